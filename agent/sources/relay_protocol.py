"""The kmsg relay wire protocol, imported by both ends (``relay_server`` and ``relay_client``).

Standard library only, and nothing of the agent: the relay imports this module (see
:mod:`agent.sources.relay_server`, which must stay small).

Wire protocol (version 2)::

    frame   = length payload
    length  = 4-byte unsigned big-endian integer, the size of payload (at most MAX_FRAME)
    payload = hello | chunk | sync | heartbeat      (relay -> client)

- **hello** (always the first frame of a connection): UTF-8 JSON object
  ``{"proto": 2, "boot_time": <float>, "boot_id": "<uuid>" | null, "source": "<kind>"}``.
  ``boot_time`` is the host's wall-clock time of boot (``CLOCK_REALTIME - CLOCK_MONOTONIC`` in the
  relay, taken at connect time; finite and within ``[0, MAX_BOOT_TIME]``); the client computes a
  record's time as ``boot_time + usec / 1e6``. ``boot_id`` is ``/proc/sys/kernel/random/boot_id``, or
  null when unreadable. ``source`` says what the relay reads (one of :data:`SOURCES`):
  ``kernel-device`` (the kernel's own ``/dev/kmsg``, character device 1:11), ``other-device`` (another
  character device) or ``file`` (a regular file or FIFO of concatenated records: tests, replays).
- **chunk**: ``b"C"``, the first and the last record's sequence numbers (two 8-byte unsigned big-endian
  integers; 0 where the relay could not read one), then the records exactly as read: for a device,
  its ``read()`` s one after the other (one record each, ``prio,seq,usec,flags;message\\n`` plus
  `` KEY=value\\n`` dictionary lines), for a file complete records as they stand in it. Many records
  a frame: a chunk is what the relay read at one wake-up (at most :data:`CHUNK_BYTES` of it).
- **sync**: kind ``b"S"``, the same two numbers, then the number of catch-up requests the relay has read
  on this connection so far (an 8-byte unsigned big-endian integer), then the records: what the relay
  read in answer to them, sent even when that is nothing (then both sequence numbers are 0).
- **heartbeat**: an empty frame (length 0), sent when nothing else was sent for
  ``heartbeat_interval`` seconds while the relay has the kernel log open and polls it. A relay
  that accepts connections but cannot read the kernel log therefore goes silent, and the
  client's stall detection (and the agent's ``/healthz``) notices.

Client -> relay: only catch-up requests, one byte :data:`CATCH_UP` each. The relay answers the
requests it finds together with one sync frame, read from the device at that moment (which may hold
records the kernel has not yet woken its readers for: see
:meth:`agent.sources.kmsg.reader.KmsgReader.catch_up`); its count says which requests it answers.
Other bytes are ignored.

Version 1 (one record a frame, no source in the hello, no catch-up) is not accepted by either
end: the relay and the agent run from the same image in the same pod, so they never differ
in version; a version-1 hello is refused with a message saying so.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

from agent.sources.unixsocket import Frozen

PROTO = 2
HEADER = struct.Struct(">I")
CHUNK = struct.Struct(">cQQ")  # kind, first seq, last seq; the records follow (a sync's after ANSWERED)
ANSWERED = struct.Struct(">Q")  # in a sync frame: the catch-up requests read so far
KIND_CHUNK = b"C"
KIND_SYNC = b"S"
CATCH_UP = b"?"  # client -> relay: read now and answer with a sync frame
KERNEL_DEVICE, OTHER_DEVICE, FILE = "kernel-device", "other-device", "file"
SOURCES = (KERNEL_DEVICE, OTHER_DEVICE, FILE)
MAX_FRAME = 1024 * 1024
# A chunk's records are at most about this many bytes (a device record is at most ~8 KiB).
CHUNK_BYTES = 32 * 1024
# A hello's boot_time must be a finite wall-clock time in [0, MAX_BOOT_TIME] (2**40 s is ~36,800 years).
MAX_BOOT_TIME = float(2**40)
_MAX_SEQ = 2**64 - 1
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class ProtocolError(ValueError):
    """Bytes from the relay that do not follow the wire protocol; the message says what is wrong."""


class Hello(Frozen):
    """The first frame of a connection: the protocol version, the host's boot identity, what the relay reads."""

    __slots__ = ("proto", "boot_time", "boot_id", "source")
    proto: int
    boot_time: float
    boot_id: str | None
    source: str

    def __init__(self, *, proto: int, boot_time: float, boot_id: str | None, source: str = KERNEL_DEVICE) -> None:
        self._set(proto=proto, boot_time=boot_time, boot_id=boot_id, source=source)

    def encode(self) -> bytes:
        """JSON written here, not by :mod:`json` (which the relay does not load: a tenth of a megabyte)."""
        boot_id = "null" if self.boot_id is None else _json_string(self.boot_id)
        return (
            f'{{"proto": {int(self.proto)}, "boot_time": {float(self.boot_time)!r}, "boot_id": {boot_id}, '
            f'"source": {_json_string(self.source)}}}'
        ).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Hello:
        """Parse a hello payload; raises :class:`ProtocolError` for anything but a version-2 hello.

        ``boot_time`` must be finite and within ``[0, MAX_BOOT_TIME]`` (JSON from Python may hold
        ``NaN`` or ``Infinity``, which would poison every record's timestamp).
        """
        import json  # the agent's end only: the relay encodes its hello without it

        try:
            data = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(f"hello is not UTF-8 JSON: {payload[:80]!r}") from exc
        if not isinstance(data, dict):
            raise ProtocolError(f"hello is not a JSON object: {payload[:80]!r}")
        proto, boot_time, boot_id = data.get("proto"), data.get("boot_time"), data.get("boot_id")
        source = data.get("source")
        if isinstance(proto, bool) or proto != PROTO:
            also = " (run the relay and the agent from the same image)" if proto == 1 else ""
            raise ProtocolError(f"unsupported relay protocol {proto!r} (this agent speaks {PROTO}){also}")
        if isinstance(boot_time, bool) or not isinstance(boot_time, int | float):
            raise ProtocolError(f"hello has no numeric boot_time: {boot_time!r}")
        if not 0 <= boot_time <= MAX_BOOT_TIME:  # also false for NaN; no float() of a huge int
            raise ProtocolError(f"hello boot_time {boot_time!r:.80} is not a plausible wall-clock time")
        if boot_id is not None and not isinstance(boot_id, str):
            raise ProtocolError(f"hello boot_id is not a string: {boot_id!r}")
        if source not in SOURCES:
            raise ProtocolError(f"hello source {source!r:.80} is not one of {', '.join(SOURCES)}")
        return cls(proto=proto, boot_time=float(boot_time), boot_id=boot_id or None, source=source)


