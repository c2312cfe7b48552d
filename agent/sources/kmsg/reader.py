"""The ``/dev/kmsg`` reader: read kernel log records, account for lost ones, hand them to the decoder.

The record format is :mod:`agent.sources.kmsg.format`, the decoder :mod:`agent.sources.kmsg.decoder`,
the sequence accounting :mod:`agent.sources.kmsg.sequence`, the restart cursor policy
:mod:`agent.sources.replay`, the retry schedule :mod:`agent.core.backoff`.

The real device returns exactly one record per ``read()``; the reader reads on while more is ready and
hands up to 4096 records at once to the decoder. It also accepts a regular file or a FIFO holding many
concatenated records (test fixtures), read in 64 KiB chunks and decoded a chunk at a time.

Restart semantics: the reader remembers the last sequence number it delivered. After a reopen the
kernel replays the ring buffer from its oldest record; records already delivered are skipped, and
a jump in sequence numbers is counted as lost records. Across process restarts the same idea is
carried by :mod:`agent.sources.replay`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.backoff import Backoff
from agent.core.columns import RecordColumns
from agent.core.types import LogRecord
from agent.sources.kmsg.boot import boot_time_now
from agent.sources.kmsg.decoder import Decoded, Mode, decode
from agent.sources.kmsg.format import KmsgParseError
from agent.sources.kmsg.sequence import SequenceTracker
from agent.sources.kmsg.stats import KmsgStats

_logger = logging.getLogger(__name__)

# The kernel refuses (EINVAL) a read() whose buffer cannot hold the next record; records are at most
# about 8 KiB (CONSOLE_EXT_LOG_MAX), so twice that is safe.
_DEVICE_READ_SIZE = 16 * 1024
_FILE_READ_SIZE = 64 * 1024
# A regular file or FIFO that never produces a record boundary must not grow the buffer forever.
_MAX_PENDING = 64 * 1024
MAX_BATCH = 4096  # records per list yielded by KmsgReader.batches()
_WAKE_DRAIN = 4096  # bytes read from the wake pipe at a time (a full pipe, 64 KiB, in 16 reads)
_BATCH_READS = range(MAX_BATCH)  # reads of /dev/kmsg per chunk at most (an EPIPE takes one too)


def open_nonblocking(path: str) -> int:
    """The default ``opener`` of :class:`KmsgReader`: ``os.open(path, O_RDONLY | O_NONBLOCK)``."""
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)


# --------------------------------------------------------------------------------------------------
# Reader


# (major, minor) of the kernel's own /dev/kmsg (drivers/char/mem.c: MEM_MAJOR, minor 11 "kmsg"), whatever path
# or mount namespace names it: the one device whose every line the kernel formats (see ``Mode.KERNEL_DEVICE``).
KMSG_DEVICE_NUMBERS = (1, 11)


def is_kernel_log(st: os.stat_result) -> bool:
    """Whether ``st`` is the kernel's /dev/kmsg (not another character device, a FIFO or a file)."""
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == KMSG_DEVICE_NUMBERS


@dataclass(frozen=True, slots=True, kw_only=True)
class _Source:
    fd: int
    mode: Mode  # a device mode for a character device (the real /dev/kmsg): one record per read()
    is_regular: bool
    identity: tuple[int, int]  # (st_dev, st_ino): is the path still naming this file?

    @classmethod
    def open(cls, path: str, *, opener: Callable[[str], int]) -> _Source:
        fd = opener(path)
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        return cls(
            fd=fd,
            mode=_mode(st),
            is_regular=stat.S_ISREG(st.st_mode),
            identity=(st.st_dev, st.st_ino),
        )

    def close(self) -> None:
        os.close(self.fd)


def _mode(st: os.stat_result) -> Mode:
    """How the decoder takes what is read from the file ``st`` describes."""
    if is_kernel_log(st):
        return Mode.KERNEL_DEVICE
    return Mode.OTHER_DEVICE if stat.S_ISCHR(st.st_mode) else Mode.FILE


