"""The kmsg reader against the real /dev/kmsg: write a marked line, read it back (a bounded wait)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.types import LogRecord
from agent.sources.kmsg.boot import read_boot_id
from agent.sources.kmsg.decoder import Mode, decode
from agent.sources.kmsg.reader import MAX_BATCH, KmsgReader
from agent.sources.kmsg.stats import KmsgStats

from helpers import kmsg_problem, wait_for

pytestmark = [pytest.mark.kmsg, pytest.mark.slow]  # slow: writes to the real /dev/kmsg

DEVICE = "/dev/kmsg"
WAIT = 30.0  # only reached when something is broken: the marker is normally read back at once


_PROBLEM = kmsg_problem()
requires_kmsg = pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")


def write_line(text: str) -> None:
    fd = os.open(DEVICE, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    """A stop event that fires on its own after WAIT seconds, so a test can never hang."""
    event = threading.Event()
    timer = threading.Timer(WAIT, event.set)
    timer.start()
    yield event
    event.set()
    timer.cancel()


def read_until(reader: KmsgReader, *, marker: str, stop: threading.Event) -> list[LogRecord]:
    seen = []
    for record in reader.records(stop=stop):
        seen.append(record)
        if marker in record.message:
            break
    return seen


@requires_kmsg
def test_reads_back_a_line_written_to_dev_kmsg(stop: threading.Event) -> None:
    marker = f"node-health-agent-test-{uuid.uuid4()}"
    write_line(f"<4>{marker}\n")
    stats = KmsgStats()
    reader = KmsgReader(path=DEVICE, stats=stats, poll_interval=0.1)

    seen = read_until(reader, marker=marker, stop=stop)

    assert seen and marker in seen[-1].message, f"marker not read back within {WAIT}s"
    mine = seen[-1]
    assert mine.priority == 4
    assert mine.facility == 1  # userspace cannot log with facility 0 (kern); the kernel makes it 1 (user)
    assert abs(mine.timestamp - time.time()) < 60
    numbers = [r.seq for r in seen]
    assert numbers == sorted(set(numbers)), "sequence numbers must strictly increase"
    assert stats.records_read == len(seen)
    assert stats.parse_errors == 0


@requires_kmsg
def test_a_reopened_reader_resumes_after_the_last_seq(stop: threading.Event) -> None:
    first, second = f"nha-first-{uuid.uuid4()}", f"nha-second-{uuid.uuid4()}"
    write_line(f"<6>{first}\n")
    reader = KmsgReader(path=DEVICE, stats=KmsgStats(), poll_interval=0.1)
    before = read_until(reader, marker=first, stop=stop)
    assert before and first in before[-1].message
    write_line(f"<6>{second}\n")

    resumed = KmsgReader(path=DEVICE, stats=KmsgStats(), poll_interval=0.1, start_after_seq=before[-1].seq)
    after = read_until(resumed, marker=second, stop=stop)

    assert after and second in after[-1].message
    assert all(r.seq > before[-1].seq for r in after)  # nothing already processed is delivered again


@requires_kmsg
def test_batches_from_the_device(stop: threading.Event) -> None:
    marker = f"nha-batch-{uuid.uuid4()}"
    for i in range(20):
        write_line(f"<6>{marker} {i}\n")
    stats = KmsgStats()
    reader = KmsgReader(path=DEVICE, stats=stats, poll_interval=0.1)
    seen: list[LogRecord] = []
    for batch in reader.batches(stop=stop):
        assert 0 < len(batch) <= MAX_BATCH
        seen += batch
        if any(f"{marker} 19" in r.message for r in batch):
            break
    mine = [r.message for r in seen if marker in r.message]
    assert mine == [f"{marker} {i}" for i in range(20)], f"markers not read back within {WAIT}s"
    numbers = [r.seq for r in seen]
    assert numbers == sorted(set(numbers))
    assert (stats.records_read, stats.parse_errors, stats.last_error) == (len(seen), 0, None)
    assert stats.last_activity is not None


@requires_kmsg
def test_the_kernels_own_device_is_read_as_the_kernel_formats_it(stop: threading.Event) -> None:
    """The real /dev/kmsg's chunks are vouched for as the kernel's (its device numbers): their lines are taken as
    it formats them, and they are the records the per-line parser makes of them, escaped messages too."""
    marker = f"nha-kernel-{uuid.uuid4()}"
    sent = [f"{marker} plain", f"{marker} back\\slash\ttab"]
    for text in sent:
        write_line(f"<6>{text}\n")
    reader = KmsgReader(path=DEVICE, stats=KmsgStats(), poll_interval=0.1)
    mine: list[str] = []
    for chunk in reader.chunks(stop=stop):
        assert chunk.mode is Mode.KERNEL_DEVICE
        records = reader.decode(chunk)
        assert list(records) == decode(chunk.data, mode=Mode.FILE, boot_time=chunk.boot_time).records[-len(records) :]
        mine += [r.message for r in records if marker in r.message]
        if len(mine) == len(sent):
            break
    assert mine == sent, f"markers not read back within {WAIT}s"


@pytest.mark.skipif(not Path("/proc/sys/kernel/random/boot_id").exists(), reason="no procfs boot_id here")
def test_read_boot_id_from_the_real_proc() -> None:
    assert str(uuid.UUID(read_boot_id())) == read_boot_id()


@requires_kmsg
def test_catch_up_sees_a_line_the_kernel_stored_before_the_reader_reads_it(stop: threading.Event) -> None:
    """What ``catch_up`` rests on, on the real device: once the reader has read the ring to its end, a line
    written to /dev/kmsg polls readable for it until it reads the line (its reads are held back by the test
    from then on), and ``catch_up`` says so; the reader then reads the line."""
    drained, gate = threading.Event(), threading.Event()

    def read(fd: int, size: int) -> bytes:
        if drained.is_set():
            gate.wait(WAIT)
        try:
            return os.read(fd, size)
        except BlockingIOError:
            drained.set()  # the ring read to its end: the reader waits for new records
            raise

    marker = f"nha-catch-up-{uuid.uuid4()}"
    reader = KmsgReader(path=DEVICE, stats=KmsgStats(), read=read, idle_wait=WAIT)
    seen: list[LogRecord] = []
    thread = threading.Thread(target=lambda: seen.extend(read_until(reader, marker=marker, stop=stop)))
    thread.start()
    try:
        assert drained.wait(WAIT), f"the ring was not read to its end within {WAIT}s"
        write_line(f"<6>{marker}\n")
        wait_for(reader.catch_up, timeout=WAIT)  # stored, not read: the reader is waiting or held
        gate.set()
        thread.join(timeout=WAIT)
    finally:
        gate.set()
        stop.set()
        reader.wake()
        thread.join(timeout=WAIT)
    assert seen and marker in seen[-1].message, f"marker not read back within {WAIT}s"