class Chunk(Frozen):
    """A chunk or sync frame: records as the relay read them, with the sequence numbers of the first and last."""

    __slots__ = ("data", "first_seq", "last_seq", "answered")
    data: bytes
    first_seq: int
    last_seq: int
    answered: int | None  # a sync frame's: the catch-up requests read so far; None: a chunk frame

    def __init__(self, *, data: bytes, first_seq: int = 0, last_seq: int = 0, answered: int | None = None) -> None:
        self._set(data=data, first_seq=first_seq, last_seq=last_seq, answered=answered)

    def answering(self, answered: int) -> Chunk:
        """This chunk as the sync frame answering ``answered`` catch-up requests."""
        return Chunk(data=self.data, first_seq=self.first_seq, last_seq=self.last_seq, answered=answered)

    @property
    def sync(self) -> bool:
        return self.answered is not None

    def encode(self) -> bytes:
        """The frame (header included)."""
        return b"".join(self.encode_parts())

    def encode_parts(self) -> tuple[bytes, bytes]:
        """The frame as its headers and its records, to be sent one after the other (no copy of the records)."""
        head = CHUNK.pack(KIND_SYNC if self.sync else KIND_CHUNK, self.first_seq, self.last_seq)
        if self.answered is not None:
            head += ANSWERED.pack(self.answered)
        size = len(head) + len(self.data)
        if size > MAX_FRAME:
            raise ValueError(f"chunk of {len(self.data)} bytes exceeds MAX_FRAME ({MAX_FRAME})")
        return HEADER.pack(size) + head, self.data

    @classmethod
    def decode(cls, payload: bytes) -> Chunk:
        """A chunk or sync frame's payload (not a heartbeat's); raises :class:`ProtocolError`."""
        if len(payload) < CHUNK.size:
            raise ProtocolError(f"frame of {len(payload)} bytes is too short for a chunk: {payload[:40]!r}")
        kind, first, last = CHUNK.unpack_from(payload)
        if kind == KIND_CHUNK:
            return cls(data=payload[CHUNK.size :], first_seq=first, last_seq=last)
        if kind != KIND_SYNC:
            raise ProtocolError(f"unknown frame kind {kind!r}")
        if len(payload) < CHUNK.size + ANSWERED.size:
            raise ProtocolError(f"sync frame of {len(payload)} bytes is too short: {payload[:40]!r}")
        (answered,) = ANSWERED.unpack_from(payload, CHUNK.size)
        return cls(data=payload[CHUNK.size + ANSWERED.size :], first_seq=first, last_seq=last, answered=answered)


def _json_string(text: str) -> str:
    """``text`` as a JSON string (``"`` and ``\\`` escaped, and every character below space or above ``~``)."""
    return '"' + "".join(c if " " <= c <= "~" and c not in '"\\' else _json_escape(c) for c in text) + '"'


def _json_escape(char: str) -> str:
    """One character as JSON's ``\\uXXXX`` (a surrogate pair beyond the Basic Multilingual Plane)."""
    units = char.encode("utf-16-be")
    return "".join(f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2))


def encode_frame(payload: bytes) -> bytes:
    """One frame: 4-byte big-endian length, then the payload (empty payload = heartbeat)."""
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes exceeds MAX_FRAME ({MAX_FRAME})")
    return HEADER.pack(len(payload)) + payload


def record_seq(record: bytes) -> int:
    """The sequence number in a record's header (``prio,seq,...``); 0 where there is none to read."""
    parts = record[:64].split(b",", 2)
    if len(parts) < 3 or not parts[1].isdigit():
        return 0
    seq = int(parts[1])
    return seq if seq <= _MAX_SEQ else 0


def boot_time_now() -> float:
    """Wall-clock time of boot, with sub-second precision: ``CLOCK_REALTIME - CLOCK_MONOTONIC``."""
    return time.clock_gettime(time.CLOCK_REALTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)


def current_hello(source: str, *, boot_id_path: Path = BOOT_ID) -> Hello:
    """The hello for a new connection: this host's boot time now, its boot id when readable, the source's kind."""
    try:
        boot_id: str | None = boot_id_path.read_text(encoding="ascii", errors="replace").strip() or None
    except OSError:
        boot_id = None
    return Hello(proto=PROTO, boot_time=boot_time_now(), boot_id=boot_id, source=source)
