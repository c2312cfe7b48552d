"""JournalSource: journalctl as a subprocess, its JSON lines as records, restarts, a missing binary.

Most tests put a fake ``journalctl`` (a small Python script) alone on a temporary PATH; it records its
arguments and plays a plan: print some lines, write to stderr, exit or hang. The lines it prints were
recorded from the real ``journalctl --output=json`` (systemd 252.38, Debian 12) reading a journal that
``systemd-journal-remote`` built from an export-format stream (entries of ``dockerd`` and ``systemd``):
a plain MESSAGE, a MESSAGE with escape and non-UTF-8 bytes (printed as an array of byte values), a
MESSAGE given twice (an array of strings), and one over 4096 bytes without ``--all`` (``null``), as
journalctl(1) "json" output and systemd.io/JOURNAL_EXPORT_FORMATS ("Journal JSON Format") describe.
The last two tests run the real tools when they are installed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.core.types import LogRecord
from agent.sources import journald
from agent.sources.journald import JournalChunk, JournalConfig, JournalSource, JournalStats, build_command

from helpers import process_gone, wait_for

NOW = 1735689600.0  # 2025-01-01T00:00:00Z
CURSOR = "s=338b0c5dc8a046b5aa47b4bccd0f1386;i={};b=0f5a1c2e9d8b4a7f8e6d5c4b3a291807;m=a08f4dadc0;t=62a99b9fd1dc0;x=1"

# Recorded with journalctl 252 (see the module docstring); key order as printed.
PLAIN = {
    "_MACHINE_ID": "5833158886a8445e801d437313d25eff",
    "__MONOTONIC_TIMESTAMP": "689599000000",
    "_HOSTNAME": "node-1",
    "MESSAGE": 'time="2024-12-31T23:59:59.000000000Z" level=error msg="Handler for POST /v1.41/containers/create '
    'returned error: readlink /var/lib/docker/overlay2/l/ABCDEF: invalid argument"',
    "_TRANSPORT": "stdout",
    "__REALTIME_TIMESTAMP": "1735689599000000",
    "_PID": "812",
    "_SYSTEMD_UNIT": "docker.service",
    "SYSLOG_FACILITY": "3",
    "PRIORITY": "6",
    "_BOOT_ID": "0f5a1c2e9d8b4a7f8e6d5c4b3a291807",
    "SYSLOG_IDENTIFIER": "dockerd",
    "__CURSOR": "s=338b0c5dc8a046b5aa47b4bccd0f1386;i=1;b=0f5a1c2e9d8b4a7f8e6d5c4b3a291807;m=a08f4dadc0;"
    "t=62a99b9fd1dc0;x=e368a6b29a43d912",
}
BINARY = {
    "_TRANSPORT": "stdout",
    "_SYSTEMD_UNIT": "docker.service",
    "SYSLOG_IDENTIFIER": "dockerd",
    "_BOOT_ID": "0f5a1c2e9d8b4a7f8e6d5c4b3a291807",
    "__MONOTONIC_TIMESTAMP": "689599500000",
    "PRIORITY": "6",
    "MESSAGE": [98, 105, 110, 97, 114, 121, 32, 27, 91, 51, 49, 109, 114, 101, 100, 27, 91, 48, 109, 32, 109]
    + [101, 115, 115, 97, 103, 101, 32, 255, 254, 32, 101, 110, 100],
    "_PID": "812",
    "__REALTIME_TIMESTAMP": "1735689599500000",
    "SYSLOG_FACILITY": "3",
    "_MACHINE_ID": "5833158886a8445e801d437313d25eff",
    "_HOSTNAME": "node-1",
    "__CURSOR": "s=338b0c5dc8a046b5aa47b4bccd0f1386;i=2;b=0f5a1c2e9d8b4a7f8e6d5c4b3a291807;m=a08f554ee0;"
    "t=62a99ba04bee0;x=ca844f080f26d471",
}
TWICE = {
    "__MONOTONIC_TIMESTAMP": "689601000000",
    "_BOOT_ID": "0f5a1c2e9d8b4a7f8e6d5c4b3a291807",
    "SYSLOG_FACILITY": "3",
    "MESSAGE": ["first value", "second value"],
    "__REALTIME_TIMESTAMP": "1735689601000000",
    "_HOSTNAME": "node-1",
    "__CURSOR": "s=338b0c5dc8a046b5aa47b4bccd0f1386;i=4;b=0f5a1c2e9d8b4a7f8e6d5c4b3a291807;m=a08f6c3240;"
    "t=62a99ba1ba240;x=ca48bf17155ea11f",
    "PRIORITY": "6",
    "_TRANSPORT": "stdout",
    "_MACHINE_ID": "5833158886a8445e801d437313d25eff",
    "_PID": "812",
    "SYSLOG_IDENTIFIER": "dockerd",
}
NULL = {
    "_BOOT_ID": "0f5a1c2e9d8b4a7f8e6d5c4b3a291807",
    "__CURSOR": "s=338b0c5dc8a046b5aa47b4bccd0f1386;i=5;b=0f5a1c2e9d8b4a7f8e6d5c4b3a291807;m=a08f7b7480;"
    "t=62a99ba2ae480;x=32a2afda15df715c",
    "__REALTIME_TIMESTAMP": "1735689602000000",
    "SYSLOG_IDENTIFIER": "dockerd",
    "MESSAGE": None,
    "_HOSTNAME": "node-1",
    "_TRANSPORT": "stdout",
    "__MONOTONIC_TIMESTAMP": "689602000000",
    "PRIORITY": "6",
    "_PID": "812",
    "SYSLOG_FACILITY": "3",
    "_MACHINE_ID": "5833158886a8445e801d437313d25eff",
}


def line(entry: dict) -> str:
    """An entry as journalctl prints it: compact JSON on one line."""
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False)


def entry(n: int, message: object = None, **fields: str) -> dict:
    return {
        "__CURSOR": CURSOR.format(n),
        "__REALTIME_TIMESTAMP": str(int((NOW + n) * 1e6)),
        "SYSLOG_IDENTIFIER": "dockerd",
        "MESSAGE": f"message {n}" if message is None else message,
        **fields,
    }


FAKE_JOURNALCTL = """#!{python}
import json, os, subprocess, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
with open(os.path.join(here, "calls.jsonl")) as f:
    call = sum(1 for _ in f)
