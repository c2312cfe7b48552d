"""The condition sink against the test API server (real client), on simulated time.

Each test publishes snapshots on a feed, lets the sink use simulated seconds (``SimTime``) and
reads what reached the Node and when (the recorder notes the simulated time of each call).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import math
import random
import re
from collections.abc import Callable, Iterator

import pytest

from agent.core.bounds import MAX_MESSAGE
from agent.core.bus import SnapshotFeed
from agent.core.latency import Histogram
from agent.core.types import Status
from agent.sinks.conditions import ConditionSink, condition_dict

from helpers import kube_client
from helpers.sinks import NODE, Recorder, SimTime, condition, node_api, publish, running, snapshot

STATUS_PATH = r"/nodes/.*/status$"
HEALTHY = condition()
PROBLEM = condition(status=Status.TRUE, reason="NeuronHasError_DMA_ERROR")


@pytest.fixture
def api():
    with node_api() as server:
        yield server


class Setup:
    def __init__(self, server, client, **kwargs) -> None:
        self.server = server
        self.sim = SimTime()
        self.feed = SnapshotFeed(initial=snapshot(seeded=False))
        self.client = Recorder(client, self.sim)
        self.sink = ConditionSink(
            client=self.client,
            feed=self.feed,
            node_name=NODE,
            clock=self.sim.clock,
            monotonic=self.sim.monotonic,
            wait=self.sim.wait,
            rng=random.Random(3).random,
            **kwargs,
        )

    def patch_times(self) -> list[float]:
        return self.client.times("patch_node_status")

    def sent(self) -> list[dict[str, dict]]:
        """The conditions of each PATCH the server received, by type."""
        return [
            {c["type"]: c for c in r.body["status"]["conditions"]}
            for r in self.server.requests.filter(method="PATCH", path_regex=STATUS_PATH)
        ]

    def on_node(self) -> dict[str, dict]:
        return {c["type"]: c for c in self.server.get_object("nodes", NODE)["status"]["conditions"]}


@pytest.fixture
def setup(api, tmp_path) -> Iterator[Callable[..., Setup]]:
    """``setup(**sink_kwargs)``: a sink on simulated time with the real client."""
    with contextlib.ExitStack() as stack:
        yield lambda **kwargs: Setup(api, stack.enter_context(kube_client(api, tmp_path)), **kwargs)


# ---- the faults this fixes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "floor"),
    [
        ({"status": 503, "retry_after": 5}, 10.0),  # was: 35 PATCHes in 30 s while logging "retry in 10s"
        ({"status": 429, "retry_after": 25}, 25.0),
        ({"status": 500}, 10.0),
        ({"kind": "drop"}, 10.0),  # no answer at all
    ],
    ids=["503-retry-after-5", "429-retry-after-25", "500", "no-answer"],
)
def test_a_failing_api_is_retried_no_faster_than_retry_after_and_resync(setup, fault, floor, caplog):
    s = setup()
    s.server.faults.add(method="PATCH", path_regex=STATUS_PATH, count=None, **fault)
    publish(s.feed, snapshot(PROBLEM))
    start = s.sim.now
    with running(s.sink, s.sim):
        s.sim.run(until=start + 60)
        assert s.sink.healthy(s.sim.now), "a failing API is reported in last_error, not as a sink failure"
    times = s.patch_times()
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert times[0] == start, "the first write is not delayed"
    assert 2 <= len(times) <= 7
    assert all(gap >= floor for gap in gaps), gaps
    logged = [float(d) for d in re.findall(r"retrying in ([\d.]+)s", caplog.text)]
    assert logged[: len(gaps)] == pytest.approx(gaps, abs=0.051), "the log tells the real retry delay"
    assert s.sink.failures == {"transient": len(times)} and s.sink.writes == 0
    assert s.sink.last_error is not None and not s.sink.in_sync


def test_the_write_goes_through_once_the_api_recovers(setup):
    s = setup()
    s.server.faults.add(method="PATCH", path_regex=STATUS_PATH, status=503, retry_after=5, count=3)
    publish(s.feed, snapshot(PROBLEM))
    with running(s.sink, s.sim):
        s.sim.advance(300)
        assert s.sink.in_sync and s.sink.last_error is None
    assert [r.status for r in s.server.requests.filter(method="PATCH")] == [503, 503, 503, 200]
    assert s.on_node()["NeuronHealth"]["status"] == "True"
    assert s.on_node()["Ready"]["reason"] == "KubeletReady", "kubelet's conditions are never touched"


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_a_refused_write_is_dropped_logged_once_and_the_next_change_is_written(setup, status, caplog):
    s = setup()
    s.server.faults.add(method="PATCH", path_regex=STATUS_PATH, status=status, count=2)
    with running(s.sink, s.sim):
        publish(s.feed, snapshot(PROBLEM))
        s.sim.advance(60)
        assert len(s.patch_times()) == 1, "a refused write is not retried"
        publish(s.feed, snapshot(HEALTHY))
        s.sim.advance(60)
        publish(s.feed, snapshot(condition(status=Status.TRUE, reason="NeuronHasError_HANG")))
        s.sim.advance(60)
    assert [r.status for r in s.server.requests.filter(method="PATCH")] == [status, status, 200]
    assert s.on_node()["NeuronHealth"]["reason"] == "NeuronHasError_HANG"
    assert s.sink.dropped == {status: 2} and s.sink.failures == {"permanent": 2}
    refusals = [r for r in caplog.records if r.levelname == "ERROR" and "refused" in r.getMessage()]
    assert len(refusals) == 1


# ---- behaviour kept and added ------------------------------------------------------------------


def test_leading_edge_coalescing(setup):
    """The first change after a quiet period goes out at once; changes within the window after a
    write merge into one write at the end of the window."""
    s = setup(coalesce=0.2)
    t0 = s.sim.now
    with running(s.sink, s.sim):
        publish(s.feed, snapshot(PROBLEM))
        s.sim.run()
        publish(s.feed, snapshot(HEALTHY))  # within the window (simulated time stands still)
        publish(s.feed, snapshot(condition(status=Status.TRUE, reason="NeuronHasError_HANG")))
        s.sim.run()
        assert s.patch_times() == [t0], "changes inside the window wait for its end"
        s.sim.run(until=t0 + 5)
        publish(s.feed, snapshot(HEALTHY))  # after a quiet period
        s.sim.run()
    assert s.patch_times() == pytest.approx([t0, t0 + 0.2, t0 + 5])
    reasons = [sent["NeuronHealth"]["reason"] for sent in s.sent()]
    assert reasons == ["NeuronHasError_DMA_ERROR", "NeuronHasError_HANG", "NeuronIsHealthy"]


def test_nothing_is_written_before_a_seeded_snapshot(setup):
    s = setup()
    with running(s.sink, s.sim):
        publish(s.feed, snapshot(HEALTHY, seeded=False))
        s.sim.advance(600)
        assert s.patch_times() == []
        publish(s.feed, snapshot(PROBLEM, seeded=True))
        s.sim.run()
    assert len(s.patch_times()) == 1 and s.on_node()["NeuronHealth"]["status"] == "True"


@pytest.mark.parametrize(
    ("heartbeat", "jitter", "cycle"),
    [(300.0, 0.1, 330.0), (60.0, 0.5, 90.0)],
    ids=["default", "short"],
)
def test_heartbeats_come_at_the_nodes_phase_one_cycle_apart(setup, heartbeat, jitter, cycle):
    """The cycle is heartbeat * (1 + jitter); the first heartbeat comes at the first anchor at least a
    heartbeat after the first write (so within heartbeat + cycle), then one every cycle."""
    s = setup(heartbeat=heartbeat, jitter=jitter)
    with running(s.sink, s.sim):
        publish(s.feed, snapshot(PROBLEM))
        s.sim.advance(10 * cycle)
    times = s.patch_times()
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert heartbeat <= gaps[0] <= heartbeat + cycle, gaps
    assert len(gaps) >= 8 and gaps[1:] == pytest.approx([cycle] * (len(gaps) - 1), abs=1e-6), gaps
    heartbeats = [sent["NeuronHealth"]["lastHeartbeatTime"] for sent in s.sent()]
    assert len(set(heartbeats)) == len(heartbeats)


class _PatchTimes:
    """The sinks' client seam (``patch_node_status``), recording when each write was sent."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.times: list[float] = []

    def patch_node_status(self, name: str, body: dict) -> dict:
        self.times.append(self.now())
        return {}


