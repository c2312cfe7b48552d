"""FileLogSource: node-problem-detector's filelog plugin, followed like ``tail -F`` (injected clocks, step by step).

The settings are those of NPD's ``config/kernel-monitor-filelog.json``: ``logPath`` ``/var/log/kern.log``,
``timestamp`` ``^.{15}``, ``message`` ``kernel: \\[.*\\] (.*)``, ``timestampFormat`` ``Jan _2 15:04:05``.
Lines look like rsyslog's traditional kern.log format. Files live under tmp_path; the reader is driven
with ``poll_once()`` so no test waits on a timer.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.core.types import LogRecord
from agent.sources.filelog import (
    MAX_LINE,
    FileLogConfig,
    FileLogConfigError,
    FileLogSource,
    FileLogStats,
)

NOW = datetime(2025, 1, 1, 0, 0, 5, tzinfo=UTC).timestamp()  # just after New Year: year-less times roll back


def kern_config(path: Path, **overrides: object) -> FileLogConfig:
    settings: dict = {
        "path": str(path),
        "timestamp_regex": r"^.{15}",
        "message_regex": r"kernel: \[.*\] (.*)",
        "timestamp_format": "Jan _2 15:04:05",
    }
    settings.update(overrides)
    return FileLogConfig(**settings)


def kern(stamp: str, message: str, *, host: str = "node-1") -> str:
    return f"{stamp} {host} kernel: [ 1234.567890] {message}\n"


def at(iso: str) -> float:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


class Clocks:
    """Wall clock (settable) and a monotonic counter that advances on every read."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now
        self.ticks = 0.0

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        self.ticks += 1.0
        return self.ticks


def make_source(config: FileLogConfig, clocks: Clocks | None = None, **kwargs) -> FileLogSource:
    clocks = clocks or Clocks()
    return FileLogSource(config=config, clock=clocks.wall, monotonic=clocks.monotonic, tz=UTC, **kwargs)


def until_idle(source: FileLogSource, *, limit: int = 200) -> list[LogRecord]:
    """Poll until the reader says to wait (end of file, or a missing file); the records decoded meanwhile."""
    records: list[LogRecord] = []
    for _ in range(limit):
        step = source.poll_once()
        if step.chunk is not None:
            records += source.decode(step.chunk)
        elif step.wait > 0:
            return records
    raise AssertionError("the reader never went idle")


def messages(records: list[LogRecord]) -> list[str]:
    return [r.message for r in records]


def append(path: Path, text: str | bytes) -> None:
    with open(path, "ab") as f:
        f.write(text.encode() if isinstance(text, str) else text)


# ------------------------------------------------------------------------------------------------
# Start position and lookback


