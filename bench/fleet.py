"""The cluster budget with the whole recovery loop: ``failing`` of ``nodes`` simulated nodes fail at once.

One tests/kubeapi server holds Nodes ``n00``.. (no control plane); each node has its own
:class:`~agent.recovery.loop.RecoveryLoop` (enabled, no startup delay, the built-in policy and its
budget: 10% of the nodes, capped at 10; at most 10 disruptive steps per 600 s), its own feed, inbox and
:class:`~agent.recovery.budget.ClusterBudget`, all sharing one KubeClient (used from one thread) and
one injected clock, and a recording ``mark_unhealthy``. The failing nodes get
``NeuronHealth=True NeuronHasError_DMA_ERROR`` at once.

Each round steps every remaining loop once, in a seeded random order, and after each step counts the
disrupted failure domains (Nodes our incident annotation says we cordoned, or whose instance was
marked unhealthy). After a round the marked nodes are replaced, as Auto Scaling does: their Node is
deleted (which frees their budget place), their loop stops, and a new healthy Node joins under a new
name (the fleet keeps its size, so the limit stays the same). The clock moves 5 s per round, and past
the budget's window when a round made no progress (the window's disruptive steps were used).

:func:`simulate_fleet` returns the figures the test asserts and the benchmark prints.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "node-health-agent"
T0 = 1_767_225_600.0
ROUND_SECONDS = 5.0
MAX_ROUNDS = 200
DMA = ("NeuronHealth", "NeuronHasError_DMA_ERROR")


@dataclass(frozen=True, kw_only=True)
class FleetResult:
    max_disrupted: int  # most failure domains disrupted by recovery at once, after any step
    limit: int  # the budget's limit of places for this fleet
    actions_over_budget: int  # steps with disruptive actions that left more than ``limit`` domains disrupted
    duplicate_calls: int  # mark-unhealthy calls and cordon PATCHes beyond the first per node
    blocked_events: int  # RecoveryBlocked Events, all nodes together
    rounds: int  # rounds until every failing node was handled
    failing: tuple[str, ...] = ()  # the failing nodes
    handled: tuple[str, ...] = ()  # the failing nodes marked unhealthy, in order
    blocked_by_node: dict[str, int] = dataclasses.field(default_factory=dict)  # RecoveryBlocked Events per node
    marks_by_node: dict[str, int] = dataclasses.field(default_factory=dict)  # mark-unhealthy calls per node
    cordons_by_node: dict[str, int] = dataclasses.field(default_factory=dict)  # cordon PATCHes per node
    disrupted_timeline: tuple[int, ...] = ()  # disrupted domains after each step
    window_waits: int = 0  # rounds after which the clock was moved past the action window
    errors: int = 0  # steps that raised


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _Marker:
    """A recording ``mark_unhealthy``: ``calls`` = (node, call number)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, node: Any) -> Any:
        from agent.recovery.asg import MarkResult

        self.calls.append((node.name, len(self.calls) + 1))
        instance = node.provider_id.rsplit("/", 1)[-1]
        return MarkResult(outcome="marked", instance_id=instance, group="fleet", message=f"{instance} marked Unhealthy")


def _node(name: str, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"providerID": f"aws:///us-west-2a/i-{index:017x}"},
    }


def _disrupted(server: Any, marked: set[str]) -> set[str]:
    """Nodes present now that recovery disrupted: cordoned by us (the annotation) or marked unhealthy."""
    from agent.recovery.model import INCIDENT_ANNOTATION

    out = set()
    for node in server.list_objects("nodes"):
        name = node["metadata"]["name"]
        text = (node["metadata"].get("annotations") or {}).get(INCIDENT_ANNOTATION)
        incident = json.loads(text) if text else {}
        done = incident.get("done") or []
        if name in marked or "mark-unhealthy" in done or ("cordon" in done and incident.get("cordonedByUs")):
            out.add(name)
    return out


def _loop(
    *, client: Any, name: str, policy: Any, clock: _Clock, marker: _Marker, rng: random.Random, failing: bool
) -> Any:
    """One node's recovery loop on a stepped clock (the budget's sleeps skipped), and its inbox; ``failing``:
    its feed already holds NeuronHealth=NeuronHasError_DMA_ERROR, since now. Shared with bench/fleetweek.py."""
    from agent.core.bus import Inbox, SnapshotFeed
    from agent.core.types import Condition, Snapshot, Status
    from agent.recovery.budget import ClusterBudget, budget_lease_name
    from agent.recovery.loop import RecoveryLoop
    from agent.recovery.model import BUILTIN_CONDITIONS

    feed = SnapshotFeed(initial=Snapshot(conditions=(), generated_at=clock.now))
    if failing:
        condition = Condition(
            type=DMA[0],
            status=Status.TRUE,
            reason=DMA[1],
            message="NEURON_HW_ERR=DMA_ERROR",
            last_transition=clock.now,
            last_update=clock.now,
        )
        snapshot = Snapshot(conditions=(condition,), generated_at=clock.now, provenance=BUILTIN_CONDITIONS)
        feed.publish(snapshot=snapshot, events=[], health={})
    inbox = Inbox()
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
            lease_name=budget_lease_name("fleet"),
            node_name=name,
            settings=policy.budget,
            clock=clock,
            sleep=lambda s: None,
            rng=rng.random,
        ),
        mark_unhealthy=marker,
        clock=clock,
    )
    return loop, inbox


