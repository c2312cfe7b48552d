"""The off switch end to end: three real agent processes, each draining its node (a PodDisruptionBudget
keeps refusing the evictions, so the drains go on), then ``node-health-agent pause`` stops all three
drains before their next pod, without a restart; ``resume`` lets them go on.

"Within 10 s" is counted in the drains' own steps, not in seconds (a loaded machine is slow, never
wrong): a drain re-reads the pause between any two evictions (every 2 s, timed with an injected clock in
test_recovery_holds.py::test_a_drain_stops_before_the_next_pod), so after the pause each drain makes at
most the one eviction already under way."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agent.app.cli import main
from agent.recovery.model import INCIDENT_ANNOTATION

from helpers import wait_for
from helpers.agents import PolicyAgent
from helpers.recovery import agent_pod
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # starts three agent processes

NAMESPACE = "node-health-agent"
NODES = ("ip-10-0-0-1", "ip-10-0-0-2", "ip-10-0-0-3")
POLICY = """\
startupDelay: 0s
rules:
  - condition: NeuronHealth
    reasons: ["NeuronHasError_*"]
    actions: [cordon, drain]
drain:
  podDeadline: 10m
  timeout: 30m
budget:
  maxUnhealthy: 3
  maxActions: 100
"""
PAUSE_LEASE_NAME = "node-health-agent-recovery-pause"
PAUSE_LEASE = rf"/namespaces/{NAMESPACE}/leases/{PAUSE_LEASE_NAME}$"


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    server.start()
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for name in NODES:
        server.put_object(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
            }
        )
        server.put_object(agent_pod(name, namespace=NAMESPACE))  # whom `pause` sees it reaches
        server.put_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"train-{name}", "namespace": "default", "labels": {"app": "train"}},
                "spec": {"nodeName": name, "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
    server.put_object(  # every training pod must stay: each eviction is refused (429), each drain goes on
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"minAvailable": len(NODES), "selector": {"matchLabels": {"app": "train"}}},
        }
    )
    try:
        yield server
    finally:
        server.stop()


Agent = PolicyAgent


def drain_state(api: KubeApiServer, node: str) -> str:
    annotations = api.get_object("nodes", node)["metadata"].get("annotations") or {}
    text = annotations.get(INCIDENT_ANNOTATION)
    return json.loads(text)["drain"] if text else ""


def evictions(api: KubeApiServer) -> int:
    return api.requests.count(method="POST", path_regex=r"/eviction$")


def evictions_after_the_pause(api: KubeApiServer) -> dict[str, int]:
    """Node -> evictions of its pod answered after the pause was written (the request log's order)."""
    records = api.requests.snapshot()
    written = next(
        i
        for i, r in enumerate(records)
        if r.method in ("POST", "PUT", "PATCH")
        and r.status in (200, 201)
        and r.path.startswith(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")
        and ((r.body or {}).get("metadata") or {}).get("name") == PAUSE_LEASE_NAME
    )
    later = records[written + 1 :]
    return {n: sum(r.method == "POST" and r.path.endswith(f"/pods/train-{n}/eviction") for r in later) for n in NODES}


def test_pause_stops_three_drains_before_their_next_eviction_and_resume_lets_them_go_on(api, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    kubeconfig = str(api.write_kubeconfig(tmp_path / "cli-kubeconfig"))
    agents = [Agent(tmp_path / node, api, node, policy) for node in NODES]
    try:
        for agent in agents:
            agent.fault()
        # Readiness: every drain runs and has been refused at least once (the PDB holds the pods).
        wait_for(lambda: all(drain_state(api, n) == "running" for n in NODES), timeout=60)
        wait_for(lambda: evictions(api) >= len(NODES), timeout=60)

        assert main(["pause", "--kubeconfig", kubeconfig, "--reason", "e2e", "--by", "tester"]) == 0
        wait_for(lambda: all(drain_state(api, n) == "stopped" for n in NODES), timeout=60)
        after = evictions_after_the_pause(api)
        print(f"pause -> all {len(NODES)} drains stopped; evictions after the pause: {after}")
        assert all(count <= 1 for count in after.values()), f"a drain went on evicting after the pause: {after}"

        # Paused: each agent's next steps read the pause Lease and evict nothing more.
        quiet_from = evictions(api)
        reads = api.requests.count(method="GET", path_regex=PAUSE_LEASE)
        wait_for(lambda: api.requests.count(method="GET", path_regex=PAUSE_LEASE) >= reads + 2 * len(NODES), timeout=60)
        assert evictions(api) == quiet_from
        held = [e for e in api.list_objects("events", "default") if e["reason"] == "RecoveryDrainHeld"]
        assert {e["involvedObject"]["name"] for e in held} == set(NODES)
        assert all("tester" in e["message"] and "e2e" in e["message"] for e in held)

        assert main(["resume", "--kubeconfig", kubeconfig, "--by", "tester"]) == 0
        wait_for(lambda: all(drain_state(api, n) == "running" for n in NODES), timeout=60)
        wait_for(lambda: evictions(api) > quiet_from, timeout=60)
    finally:
        errors = [agent.stop() for agent in agents]
    assert all(agent.proc.returncode == 0 for agent in agents), errors
