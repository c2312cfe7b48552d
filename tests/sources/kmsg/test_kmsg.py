"""Specification of the /dev/kmsg source: parsing, reading, sequence accounting, restarts, replay cursor."""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import string
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.bus import Inbox, RecordBatch
from agent.core.types import LogRecord
from agent.sources.kmsg.boot import boot_time_now, read_boot_id
from agent.sources.kmsg.format import KmsgParseError, parse_record
from agent.sources.kmsg.reader import KmsgReader
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.producer import SourceProducer
from agent.sources.replay import Cursor, CursorStore, ReplayPolicy

from helpers import FIXTURES, ScriptedRead, wait_for
from helpers.threads import wakeups_while_asleep

FIXTURES = FIXTURES / "kmsg"
BOOT = 1_700_000_000.0
WAIT = 15.0  # bound on waiting for another thread: generous, only reached when something is broken


def escape(data: bytes) -> bytes:
    """Escape like the kernel: control bytes, bytes >= 0x7f and the backslash become \\xNN."""
    return b"".join(bytes([c]) if 32 <= c < 127 and c != 0x5C else b"\\x%02x" % c for c in data)


def make_record(
    *,
    prio: int,
    seq: int,
    usec: int = 0,
    message: str = "",
    flags: str = "-",
    extra: str = "",
    fields: dict[str, str] | None = None,
) -> bytes:
    header = f"{prio},{seq},{usec},{flags}{extra};".encode()
    lines = [header + escape(message.encode())]
    lines += [b" " + escape(k.encode()) + b"=" + escape(v.encode()) for k, v in (fields or {}).items()]
    return b"\n".join(lines) + b"\n"


def read_all(path: Path, **kwargs) -> tuple[list[LogRecord], KmsgStats]:
    stats = KmsgStats()
    kwargs.setdefault("follow", False)
    reader = KmsgReader(path=path, stats=stats, boot_time=lambda: BOOT, poll_interval=0.01, **kwargs)
    return list(reader.records(stop=threading.Event())), stats


def seqs(records: list[LogRecord]) -> list[int | None]:
    return [r.seq for r in records]


# ------------------------------------------------------------------------------------------------
# parse_record

