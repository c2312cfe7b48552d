"""The ``/dev/kmsg`` record format: parse one record into a ``LogRecord``; the host's boot clock and id.

Record format (kernel ``Documentation/ABI/testing/dev-kmsg``)::

    prio,seq,usec,flags[,more fields];message\\n
     KEY=value\\n                        (zero or more dictionary lines, each starting with a space)

Non-printable bytes and backslashes in the message and in dictionary lines are escaped as ``\\xNN``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from agent.types import LogRecord

# How much of a bad record ends up in a log line or an error message.
_SHOW_BYTES = 120

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_DIGITS = re.compile(rb"[0-9]{1,20}")  # a u64 has at most 20 decimal digits

class KmsgParseError(ValueError):
    """Raised for bytes that are not a well-formed kmsg record; the message names what is wrong."""


# --------------------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True, slots=True)
class Header:
    prio: int
    seq: int
    usec: int
    flags: bytes
    message: bytes  # still escaped


def _fail(reason: str, data: bytes) -> KmsgParseError:
    shown = bytes(data[:_SHOW_BYTES])
    suffix = "..." if len(data) > _SHOW_BYTES else ""
    return KmsgParseError(f"invalid kmsg record: {reason}: {shown!r}{suffix}")


def _number(raw: bytes, *, name: str, line: bytes) -> int:
    if not _DIGITS.fullmatch(raw):
        raise _fail(f"{name} {bytes(raw[:24])!r} is not a decimal number", line)
    return int(raw)


def parse_header(line: bytes) -> Header:
    """Parse the first line of a record: ``prio,seq,usec,flags[,...];message``."""
    prefix, sep, message = line.partition(b";")
    if not sep:
        raise _fail("missing ';' between header and message", line)
    parts = prefix.split(b",")
    if len(parts) < 4:
        raise _fail(f"expected at least 4 comma-separated header fields (prio,seq,usec,flags), got {len(parts)}", line)
    return Header(
        prio=_number(parts[0], name="priority", line=line),
        seq=_number(parts[1], name="sequence number", line=line),
        usec=_number(parts[2], name="timestamp", line=line),
        flags=parts[3],
        message=message,
    )


def _unescape(raw: bytes) -> str:
    """Undo the kernel's ``\\xNN`` escaping; anything that is not a valid escape stays literal."""
    return _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw).decode("utf-8", errors="replace")


def _parse_fields(lines: list[bytes], *, data: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in lines:
        if not line.startswith(b" "):
            raise _fail("a dictionary line must start with a space", data)
        key, sep, value = line[1:].partition(b"=")
        if not sep or not key:
            raise _fail(f"dictionary line {bytes(line[:40])!r} is not ' KEY=value'", data)
        fields[_unescape(key)] = _unescape(value)
    return fields


def parse_record(data: bytes, *, boot_time: float, source: str = "kmsg") -> LogRecord:
    """Parse one raw record (with or without trailing newlines).

    ``boot_time`` is the wall-clock time of boot (see :func:`boot_time_now`); the record's timestamp is
    ``boot_time + usec / 1e6``. Raises :class:`KmsgParseError`, and nothing else, for malformed input.
    """
    data = bytes(data)
    body = data.rstrip(b"\n")
    first, *dictionary = body.split(b"\n")
    header = parse_header(first)
    return LogRecord(
        message=_unescape(header.message),
        timestamp=boot_time + header.usec / 1e6,
        seq=header.seq,
        priority=header.prio & 7,
        facility=header.prio >> 3,
        monotonic_usec=header.usec,
        continuation=b"c" in header.flags,
        fields=_parse_fields(dictionary, data=data),
        source=source,
    )


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

