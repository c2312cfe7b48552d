"""The ``/dev/kmsg`` record format: parse records into ``LogRecord``s; the host's boot clock and id.

Record format (kernel ``Documentation/ABI/testing/dev-kmsg``)::

    prio,seq,usec,flags[,more fields];message\\n
     KEY=value\\n                        (zero or more dictionary lines, each starting with a space)

Non-printable bytes and backslashes in the message and in dictionary lines are escaped as ``\\xNN``.

:func:`parse_record` parses one record, :func:`parse_chunk` many concatenated ones (a regular file, or
device reads joined) with the same result per record, several times faster. Parsing never alters the
message beyond undoing the escapes: prefixes are the pipeline's business.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.types import LogRecord, Mapped, MicrosecondTimes, RecordColumns

# How much of a bad record ends up in a log line or an error message.
_SHOW_BYTES = 120

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_DIGITS = re.compile(rb"[0-9]{1,20}")  # a u64 has at most 20 decimal digits
_SPACE = 0x20


class KmsgParseError(ValueError):
    """Raised for bytes that are not a well-formed kmsg record; the message names what is wrong.

    ``seq`` is the record's sequence number when its header still shows one, else ``None``.
    """

    def __init__(self, message: str, *, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq


# --------------------------------------------------------------------------------------------------
# One record


@dataclass(frozen=True, slots=True)
class Header:
    prio: int
    seq: int
    usec: int
    flags: bytes
    message: bytes  # still escaped


def _fail(reason: str, data: bytes, *, seq: int | None = None) -> KmsgParseError:
    shown = bytes(data[:_SHOW_BYTES])
    suffix = "..." if len(data) > _SHOW_BYTES else ""
    return KmsgParseError(f"invalid kmsg record: {reason}: {shown!r}{suffix}", seq=seq)


def _seq_hint(parts: list[bytes]) -> int | None:
    """The sequence number of a bad header, if its second field is still a valid one."""
    return int(parts[1]) if len(parts) > 1 and _DIGITS.fullmatch(parts[1]) else None


def _number(raw: bytes, *, name: str, line: bytes, parts: list[bytes]) -> int:
    if not _DIGITS.fullmatch(raw):
        raise _fail(f"{name} {bytes(raw[:24])!r} is not a decimal number", line, seq=_seq_hint(parts))
    return int(raw)


def parse_header(line: bytes) -> Header:
    """Parse the first line of a record: ``prio,seq,usec,flags[,...];message``."""
    prefix, sep, message = line.partition(b";")
    parts = prefix.split(b",")
    if not sep:
        raise _fail("missing ';' between header and message", line, seq=_seq_hint(parts))
    if len(parts) < 4:
        raise _fail(
            f"expected at least 4 comma-separated header fields (prio,seq,usec,flags), got {len(parts)}",
            line,
            seq=_seq_hint(parts),
        )
    return Header(
        prio=_number(parts[0], name="priority", line=line, parts=parts),
        seq=_number(parts[1], name="sequence number", line=line, parts=parts),
        usec=_number(parts[2], name="timestamp", line=line, parts=parts),
        flags=parts[3],
        message=message,
    )


def _unescape(raw: bytes) -> str:
    """Undo the kernel's ``\\xNN`` escaping; anything that is not a valid escape stays literal."""
    if b"\\x" in raw:
        raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw)
    return raw.decode("utf-8", errors="replace")


def _message(scanned: str) -> str:
    """A message as the scan found it (ASCII, still escaped) as the record holds it."""
    return scanned if "\\x" not in scanned else _unescape(scanned.encode())


def _dictionary_entry(line: bytes) -> tuple[str, str]:
    """Parse one dictionary line ``' KEY=value'``."""
    if not line.startswith(b" "):
        raise _fail("a dictionary line must start with a space", line)
    key, sep, value = line[1:].partition(b"=")
    if not sep or not key:
        raise _fail(f"dictionary line {bytes(line[:40])!r} is not ' KEY=value'", line)
    return _unescape(key), _unescape(value)


def _record(header_line: bytes, *, fields: dict[str, str], boot_time: float, source: str) -> LogRecord:
    header = parse_header(header_line)
    return LogRecord(
        message=_unescape(header.message),
        timestamp=boot_time + header.usec / 1e6,
        seq=header.seq,
        priority=header.prio & 7,
        facility=header.prio >> 3,
        monotonic_usec=header.usec,
        continuation=b"c" in header.flags,
        fields=fields,
        source=source,
    )


