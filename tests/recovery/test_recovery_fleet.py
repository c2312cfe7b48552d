"""The budget scenario with the whole recovery loop: 15 of 50 nodes fail at once (bench/fleet.py), then the
same with 15 loops' ``run()`` in threads against one API server."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from agent.adapters.kube import KubeClient
from agent.core.bus import Inbox, SnapshotFeed
from agent.core.types import Condition, Snapshot, Status
from agent.recovery.asg import MarkResult
from agent.recovery.budget import BUDGET_ANNOTATION, ClusterBudget, budget_lease_name, decode_state
from agent.recovery.loop import RecoveryLoop
from agent.recovery.model import BUILTIN_CONDITIONS, BudgetSettings, NodeView
from agent.recovery.policyfile import DEFAULT_POLICY
from bench.fleet import NAMESPACE, FleetResult, _disrupted, _node, simulate_fleet

from kubeapi.server import KubeApiServer

pytestmark = pytest.mark.slow  # 50 recovery loops against one API server


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_fifteen_of_fifty_fail_at_once_with_the_default_budget(seed):
    result = simulate_fleet(nodes=50, failing=15, seed=seed)
    assert isinstance(result, FleetResult)
    assert result.limit == 5  # 10% of 50
    assert result.max_disrupted == 5, "the budget was used, never exceeded"
    assert all(d <= 5 for d in result.disrupted_timeline)
    assert result.actions_over_budget == 0
    assert result.duplicate_calls == 0
    assert result.errors == 0
    # 5 act at once; the other 10 say RecoveryBlocked exactly once each, however many steps they wait.
    assert result.blocked_events == 10
    assert sorted(result.blocked_by_node) == sorted(set(result.failing) - set(result.handled[:5]))
    assert set(result.blocked_by_node.values()) == {1}
    # Every failing node handled, each exactly once: one cordon PATCH, one mark-unhealthy.
    assert sorted(result.handled) == sorted(result.failing) and len(result.handled) == 15
    assert result.marks_by_node == dict.fromkeys(result.failing, 1)
    assert result.cordons_by_node == dict.fromkeys(result.failing, 1)
    # Waves of 5. A refused node asks again after its backoff (30 s, then 60 s, each +-50%), so the round
    # after a wave makes no progress and the simulation moves the clock a window on (which also frees the
    # default 10 disruptive steps per 600 s for the next wave).
    assert result.window_waits == 2 and result.rounds == 5


def test_a_larger_budget_is_used_and_not_exceeded():
    result = simulate_fleet(seed=3, budget=BudgetSettings(max_unhealthy="20%", max_actions=100))
    assert (result.limit, result.max_disrupted, result.actions_over_budget) == (10, 10, 0)
    # the 5 refused ask again after their backoff: one round without progress, then they act
    assert (result.blocked_events, result.duplicate_calls, result.window_waits) == (5, 0, 1)
    assert sorted(result.handled) == sorted(result.failing)


# ---- the same with threads -----------------------------------------------------------------------------


class Marker:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, node: NodeView) -> MarkResult:
        with self._lock:
            self.calls.append(node.name)
        return MarkResult(outcome="marked", instance_id="i-0", group="fleet", message="marked")


def lease_history(server: KubeApiServer, name: str, since: int) -> list[dict]:
    """Every version of the Lease ``name`` written after resourceVersion ``since`` (a watch replays them)."""
    api_client = server.api_client()
    try:
        stream = watch.Watch().stream(
            k8s.CoordinationV1Api(api_client).list_namespaced_lease,
            NAMESPACE,
            resource_version=str(since),
            timeout_seconds=1,
            _preload_content=False,
        )
        return [e["raw_object"] for e in stream if e["raw_object"]["metadata"]["name"] == name]
    finally:
        api_client.close()


@pytest.fixture
def server() -> Iterator[KubeApiServer]:
    with KubeApiServer() as started:
        yield started


def test_fifteen_loops_in_threads_never_disrupt_more_than_five(server, tmp_path: Path):
    """The loops' own ``run()`` (own client each, interval 20 ms, the real clock): the disrupted nodes are
    polled as the loops go and every version of the budget Lease is replayed at the end. The action window
    cannot be waited out on the real clock, so ``max_actions`` is raised to 100 (the places stay 10%), and
    a refused node asks again after 0.2 s, not 30 s."""
    names = [f"n{i:02d}" for i in range(50)]
    failing = names[::3][:15]
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for i, name in enumerate(names):
        server.put_object(_node(name, i))
    policy = dataclasses.replace(DEFAULT_POLICY, startup_delay=0.0, budget=BudgetSettings(max_actions=100))
    lease = budget_lease_name("fleet")
    config = server.write_kubeconfig(tmp_path / "kubeconfig")
    marker = Marker()
    start = server.resource_version
    now = time.time()
    running: dict[str, tuple[threading.Thread, threading.Event, Inbox]] = {}
    with contextlib.ExitStack() as stack:
        for name in failing:
            client = KubeClient.load(kubeconfig=config, timeout=10.0)
            stack.callback(client.close)
            feed = SnapshotFeed(initial=Snapshot(conditions=(), generated_at=now))
            condition = Condition(
                type="NeuronHealth",
                status=Status.TRUE,
                reason="NeuronHasError_DMA_ERROR",
                message="test",
                last_transition=now,
                last_update=now,
            )
            snapshot = Snapshot(conditions=(condition,), generated_at=now, provenance=BUILTIN_CONDITIONS)
            feed.publish(snapshot=snapshot, events=[], health={})
            inbox = Inbox(maxsize=100)  # at most 3 Events per node: never full
            loop = RecoveryLoop(
                feed=feed,
                inbox=inbox,
                client=client,
                node_name=name,
                policy=policy,
                enabled=True,
                budget=ClusterBudget(
                    client=client,
                    namespace=NAMESPACE,
                    lease_name=lease,
                    node_name=name,
                    settings=policy.budget,
                    clock=time.time,
                ),
                mark_unhealthy=marker,
                interval=0.02,
                budget_retry=0.2,  # a refused node asks again soon (30 s in production), as the real clock runs
            )
            stop = threading.Event()
            running[name] = (threading.Thread(target=loop.run, args=(stop,), daemon=True), stop, inbox)

        def stop_all() -> None:
            for thread, stop, _ in running.values():
                stop.set()
                thread.join(timeout=10)

        stack.callback(stop_all)
        for thread, _, _ in running.values():
            thread.start()

        most = 0
        replaced: list[str] = []
        deadline = time.monotonic() + 60
        while len(replaced) < len(failing):
            assert time.monotonic() < deadline, f"only {len(replaced)} replaced"
            disrupted = _disrupted(server, set(marker.calls))
            most = max(most, len(disrupted))
            assert len(disrupted) <= 5, sorted(disrupted)
            for name in [n for n in marker.calls if n not in replaced]:
                thread, stop, _ = running[name]
                stop.set()
                thread.join(timeout=10)
                server.delete_object("nodes", name)  # the instance was replaced
                server.put_object(_node(f"r{len(replaced):02d}", 100 + len(replaced)))
                replaced.append(name)
            time.sleep(0.005)
        stop_all()

    assert 1 <= most <= 5  # how many are seen at once depends on timing (replaced as soon as marked)
    assert sorted(marker.calls) == sorted(failing), "each failing node marked exactly once"
    cordons = [
        r.path
        for r in server.requests.filter(method="PATCH", path_regex=r"/api/v1/nodes/[^/]+$")
        if isinstance(r.body, dict) and (r.body.get("spec") or {}).get("unschedulable") is True
    ]
    assert sorted(p.rsplit("/", 1)[1] for p in cordons) == sorted(failing), "one cordon PATCH per node"
    blocked = {}
    for name, (_, _, inbox) in running.items():
        while (notice := inbox.get_nowait()) is not None:
            for event in notice.events:
                if event.reason == "RecoveryBlocked":
                    blocked[name] = blocked.get(name, 0) + 1
    assert set(blocked.values()) <= {1}  # timing decides who had to wait (a place may free before its first step)
    history = [
        decode_state(v["metadata"]["annotations"][BUDGET_ANNOTATION]) for v in lease_history(server, lease, start)
    ]
    assert len(history) >= 15 and 1 <= max(len(s.holders) for s in history) <= 5  # every version ever written
