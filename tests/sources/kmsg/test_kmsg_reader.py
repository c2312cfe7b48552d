"""KmsgReader: batches, honest liveness, input faults and followed files (injected clock, sleep, open, read)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import select
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.types import LogRecord
from agent.sources.kmsg.reader import MAX_BATCH, KmsgReader, is_kernel_log
from agent.sources.kmsg.stats import KmsgStats

from helpers import ScriptedRead, wait_for

BOOT = 1_700_000_000.0


def rec(seq: int, message: str = "m", *, prio: int = 6, usec: int | None = None) -> bytes:
    return f"{prio},{seq},{seq * 1000 if usec is None else usec},-;{message}\n".encode()


def device_opener(path: str) -> int:
    """Opens a character device (/dev/null), so the reader takes its one-record-per-read() path."""
    return os.open("/dev/null", os.O_RDONLY | os.O_NONBLOCK)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def reader_for(path: Path | str, stats: KmsgStats, **kwargs) -> KmsgReader:
    kwargs.setdefault("follow", False)
    kwargs.setdefault("boot_time", lambda: BOOT)
    kwargs.setdefault("backoff_initial", 0.01)
    return KmsgReader(path=path, stats=stats, **kwargs)


def stop_after(naps: int, stop: threading.Event, *, each: Callable[[int], None] | None = None):
    """A ``sleep`` that records its delays, calls ``each(n)`` on the n-th (1-based), and sets stop on the last."""
    delays: list[float] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        if each is not None:
            each(len(delays))
        if len(delays) >= naps:
            stop.set()

    sleep.delays = delays  # type: ignore[attr-defined]
    return sleep


# ------------------------------------------------------------------------------------------------
# Batches


def test_batches_of_a_file_hold_at_most_max_batch_records(tmp_path: Path) -> None:
    path = tmp_path / "tiny.kmsg"
    path.write_bytes(b"".join(rec(seq, usec=0, message="") for seq in range(1, 10_001)))  # ~5,000 per read()
    stats = KmsgStats()
    batches = list(reader_for(path, stats).batches(stop=threading.Event()))

    assert all(0 < len(batch) <= MAX_BATCH for batch in batches)
    assert max(len(batch) for batch in batches) == MAX_BATCH
    assert [r.seq for batch in batches for r in batch] == list(range(1, 10_001))
    assert (stats.records_read, stats.records_lost, stats.parse_errors) == (10_000, 0, 0)


def test_records_flattens_batches(tmp_path: Path) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(b"".join(rec(seq, f"message {seq}") for seq in range(1, 3001)))
    flat = [r for batch in reader_for(path, KmsgStats()).batches(stop=threading.Event()) for r in batch]
    assert list(reader_for(path, KmsgStats()).records(stop=threading.Event())) == flat
    assert len(flat) == 3000


def test_device_reads_go_on_while_data_is_ready_up_to_max_batch() -> None:
    script: list[bytes | OSError] = [rec(seq) for seq in range(1, 5001)]
    script += [BlockingIOError(errno.EAGAIN, "again"), rec(5001), rec(5002), rec(5003)]
    stats = KmsgStats()
    reader = reader_for("/dev/kmsg", stats, opener=device_opener, read=ScriptedRead(script))
    batches = list(reader.batches(stop=threading.Event()))

    assert [len(batch) for batch in batches] == [MAX_BATCH, 5000 - MAX_BATCH, 3]
    assert [r.seq for batch in batches for r in batch] == list(range(1, 5004))
    assert stats.records_read == 5003


def test_device_overruns_are_counted_and_reads_joined_safely() -> None:
    script: list[bytes | OSError] = [rec(1), BrokenPipeError(errno.EPIPE, "Broken pipe"), b"6,4,0,-;no newline"]
    script += [rec(5)]
    stats = KmsgStats()
    reader = reader_for("/dev/kmsg", stats, opener=device_opener, read=ScriptedRead(script))
    assert [(r.seq, r.message) for r in reader.records(stop=threading.Event())] == [
        (1, "m"),
        (4, "no newline"),
        (5, "m"),
    ]
    assert (stats.overruns, stats.records_lost) == (1, 2)


def _a_fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "fifo")
    return str(tmp_path / "fifo")


def _a_file(tmp_path: Path) -> str:
    (tmp_path / "file").write_bytes(b"6,1,0,-;m\n")
    return str(tmp_path / "file")


@pytest.mark.parametrize(
    ("path", "kernel"),
    [
        pytest.param(
            lambda _: "/dev/kmsg",
            True,
            marks=pytest.mark.skipif(not os.path.exists("/dev/kmsg"), reason="no /dev/kmsg"),
        ),
        (lambda _: "/dev/null", False),  # the same major number (mem), another device
        (lambda _: "/dev/zero", False),
        pytest.param(
            lambda _: "/dev/ptmx", False, marks=pytest.mark.skipif(not os.path.exists("/dev/ptmx"), reason="no ptmx")
        ),
        (_a_fifo, False),
        (_a_file, False),
    ],
    ids=["kmsg", "null", "zero", "terminal", "fifo", "file"],
)
def test_only_the_kernels_own_device_is_taken_as_formatted_by_it(tmp_path: Path, path, kernel: bool) -> None:
    """The kernel formats every line of its /dev/kmsg (character device 1:11, wherever it is mounted): the reader
    vouches for those lines alone, not for another device's, a FIFO's or a file's."""
    assert is_kernel_log(os.stat(path(tmp_path))) is kernel


