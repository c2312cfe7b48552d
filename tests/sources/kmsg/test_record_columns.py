"""RecordColumns: the kernel log reader's records as columns (issue 16: an object per record was most of the
agent's CPU per record). Every consumer on the main loop's path must give the same result from the columns
as from the records themselves: the replay policy, the cursor's sequence accounting, matching, the ring."""

from __future__ import annotations

import logging

import pytest

from agent.app.config import load_rule_set
from agent.core.columns import RecordColumns
from agent.core.paths import builtin_plugins_dir
from agent.core.ring import LineRing
from agent.core.types import LogRecord
from agent.detectors.pipeline import Batch, DetectionPipeline
from agent.sources.kmsg.columns import KERNEL_ORDER_SLACK, MicrosecondTimes
from agent.sources.kmsg.decoder import Mode, decode, scan
from agent.sources.kmsg.sequence import SequenceTracker
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.replay import Cursor, ReplayPolicy

BOOT_TIME = 1_767_225_600.0
MESSAGES = [
    "Linux version 6.1.0",
    "NVRM: Xid (PCI:0000:10:1c): 79, pid=1, name=x, GPU has fallen off the bus.",
    "Out of memory: Killed process 1234 (python) total-vm:1kB, anon-rss:1kB, file-rss:1kB, shmem-rss:0kB",
    "tab\\x09escaped",
    "test NEURON_HW_ERR=DMA_ERROR test",
    "plain",
]


def chunk(first_seq: int = 100, count: int = 60, *, dictionaries: bool = True, escapes: bool = True) -> bytes:
    messages = MESSAGES if escapes else [m for m in MESSAGES if "\\x" not in m]
    return b"".join(
        f"{(i % 7) + 1},{first_seq + i},{(i + 1) * 1_000_000},-;{messages[i % len(messages)]}\n".encode()
        + (b" SUBSYSTEM=pci\n DEVICE=+pci:0000:10:1c.0\n" if dictionaries and i % 11 == 3 else b"")
        for i in range(count)
    )


# The parser's ways to columns: one scan of every field (dictionary lines), the message scan with the other
# fields read from a line when asked for, the same with the numbers taken from the first and last record (the
# device's reads), and for the kernel's own device no scan where no message is escaped: each message is cut
# from its line when asked for and the chunk's bytes are what the prefilter scans.
KINDS = {
    "dictionaries": {"dictionaries": True, "device": False, "kernel": False, "escapes": True},
    "record-lines": {"dictionaries": False, "device": False, "kernel": False, "escapes": True},
    "device-reads": {"dictionaries": False, "device": True, "kernel": False, "escapes": True},
    "kernel-reads": {"dictionaries": False, "device": True, "kernel": True, "escapes": True},
    "kernel-reads-unescaped": {"dictionaries": False, "device": True, "kernel": True, "escapes": False},
    "kernel-reads-dictionaries": {"dictionaries": True, "device": True, "kernel": True, "escapes": False},
}


@pytest.fixture(scope="module", params=list(KINDS))
def columns_and_list(request) -> tuple[RecordColumns, list[LogRecord]]:
    kind = KINDS[request.param]
    data = chunk(dictionaries=kind["dictionaries"], escapes=kind["escapes"])
    mode = Mode.KERNEL_DEVICE if kind["kernel"] else Mode.OTHER_DEVICE if kind["device"] else Mode.FILE
    columns = scan(data, boot_time=BOOT_TIME, mode=mode)
    assert columns is not None
    assert isinstance(columns.seqs, range) is (kind["device"] and not kind["dictionaries"])
    assert (columns.raw_lines is not None) is (request.param == "kernel-reads-unescaped")
    assert columns.raw_lines is None or columns.raw_lines == data
    return columns, list(decode(data, mode=Mode.FILE, boot_time=BOOT_TIME).records)


