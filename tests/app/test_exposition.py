"""The /metrics body: ``TextRenderer`` writes exactly what prometheus-client's ``generate_latest`` writes
(issue 16: the library's per-sample name checks made a scrape cost 5 ms of the agent's CPU), on every
metric type, odd names and label values, and the agent's own collector, scrape after scrape, and when
families change between scrapes (it reuses the text of what did not change)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.core import GaugeHistogramMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from agent.app import exposition
from agent.app.exposition import TextRenderer
from agent.core.latency import HistogramSnapshot
from agent.core.types import Condition, Severity, Snapshot, Status
from agent.sinks.metrics import AgentCollector, AgentStats, build_registry

ODD_VALUES = ["plain", 'quote " inside', "back\\slash", "new\nline", "ünïcödé °C", "", "trailing\\"]


class OddCollector(Collector):
    """Families a hand-written collector may yield: names outside the legacy set, timestamps, odd floats."""

    def collect(self) -> Iterator[Metric]:
        untyped = Metric("odd.metric-name", "Help with a back\\slash\nand a newline.", "unknown")
        untyped.add_sample("odd.metric-name", {"label-with-dash": "x", "ok_label": 'v"1'}, 1.5, timestamp=12.345)
        untyped.add_sample("odd.metric-name", {}, float("nan"))
        yield untyped
        gauge = Metric("odd_gauge", "", "gauge")
        for value in (float("inf"), float("-inf"), -0.0, 1e-9, 123456789012.0, 7):
            gauge.add_sample("odd_gauge", {"v": repr(value)}, value)
        yield gauge
        yield GaugeHistogramMetricFamily(
            "odd_gauge_histogram", "A gauge histogram.", buckets=[("1", 2), ("+Inf", 3)], gsum_value=4
        )
        yield StateSetMetricFamily("odd_stateset", "A state set.", {"a": True, "b": False})
        info = Metric("odd", "An info.", "info")
        info.add_sample("odd_info", {"version": "1.2"}, 1)
        yield info


def library_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    counter = Counter("requests", "Requests.", ["path", "code"], registry=registry)
    for i, value in enumerate(ODD_VALUES):
        counter.labels(path=value, code=str(i)).inc(i + 0.5)
    Gauge("temperature_celsius", "A gauge.", registry=registry).set(-3.25)
    Histogram("latency_seconds", "A histogram.", ["op"], registry=registry).labels(op="read").observe(0.3)
    Summary("size_bytes", "A summary.", registry=registry).observe(512)
    Info("build", "An info.", registry=registry).info({"version": "1.0", "commit": 'a"b'})
    Enum("state", "An enum.", states=["up", "down"], registry=registry).state("down")
    registry.register(OddCollector())
    return registry


def agent_registry() -> CollectorRegistry:
    conditions = tuple(
        Condition(
            type=f"Type{i}",
            status=Status.TRUE if i % 2 else Status.FALSE,
            reason=f"Reason{i}",
            message="m",
            last_transition=1.0,
            last_update=2.0,
            severity=Severity.CRITICAL,
        )
        for i in range(3)
    )
    snapshot = Snapshot(
        conditions=conditions,
        generated_at=5.0,
        problem_counts={"NeuronHasError_DMA_ERROR": 3, 'Odd "reason"': 1},
        problem_pairs=(("NeuronHealth", "NeuronHasError_DMA_ERROR"),),
        reasons_overflowed={"neuron/hw-error": 2},
    )
    stats = AgentStats(
        records_read=10,
        records_lost=1,
        reader_restarts=0,
        read_errors=0,
        parse_errors=2,
        last_record_time=1_700_000_000.5,
        lines_matched=10,
        rule_matches={"neuron/hw-error": 3, "kernel/oom-killing": 1},
        config_generation=4,
        rules_loaded=150,
        components={"main_loop": True, "kmsg_reader": False},
        device_matches={("nvidia/xid-node", "gpu=0"): 2},
        monitor_counts={("syslog", "rotations"): 1},
        detection=HistogramSnapshot(buckets=((0.1, 1), (1.0, 2), (float("inf"), 3)), total=1.5, count=3),
    )
    return build_registry(AgentCollector(snapshot=lambda: snapshot, stats=lambda: stats))


@pytest.mark.parametrize("make", [library_registry, agent_registry], ids=["every-type-and-odd-names", "agent"])
def test_the_body_is_generate_latests(make) -> None:
    registry = make()
    renderer = TextRenderer()
    expected = generate_latest(registry)
    assert renderer.render(registry) == expected
    assert renderer.render(registry) == expected  # the remembered names give the same body again


def test_names_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exposition, "MAX_NAMES", 2)
    registry = library_registry()
    renderer = TextRenderer()
    assert renderer.render(registry) == generate_latest(registry)
    assert len(renderer._metric_names) <= 2
    assert len(renderer._label_names) <= 2


class Changing(Collector):
    """A collector whose families change between scrapes as the agent's do: samples that stand are the same
    objects (a collector's memo), a sample that moved is a new one."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {"a": 0.0, "b": 1.0, "c": 2.0}
        self.help = "Help."
        self.kind = "gauge"
        self._made: dict[tuple[str, float], Sample] = {}

    def collect(self) -> Iterator[Metric]:
        family = Metric("changing", self.help, self.kind)
        for key, value in self.values.items():
            made = self._made.get((key, value))
            if made is None or math.copysign(1.0, made.value) != math.copysign(1.0, value):
                made = self._made[(key, value)] = Sample("changing", {"k": key}, value)
            family.samples.append(made)
        yield family
        fresh = Metric("fresh", "Made anew every scrape.", "counter")  # equal samples, new objects
        fresh.add_sample("fresh_total", {}, sum(self.values.values()))
        yield fresh


def _move(collector: Changing, step: str) -> None:
    if step == "value":
        collector.values["b"] = 5.0
    elif step == "negative-zero":
        collector.values["a"] = -0.0
    elif step == "nan":
        collector.values["c"] = float("nan")
    elif step == "inserted":
        collector.values = {"0": 9.0, **collector.values}
    elif step == "removed":
        del collector.values["b"]
    elif step == "help":
        collector.help = "Other help."
    elif step == "type":
        collector.kind = "untyped"


STEPS = ["value", "negative-zero", "nan", "inserted", "removed", "help", "type"]


@pytest.mark.parametrize("steps", [[s] for s in STEPS] + [STEPS], ids=[*STEPS, "all-in-turn"])
def test_a_family_that_changed_is_written_as_generate_latest_writes_it(steps) -> None:
    """Families whose text is reused, or whose unchanged lines are: after each change the body is still
    byte for byte generate_latest's, and a scrape with nothing changed gives the same body again."""
    collector = Changing()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    renderer = TextRenderer()
    assert renderer.render(registry) == generate_latest(registry)
    for step in steps:
        _move(collector, step)
        body = renderer.render(registry)
        assert body == generate_latest(registry), step
        assert renderer.render(registry) == body


def test_families_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exposition, "MAX_FAMILIES", 2)
    registry = library_registry()
    renderer = TextRenderer()
    assert renderer.render(registry) == generate_latest(registry)
    assert len(renderer._written) <= 2
    assert renderer.render(registry) == generate_latest(registry)
