"""``node-health-agent status`` shows per node the operator's clears (the Node annotation
node-health-agent.io/clears, as agent.sinks.clearack writes it) and the per-device recovery work (the incident
annotation's "fences"); a corrupt annotation is shown unreadable, the rest still shown. Recorded Node objects,
read through the real client from the test API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.app.commands.devicestatus import device_lines, device_view
from agent.core.clears import CLEARS_ANNOTATION, ClearRecord, ClearRequest, records_text
from agent.recovery.model import INCIDENT_ANNOTATION

from kubeapi import KubeApiServer

NAMESPACE = "node-health-agent"
NOW = 1795341600.0  # 2026-11-22T10:00:00Z
T = "2026-11-22T09:00:00Z"


def clear(device: str | None, *, by: str = "alice", hours: float = 3.0, outcome: str = "applied") -> ClearRecord:
    request = ClearRequest(
        id=f"c-{by}-{int(hours * 10)}",
        condition="GpuXid",
        device=device,
        reason="card swapped",
        by=by,
        at=NOW - hours * 3600 - 5,
    )
    detail = "cleared gpu:0000:3b:00.0" if outcome == "applied" else "no such device failing"
    return ClearRecord(
        request=request, outcome=outcome, detail=detail, applied_at=NOW - hours * 3600, boot_id="b-1", seq=41
    )


FENCES = [
    {
        "device": "gpu:0000:3b:00.0",
        "fence": "fenced",
        "rule": "node-health-agent-a-gpu-0000-3b-00-0",
        "holders": ["ml/train-0"],
        "evicted": ["ml/train-0"],
        "steps": ["fence-device", "drain-device"],
    },
    {"device": "gpu:0000:5d:00.0", "fence": "not-dra", "rule": "", "holders": [], "evicted": [], "steps": []},
]


ATTEMPTS = [  # as the validation gate records them (agent.recovery.model.ValidationAttempt.to_json)
    {"number": 1, "id": "i#1", "remedy": "reboot", "checks": ["dcgm-diag"], "devices": [], "after": 1.0,
     "requestedAt": 2.0, "outcome": "permanent", "reason": "ValidationFailed", "message": "", "settledAt": 3.0},
    {"number": 2, "id": "i#2", "remedy": "reboot", "checks": ["dcgm-diag"], "devices": [], "after": 1.0,
     "requestedAt": 4.0, "outcome": "", "reason": "", "message": "", "settledAt": None},
]  # fmt: skip


def incident(**extra: object) -> str:
    return json.dumps(
        {
            "id": "GpuXid/GpuXid79/uid-a/1795338000",
            "condition": "GpuXid",
            "reason": "GpuXid79",
            "since": 1795338000.0,
            "opened": 1795338001.0,
            "done": ["fence-device"],
            "cordonedByUs": False,
            "drain": "",
            "budgetHeld": False,
            "healthySince": None,
            "dryRun": False,
            **extra,
        },
        sort_keys=True,
    )


def node(name: str, annotations: dict[str, str], *, failing: bool = True) -> dict:
    conditions = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}]
    if failing:
        conditions.append(
            {"type": "GpuXid", "status": "True", "reason": "GpuXid79", "message": "", "lastTransitionTime": T}
        )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {},
        "status": {"conditions": conditions},
    }


@pytest.mark.parametrize(
    ("annotations", "view", "lines"),
    [
        pytest.param({}, {}, [], id="nothing recorded"),
        pytest.param(
            {INCIDENT_ANNOTATION: incident(fences=FENCES)},
            {"fences": FENCES},
            [
                "device gpu:0000:3b:00.0: fence fenced (rule node-health-agent-a-gpu-0000-3b-00-0); "
                "holders ml/train-0; evicted ml/train-0; done fence-device, drain-device",
                "device gpu:0000:5d:00.0: fence not-dra; holders none; evicted none",
            ],
            id="two devices' recovery work",
        ),
        pytest.param({INCIDENT_ANNOTATION: incident()}, {}, [], id="an incident without fences: none"),
        pytest.param(
            {INCIDENT_ANNOTATION: incident(fences=[FENCES[0], {"device": "", "fence": "fenced"}, 7])},
            {
                "fences": [
                    FENCES[0],
                    {"unreadable": "fences[1].device: must be a non-empty string of at most 256 characters"},
                    {"unreadable": "fences[2]: must be an object"},
                ]
            },
            [
                "device gpu:0000:3b:00.0: fence fenced (rule node-health-agent-a-gpu-0000-3b-00-0); "
                "holders ml/train-0; evicted ml/train-0; done fence-device, drain-device",
                "device: unreadable (fences[1].device: must be a non-empty string of at most 256 characters)",
                "device: unreadable (fences[2]: must be an object)",
            ],
            id="corrupt entries shown unreadable, the good one kept",
        ),
        pytest.param(
            {INCIDENT_ANNOTATION: incident(fences={"gpu": 1})},
            {"fencesUnreadable": "fences: must be a list"},
            ["devices: unreadable (fences: must be a list)"],
            id="fences not a list",
        ),
        pytest.param(
            {INCIDENT_ANNOTATION: '{"fences": ['},
            {"fencesUnreadable": "the incident annotation is not JSON: Expecting value: line 1 column 13 (char 12)"},
            ["devices: unreadable (the incident annotation is not JSON: Expecting value: line 1 column 13 (char 12))"],
            id="incident not JSON",
        ),
        pytest.param(
            {INCIDENT_ANNOTATION: incident(fences=[{**FENCES[0], "holders": "ml/train-0"}])},
            {"fences": [{"unreadable": "fences[0].holders: must be a list of pods (namespace/name)"}]},
            ["device: unreadable (fences[0].holders: must be a list of pods (namespace/name))"],
            id="holders not a list",
        ),
        pytest.param(
            {CLEARS_ANNOTATION: records_text([clear("gpu:0000:3b:00.0"), clear(None, by="bob", hours=1.0)])},
            {
                "clears": [
                    {
                        "condition": "GpuXid",
                        "device": "gpu:0000:3b:00.0",
                        "by": "alice",
                        "reason": "card swapped",
                        "at": NOW - 3 * 3600,
                        "outcome": "applied",
                        "detail": "cleared gpu:0000:3b:00.0",
                    },
                    {
                        "condition": "GpuXid",
                        "device": None,
                        "by": "bob",
                        "reason": "card swapped",
                        "at": NOW - 3600,
                        "outcome": "applied",
                        "detail": "cleared gpu:0000:3b:00.0",
                    },
                ]
            },
            [
                "cleared GpuXid of device gpu:0000:3b:00.0 by alice 3h ago (card swapped): applied: "
                "cleared gpu:0000:3b:00.0",
                "cleared GpuXid by bob 1h ago (card swapped): applied: cleared gpu:0000:3b:00.0",
            ],
            id="two clears, one of a device",
        ),
        pytest.param(
            {CLEARS_ANNOTATION: '{"clears": [{"id": "x"}]}'},
            {"clearsUnreadable": "clears[0].condition: must be a string of at most 63 characters, got missing"},
            None,
            id="a corrupt clear record",
        ),
        pytest.param(
            {CLEARS_ANNOTATION: "not json", INCIDENT_ANNOTATION: incident(fences=FENCES[1:])},
            {"clearsUnreadable": "clears: not JSON: Expecting value: line 1 column 1 (char 0)", "fences": FENCES[1:]},
            [
                "device gpu:0000:5d:00.0: fence not-dra; holders none; evicted none",
                "clears: unreadable (clears: not JSON: Expecting value: line 1 column 1 (char 0))",
            ],
            id="clears unreadable, devices still shown",
        ),
        pytest.param(
            {INCIDENT_ANNOTATION: incident(validations=ATTEMPTS)},
            {
                "attempts": [
                    {
                        "number": 1,
                        "remedy": "reboot",
                        "checks": ["dcgm-diag"],
                        "outcome": "permanent",
                        "reason": "ValidationFailed",
                    },
                    {"number": 2, "remedy": "reboot", "checks": ["dcgm-diag"], "outcome": "", "reason": ""},
                ]
            },
            [
                "validation attempt #1 after reboot [dcgm-diag]: permanent (ValidationFailed)",
                "validation attempt #2 after reboot [dcgm-diag]: open",
            ],
            id="the validation gate's attempts",
        ),  # fmt: skip
        pytest.param(
            {INCIDENT_ANNOTATION: incident(validations=[{"number": "one"}])},
            {"attempts": [{"unreadable": "validations[0]: must be an object with a number"}]},
            ["validation attempt: unreadable (validations[0]: must be an object with a number)"],
            id="an unreadable attempt",
        ),
    ],
)
def test_what_a_node_shows_of_its_devices_and_clears(annotations, view, lines):
    got = device_view(node("a", annotations), now=NOW)
    got.pop("show")
    if "clearsUnreadable" in view and "clearsUnreadable" in got:  # the codec's wording past the field
        assert got["clearsUnreadable"].split(":")[0] == view["clearsUnreadable"].split(":")[0]
        got["clearsUnreadable"] = view["clearsUnreadable"]
    assert got == view
    if lines is not None:
        assert device_lines(got, ago=lambda t: f"{int((NOW - t) // 3600)}h") == lines


@pytest.mark.parametrize(
    ("annotations", "shown"),
    [
        pytest.param({}, False, id="healthy, nothing recorded"),
        pytest.param(
            {CLEARS_ANNOTATION: records_text([clear("gpu:0000:3b:00.0", hours=3.0)])}, True, id="cleared 3h ago"
        ),
        pytest.param({CLEARS_ANNOTATION: records_text([clear(None, hours=30.0)])}, False, id="cleared 30h ago"),
        pytest.param({CLEARS_ANNOTATION: "{"}, True, id="an unreadable clears annotation"),
    ],
)
def test_a_healthy_node_shows_for_a_recent_clear_or_an_unreadable_record(annotations, shown):
    assert device_view(node("a", annotations, failing=False), now=NOW)["show"] is shown


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        server.put_object(
            node(
                "a",
                {
                    INCIDENT_ANNOTATION: incident(fences=FENCES),
                    CLEARS_ANNOTATION: records_text([clear("gpu:0000:5d:00.0", by="bob", hours=2.0)]),
                },
            )
        )
        server.put_object(node("b", {INCIDENT_ANNOTATION: "{not json", CLEARS_ANNOTATION: "[]"}))
        server.put_object(node("c", {CLEARS_ANNOTATION: records_text([clear(None, hours=1.0)])}, failing=False))
        server.put_object(node("d", {}, failing=False))
        yield server


def run_status(api: KubeApiServer, tmp_path: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["status", "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")), *extra])
    return code, capsys.readouterr().out


def test_status_json_carries_clears_and_fences_per_node(api, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("time.time", lambda: NOW)  # c's clear an hour ago: recent
    code, out = run_status(api, tmp_path, capsys, "--json")
    rows = {r["node"]: r for r in json.loads(out)["nodes"]}
    assert code == 0 and sorted(rows) == ["a", "b", "c"]  # d: healthy, nothing recorded
    assert rows["a"]["fences"] == FENCES and [c["by"] for c in rows["a"]["clears"]] == ["bob"]
    assert rows["b"]["fencesUnreadable"].startswith("the incident annotation is not JSON")
    assert rows["b"]["clearsUnreadable"].startswith("clears:")
    assert rows["c"]["problems"] == [] and rows["c"]["clears"][0]["device"] is None


def test_status_table_lists_device_work_and_clears_under_each_node(api, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("time.time", lambda: NOW)
    code, out = run_status(api, tmp_path, capsys)
    assert code == 0
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("a ")))
    assert lines[start + 1 : start + 4] == [
        "  device gpu:0000:3b:00.0: fence fenced (rule node-health-agent-a-gpu-0000-3b-00-0); holders ml/train-0; "
        "evicted ml/train-0; done fence-device, drain-device",
        "  device gpu:0000:5d:00.0: fence not-dra; holders none; evicted none",
        "  cleared GpuXid of device gpu:0000:5d:00.0 by bob 2h ago (card swapped): applied: cleared gpu:0000:3b:00.0",
    ]
    assert any(line.startswith("  devices: unreadable (the incident annotation is not JSON") for line in lines)
    assert any(line.startswith("  clears: unreadable (clears:") for line in lines)
    assert any(line.startswith("c ") and "(healed)" in line for line in lines)
