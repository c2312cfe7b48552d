"""Kernel log records from a kmsg relay over a UNIX socket (protocol: :mod:`agent.sources.relay_protocol`).

The unprivileged agent cannot open the host's ``/dev/kmsg``; a privileged relay container can, and
serves its raw records on a socket in a shared emptyDir. :class:`RelayClient` is a drop-in
:class:`agent.sources.producer.Source` for that socket: same ``KmsgStats``, same ``LogRecord`` s, same sequence
accounting as :class:`~agent.sources.kmsg.reader.KmsgReader`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

from agent.core.backoff import Backoff
from agent.core.types import LogRecord
from agent.sources.kmsg.decoder import Mode, decode
from agent.sources.kmsg.sequence import SequenceTracker
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.relay_protocol import HEADER, MAX_FRAME, Hello, ProtocolError

_logger = logging.getLogger(__name__)

_RECV_SIZE = 64 * 1024
BATCH_MAX = 4096  # records per list from RelayClient.batches()


class _Closed(Exception):
    """The relay ended the connection (a relay restart, or it replaced us with a newer client)."""


class _Stalled(Exception):
    """Nothing, not even a heartbeat, arrived for ``stall_after`` seconds."""


class _FrameReader:
    """Split a connection's byte stream into frames, watching for stop and for a stalled relay."""

    def __init__(
        self,
        conn: socket.socket,
        *,
        stop: threading.Event,
        stall_after: float,
        clock: Callable[[], float],
    ) -> None:
        self._conn = conn
        self._stop = stop
        self._stall_after = stall_after
        self._clock = clock
        self._buffer = bytearray()
        self._last_frame = clock()

    def frames(self, *, limit: int) -> list[bytes] | None:
        """1 to ``limit`` frame payloads (``b""`` is a heartbeat); ``None`` once ``stop`` is set.

        Returns the complete frames already received, reading more only while there are none.
        Raises :class:`_Closed`, :class:`_Stalled`, :class:`ProtocolError` or ``OSError``.
        """
        while not self._stop.is_set():
            payloads = self._split(limit)
            if payloads:
                self._last_frame = self._clock()
                return payloads
            try:
                data = self._conn.recv(_RECV_SIZE)  # the socket's timeout is poll_interval
            except TimeoutError:
                silent = self._clock() - self._last_frame
                if silent >= self._stall_after:
                    raise _Stalled(f"nothing from the relay for {silent:.3g}s, not even a heartbeat") from None
                continue
            if not data:
                where = " in the middle of a frame" if self._buffer else ""
                raise _Closed(f"the relay closed the connection{where}")
            self._buffer += data
        return None

    def _split(self, limit: int) -> list[bytes]:
        """Take up to ``limit`` complete frames off the buffer (one copy each, one trim at the end)."""
        buffer = self._buffer
        payloads: list[bytes] = []
        offset = 0
        with memoryview(buffer) as view:
            while len(payloads) < limit and len(buffer) - offset >= HEADER.size:
                (length,) = HEADER.unpack_from(buffer, offset)
                if length > MAX_FRAME:
                    if payloads:
                        break  # hand out the good frames first; the next call raises
                    raise ProtocolError(f"frame length {length} exceeds {MAX_FRAME} bytes")
                end = offset + HEADER.size + length
                if end > len(buffer):
                    break
                payloads.append(view[offset + HEADER.size : end].tobytes())
                offset = end
        del buffer[:offset]
        return payloads


