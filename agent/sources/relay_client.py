"""Kernel log records from a kmsg relay over a UNIX socket (protocol: :mod:`agent.sources.relay_protocol`).

The unprivileged agent cannot open the host's ``/dev/kmsg``; a privileged relay container can, and
serves what it reads on a socket in a shared emptyDir. :class:`RelayClient` is a drop-in
:class:`agent.sources.producer.Source` for that socket: same ``KmsgStats``, same chunks
(:class:`~agent.sources.kmsg.reader.RawChunk`), same decoding and sequence accounting as
:class:`~agent.sources.kmsg.reader.KmsgReader` (:func:`~agent.sources.kmsg.reader.decode_chunk`).

How the client knows a chunk is the kernel's: the fast path (:attr:`Mode.KERNEL_DEVICE`, which parses only a
chunk's first and last lines) is taken only when both hold: the relay's hello says it reads the kernel's own
device (character device 1:11, from its ``fstat``), and the process serving the socket is the one this client
trusts to say so: its ``SO_PEERCRED`` uid, read by the kernel at connect time and unforgeable, is
``trusted_uid`` (default 0: the relay container runs as root, the agent and everything it starts as 65532, so
no process of the agent's pod but the relay can serve it). A socket served by anyone else (something of the
agent's uid that replaced the socket file in the emptyDir) still works, but its chunks are decoded as
another device's, every line checked (:attr:`Mode.OTHER_DEVICE`), and a warning says why. The relay checks
its peer the same way (only the agent's uid and root may read the kernel log), so no other process reads
the records either.

Catch-up: :meth:`RelayClient.catch_up` (called when a scrape comes in) sends the relay a request byte and
waits for the answer (a round trip, at most ``ANSWER_WAIT``): the relay reads the device at once and sends
what it found in a sync frame. Chunks received while a request is unanswered are held (at most
``HOLD_MAX``) and handed on with the answer as one chunk; ``catch_up`` says whether that chunk holds
records, so the scrape (:class:`agent.core.bus.CaughtUp`) waits for it exactly when there is something to
wait for, as with the device read directly (``KmsgReader.catch_up``), and an idle scrape costs a round
trip, no main-loop step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path

from agent.core.backoff import Backoff
from agent.core.types import LogRecord
from agent.sources.kmsg.decoder import Mode
from agent.sources.kmsg.reader import RawChunk, decode_chunk
from agent.sources.kmsg.sequence import SequenceTracker
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.relay_protocol import (
    CATCH_UP,
    FILE,
    HEADER,
    KERNEL_DEVICE,
    MAX_FRAME,
    Chunk,
    Hello,
    ProtocolError,
)
from agent.sources.unixsocket import PeerCredentials

_logger = logging.getLogger(__name__)

_RECV_SIZE = 256 * 1024
BATCH_MAX = 4096  # records per list from RelayClient.batches()
HOLD_MAX = 0.05  # seconds a chunk waits for the answer to a catch-up request (a scrape waits 0.02 s at most)
ANSWER_WAIT = 0.01  # seconds catch_up() waits for the relay's answer
# Seconds the agent's reader waits on the socket for a frame before it looks at the clock (a stall): the
# relay's heartbeats wake it every couple of seconds anyway, and wake() ends the wait at stop.
IDLE_WAIT = 10.0


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
        self._timeout = conn.gettimeout() or 1.0  # poll_interval

    def frames(self, *, limit: int, until: float | None = None) -> list[bytes] | None:
        """1 to ``limit`` frame payloads (``b""`` is a heartbeat); ``None`` once ``stop`` is set; ``[]`` once
        ``clock()`` has passed ``until`` (when given) with no frame come.

        Returns the complete frames already received, reading more only while there are none.
        Raises :class:`_Closed`, :class:`_Stalled`, :class:`ProtocolError` or ``OSError``.
        """
        while not self._stop.is_set():
            payloads = self._split(limit)
            if payloads:
                self._last_frame = self._clock()
                return payloads
            if until is not None:
                left = until - self._clock()
                if left <= 0:
                    return []
                self._conn.settimeout(min(self._timeout, left))
            elif self._conn.gettimeout() != self._timeout:
                self._conn.settimeout(self._timeout)
            try:
                data = self._conn.recv(_RECV_SIZE)  # the socket's timeout is poll_interval (or less, until ``until``)
            except TimeoutError:
                silent = self._clock() - self._last_frame
                if silent >= self._stall_after:
                    raise _Stalled(f"nothing from the relay for {silent:.3g}s, not even a heartbeat") from None
                continue
            if not data:
                if self._stop.is_set():
                    return None  # wake() shut the connection down: stopping, not a relay gone
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

    ``chunks()`` connects (retrying with exponential backoff, ``backoff_initial`` doubling up to
    ``backoff_max``, reset after a good hello), reads the hello, then the relay's chunk frames, and yields
    the chunks of all frames received so far as one :class:`RawChunk` (the relay's bytes as the relay read
    them, joined), with the host boot time from the hello and the :class:`Mode` its source and this
    client's trust give (module docstring); :meth:`decode` turns one into records, on the main loop.
    ``batches()`` and ``records()`` do both, for callers without a main loop. Each connection replays the
    relay's ring buffer from its oldest record: a chunk whose records all have ``seq`` <= the last one
    delivered is dropped whole (by the sequence range in its frame), other old records are skipped when
    decoded, and a jump in sequence numbers is counted in ``records_lost`` (a new ``boot_id`` in a hello
    starts the accounting afresh). None of them raises; only ``stop`` ends them, within about
    ``poll_interval``.

    Counters (``stats``): every reconnect counts in ``reader_restarts``: after a failed connect, a
    protocol error, a stall, or the relay closing the connection; all of these except an orderly
    close by the relay also count in ``read_errors``, and set ``last_error`` (cleared by the next
    chunk or heartbeat). ``connected`` is true while a connection is open.

    ``last_activity`` (``clock()``) is set whenever a chunk or a heartbeat arrives, and at no other
    time: not on connect or hello, not while waiting, backing off or reconnecting, and not while the
    consumer holds on to a yielded chunk. A live relay sends a heartbeat every couple of poll
    intervals when idle, so ``/healthz`` (``now - last_activity < stall_timeout``) stays green; a
    relay that is gone, or that accepts connections but cannot read the kernel log (it then sends
    no heartbeats), turns it red after ``stall_timeout`` even though reconnects keep succeeding.
    When nothing arrives for ``stall_after`` seconds the connection is dropped and reopened.

    ``trusted_uid``: the uid whose relay may have its kernel-device chunks taken on the fast path (default
    root). ``answer_wait``: how long :meth:`catch_up` waits for the relay's answer. ``sleep`` replaces the
    interruptible wait used for backoff (default ``stop.wait``).
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
        trusted_uid: int = 0,
        answer_wait: float = ANSWER_WAIT,
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
        self._trusted_uid = trusted_uid
        self._answer_wait = answer_wait
        self._clock = clock
        self._sleep = sleep
        self._log = logger if logger is not None else _logger
        self._hello: Hello | None = None
        self._mode: Mode | None = None
        self._tracked_boot: str | None = None
        # catch_up() and the reader thread: the connection it writes to, the requests sent and answered
        self._answer = threading.Condition()
        self._conn: socket.socket | None = None  # set once the hello is in
        self._open: socket.socket | None = None  # the connection from connect() to close(): what wake() ends
        self._sent = 0  # catch-up requests sent on this connection
        self._answered = 0  # of which the relay has answered, by its count
        self._answered_with_records = 0  # the last answer's count, if it (with what was held) held records

    # -- public ------------------------------------------------------------------------------------

    @property
    def stats(self) -> KmsgStats:
        """The counters this client updates (read them at any time; one writer, this client)."""
        return self._stats

    @property
    def hello(self) -> Hello | None:
        """The hello of the current (or last) connection: the host's boot time and boot id, the relay's source."""
        return self._hello

    @property
    def mode(self) -> Mode | None:
        """How the current (or last) connection's chunks are decoded."""
        return self._mode

    def wake(self) -> None:
        """Stop was set: end the reader's wait on the relay now (the connection is shut down, so its ``recv``
        returns at once) rather than at its timeout. Any thread; the reader closes the connection as usual."""
        with self._answer:
            conn = self._open
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def catch_up(self) -> bool:
        """Have the relay read the kernel log now (a scrape came in) and say whether that brought records (they
        come as the reader's next chunk). Any thread, any time; waits for the relay's answer at most
        ``answer_wait`` (True past that: records may be on their way); False while not connected."""
        with self._answer:
            conn = self._conn
            if conn is None:
                return False
            try:
                conn.send(CATCH_UP)
            except OSError:  # full (the relay is behind: it answers the requests already sent) or gone
                return False
            self._sent += 1
            mine = self._sent
            if not self._answer.wait_for(lambda: self._answered >= mine or self._conn is not conn, self._answer_wait):
                return True
            return self._conn is conn and self._answered_with_records >= mine

    def decode(self, chunk: RawChunk) -> Sequence[LogRecord]:
        """The new records of a chunk, in order; call in chunk order, from one thread (as ``KmsgReader.decode``)."""
        return decode_chunk(chunk, stats=self._stats, log=self._log, where=f"kmsg relay {self._path}")

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
        """Yield lists of new parsed records (1 to ``BATCH_MAX``, in order) until ``stop`` is set."""
        chunks = self.chunks(stop=stop)
        try:
            for chunk in chunks:
                records = self.decode(chunk)
                for start in range(0, len(records), BATCH_MAX):
                    yield list(records[start : start + BATCH_MAX])
        finally:
            chunks.close()

    def chunks(self, *, stop: threading.Event) -> Generator[RawChunk, None, None]:
        """Yield the relay's chunks until ``stop`` is set (:meth:`decode` each, in order)."""
        sleep = self._sleep if self._sleep is not None else stop.wait
        backoff = Backoff(initial=self._backoff_initial, maximum=self._backoff_max)
        tracker: SequenceTracker | None = None
        while not stop.is_set():
            try:
                conn = self._connect()
            except OSError as exc:
                self._failed(f"cannot connect to {self._path} ({exc})", backoff.delay, error=True)
            else:
                with self._answer:
                    self._open = conn
                if stop.is_set():  # a wake() came before the connection was there to end
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)
                self._stats.connected = True
                try:
                    frames = _FrameReader(conn, stop=stop, stall_after=self._stall_after, clock=self._clock)
                    hello = self._handshake(frames)
                    if hello is None:
                        return  # stop
                    mode = self._mode = self._mode_for(hello, conn)
                    backoff.reset()
                    tracker = self._tracker_for(hello, tracker)
                    with self._answer:
                        self._conn, self._sent, self._answered, self._answered_with_records = conn, 0, 0, 0
                    yield from self._stream(frames, hello=hello, tracker=tracker, mode=mode)
                    return  # _stream only returns on stop
                except _Closed as exc:
                    self._failed(str(exc), backoff.delay, error=False)
                except (_Stalled, ProtocolError, OSError) as exc:
                    self._failed(f"{exc}", backoff.delay, error=True)
                finally:
                    with self._answer:
                        self._conn = self._open = None
                        self._answer.notify_all()
                        conn.close()  # under the lock: a wake() never shuts down a descriptor reused meanwhile
                    self._stats.connected = False
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
            "kmsg relay: connected to %s (boot id %s, boot time %.6f, reading %s)",
            self._path,
            hello.boot_id,
            hello.boot_time,
            hello.source,
        )
        return hello

    def _mode_for(self, hello: Hello, conn: socket.socket) -> Mode:
        """How this connection's chunks are decoded: the kernel's device only from the trusted relay."""
        if hello.source == FILE:
            return Mode.FILE
        if hello.source != KERNEL_DEVICE:
            return Mode.OTHER_DEVICE
        try:
            peer: PeerCredentials | None = PeerCredentials.of(conn)
        except OSError:
            peer = None
        if peer is not None and peer.uid == self._trusted_uid:
            return Mode.KERNEL_DEVICE
        who = f"uid {peer.uid} (pid {peer.pid})" if peer is not None else "a process whose credentials are unknown"
        self._log.warning(
            "kmsg relay: %s is served by %s, not uid %d: its records are checked line by line",
            self._path,
            who,
            self._trusted_uid,
        )
        return Mode.OTHER_DEVICE

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

    def _stream(
        self, frames: _FrameReader, *, hello: Hello, tracker: SequenceTracker, mode: Mode
    ) -> Iterator[RawChunk]:
        """The connection's chunks: those of all frames received at once joined, held while a catch-up is asked."""
        held: list[bytes] = []
        hold_until: float | None = None
        while (payloads := frames.frames(limit=BATCH_MAX, until=hold_until)) is not None:
            answered: int | None = None
            if payloads:
                self._touch()  # after the hello every frame is a chunk or a heartbeat
                for payload in payloads:
                    if not payload:
                        continue  # a heartbeat
                    chunk = Chunk.decode(payload)
                    if chunk.answered is not None:
                        answered = chunk.answered
                    if chunk.data and not _seen(chunk, tracker, mode):
                        held.append(chunk.data)
            with self._answer:
                if answered is not None:
                    self._answered = answered
                    if held:
                        self._answered_with_records = answered
                    self._answer.notify_all()
                waiting = self._sent > self._answered
            if waiting and held:
                now = self._clock()
                if hold_until is None:
                    hold_until = now + HOLD_MAX
                if now < hold_until:
                    continue  # the answer to a request is on its way: hand these on with it
            if held:
                yield RawChunk(data=b"".join(held), boot_time=hello.boot_time, tracker=tracker, mode=mode)
            held, hold_until = [], None

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


def _seen(chunk: Chunk, tracker: SequenceTracker, mode: Mode) -> bool:
    """Whether every record of a device's chunk was delivered before (a reconnect's replay), by its range alone.

    ``tracker.last`` moves on the main loop as it decodes; read here it can only lag, so a chunk is never
    dropped that holds anything new."""
    last = tracker.last
    return mode.device and chunk.last_seq > 0 and last is not None and chunk.first_seq <= chunk.last_seq <= last
