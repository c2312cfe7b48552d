"""The CloudWatch sink on simulated time, and once end to end against moto.

Each test publishes snapshots on a feed, lets the sink use simulated seconds (``SimTime``) and
reads what it handed the publisher, and when. The publisher here is our own seam
(``put_metrics(namespace, datums)``); ``agent.adapters.aws.CloudWatchPublisher``, the real one, is tested
against moto in test_aws.py and here in the end-to-end test.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.adapters.aws import AwsClients, AwsError, CloudWatchPublisher, MetricDatum
from agent.core.bounds import bounded_reason
from agent.core.bus import SnapshotFeed
from agent.core.types import Condition, Status
from agent.sinks.cloudwatch import (
    DEFAULT_NAMESPACE,
    CloudWatchCollector,
    CloudWatchSink,
    CloudWatchStats,
    select_reasons,
)

from helpers.sinks import SimTime, condition, publish, running, snapshot

CLUSTER = "trn-prod"
INSTANCE = "i-0123456789abcdef0"
DMA = "NeuronHasError_DMA_ERROR"
HBM = "NeuronHasError_HBM_UNCORRECTABLE_ERROR"
T0 = 1_000.0  # SimTime's start


def problem(reason: str = DMA, type_: str = "NeuronHealth") -> Condition:
    return condition(type_, Status.TRUE, reason)


HEALTHY = condition("NeuronHealth", Status.FALSE, "NeuronHasNoError")


class Recorder:
    """The publisher seam: notes (simulated time, namespace, {name: value}, dimensions) of each call;
    ``fail`` holds errors to raise on the next calls."""

    def __init__(self, sim: SimTime) -> None:
        self._sim = sim
        self.calls: list[tuple[float, str, dict[str, float], set[tuple[tuple[str, str], ...]]]] = []
        self.fail: list[AwsError] = []

    def put_metrics(self, namespace: str, datums: Sequence[MetricDatum]) -> int:
        if self.fail:
            raise self.fail.pop(0)
        values = {d.name: d.value for d in datums}
        self.calls.append((self._sim.now, namespace, values, {d.dimensions for d in datums}))
        return 1

    def sent(self) -> list[tuple[float, str, dict[str, float]]]:
        """(time offset from T0, namespace, values) per call."""
        return [(t - T0, ns, values) for t, ns, values, _ in self.calls]


class Setup:
    def __init__(self, *, instance: str | None = INSTANCE, **kwargs) -> None:
        self.sim = SimTime(start=T0)
        self.feed = SnapshotFeed(initial=snapshot(seeded=False))
        self.publisher = Recorder(self.sim)
        self.sink = CloudWatchSink(
            feed=self.feed,
            publisher=self.publisher,
            cluster_name=CLUSTER,
            instance_id=lambda: instance,
            clock=self.sim.clock,
            monotonic=self.sim.monotonic,
            wait=self.sim.wait,
            rng=random.Random(7).random,
            **kwargs,
        )

    def publish(self, *conditions: Condition, seeded: bool = True) -> None:
        publish(self.feed, snapshot(*conditions, seeded=seeded))

    def at(self, offset: float) -> None:
        """Let the sink run until T0 + offset."""
        self.sim.run(until=T0 + offset)


@contextlib.contextmanager
def sink_running(**kwargs) -> Iterator[Setup]:
    setup = Setup(**kwargs)
    with running(setup.sink, setup.sim):
        setup.at(0)
        yield setup


# ---- what is published, and when ---------------------------------------------------------------


def test_a_problem_is_published_at_once_then_every_interval_with_exactly_our_dimensions():
    with sink_running() as s:
        s.publish(problem())
        s.at(150)
    assert s.publisher.sent() == [
        (0.0, DEFAULT_NAMESPACE, {DMA: 1.0}),
        (60.0, DEFAULT_NAMESPACE, {DMA: 1.0}),
        (120.0, DEFAULT_NAMESPACE, {DMA: 1.0}),
    ]
    assert all(dims == {(("ClusterName", CLUSTER), ("InstanceId", INSTANCE))} for *_, dims in s.publisher.calls)


def test_healing_publishes_one_zero_then_nothing():
    with sink_running() as s:
        s.publish(problem())
        s.at(70)
        s.publish(HEALTHY)
        s.at(600)
    assert s.publisher.sent() == [
        (0.0, DEFAULT_NAMESPACE, {DMA: 1.0}),
        (60.0, DEFAULT_NAMESPACE, {DMA: 1.0}),
        (120.0, DEFAULT_NAMESPACE, {DMA: 0.0}),
    ]


def test_a_problem_that_heals_between_rounds_is_still_published_once():
    with sink_running() as s:
        s.publish(problem(HBM))  # published at 0
        s.at(10)
        s.publish(problem(HBM), problem(DMA, type_="Other"))
        s.at(20)
        s.publish(problem(HBM))  # the DMA problem healed before the next round
        s.at(200)
    rounds = [values for _, _, values in s.publisher.sent()]
    assert rounds == [{HBM: 1.0}, {HBM: 1.0, DMA: 1.0}, {HBM: 1.0, DMA: 0.0}, {HBM: 1.0}]


def test_a_new_reason_on_the_same_condition_is_a_new_metric_and_the_old_one_goes_to_zero():
    with sink_running() as s:
        s.publish(problem(DMA))
        s.at(30)
        s.publish(problem(HBM))
        s.at(90)
    assert s.publisher.sent() == [
        (0.0, DEFAULT_NAMESPACE, {DMA: 1.0}),
        (60.0, DEFAULT_NAMESPACE, {HBM: 1.0, DMA: 0.0}),
    ]


@pytest.mark.parametrize(
    "conditions",
    [
        (HEALTHY,),  # nothing wrong
        (condition("NeuronHealth", Status.UNKNOWN, DMA),),  # not known to be a problem
        (problem("KernelDeadlock", type_="KernelDeadlock"),),  # True, but not selected
        (problem(""),),  # no reason: no metric name
    ],
)
def test_nothing_selected_and_true_means_no_calls(conditions):
    with sink_running() as s:
        s.publish(*conditions)
        s.at(600)
    assert s.publisher.calls == []


def test_conditions_before_the_node_was_seeded_are_not_published():
    with sink_running() as s:
        s.publish(problem(), seeded=False)
        s.at(120)
        assert s.publisher.calls == []
        s.publish(problem())
        s.at(121)
    assert [t for t, _, _ in s.publisher.sent()] == [120.0]


def test_at_most_one_round_per_interval_however_often_the_state_changes():
    with sink_running() as s:
        for second in range(1, 59):
            s.publish(problem(DMA) if second % 2 else problem(HBM))
            s.at(second)
        s.at(170)
    assert [t for t, _, _ in s.publisher.sent()] == [0.0, 60.0, 120.0]


def test_each_namespace_gets_one_request_per_round():
    select = {DMA: "NeuronHealthCheck", HBM: "TeamAlerts"}
    with sink_running(select=lambda c, _owner: select.get(c.reason)) as s:
        s.publish(problem(DMA), problem(HBM, type_="Other"))
        s.at(70)
    assert s.publisher.sent() == [
        (0.0, "NeuronHealthCheck", {DMA: 1.0}),
        (0.0, "TeamAlerts", {HBM: 1.0}),
        (60.0, "NeuronHealthCheck", {DMA: 1.0}),
        (60.0, "TeamAlerts", {HBM: 1.0}),
    ]


def test_without_an_instance_id_only_the_cluster_dimension_is_sent():
    with sink_running(instance=None) as s:
        s.publish(problem())
        s.at(1)
    assert s.publisher.calls[0][3] == {(("ClusterName", CLUSTER),)}


@pytest.mark.parametrize(
    ("reasons", "reason", "namespace"),
    [
        (None, DMA, DEFAULT_NAMESPACE),  # the default: the Neuron errors
        (None, "NeuronHasError_HANG_ON_COLLECTIVES", DEFAULT_NAMESPACE),
        (None, "NeuronHasError_SOMETHING_NEW", None),
        (("NeuronHasError_*",), "NeuronHasError_SOMETHING_NEW", DEFAULT_NAMESPACE),
        (("GPU*", "Xid*"), "XidCriticalError", DEFAULT_NAMESPACE),
        (("GPU*",), "NeuronHasError_DMA_ERROR", None),
    ],
)
def test_select_reasons(reasons, reason, namespace):
    select = select_reasons() if reasons is None else select_reasons(reasons)
    assert select(problem(reason), None) == namespace


def test_the_cluster_name_is_required():
    with pytest.raises(ValueError, match="ClusterName"):
        CloudWatchSink(
            feed=SnapshotFeed(initial=snapshot()),
            publisher=Recorder(SimTime()),
            cluster_name="",
            instance_id=lambda: None,
        )


# ---- failures, health, figures -----------------------------------------------------------------

THROTTLED = AwsError("cloudwatch:PutMetricData failed: Throttling: Rate exceeded", code="Throttling", transient=True)
DENIED = AwsError("cloudwatch:PutMetricData failed: AccessDenied: not authorized", code="AccessDenied", status=403)


def test_a_failed_round_is_retried_later_and_later_then_resumes_the_interval():
    with sink_running() as s:
        s.publisher.fail = [THROTTLED, THROTTLED, DENIED]
        s.publish(problem())
        s.at(1000)
        stats = s.sink.stats()
    times = [t for t, _, _ in s.publisher.sent()]
    # failures at 0, ~60, ~120+ (jittered exponential backoff, never sooner than the interval), then every 60 s
    first = times[0]
    assert 60 * (1 + 2 + 4) * 0.8 <= first <= 60 * (1 + 2 + 4) * 1.2
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [60.0] * (len(times) - 1)
    assert stats.failures == {"transient": 2, "permanent": 1}
    assert stats.last_error is None  # cleared by the success


def test_last_error_says_what_failed_until_a_success():
    with sink_running() as s:
        s.publisher.fail = [DENIED]
        s.publish(problem())
        s.at(1)
        assert s.sink.last_error == str(DENIED)
        assert s.sink.stats().requests == 0
        s.at(200)
        assert s.sink.last_error is None


@pytest.mark.parametrize(
    ("unhealthy_after", "failing_for", "healthy"),
    [
        (3600.0, 1800.0, True),  # AWS trouble alone is no health problem ...
        (3600.0, 5000.0, False),  # ... until every round has failed for an hour
        (None, 50_000.0, True),  # or never, if so configured
    ],
)
def test_health_turns_only_after_failing_for_long(unhealthy_after, failing_for, healthy):
    with sink_running(unhealthy_after=unhealthy_after, max_backoff=600.0) as s:
        s.publisher.fail = [THROTTLED] * 1000
        s.publish(problem())
        s.at(failing_for)
        assert s.sink.healthy(s.sim.now) is healthy
        s.publisher.fail = []
        s.at(failing_for + 700)
        assert s.sink.healthy(s.sim.now)  # a success makes it healthy again


def test_a_pending_recovery_is_sent_at_shutdown():
    s = Setup()
    with running(s.sink, s.sim):
        s.at(0)
        s.publish(problem())
        s.at(10)
        s.publish(HEALTHY)  # the zero would go out at 60
        s.at(20)
    assert [values for _, _, values in s.publisher.sent()] == [{DMA: 1.0}, {DMA: 0.0}]


def test_nothing_new_is_sent_at_shutdown():
    s = Setup()
    with running(s.sink, s.sim):
        s.at(0)
        s.publish(problem())
        s.at(10)
    assert len(s.publisher.calls) == 1


def test_stats_count_requests_datums_and_problems():
    with sink_running() as s:
        s.publish(problem(DMA), problem(HBM, type_="Other"))
        s.at(70)
        stats = s.sink.stats()
    assert (stats.requests, stats.datums, stats.rounds, stats.problems) == (2, 4, 2, 2)
    assert stats.last_success == SimTime.EPOCH + T0 + 60


def test_collector_metrics():
    stats = CloudWatchStats(
        requests=12,
        datums=30,
        rounds=10,
        failures={"transient": 3},
        last_error="cloudwatch:PutMetricData failed: Throttling",
        last_success=1_767_225_600.0,
        problems=2,
    )
    registry = CollectorRegistry()
    registry.register(CloudWatchCollector(stats=lambda: stats))
    text = generate_latest(registry).decode()
    for line in [
        "node_health_agent_cloudwatch_requests_total 12.0",
        "node_health_agent_cloudwatch_datums_total 30.0",
        'node_health_agent_cloudwatch_failures_total{kind="transient"} 3.0',
        'node_health_agent_cloudwatch_failures_total{kind="permanent"} 0.0',
        "node_health_agent_cloudwatch_last_success_timestamp_seconds 1.7672256e+09",
        "node_health_agent_cloudwatch_failing 1.0",
        "node_health_agent_cloudwatch_problem_metrics 2.0",
    ]:
        assert line in text.splitlines(), line


def test_collector_before_any_success():
    registry = CollectorRegistry()
    registry.register(CloudWatchCollector(stats=CloudWatchStats))
    text = generate_latest(registry).decode()
    assert "last_success_timestamp_seconds" not in text
    assert "node_health_agent_cloudwatch_failing 0.0" in text.splitlines()


# ---- any value ------------------------------------------------------------------------------------

LONG = "NeuronHasError_" + "E" * 300


def valid_name(name: str) -> bool:
    """CloudWatch's rules for a metric name: 1 to 255 ASCII characters, no control characters, not blank."""
    return 1 <= len(name) <= 255 and name.isascii() and name.isprintable() and bool(name.strip())