def test_only_the_devices_reads_are_vouched_for_as_numbered_in_order(tmp_path: Path) -> None:
    """The kernel's device hands out records in sequence order (a jump comes as EPIPE), so its chunks may be
    numbered from their ends; a file's records may come in any order and are read one by one."""
    reader = reader_for("/dev/kmsg", KmsgStats(), opener=device_opener, read=ScriptedRead([rec(1), rec(2), rec(3)]))
    chunks = list(reader.chunks(stop=threading.Event()))
    assert [chunk.mode.device for chunk in chunks] == [True]
    assert isinstance(reader.decode(chunks[0]).seqs, range)
    path = tmp_path / "f.kmsg"
    path.write_bytes(rec(1) + rec(3) + rec(2) + rec(4))
    reader = reader_for(path, KmsgStats())
    chunks = list(reader.chunks(stop=threading.Event()))
    assert chunks and not any(chunk.mode.device for chunk in chunks)
    assert [r.seq for chunk in chunks for r in reader.decode(chunk)] == [1, 3, 4]  # 2 came after 3: passed


def test_the_boot_clock_is_read_once_per_chunk_not_per_record(tmp_path: Path) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(b"".join(rec(seq, "x" * 60) for seq in range(1, 3001)))  # ~220 KiB: 4 reads
    calls: list[int] = []

    def boot_time() -> float:
        calls.append(1)
        return BOOT

    records = list(reader_for(path, KmsgStats(), boot_time=boot_time).records(stop=threading.Event()))
    assert len(records) == 3000
    assert len(calls) <= path.stat().st_size // (64 * 1024) + 2
    assert records[-1].timestamp == BOOT + 3000 * 1000 / 1e6


# ------------------------------------------------------------------------------------------------
# Liveness: last_activity only moves while the open source answers


def test_a_missing_path_never_looks_alive(tmp_path: Path) -> None:
    path = tmp_path / "missing"
    stats, stop = KmsgStats(), threading.Event()
    sleep = stop_after(5, stop)
    reader = reader_for(path, stats, follow=True, sleep=sleep, clock=Clock(), backoff_initial=0.5, backoff_max=4.0)

    assert list(reader.batches(stop=stop)) == []
    assert sleep.delays == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert stats.last_activity is None
    assert stats.last_error == f"cannot open {path}: [Errno 2] No such file or directory"
    assert (stats.read_errors, stats.reader_restarts, stats.connected) == (5, 5, False)


def test_permission_denied_never_looks_alive_and_says_why() -> None:
    def opener(path: str) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", path)  # dmesg_restrict, no CAP_SYSLOG

    stats, stop = KmsgStats(), threading.Event()
    seen: list[tuple[float | None, str | None]] = []
    sleep = stop_after(4, stop, each=lambda n: seen.append((stats.last_activity, stats.last_error)))
    reader = reader_for("/dev/kmsg", stats, follow=True, sleep=sleep, clock=Clock(), opener=opener)

    assert list(reader.batches(stop=stop)) == []
    denied = "cannot open /dev/kmsg: [Errno 13] Permission denied"
    assert seen == [(None, denied)] * 4
    assert stats.last_activity is None


