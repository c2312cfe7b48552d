"""The built-in packs against real, labelled kernel lines and captures (../shared/testdata).

Each labelled line is replayed through `simulate`'s code path. A line whose label says a
problem is expected must produce a finding, except context lines of a multi-line incident
(stack headers, RPC dumps) which must instead follow a detected line within a few lines; lines
labelled healthy must stay silent.
"""

from __future__ import annotations

import pytest

from agent.app.cli import simulate_lines
from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir

from helpers.testdata import kernel_lines, require_testdata, tool_output

CONTEXT_EVENTS = {"gsp_rpc_dump_context", "stack_dump_header", "panic_context", "hung_task_context"}
ROWS = kernel_lines()


@pytest.fixture(scope="module")
def rule_set():
    return load_rule_set([builtin_plugins_dir()])


def _findings(rule_set, lines):
    return list(simulate_lines(rule_set=rule_set, lines=iter(lines)))


def _row_id(row: dict) -> str:
    label = row["label"]
    return f"{row['category']}-{label.get('xid', label.get('event', label.get('hw_err', '')))}"


@pytest.mark.parametrize("row", [r for r in ROWS if r["label"].get("event") not in CONTEXT_EVENTS], ids=_row_id)
def test_labelled_line_alone(rule_set, row):
    require_testdata()
    found = _findings(rule_set, [row["text"]])
    if not row["expect_problem"]:
        assert found == [], f"false alarm on a healthy line: {row['text']!r} -> {found}"
        return
    assert found, f"missed: {row['text']!r}"
    label = row["label"]
    if "xid" in label:
        xid_findings = [f for f in found if "xid" in f["fields"]]
        assert xid_findings and xid_findings[0]["fields"]["xid"] == label["xid"]
        assert xid_findings[0]["fields"]["pci"] == label["pci"]
        impact = label["expected_node_impact"]
        # node/GPU-action codes set condition GpuXid; the others are Events only
        expected_type = "permanent" if impact == "node" else "temporary"
        assert {f["type"] for f in xid_findings} == {expected_type}, (impact, xid_findings)
        if expected_type == "permanent":
            assert xid_findings[0]["condition"] == "GpuXid"
            assert xid_findings[0]["reason"] == f"GpuXid{label['xid']}"
    if label.get("event") == "NEURON_HW_ERR":
        (neuron,) = found
        assert neuron["condition"] == "NeuronHealth"
        assert neuron["reason"] == f"NeuronHasError_{label['hw_err']}"
        assert neuron["fields"]["error"] == label["hw_err"]
        if "nd" in label:
            assert neuron["fields"]["nd_id"] == label["nd"]
        if "nc" in label:
            assert neuron["fields"]["nc_id"] == label["nc"]
        if "action" in label:
            assert neuron["fields"]["action"] == label["action"]


def test_context_lines_follow_a_detected_incident(rule_set):
    """Context lines are part of the incident before them: replayed in order, an earlier line fired."""
    require_testdata()
    texts = [r["text"] for r in ROWS]
    found_lines = {f["line"] for f in _findings(rule_set, texts)}
    for number, row in enumerate(ROWS, start=1):
        if row["label"].get("event") in CONTEXT_EVENTS and row["expect_problem"]:
            assert any(n in found_lines for n in range(number - 3, number)), row["text"]


def test_seed_test_line_fires(rule_set):
    (found,) = _findings(rule_set, ["test NEURON_HW_ERR=DMA_ERROR test"])
    assert (found["condition"], found["reason"]) == ("NeuronHealth", "NeuronHasError_DMA_ERROR")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("dmesg-h100-xid119-gsp-rpc-timeout.log", {("GpuXid", "GpuXid119")}, id="xid119"),
        pytest.param(
            "dmesg-npd-docker-hung-task.txt", {(None, "TaskHung"), ("KernelDeadlock", "DockerHung")}, id="docker-hung"
        ),
        pytest.param("dmesg-npd-null-pointer-oops.txt", {(None, "KernelOops")}, id="null-pointer"),
        pytest.param("kmsg-raw-nvswitch-boot-benign.log", set(), id="nvswitch-boot-benign"),
        pytest.param("fabricmanager-log-nvswitch-nonfatal.log", {(None, "NVSwitchError")}, id="fabricmanager"),
    ],
)
def test_captures(rule_set, name, expected):
    require_testdata()
    found = _findings(rule_set, tool_output(name).splitlines())
    assert {(f["condition"], f["reason"]) for f in found} == expected


def test_xid119_capture_is_one_incident_per_gpu(rule_set):
    """The RPC history table and stack after an Xid 119 must not become separate problems."""
    require_testdata()
    found = _findings(rule_set, tool_output("dmesg-h100-xid119-gsp-rpc-timeout.log").splitlines())
    assert {f["fields"].get("pci") for f in found} == {"0000:9b:00"}
    assert {f["rule"] for f in found} == {"nvidia/xid-node"}
