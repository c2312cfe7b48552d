"""Detection pipeline: log records → matchable lines → rule engine → catch-all → findings.

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
from agent.detectors.catchall import CatchAll, Leveled, subsystems
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
        config = rule_set.catch_all
        # The last stage: error-level records no rule knows (agent.detectors.catchall); None when off.
        self.catch_all = CatchAll(config=config) if config is not None and config.enabled else None
        self.rule_matches: Counter[str] = Counter()
        self.lines_matched = 0

    def catch_all_counts(self) -> dict[str, dict[str, int]]:
        """The catch-all's figures for the metrics: every subsystem (0 where none came, so alerts can fire on the
        first) and every platform-noise entry; empty while it is off."""
        stage = self.catch_all
        if stage is None:
            return {}
        return {
            "unmatched_errors": {s: stage.unmatched.get(s, 0) for s in subsystems()},
            "platform_noise": {e.name: stage.benign.get(e.name, 0) for e in stage.config.benign},
        }

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
        one_each = raw_lines is not None or "\n" not in "".join(messages)
        if one_each:
            lines = Mapped(messages, str.strip) if raw_lines is not None else list(map(str.strip, messages))
            times = columns.timestamps
            numbers = _numbers(columns.seqs)
        else:
            lines, times, numbers = _split_lines(records)
        if not lines:
            return []
        # Replayed records were told before a restart: the catch-all's Events (temporary) are not told again.
        catch_all = self.catch_all if not batch.permanent_only else None
        severe = columns.severe(catch_all.max_level) if catch_all is not None else []
        matched: list[int] | None = [] if severe else None
        gates: tuple[int, ...] = getattr(self._engine, "gate_levels", ())
        findings = self._engine.feed(
            lines,
            times=times,
            line_numbers=numbers,
            permanent_only=batch.permanent_only,
            raw_lines=raw_lines,
            matched=matched,
            levels=_levels(columns, gates, one_each=one_each) if gates else None,
        )
        if catch_all is not None and severe:
            findings.extend(catch_all.findings(_unknown(columns, severe, matched or [], one_each=one_each)))
        self.lines_matched += len(lines)
        for finding in findings:
            self.rule_matches[finding.rule] += 1
        return findings


def _levels(columns: RecordColumns, gates: Sequence[int], *, one_each: bool) -> dict[int, Sequence[int]] | None:
    """For each gate level, the line indexes of the records printed at that level or worse or of no known level
    (the engine's ``levels``); None when no record's level is known."""
    out: dict[int, Sequence[int]] = {}
    for level in gates:
        records = columns.gated(level)
        if records is None:
            return None
        if one_each:
            out[level] = records
            continue
        # Lines were split out of multi-line messages: every line of a record has its level.
        starts, at = [], 0
        for message in columns.messages:
            starts.append(at)
            at += message.count("\n") + 1
        out[level] = [j for i in records for j in range(starts[i], starts[i] + columns.messages[i].count("\n") + 1)]
    return out


def _unknown(columns: RecordColumns, severe: list[int], matched: list[int], *, one_each: bool) -> list[Leveled]:
    """The records at ``severe`` indexes whose lines no rule matched (``matched``: line indexes), leveled."""
    if one_each:
        known = set(matched)
        unknown = [i for i in severe if i not in known]
    else:  # lines were split out of multi-line messages: a record is known where any of its lines is
        line_of, at = [], 0
        for message in columns.messages:
            line_of.append(at)
            at += message.count("\n") + 1
        known = set(matched)
        spans = {i: range(line_of[i], line_of[i] + columns.messages[i].count("\n") + 1) for i in severe}
        unknown = [i for i in severe if not any(j in known for j in spans[i])]
    out = []
    for i in unknown:
        record = columns[i]
        out.append(
            Leveled(message=record.message, level=record.priority or 0, timestamp=record.timestamp, line=record.seq)
        )
    return out


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