def parse_record(data: bytes, *, boot_time: float, source: str = "kmsg") -> LogRecord:
    """Parse one raw record: a header line, then dictionary lines (trailing newlines are fine).

    ``boot_time`` is the wall-clock time of boot (see :func:`boot_time_now`); the record's timestamp is
    ``boot_time + usec / 1e6``. Blank lines are ignored and malformed dictionary lines dropped (keeping
    the record; :func:`parse_chunk` reports them). Raises :class:`KmsgParseError`, and nothing else, when
    the header is malformed.
    """
    header_line, *lines = bytes(data).rstrip(b"\n").split(b"\n")
    fields: dict[str, str] = {}
    record = _record(header_line, fields=fields, boot_time=boot_time, source=source)
    for line in lines:
        if line:
            try:
                key, value = _dictionary_entry(line)
            except KmsgParseError:
                continue
            fields[key] = value
    return record


# --------------------------------------------------------------------------------------------------
# Many records


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedChunk:
    """What :func:`parse_chunk` found, in input order."""

    records: list[LogRecord]
    # One entry per record skipped because its header is malformed: (len(records) when it was met, error).
    errors: list[tuple[int, KmsgParseError]]
    # Malformed dictionary lines, dropped from records that were kept.
    bad_lines: list[KmsgParseError]


class _RecordSlots:
    """``LogRecord``'s memory layout without its frozen ``__setattr__``.

    The fast parser fills one of these with plain attribute stores and then makes it a ``LogRecord``
    (``__class__`` assignment, allowed between classes with identical ``__slots__``): a real, frozen
    ``LogRecord``, built several times faster than the dataclass ``__init__`` allows. Every field must be
    stored; the kmsg tests check that the result equals :func:`parse_record`'s.
    """

    __slots__ = LogRecord.__slots__


# priority text -> (level, facility), for every priority the kernel can produce; others go the slow way.
_PRIORITIES = {str(prio): (prio & 7, prio >> 3) for prio in range(1024)}
# One well-formed record: priority, seq, usec, flags (up to a ',' of further fields), message, and its
# dictionary lines (each "\n " and the rest of its line). One scan in C finds them all; see parse_columns.
# The priority is one the table holds (0-1023, no leading zero): a line with another is no row, so the
# chunk's line count finds it and the chunk goes to parse_chunk.
_PRIORITY = r"([0-9]|[1-9][0-9]{1,2}|10[01][0-9]|102[0-3])"
_RECORD = re.compile("^" + _PRIORITY + r",([0-9]{1,20}),([0-9]{1,20}),([^,;\n]*)[^;\n]*;(.*)((?:\n .*)*)", re.MULTILINE)
_HEADER = re.compile(  # the same without dictionary lines
    "^" + _PRIORITY + r",([0-9]{1,20}),([0-9]{1,20}),([^,;\n]*)[^;\n]*;(.*)", re.MULTILINE
)
# A dictionary line's start: the regex engine looks for it a newline at a time, three times as fast as
# ``"\n " in text``, whose skip table stops at every space.
_DICTIONARY_LINE = re.compile("\n ")
_MESSAGE = re.compile(  # the same line with only its message as a group (one string a record, no tuple)
    "^(?:" + _PRIORITY[1:] + r",[0-9]{1,20},[0-9]{1,20},[^;\n]*;(.*)", re.MULTILINE
)


def parse_chunk(data: bytes, *, boot_time: float, source: str = "kmsg") -> ParsedChunk:
    """Parse concatenated records (a kmsg-format file's contents, or device reads joined).

    Every line that does not start with a space starts a record; blank lines are ignored. Each record
    comes out exactly as :func:`parse_record` makes it. A record with a malformed header is skipped with
    its dictionary lines, and so are dictionary lines before the first header; both are reported in
    ``errors``. A malformed dictionary line is dropped from its record and reported in ``bad_lines``.
    """
    records: list[LogRecord] = []
    errors: list[tuple[int, KmsgParseError]] = []
    bad_lines: list[KmsgParseError] = []
    columns = parse_columns(data, boot_time=boot_time, source=source)  # the device escapes bytes >= 0x7f
    if columns is not None:
        return ParsedChunk(records=list(columns), errors=errors, bad_lines=bad_lines)
    skipped = False
    for line in data.split(b"\n"):
        if not line:
            continue
        if line[0] == _SPACE:
            skipped = _dictionary_line(line, records, errors, bad_lines, skipped=skipped)
        else:
            skipped = _header_line(line, records, errors, boot_time=boot_time, source=source)
    return ParsedChunk(records=records, errors=errors, bad_lines=bad_lines)


