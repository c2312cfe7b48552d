"""A zone burst end to end (issue 15, "a zone burst holds"): four real agent processes on four nodes of one
zone, the same Neuron fault written to three of their kernel logs at once. The zone budget (one place) and
the correlated-failure hold (more than 30 % and at least 3 of the zone's nodes with the same problem type)
let at most one node act; the others report ``RecoveryHeldCorrelated`` and wait. The node without a fault
and the node of the other zone are never touched.

Then ``pause --pool b`` and ``pause --pool a``, pools named by the operator's own label in ``budget.groups``.
Pool b's agent is idle (it polls the pause Lease every 5 min, but reads it fresh before any action): a
fault written to it after the pause is held (``RecoveryPaused``) and it then exports
``node_health_agent_recovery_paused 1``; pool a's held agents (an incident open: each step reads the pause
Lease) export it from their next step on; no agent of another pool does. Steps, not seconds: a loaded
machine is slow, never wrong (the 5 s interval itself is timed with an injected clock in
test_recovery_holds.py::test_an_agent_polls_every_5_s_with_an_incident_open_and_every_5_min_idle)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.recovery.model import INCIDENT_ANNOTATION

from helpers import free_port, http_get, wait_for
from helpers.agents import PolicyAgent
from helpers.recovery import agent_pod
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # four agent processes: about 30 s

NAMESPACE = "node-health-agent"
ZONE = "topology.kubernetes.io/zone"
POOL = "example.com/pool"  # the operator's own pool label
AGENTS = ("ip-10-0-0-1", "ip-10-0-0-2", "ip-10-0-0-3", "ip-10-0-0-4")  # zone us-west-2a, one agent each
FAULTY = AGENTS[:3]
ELSEWHERE = "ip-10-0-1-1"  # zone us-west-2b, no agent
# persist: the agents decide once the burst is on the Nodes (each agent writes its condition first), so the
# order in which they ask the budget does not matter: whoever asks sees the zone failing together.
POLICY = f"""\
startupDelay: 0s
rules:
  - condition: NeuronHealth
    reasons: ["NeuronHasError_*"]
    actions: [cordon]
    persist: 2s
budget:
  maxUnhealthy: 10
  maxActions: 100
  groups:
    - label: {ZONE}
      maxUnhealthy: 1
    - label: {POOL}
      maxUnhealthy: 10
  correlation:
    labels: [{ZONE}]
    share: 30%
    minNodes: 3