def _complete_end(buf: bytes) -> int:
    """How much of ``buf`` is complete records: where the last record that may still grow starts."""
    end = buf.rfind(b"\n") + 1
    if end == 0 or (end < len(buf) and buf[end] != 0x20):
        return end  # no complete line, or a record (not a dictionary line) has begun after the last one
    line_end = end - 1
    while line_end > 0:  # walk back over dictionary lines to the last record's first line
        start = buf.rfind(b"\n", 0, line_end) + 1
        if buf[start] != 0x20:
            return start
        line_end = start - 1
    return 0


def _describe(exc: OSError) -> str:
    """``[Errno 13] Permission denied``: the error without the file name (the caller names it)."""
    return f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None and exc.strerror else str(exc)


# (complete records, the sequence accounting that applies, the source they were read from)
_Chunks = Generator[tuple[bytes, SequenceTracker, _Source], None, bool]


@dataclass(frozen=True, slots=True)
class RawChunk:
    """Complete records as read, with the boot time at reading and the sequence accounting that applies."""

    data: bytes
    boot_time: float
    tracker: SequenceTracker
    mode: Mode = Mode.FILE  # where it was read: how far the decoder can trust it


class KmsgReader:
    """Read records from ``/dev/kmsg`` (or a file/FIFO of concatenated records) until told to stop.

    Errors never end the iteration: the source is closed, counted and reopened after an exponential
    backoff (``backoff_initial`` doubling up to ``backoff_max``, reset after a successful read).
    Only ``stop`` (or end of a regular file/FIFO with ``follow=False``) ends it.

    At end of input a pending record is handed out once its last line is complete (``follow=True``) or
    as it is (``follow=False``). A FIFO without a writer reads as end of input, so with ``follow=False``
    open the writer first. While following a regular file or FIFO, the reader notices at end of input
    when the path names another file or none (rotation, deletion) or the file shrank (truncation): it
    reads the old file to its end, then reopens the path and reads the new file from its start, with
    fresh sequence accounting.

    ``start_after_seq``: records with ``seq <= start_after_seq`` are skipped (a cursor from the same
    boot); a jump past it is counted as lost. ``sleep`` replaces the interruptible wait used for
    backoff and for polling a file at its end (default: ``stop.wait``). ``clock`` feeds
    ``stats.last_activity``. ``opener`` opens the path and returns a file descriptor (default
    :func:`open_nonblocking`); ``read`` reads from it (default ``os.read``).
    """

    def __init__(
        self,
        *,
        path: str | Path,
        stats: KmsgStats,
        boot_time: Callable[[], float] = boot_time_now,
        poll_interval: float = 1.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        follow: bool = True,
        start_after_seq: int | None = None,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        opener: Callable[[str], int] = open_nonblocking,
        read: Callable[[int, int], bytes] = os.read,
        logger: logging.Logger | None = None,
        idle_wait: float | None = None,
        poller: Callable[[], select.poll] = select.poll,
    ) -> None:
        """``idle_wait``: the longest a wait for new records on a device or FIFO lasts, i.e. how often an idle
        reader shows it is alive (``stats.last_activity``; default ``poll_interval``). New records (once the
        kernel wakes its readers), :meth:`catch_up` and :meth:`wake` end the wait, so it only sets the idle
        wakeups. ``poller`` makes the poll objects those waits use."""
        if poll_interval <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError("need poll_interval > 0 and 0 < backoff_initial <= backoff_max")
        if idle_wait is not None and idle_wait <= 0:
            raise ValueError("need idle_wait > 0")
        self._idle_wait = idle_wait if idle_wait is not None else poll_interval
        self._wake_fds: tuple[int, int] | None = None  # (read, write) of the pipe wake() writes to
        self._device: select.poll | None = None  # the open device, for catch_up(); set and cleared under the lock
        self._wake_lock = threading.Lock()
        self._poller = poller
        self._path = os.fspath(path)
        self._stats = stats
        self._boot_time = boot_time
        self._poll_interval = poll_interval
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._follow = follow
        self._start_after_seq = start_after_seq
        self._sleep = sleep
        self._clock = clock
        self._opener = opener
        self._read = read
        self._log = logger if logger is not None else _logger

    # -- public ------------------------------------------------------------------------------------

    @property
    def stats(self) -> KmsgStats:
        """The counters this reader updates (read them at any time; one writer, this reader)."""
        return self._stats

    def catch_up(self) -> bool:
        """Whether the kernel holds records this reader has not read yet (the open device polls readable, or
        reports records overwritten before they were read); if it does, the reader's wait for them ends now.
        Any thread, any time; False while no device is open, and always for a file or FIFO (a file polls
        readable at its end too).

        The kernel marks the device readable at once but wakes its readers only at its next tick; a scrape
        (:class:`agent.core.bus.CaughtUp`) would wait for that tick too (docs/benchmarks.md, "The kmsg fast path")."""
        with self._wake_lock:  # never a poll of (or a write to) a descriptor closed and reused meanwhile
            if self._device is None:
                return False
            try:
                waiting = bool(self._device.poll(0))
            except OSError:  # out of memory for the poll: nothing known, nothing waited for
                return False
            if waiting:
                self._end_wait()
            return waiting

    def wake(self) -> None:
        """Stop was set: end a wait for new records now (any thread; the supervisor calls it)."""
        with self._wake_lock:  # never a write to a descriptor closed (and reused) meanwhile
            self._end_wait()

    def _end_wait(self) -> None:
        """End the reader's wait (under the wake lock): a byte in its wake pipe."""
        if self._wake_fds is not None:
            with contextlib.suppress(BlockingIOError):  # full: woken already
                os.write(self._wake_fds[1], b"\0")

    def chunks(self, *, stop: threading.Event) -> Iterator[RawChunk]:
        """Yield raw chunks of complete records until ``stop`` is set; :meth:`decode` turns one into records.

        Reading and decoding are apart so that the reading thread only does I/O: the agent's main
        loop decodes, and the two threads do not compete for the interpreter lock record by record.
        """
        for data, tracker, source in self._chunks(stop=stop):
            yield RawChunk(
                data=data,
                boot_time=self._boot_time(),
                tracker=tracker,
                mode=source.mode,
            )

    def decode(self, chunk: RawChunk) -> Sequence[LogRecord]:
        """The new records of a chunk, in order; call in chunk order, from one thread: :func:`decode_chunk`."""
        return decode_chunk(chunk, stats=self._stats, log=self._log, where=self._path)

    def batches(self, *, stop: threading.Event) -> Iterator[list[LogRecord]]:
        """Yield lists of new parsed records (1 to 4096, in order) until ``stop`` is set (see :meth:`decode`)."""
        for chunk in self.chunks(stop=stop):
            records = self.decode(chunk)
            for start in range(0, len(records), MAX_BATCH):
                yield list(records[start : start + MAX_BATCH])

    def records(self, *, stop: threading.Event) -> Iterator[LogRecord]:
        """Yield parsed records one by one until ``stop`` is set (see :meth:`batches`)."""
        for batch in self.batches(stop=stop):
            yield from batch

    # -- opening, reopening ------------------------------------------------------------------------

    def _chunks(self, *, stop: threading.Event) -> Iterator[tuple[bytes, SequenceTracker, _Source]]:
        """Yield chunks of complete records, each with the sequence tracker that applies to it."""
        wake_fds = self._wake_fds = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # before the first look at stop
        try:
            yield from self._chunks_until_stop(stop=stop)
        finally:
            with self._wake_lock:
                self._wake_fds = None
                for fd in wake_fds:
                    os.close(fd)

    def _chunks_until_stop(self, *, stop: threading.Event) -> Iterator[tuple[bytes, SequenceTracker, _Source]]:
        sleep = self._sleep if self._sleep is not None else stop.wait
        tracker = SequenceTracker(start_after_seq=self._start_after_seq, stats=self._stats, log=self._log)
        backoff = Backoff(initial=self._backoff_initial, maximum=self._backoff_max)
        while not stop.is_set():
            try:
                source = _Source.open(self._path, opener=self._opener)
            except OSError as exc:
                self._failed("open", exc, backoff.delay)
            else:
                self._stats.connected = True
                try:
                    if source.mode.device:
                        device = select.poll()
                        device.register(source.fd, select.POLLIN)
                        with self._wake_lock:
                            self._device = device
                        replaced = yield from self._read_device(
                            source, tracker, stop=stop, sleep=sleep, backoff=backoff
                        )
                    else:
                        replaced = yield from self._read_stream(
                            source, tracker, stop=stop, sleep=sleep, backoff=backoff
                        )
                    if not replaced:
                        return  # stop was set, or the end of input with follow=False
                    tracker = SequenceTracker(start_after_seq=None, stats=self._stats, log=self._log)
                    continue  # reopen the path at once
                except OSError as exc:
                    self._failed("read", exc, backoff.delay)
                finally:
                    self._stats.connected = False
                    with self._wake_lock:
                        self._device = None
                    source.close()
            sleep(backoff.next_delay())

    # -- reading one open source -------------------------------------------------------------------

    def _read_device(
        self,
        source: _Source,
        tracker: SequenceTracker,
        *,
        stop: threading.Event,
        sleep: Callable[[float], object],
        backoff: Backoff,
    ) -> _Chunks:
        """One record per read(): read on while more is ready, up to MAX_BATCH records a chunk."""
        read, fd = self._read, source.fd
        while not stop.is_set():
            reads: list[bytes] = []
            append = reads.append
            again = end = False
            error: OSError | None = None
            for _ in _BATCH_READS:  # the loop runs once per record: as little Python in it as can be
                try:
                    data = read(fd, _DEVICE_READ_SIZE)
                except BlockingIOError:  # EAGAIN: nothing more for now
                    again = True
                    break
                except BrokenPipeError:  # EPIPE: records overwritten; the next read returns the oldest left
                    self._overrun()
                    continue
                except OSError as exc:
                    error = exc
                    break
                if not data:
                    end = True
                    break
                append(data)
            if reads:
                self._alive()
                backoff.reset()
                if not all(map(bytes.endswith, reads, itertools.repeat(b"\n"))):  # the kernel's always do
                    reads = [data if data.endswith(b"\n") else data + b"\n" for data in reads]  # keep records apart
                yield b"".join(reads), tracker, source
            if error is not None:
                raise error  # after handing out what was read before it
            if not reads:
                self._alive()  # EAGAIN or end of input: the open device answered
            if again:
                self._wait_readable(fd)
            elif end:
                if not self._follow:
                    return False
                sleep(self._poll_interval)
        return False

    def _read_stream(
        self,
        source: _Source,
        tracker: SequenceTracker,
        *,
        stop: threading.Event,
        sleep: Callable[[float], object],
        backoff: Backoff,
    ) -> _Chunks:
        """Concatenated records in chunks; returns True when a followed file was replaced (reopen it)."""
        read, fd = self._read, source.fd
        pending = b""
        replaced = False
        while not stop.is_set():
            try:
                data = read(fd, _FILE_READ_SIZE)
            except BlockingIOError:  # EAGAIN (a FIFO): nothing more for now
                self._alive()
                if pending.endswith(b"\n"):
                    yield pending, tracker, source
                    pending = b""
                self._wait_readable(fd)
                continue
            except BrokenPipeError:
                self._overrun()
                continue
            except OSError:
                if pending.endswith(b"\n"):
                    yield pending, tracker, source  # what was read before the error
                raise
            self._alive()
            if not data:  # end of a regular file, or a FIFO without writer
                if not self._follow:
                    if pending:
                        yield pending, tracker, source
                    return False
                if pending.endswith(b"\n"):
                    yield pending, tracker, source
                    pending = b""
                if replaced:
                    return True  # the old file is read to its end
                if self._was_replaced(source):
                    replaced = True  # read what was written to the old file meanwhile, then reopen
                    continue
                sleep(self._poll_interval)
                continue
            backoff.reset()
            buf = pending + data if pending else data
            end = _complete_end(buf)
            pending = buf[end:]
            if end:
                yield buf[:end], tracker, source
            if len(pending) > _MAX_PENDING:
                yield pending, tracker, source
                pending = b""
        return False

    def _was_replaced(self, source: _Source) -> bool:
        """Whether the path now names another file or none, or the regular file shrank under us."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            self._log.warning("kmsg: %s was removed; reopening", self._path)
            return True
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != source.identity:
            self._log.info("kmsg: %s now names another file; reading that from its start", self._path)
            return True
        if source.is_regular and st.st_size < os.lseek(source.fd, 0, os.SEEK_CUR):
            self._log.info("kmsg: %s was truncated; reading it from its start", self._path)
            return True
        return False

    def _wait_readable(self, fd: int) -> None:
        """Until ``fd`` has data (the kernel woke its readers), :meth:`catch_up` or :meth:`wake` is called, or
        ``idle_wait`` passes."""
        poller = self._poller()
        poller.register(fd, select.POLLIN)
        fds = self._wake_fds
        if fds is not None:
            poller.register(fds[0], select.POLLIN)
        ready = poller.poll(self._idle_wait * 1000)
        if fds is not None and any(ready_fd == fds[0] for ready_fd, _ in ready):
            try:  # scrapes may have written many bytes (catch_up) while the reader was busy reading
                while os.read(fds[0], _WAKE_DRAIN):
                    pass
            except BlockingIOError:
                pass

    # -- bookkeeping -------------------------------------------------------------------------------

    def _parse_failed(self, exc: KmsgParseError) -> None:
        _parse_failed(exc, stats=self._stats, log=self._log, where=self._path)

    def _overrun(self) -> None:
        self._stats.overruns += 1
        self._log.warning(
            "kmsg: ring buffer overrun on %s, records were overwritten before they could be read", self._path
        )

    def _failed(self, what: str, exc: OSError, delay: float) -> None:
        self._stats.read_errors += 1
        self._stats.reader_restarts += 1
        self._stats.last_error = f"cannot {what} {self._path}: {_describe(exc)}"
        self._log.warning("kmsg: %s; reopening in %.3gs", self._stats.last_error, delay)

    def _alive(self) -> None:
        """The open source answered: the reader is live and has no error to report."""
        self._stats.last_activity = self._clock()
        self._stats.last_error = None


def decode_chunk(chunk: RawChunk, *, stats: KmsgStats, log: logging.Logger, where: str) -> Sequence[LogRecord]:
    """The new records of a chunk read from ``where`` (the device, a file, or the relay: agent.sources.relay_client
    hands its chunks here too), in order; call in chunk order, from one thread. A chunk of well-formed records
    comes as :class:`RecordColumns` (each record built when asked for).

    Records whose header cannot be parsed are counted in ``parse_errors`` and skipped; malformed dictionary
    lines are counted in ``malformed_lines`` and dropped from their record.
    """
    if not chunk.data:
        return []
    decoded = decode(chunk.data, mode=chunk.mode, boot_time=chunk.boot_time)
    for line_error in decoded.bad_lines:
        stats.malformed_lines += 1
        log.warning("kmsg: dropping a dictionary line from %s: %s", where, line_error)
    records = _new_records(decoded, chunk.tracker, stats=stats, log=log, where=where)
    if records:
        stats.records_read += len(records)
        last = records.timestamps[-1] if isinstance(records, RecordColumns) else records[-1].timestamp
        stats.last_record_time = last
    return records


def _new_records(
    parsed: Decoded, tracker: SequenceTracker, *, stats: KmsgStats, log: logging.Logger, where: str
) -> Sequence[LogRecord]:
    """The records not delivered before; each skipped record counts once, as a parse error."""
    records = parsed.records
    if not parsed.errors:
        return tracker.accept_all(records)
    new: list[LogRecord] = []
    start = 0
    for before, error in parsed.errors:
        new += tracker.accept_all(records[start:before])
        start = before
        if tracker.skip(error.seq):
            _parse_failed(error, stats=stats, log=log, where=where)
    new += tracker.accept_all(records[start:])
    return new


def _parse_failed(exc: KmsgParseError, *, stats: KmsgStats, log: logging.Logger, where: str) -> None:
    stats.parse_errors += 1
    log.warning("kmsg: skipping a record from %s: %s", where, exc)