# priority, seq, usec, flags, message (escaped)[, dictionary lines: only scanned in a chunk that has some]
_Row = tuple[str, ...]


def parse_columns(
    data: bytes, *, boot_time: float, source: str = "kmsg", device: bool = False, kernel: bool = False
) -> RecordColumns | None:
    """The records of a chunk of well-formed records as columns, each ``LogRecord`` built only when asked
    for (equal to :func:`parse_chunk`'s records); None for a chunk :func:`parse_chunk` must parse: one that
    is not ASCII or holds a blank or malformed line, a malformed dictionary line or a priority beyond the
    table. One regex scan in C finds the records (issue 16: building an object per record, and splitting
    each header, were most of the agent's CPU per record).

    ``device``: the records are the kernel device's reads, in the order it hands them out (a jump is
    reported with EPIPE). A chunk of such records without dictionary lines (the usual one) is scanned for its
    messages alone, and a record's other fields are read from its line when asked for: the matcher wants the
    time and number of the few lines it looks at, the replay policy the first time, and a chunk whose first
    and last numbers are as far apart as it has records is numbered from those two. Any other chunk is
    scanned for every field of every record.

    ``kernel``: reads of the kernel's own /dev/kmsg (see ``is_kernel_log``), whose every line the kernel
    formats as one record (``prefix;message``, the message's bytes below space, above ``~`` and its
    backslashes escaped): only the first and last lines are parsed, and a chunk without escapes is not
    scanned at all: each message is cut from its line when asked for, and the chunk's bytes are its
    ``raw_lines`` (the matcher's prefilter scans them in place of the messages)."""
    if not data.isascii():
        return None
    text = data.decode("ascii")
    if text.startswith(" "):  # a dictionary line before any record
        return None
    if not (device or kernel) or _DICTIONARY_LINE.search(text):
        return _scanned_columns(text, boot_time=boot_time, source=source)
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()  # after the last newline
    raw_lines = None
    messages: Sequence[str]
    if kernel and "\\" not in text:  # the kernel escapes every backslash: one begins each escape (memchr)
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
    return RecordColumns(
        messages=messages,
        timestamps=MicrosecondTimes(micros=Mapped(lines, _usec_text), base=boot_time, logged_order=True),
        seqs=seqs,
        rows=Mapped(lines, _scan_row),
        make=functools.partial(_row_record, boot_time=boot_time, source=source),
        raw_lines=raw_lines,
    )


def _scanned_columns(text: str, *, boot_time: float, source: str) -> RecordColumns | None:
    """:func:`parse_columns` by one scan that takes every field of every record, its dictionary lines too."""
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
    return RecordColumns(
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


# --------------------------------------------------------------------------------------------------
# Clocks and boot identity


def boot_time_now() -> float:
    """Wall-clock time of boot, with sub-second precision: ``CLOCK_REALTIME - CLOCK_MONOTONIC``."""
    return time.clock_gettime(time.CLOCK_REALTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)


def read_boot_id(*, proc_root: Path = Path("/proc")) -> str:
    """Return this boot's random id (``<proc_root>/sys/kernel/random/boot_id``).

    Raises ``FileNotFoundError``/``OSError`` naming the file when it cannot be read, and
    ``ValueError`` when it is empty.
    """
    path = proc_root / "sys" / "kernel" / "random" / "boot_id"
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"cannot read the boot id: {path} does not exist (is {proc_root} the host's procfs?)"
        ) from exc
    except OSError as exc:
        raise OSError(f"cannot read the boot id from {path}: {exc}") from exc
    boot_id = text.strip()
    if not boot_id:
        raise ValueError(f"the boot id file {path} is empty")
    return boot_id
