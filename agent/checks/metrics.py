"""Prometheus metrics of the checks, computed at scrape time from the scheduler's figures.

- ``node_health_agent_check_status{check,status}``: 1 for the last run's outcome (OK, PROBLEM,
  UNKNOWN), 0 for the others.
- ``node_health_agent_check_duration_seconds{check}``: how long the last run took.
- ``node_health_agent_check_last_success_timestamp_seconds{check}``: when a run last completed
  (OK or PROBLEM: the check itself worked).
- ``node_health_agent_check_runs_total{check,outcome}``: runs by outcome.
- ``node_health_agent_check_errors_total{check,error}``: the agent's own trouble running it
  (``timeout``, ``exception``, ``invalid`` result): the self-health signal, never the node's.
- ``node_health_agent_check_cannot_run{check}``: 1 while the check cannot run at all (its executable
  is missing or not executable, its Python plugin cannot be loaded), else 0.
- ``node_health_agent_check_<value>{check,...}``: the labelled values the checks report
  (ECC counts, link states, allocatable devices, ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.checks.model import CheckStatus
from agent.checks.scheduler import CheckStats
from agent.core.memo import Memo

PREFIX = "node_health_agent_check_"
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class _Figures:
    """One check's figures at a scrape: a copy, since the scheduler changes its CheckStats in place."""

    name: str
    last_status: CheckStatus | None
    last_duration: float | None
    last_success: float | None
    runs: tuple[tuple[str, int], ...]
    errors: tuple[tuple[str, int], ...]
    values: tuple[tuple[str, float, tuple[tuple[str, str], ...]], ...]  # (name, value, labels)
    cannot_run: bool

    @classmethod
    def of(cls, name: str, stats: CheckStats) -> _Figures:
        return cls(
            name=name,
            last_status=stats.last_status,
            last_duration=stats.last_duration,
            last_success=stats.last_success,
            runs=tuple(stats.runs.items()),
            errors=tuple(stats.errors.items()),
            values=tuple((v.name, v.value, tuple(v.labels.items())) for v in stats.values),
            cannot_run=bool(stats.cannot_run),
        )


class CheckCollector:
    def __init__(self, *, stats: Callable[[], Mapping[str, CheckStats]]) -> None:
        self._stats = stats
        # The same families (objects) while the figures stand: the /metrics renderer reuses their text.
        self._families: Memo[tuple[_Figures, ...], tuple[Metric, ...]] = Memo(_families)

    def collect(self) -> Iterator[Metric]:
        stats = dict(self._stats())
        yield from self._families(tuple(_Figures.of(name, s) for name, s in sorted(stats.items())))


def _families(checks: tuple[_Figures, ...]) -> tuple[Metric, ...]:
    status = GaugeMetricFamily(
        PREFIX + "status", "1 for the outcome of the check's last run.", labels=["check", "status"]
    )
    duration = GaugeMetricFamily(PREFIX + "duration_seconds", "Duration of the last run.", labels=["check"])
    success = GaugeMetricFamily(
        PREFIX + "last_success_timestamp_seconds",
        "When a run of the check last completed (OK or PROBLEM).",
        labels=["check"],
    )
    runs = CounterMetricFamily(PREFIX + "runs", "Runs of the check by outcome.", labels=["check", "outcome"])
    errors = CounterMetricFamily(
        PREFIX + "errors",
        "The agent's own trouble running the check (timeout, exception, invalid result).",
        labels=["check", "error"],
    )
    cannot_run = GaugeMetricFamily(
        PREFIX + "cannot_run",
        "1 while the check cannot run at all (plugin missing, not executable, or not loadable).",
        labels=["check"],
    )
    values: dict[str, list[tuple[str, Mapping[str, str], float]]] = {}
    for s in checks:
        name = s.name
        for st in CheckStatus:
            status.add_metric([name, st.value], 1.0 if s.last_status is st else 0.0)
        if s.last_duration is not None:
            duration.add_metric([name], s.last_duration)
        if s.last_success is not None:
            success.add_metric([name], s.last_success)
        for outcome, n in s.runs:
            runs.add_metric([name, outcome], n)
        for error, n in s.errors:
            errors.add_metric([name, error], n)
        cannot_run.add_metric([name], 1.0 if s.cannot_run else 0.0)
        for value_name, value, label_items in s.values:
            given = dict(label_items)
            if _NAME_RE.match(value_name) and all(_LABEL_RE.match(k) and k != "check" for k in given):
                values.setdefault(value_name, []).append((name, given, float(value)))
    families: list[Metric] = [status, duration, success, runs, errors, cannot_run]
    for value_name, samples in sorted(values.items()):
        keys = sorted({k for _, labels, _ in samples for k in labels})
        family = GaugeMetricFamily(PREFIX + value_name, f"Check value {value_name}.", labels=["check", *keys])
        seen = set()
        for check, labels, number in samples:
            label_values = (check, *(str(labels.get(k, "")) for k in keys))
            if label_values in seen:
                continue
            seen.add(label_values)
            family.add_metric(list(label_values), number)
        families.append(family)
    return tuple(families)
