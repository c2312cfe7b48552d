"""The checks' metrics: the scheduler changes each check's ``CheckStats`` in place, and the collector keeps
its families while the figures stand (issue 16) — a change made in place still shows on the next scrape."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.app.exposition import TextRenderer
from agent.checks.metrics import CheckCollector
from agent.checks.model import CheckStatus, Value
from agent.checks.scheduler import CheckStats


def _ran(stats: CheckStats) -> None:
    stats.last_status = CheckStatus.PROBLEM
    stats.runs[CheckStatus.PROBLEM.value] += 1


def _timed_out(stats: CheckStats) -> None:
    stats.errors["timeout"] += 1


def _new_value(stats: CheckStats) -> None:
    stats.values = (Value(name="gpu_ecc_errors", value=3, labels={"gpu": "0"}),)


def _took_longer(stats: CheckStats) -> None:
    stats.last_duration = 2.5


def _cannot_run(stats: CheckStats) -> None:
    stats.cannot_run = "not executable"


# (a change the scheduler makes in place, a line the next scrape must show)
IN_PLACE = [
    (_ran, 'node_health_agent_check_status{check="gpu",status="PROBLEM"} 1.0'),
    (_ran, 'node_health_agent_check_runs_total{check="gpu",outcome="PROBLEM"} 1.0'),
    (_timed_out, 'node_health_agent_check_errors_total{check="gpu",error="timeout"} 1.0'),
    (_new_value, 'node_health_agent_check_gpu_ecc_errors{check="gpu",gpu="0"} 3.0'),
    (_took_longer, 'node_health_agent_check_duration_seconds{check="gpu"} 2.5'),
    (_cannot_run, 'node_health_agent_check_cannot_run{check="gpu"} 1.0'),
]


@pytest.mark.parametrize(("change", "shown"), IN_PLACE, ids=["status", "runs", "errors", "value", "duration", "cannot"])
def test_a_change_made_in_place_shows_on_the_next_scrape(change, shown) -> None:
    stats = {"gpu": CheckStats(kind="python", origin="builtin", last_status=CheckStatus.OK, last_duration=0.1)}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CheckCollector(stats=lambda: stats))
    renderer = TextRenderer()
    assert shown not in renderer.render(registry).decode()
    change(stats["gpu"])
    body = renderer.render(registry)
    assert shown in body.decode()
    assert body == generate_latest(registry)


def test_figures_that_stand_give_the_very_same_families() -> None:
    stats = {"gpu": CheckStats(kind="python", origin="builtin", values=(Value(name="temp", value=40.0),))}
    collector = CheckCollector(stats=lambda: stats)
    first, second = list(collector.collect()), list(collector.collect())
    assert all(a is b for a, b in zip(first, second, strict=True))
