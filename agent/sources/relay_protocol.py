"""The kmsg relay wire protocol, imported by both ends (``relay_server`` and ``relay_client``).

Wire protocol (version 1), relay → client only; the client sends nothing::

    frame   = length payload
    length  = 4-byte unsigned big-endian integer, the size of payload (at most MAX_FRAME)
    payload = hello | record | heartbeat

- **hello** (always the first frame of a connection): UTF-8 JSON object
  ``{"proto": 1, "boot_time": <float>, "boot_id": "<uuid>" | null}``. ``boot_time`` is the host's
  wall-clock time of boot (``CLOCK_REALTIME - CLOCK_MONOTONIC`` in the relay, taken at connect
  time; finite and within ``[0, MAX_BOOT_TIME]``); the client computes a record's time as
  ``boot_time + usec / 1e6``. ``boot_id`` is ``/proc/sys/kernel/random/boot_id``, or null when
  unreadable.
- **record**: exactly the bytes one kmsg record consists of, as the kernel returned them
  (``prio,seq,usec,flags[,...];message\\n`` plus optional `` KEY=value\\n`` dictionary lines). Not
  empty. Sequence numbers are the kernel's; the client does the gap/duplicate accounting.
- **heartbeat**: an empty frame (length 0), sent when nothing else was sent for
  ``heartbeat_interval`` seconds *and* the relay's own kmsg reader has its source open and is
  polling. A relay that accepts connections but cannot read the kernel log therefore goes silent,
  and the client's stall detection (and the agent's ``/healthz``) notices.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass

from agent.sources.kmsg.boot import boot_time_now, read_boot_id

log = logging.getLogger(__name__)

PROTO = 1
HEADER = struct.Struct(">I")
# Records from the device are at most ~8 KiB; a file source may hand out up to 64 KiB of unsplit bytes.
MAX_FRAME = 1024 * 1024
# A hello's boot_time must be a finite wall-clock time in [0, MAX_BOOT_TIME] (2**40 s is ~36,800 years).
MAX_BOOT_TIME = float(2**40)


class ProtocolError(ValueError):
    """Bytes from the relay that do not follow the wire protocol; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Hello:
    """The first frame of a connection: the protocol version and the host's boot identity."""

    proto: int
    boot_time: float
    boot_id: str | None

    def encode(self) -> bytes:
        return json.dumps({"proto": self.proto, "boot_time": self.boot_time, "boot_id": self.boot_id}).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Hello:
        """Parse a hello payload; raises :class:`ProtocolError` for anything but a version-1 hello.

        ``boot_time`` must be finite and within ``[0, MAX_BOOT_TIME]`` (JSON from Python may hold
        ``NaN`` or ``Infinity``, which would poison every record's timestamp).
        """
        try:
            data = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(f"hello is not UTF-8 JSON: {payload[:80]!r}") from exc
        if not isinstance(data, dict):
            raise ProtocolError(f"hello is not a JSON object: {payload[:80]!r}")
        proto, boot_time, boot_id = data.get("proto"), data.get("boot_time"), data.get("boot_id")
        if isinstance(proto, bool) or proto != PROTO:
            raise ProtocolError(f"unsupported relay protocol {proto!r} (this agent speaks {PROTO})")
        if isinstance(boot_time, bool) or not isinstance(boot_time, int | float):
            raise ProtocolError(f"hello has no numeric boot_time: {boot_time!r}")
        if not 0 <= boot_time <= MAX_BOOT_TIME:  # also false for NaN; no float() of a huge int
            raise ProtocolError(f"hello boot_time {boot_time!r:.80} is not a plausible wall-clock time")
        if boot_id is not None and not isinstance(boot_id, str):
            raise ProtocolError(f"hello boot_id is not a string: {boot_id!r}")
        return cls(proto=proto, boot_time=float(boot_time), boot_id=boot_id or None)


def encode_frame(payload: bytes) -> bytes:
    """One frame: 4-byte big-endian length, then the payload (empty payload = heartbeat)."""
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes exceeds MAX_FRAME ({MAX_FRAME})")
    return HEADER.pack(len(payload)) + payload


def current_hello() -> Hello:
    """The hello for a new connection: this host's boot time now, and its boot id when readable."""
    try:
        boot_id: str | None = read_boot_id()
    except (OSError, ValueError) as exc:
        log.debug("kmsg relay: no boot id in the hello: %s", exc)
        boot_id = None
    return Hello(proto=PROTO, boot_time=boot_time_now(), boot_id=boot_id)