with open(os.path.join(here, "plan.json")) as f:
    plan = json.load(f)
run = plan[min(call, len(plan)) - 1]
for text in run.get("lines", []):
    sys.stdout.write(text + "\\n")
sys.stdout.write(run.get("partial", ""))
sys.stdout.flush()
if run.get("stderr"):
    sys.stderr.write(run["stderr"] + "\\n")
    sys.stderr.flush()
if run.get("hang"):
    if run.get("child"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.path.join(here, "child.pid"), "w") as f:
            f.write(str(child.pid))
    with open(os.path.join(here, "journalctl.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
sys.exit(run.get("exit", 0))
"""


class FakeJournalctl:
    """A fake journalctl alone in a directory used as PATH; ``plan`` is one dict per invocation."""

    def __init__(self, directory: Path, plan: list[dict]) -> None:
        self.directory = directory
        directory.mkdir(exist_ok=True)
        script = directory / "journalctl"
        script.write_text(FAKE_JOURNALCTL.format(python=sys.executable))
        script.chmod(0o755)
        (directory / "plan.json").write_text(json.dumps(plan))

    @property
    def calls(self) -> list[list[str]]:
        path = self.directory / "calls.jsonl"
        return [json.loads(text) for text in path.read_text().splitlines()] if path.exists() else []

    def pid(self, name: str) -> int | None:
        path = self.directory / f"{name}.pid"
        return int(path.read_text()) if path.exists() and path.read_text() else None


def make_source(path: Path | str, config: JournalConfig | None = None, **kwargs) -> JournalSource:
    kwargs.setdefault("clock", lambda: NOW)
    kwargs.setdefault("poll_interval", 0.05)
    kwargs.setdefault("backoff_initial", 0.1)
    return JournalSource(config=config or JournalConfig(source="dockerd", lookback=300.0), path=str(path), **kwargs)


def poll_until(source: JournalSource, done: Callable[[list[LogRecord]], bool], *, limit: int = 400) -> list[LogRecord]:
    """Poll (each poll waits at most poll_interval for output) until ``done(records)``."""
    records: list[LogRecord] = []
    for _ in range(limit):
        step = source.poll_once()
        if step.chunk is not None:
            records += source.decode(step.chunk)
        if done(records):
            return records
    raise AssertionError(f"not reached after {limit} polls; records: {records!r}, stats: {source.stats!r}")


# ------------------------------------------------------------------------------------------------
# The command line


@pytest.mark.parametrize(
    ("config", "kwargs", "tail"),
    [
        pytest.param(
            JournalConfig(source="dockerd", directory="/var/log/journal", lookback=300.0),
            {"since": NOW - 300.0},
            ["--since=@1735689300", "--directory=/var/log/journal", "SYSLOG_IDENTIFIER=dockerd"],
            id="npd-docker-monitor",
        ),
        pytest.param(
            JournalConfig(source="systemd"),
            {"since": NOW + 0.9},
            ["--since=@1735689600", "SYSLOG_IDENTIFIER=systemd"],
            id="system-journal-no-lookback",
        ),
        pytest.param(
            JournalConfig(source="kernel"),
            {"since": NOW},
            ["--since=@1735689600", "SYSLOG_IDENTIFIER=kernel", "_TRANSPORT=kernel"],
            id="kernel-only-from-the-kernel",
        ),
        pytest.param(
            JournalConfig(source="kubelet", directory="/run/log/journal"),
            {"since": NOW, "after_cursor": CURSOR.format(7)},
            [f"--after-cursor={CURSOR.format(7)}", "--directory=/run/log/journal", "SYSLOG_IDENTIFIER=kubelet"],
            id="restart-after-cursor",
        ),
    ],
)
def test_build_command(config: JournalConfig, kwargs: dict, tail: list[str]) -> None:
    head = ["journalctl", "--follow", "--output=json", "--no-pager", "--all", "--lines=all"]
    assert build_command("journalctl", config, **kwargs) == head + tail


def test_an_empty_source_is_refused() -> None:
    with pytest.raises(ValueError, match="SYSLOG_IDENTIFIER"):
        JournalSource(config=JournalConfig(source=""))


# ------------------------------------------------------------------------------------------------
# Decoding recorded output


def test_decode_recorded_journalctl_json() -> None:
    source = JournalSource(config=JournalConfig(source="dockerd"))
    data = "".join(line(e) + "\n" for e in (PLAIN, BINARY, TWICE, NULL)).encode()

    records = source.decode(JournalChunk(data=data, read_time=NOW))

    assert [(r.seq, r.timestamp, r.message) for r in records] == [
        (1, 1735689599.0, PLAIN["MESSAGE"]),
        (2, 1735689599.5, "binary \x1b[31mred\x1b[0m message \ufffd\ufffd end"),
        (3, 1735689601.0, "second value"),  # a field given twice: the last value, as node-problem-detector keeps
    ]
    assert {(r.priority, r.facility, r.source) for r in records} == {(6, 3, "journald:dockerd")}
    assert (source.stats.records_read, source.stats.empty_messages, source.stats.parse_errors) == (3, 1, 0)
    assert source.stats.last_record_time == 1735689601.0


@pytest.mark.parametrize(
    ("text", "expected", "counter"),
    [
        pytest.param(line(entry(1, "  padded message \n")), "padded message", None, id="trimmed-like-npd"),
        pytest.param(line(entry(1, "   ")), None, "empty_messages", id="only-white-space"),
        pytest.param(line({"__REALTIME_TIMESTAMP": "1"}), None, "empty_messages", id="no-message-field"),
        pytest.param(line(entry(1, [])), None, "empty_messages", id="empty-byte-array"),
        pytest.param(line(entry(1, [104, 105, 300])), None, "empty_messages", id="not-bytes"),
        pytest.param(line(entry(1, ["a", [104, 105]])), "hi", None, id="last-value-binary"),
        pytest.param('{"MESSAGE": "x", "__REALTIME_TIMESTAMP": "soon"}', "x", "timestamp_errors", id="bad-timestamp"),
        pytest.param("Failed to get journal", None, "parse_errors", id="not-json"),
        pytest.param('["MESSAGE", "x"]', None, "parse_errors", id="not-an-object"),
    ],
)
def test_decode_odd_entries(text: str, expected: str | None, counter: str | None) -> None:
    source = JournalSource(config=JournalConfig(source="dockerd"))

    records = source.decode(JournalChunk(data=(text + "\n").encode(), read_time=NOW + 9))

    assert [r.message for r in records] == ([expected] if expected is not None else [])
    if counter == "timestamp_errors":
        assert records[0].timestamp == NOW + 9
    if counter is not None:
        assert getattr(source.stats, counter) == 1


def test_decode_cuts_long_messages() -> None:
    source = JournalSource(config=JournalConfig(source="dockerd"))
    data = (line(entry(1, "x" * (journald.MAX_ENTRY_MESSAGE + 10))) + "\n").encode()

    (record,) = source.decode(JournalChunk(data=data, read_time=NOW))

    assert len(record.message) == journald.MAX_ENTRY_MESSAGE
    assert source.stats.messages_cut == 1


# ------------------------------------------------------------------------------------------------
# The process


def test_runs_journalctl_with_the_lookback_and_reads_its_entries(tmp_path: Path) -> None:
    fake = FakeJournalctl(tmp_path / "bin", [{"lines": [line(PLAIN), line(BINARY)], "hang": True}])
    config = JournalConfig(source="dockerd", directory="/var/log/journal", lookback=300.0)
    source = make_source(fake.directory, config)
    try:
        records = poll_until(source, lambda r: len(r) == 2)
        assert [r.timestamp for r in records] == [1735689599.0, 1735689599.5]
        assert fake.calls == [
            [
                "--follow",
                "--output=json",
                "--no-pager",
                "--all",
                "--lines=all",
                "--since=@1735689300",
                "--directory=/var/log/journal",
                "SYSLOG_IDENTIFIER=dockerd",
            ]
        ]
        poll_until(source, lambda _: source.stats.last_activity is not None and source.stats.connected)
        assert source.stats.last_error is None
    finally:
        source.close()
    assert not source.stats.connected


def test_restarts_after_an_exit_continuing_after_the_last_cursor(tmp_path: Path) -> None:
    plan = [
        {
            "lines": [line(entry(1)), line(entry(2))],
            "stderr": "Failed to iterate through journal: Bad message",
            "exit": 1,
        },
        {"lines": [line(entry(3))], "hang": True},
    ]
    fake = FakeJournalctl(tmp_path / "bin", plan)
    source = make_source(fake.directory)
    try:
        first = poll_until(source, lambda _: source.stats.read_errors == 1)
        assert (
            source.stats.last_error == "journalctl exited with status 1: Failed to iterate through journal: Bad message"
        )
        assert (source.stats.connected, source.stats.reader_restarts) == (False, 1)

        records = first + poll_until(source, lambda r: len(r) == 1)
        assert [r.message for r in records] == ["message 1", "message 2", "message 3"]
        assert [r.seq for r in records] == [1, 2, 3]
        assert fake.calls[1][-2:] == [f"--after-cursor={CURSOR.format(2)}", "SYSLOG_IDENTIFIER=dockerd"]
        assert not any(arg.startswith("--since") for arg in fake.calls[1])

        poll_until(source, lambda _: source.stats.last_error is None)
        assert source.stats.connected
    finally:
        source.close()


def test_a_restart_before_any_entry_keeps_the_original_start(tmp_path: Path) -> None:
    fake = FakeJournalctl(tmp_path / "bin", [{"exit": 1}, {"exit": 1}])
    clock = iter([NOW, NOW + 60, NOW + 120])
    source = make_source(fake.directory, clock=lambda: next(clock))

    poll_until(source, lambda _: len(fake.calls) == 2 and source.stats.read_errors == 2)

    assert [call[5] for call in fake.calls] == ["--since=@1735689300"] * 2
    assert source.stats.last_error == "journalctl exited with status 1"


def test_backoff_between_restarts(tmp_path: Path) -> None:
    fake = FakeJournalctl(tmp_path / "bin", [{"exit": 2}])
    source = make_source(fake.directory, backoff_initial=1.0, backoff_max=4.0)
    waits: list[float] = []
    for _ in range(200):
        step = source.poll_once()
        if step.wait > 0:
            waits.append(step.wait)
        if len(waits) == 4:
            break

    assert waits == [1.0, 2.0, 4.0, 4.0]
    assert source.stats.read_errors == 4


def test_partial_and_garbage_output_lines(tmp_path: Path) -> None:
    fake = FakeJournalctl(
        tmp_path / "bin", [{"lines": ["Journal file corrupted", line(entry(1))], "partial": '{"MESS'}]
    )
    source = make_source(fake.directory)

    records = poll_until(source, lambda _: source.stats.read_errors == 1)

    assert [r.message for r in records] == ["message 1"]
    assert source.stats.parse_errors == 1
    assert source.stats.last_error == "journalctl exited with status 0"


@pytest.mark.parametrize(
    "run",
    [
        pytest.param({"lines": [line(entry(1, "y" * 5000)), line(entry(2))], "hang": True}, id="complete"),
        pytest.param({"lines": [line(entry(2))], "partial": '{"MESSAGE":"' + "y" * 5000, "hang": True}, id="unending"),
    ],
)
def test_an_over_long_output_line_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: dict) -> None:
    monkeypatch.setattr(journald, "MAX_JSON_LINE", 1000)
    fake = FakeJournalctl(tmp_path / "bin", [run])
    source = make_source(fake.directory)
    try:
        records = poll_until(source, lambda r: len(r) == 1 and source.stats.entries_too_long == 1)
    finally:
        source.close()

    assert [r.message for r in records] == ["message 2"]


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    fake = FakeJournalctl(tmp_path / "bin", [{"lines": [line(entry(1))], "hang": True, "child": True}])
    source = make_source(fake.directory)
    poll_until(source, lambda _: bool(fake.pid("journalctl") and fake.pid("child")))
    journalctl_pid, child_pid = fake.pid("journalctl"), fake.pid("child")
    assert journalctl_pid and child_pid and not process_gone(journalctl_pid) and not process_gone(child_pid)

    stop = threading.Event()
    stop.set()
    assert list(source.chunks(stop=stop)) == []  # the producer ends: the source is closed

    # journalctl itself was waited for; its reparented child dies when the kernel gets to it
    wait_for(lambda: process_gone(journalctl_pid) and process_gone(child_pid), timeout=10.0)
    assert not source.stats.connected


def test_missing_journalctl_is_an_error_not_a_crash(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    stop = threading.Event()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            stop.set()

    source = make_source(empty, sleep=sleep, backoff_initial=1.0)

    assert list(source.chunks(stop=stop)) == []
    assert source.stats.last_error == f"journalctl not found in PATH ({empty}){journald.NO_JOURNALCTL_HINT}"
    assert "-journald" in journald.NO_JOURNALCTL_HINT, "names the image variant that has it"
    assert waits == [1.0, 2.0, 4.0]
    assert (source.stats.read_errors, source.stats.last_activity, source.stats.connected) == (3, None, False)


def test_a_journalctl_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bin"
    bad.mkdir()
    (bad / "journalctl").write_text("no interpreter line\n")
    (bad / "journalctl").chmod(0o755)
    source = make_source(bad)

    step = source.poll_once()

    assert step.wait > 0
    assert (source.stats.last_error or "").startswith(f"cannot start {bad / 'journalctl'}: ")


# ------------------------------------------------------------------------------------------------
# The real journalctl


def _export_entry(fields: list[tuple[str, str | bytes]]) -> bytes:
    """One entry in the journal export format: KEY=value lines; binary values with a 64-bit length."""
    out = b""
    for key, value in fields:
        if isinstance(value, bytes):
            out += key.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
        else:
            out += f"{key}={value}\n".encode()
    return out + b"\n"


def real_journal(tmp_path: Path, entries: list[list[tuple[str, str | bytes]]], *, source: str) -> JournalSource:
    """A journal directory holding ``entries`` (fields; the timestamps and boot id are added: one entry a
    second from NOW), written by systemd-journal-remote, read by the real journalctl as monitor ``source``."""
    journalctl = shutil.which("journalctl")
    remote = next(
        (
            p
            for p in ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")
            if os.path.exists(p)
        ),
        None,
    )
    if journalctl is None or remote is None:
        pytest.skip("needs journalctl and systemd-journal-remote")
    directory = tmp_path / "journal"
    directory.mkdir()
    stream = b""
    for n, fields in enumerate(entries):
        usec = int((NOW + n) * 1e6)
        stream += _export_entry(
            [
                ("__REALTIME_TIMESTAMP", str(usec)),
                ("__MONOTONIC_TIMESTAMP", str(usec - 1_700_000_000_000_000)),
                ("_BOOT_ID", "0f5a1c2e9d8b4a7f8e6d5c4b3a291807"),
                *fields,
            ]
        )
    (tmp_path / "in.export").write_bytes(stream)
    with open(tmp_path / "in.export", "rb") as stdin:
        subprocess.run(
            [remote, "-o", str(directory / "remote.journal"), "-"], stdin=stdin, check=True, capture_output=True
        )
    return make_source(
        os.path.dirname(journalctl), JournalConfig(source=source, directory=str(directory), lookback=10.0)
    )


def test_real_journalctl_on_a_journal_directory(tmp_path: Path) -> None:
    source = real_journal(
        tmp_path,
        [
            [("SYSLOG_IDENTIFIER", ident), ("MESSAGE", message)]
            for ident, message in [
                ("dockerd", "readlink /var/lib/docker/overlay2/l/X: invalid argument"),
                ("systemd", "Started x."),
                ("dockerd", b"bytes \xff\x07"),
                ("dockerd", "z" * 5000),
            ]
        ],
        source="dockerd",
    )
    try:
        records = poll_until(source, lambda r: len(r) == 3)
    finally:
        source.close()

    assert [(r.timestamp, r.message[:20]) for r in records] == [
        (NOW, "readlink /var/lib/do"),
        (NOW + 2, "bytes \ufffd\x07"),  # not UTF-8: printed as byte values, decoded with replacement
        (NOW + 3, "z" * 20),
    ]
    assert len(records[2].message) == 5000  # --all: a field over 4096 bytes is printed, not null
    assert isinstance(source.stats, JournalStats)


def test_real_journalctl_reads_as_kernel_only_what_the_kernel_logged(tmp_path: Path) -> None:
    """``logger -t kernel`` (any user) gives SYSLOG_IDENTIFIER=kernel with _TRANSPORT=syslog; the kernel's
    own lines have _TRANSPORT=kernel, a field journald sets and no client can."""
    source = real_journal(
        tmp_path,
        [
            [("_TRANSPORT", transport), ("SYSLOG_IDENTIFIER", "kernel"), ("MESSAGE", message)]
            for transport, message in [
                ("kernel", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."),
                ("syslog", "NVRM: Xid (PCI:0000:3b:00): 79, forged by logger -t kernel"),
                ("journal", "NVRM: Xid (PCI:0000:3b:00): 79, forged by systemd-cat -t kernel"),
                ("kernel", "the last entry"),
            ]
        ],
        source="kernel",
    )
    try:
        records = poll_until(source, lambda r: any(x.message == "the last entry" for x in r))  # read in order
    finally:
        source.close()
    assert [r.message for r in records] == [
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "the last entry",
    ]
