"""The built-in policy's first remedy per NVIDIA Xid (agent.recovery.xid) follows NVIDIA's Xid catalog
(shared/reference/nvidia-xid-catalog.json) and covers every Xid the NVIDIA rule pack raises a condition for."""

from __future__ import annotations

import json

import pytest
import yaml

from agent.core.types import Condition, Status
from agent.recovery import xid
from agent.recovery.model import Action, Remedy, Scope
from agent.recovery.policy import rule_for
from agent.recovery.policyfile import DEFAULT_POLICY

from helpers import REPO

ROOT = REPO
CATALOG = ROOT.parent / "shared" / "reference" / "nvidia-xid-catalog.json"
PACK = ROOT / "plugins" / "nvidia" / "nvidia-monitor.yaml"


def catalog() -> dict[int, str]:
    if not CATALOG.exists():
        pytest.skip(f"{CATALOG} is not here (the shared reference data of this checkout)")
    return {int(k): v["immediate_resolution"] for k, v in json.loads(CATALOG.read_text())["xids"].items()}


def node_level_codes() -> set[int]:
    lists = yaml.safe_load(PACK.read_text())["lists"]
    return set(lists["nvidia.xid.node"]) | set(lists["nvidia.xid.nvlink5"]) | set(lists["nvidia.xid.recovery"])


def test_reboot_first_is_what_the_catalog_says_resets_or_reboots():
    actions = catalog()
    assert {c for c in xid.RESET_GPU if actions[c] != "RESET_GPU"} == set()
    assert [actions[c] for c in xid.RESTART_BM] == ["RESTART_BM"]
    assert [actions[c] for c in xid.RESTART_VM] == ["RESTART_VM"]
    assert {actions[c] for c in xid.RESET_WORKFLOWS} <= {
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "XID_154",
    }
    # every reset/reboot code the pack raises a condition for reboots first (64, the row-remap failure, aside)
    wanted = {c for c in node_level_codes() if actions.get(c) in ("RESET_GPU", "RESTART_BM", "RESTART_VM")}
    assert wanted - {xid.ROW_REMAP_FAILURE} <= set(xid.REBOOT_FIRST)


def test_replace_is_hardware_and_the_row_remap_failure():
    actions = catalog()
    assert {actions[c] for c in xid.REPLACE if c != xid.ROW_REMAP_FAILURE} <= {"CONTACT_SUPPORT", "CHECK_MECHANICALS"}
    assert actions[xid.ROW_REMAP_FAILURE] == "RESET_GPU"  # the catalog's; its investigation says CONTACT_SUPPORT
    assert not set(xid.REPLACE) & set(xid.REBOOT_FIRST)
    assert set(xid.REPLACE) | set(xid.REBOOT_FIRST) <= node_level_codes()


def first(reason: str, condition: str = "GpuXid") -> tuple[tuple[Action, ...], tuple[Remedy, ...]] | None:
    found = rule_for(
        DEFAULT_POLICY,
        Condition(type=condition, status=Status.TRUE, reason=reason, message="", last_transition=0.0, last_update=0.0),
        DEFAULT_POLICY.rules[0].sources[0],  # kernel-log: trusted by every built-in rule
    )
    return None if found is None else (found[1].actions, found[1].ladder)


REPLACE = ((Action.CORDON, Action.MARK_UNHEALTHY), ())
REBOOT = ((Action.CORDON,), (Remedy.REBOOT, Remedy.REPLACE))
REPORT = ((Action.CORDON,), ())
DEVICE = ((Action.FENCE_DEVICE, Action.DRAIN_DEVICE, Action.CORDON), (Remedy.REBOOT, Remedy.REPLACE))


@pytest.mark.parametrize(
    ("condition", "reason", "expected"),
    [
        ("GpuXid", "GpuXid79", REBOOT),  # fallen off the bus: RESTART_BM
        ("GpuXid", "GpuXid119", DEVICE),  # GSP RPC timeout: RESET_GPU, one GPU's: the device first
        ("GpuXid", "GpuXid46", DEVICE),  # GPU timeout: RESET_GPU
        ("GpuXid", "GpuXid95", REBOOT),  # uncontained memory error: at the node
        ("GpuXid", "GpuXid140", REBOOT),  # unrecoverable ECC error escape: at the node
        ("GpuXid", "GpuXid48", REBOOT),  # double-bit ECC: at the node
        ("GpuXid", "GpuXid151", REBOOT),  # RESTART_VM
        ("GpuXid", "GpuXid64", REPLACE),  # row-remap failure
        ("GpuXid", "GpuXid142", REPLACE),  # CONTACT_SUPPORT
        ("GpuXid", "GpuXid13Repeated", REPORT),  # an application-level code, repeating
        ("GpuXid", "GpuXid78", REPORT),  # UPDATE_SWFW
        ("GpuXid", "GpuXid999", REPORT),  # unknown
        ("GpuDriverError", "GpuFallenOffBus", REBOOT),
        ("GpuDriverError", "GpuSomethingNew", REPORT),
        ("NeuronHealth", "NeuronHasError_DMA_ERROR", REPLACE),  # the seed's
    ],
)
def test_the_built_in_first_remedy(condition, reason, expected):
    assert first(reason, condition) == expected


def test_the_device_first_codes_are_one_gpus_resets_and_contained_errors():
    actions = catalog()
    assert {actions[c] for c in xid.DEVICE_FIRST} <= {"RESET_GPU", "RESTART_APP"}
    assert {c for c in xid.DEVICE_FIRST if actions[c] == "RESTART_APP"} == set(xid.CONTAINED)
    # uncorrectable memory and the GPU gone from the bus stay at the node
    assert not set(xid.DEVICE_FIRST) & {*xid.UNCORRECTABLE_MEMORY, *xid.RESTART_BM, *xid.RESTART_VM}


def test_the_device_rule_goes_first_and_falls_back_to_the_reboot_ladder():
    rule = rule_for(
        DEFAULT_POLICY,
        Condition(type="GpuXid", status=Status.TRUE, reason="GpuXid119", message="", last_transition=0, last_update=0),
        DEFAULT_POLICY.rules[0].sources[0],
    )
    assert rule is not None
    assert rule[1].scope is Scope.DEVICE and rule[1].max_devices == 2
    assert rule[1].node_actions == (Action.CORDON,) and rule[1].ladder == (Remedy.REBOOT, Remedy.REPLACE)
