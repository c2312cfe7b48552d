"""From check verdicts to findings: the failure/success thresholds, in the main loop (the one writer).

Per check and condition, one verdict per run: the worst of the run's results for that condition
(any PROBLEM, the most severe one, wins over UNKNOWN, which wins over OK).

- ``failure_threshold`` consecutive PROBLEM runs → a finding that sets the condition True;
- ``success_threshold`` consecutive OK runs → a finding that sets it False (its healthy default);
- UNKNOWN changes nothing: it neither counts toward a streak nor breaks one. The agent's own
  trouble never becomes the node's.

A result without a condition is a warning: a temporary finding (an Event) when it starts, i.e.
when the previous run of that check did not report the same reason, or on every PROBLEM run when
the result asks for it (``repeat_event``, node-problem-detector temporary rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.checks.model import CheckReport, CheckResult, CheckStatus
from agent.core.types import Finding, RuleType, Severity, Status

MESSAGE_MAX = 1024
_ORDER = {CheckStatus.OK: 0, CheckStatus.UNKNOWN: 1, CheckStatus.PROBLEM: 2}


def verdict(results: Sequence[CheckResult]) -> CheckResult:
    """The run's verdict for one condition: the worst result; several PROBLEMs are told in one message."""
    worst = max(results, key=lambda r: (_ORDER[r.status], r.severity.rank))
    if worst.status is not CheckStatus.PROBLEM:
        return worst
    problems = [r for r in results if r.status is CheckStatus.PROBLEM]
    if len(problems) == 1:
        return worst
    message = "; ".join(dict.fromkeys(r.message for r in problems))
    if len(message) > MESSAGE_MAX:
        message = message[: MESSAGE_MAX - 1] + "…"
    return CheckResult(
        status=CheckStatus.PROBLEM,
        condition=worst.condition,
        reason=worst.reason,
        message=message,
        severity=worst.severity,
    )


@dataclass(slots=True)
class _Streak:
    problems: int = 0
    oks: int = 0


@dataclass(slots=True)
class CheckJudge:
    """Consecutive-verdict counters per (check, condition) and active warnings per check."""

    _streaks: dict[tuple[str, str], _Streak] = field(default_factory=dict)
    _warnings: dict[str, frozenset[str]] = field(default_factory=dict)

    def judge(self, report: CheckReport) -> list[Finding]:
        findings: list[Finding] = []
        by_condition: dict[str, list[CheckResult]] = {}
        warned: set[str] = set()
        for result in report.results:
            if result.condition is not None:
                by_condition.setdefault(result.condition, []).append(result)
            elif result.status is CheckStatus.PROBLEM:
                if result.repeat_event or result.reason not in self._warnings.get(report.check, frozenset()):
                    findings.append(self._warning(report, result))
                warned.add(result.reason)
        self._warnings[report.check] = frozenset(warned)
        for condition, results in by_condition.items():
            finding = self._condition(report, condition, verdict(results))
            if finding is not None:
                findings.append(finding)
        return findings

    def _condition(self, report: CheckReport, condition: str, result: CheckResult) -> Finding | None:
        streak = self._streaks.setdefault((report.check, condition), _Streak())
        if result.status is CheckStatus.UNKNOWN:
            return None
        if result.status is CheckStatus.PROBLEM:
            streak.problems += 1
            streak.oks = 0
            if streak.problems < report.failure_threshold:
                return None
            status = Status.TRUE
        else:
            streak.oks += 1
            streak.problems = 0
            if streak.oks < report.success_threshold:
                return None
            status = Status.FALSE
        return Finding(
            rule=f"check:{report.check}",
            type=RuleType.PERMANENT,
            condition=condition,
            reason=result.reason,
            severity=result.severity if status is Status.TRUE else Severity.INFO,
            message=result.message,
            timestamp=report.finished_at,
            source=report.check,
            status=status,
        )

    @staticmethod
    def _warning(report: CheckReport, result: CheckResult) -> Finding:
        return Finding(
            rule=f"check:{report.check}",
            type=RuleType.TEMPORARY,
            condition=None,
            reason=result.reason,
            severity=result.severity,
            message=result.message,
            timestamp=report.finished_at,
            source=report.check,
        )

    def forget(self, checks: Sequence[str]) -> None:
        """Drop the counters of checks that no longer exist (after a reload)."""
        gone = set(checks)
        self._streaks = {k: v for k, v in self._streaks.items() if k[0] not in gone}
        self._warnings = {k: v for k, v in self._warnings.items() if k not in gone}