def test_a_reason_cloudwatch_cannot_take_is_made_valid_and_the_sink_goes_on(caplog):
    """Before: a reason over 255 characters raised out of the round and the component died (/healthz 503)."""
    with sink_running(select=lambda _cond, _owner: DEFAULT_NAMESPACE) as s:
        s.publish(
            problem(LONG, "NeuronHealth"),
            problem("GpuXid\u00fcber\x07bell", "GpuXid"),
            problem("   ", "Blank"),
            problem(DMA, "Other"),
        )
        s.at(0)
        assert s.sink.healthy(s.sim.now)
        s.at(60)
        assert s.sink.healthy(s.sim.now) and s.sink.last_error is None and s.sink.bugs == 0
    names = [name for _, _, values in s.publisher.sent() for name in values]
    assert names and all(valid_name(n) for n in names), names
    assert set(names) == {bounded_reason(LONG), "GpuXid_ber_bell", DMA}
    assert len(s.publisher.sent()) == 2, "published at once and again after the interval"
    assert s.sink.stats().skipped == {"name": 1}  # the blank reason, in the one publication taken
    assert sum("not published" in r.getMessage() for r in caplog.records) == 1, "logged once"


def test_a_storm_of_distinct_reasons_between_rounds_publishes_the_current_ones_and_a_bounded_rest():
    with sink_running(max_flagged=8, select=lambda _cond, _owner: DEFAULT_NAMESPACE) as s:
        s.publish(problem(DMA))
        s.at(1)  # the first round: at once
        for i in range(40):  # each taken by the sink (it wakes on every publication)
            s.publish(problem(f"NeuronHasError_T{i:02}"))
            s.sim.run()
        s.at(60)
    (_, _, first), (_, _, second) = s.publisher.sent()[:2]  # (then the zeros at shutdown)
    assert first == {DMA: 1.0}
    ones = {n for n, v in second.items() if v == 1.0}
    assert "NeuronHasError_T39" in ones, "the current reason is always published"
    assert len(ones) == 8 + 1 and second[DMA] == 0.0
    assert s.sink.stats().skipped == {"flagged": 40 - 8}


