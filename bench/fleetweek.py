"""Scenario 4 of the fleet benchmark: a week of faults at a real failure rate plus one zone burst.

One tests/kubeapi server holds ``nodes`` Nodes; a node with a fault gets the real
:class:`~agent.recovery.loop.RecoveryLoop` and :class:`~agent.recovery.budget.ClusterBudget` (the
built-in policy and budget, no startup delay) fed a NeuronHealth DMA error, on one stepped clock.
Healthy nodes' loops are quiet (they make no request: see ``RecoveryLoop._quiet``), so they are not
stepped. Auto Scaling replaces a marked instance ``replace_after`` seconds later: its Node goes (its
budget place with it) and a new healthy Node joins.

Faults arrive as a Poisson process at ``rate`` per 1,000 node-days; on day 4 ``burst`` nodes of one
zone fail at once. Active loops step every ``STEP`` simulated seconds while one of them can act, as in
production; a loop that the budget blocked steps every ``BLOCKED_STEP`` seconds (the outcome is the
same: a place frees only at a replacement; the request count of this scenario is not a figure).
"""

from __future__ import annotations

import dataclasses
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "node-health-agent"
T0 = 1_767_225_600.0
DAY = 86_400.0
STEP = 5.0
BLOCKED_STEP = 60.0


@dataclass(frozen=True, kw_only=True)
class WeekResult:
    faults: int  # steady-rate faults
    burst: int
    steady_blocked: int  # steady-rate faults that were ever told RecoveryBlocked
    burst_held: int  # burst nodes held by the budget at least once
    over: int  # disruptive steps that left more than the limit disrupted
    limit: int
    max_disrupted: int
    summary: str


def simulate_week(*, nodes: int, rate: float, burst: int, seed: int = 0, replace_after: float = 600.0) -> WeekResult:
    sys.path.insert(0, str(ROOT / "tests"))
    from agent.adapters.kube import KubeClient
    from agent.recovery.budget import resolve_limit
    from agent.recovery.policyfile import DEFAULT_POLICY
    from bench.fleet import _Clock, _disrupted, _loop, _Marker
    from bench.fleetsim import node_object

    from kubeapi.server import KubeApiServer

    rng = random.Random(seed)
    policy = dataclasses.replace(DEFAULT_POLICY, startup_delay=0.0)
    limit = resolve_limit(policy.budget, domains=nodes)
    zones = ("us-west-2a", "us-west-2b", "us-west-2c")
    live = {f"n{i:04d}": zones[i % 3] for i in range(nodes)}
    serial = nodes
    # The fault schedule: (time, node or None = the burst)
    schedule: list[tuple[float, str | None]] = []
    t = T0
    while True:
        t += rng.expovariate(rate / 1000.0 * nodes / DAY)
        if t >= T0 + 7 * DAY:
            break
        schedule.append((t, ""))
    schedule.append((T0 + 3.5 * DAY, None))
    schedule.sort(key=lambda e: e[0])
    clock = _Clock(T0)
    marker = _Marker()
    steady_blocked = burst_held = over = max_disrupted = 0
    steady = 0
    with tempfile.TemporaryDirectory() as tmp, KubeApiServer() as server:
        server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for i, (name, zone) in enumerate(live.items()):
            server.put_object(node_object(name, i, zone=zone))
        client = KubeClient.load(kubeconfig=server.write_kubeconfig(Path(tmp) / "kubeconfig"), timeout=10.0)
        active: dict[str, dict[str, Any]] = {}  # node -> loop, inbox, kind, blocked, marked_at
        try:

            def fail(name: str, kind: str) -> None:
                loop, inbox = _loop(
                    client=client, name=name, policy=policy, clock=clock, marker=marker, rng=rng, failing=True
                )
                active[name] = {"loop": loop, "inbox": inbox, "kind": kind, "blocked": False, "marked": None}

            pending = list(schedule)
            next_step: dict[str, float] = {}
            while pending or active:
                # the next thing to happen: a fault, a replacement or a loop's step
                times = [pending[0][0]] if pending else []
                times += [a["marked"] + replace_after for a in active.values() if a["marked"] is not None]
                times += [next_step[n] for n, a in active.items() if a["marked"] is None]
                clock.now = max(clock.now, min(times))
                while pending and pending[0][0] <= clock.now:
                    _, who = pending.pop(0)
                    if who is None:
                        zone = zones[0]
                        for name in [n for n, z in live.items() if z == zone and n not in active][:burst]:
                            fail(name, "burst")
                            next_step[name] = clock.now
                    else:
                        name = rng.choice([n for n in live if n not in active])
                        fail(name, "steady")
                        next_step[name] = clock.now
                        steady += 1
                for name, a in list(active.items()):
                    if a["marked"] is not None and clock.now >= a["marked"] + replace_after:
                        server.delete_object("nodes", name)
                        zone = live.pop(name)
                        del active[name]
                        new = f"r{serial:05d}"
                        server.put_object(node_object(new, serial, zone=zone))
                        live[new] = zone
                        serial += 1
                        for other in active:  # a freed place: blocked loops ask again now
                            next_step[other] = min(next_step.get(other, clock.now), clock.now)
                for name, a in list(active.items()):
                    if a["marked"] is not None or next_step.get(name, 0) > clock.now:
                        continue
                    decision = a["loop"].step()
                    while (notice := a["inbox"].get_nowait()) is not None:
                        if any(e.reason == "RecoveryBlocked" for e in notice.events):
                            a["blocked"] = True
                    disrupted = len(_disrupted(server, {n for n, _ in marker.calls}))
                    max_disrupted = max(max_disrupted, disrupted)
                    if decision is not None and any(x.disruptive for x in decision.actions) and disrupted > limit:
                        over += 1
                    if any(n == name for n, _ in marker.calls):
                        a["marked"] = clock.now
                        steady_blocked += a["blocked"] and a["kind"] == "steady"
                        burst_held += a["blocked"] and a["kind"] == "burst"
                    blocked_now = decision is not None and decision.blocked is not None
                    next_step[name] = clock.now + (BLOCKED_STEP if blocked_now else STEP)
        finally:
            client.close()
    summary = (
        f"week: {nodes} nodes, {rate:g} faults per 1000 node-days ({steady} faults) and a burst of {burst} in one "
        f"zone; limit {limit}: {steady_blocked} steady faults blocked, {burst_held} of the burst held, at most "
        f"{max_disrupted} disrupted, {len(marker.calls)} replaced"
    )
    return WeekResult(
        faults=steady,
        burst=burst,
        steady_blocked=steady_blocked,
        burst_held=burst_held,
        over=over,
        limit=limit,
        max_disrupted=max_disrupted,
        summary=summary,
    )