PARSE_CASES = [
    # (id, raw, expected attributes)
    (
        "plain",
        b"6,1,2000000,-;hello\n",
        dict(
            message="hello",
            priority=6,
            facility=0,
            seq=1,
            monotonic_usec=2_000_000,
            timestamp=BOOT + 2.0,
            continuation=False,
            fields={},
            source="kmsg",
        ),
    ),
    ("without trailing newline", b"6,1,0,-;hello", dict(message="hello", timestamp=BOOT)),
    (
        "userspace write: facility 1, level 4",
        b"12,348,165682670,-;hello",
        dict(priority=4, facility=1, seq=348, timestamp=BOOT + 165.68267),
    ),
    ("daemon facility, info level", b"30,2,0,-;x", dict(priority=6, facility=3)),
    ("emergency level", b"0,2,0,-;x", dict(priority=0, facility=0)),
    ("continuation flag", b"4,5,0,c;tail of a line", dict(continuation=True, message="tail of a line")),
    ("'+' flag is not a continuation", b"4,5,0,+;x", dict(continuation=False)),
    ("extra comma fields after flags (caller id)", b"6,7,0,-,caller=T42;msg", dict(message="msg", seq=7)),
    ("semicolon inside the message", b"6,1,0,-;a;b", dict(message="a;b")),
    ("empty message", b"6,9,0,-;\n", dict(message="")),
    (
        "dictionary lines",
        b"3,8,0,-;Xid 79\n SUBSYSTEM=pci\n DEVICE=+pci:0000:10:1c.0\n",
        dict(message="Xid 79", fields={"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:10:1c.0"}),
    ),
    ("dictionary value containing '='", b"6,1,0,-;m\n K=a=b\n", dict(fields={"K": "a=b"})),
    ("escaped dictionary value", b"6,1,0,-;m\n K=a\\x20b\\x0ac\n", dict(fields={"K": "a b\nc"})),
    ("escapes", b"6,1,0,-;tab\\x09nl\\x0abs\\x5c", dict(message="tab\tnl\nbs\\")),
    ("uppercase hex escape", b"6,1,0,-;\\x4A", dict(message="J")),
    ("invalid escapes stay literal", b"6,1,0,-;a\\xZZ b\\x4 c\\q d\\", dict(message="a\\xZZ b\\x4 c\\q d\\")),
    ("an escaped backslash is not unescaped twice", b"6,1,0,-;\\x5cx41", dict(message="\\x41")),
    ("escaped UTF-8", b"6,1,0,-;caf\\xc3\\xa9", dict(message="caf\u00e9")),
    ("raw UTF-8", "6,1,0,-;caf\u00e9".encode(), dict(message="caf\u00e9")),
    ("invalid UTF-8 is replaced", b"6,1,0,-;\\xff!", dict(message="\ufffd!")),
    ("largest u64 sequence number", b"6,18446744073709551615,0,-;x", dict(seq=2**64 - 1)),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_parse_record(raw: bytes, expected: dict) -> None:
    record = parse_record(raw, boot_time=BOOT)
    assert {name: getattr(record, name) for name in expected} == expected


def test_parse_record_uses_given_source() -> None:
    assert parse_record(b"6,1,0,-;x", boot_time=0.0, source="relay").source == "relay"


PARSE_ERRORS = [
    # (id, raw, part of the error message)
    ("empty input", b"", "missing ';'"),
    ("no separator", b"6,1,0,-hello", "missing ';'"),
    ("too few header fields", b"6,1,0;x", "at least 4 comma-separated header fields"),
    ("priority not a number", b"x,1,0,-;m", "priority b'x' is not a decimal number"),
    ("signed priority", b"+6,1,0,-;m", "priority"),
    ("padded priority", b" 6,1,0,-;m", "priority"),
    ("negative sequence number", b"6,-1,0,-;m", "sequence number b'-1'"),
    ("fractional timestamp", b"6,1,1.5,-;m", "timestamp b'1.5'"),
    ("number longer than a u64", b"6,123456789012345678901,0,-;m", "sequence number"),
]


@pytest.mark.parametrize(("raw", "reason"), [c[1:] for c in PARSE_ERRORS], ids=[c[0] for c in PARSE_ERRORS])
def test_parse_record_rejects(raw: bytes, reason: str) -> None:
    with pytest.raises(KmsgParseError) as info:
        parse_record(raw, boot_time=BOOT)
    assert reason in str(info.value)
    assert str(info.value).startswith("invalid kmsg record: ")


@pytest.mark.parametrize(
    ("raw", "seq"),
    [
        (b"x,7,0,-;bad priority", 7),
        (b"6,7,1.5,-;bad timestamp", 7),
        (b"6,7,0,-no separator", 7),
        (b"6,7;too few fields", 7),
        (b"6,-7,0,-;bad seq", None),
        (b"garbage", None),
        (b"", None),
    ],
)
def test_parse_error_carries_the_seq_when_the_header_still_shows_one(raw: bytes, seq: int | None) -> None:
    with pytest.raises(KmsgParseError) as info:
        parse_record(raw, boot_time=BOOT)
    assert info.value.seq == seq


# Bad dictionary lines cost only themselves: the record (and the finding it carries) is kept.
LENIENT_CASES = [
    # (id, raw, expected fields)
    ("line without leading space", b"6,1,0,-;m\nSUBSYSTEM=pci\n K=v", {"K": "v"}),
    ("blank line between dictionary lines", b"6,1,0,-;m\n\n K=v", {"K": "v"}),
    ("line without '='", b"6,1,0,-;m\n novalue\n K=v", {"K": "v"}),
    ("line without key", b"6,1,0,-;m\n =v", {}),
    ("orphan continuation text", b"3,1,0,-;Xid 79\n fell off the bus\n SUBSYSTEM=pci\n", {"SUBSYSTEM": "pci"}),
]


@pytest.mark.parametrize(("raw", "fields"), [c[1:] for c in LENIENT_CASES], ids=[c[0] for c in LENIENT_CASES])
def test_parse_record_drops_only_bad_dictionary_lines(raw: bytes, fields: dict[str, str]) -> None:
    record = parse_record(raw, boot_time=BOOT)
    assert (record.seq, record.fields) == (1, fields)
    assert record.message in ("m", "Xid 79")


def test_parse_error_shows_the_record_truncated() -> None:
    with pytest.raises(KmsgParseError, match=r"b'(garbage){17}") as info:
        parse_record(b"garbage" * 100, boot_time=BOOT)
    assert len(str(info.value)) < 250
    assert isinstance(info.value, ValueError)


# Pieces that make near-valid records, so that fuzzing reaches the deeper parsing paths.
_PIECES = st.sampled_from(
    [
        b"6",
        b"12",
        b",",
        b";",
        b"\n",
        b" ",
        b"=",
        b"K",
        b"\\x",
        b"4f",
        b"zz",
        b"c",
        b"-",
        b"\xff",
        b"\xc3",
        b"\x00",
        b"99999999999999999999999",
    ]
)
_ANY_BYTES = st.one_of(st.binary(max_size=200), st.lists(_PIECES, max_size=30).map(b"".join))


@settings(deadline=None)  # no per-example time limit: the machine is shared
@given(data=_ANY_BYTES)
def test_parse_record_only_ever_raises_kmsg_parse_error(data: bytes) -> None:
    try:
        record = parse_record(data, boot_time=BOOT)
    except KmsgParseError:
        return
    assert isinstance(record, LogRecord)


@settings(deadline=None)  # no per-example time limit: the machine is shared
@given(
    prio=st.integers(0, 1023),
    seq=st.integers(0, 2**64 - 1),
    usec=st.integers(0, 2**64 - 1),
    flags=st.sampled_from(["-", "c", "+"]),
    extra=st.sampled_from(["", ",caller=T1", ",caller=C3,x"]),
    message=st.text(max_size=60),
    fields=st.dictionaries(
        st.text(string.ascii_uppercase + "_", min_size=1, max_size=10), st.text(max_size=20), max_size=3
    ),
)
def test_parse_record_round_trip(
    prio: int, seq: int, usec: int, flags: str, extra: str, message: str, fields: dict[str, str]
) -> None:
    raw = make_record(prio=prio, seq=seq, usec=usec, flags=flags, extra=extra, message=message, fields=fields)
    record = parse_record(raw, boot_time=BOOT)
    assert (record.priority, record.facility) == (prio & 7, prio >> 3)
    assert (record.seq, record.monotonic_usec, record.timestamp) == (seq, usec, BOOT + usec / 1e6)
    assert record.continuation == (flags == "c")
    assert record.message == message
    assert record.fields == fields


# ------------------------------------------------------------------------------------------------
# Boot time and boot id


def test_boot_time_now_is_realtime_minus_monotonic() -> None:
    # Both sides read two clocks; a generous bound keeps a descheduled thread from failing this.
    assert boot_time_now() == pytest.approx(time.time() - time.monotonic(), abs=1.0)
    assert boot_time_now() < time.time()


def test_read_boot_id(tmp_path: Path) -> None:
    path = tmp_path / "sys" / "kernel" / "random" / "boot_id"
    path.parent.mkdir(parents=True)
    path.write_text("0f3e1ad2-7c3b-4e0e-9a52-4a1b2c3d4e5f\n")
    assert read_boot_id(proc_root=tmp_path) == "0f3e1ad2-7c3b-4e0e-9a52-4a1b2c3d4e5f"


def test_read_boot_id_missing_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="sys/kernel/random/boot_id does not exist"):
        read_boot_id(proc_root=tmp_path)


