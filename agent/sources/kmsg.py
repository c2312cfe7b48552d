"""The ``/dev/kmsg`` reader: read kernel log records, account for lost ones, turn them into ``LogRecord``s.

The record format lives in :mod:`agent.sources.kmsg_format`, the restart cursor policy in
:mod:`agent.sources.replay`, the retry schedule in :mod:`agent.backoff`.

The real device returns exactly one record per ``read()``. The same reader also accepts a regular
file or a FIFO holding many concatenated records (test fixtures, a relay), which it splits itself.

Restart semantics: the reader remembers the last sequence number it delivered. After a reopen the
kernel replays the ring buffer from its oldest record; records already delivered are skipped, and
a jump in sequence numbers is counted as lost records. Across process restarts the same idea is
carried by :mod:`agent.sources.replay`.
"""

from __future__ import annotations

import logging
import os
import re
import select
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.backoff import Backoff
from agent.sources.kmsg_format import KmsgParseError, boot_time_now, parse_header, parse_record
from agent.types import LogRecord

_logger = logging.getLogger(__name__)

# The kernel refuses (EINVAL) a read() whose buffer cannot hold the next record; records are at most
# about 8 KiB (CONSOLE_EXT_LOG_MAX), so twice that is safe.
_DEVICE_READ_SIZE = 16 * 1024
_FILE_READ_SIZE = 64 * 1024
# A regular file or FIFO that never produces a record boundary must not grow the buffer forever.
_MAX_PENDING = 64 * 1024
_RECORD_START = re.compile(rb"(?<=\n)(?=[^ ])")  # a new record starts at a line not beginning with a space

# --------------------------------------------------------------------------------------------------
# Reader


@dataclass
class KmsgStats:
    """Counters of one reader, read by the metrics sink and ``/healthz`` at scrape time.

    Thread-safety: the reader thread is the only writer. Each field is a plain int/float/bool whose
    assignment is atomic under the GIL, so other threads may read single fields at any time; they
    must not expect two fields to be consistent with each other.
    """

    records_read: int = 0  # records passed on by raw_records() (new seq); a few may still fail full parsing
    records_lost: int = 0  # sum of sequence-number gaps, including ring-buffer overwrites (EPIPE)
    overruns: int = 0  # EPIPE reads: the kernel overwrote records before we read them
    reader_restarts: int = 0  # reopens after an error
    read_errors: int = 0  # OSErrors on open/read (other than EAGAIN/EPIPE)
    parse_errors: int = 0  # records skipped because they could not be parsed
    last_record_time: float | None = None  # wall-clock timestamp of the last delivered record
    # clock() (time.monotonic) of the last loop iteration: refreshed at least every poll_interval while idle
    # or in backoff, but not while the consumer holds on to a yielded record (a stalled pipeline goes stale).
    last_activity: float | None = None
    connected: bool = False  # the source is open


class _RecordSplitter:
    """Split a byte stream of concatenated records; a record starts at a line not beginning with a space."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Add data; return the records known to be complete (a following record has started)."""
        parts = _RECORD_START.split(self._pending + data)
        self._pending = parts.pop()
        if len(self._pending) > _MAX_PENDING:
            parts.append(self._pending)
            self._pending = b""
        return [p for p in parts if p.strip()]

    def flush_complete_lines(self) -> list[bytes]:
        """No more data for now: hand out the pending record if its last line is complete."""
        if self._pending.endswith(b"\n"):
            return self.flush_all()
        return []

    def flush_all(self) -> list[bytes]:
        """End of input: hand out whatever is pending, even an unterminated last line."""
        pending, self._pending = self._pending, b""
        return [pending] if pending.strip() else []


class SequenceTracker:
    """Skip records already seen and count gaps in sequence numbers as lost records."""

    def __init__(self, *, start_after_seq: int | None, stats: KmsgStats, log: logging.Logger) -> None:
        self._last = start_after_seq
        self._stats = stats
        self._log = log

    def accept(self, seq: int) -> bool:
        last = self._last
        if last is not None:
            if seq <= last:
                return False
            if seq > last + 1:
                lost = seq - last - 1
                self._stats.records_lost += lost
                self._log.warning("kmsg: %d record(s) lost (sequence jumped from %d to %d)", lost, last, seq)
        self._last = seq
        return True


@dataclass(frozen=True, slots=True)
class _Source:
    fd: int
    one_record_per_read: bool  # the real character device

    @classmethod
    def open(cls, path: str) -> _Source:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            is_device = stat.S_ISCHR(os.fstat(fd).st_mode)
        except OSError:
            os.close(fd)
            raise
        return cls(fd=fd, one_record_per_read=is_device)

    @property
    def read_size(self) -> int:
        return _DEVICE_READ_SIZE if self.one_record_per_read else _FILE_READ_SIZE

    def close(self) -> None:
        os.close(self.fd)


