"""Detection pipeline: log records → matchable lines → rule engine → findings.

Live kernel records are matched as the kernel printed them (split on embedded newlines, outer
whitespace trimmed, as node-problem-detector trims): a message that begins with ``kernel:`` or
``[12.3]`` is not cut. Prefix stripping of saved logs belongs to ``simulate`` and file sources
(:func:`saved_log_line`). Keeps the replay semantics (records already processed before a restart
only rebuild permanent conditions) and the per-rule match counts the metrics report. Pure apart
from the engine's matching state: no threads, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from agent.core.columns import Mapped, RecordColumns
from agent.core.types import Finding, LogRecord
from agent.detectors.prefix import strip_prefix
from agent.detectors.rulepack import RuleSet
from agent.detectors.rules import RuleEngine


def saved_log_line(line: str) -> str:
    """A line of a saved log (dmesg, syslog, journal) with its log-format prefixes stripped."""
    return strip_prefix(line).strip()


@dataclass(frozen=True, kw_only=True, slots=True)
class Batch:
    """Records to match together, all with the same replay mode."""

    records: Sequence[LogRecord]
    permanent_only: bool = False


class DetectionPipeline:
    def __init__(self, *, rule_set: RuleSet, engine_factory: Callable[..., RuleEngine] = RuleEngine) -> None:
        self.rule_set = rule_set
        self._engine = engine_factory(rule_set=rule_set)
        self.rule_matches: Counter[str] = Counter()
        self.lines_matched = 0

    def threshold_counts(self) -> dict[tuple[str, str], int]:
        """Matches of count-in-window rules by device (their ``by`` fields), quiet ones included."""
        counts = getattr(self._engine, "threshold_counts", None)
        return counts() if counts is not None else {}

    def process(self, batch: Batch) -> list[Finding]:
        records = batch.records
        columns = RecordColumns.of(records)  # the kernel log reader's records are columns already
        messages = columns.messages
        raw_lines = columns.raw_lines
        lines: Sequence[str]
        # The usual case: one line per record, built in C loops; the kernel's own lines (no newline in any)
        # stripped only where a rule looks at them.
        if raw_lines is not None or "\n" not in "".join(messages):
            lines = Mapped(messages, str.strip) if raw_lines is not None else list(map(str.strip, messages))
            times = columns.timestamps
            numbers = _numbers(columns.seqs)
        else:
            lines, times, numbers = _split_lines(records)
        if not lines:
            return []
        findings = self._engine.feed(
            lines, times=times, line_numbers=numbers, permanent_only=batch.permanent_only, raw_lines=raw_lines
        )
        self.lines_matched += len(lines)
        for finding in findings:
            self.rule_matches[finding.rule] += 1
        return findings


def _numbers(seqs: Sequence[int | None]) -> Sequence[int]:
    """The line numbers of records numbered ``seqs`` (0 for a record without one)."""
    if isinstance(seqs, range) or None not in seqs:  # `None in` walks a range too: the device's chunks come as one
        return cast(Sequence[int], seqs)
    return [s if s is not None else 0 for s in seqs]


def _split_lines(records: Sequence[LogRecord]) -> tuple[list[str], list[float], list[int]]:
    """Each line of each record's message, stripped, with the record's time and number (0 for none)."""
    lines: list[str] = []
    times: list[float] = []
    numbers: list[int] = []
    for record in records:
        seq = record.seq if record.seq is not None else 0
        for line in record.message.split("\n"):
            lines.append(line.strip())
            times.append(record.timestamp)
            numbers.append(seq)
    return lines, times, numbers