def test_read_boot_id_empty(tmp_path: Path) -> None:
    path = tmp_path / "sys" / "kernel" / "random" / "boot_id"
    path.parent.mkdir(parents=True)
    path.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        read_boot_id(proc_root=tmp_path)


# ------------------------------------------------------------------------------------------------
# KmsgReader on regular files


def test_reads_concatenated_records_from_a_file() -> None:
    records, stats = read_all(FIXTURES / "basic.kmsg")

    assert seqs(records) == [100, 101, 102, 103, 104]
    xid = records[1]
    assert (xid.priority, xid.facility, xid.timestamp) == (3, 0, BOOT + 5.0001)
    assert xid.message.endswith("GPU has fallen off the bus.")
    assert xid.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:10:1c.0"}
    assert records[2].message.startswith("neuron: NEURON_HW_ERR=")
    assert records[3].message == "tab\tand backslash\\ and caf\u00e9"
    assert (records[3].priority, records[3].facility) == (4, 1)
    assert [r.continuation for r in records] == [False, False, False, False, True]
    assert (stats.records_read, stats.records_lost, stats.parse_errors) == (5, 0, 0)
    assert (stats.reader_restarts, stats.read_errors, stats.connected) == (0, 0, False)
    assert stats.last_record_time == BOOT + 5.0004
    assert stats.last_activity is not None


