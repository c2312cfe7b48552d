"""How many catch-all Events a healthy node gets a day (issue 38 §2: at most 1).

The catch-all (agent/detectors/catchall.py) turns an error-level kernel record no rule knows into a
``KernelError_<subsystem>`` Event. A healthy node's logs are run through the agent's own pipeline (the
built-in packs, the catch-all with its window and bounds) with each record's level and time as the log
kept them, and the Events counted per day of the log's span (first to last record; a log shorter than a
day counts as a day, so a boot's noise is not scaled up past what it is):

- this machine's kernel log (``dmesg -r``: level and seconds since boot), read where the bench runs;
- the open set's healthy captures that kept a level (``../shared/testdata/tool-outputs``, read in place);
- the open set's healthy lines (``kernel-lines.jsonl``, ``expect_problem`` false) that kept a level: each
  one alone; any that would raise an Event is a false alarm.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agent.core.types import LogRecord

_DMESG_R = re.compile(r"^<(\d{1,4})>\[\s*(\d+)\.(\d+)\]\s?(.*)$")
_KMSG = re.compile(r"^(\d{1,4}),(\d+),(\d+),[^;]*;(.*)$")
DAY = 86400.0


@dataclass(frozen=True, kw_only=True)
class PerDay:
    source: str
    records: int
    severe: int  # kernel records at error level or worse
    events: int
    span_s: float

    @property
    def per_day(self) -> float:
        return self.events / max(1.0, self.span_s / DAY)


def records_of(lines: list[str]) -> list[LogRecord]:
    """The records of ``dmesg -r`` or raw kmsg lines, with their level, facility and time; others skipped."""
    out = []
    for n, line in enumerate(lines, start=1):
        if m := _DMESG_R.match(line):
            prio, at, message = int(m.group(1)), float(f"{m.group(2)}.{m.group(3)}"), m.group(4)
        elif m := _KMSG.match(line):
            prio, at, message = int(m.group(1)), int(m.group(3)) / 1e6, m.group(4)
        else:
            continue
        out.append(LogRecord(message=message, timestamp=at, seq=n, priority=prio & 7, facility=prio >> 3))
    return out


def per_day(source: str, records: list[LogRecord], rule_set: object) -> PerDay:
    from agent.detectors.catchall import RULE
    from agent.detectors.pipeline import Batch, DetectionPipeline

    pipeline = DetectionPipeline(rule_set=rule_set)  # type: ignore[arg-type]
    events = sum(f.rule == RULE for f in pipeline.process(Batch(records=records))) if records else 0
    times = [r.timestamp for r in records]
    return PerDay(
        source=source,
        records=len(records),
        severe=sum(1 for r in records if not r.facility and (r.priority or 0) <= 3),
        events=events,
        span_s=(max(times) - min(times)) if times else 0.0,
    )


def this_machine() -> list[str]:
    """This machine's kernel log as ``dmesg -r`` prints it (empty where it cannot be read)."""
    try:
        done = subprocess.run(["dmesg", "-r"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.splitlines() if done.returncode == 0 else []


def _capture(path: Path) -> list[str]:
    """A tool-outputs file's output (after its ``---8<---`` line)."""
    lines = path.read_text(errors="replace").splitlines()
    cut = next((i for i, line in enumerate(lines) if "---8<---" in line), -1)
    return lines[cut + 1 :]


def healthy_captures(testdata: Path) -> list[tuple[str, list[str]]]:
    """The open set's healthy kernel log captures (``expect_problem: False``) that kept a level."""
    out = []
    for path in sorted((testdata / "tool-outputs").glob("*")):
        if not path.is_file() or path.suffix not in (".log", ".txt"):
            continue
        head = path.read_text(errors="replace")[:2000]
        if "expect_problem: False" not in head:
            continue
        lines = _capture(path)
        if records_of(lines):
            out.append((path.name, lines))
    return out


def healthy_lines_raising(testdata: Path, rule_set: object) -> tuple[int, list[str]]:
    """(healthy lines of kernel-lines.jsonl that kept a level, those the catch-all would raise an Event for)."""
    from agent.app.commands.simulate import simulate_lines
    from agent.detectors.catchall import RULE
    from agent.detectors.prefix import saved_level

    path = testdata / "kernel-lines.jsonl"
    if not path.is_file():
        return 0, []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    leveled = [r["text"] for r in rows if not r["expect_problem"] and saved_level(r["text"]) is not None]
    raising = [
        text
        for text in leveled
        if any(f["rule"] == RULE for f in simulate_lines(rule_set=rule_set, lines=iter([text])))  # type: ignore[arg-type]
    ]
    return len(leveled), raising


def measure(testdata: Path) -> tuple[list[PerDay], tuple[int, list[str]]]:
    from agent.app.config import load_rule_set
    from agent.app.settings import builtin_packs
    from agent.core.paths import builtin_plugins_dir

    rule_set = load_rule_set([builtin_plugins_dir() / p for p in builtin_packs()])
    days = [per_day("this machine (dmesg -r)", records_of(this_machine()), rule_set)]
    if testdata.is_dir():
        days += [per_day(name, records_of(lines), rule_set) for name, lines in healthy_captures(testdata)]
        return days, healthy_lines_raising(testdata, rule_set)
    return days, (0, [])


if __name__ == "__main__":
    found, (leveled, raising) = measure(Path(__file__).resolve().parents[2] / "shared" / "testdata")
    for d in found:
        print(
            f"{d.source}: {d.records} records, {d.severe} at err or worse, {d.events} Events over "
            f"{d.span_s / 3600:.1f} h = {d.per_day:.2f} a day"
        )
    print(f"healthy leveled lines: {leveled}, raising an Event: {len(raising)}")
