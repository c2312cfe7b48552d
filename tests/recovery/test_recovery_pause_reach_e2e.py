"""The off switch reaches an agent run with a cluster name (every EKS example sets one) when the operator
runs ``pause`` exactly as README.md and docs/recovery.md write it, without ``--cluster-name``: a real agent
process with CLUSTER_NAME=prod, a Neuron fault after the pause, and the node is not cordoned."""

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

pytestmark = pytest.mark.slow  # one agent process: about 10 s

NAMESPACE = "node-health-agent"
NODE = "ip-10-0-0-1"
CLUSTER = "prod"
POLICY = """\
startupDelay: 0s
rules:
  - condition: NeuronHealth
    reasons: ["NeuronHasError_*"]
    actions: [cordon]
budget:
  maxActions: 100
"""


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        server.put_object(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": NODE, "labels": {"kubernetes.io/os": "linux"}},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
            }
        )
        server.put_object(agent_pod(NODE, cluster_name=CLUSTER, namespace=NAMESPACE))  # as the DaemonSet runs it
        yield server


def events(api: KubeApiServer, reason: str) -> list[dict]:
    return [e for e in api.list_objects("events", "default") if e["reason"] == reason]


def incident(api: KubeApiServer) -> dict | None:
    text = (api.get_object("nodes", NODE)["metadata"].get("annotations") or {}).get(INCIDENT_ANNOTATION)
    return json.loads(text) if text else None


def test_pause_as_documented_holds_an_agent_run_with_a_cluster_name(api, tmp_path, monkeypatch, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "operator-kubeconfig")))
    monkeypatch.delenv("CLUSTER_NAME", raising=False)  # the operator's shell: no cluster name anywhere
    agent = PolicyAgent(tmp_path / NODE, api, NODE, policy, env={"CLUSTER_NAME": CLUSTER})
    try:
        # `kubectl node-health pause --reason "bad rule rollout"`, as README.md and docs/recovery.md write it.
        assert main(["pause", "--reason", "bad rule rollout"]) == 0
        out = capsys.readouterr().out
        assert "reaches: 1 of 1 agent pod(s)" in out
        agent.fault()
        wait_for(lambda: events(api, "RecoveryPaused"), timeout=60)
        (paused,) = events(api, "RecoveryPaused")
        assert paused["involvedObject"]["name"] == NODE and "bad rule rollout" in paused["message"]
        assert not api.get_object("nodes", NODE)["spec"].get("unschedulable"), "paused: not cordoned"
        assert (incident(api) or {}).get("done", []) == []

        assert main(["resume"]) == 0  # as documented: the same selector lifts it, and the agent goes on
        wait_for(lambda: api.get_object("nodes", NODE)["spec"].get("unschedulable") is True, timeout=60)
    finally:
        err = agent.stop()
    assert agent.proc.returncode == 0, err