def test_sequence_gaps_are_counted_and_old_records_skipped() -> None:
    records, stats = read_all(FIXTURES / "gaps.kmsg")
    assert seqs(records) == [10, 11, 14, 15, 20]  # the duplicate 14 and the older 12 are skipped
    assert stats.records_lost == 2 + 4  # 12..13 and 16..19
    assert stats.records_read == 5


@pytest.mark.parametrize(
    ("start_after_seq", "expected", "lost"),
    [
        (None, [100, 101, 102, 103, 104], 0),
        (102, [103, 104], 0),
        (99, [100, 101, 102, 103, 104], 0),
        (97, [100, 101, 102, 103, 104], 2),  # 98 and 99 were overwritten while we were away
        (104, [], 0),
        (500, [], 0),
    ],
)
def test_start_after_seq(start_after_seq: int | None, expected: list[int], lost: int) -> None:
    records, stats = read_all(FIXTURES / "basic.kmsg", start_after_seq=start_after_seq)
    assert seqs(records) == expected
    assert stats.records_lost == lost


def test_unparsable_records_are_counted_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "mixed.kmsg"
    path.write_bytes(
        b" ORPHAN=dictionary line\n"  # no header before it
        b"6,1,0,-;ok\n"
        b"garbage\n"
        b"6,2,0,-;ok too\n"
        b"6,3,0,-;bad dictionary\n no-equals-sign\n"  # the record is kept, the bad line dropped
    )
    with caplog.at_level(logging.WARNING, logger="agent.sources.kmsg"):
        records, stats = read_all(path)
    assert seqs(records) == [1, 2, 3]
    assert (stats.parse_errors, stats.malformed_lines, stats.records_lost) == (2, 1, 0)
    assert "garbage" in caplog.text and "no-equals-sign" in caplog.text


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"6,1,0,-;a\n6,2,0,-;last line without newline", ["a", "last line without newline"]),
        (b"6,1,0,-;a\n\n\n6,2,0,-;b\n\n", ["a", "b"]),  # blank lines between records are ignored
        (b"", []),
    ],
)
def test_end_of_file_without_follow_flushes_everything(tmp_path: Path, content: bytes, expected: list[str]) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(content)
    records, _ = read_all(path)
    assert [r.message for r in records] == expected


def test_follow_keeps_a_partial_record_until_the_rest_is_appended(tmp_path: Path) -> None:
    path = tmp_path / "growing.kmsg"
    path.write_bytes(b"6,1,0,-;first\n6,2,0,-;sec")
    stop = threading.Event()
    naps: list[float] = []

    def sleep(seconds: float) -> None:  # runs on the reader's side each time it reaches end of file
        naps.append(seconds)
        if len(naps) == 1:
            with path.open("ab") as f:
                f.write(b"ond\n SUBSYSTEM=pci\n6,3,0,-;third\n")
        else:
            stop.set()

    reader = KmsgReader(path=path, stats=KmsgStats(), poll_interval=0.25, sleep=sleep, follow=True)
    records = list(reader.records(stop=stop))

    assert [(r.seq, r.message, dict(r.fields)) for r in records] == [
        (1, "first", {}),
        (2, "second", {"SUBSYSTEM": "pci"}),
        (3, "third", {}),
    ]
    assert naps == [0.25, 0.25]


# ------------------------------------------------------------------------------------------------
# KmsgReader on a FIFO (records arrive while the reader runs)


class ReaderThread:
    def __init__(self, reader: KmsgReader) -> None:
        self.stop = threading.Event()
        self.records: queue.Queue[LogRecord] = queue.Queue()
        self._reader = reader
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for record in self._reader.records(stop=self.stop):
            self.records.put(record)

    def stop_and_join(self) -> None:
        """Stop the reader; it must notice within a generous bound (it waits at most poll_interval)."""
        self.stop.set()
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "reader did not stop"