def simulate_fleet(*, nodes: int = 50, failing: int = 15, seed: int = 0, budget: Any = None) -> FleetResult:
    """Run the scenario (see the module docstring); ``budget`` (BudgetSettings) replaces the policy's."""
    sys.path.insert(0, str(ROOT / "tests"))
    from agent.adapters.kube import KubeClient
    from agent.core.bus import Inbox
    from agent.recovery.budget import resolve_limit
    from agent.recovery.loop import RecoveryLoop
    from agent.recovery.model import Action
    from agent.recovery.policyfile import DEFAULT_POLICY

    from kubeapi.server import KubeApiServer

    policy = dataclasses.replace(DEFAULT_POLICY, startup_delay=0.0)
    if budget is not None:
        policy = dataclasses.replace(policy, budget=budget)
    rng = random.Random(seed)
    names = [f"n{i:02d}" for i in range(nodes)]
    sick = sorted(rng.sample(names, failing))
    clock = _Clock(T0)
    marker = _Marker()
    limit = resolve_limit(policy.budget, domains=nodes)

    with tempfile.TemporaryDirectory() as tmp, KubeApiServer() as server:
        server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for i, name in enumerate(names):
            server.put_object(_node(name, i))
        client = KubeClient.load(kubeconfig=server.write_kubeconfig(Path(tmp) / "kubeconfig"), timeout=10.0)
        try:
            loops: dict[str, tuple[RecoveryLoop, Inbox]] = {}
            for name in names:
                loops[name] = _loop(
                    client=client, name=name, policy=policy, clock=clock, marker=marker, rng=rng, failing=name in sick
                )
            server.reset_requests()

            blocked: Counter[str] = Counter()
            timeline: list[int] = []
            over = errors = window_waits = rounds = 0
            replaced: set[str] = set()
            while rounds < MAX_ROUNDS and len(replaced) < failing:
                rounds += 1
                marked_before = len(marker.calls)
                order = sorted(loops)
                rng.shuffle(order)
                for name in order:
                    loop, inbox = loops[name]
                    try:
                        decision = loop.step()
                    except Exception:
                        errors += 1
                        decision = None
                    while (notice := inbox.get_nowait()) is not None:
                        blocked.update(name for e in notice.events if e.reason == "RecoveryBlocked")
                    disrupted = len(_disrupted(server, {n for n, _ in marker.calls}))
                    timeline.append(disrupted)
                    acted = decision is not None and any(a.disruptive for a in decision.actions)
                    if acted and disrupted > limit:
                        over += 1
                # Auto Scaling replaces the marked instances: their Nodes go, new ones join.
                for name in sorted({n for n, _ in marker.calls} - replaced):
                    server.delete_object("nodes", name)
                    del loops[name]
                    replaced.add(name)
                    server.put_object(_node(f"r{len(replaced):02d}", nodes + len(replaced)))
                if len(marker.calls) == marked_before and len(replaced) < failing:
                    clock.now += policy.budget.window + 1  # no progress: the window's steps are used up
                    window_waits += 1
                else:
                    clock.now += ROUND_SECONDS
            patches = [
                r
                for r in server.requests.filter(method="PATCH", path_regex=r"/api/v1/nodes/[^/]+$")
                if isinstance(r.body, dict) and (r.body.get("spec") or {}).get("unschedulable") is True
            ]
        finally:
            client.close()

    marks = Counter(n for n, _ in marker.calls)
    cordons = Counter(r.path.rsplit("/", 1)[-1] for r in patches)
    duplicates = sum(c - 1 for c in marks.values()) + sum(c - 1 for c in cordons.values())
    assert Action.MARK_UNHEALTHY in policy.rules[0].actions
    return FleetResult(
        max_disrupted=max(timeline, default=0),
        limit=limit,
        actions_over_budget=over,
        duplicate_calls=duplicates,
        blocked_events=sum(blocked.values()),
        rounds=rounds,
        failing=tuple(sick),
        handled=tuple(dict.fromkeys(n for n, _ in marker.calls)),
        blocked_by_node=dict(blocked),
        marks_by_node=dict(marks),
        cordons_by_node=dict(cordons),
        disrupted_timeline=tuple(timeline),
        window_waits=window_waits,
        errors=errors,
    )


if __name__ == "__main__":
    print(simulate_fleet())
