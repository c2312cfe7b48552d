"""Detection pipeline: log records → normalised lines → rule engine → findings.

Keeps the replay semantics (records already processed before a restart only rebuild permanent
conditions) and the per-rule match counts the metrics report. Pure apart from the engine's
matching state: no threads, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.detectors.prefix import strip_prefix
from agent.detectors.rulepack import RuleSet
from agent.detectors.rules import RuleEngine
from agent.types import Finding, LogRecord


def normalize(message: str) -> list[str]:
    """The matchable lines of a message: split on newlines, log prefixes stripped, whitespace trimmed.

    node-problem-detector trims every message too, so a trailing space never defeats an
    end-anchored pattern.
    """
    return [strip_prefix(part).strip() for part in message.split("\n")]


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

    def process(self, batch: Batch) -> list[Finding]:
        lines: list[str] = []
        times: list[float] = []
        numbers: list[int] = []
        for record in batch.records:
            for line in normalize(record.message):
                lines.append(line)
                times.append(record.timestamp)
                numbers.append(record.seq if record.seq is not None else 0)
        if not lines:
            return []
        findings = self._engine.feed(lines, times=times, line_numbers=numbers, permanent_only=batch.permanent_only)
        self.lines_matched += len(lines)
        for finding in findings:
            self.rule_matches[finding.rule] += 1
        return findings