def test_columns_are_the_records(columns_and_list) -> None:
    columns, records = columns_and_list
    assert len(columns) == len(records) and list(columns) == records and columns == records and records == columns
    assert columns[5] == records[5] and columns[-1] == records[-1]
    assert columns[10:20] == records[10:20] and isinstance(columns[10:20], RecordColumns)
    assert RecordColumns.of(records) == records and RecordColumns.of(columns) is columns
    assert columns != records[:-1] and columns != "not records"
    assert list(columns.messages) == [r.message for r in records] and list(columns.messages[3:9]) == [
        r.message for r in records[3:9]
    ]
    assert columns[10:20].raw_lines is None  # a slice's lines are not the chunk's bytes


@pytest.mark.parametrize(
    ("cursor_seq", "lookback"),
    [(None, 300.0), (None, 1e12), (None, 0.0), (129, 300.0), (99, 300.0), (500, 300.0)],
    ids=["no-cursor", "no-cursor-all-recent", "no-cursor-all-old", "cursor-mid", "cursor-before", "cursor-after"],
)
def test_the_replay_policy_splits_columns_as_records(columns_and_list, cursor_seq, lookback) -> None:
    columns, records = columns_and_list
    cursor = Cursor(boot_id="b", last_seq=cursor_seq) if cursor_seq is not None else None
    policy = ReplayPolicy(cursor=cursor, boot_id="b", lookback=lookback)
    now = BOOT_TIME + 330.0  # lookback 300 s: the first 29 records are older
    expected = [(list(run), flag) for run, flag in policy.split(records, now=now)]
    assert [(list(run), flag) for run, flag in policy.split(columns, now=now)] == expected
    assert [r for run, _ in expected for r in run] == records  # every record, in order, once
    assert all(policy.replayed(r, now=now) is flag for run, flag in expected for r in run)


@pytest.mark.parametrize("cursor_seq", [50, 99, 100, 129, 159, 500])
@pytest.mark.parametrize("order", ["ascending", "descending", "one-late"])
def test_the_replay_policy_splits_by_each_records_own_seq_in_any_order(columns_and_list, order, cursor_seq) -> None:
    """Every record at or below the cursor is replayed, every one above is not, whatever the order of the
    seqs (the kernel's are ascending; a reread, a relay or a file need not be)."""
    _, records = columns_and_list
    given = {"ascending": records, "descending": records[::-1], "one-late": [*records[1:], records[0]]}[order]
    policy = ReplayPolicy(cursor=Cursor(boot_id="b", last_seq=cursor_seq), boot_id="b", lookback=300.0)
    runs = policy.split(RecordColumns.of(given), now=BOOT_TIME + 330.0)
    assert [r for run, _ in runs for r in run] == given
    assert all((r.seq is not None and r.seq <= cursor_seq) is flag for run, flag in runs for r in run)


@pytest.mark.parametrize(
    ("micros", "base"),
    [(["0", "1", "999999", "1000000", "123456789012"], BOOT_TIME), (["5"], 0.0), ([], 1.5), (["7", "7"], -2.0)],
)
def test_microsecond_times_are_the_records_times(micros, base) -> None:
    times = MicrosecondTimes(micros=micros, base=base)
    expected = [base + int(m) / 1e6 for m in micros]  # parse_record's formula
    assert len(times) == len(expected) and list(times) == expected and times == expected and expected == times
    assert [times[i] for i in range(-len(expected), len(expected))] == expected + expected
    assert times[1:] == expected[1:] and isinstance(times[1:], MicrosecondTimes) and times[::-1] == expected[::-1]
    assert times != [*expected, 0.0] and times != "not times"
    with pytest.raises(IndexError):
        times[len(expected)]