def test_fifo_records_arrive_while_reading_and_stop_ends_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.fifo"
    os.mkfifo(path)
    stats = KmsgStats()
    running = ReaderThread(KmsgReader(path=path, stats=stats, boot_time=lambda: BOOT, poll_interval=0.05))
    with path.open("wb", buffering=0) as writer:  # blocks until the reader has opened the FIFO
        writer.write(make_record(prio=6, seq=1, message="one"))
        assert running.records.get(timeout=WAIT).message == "one"
        assert stats.connected

        writer.write(b"6,2,0,-;tw")  # a record split across writes is kept until complete
        time.sleep(0.02)
        writer.write(b"o\n SUBSYSTEM=pci\n6,3,0,-;three\n")
        second, third = running.records.get(timeout=WAIT), running.records.get(timeout=WAIT)
        assert (second.message, dict(second.fields), third.message) == ("two", {"SUBSYSTEM": "pci"}, "three")

        idle_since = stats.last_activity
        wait_for(lambda: stats.last_activity > idle_since)  # alive while idle, not just while reading

        running.stop_and_join()
    assert stats.records_read == 3
    assert not stats.connected


def test_an_idle_reader_sleeps_on_its_fd_until_a_record_or_stop(tmp_path: Path) -> None:
    """No poll timeout wakes an idle reader (each wakeup is idle CPU, issue 16): a record wakes it at once,
    and so does wake(), which the supervisor calls at stop (through the producer)."""
    path = tmp_path / "kmsg.fifo"
    os.mkfifo(path)
    stats = KmsgStats()
    reader = KmsgReader(path=path, stats=stats, boot_time=lambda: BOOT, idle_wait=3600.0)
    inbox, stop = Inbox(), threading.Event()
    producer = SourceProducer(source=reader, inbox=inbox, stall_timeout=7200.0)
    thread = threading.Thread(target=producer.run, args=(stop,), daemon=True)
    thread.start()
    with path.open("wb", buffering=0) as writer:
        assert thread.native_id is not None
        assert wakeups_while_asleep(thread.native_id, sleeps_in=["poll"]) == 0
        writer.write(make_record(prio=6, seq=1, message="one"))
        batch = inbox.get(timeout=WAIT)
        assert isinstance(batch, RecordBatch) and [r.message for r in batch.resolve()] == ["one"]
        stop.set()
        producer.wake()
        thread.join(WAIT)
        assert not thread.is_alive(), "the reader slept through stop"


class Silent:
    """A source with nothing to say and no way to tell what waits (a relay, a test's own)."""

    def __init__(self) -> None:
        self.stats = KmsgStats()

    def chunks(self, *, stop: threading.Event):
        return iter(())

    def decode(self, chunk):
        return chunk


class Telling(Silent):
    def __init__(self, unread: bool) -> None:
        super().__init__()
        self.answer = unread
        self.asked = 0

    def catch_up(self) -> bool:
        self.asked += 1
        return self.answer


@pytest.mark.parametrize(
    ("source", "unread"),
    [(Silent(), False), (Telling(unread=False), False), (Telling(unread=True), True)],
    ids=["cannot-tell", "nothing-waits", "records-wait"],
)
def test_the_producer_has_its_source_catch_up_and_says_whether_records_were_unread(
    source: Silent, unread: bool
) -> None:
    producer = SourceProducer(source=source, inbox=Inbox(), stall_timeout=10.0)
    assert producer.catch_up() is unread
    assert getattr(source, "asked", 1) == 1  # a source that can catch up is asked each time


# ------------------------------------------------------------------------------------------------
# Errors, EPIPE and restarts (scripted reads through the reader's `read` seam)