def test_liveness_starts_and_the_error_clears_once_the_source_answers(tmp_path: Path) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(rec(1))
    attempts = itertools.count(1)

    def opener(name: str) -> int:
        if next(attempts) <= 2:
            raise PermissionError(errno.EACCES, "Permission denied", name)
        return os.open(name, os.O_RDONLY | os.O_NONBLOCK)

    stats, clock = KmsgStats(), Clock()
    seen: list[float | None] = []
    reader = reader_for(path, stats, opener=opener, clock=clock, sleep=lambda _: seen.append(stats.last_activity))

    assert [r.seq for r in reader.records(stop=threading.Event())] == [1]
    assert seen == [None, None]  # nothing moved during the backoff
    assert stats.last_activity == clock.now
    assert stats.last_error is None


def test_a_read_error_stops_liveness_until_the_source_answers_again(tmp_path: Path) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(b"")
    read = ScriptedRead([rec(1), OSError(errno.EIO, "Input/output error"), rec(2)])
    stats, clock = KmsgStats(), Clock()
    seen: list[tuple[float | None, str | None]] = []
    reader = reader_for(
        path, stats, read=read, clock=clock, sleep=lambda _: seen.append((stats.last_activity, stats.last_error))
    )

    assert [r.seq for r in reader.records(stop=threading.Event())] == [1, 2]
    assert seen == [(101.0, f"cannot read {path}: [Errno 5] Input/output error")]
    assert stats.last_activity > 101.0 and stats.last_error is None


def test_an_idle_followed_file_stays_alive(tmp_path: Path) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(rec(1))
    stats, stop = KmsgStats(), threading.Event()
    seen: list[float | None] = []
    sleep = stop_after(3, stop, each=lambda _: seen.append(stats.last_activity))
    reader = reader_for(path, stats, follow=True, sleep=sleep, clock=Clock(), poll_interval=0.25)

    assert [r.seq for r in reader.records(stop=stop)] == [1]
    assert sleep.delays == [0.25, 0.25, 0.25]
    assert seen == sorted(set(seen)) and None not in seen  # refreshed at every poll at the end of the file


# ------------------------------------------------------------------------------------------------
# Input faults


ORPHAN = rec(1, "NVRM: Xid (PCI:0000:10:1c): 79, GPU has fallen off the bus.") + b" continued text\n SUBSYSTEM=pci\n"


