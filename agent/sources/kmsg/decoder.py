"""The one kmsg decoder: a chunk of raw records, read in a :class:`Mode`, into ``LogRecord`` s.

:func:`decode` takes a chunk whole by one regex scan in C where it can (:func:`scan`, the records as lazy
:class:`~agent.sources.kmsg.columns.KmsgColumns`) and else line by line; each record comes out exactly as
:func:`agent.sources.kmsg.format.parse_record` (the reference) makes it. Why the scan:
docs/benchmarks.md, "The kmsg fast path".
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.columns import Mapped
from agent.core.types import LogRecord
from agent.sources.kmsg.columns import KmsgColumns, MicrosecondTimes
from agent.sources.kmsg.format import (
    KmsgParseError,
    _dictionary_entry,
    _fail,
    _message,
    _record,
)

_SPACE = 0x20


class Mode(enum.Enum):
    """Where a chunk was read, which says what its bytes can be trusted to be."""

    # The kernel's own /dev/kmsg (``reader.is_kernel_log``): one record a read, in the order the kernel logged
    # them (a jump is reported with EPIPE), every line formatted by the kernel (``prefix;message``, the
    # message's bytes below space, above ``~`` and its backslashes escaped).
    KERNEL_DEVICE = "kernel-device"
    OTHER_DEVICE = "other-device"  # another character device: one record a read, in order; lines not vouched for
    FILE = "file"  # a regular file or FIFO of concatenated records: any order, anything in them
    # (The kmsg relay's chunks are decoded in the mode of what the relay read: agent.sources.relay_client.)

    @property
    def device(self) -> bool:
        """Whether the records are a device's reads, in the order it hands them out."""
        return self in (Mode.KERNEL_DEVICE, Mode.OTHER_DEVICE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decoded:
    """What :func:`decode` found, in input order."""

    records: Sequence[LogRecord]  # KmsgColumns where the scan took the chunk
    # One entry per record skipped because its header is malformed: (len(records) when it was met, error).
    errors: list[tuple[int, KmsgParseError]]
    # Malformed dictionary lines, dropped from records that were kept.
    bad_lines: list[KmsgParseError]


def decode(chunk: bytes, *, mode: Mode, boot_time: float, source: str = "kmsg") -> Decoded:
    """Decode complete records read in ``mode``.

    ``boot_time`` is the wall-clock time of boot; a record's time is ``boot_time + usec / 1e6``. Every line
    that does not start with a space starts a record; blank lines are ignored. A record with a malformed
    header is skipped with its dictionary lines, and so are dictionary lines before the first header; both
    are reported in ``errors``. A malformed dictionary line is dropped from its record and reported in
    ``bad_lines``.
    """
    if not isinstance(chunk, bytes):
        raise TypeError(f"a {mode.value} chunk is bytes")
    columns = scan(chunk, mode=mode, boot_time=boot_time, source=source)
    if columns is not None:
        return Decoded(records=columns, errors=[], bad_lines=[])
    return _lines(chunk, boot_time=boot_time, source=source)


def _lines(data: bytes, *, boot_time: float, source: str) -> Decoded:
    """:func:`decode` line by line: any chunk, each error reported."""
    records: list[LogRecord] = []
    errors: list[tuple[int, KmsgParseError]] = []
    bad_lines: list[KmsgParseError] = []
    skipped = False
    for line in data.split(b"\n"):
        if not line:
            continue
        if line[0] == _SPACE:
            skipped = _dictionary_line(line, records, errors, bad_lines, skipped=skipped)
        else:
            skipped = _header_line(line, records, errors, boot_time=boot_time, source=source)
    return Decoded(records=records, errors=errors, bad_lines=bad_lines)


class _RecordSlots:
    """``LogRecord``'s memory layout without its frozen ``__setattr__``.

    The fast parser fills one of these with plain attribute stores and then makes it a ``LogRecord``
    (``__class__`` assignment, allowed between classes with identical ``__slots__``): a real, frozen
    ``LogRecord`` without the dataclass ``__init__``. Every field must be stored; the kmsg tests check that
    the result equals :func:`parse_record`'s.
    """

    __slots__ = LogRecord.__slots__


# priority text -> (level, facility), for every priority the kernel can produce; others go the slow way.
_PRIORITIES = {str(prio): (prio & 7, prio >> 3) for prio in range(1024)}
# One well-formed record: priority, seq, usec, flags (up to a ',' of further fields), message, and its
# dictionary lines (each "\n " and the rest of its line). One scan in C finds them all; see scan.
# The priority is one the table holds (0-1023, no leading zero): a line with another is no row, so the
# chunk's line count finds it and the chunk goes line by line.
_PRIORITY = r"([0-9]|[1-9][0-9]{1,2}|10[01][0-9]|102[0-3])"
_RECORD = re.compile("^" + _PRIORITY + r",([0-9]{1,20}),([0-9]{1,20}),([^,;\n]*)[^;\n]*;(.*)((?:\n .*)*)", re.MULTILINE)
_HEADER = re.compile(  # the same without dictionary lines
    "^" + _PRIORITY + r",([0-9]{1,20}),([0-9]{1,20}),([^,;\n]*)[^;\n]*;(.*)", re.MULTILINE
)
# A dictionary line's start, found by the regex engine (docs/benchmarks.md, "The kmsg fast path").
_DICTIONARY_LINE = re.compile("\n ")
_MESSAGE = re.compile(  # the same line with only its message as a group (one string a record, no tuple)
    "^(?:" + _PRIORITY[1:] + r",[0-9]{1,20},[0-9]{1,20},[^;\n]*;(.*)", re.MULTILINE
)


# priority, seq, usec, flags, message (escaped)[, dictionary lines: only scanned in a chunk that has some]
_Row = tuple[str, ...]


def scan(data: bytes, *, mode: Mode, boot_time: float, source: str = "kmsg") -> KmsgColumns | None:
    """:func:`decode`'s fast path: a chunk of well-formed records as columns, each ``LogRecord`` built only
    when asked for; None for a chunk that must go line by line: one that is not ASCII or holds a blank or
    malformed line, a malformed dictionary line or a priority beyond the table.

    In a device mode, a chunk without dictionary lines (the usual one) is scanned for its messages alone,
    a record's other fields are read from its line when asked for, and a chunk whose first and last numbers
    are as far apart as it has records is numbered from those two. Any other chunk is scanned for every
    field of every record. In :attr:`Mode.KERNEL_DEVICE` only the first and last lines are parsed, and a
    chunk without escapes is not scanned at all: each message is cut from its line when asked for, and the
    chunk's bytes are its ``raw_lines``."""
    if not data.isascii():
        return None
    text = data.decode("ascii")
    if text.startswith(" "):  # a dictionary line before any record
        return None
    if not mode.device or _DICTIONARY_LINE.search(text):
        return _scanned_columns(text, boot_time=boot_time, source=source)
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()  # after the last newline
    raw_lines = None
    messages: Sequence[str]
    if mode is Mode.KERNEL_DEVICE and "\\" not in text:  # the kernel escapes every backslash: one begins each escape
        if not lines or not (_HEADER.fullmatch(lines[0]) and _HEADER.fullmatch(lines[-1])):
            return None  # not the kernel's format after all: the per-line code says what is wrong
        messages, raw_lines = Mapped(lines, _line_message), data
    else:
        messages = _MESSAGE.findall(text)
        if not messages or len(messages) != len(lines):
            return None  # a blank or malformed line: no scan row for it
        if "\\x" in text:
            messages = list(map(_message, messages))
    count = len(lines)
    first, last = int(_seq_text(lines[0])), int(_seq_text(lines[-1]))
    seqs: Sequence[int] = range(first, last + 1) if last - first + 1 == count else list(map(int, map(_seq_text, lines)))
    return KmsgColumns(
        messages=messages,
        timestamps=MicrosecondTimes(micros=Mapped(lines, _usec_text), base=boot_time, logged_order=True),
        seqs=seqs,
        rows=Mapped(lines, _scan_row),
        make=functools.partial(_row_record, boot_time=boot_time, source=source),
        raw_lines=raw_lines,
        lines=data,
    )


def _scanned_columns(text: str, *, boot_time: float, source: str) -> KmsgColumns | None:
    """:func:`scan` by one scan that takes every field of every record, its dictionary lines too."""
    # Each line is a row (a record's first line), a dictionary line (after "\n "), blank or malformed. Rows
    # plus dictionary lines equal to the line count: no blank or malformed line.
    dictionaries = text.count("\n ")
    rows: list[_Row] = (_RECORD if dictionaries else _HEADER).findall(text)
    if not rows or len(rows) != text.count("\n") + (not text.endswith("\n")) - dictionaries:
        return None
    if dictionaries:
        try:
            for row in rows:
                if row[5]:
                    _fields(row[5])  # every one parses, so building a record later cannot fail
        except KmsgParseError:
            return None
    columns = list(zip(*rows, strict=True))
    seqs, usecs, messages = columns[1], columns[2], columns[4]
    if "\\x" in text:
        messages = tuple(map(_message, messages))
    return KmsgColumns(
        messages=messages,
        timestamps=MicrosecondTimes(micros=usecs, base=boot_time),
        seqs=list(map(int, seqs)),
        rows=rows,
        make=functools.partial(_row_record, boot_time=boot_time, source=source),
    )


def _seq_text(line: str) -> str:
    return line.split(",", 2)[1]


def _usec_text(line: str) -> str:
    return line.split(",", 3)[2]


def _line_message(line: str) -> str:
    """The message of a record line the kernel printed without escapes (everything after the prefix)."""
    return line.partition(";")[2]


def _scan_row(line: str) -> _Row:
    """A record line's scan row (priority, seq, usec, flags, message), as the one scan of every field gives it."""
    match = _HEADER.match(line)
    assert match is not None  # every line was scanned as a record's
    return match.groups()


def _fields(dictionary: str) -> dict[str, str]:
    """A record's dictionary from its lines as scanned (each "\\n KEY=value"); raises KmsgParseError."""
    fields = {}
    for line in dictionary[1:].split("\n"):
        key, value = _dictionary_entry(line.encode())
        fields[key] = value
    return fields


def _row_record(row: _Row, *, boot_time: float, source: str) -> LogRecord:
    """The ``LogRecord`` of a scanned row (built without the frozen dataclass's ``__init__``)."""
    prio, seq, usec, flags, message = row[:5]
    dictionary = row[5] if len(row) > 5 else ""
    micros = int(usec)
    record: Any = object.__new__(_RecordSlots)  # a _RecordSlots, a LogRecord once its class is set below
    record.message = _message(message)
    record.timestamp = boot_time + micros / 1e6
    record.seq = int(seq)
    record.priority, record.facility = _PRIORITIES[prio]
    record.monotonic_usec = micros
    record.continuation = "c" in flags
    record.fields = _fields(dictionary) if dictionary else {}
    record.source = source
    record.__class__ = LogRecord
    return record


def _header_line(
    line: bytes,
    records: list[LogRecord],
    errors: list[tuple[int, KmsgParseError]],
    *,
    boot_time: float,
    source: str,
) -> bool:
    """Parse a record's first line into ``records``, or report it; returns whether it was skipped."""
    try:
        records.append(_record(line, fields={}, boot_time=boot_time, source=source))
    except KmsgParseError as exc:
        errors.append((len(records), exc))
        return True
    return False


def _dictionary_line(
    line: bytes,
    records: list[LogRecord],
    errors: list[tuple[int, KmsgParseError]],
    bad_lines: list[KmsgParseError],
    *,
    skipped: bool,
) -> bool:
    """Add a dictionary line to the last record (still ours to fill); returns the new ``skipped``."""
    if skipped:
        return True  # part of a record already reported as skipped
    if not records:
        errors.append((0, _fail("dictionary line without a record header before it", line)))
        return True
    try:
        key, value = _dictionary_entry(line)
    except KmsgParseError as exc:
        bad_lines.append(exc)
        return False
    records[-1].fields[key] = value  # type: ignore[index]  # a fresh dict, not yet handed out
    return False