def test_epipe_is_counted_and_reading_continues(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(b"")
    read = ScriptedRead(
        [
            b"6,1,0,-;a\n6,2,0,-;b\n",
            BrokenPipeError(errno.EPIPE, "Broken pipe"),  # records 3 and 4 were overwritten
            b"6,5,0,-;e\n",
        ]
    )
    with caplog.at_level(logging.WARNING, logger="agent.sources.kmsg"):
        records, stats = read_all(path, read=read)
    assert seqs(records) == [1, 2, 5]
    assert (stats.overruns, stats.records_lost) == (1, 2)
    assert (stats.reader_restarts, stats.read_errors) == (0, 0)
    assert "overrun" in caplog.text and "2 record(s) lost" in caplog.text


def test_read_errors_reopen_with_exponential_backoff_that_resets(tmp_path: Path) -> None:
    path = tmp_path / "f.kmsg"
    path.write_bytes(b"")
    read = ScriptedRead(
        [
            OSError(errno.EIO, "I/O error"),
            OSError(errno.EIO, "I/O error"),
            b"6,1,0,-;a\n",
            OSError(errno.EIO, "I/O error"),
            b"6,1,0,-;a\n6,2,0,-;b\n",  # after a reopen the device replays from its oldest record
        ]
    )
    naps: list[float] = []
    stats = KmsgStats()
    reader = KmsgReader(
        path=path,
        stats=stats,
        follow=False,
        poll_interval=1.0,
        backoff_initial=0.01,
        backoff_max=0.5,
        sleep=naps.append,
        read=read,
    )
    records = list(reader.records(stop=threading.Event()))

    assert seqs(records) == [1, 2]  # the replayed record 1 is not delivered twice
    assert naps == [0.01, 0.02, 0.01]  # doubled, then reset by the successful read
    assert (stats.reader_restarts, stats.read_errors, stats.records_lost) == (3, 3, 0)
    assert stats.last_error is None  # cleared once the source answered again


def test_missing_path_is_retried_until_it_appears(tmp_path: Path) -> None:
    path = tmp_path / "not-yet.kmsg"
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 4:
            path.write_bytes(b"6,7,0,-;finally\n")

    stats = KmsgStats()
    reader = KmsgReader(
        path=path, stats=stats, follow=False, poll_interval=1.0, backoff_initial=0.01, backoff_max=0.04, sleep=sleep
    )
    records = list(reader.records(stop=threading.Event()))

    assert [r.message for r in records] == ["finally"]
    assert naps == [0.01, 0.02, 0.04, 0.04]  # capped at backoff_max
    assert (stats.reader_restarts, stats.read_errors) == (4, 4)


def test_a_directory_fails_on_read_and_is_retried(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.mkdir()
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        path.rmdir()
        path.write_bytes(b"6,1,0,-;ok\n")

    stats = KmsgStats()
    reader = KmsgReader(path=path, stats=stats, follow=False, backoff_initial=0.01, sleep=sleep)
    assert seqs(list(reader.records(stop=threading.Event()))) == [1]
    assert (stats.reader_restarts, stats.read_errors, naps) == (1, 1, [0.01])


def test_stop_during_backoff_ends_the_reader_which_never_looked_alive(tmp_path: Path) -> None:
    stats = KmsgStats()
    reader = KmsgReader(
        path=tmp_path / "missing", stats=stats, poll_interval=0.02, backoff_initial=30.0, backoff_max=30.0
    )
    running = ReaderThread(reader)
    wait_for(lambda: stats.reader_restarts == 1, timeout=WAIT)
    running.stop_and_join()  # the 30 s backoff is an interruptible wait
    assert stats.last_activity is None
    assert stats.last_error is not None and "No such file or directory" in stats.last_error
    assert not stats.connected


@pytest.mark.parametrize(
    "kwargs",
    [dict(poll_interval=0), dict(backoff_initial=0), dict(backoff_initial=2.0, backoff_max=1.0)],
)
def test_reader_rejects_nonsense_timing(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        KmsgReader(path="/dev/kmsg", stats=KmsgStats(), **kwargs)


# ------------------------------------------------------------------------------------------------
# Cursor store


def test_cursor_round_trip_creates_the_state_dir(tmp_path: Path) -> None:
    state_dir = tmp_path / "state" / "nested"
    store = CursorStore(state_dir=state_dir)
    assert store.load() is None

    store.save(Cursor(boot_id="b1", last_seq=41))
    store.save(Cursor(boot_id="b1", last_seq=42))

    assert store.load() == Cursor(boot_id="b1", last_seq=42)
    assert json.loads((state_dir / "kmsg-cursor.json").read_text()) == {"boot_id": "b1", "last_seq": 42}
    assert [p.name for p in state_dir.iterdir()] == ["kmsg-cursor.json"]  # no temporary files left


def test_failed_save_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "kmsg-cursor.json").mkdir()  # os.replace onto a directory fails
    (tmp_path / "kmsg-cursor.json" / "x").touch()
    with pytest.raises(OSError):
        CursorStore(state_dir=tmp_path).save(Cursor(boot_id="b", last_seq=1))
    assert [p.name for p in tmp_path.iterdir()] == ["kmsg-cursor.json"]


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"",
        b"[]",
        b"{}",
        b'{"boot_id": "b"}',
        b'{"boot_id": 1, "last_seq": 2}',
        b'{"boot_id": "", "last_seq": 2}',
        b'{"boot_id": "b", "last_seq": -1}',
        b'{"boot_id": "b", "last_seq": true}',
        b'{"boot_id": "b", "last_seq": "7"}',
        b"\xff\xfe",
    ],
)
def test_corrupt_cursor_is_ignored_with_a_warning(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "kmsg-cursor.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="agent.sources.replay"):
        assert CursorStore(state_dir=tmp_path).load() is None
    assert str(tmp_path / "kmsg-cursor.json") in caplog.text


def test_unreadable_cursor_is_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "kmsg-cursor.json").mkdir()
    with caplog.at_level(logging.WARNING, logger="agent.sources.replay"):
        assert CursorStore(state_dir=tmp_path).load() is None
    assert "kmsg-cursor.json" in caplog.text