def test_sinks_started_together_do_not_heartbeat_together():
    """1,000 agents that start at one instant (a rollout, a node pool created at once): past the start, no
    10 s window gets more than twice the mean of the fleet's heartbeat writes (no pulse)."""
    clock = [0.0]
    client = _PatchTimes(lambda: clock[0])
    rng = random.Random(7)
    feed = SnapshotFeed(initial=snapshot(PROBLEM))
    sinks = [
        ConditionSink(
            client=client,  # type: ignore[arg-type]
            feed=feed,
            node_name=f"n{i}",
            heartbeat=300.0,
            clock=lambda: 1_767_225_600.0 + clock[0],
            monotonic=lambda: clock[0],
            rng=rng.random,
        )
        for i in range(1000)
    ]
    due = [(0.0, i) for i in range(len(sinks))]
    for sink in sinks:
        sink.take(feed.latest())
    while due[0][0] < 3 * 3600.0:
        at, i = heapq.heappop(due)
        clock[0] = at
        heapq.heappush(due, (at + max(sinks[i].work(at), 0.001), i))
    steady = [t for t in client.times if t >= 600.0]  # past the start and the first heartbeats' spread
    windows = collections.Counter(int(t // 10) for t in steady)
    mean = len(steady) / ((3 * 3600.0 - 600.0) / 10)
    assert len(client.times) == pytest.approx(1000 * (1 + 3 * 3600 / 330), rel=0.1)  # a cycle apart
    assert max(windows.values()) <= 2 * mean, (max(windows.values()), mean)


_CLOCK = [0.0]  # the simulated monotonic seconds the sinks of ``_sinks`` read


def _sinks(names: list[str], client: _PatchTimes, feed: SnapshotFeed) -> list[ConditionSink]:
    """A sink for each node name on the simulated clock, each holding the feed's newest snapshot."""
    rng = random.Random(11)  # one for all: sinks with equal draws would back off in step
    sinks = [
        ConditionSink(
            client=client,  # type: ignore[arg-type]
            feed=feed,
            node_name=name,
            heartbeat=300.0,
            clock=lambda: 1_767_225_600.0 + _CLOCK[0],
            monotonic=lambda: _CLOCK[0],
            rng=rng.random,
        )
        for name in names
    ]
    for sink in sinks:
        sink.take(feed.latest())
    return sinks


def _run(sinks: list[ConditionSink], starts: list[float], until: float) -> None:
    """Each sink's ``work`` whenever it asks, from its start time up to ``until`` (the clock then reads it)."""
    due = list(zip(starts, range(len(sinks)), strict=True))
    heapq.heapify(due)
    while due and due[0][0] < until:
        at, i = heapq.heappop(due)
        _CLOCK[0] = at
        heapq.heappush(due, (max(at + sinks[i].work(at), math.nextafter(at, math.inf)), i))
    _CLOCK[0] = until


def test_a_fleet_wide_write_does_not_realign_heartbeats():
    """1,000 agents started at spread times run for an hour; then every node writes at one instant (a
    rule misfiring everywhere, the API server back after an outage, a rollout changing a condition).
    Over the next two hours, past the change's own 10 s window, no window gets more than twice the
    mean of the fleet's heartbeat writes: the heartbeats do not come back as a pulse 300-330 s later."""
    _CLOCK[0] = 0.0
    client = _PatchTimes(lambda: _CLOCK[0])
    feed = SnapshotFeed(initial=snapshot(HEALTHY))
    sinks = _sinks([f"n{i}" for i in range(1000)], client, feed)
    spread = random.Random(5)
    change, end = 3600.0, 3600.0 + 7200.0
    _run(sinks, [spread.uniform(0.0, 600.0) for _ in sinks], until=change)
    publish(feed, snapshot(PROBLEM))
    for sink in sinks:
        sink.take(feed.latest())
    _run(sinks, [change] * len(sinks), until=end)
    after = [t for t in client.times if t >= change]
    assert after[: len(sinks)] == [change] * len(sinks), "every node writes the change at once"
    heartbeats = [t for t in after if t >= change + 10.0]  # past the change's own window
    windows = collections.Counter(int(t // 10) for t in heartbeats)
    mean = len(heartbeats) / ((end - change - 10.0) / 10)
    assert max(windows.values()) <= 2 * mean, (max(windows.values()), mean)


@pytest.mark.parametrize(
    ("starts", "change"),
    [
        ((0.0, 1234.5), None),  # the agent restarted 20 min later
        ((100.0, 7.25), 2000.0),  # both see a change at one instant (written at once), then beat as before
    ],
    ids=["restart", "after-a-change"],
)
def test_the_heartbeat_phase_is_a_function_of_the_node_name_only(starts, change):
    """Sinks for one node, started at different times, beat at the same anchors (modulo the cycle);
    another node beats at another phase."""
    runs: dict[tuple[str, float], list[float]] = {}
    for name in (NODE, "other-node"):
        for start in starts:
            _CLOCK[0] = start
            client = _PatchTimes(lambda: _CLOCK[0])
            feed = SnapshotFeed(initial=snapshot(HEALTHY))
            sinks = _sinks([name], client, feed)
            if change is None:
                _run(sinks, [start], until=start + 7200.0)
            else:
                _run(sinks, [start], until=change)
                publish(feed, snapshot(PROBLEM))
                sinks[0].take(feed.latest())
                _run(sinks, [change], until=change + 7200.0)
            writes = {start} if change is None else {start, change}
            runs[name, start] = [t % 330.0 for t in client.times if t not in writes]
    for (name, _), phases in runs.items():
        assert len(phases) >= 20 and max(phases) - min(phases) < 1e-6, (name, phases)
    ours, theirs = ({runs[name, start][0] for start in starts} for name in (NODE, "other-node"))
    assert max(ours) - min(ours) < 1e-6 and max(theirs) - min(theirs) < 1e-6, (ours, theirs)
    assert abs(min(ours) - min(theirs)) > 1.0, "another node, another phase"


@pytest.mark.parametrize(
    ("heartbeat", "jitter"),
    [(300.0, 0.0), (300.0, -0.1), (300.0, 1.0), (300.0, float("nan")), (300.0, float("inf")), (0.0, 0.1)],
    ids=["no-jitter", "negative", "one", "nan", "inf", "no-heartbeat"],
)
def test_a_cycle_no_longer_than_the_heartbeat_is_refused(heartbeat, jitter):
    """With jitter 0 the cycle equals the heartbeat: a write a moment after an anchor would skip a cycle."""
    with pytest.raises(ValueError, match="0 < jitter < 1"):
        ConditionSink(
            client=_PatchTimes(lambda: 0.0),  # type: ignore[arg-type]
            feed=SnapshotFeed(initial=snapshot(HEALTHY)),
            node_name=NODE,
            heartbeat=heartbeat,
            jitter=jitter,
        )


def test_removed_condition_types_are_deleted_once(setup, api):
    node = api.get_object("nodes", NODE)
    node["status"]["conditions"].append({"type": "OldNeuronCheck", "status": "False", "reason": "Fine"})
    api.put_object(node)
    s = setup(delete_types=("OldNeuronCheck",), heartbeat=60.0)
    with running(s.sink, s.sim):
        publish(s.feed, snapshot(HEALTHY))
        s.sim.advance(100)
    first, second = s.sent()[:2]
    assert first["OldNeuronCheck"] == {"type": "OldNeuronCheck", "$patch": "delete"}
    assert "OldNeuronCheck" not in second
    assert set(s.on_node()) == {"Ready", "NeuronHealth"}


def test_a_pending_change_is_written_at_stop(setup):
    s = setup(coalesce=0.2)
    with running(s.sink, s.sim):
        publish(s.feed, snapshot(HEALTHY))
        s.sim.run()
        publish(s.feed, snapshot(PROBLEM))  # inside the window: due only at its end
        s.sim.run()
        assert len(s.patch_times()) == 1
    assert s.on_node()["NeuronHealth"]["status"] == "True"


@pytest.mark.parametrize(
    ("length", "sent"),
    [(10, 10), (MAX_MESSAGE, MAX_MESSAGE), (MAX_MESSAGE + 1, MAX_MESSAGE), (5000, MAX_MESSAGE)],
)
def test_messages_are_truncated(length, sent):
    body = condition_dict(dataclasses.replace(condition(), message="x" * length), heartbeat="2026-01-01T00:00:00Z")
    assert len(body["message"]) == sent
    assert body["message"].endswith("...") == (length > MAX_MESSAGE)


# ---- types others own ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("aggregate", "written"),
    [
        (False, {"Ready", "NeuronHealth"}),  # kubelet's Ready as it was; nothing else of theirs
        (True, {"Ready", "NeuronHealth", "AcceleratedHardwareReady"}),  # the aggregate is ours when on
    ],
)
def test_the_sink_never_writes_a_type_others_own_whatever_the_state_holds(setup, aggregate, written):
    s = setup(aggregate=aggregate, delete_types=["DiskPressure"])
    theirs = [
        condition("Ready", Status.FALSE, "KubeletReady"),  # NPD's inverted meaning: would evict every pod
        condition("StorageReady", Status.TRUE, "Broken"),  # EKS node auto repair would replace the node
        condition("AcceleratedHardwareReady", Status.TRUE, "AcceleratedHardwareIsReady"),
    ]
    publish(s.feed, snapshot(PROBLEM, *theirs))
    with running(s.sink, s.sim):
        s.sim.advance(5)
        assert s.sink.writes == 1
    (sent,) = s.sent()
    assert set(sent) == written - {"Ready"}
    assert not any(c.get("$patch") for c in sent.values()), "DiskPressure is never deleted"
    assert set(s.on_node()) == written
    assert s.on_node()["Ready"] == {**s.on_node()["Ready"], "status": "True", "reason": "KubeletReady"}


# ---- time to detect ------------------------------------------------------------------------------


def test_each_new_problem_is_observed_once_from_its_transition_time_to_the_write_that_shows_it(setup):
    """What the Node had at the first seeded snapshot is not news; a heartbeat or a failed write is
    no observation; a problem that clears and returns is observed again."""
    detection = Histogram(bounds=(1, 5, 30))
    s = setup(detection=detection, heartbeat=60.0)
    with running(s.sink, s.sim):
        publish(s.feed, snapshot(PROBLEM))  # restored at start: reported before this run
        s.sim.advance(10)
        xid = condition("GpuHealth", Status.TRUE, "GpuXid79")
        xid = dataclasses.replace(xid, last_transition=s.sim.clock() - 3)  # a kernel line 3 s old
        s.server.faults.add(method="PATCH", path_regex=STATUS_PATH, status=500, count=1)
        publish(s.feed, snapshot(PROBLEM, xid))
        s.sim.advance(2)  # the write fails; the retry comes 10 s later (resync)
        assert detection.snapshot().count == 0
        s.sim.advance(200)  # the retry, then heartbeats
        healed = dataclasses.replace(xid, status=Status.FALSE, reason="GpuHealthy")
        publish(s.feed, snapshot(PROBLEM, healed))
        s.sim.advance(5)
        publish(s.feed, snapshot(PROBLEM, dataclasses.replace(xid, last_transition=s.sim.clock())))
        s.sim.advance(5)
    buckets = dict(detection.snapshot().buckets)
    assert detection.snapshot().count == 2
    assert (buckets[1], buckets[5], buckets[30]) == (1, 1, 2)  # now, then 3 s + the 10 s retry
