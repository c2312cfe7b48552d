"""What ``status`` shows of a node's validations (node-health-agent.io/validations, as agent.sinks.validations
writes it): the last verdict per check and device, and whether a pass is still valid; a failed or voided one
gives a healthy node a row; `node-health-agent status` lists them under the node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.app.commands.devicestatus import device_lines, device_view
from agent.core.validation import VALIDATIONS_ANNOTATION, ValidationRecord, Verdict, records_text

from kubeapi import KubeApiServer

NOW = 1795341600.0
GPU0 = "gpu:0000:3b:00.0"


def record(verdict=Verdict.PASS, *, hours=3.0, valid_h=24.0, devices=(GPU0,), **kw) -> ValidationRecord:
    at = NOW - hours * 3600
    return ValidationRecord(
        check="dcgm-diag", devices=devices, verdict=verdict, reason=kw.pop("reason", "DiagPassed"), message="", at=at,
        valid_until=at + valid_h * 3600 if verdict is Verdict.PASS else None, **kw,
    )  # fmt: skip


def node(name: str, annotations: dict[str, str]) -> dict:
    ready = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": annotations},
            "spec": {}, "status": {"conditions": ready}}  # fmt: skip


@pytest.mark.parametrize(
    ("records", "line", "shown"),
    [
        ([record()], f"validation dcgm-diag of {GPU0}: pass 3h ago, valid", False),
        ([record(valid_h=1.0)], f"validation dcgm-diag of {GPU0}: pass 3h ago, expired", False),
        (
            [record(invalidated_by=f"GpuXid/GpuXid79 on {GPU0}")],
            f"validation dcgm-diag of {GPU0}: pass 3h ago, voided by GpuXid/GpuXid79 on {GPU0}",
            True,
        ),
        ([record(Verdict.FAIL, reason="MemoryTestFailed")], f"validation dcgm-diag of {GPU0}: fail 3h ago, "
         "MemoryTestFailed", True),
        ([record(Verdict.UNKNOWN, devices=(), reason="ToolMissing")], "validation dcgm-diag of the node: unknown "
         "3h ago, ToolMissing", False),
    ],
    ids=["valid-pass", "expired-pass", "voided-pass", "fail", "unknown-node"],
)  # fmt: skip
def test_a_node_shows_each_validation_and_its_validity(records, line, shown):
    view = device_view(node("a", {VALIDATIONS_ANNOTATION: records_text(records)}), now=NOW)
    assert view.pop("show") is shown
    assert device_lines(view, ago=lambda t: f"{int((NOW - t) // 3600)}h") == [line]


def test_an_unreadable_validations_annotation_is_shown_as_such():
    view = device_view(node("a", {VALIDATIONS_ANNOTATION: "[{"}), now=NOW)
    assert view["show"] and view["validationsUnreadable"].startswith("validations: not JSON")


def test_status_json_and_table_carry_the_validations(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setattr("time.time", lambda: NOW)
    voided = record(invalidated_by=f"GpuXid/GpuXid79 on {GPU0}")
    with KubeApiServer() as api:
        api.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "node-health-agent"}})
        api.put_object(node("a", {VALIDATIONS_ANNOTATION: records_text([voided])}))
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        assert main(["status", "--kubeconfig", kubeconfig, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        [row] = [n for n in doc["nodes"] if n["node"] == "a"]
        assert [(v["verdict"], v["valid"], v["invalidatedBy"]) for v in row["validations"]] == [
            ("pass", False, f"GpuXid/GpuXid79 on {GPU0}")
        ]
        assert main(["status", "--kubeconfig", kubeconfig]) == 0
        assert f"validation dcgm-diag of {GPU0}: pass" in capsys.readouterr().out
