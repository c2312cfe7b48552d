"""The agent's own counters reach /metrics: every counter the parts keep is exported (issue 14: some
were kept and never exported), with bounded labels."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.core.types import Snapshot
from agent.sinks.metrics import AgentCollector, AgentStats, build_registry

BASE = AgentStats(
    records_read=0,
    records_lost=0,
    reader_restarts=0,
    read_errors=0,
    parse_errors=0,
    last_record_time=None,
    lines_matched=0,
    rule_matches={},
    config_generation=1,
    rules_loaded=0,
    components={},
)


def scrape(stats: AgentStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = build_registry(
        AgentCollector(snapshot=lambda: Snapshot(conditions=(), generated_at=0.0), stats=lambda: stats)
    )
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.parametrize(
    ("given", "sample", "labels", "value"),
    [
        ({"kmsg_overruns": 3}, "node_health_agent_kmsg_overruns_total", (), 3),
        ({"decode_errors": 2}, "node_health_agent_decode_errors_total", (), 2),
        ({"events_dropped": 7}, "node_health_agent_events_dropped_total", (), 7),
        (
            {"monitor_counts": {("kubelet-journal", "messages_cut"): 4}},
            "node_health_agent_log_monitor_total",
            (("count", "messages_cut"), ("monitor", "kubelet-journal")),
            4,
        ),
        (
            {"monitor_counts": {("syslog", "rotations"): 1}},
            "node_health_agent_log_monitor_total",
            (("count", "rotations"), ("monitor", "syslog")),
            1,
        ),
    ],
    ids=["kmsg-overruns", "decode-errors", "events-dropped", "journald-counter", "filelog-counter"],
)
def test_every_kept_counter_is_exported(given, sample, labels, value):
    assert scrape(dataclasses.replace(BASE, **given))[(sample, labels)] == value


def test_counters_read_zero_before_anything_happened():
    samples = scrape(BASE)
    for name in ("kmsg_overruns", "decode_errors", "events_dropped"):
        assert samples[(f"node_health_agent_{name}_total", ())] == 0
    assert not [key for key in samples if key[0] == "node_health_agent_log_monitor_total"]  # no monitors, no series
