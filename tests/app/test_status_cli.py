"""``node-health-agent status``: the cluster view of recovery, read from a test API server by the real client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.recovery.model import INCIDENT_ANNOTATION

from kubeapi import KubeApiServer

NAMESPACE = "node-health-agent"
T = "2026-11-22T10:00:00Z"
T_EPOCH = 1795341600.0  # T in seconds since the epoch


def node(name: str, *, conditions: list[dict] = (), annotations: dict | None = None, unschedulable=False) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}]
            + list(conditions)
        },
    }


def cond(type_: str, status: str, reason: str) -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": T}


INCIDENT = {
    "id": "NeuronHealth/NeuronHasError_DMA_ERROR/uid-a/1795168800",
    "condition": "NeuronHealth",
    "reason": "NeuronHasError_DMA_ERROR",
    "since": 1795168800.0,
    "opened": 1795168801.0,
    "done": ["cordon", "mark-unhealthy"],
    "cordonedByUs": True,
    "drain": "",
    "budgetHeld": True,
    "healthySince": None,
    "dryRun": False,
}


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        server.put_object(
            node(
                "a",
                conditions=[cond("NeuronHealth", "True", "NeuronHasError_DMA_ERROR")],
                annotations={INCIDENT_ANNOTATION: json.dumps(INCIDENT)},
                unschedulable=True,
            )
        )
        server.put_object(node("b", conditions=[cond("GpuXid", "True", "GpuXid79")]))
        server.put_object(node("c", conditions=[cond("NeuronHealth", "False", "NeuronHasNoError")]))
        yield server


def run_status(api: KubeApiServer, tmp_path: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["status", "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_lists_problem_nodes_with_what_was_done_or_would_be(api, tmp_path, capsys):
    code, out, _ = run_status(api, tmp_path, capsys, "--json")
    assert code == 0
    view = json.loads(out)
    rows = {r["node"]: r for r in view["nodes"]}
    assert set(rows) == {"a", "b"}, "a healthy node is not listed"
    assert rows["a"]["recovery"]["done"] == ["cordon", "mark-unhealthy"]
    assert rows["a"]["recovery"]["cordonedByUs"] is True
    assert rows["b"]["wouldDo"] == ["cordon", "drain", "reboot"]  # Xid 79: the ladder's first rung
    assert rows["b"]["problems"] == [{"condition": "GpuXid", "reason": "GpuXid79", "since": T_EPOCH, "policy": True}]
    assert view["budget"]["state"].startswith("not created yet")
    assert view["nodesListed"] == 3


def test_the_table_and_the_budget_holders(api, tmp_path, capsys):
    state = {"version": 1, "holders": {"a": {"nodes": ["a"], "incident": INCIDENT["id"], "since": 1.0}}, "actions": []}
    api.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "node-health-agent-recovery-budget-prod",
                "namespace": NAMESPACE,
                "annotations": {"node-health-agent.io/budget": json.dumps(state)},
            },
            "spec": {"holderIdentity": "a"},
        }
    )
    code, out, _ = run_status(api, tmp_path, capsys, "--cluster-name", "prod")
    assert code == 0
    assert "2 of 3 nodes with problems, a recovery incident or a recent clear" in out
    assert "done: cordon, mark-unhealthy" in out
    assert "would: cordon, drain, reboot" in out
    assert "places held: 1" in out and "a: a since" in out


def test_the_ladder_step_and_the_windows_end(api, tmp_path, capsys):
    """A node rebooted by recovery for Xid 79 and watched: status says which rung and when the window ends."""
    from agent.recovery.ladder import HISTORY_ANNOTATION

    incident = {**INCIDENT, "id": "GpuXid/GpuXid79/uid-d/1795341600", "condition": "GpuXid", "reason": "GpuXid79"}
    incident["done"] = ["cordon", "drain", "reboot"]
    rung = {
        "incident": incident["id"],
        "condition": "GpuXid",
        "reason": "GpuXid79",
        "remedy": "reboot",
        "step": 0,
        "at": T_EPOCH,
        "boot": "boot-1",
        "window": 1200.0,
        "outcome": "ok",
        "message": "",
        "finishedAt": T_EPOCH + 300,
        "finishedBoot": "boot-2",
        "windowEnd": T_EPOCH + 1500,
    }
    annotations = {INCIDENT_ANNOTATION: json.dumps(incident), HISTORY_ANNOTATION: json.dumps({"rungs": [rung]})}
    api.put_object(
        node("d", conditions=[cond("GpuXid", "False", "GpuXidGood")], annotations=annotations, unschedulable=True)
    )
    code, out, _ = run_status(api, tmp_path, capsys, "--json")
    assert code == 0
    (row,) = [r for r in json.loads(out)["nodes"] if r["node"] == "d"]
    ladder = row["recovery"]["ladder"]
    assert (ladder["step"], ladder["of"], ladder["remedy"], ladder["next"]) == (1, 2, "reboot", "replace")
    assert ladder["windowEnd"] == T_EPOCH + 1500
    code, out, _ = run_status(api, tmp_path, capsys)
    assert "reboot (rung 1 of 2): rebooted; window ende" in out and "2026-11-22T10:25:00" in out


def test_a_corrupt_budget_is_shown_as_such(api, tmp_path, capsys):
    api.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "node-health-agent-recovery-budget",
                "namespace": NAMESPACE,
                "annotations": {"node-health-agent.io/budget": "{not json"},
            },
            "spec": {},
        }
    )
    code, out, _ = run_status(api, tmp_path, capsys)
    assert code == 0
    assert "corrupt: budget: not JSON" in out and "blocked cluster-wide" in out


def test_an_unreachable_api_server_exits_1_with_the_reason(api, tmp_path, capsys):
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    with api.outage("refuse"):
        code = main(["status", "--kubeconfig", str(kubeconfig)])
    _, err = capsys.readouterr()
    assert code == 1 and "cannot read the cluster" in err


def test_a_bad_policy_file_exits_2(api, tmp_path, capsys):
    bad = tmp_path / "policy.yaml"
    bad.write_text("rules:\n  - condition: GpuXid\n    actions: [reboot]\n")
    code, _, err = run_status(api, tmp_path, capsys, "--recovery-policy", str(bad))
    assert code == 2 and "reboot is a remedy" in err and "policy.yaml:3" in err


def test_kubectl_plugin_shim(api, tmp_path):
    """``kubectl node-health`` runs the ``kubectl-node_health`` entry point: the status command."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from agent.app.cli import kubectl_plugin; sys.exit(kubectl_plugin())"]
        + ["--kubeconfig", str(kubeconfig), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert {r["node"] for r in json.loads(proc.stdout)["nodes"]} == {"a", "b"}


def test_a_node_with_two_problems_has_a_row_for_each(api, tmp_path, capsys):
    api.put_object(
        node(
            "d",
            conditions=[
                cond("NeuronHealth", "True", "NeuronHasError_DMA_ERROR"),
                cond("NeuronDevices", "True", "NeuronDeviceMissing"),
            ],
        )
    )
    code, out, _ = run_status(api, tmp_path, capsys)
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.startswith("d ")]
    assert [r[1:3] for r in rows] == [
        ["NeuronHealth", "NeuronHasError_DMA_ERROR"],
        ["NeuronDevices", "NeuronDeviceMissing"],
    ]
    assert "would:" in " ".join(rows[0]) and "would:" not in " ".join(rows[1]), "recovery is said once per node"


def test_without_credentials_the_hint_names_only_what_status_accepts(tmp_path, capsys, monkeypatch):
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    code = main(["status"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "--kubeconfig" in err and "KUBECONFIG" in err
    assert "--standalone" not in err, "status has no --standalone (it rejects the flag)"


def test_status_rejects_standalone(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["status", "--standalone"])
    assert exited.value.code == 2