class KmsgReader:
    """Read records from ``/dev/kmsg`` (or a file/FIFO of concatenated records) until told to stop.

    Errors never end the iteration: the source is closed, counted and reopened after an exponential
    backoff (``backoff_initial`` doubling up to ``backoff_max``, reset after a successful read).
    Only ``stop`` (or end of a regular file/FIFO with ``follow=False``) ends it.

    The real device (a character device) gives one record per ``read()``. Anything else is read in
    chunks and split into records; at end of input a pending record is handed out once its last line
    is complete (``follow=True``) or as it is (``follow=False``). A FIFO without a writer reads as end
    of input, so with ``follow=False`` open the writer first.

    ``start_after_seq``: records with ``seq <= start_after_seq`` are skipped (a cursor from the same
    boot); a jump past it is counted as lost. ``sleep`` replaces the interruptible wait used for
    backoff and for polling a file at its end (default: ``stop.wait``). ``clock`` feeds
    ``stats.last_activity``.
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
        logger: logging.Logger | None = None,
    ) -> None:
        if poll_interval <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError("need poll_interval > 0 and 0 < backoff_initial <= backoff_max")
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
        self._log = logger if logger is not None else _logger

    # -- public ------------------------------------------------------------------------------------

    @property
    def stats(self) -> KmsgStats:
        """The counters this reader updates (read them at any time; one writer, this reader)."""
        return self._stats

    def records(self, *, stop: threading.Event) -> Iterator[LogRecord]:
        """Yield parsed records until ``stop`` is set; unparsable records are counted and skipped."""
        for raw in self.raw_records(stop=stop):
            try:
                record = parse_record(raw, boot_time=self._boot_time())
            except KmsgParseError as exc:
                self._parse_failed(exc)
                continue
            yield record

    def raw_records(self, *, stop: threading.Event) -> Iterator[bytes]:
        """Yield raw records (bytes as read, one record each) until ``stop`` is set.

        Sequence accounting, duplicate skipping and reconnects happen here; a record whose header
        cannot be parsed is counted in ``parse_errors`` and skipped.
        """
        sleep = self._sleep if self._sleep is not None else stop.wait
        tracker = SequenceTracker(start_after_seq=self._start_after_seq, stats=self._stats, log=self._log)
        backoff = Backoff(initial=self._backoff_initial, maximum=self._backoff_max)
        while not stop.is_set():
            self._touch()
            try:
                source = _Source.open(self._path)
            except OSError as exc:
                self._failed("open", exc, backoff.delay)
            else:
                self._stats.connected = True
                try:
                    for raw in self._read_source(source, stop=stop, sleep=sleep, backoff=backoff):
                        if self._accept(raw, tracker):
                            yield raw
                    return  # stop was set, or the end of input with follow=False
                except OSError as exc:
                    self._failed("read", exc, backoff.delay)
                finally:
                    self._stats.connected = False
                    source.close()
            self._wait(backoff.next_delay(), sleep=sleep, stop=stop)

    # -- reading one open source -------------------------------------------------------------------

    def _read_source(
        self, source: _Source, *, stop: threading.Event, sleep: Callable[[float], object], backoff: Backoff
    ) -> Iterator[bytes]:
        """Yield records from one open source; returns on stop or, with follow=False, at EOF."""
        splitter = _RecordSplitter()
        while not stop.is_set():
            self._touch()
            try:
                data = os.read(source.fd, source.read_size)
            except BlockingIOError:  # EAGAIN: nothing more for now
                yield from splitter.flush_complete_lines()
                self._wait_readable(source.fd)
                continue
            except BrokenPipeError:  # EPIPE: records overwritten; the next read returns the oldest left
                self._stats.overruns += 1
                self._log.warning(
                    "kmsg: ring buffer overrun on %s, records were overwritten before they could be read", self._path
                )
                continue
            if not data:  # end of a regular file, or a FIFO without writer
                if not self._follow:
                    yield from splitter.flush_all()
                    return
                yield from splitter.flush_complete_lines()
                sleep(self._poll_interval)
                continue
            backoff.reset()
            if source.one_record_per_read:
                yield data
            else:
                yield from splitter.feed(data)

    def _wait_readable(self, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(self._poll_interval * 1000)

    # -- bookkeeping -------------------------------------------------------------------------------

    def _accept(self, raw: bytes, tracker: SequenceTracker) -> bool:
        try:
            header = parse_header(raw.split(b"\n", 1)[0])
        except KmsgParseError as exc:
            self._parse_failed(exc)
            return False
        if not tracker.accept(header.seq):
            return False
        self._stats.records_read += 1
        self._stats.last_record_time = self._boot_time() + header.usec / 1e6
        return True

    def _parse_failed(self, exc: KmsgParseError) -> None:
        self._stats.parse_errors += 1
        self._log.warning("kmsg: skipping a record from %s: %s", self._path, exc)

    def _failed(self, what: str, exc: OSError, delay: float) -> None:
        self._stats.read_errors += 1
        self._stats.reader_restarts += 1
        self._log.warning("kmsg: cannot %s %s (%s); reopening in %.3gs", what, self._path, exc, delay)

    def _wait(self, delay: float, *, sleep: Callable[[float], object], stop: threading.Event) -> None:
        """Wait ``delay`` seconds in slices of at most ``poll_interval``, staying visibly alive."""
        remaining = delay
        while remaining > 0 and not stop.is_set():
            step = min(self._poll_interval, remaining)
            sleep(step)
            remaining -= step
            self._touch()

    def _touch(self) -> None:
        self._stats.last_activity = self._clock()