# ---- end to end ----------------------------------------------------------------------------------


def test_end_to_end_against_moto(aws):
    """The real publisher: a problem shows up as the metric with our two dimensions; healing sends the 0."""
    sim = SimTime(start=T0)
    feed = SnapshotFeed(initial=snapshot(seeded=False))
    sink = CloudWatchSink(
        feed=feed,
        publisher=CloudWatchPublisher(clients=AwsClients(), sleep=lambda _: None),
        cluster_name=CLUSTER,
        instance_id=lambda: INSTANCE,
        clock=time.time,  # CloudWatch takes timestamps from the last two weeks only
        monotonic=sim.monotonic,
        wait=sim.wait,
    )
    with running(sink, sim):
        sim.run(until=T0)
        publish(feed, snapshot(problem()))
        sim.run(until=T0 + 1)
        publish(feed, snapshot(HEALTHY))
        sim.run(until=T0 + 61)
        assert sink.stats().requests == 2 and sink.last_error is None

    cloudwatch = aws.client("cloudwatch")
    listed = cloudwatch.list_metrics(Namespace=DEFAULT_NAMESPACE)["Metrics"]
    # One metric (moto lists it once per value received; CloudWatch lists it once).
    assert {(m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"])) for m in listed} == {
        (DMA, (("ClusterName", CLUSTER), ("InstanceId", INSTANCE)))
    }
    metric = listed[0]
    now = time.time()
    stat = cloudwatch.get_metric_statistics(
        Namespace=DEFAULT_NAMESPACE,
        MetricName=DMA,
        Dimensions=metric["Dimensions"],
        StartTime=now - 600,
        EndTime=now + 600,
        Period=3600,
        Statistics=["Maximum", "Minimum", "SampleCount"],
    )
    (point,) = stat["Datapoints"]
    assert (point["Maximum"], point["Minimum"], point["SampleCount"]) == (1.0, 0.0, 2.0)