# ------------------------------------------------------------------------------------------------
# replay policy

NOW, LOOKBACK = 10_000.0, 300.0
FULL, PERMANENT_ONLY = False, True  # replayed: only permanent rules see the record
SAME_BOOT, OTHER_BOOT = Cursor(boot_id="boot-a", last_seq=50), Cursor(boot_id="boot-z", last_seq=50)
RECENT, OLD = NOW - 10, NOW - LOOKBACK - 1

REPLAY_CASES = [
    # (id, cursor, seq, timestamp, expected)
    ("same boot, processed before the restart", SAME_BOOT, 49, RECENT, PERMANENT_ONLY),
    ("same boot, the cursor record itself", SAME_BOOT, 50, RECENT, PERMANENT_ONLY),
    ("same boot, new record", SAME_BOOT, 51, RECENT, FULL),
    ("same boot, new but old record (missed while down)", SAME_BOOT, 51, OLD, FULL),
    ("same boot, record without seq uses lookback", SAME_BOOT, None, OLD, PERMANENT_ONLY),
    ("other boot, old record", OTHER_BOOT, 10, OLD, PERMANENT_ONLY),
    ("other boot, recent record with small seq", OTHER_BOOT, 10, RECENT, FULL),
    ("no cursor, old record", None, 10, OLD, PERMANENT_ONLY),
    ("no cursor, recent record", None, 10, RECENT, FULL),
    ("no cursor, exactly at the lookback edge", None, 10, NOW - LOOKBACK, FULL),
]


@pytest.mark.parametrize(
    ("cursor", "seq", "timestamp", "expected"), [c[1:] for c in REPLAY_CASES], ids=[c[0] for c in REPLAY_CASES]
)
def test_replay_policy(cursor: Cursor | None, seq: int | None, timestamp: float, expected: bool) -> None:
    policy = ReplayPolicy(cursor=cursor, boot_id="boot-a", lookback=LOOKBACK)
    record = LogRecord(message="m", timestamp=timestamp, seq=seq)
    assert policy.replayed(record, now=NOW) is expected
    assert policy.split([record], now=NOW) == [([record], expected)]


@pytest.mark.parametrize("cursor", [SAME_BOOT, OTHER_BOOT, None], ids=["same-boot", "other-boot", "no-cursor"])
@pytest.mark.parametrize("seqs", [[48, 49, 50, 51, 52], [51, 52], [10, 11], [49, None, 51], [52, 49, 53]], ids=str)
def test_split_keeps_order_and_agrees_with_the_per_record_rule(cursor, seqs) -> None:
    policy = ReplayPolicy(cursor=cursor, boot_id="boot-a", lookback=LOOKBACK)
    records = [LogRecord(message=str(i), timestamp=OLD if i % 2 else RECENT, seq=s) for i, s in enumerate(seqs)]
    runs = policy.split(records, now=NOW)
    assert [r for run, _ in runs for r in run] == records
    assert [flag for run, flag in runs for _ in run] == [policy.replayed(r, now=NOW) for r in records]
    assert all(a[1] != b[1] for a, b in zip(runs, runs[1:], strict=False)), "adjacent runs differ"