class RelayClient:
    """Read kernel log records from a kmsg relay socket until told to stop (an ``agent.sources.producer.Source``).

    ``batches()`` connects (retrying with exponential backoff, ``backoff_initial`` doubling up to
    ``backoff_max``, reset after a good hello), reads the hello, then record frames, and parses each
    record with the host boot time from the hello; it yields the records of all frames received so
    far as one list (at most ``BATCH_MAX``). ``records()`` yields the same records one by one. Each
    connection replays the relay's ring buffer from its oldest record: records with ``seq`` <= the
    last one delivered are skipped, and a jump in sequence numbers is counted in ``records_lost`` (a
    new ``boot_id`` in a hello starts the accounting afresh). Neither raises; only ``stop`` ends
    them, within about ``poll_interval``.

    Counters (``stats``): every reconnect counts in ``reader_restarts``: after a failed connect, a
    protocol error, a stall, or the relay closing the connection; all of these except an orderly
    close by the relay also count in ``read_errors``, and set ``last_error`` (cleared by the next
    record or heartbeat). ``connected`` is true while a connection is open.

    ``last_activity`` (``clock()``) is set whenever a record or a heartbeat arrives, and at no other
    time: not on connect or hello, not while waiting, backing off or reconnecting, and not while the
    consumer holds on to a yielded batch or record. A live relay sends a heartbeat every couple of poll
    intervals when idle, so ``/healthz`` (``now - last_activity < stall_timeout``) stays green; a
    relay that is gone, or that accepts connections but cannot read the kernel log (it then sends
    no heartbeats), turns it red after ``stall_timeout`` even though reconnects keep succeeding.
    When nothing arrives for ``stall_after`` seconds the connection is dropped and reopened.

    ``sleep`` replaces the interruptible wait used for backoff (default ``stop.wait``).
    """

    def __init__(
        self,
        *,
        path: str | Path,
        stats: KmsgStats,
        poll_interval: float = 1.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 10.0,
        stall_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if poll_interval <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial or stall_after <= 0:
            raise ValueError("need poll_interval > 0, stall_after > 0 and 0 < backoff_initial <= backoff_max")
        self._path = os.fspath(path)
        self._stats = stats
        self._poll_interval = poll_interval
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._stall_after = stall_after
        self._clock = clock
        self._sleep = sleep
        self._log = logger if logger is not None else _logger
        self._hello: Hello | None = None
        self._tracked_boot: str | None = None

    # -- public ------------------------------------------------------------------------------------

    @property
    def stats(self) -> KmsgStats:
        """The counters this client updates (read them at any time; one writer, this client)."""
        return self._stats

    @property
    def hello(self) -> Hello | None:
        """The hello of the current (or last) connection: the host's boot time and boot id."""
        return self._hello

    def chunks(self, *, stop: threading.Event) -> Iterator[list[LogRecord]]:
        """The :class:`~agent.sources.producer.Source` interface: the relay's chunks are record batches."""
        return self.batches(stop=stop)

    @staticmethod
    def decode(chunk: list[LogRecord]) -> list[LogRecord]:
        return chunk

    def records(self, *, stop: threading.Event) -> Iterator[LogRecord]:
        """Yield parsed records one by one until ``stop`` is set: :meth:`batches`, flattened."""
        batches = self.batches(stop=stop)
        try:
            for batch in batches:
                for record in batch:
                    if stop.is_set():
                        return
                    yield record
        finally:
            batches.close()  # closes the connection now, not when the generator is collected

    def batches(self, *, stop: threading.Event) -> Generator[list[LogRecord], None, None]:
        """Yield lists of parsed records until ``stop`` is set; unparsable records are counted and skipped.

        Each list holds the new records of all frames already received (1 to ``BATCH_MAX``), so a
        busy relay costs one yield per ``recv()`` rather than one per record.
        """
        sleep = self._sleep if self._sleep is not None else stop.wait
        backoff = Backoff(initial=self._backoff_initial, maximum=self._backoff_max)
        tracker: SequenceTracker | None = None
        while not stop.is_set():
            try:
                conn = self._connect()
            except OSError as exc:
                self._failed(f"cannot connect to {self._path} ({exc})", backoff.delay, error=True)
            else:
                self._stats.connected = True
                try:
                    frames = _FrameReader(conn, stop=stop, stall_after=self._stall_after, clock=self._clock)
                    hello = self._handshake(frames)
                    if hello is None:
                        return  # stop
                    backoff.reset()
                    tracker = self._tracker_for(hello, tracker)
                    yield from self._stream(frames, hello=hello, tracker=tracker)
                    return  # _stream only returns on stop
                except _Closed as exc:
                    self._failed(str(exc), backoff.delay, error=False)
                except (_Stalled, ProtocolError, OSError) as exc:
                    self._failed(f"{exc}", backoff.delay, error=True)
                finally:
                    self._stats.connected = False
                    conn.close()
            self._wait(backoff.next_delay(), sleep=sleep, stop=stop)

    # -- one connection ----------------------------------------------------------------------------

    def _connect(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(self._poll_interval)
        try:
            conn.connect(self._path)
        except OSError:
            conn.close()
            raise
        return conn

    def _handshake(self, frames: _FrameReader) -> Hello | None:
        payloads = frames.frames(limit=1)
        if payloads is None:
            return None
        hello = Hello.decode(payloads[0])
        self._hello = hello
        self._log.info(
            "kmsg relay: connected to %s (boot id %s, boot time %.6f)", self._path, hello.boot_id, hello.boot_time
        )
        return hello

    def _tracker_for(self, hello: Hello, tracker: SequenceTracker | None) -> SequenceTracker:
        """Keep the sequence accounting across reconnects, unless the relay reports another boot."""
        previous = self._tracked_boot
        if tracker is not None and hello.boot_id is not None and previous is not None and hello.boot_id != previous:
            self._log.warning(
                "kmsg relay: boot id changed from %s to %s; sequence numbers start afresh", previous, hello.boot_id
            )
            tracker = None
        if hello.boot_id is not None:
            self._tracked_boot = hello.boot_id
        if tracker is None:
            tracker = SequenceTracker(start_after_seq=None, stats=self._stats, log=self._log)
        return tracker

    def _stream(self, frames: _FrameReader, *, hello: Hello, tracker: SequenceTracker) -> Iterator[list[LogRecord]]:
        stats = self._stats
        while (payloads := frames.frames(limit=BATCH_MAX)) is not None:
            self._touch()  # after the hello every frame is a record or a heartbeat
            decoded = decode([p for p in payloads if p], mode=Mode.RELAY, boot_time=hello.boot_time)  # b"": heartbeat
            batch: list[LogRecord] = []
            start = 0
            records = decoded.records
            for before, error in decoded.errors:
                batch += tracker.accept_all(records[start:before])
                start = before
                stats.parse_errors += 1
                self._log.warning("kmsg relay: skipping a record: %s", error)
            batch += tracker.accept_all(records[start:])
            if batch:
                stats.records_read += len(batch)
                stats.last_record_time = batch[-1].timestamp
                yield batch

    # -- bookkeeping -------------------------------------------------------------------------------

    def _failed(self, why: str, delay: float, *, error: bool) -> None:
        self._stats.reader_restarts += 1
        if error:
            self._stats.read_errors += 1
            self._stats.last_error = f"kmsg relay {self._path}: {why}"
        self._log.warning("kmsg relay: %s; reconnecting in %.3gs", why, delay)

    def _wait(self, delay: float, *, sleep: Callable[[float], object], stop: threading.Event) -> None:
        """Wait ``delay`` seconds in slices of at most ``poll_interval``, checking ``stop`` in between."""
        remaining = delay
        while remaining > 0 and not stop.is_set():
            step = min(self._poll_interval, remaining)
            sleep(step)
            remaining -= step

    def _touch(self) -> None:
        self._stats.last_activity = self._clock()
        self._stats.last_error = None