def test_starts_at_the_end_and_follows_appends(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(kern("Dec 31 23:59:59", "written before the start"))
    source = make_source(kern_config(log))

    assert until_idle(source) == []
    append(log, kern("Jan  1 00:00:04", "Out of memory: Killed process 42 (python)"))
    records = until_idle(source)

    assert records == [
        LogRecord(
            message="Out of memory: Killed process 42 (python)",
            timestamp=at("2025-01-01T00:00:04"),
            seq=1,
            source=f"filelog:{log}",
        )
    ]
    assert (source.stats.records_read, source.stats.last_record_time) == (1, at("2025-01-01T00:00:04"))
    assert source.stats.connected and source.stats.last_error is None


def test_start_in_the_middle_of_a_line_skips_its_rest(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(kern("Dec 31 23:59:59", "complete") + "Jan  1 00:00:01 node-1 kernel: [ 1.0] half")
    source = make_source(kern_config(log))
    until_idle(source)

    append(log, " of a line\n" + kern("Jan  1 00:00:04", "next"))

    assert messages(until_idle(source)) == ["next"]


@pytest.mark.parametrize(
    ("lookback", "expected"),
    [
        pytest.param(0.0, [], id="no-lookback-starts-at-end"),
        pytest.param(60.0, ["recent", "recent continuation"], id="one-minute"),
        pytest.param(600.0, ["old", "old continuation", "recent", "recent continuation"], id="ten-minutes"),
    ],
)
def test_lookback_delivers_the_recent_lines_present_at_start(
    tmp_path: Path, lookback: float, expected: list[str]
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(
        kern("Dec 31 23:40:00", "ancient")
        + kern("Dec 31 23:58:00", "old")
        + "-- no timestamp -- kernel: [ 2.0] old continuation\n"  # goes with the line before it
        + kern("Dec 31 23:59:30", "recent")
        + "-- no timestamp -- kernel: [ 3.0] recent continuation\n"
    )
    source = make_source(kern_config(log, lookback=lookback))

    assert messages(until_idle(source)) == expected
    append(log, kern("Jan  1 00:00:04", "new"))
    assert messages(until_idle(source)) == ["new"]
    assert source.stats.timestamp_errors == (2 if lookback else 0)


def test_lookback_reads_at_most_lookback_max_bytes_and_never_half_a_line(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    lines = [kern("Jan  1 00:00:00", f"line {n:03d}") for n in range(100)]
    log.write_text("".join(lines))
    source = make_source(kern_config(log, lookback=300.0), lookback_max_bytes=10 * len(lines[0]) + 7)

    assert messages(until_idle(source)) == [f"line {n:03d}" for n in range(90, 100)]


def test_a_file_that_appears_after_the_start_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    source = make_source(kern_config(log))

    assert until_idle(source) == []
    assert source.stats.last_error == f"waiting for {log}: no such file"
    assert (source.stats.connected, source.stats.read_errors, source.stats.last_activity) == (False, 0, None)

    log.write_text(kern("Jan  1 00:00:01", "first") + kern("Jan  1 00:00:02", "second"))
    assert messages(until_idle(source)) == ["first", "second"]
    assert source.stats.last_error is None and source.stats.last_activity is not None


# ------------------------------------------------------------------------------------------------
# Decoding: pluginConfig


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        pytest.param("Dec 31 23:59:58", "2024-12-31T23:59:58", id="last-year"),
        pytest.param("Jan  1 00:00:02", "2025-01-01T00:00:02", id="this-year"),
        pytest.param("Jan  1 00:30:00", "2025-01-01T00:30:00", id="slightly-ahead"),
        pytest.param("Dec 30 08:00:00", "2024-12-30T08:00:00", id="days-before"),
    ],
)
def test_year_less_timestamps_around_new_year(tmp_path: Path, stamp: str, expected: str) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = make_source(kern_config(log))
    until_idle(source)
    append(log, kern(stamp, "hello"))

    assert [r.timestamp for r in until_idle(source)] == [at(expected)]


@pytest.mark.parametrize(
    ("message_regex", "line", "expected"),
    [
        pytest.param(r"kernel: \[.*\] (.*)", kern("Jan  1 00:00:01", "a: b"), "a: b", id="npd-kernel-group"),
        pytest.param(
            r"kernel: \[\s*\d+\.\d+\] (.*)", "xx Jan  1 00:00:01 kernel: [ 5.5] mid\n", "mid", id="unanchored"
        ),
        pytest.param(
            r"kernel: .*", kern("Jan  1 00:00:01", "m"), "kernel: [ 1234.567890] m", id="no-group-whole-match"
        ),
        pytest.param(r"(\w+)\[(\d+)\]: (.*)", "Jan  1 00:00:01 h dockerd[7]: up\n", "up", id="last-group-counts"),
        pytest.param(r"kernel: (x)?(.*)", kern("Jan  1 00:00:01", "y"), "[ 1234.567890] y", id="optional-group"),
        pytest.param(r"kernel: .*(x)?$", kern("Jan  1 00:00:01", "y"), "", id="last-group-unused-is-empty"),
    ],
)
def test_message_is_the_last_group_of_the_message_regex(
    tmp_path: Path, message_regex: str, line: str, expected: str
) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = make_source(kern_config(log, message_regex=message_regex))
    until_idle(source)
    append(log, line)

    assert messages(until_idle(source)) == [expected]


def test_lines_the_message_regex_does_not_match_are_dropped_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = make_source(kern_config(log))
    until_idle(source)
    append(log, "Jan  1 00:00:01 node-1 systemd[1]: Started foo.\n" + kern("Jan  1 00:00:02", "kept"))

    records = until_idle(source)

    assert [(r.seq, r.message) for r in records] == [(2, "kept")]
    assert (source.stats.parse_errors, source.stats.records_read) == (1, 1)


def test_bytes_that_are_not_utf8_are_replaced(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = make_source(kern_config(log, skip_list=("é skip",)))
    until_idle(source)
    append(log, b"Jan  1 00:00:01 node-1 kernel: [ 1.0] bad \xff\xfe bytes, caf\xc3\xa9\n")
    append(log, "Jan  1 00:00:02 node-1 kernel: [ 2.0] é skip\n".encode())

    assert messages(until_idle(source)) == ["bad \ufffd\ufffd bytes, café"]
    assert source.stats.lines_skipped == 1


def test_skip_list_drops_lines_containing_any_item(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = make_source(kern_config(log, skip_list=("audit:", "IPv6")))
    until_idle(source)
    append(
        log,
        kern("Jan  1 00:00:01", "audit: type=1400 apparmor")
        + kern("Jan  1 00:00:02", "IPv6: ADDRCONF(NETDEV_CHANGE)")
        + kern("Jan  1 00:00:03", "EXT4-fs error"),
    )

    assert messages(until_idle(source)) == ["EXT4-fs error"]
    assert (source.stats.lines_skipped, source.stats.parse_errors) == (2, 0)


def test_an_unreadable_timestamp_keeps_the_line_with_the_read_time(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    clocks = Clocks()
    source = make_source(kern_config(log), clocks)
    until_idle(source)
    clocks.now = NOW + 7
    append(log, "2025-01-01T00:00:04+00:00 node-1 kernel: [ 9.0] new rsyslog time format\n")

    records = until_idle(source)

    assert [(r.message, r.timestamp) for r in records] == [("new rsyslog time format", NOW + 7)]
    assert source.stats.timestamp_errors == 1


@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        pytest.param("pluginConfig.message", {"message_regex": r"(?=lookahead)"}, id="lookahead"),
        pytest.param("pluginConfig.message", {"message_regex": ""}, id="empty-message"),
        pytest.param("pluginConfig.timestamp", {"timestamp_regex": r"(unclosed"}, id="unbalanced"),
        pytest.param("pluginConfig.timestampFormat", {"timestamp_format": "2006-002"}, id="year-day-layout"),
        pytest.param("pluginConfig.timestampFormat", {"timestamp_format": ""}, id="empty-layout"),
    ],
)
def test_bad_plugin_config_names_the_field(tmp_path: Path, field: str, overrides: dict) -> None:
    with pytest.raises(FileLogConfigError) as caught:
        make_source(kern_config(tmp_path / "kern.log", **overrides))
    assert caught.value.field == field


# ------------------------------------------------------------------------------------------------
# Lines: partial, long


def test_a_partial_last_line_is_held_until_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = make_source(kern_config(log))
    until_idle(source)

    append(log, "Jan  1 00:00:01 node-1 kernel: [ 1.0] NETDEV WATCHDOG: eth0 (ixgbe): transmit ")
    assert until_idle(source) == []
    append(log, "queue 3 timed out\n")

    assert messages(until_idle(source)) == ["NETDEV WATCHDOG: eth0 (ixgbe): transmit queue 3 timed out"]


@pytest.mark.parametrize("length", [100 * 1024, 1024 * 1024], ids=["100KiB-in-one-go", "1MiB-in-pieces"])
def test_a_line_longer_than_64KiB_is_cut(tmp_path: Path, length: int) -> None:
    log = tmp_path / "app.log"
    log.touch()
    source = make_source(kern_config(log, message_regex=r"(.*)"))
    until_idle(source)
    body = "Jan  1 00:00:01 " + "x" * length
    records: list[LogRecord] = []
    if length > 200 * 1024:
        step = 300 * 1024
        for start in range(0, len(body), step):  # the writer is slow: the reader sees it grow
            append(log, body[start : start + step])
            records += until_idle(source)  # the cut line comes out once it passes MAX_LINE
        append(log, "\n")
    else:
        append(log, body + "\n")
    append(log, "Jan  1 00:00:02 next line\n")

    records += until_idle(source)

    assert [len(r.message) for r in records] == [MAX_LINE, len("Jan  1 00:00:02 next line")]
    assert records[0].timestamp == at("2025-01-01T00:00:01")
    assert source.stats.lines_cut == 1


# ------------------------------------------------------------------------------------------------
# Rotation, truncation, deletion


def test_rotation_by_rename_finishes_the_old_file_then_reads_the_new_one(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(kern("Jan  1 00:00:00", "before start"))
    source = make_source(kern_config(log))
    until_idle(source)
    append(log, kern("Jan  1 00:00:01", "one"))
    assert messages(until_idle(source)) == ["one"]

    rotated = tmp_path / "kern.log.1"
    log.rename(rotated)
    append(rotated, kern("Jan  1 00:00:02", "written to the old file after the rename") + "unterminated")
    log.write_text(kern("Jan  1 00:00:03", "first of the new file"))

    records = until_idle(source)

    assert messages(records) == [
        "written to the old file after the rename",
        # "unterminated" does not match the message regex: dropped, counted
        "first of the new file",
    ]
    assert (source.stats.rotations, source.stats.parse_errors) == (1, 1)
    append(log, kern("Jan  1 00:00:04", "two"))
    assert messages(until_idle(source)) == ["two"]


def test_copytruncate_reads_the_file_again_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(kern("Jan  1 00:00:00", "before start"))
    source = make_source(kern_config(log))
    until_idle(source)
    append(log, kern("Jan  1 00:00:01", "one"))
    assert messages(until_idle(source)) == ["one"]

    (tmp_path / "kern.log.1").write_bytes(log.read_bytes())  # logrotate copytruncate: copy ...
    with open(log, "r+b") as f:
        f.truncate(0)  # ... then truncate in place (same inode)
    append(log, kern("Jan  1 00:00:02", "after truncation"))

    assert messages(until_idle(source)) == ["after truncation"]
    assert source.stats.rotations == 1


def test_deleted_file_is_waited_for_and_read_from_its_start_when_recreated(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    source = make_source(kern_config(log))
    until_idle(source)
    append(log, kern("Jan  1 00:00:01", "one"))
    log.unlink()

    assert messages(until_idle(source)) == ["one"]
    assert source.stats.last_error == f"waiting for {log}: no such file"
    assert not source.stats.connected
    activity = source.stats.last_activity
    assert until_idle(source) == []
    assert source.stats.last_activity == activity  # a missing file is not a live source

    log.write_text(kern("Jan  1 00:00:02", "recreated"))
    assert messages(until_idle(source)) == ["recreated"]
    assert source.stats.connected and source.stats.last_error is None
    assert (source.stats.rotations, source.stats.read_errors) == (1, 0)


def test_a_directory_at_the_path_is_an_error_not_a_crash(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.mkdir()
    source = make_source(kern_config(log))

    step = source.poll_once()

    assert step.chunk is None and step.wait > 0
    assert source.stats.last_error == f"cannot follow {log}: not a regular file"
    assert source.stats.read_errors == 1


def test_waits_back_off_while_the_file_is_missing(tmp_path: Path) -> None:
    source = make_source(kern_config(tmp_path / "kern.log"), poll_interval=0.5, backoff_max=4.0)

    assert [source.poll_once().wait for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


# ------------------------------------------------------------------------------------------------
# The producer side: chunks()


def test_chunks_stops_on_stop_and_closes_the_file(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    stop = threading.Event()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:
            append(log, kern("Jan  1 00:00:01", "one") + kern("Jan  1 00:00:02", "two"))
        else:
            stop.set()

    stats = FileLogStats()
    source = make_source(kern_config(log), stats=stats, sleep=sleep, poll_interval=0.25)
    chunks = list(source.chunks(stop=stop))

    assert [r.message for chunk in chunks for r in source.decode(chunk)] == ["one", "two"]
    assert waits == [0.25, 0.25]
    assert source.stats is stats and not stats.connected


def test_no_file_descriptor_is_left_open(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()
    before = set(os.listdir("/proc/self/fd"))
    source = make_source(kern_config(log))
    until_idle(source)
    log.rename(tmp_path / "kern.log.1")
    log.touch()
    until_idle(source)
    source.close()

    assert set(os.listdir("/proc/self/fd")) <= before
