"""The agent's own counters reach /metrics: every counter the parts keep is exported (issue 14: some
were kept and never exported), with bounded labels; a collector that keeps its families while their
figures stand (issue 16) still shows every change on the next scrape."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.exposition import TextRenderer
from agent.core.types import Condition, Severity, Snapshot, Status
from agent.sinks.metrics import AgentCollector, AgentStats, build_registry

from helpers.sinks import IDLE_STATS

BASE = IDLE_STATS


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


def snapshot(counts: dict[str, int], conditions: tuple[Condition, ...] = ()) -> Snapshot:
    return Snapshot(
        conditions=conditions,
        generated_at=0.0,
        problem_counts=counts,
        problem_pairs=tuple(("NeuronHealth", reason) for reason in counts),
    )


def condition(status: Status, reason: str) -> Condition:
    return Condition(
        type="NeuronHealth",
        status=status,
        reason=reason,
        message="m",
        last_transition=1.0,
        last_update=1.0,
        severity=Severity.CRITICAL,
    )


# (what changes between two scrapes of one collector, the sample that must show it)
CHANGES = [
    (
        {"snap": snapshot({"A": 1, "B": 0})},
        'node_health_agent_problems_total{reason="A"} 1.0',
    ),
    (
        {"snap": snapshot({"A": 0, "B": 2})},
        'problem_counter{reason="B"} 2.0',
    ),
    (
        {"snap": snapshot({"A": 0, "B": 0}, (condition(Status.TRUE, "B"),))},
        'problem_gauge{reason="B",type="NeuronHealth"} 1.0',
    ),
    (
        {"stats": dataclasses.replace(BASE, lines_matched=5)},
        "node_health_agent_lines_matched_total 5.0",
    ),
    (
        {"stats": dataclasses.replace(BASE, rule_matches={"kernel/oom": 1})},
        'node_health_agent_rule_matches_total{rule="kernel/oom"} 1.0',
    ),
]


@pytest.mark.parametrize(("change", "shown"), CHANGES, ids=["count", "other-count", "condition", "stat", "rule"])
def test_one_collector_shows_each_change_scrape_after_scrape(change, shown) -> None:
    """The collector keeps its families while their figures stand (the renderer then skips them): a
    change in the snapshot or the stats must still show on the very next scrape, and going back shows."""
    current = {"snap": snapshot({"A": 0, "B": 0}), "stats": BASE}
    collector = AgentCollector(snapshot=lambda: current["snap"], stats=lambda: current["stats"])
    registry = build_registry(collector)
    renderer = TextRenderer()
    before = renderer.render(registry).decode()
    assert shown not in before
    current.update(change)
    after = renderer.render(registry).decode()
    assert shown in after
    assert after.encode() == generate_latest(registry)
    current.update({"snap": snapshot({"A": 0, "B": 0}), "stats": BASE})
    assert renderer.render(registry).decode() == before


def test_figures_that_stand_give_the_very_same_families() -> None:
    """Equal figures in new objects (each scrape builds a new snapshot and stats): the same family objects,
    which is what lets the renderer reuse their text."""
    collector = AgentCollector(
        snapshot=lambda: snapshot({"A": 1, "B": 0}, (condition(Status.TRUE, "A"),)),
        stats=lambda: dataclasses.replace(BASE, rule_matches={"kernel/oom": 1}),
    )
    first, second = list(collector.collect()), list(collector.collect())
    assert len(first) == len(second) and all(a is b for a, b in zip(first, second, strict=True))


def test_a_reason_whose_count_stands_keeps_its_samples() -> None:
    counts = {"A": 1, "B": 0, "C": 4}
    collector = AgentCollector(snapshot=lambda: snapshot(dict(counts)), stats=lambda: BASE)
    before = {
        s.labels["reason"]: s
        for family in collector.collect()
        if family.name == "problem_counter"
        for s in family.samples
    }
    counts["B"] = 1
    after = {
        s.labels["reason"]: s
        for family in collector.collect()
        if family.name == "problem_counter"
        for s in family.samples
    }
    assert after["A"] is before["A"] and after["C"] is before["C"]
    assert after["B"] is not before["B"] and after["B"].value == 1


# Successive problem counts of one collector: moves only, reasons coming and going (first, middle, last), back
COUNT_STEPS = [
    {"B": 0, "D": 0, "F": 2},
    {"B": 1, "D": 0, "F": 2},
    {"B": 1, "D": 5, "F": 3},
    {"A": 1, "B": 1, "D": 5, "F": 3},
    {"A": 1, "B": 1, "C": 0, "D": 6, "F": 3, "G": 1},
    {"A": 1, "D": 6, "G": 1},
    {"A": 1, "E": 6, "G": 1},  # as many reasons, one another
    {},
    {"B": 0, "D": 0, "F": 2},
]


def test_count_families_follow_every_step_and_keep_the_samples_that_stand() -> None:
    """Each scrape shows exactly the counts (as a fresh collector would); a reason whose count stands keeps
    its very sample objects whether other counts moved or reasons came and went."""
    current = {"counts": COUNT_STEPS[0]}
    collector = AgentCollector(snapshot=lambda: snapshot(dict(current["counts"])), stats=lambda: BASE)

    def samples(of: AgentCollector) -> dict[tuple[str, str], object]:
        return {
            (family.name, s.labels["reason"]): s
            for family in of.collect()
            if family.name in ("problem_counter", "node_health_agent_problems")
            for s in family.samples
        }

    before: dict[tuple[str, str], object] = {}
    for previous, counts in zip([{}, *COUNT_STEPS], COUNT_STEPS, strict=False):
        current["counts"] = counts
        shown = samples(collector)
        fresh = samples(AgentCollector(snapshot=lambda counts=counts: snapshot(dict(counts)), stats=lambda: BASE))
        assert {key: s.value for key, s in shown.items()} == {key: s.value for key, s in fresh.items()}
        assert [key for key in shown] == [key for key in fresh]  # sorted by reason, as before
        stood = {key for key in shown if key[1] in previous and previous[key[1]] == counts[key[1]]}
        assert all(shown[key] is before[key] for key in stood), counts
        before = shown


def test_a_moving_stat_rebuilds_its_own_family_only() -> None:
    """After a kernel line the records counters move and the agent's other figures stand: only the moving
    families are new objects (the renderer writes their lines only)."""
    current = {"stats": BASE}
    collector = AgentCollector(snapshot=lambda: snapshot({"A": 0}), stats=lambda: current["stats"])
    before = {family.name: family for family in collector.collect()}
    current["stats"] = dataclasses.replace(BASE, records_read=BASE.records_read + 1, lines_matched=7)
    after = {family.name: family for family in collector.collect()}
    moved = {name for name, family in after.items() if family is not before[name]}
    assert moved == {"node_health_agent_kmsg_records_read", "node_health_agent_lines_matched"}