@pytest.mark.parametrize(
    ("micros", "base"),
    [
        (["3", "1", "2"], BOOT_TIME),  # out of order: the earliest is not the first
        (["999999", "1000000", "999998"], BOOT_TIME),  # a shorter number is the smaller one
        (["18446744073709551615", "1"], 1.7e9),  # a u64 of microseconds
        (["5"], -2.0),
    ],
)
def test_the_earliest_time_is_the_smallest_of_the_times(micros, base) -> None:
    assert MicrosecondTimes(micros=micros, base=base).earliest() == min(base + int(m) / 1e6 for m in micros)


class FirstOnly(list):
    """Microseconds that may be read at the first only (the answer must not need the others)."""

    def __getitem__(self, index):
        if isinstance(index, slice):
            return FirstOnly(super().__getitem__(index))
        if index != 0:
            raise AssertionError(f"read the time at {index!r}")
        return super().__getitem__(index)

    def __iter__(self):
        raise AssertionError("read every time")


SLACK_US = int(KERNEL_ORDER_SLACK * 1e6)


@pytest.mark.parametrize(
    ("micros", "logged_order", "oldest_us", "expected"),
    [
        # Not in logged order: every time is read, the earliest decides.
        (["9000000", "1000", "9500000"], False, 5_000_000, False),
        (["9000000", "6000000", "9500000"], False, 5_000_000, True),
        (["5000000"], False, 5_000_000, True),  # at the bound is not before it
        ([], False, 5_000_000, True),
        # In logged order, a first time the slack or more after the bound answers alone...
        (FirstOnly(["9000000", "1", "2"]), True, 9_000_000 - SLACK_US, True),
        # ...and one closer than that reads them all.
        (["9000000", "1", "2"], True, 9_000_000 - SLACK_US + 1, False),
        (["9000000", "8999990", "9000001"], True, 8_999_990, True),
        (["9000000", "8999990", "9000001"], True, 8_999_991, False),
        ([], True, 0, True),
    ],
)
def test_at_least_answers_for_every_time_and_in_logged_order_from_the_first(
    micros, logged_order, oldest_us, expected
) -> None:
    times = MicrosecondTimes(micros=micros, base=BOOT_TIME, logged_order=logged_order)
    assert times.at_least(BOOT_TIME + oldest_us / 1e6) is expected


def test_logged_order_holds_for_forward_slices_only() -> None:
    times = MicrosecondTimes(micros=FirstOnly(["1", "5000000", "2"]), base=0.0, logged_order=True)
    assert times[1:].at_least(3.0) and times[1::1].at_least(3.0)  # 5 s first: the others are not read
    backwards = MicrosecondTimes(micros=["2", "1", "5000000"], base=0.0, logged_order=True)[::-1]
    assert list(backwards) == [5.0, 1e-6, 2e-6] and not backwards.at_least(3.0)  # reversed: all are read


def test_matching_gives_the_same_findings_from_columns(columns_and_list) -> None:
    columns, records = columns_and_list
    rules = load_rule_set([builtin_plugins_dir()])
    from_records = DetectionPipeline(rule_set=rules).process(Batch(records=records))
    from_columns = DetectionPipeline(rule_set=rules).process(Batch(records=columns))
    assert from_columns == from_records and from_records


@pytest.mark.parametrize("last", [None, 99, 120, 200], ids=["fresh", "right-before", "overlapping", "all-old"])
def test_sequence_accounting_is_the_same_on_columns(columns_and_list, last) -> None:
    columns, records = columns_and_list
    results = []
    for given in (records, columns):
        stats = KmsgStats()
        tracker = SequenceTracker(start_after_seq=last, stats=stats, log=logging.getLogger("t"))
        results.append((list(tracker.accept_all(given)), stats.records_lost))
    assert results[0] == results[1]


def test_the_ring_keeps_the_same_lines_from_columns(columns_and_list) -> None:
    columns, records = columns_and_list
    rings = [LineRing(max_lines=25), LineRing(max_lines=25)]
    rings[0].extend(records)
    rings[1].extend(columns)
    assert rings[0].lines() == rings[1].lines() and rings[0].dropped == rings[1].dropped == len(records) - 25