def test_an_orphan_continuation_line_costs_only_itself(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(ORPHAN + rec(2))
    stats = KmsgStats()
    with caplog.at_level(logging.WARNING, logger="agent.sources.kmsg"):
        records = list(reader_for(path, stats).records(stop=threading.Event()))

    assert [(r.seq, dict(r.fields)) for r in records] == [(1, {"SUBSYSTEM": "pci"}), (2, {})]
    assert records[0].message.endswith("GPU has fallen off the bus.")
    assert (stats.malformed_lines, stats.parse_errors, stats.records_read) == (1, 0, 2)
    assert "continued text" in caplog.text


def test_an_orphan_continuation_line_on_the_device() -> None:
    stats = KmsgStats()
    reader = reader_for("/dev/kmsg", stats, opener=device_opener, read=ScriptedRead([ORPHAN, rec(2)]))
    assert [r.seq for r in reader.records(stop=threading.Event())] == [1, 2]
    assert (stats.malformed_lines, stats.parse_errors) == (1, 0)


@pytest.mark.parametrize(
    ("bad", "lost"),
    [
        (b"6,2,x,-;bad timestamp\n", 0),  # the header still shows seq 2
        (b"x,2,0,-;bad priority\n", 0),
        (b"garbage\n", 0),  # seq unknown: it stands for one number of the gap
        (b"garbage\ngarbage\n", 0),
    ],
)
def test_a_bad_record_counts_as_a_parse_error_not_as_lost(tmp_path: Path, bad: bytes, lost: int) -> None:
    path = tmp_path / "f.kmsg"
    skipped = bad.count(b"\n")
    path.write_bytes(rec(1) + bad + rec(2 + skipped) + rec(3 + skipped))
    stats = KmsgStats()
    assert [r.seq for r in reader_for(path, stats).records(stop=threading.Event())] == [1, 2 + skipped, 3 + skipped]
    assert (stats.parse_errors, stats.records_lost) == (skipped, lost)


def test_a_real_gap_around_a_bad_record_is_still_counted(tmp_path: Path) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(rec(1) + b"garbage\n" + rec(5) + b"6,9,x,-;bad\n" + rec(12))
    stats = KmsgStats()
    assert [r.seq for r in reader_for(path, stats).records(stop=threading.Event())] == [1, 5, 12]
    assert (stats.parse_errors, stats.records_lost) == (2, 2 + 3 + 2)  # 2..4 less the garbage, 6..8, 10..11


def test_a_bad_record_replayed_after_a_reopen_is_counted_once() -> None:
    bad = b"6,2,x,-;bad timestamp\n"
    script: list[bytes | OSError] = [rec(1), bad, rec(3), OSError(errno.EIO, "Input/output error")]
    script += [rec(1), bad, rec(3), rec(4)]  # the device replays its ring buffer after the reopen
    stats = KmsgStats()
    reader = reader_for("/dev/kmsg", stats, opener=device_opener, read=ScriptedRead(script), sleep=lambda _: None)
    assert [r.seq for r in reader.records(stop=threading.Event())] == [1, 3, 4]
    assert (stats.parse_errors, stats.records_lost, stats.reader_restarts) == (1, 0, 1)


# ------------------------------------------------------------------------------------------------
# Followed files that are rotated, deleted, recreated or truncated


def test_a_rotated_file_is_drained_then_the_new_one_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    path.write_bytes(rec(1) + rec(2))

    def rotate(nap: int) -> None:
        if nap == 1:
            with path.open("ab") as old:
                old.write(rec(3, "late write to the old file"))
            path.rename(tmp_path / "kmsg.log.1")
            path.write_bytes(rec(1, "new file (a new boot: numbering starts again)"))

    stats, stop = KmsgStats(), threading.Event()
    sleep = stop_after(2, stop, each=rotate)
    records = list(reader_for(path, stats, follow=True, sleep=sleep, poll_interval=0.25).records(stop=stop))

    assert [(r.seq, r.message) for r in records] == [
        (1, "m"),
        (2, "m"),
        (3, "late write to the old file"),
        (1, "new file (a new boot: numbering starts again)"),
    ]
    assert sleep.delays == [0.25, 0.25]
    assert (stats.records_lost, stats.reader_restarts, stats.read_errors) == (0, 0, 0)


def test_a_deleted_file_is_not_followed_forever(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    path.write_bytes(rec(1))
    stats, stop, clock = KmsgStats(), threading.Event(), Clock()
    seen: list[tuple[bool, float | None, str | None]] = []

    def step(nap: int) -> None:
        seen.append((stats.connected, stats.last_activity, stats.last_error))
        if nap == 1:
            path.unlink()
        elif nap == 2:
            path.write_bytes(rec(7, "recreated"))

    sleep = stop_after(3, stop, each=step)
    reader = reader_for(path, stats, follow=True, sleep=sleep, clock=clock, poll_interval=0.25)
    records = list(reader.records(stop=stop))

    assert [(r.seq, r.message) for r in records] == [(1, "m"), (7, "recreated")]
    assert sleep.delays == [0.25, 0.01, 0.25]  # poll, backoff (the path was gone), poll
    gone = f"cannot open {path}: [Errno 2] No such file or directory"
    assert seen[1][0] is False and seen[1][2] == gone
    assert seen[1][1] == max(s[1] for s in seen[:2])  # no liveness while the file was gone
    assert stats.last_error is None and stats.records_lost == 0


def test_a_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    path.write_bytes(rec(1, "a long first record " * 5) + rec(2, "a long second record " * 5))

    def truncate(nap: int) -> None:
        if nap == 1:
            path.write_bytes(rec(3, "after truncation"))  # same file, shorter than what was read

    stats, stop = KmsgStats(), threading.Event()
    sleep = stop_after(2, stop, each=truncate)
    records = list(reader_for(path, stats, follow=True, sleep=sleep, poll_interval=0.25).records(stop=stop))
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[-1].message == "after truncation"


def test_an_unchanged_followed_file_is_not_reopened(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    path.write_bytes(rec(1))
    opened: list[str] = []

    def opener(name: str) -> int:
        opened.append(name)
        return os.open(name, os.O_RDONLY | os.O_NONBLOCK)

    def append(nap: int) -> None:
        with path.open("ab") as f:
            f.write(rec(1 + nap))

    stop = threading.Event()
    reader = reader_for(path, KmsgStats(), follow=True, opener=opener, sleep=stop_after(3, stop, each=append))
    assert [r.seq for r in reader.records(stop=stop)] == [1, 2, 3]
    assert opened == [str(path)]


def test_records_are_log_records_with_the_boot_clock(tmp_path: Path) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(b"3,5,2500000,-,caller=T7;NVRM: Xid 79\n SUBSYSTEM=pci\n")
    (record,) = reader_for(path, KmsgStats()).records(stop=threading.Event())
    assert record == LogRecord(
        message="NVRM: Xid 79",
        timestamp=BOOT + 2.5,
        seq=5,
        priority=3,
        facility=0,
        monotonic_usec=2_500_000,
        continuation=False,
        fields={"SUBSYSTEM": "pci"},
    )


@contextlib.contextmanager
def reading_a_terminal(**options: Any) -> Iterator[tuple[int, KmsgReader, list[bytes]]]:
    """A reader (``options``) on a pseudo-terminal, a character device that polls readable exactly while it
    holds input, as /dev/kmsg does while records wait: (the terminal's end to write records to, the reader,
    the data of the chunks it yields). Stopped and closed after."""
    master, slave = os.openpty()
    reader = KmsgReader(path=os.ttyname(slave), stats=KmsgStats(), **options)
    stop = threading.Event()
    chunks: list[bytes] = []
    thread = threading.Thread(target=lambda: chunks.extend(chunk.data for chunk in reader.chunks(stop=stop)))
    thread.start()
    try:
        yield master, reader, chunks
    finally:
        stop.set()
        reader.wake()
        thread.join(timeout=30)
        os.close(master)
        os.close(slave)
    assert not thread.is_alive()
    assert not reader.catch_up()  # closed: nothing to poll


def test_catch_up_says_whether_the_open_device_holds_what_the_reader_has_not_read() -> None:
    """The reader's reads are held back by the test so it can look."""
    reading, gate = threading.Event(), threading.Event()

    def read(fd: int, size: int) -> bytes:
        reading.set()  # the device is open and its poll registered: the reader reads after both
        gate.wait(30)
        return os.read(fd, size)

    with reading_a_terminal(read=read, idle_wait=30.0) as (terminal, reader, chunks):
        try:
            assert reading.wait(30)
            assert not reader.catch_up()  # open, nothing written
            os.write(terminal, b"7,1,1000,-;a line\n")
            wait_for(reader.catch_up)  # in the device, not yet read (the reader is held in its read)
            gate.set()
            wait_for(lambda: len(chunks) == 1)
            wait_for(lambda: not reader.catch_up())  # read: nothing left in the device
        finally:
            gate.set()


class LazyKernel:
    """The reader's waits as the kernel makes them after it stores a record: the device polls readable at
    once, but the waiters are woken only at the next timer tick, which never comes here. A wait registers
    the device and the reader's wake pipe; this poll leaves character devices out, so only the pipe (or
    the idle wait) ends it."""

    def __init__(self) -> None:
        self.waiting = threading.Event()
        self._poll = select.poll()

    def __call__(self) -> LazyKernel:
        return self

    def register(self, fd: int, mask: int) -> None:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            self._poll.register(fd, mask)

    def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
        self.waiting.set()
        ready = self._poll.poll(timeout)
        self.waiting.clear()
        return ready


def test_catch_up_has_the_reader_read_records_the_kernel_has_not_woken_it_for() -> None:
    """A scrape that comes in while a stored record waits for the kernel's tick: catch_up says so and the
    reader reads it now (the reader's idle wait is an hour; only catch_up can end it)."""
    lazy = LazyKernel()
    with reading_a_terminal(idle_wait=3600.0, poller=lazy) as (terminal, reader, chunks):
        assert lazy.waiting.wait(30)  # nothing in the device: the reader waits
        assert not reader.catch_up()
        os.write(terminal, b"7,1,1000,-;a line\n")
        wait_for(reader.catch_up)  # stored and readable; the reader is still waiting
        wait_for(lambda: len(chunks) == 1)
        assert chunks == [b"7,1,1000,-;a line\n"]


def test_catch_up_is_false_for_a_followed_file_which_polls_readable_at_its_end(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(rec(1))
    reader = KmsgReader(path=path, stats=KmsgStats(), follow=True, sleep=lambda _: None, poll_interval=0.01)
    stop = threading.Event()
    batches = reader.batches(stop=stop)
    assert [r.seq for r in next(batches)] == [1]
    assert not reader.catch_up()
    stop.set()
    batches.close()
