"""The ``/dev/kmsg`` record format, one record at a time: the reference every fast path is tested against.

Record format (kernel ``Documentation/ABI/testing/dev-kmsg``)::

    prio,seq,usec,flags[,more fields];message\\n
     KEY=value\\n                        (zero or more dictionary lines, each starting with a space)

Non-printable bytes and backslashes in the message and in dictionary lines are escaped as ``\\xNN``.
Parsing never alters the message beyond undoing the escapes: prefixes are the pipeline's business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.types import LogRecord

# How much of a bad record ends up in a log line or an error message.
_SHOW_BYTES = 120

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_DIGITS = re.compile(rb"[0-9]{1,20}")  # a u64 has at most 20 decimal digits


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