"""


PAUSE_LEASE_NAME = "node-health-agent-recovery-pause"
STEP_SLACK = 3  # Node reads after the pause by which a held agent must show it: its next step (+1 stray read)


def node(name: str, zone: str, pool: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", ZONE: zone, POOL: pool}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    server.start()
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for name in AGENTS:
        server.put_object(node(name, "us-west-2a", "a" if name in FAULTY else "b"))
        server.put_object(agent_pod(name, namespace=NAMESPACE))  # whom `pause` sees it reaches
    server.put_object(node(ELSEWHERE, "us-west-2b", "b"))
    try:
        yield server
    finally:
        server.stop()


class Agent(PolicyAgent):
    """An agent of the zone, /metrics on its own port (whether a pause holds it)."""

    def __init__(self, tmp: Path, api: KubeApiServer, name: str, policy: Path) -> None:
        self.port = free_port()
        super().__init__(tmp, api, name, policy, listen=f"127.0.0.1:{self.port}")

    def paused(self) -> str:
        """The value of node_health_agent_recovery_paused ("" while nothing answers)."""
        _, body = http_get(f"http://127.0.0.1:{self.port}/metrics")
        found = re.search(r"^node_health_agent_recovery_paused (\S+)$", body, re.M)
        return found.group(1) if found else ""


def condition(api: KubeApiServer, name: str, type_: str) -> dict | None:
    conds = (api.get_object("nodes", name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


def healthy(api: KubeApiServer, name: str) -> bool:
    found = condition(api, name, "NeuronHealth")
    return found is not None and found["status"] == "False"


def cordoned(api: KubeApiServer) -> set[str]:
    return {n["metadata"]["name"] for n in api.list_objects("nodes") if (n.get("spec") or {}).get("unschedulable")}


def paused_events(api: KubeApiServer) -> set[str]:
    """Nodes with a RecoveryPaused Event (a step held by a pause)."""
    return {
        e["involvedObject"]["name"] for e in api.list_objects("events", "default") if e["reason"] == "RecoveryPaused"
    }


def held(api: KubeApiServer) -> dict[str, str]:
    """Node name -> the message of its RecoveryHeldCorrelated Event."""
    return {
        e["involvedObject"]["name"]: e["message"]
        for e in api.list_objects("events", "default")
        if e["reason"] == "RecoveryHeldCorrelated"
    }


def node_reads_since_the_pause(api: KubeApiServer, names: tuple[str, ...]) -> dict[str, int]:
    """Node -> GETs of that Node (one per recovery step) answered after the latest pause was written."""
    records = api.requests.snapshot()
    written = max(
        i
        for i, r in enumerate(records)
        if r.method in ("POST", "PUT")
        and r.status in (200, 201)
        and "/leases" in r.path
        and ((r.body or {}).get("metadata") or {}).get("name") == PAUSE_LEASE_NAME
    )
    later = records[written + 1 :]
    return {n: sum(r.method == "GET" and r.path == f"/api/v1/nodes/{n}" for r in later) for n in names}


def paused_by_their_next_step(api: KubeApiServer, agents: dict, members: tuple[str, ...]) -> bool:
    """All ``members`` export the pause; fails at once if one has stepped past the pause without it."""
    reads = node_reads_since_the_pause(api, members)  # first: what is scraped after can only be more paused
    shown = {n: agents[n].paused() for n in members}
    late = {n: reads[n] for n in members if reads[n] >= STEP_SLACK and shown[n] != "1.0"}
    assert not late, f"Node reads since the pause without exporting it: {late}"
    return all(value == "1.0" for value in shown.values())


def test_a_zone_burst_lets_at_most_one_node_act_and_holds_the_rest(api, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    agents = {name: Agent(tmp_path / name, api, name, policy) for name in AGENTS}
    try:
        # Readiness: every agent has adopted its conditions (NeuronHealth written False on its Node).
        wait_for(lambda: all(healthy(api, n) for n in AGENTS), timeout=90)
        for name in FAULTY:  # the burst: three of the zone's four nodes at once
            agents[name].fault()
        wait_for(lambda: len(cordoned(api) | set(held(api))) >= len(FAULTY), timeout=90)
        acted, told = cordoned(api), held(api)
        print(f"zone burst: acted {sorted(acted)}, held {sorted(told)}")
        assert len(acted) <= 1, f"the zone's budget is one place: {sorted(acted)} acted"
        assert acted | set(told) == set(FAULTY) and not acted & set(told)
        assert all(f"{ZONE}=us-west-2a" in m and "NeuronHealth" in m for m in told.values()), told
        incidents = {
            n: json.loads(text)
            for n in FAULTY
            if (text := (api.get_object("nodes", n)["metadata"].get("annotations") or {}).get(INCIDENT_ANNOTATION))
        }
        assert all(i["done"] == [] for n, i in incidents.items() if n in told), "held: nothing done"

        assert {a.paused() for a in agents.values()} == {"0.0"}
        kubeconfig = str(api.write_kubeconfig(tmp_path / "cli-kubeconfig"))
        for pool, members in (("b", AGENTS[3:]), ("a", FAULTY)):  # b: the idle agent; a: the held ones
            argv = ["--pool", pool, "--by", "tester", "--recovery-policy", str(policy)]  # the agents' pool label
            assert main(["pause", "--kubeconfig", kubeconfig, *argv]) == 0
            if pool == "b":  # idle: the pause takes effect at its next action, read fresh (never cordoned: below)
                agents[AGENTS[3]].fault()
                wait_for(lambda: AGENTS[3] in paused_events(api), timeout=60)
                wait_for(lambda: agents[AGENTS[3]].paused() == "1.0", timeout=60)
            else:  # held with an incident open: every step reads the pause Lease
                wait_for(lambda members=members: paused_by_their_next_step(api, agents, members), timeout=60)
            print(f"pause --pool {pool}: Node reads since, by agent: {node_reads_since_the_pause(api, members)}")
            if pool == "b":
                assert {agents[n].paused() for n in FAULTY} == {"0.0"}, "pool a is not paused by pool b's pause"
    finally:
        errors = [agent.stop() for agent in agents.values()]
    assert all(agent.proc.returncode == 0 for agent in agents.values()), errors
    assert not cordoned(api) & {AGENTS[3], ELSEWHERE}, "pool b's fault came after its pause: held"
    assert len(cordoned(api)) <= 1, "still at most one once the agents stopped"
