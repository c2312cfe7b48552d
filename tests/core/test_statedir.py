"""The state directory keeps a per-device problem per device across a restart (agent.core.statedir):
``conditions.json`` carries each True condition's devices (DeviceProblem.to_json), read back through a
validated decoder; a corrupt device entry is dropped and logged, the condition kept."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from agent.core.devices import BadDevice, DeviceKind, DeviceProblem, DeviceRef, device_from, device_problem_from_json
from agent.core.state import NodeState
from agent.core.statedir import CONDITIONS_FILE, ConditionStore, StateDirHealth
from agent.core.types import ConditionSpec, Finding, RuleType, Severity, Status

UUID0 = "GPU-5a1c0a7e-0000-4000-8000-000000000000"
SPECS = (
    ConditionSpec(type="GpuXid", reason="GpuXidGood", message="GPU XID is ok", clear_after=600.0, source="nvidia"),
)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def gpu(pci: str, *, uuid: str | None = None) -> DeviceRef:
    ref = device_from(DeviceKind.GPU, pci)
    assert ref is not None
    return DeviceRef(kind=ref.kind, id=ref.id, printed=pci, pci=ref.pci, index=3, uuid=uuid, present=True)


A, B = gpu("0000:3b:00", uuid=UUID0), gpu("0000:5d:00")


def xid(device: DeviceRef | None, *, status: Status = Status.TRUE, reason: str = "GpuXid79") -> Finding:
    return Finding(
        rule="nvidia/xid",
        type=RuleType.PERMANENT,
        condition="GpuXid",
        reason=reason,
        severity=Severity.CRITICAL,
        message="NVRM: Xid 79",
        timestamp=990.0,
        source="nvidia-monitor",
        status=status,
        device=device,
    )


def failing(*devices: DeviceRef | None) -> NodeState:
    state = NodeState(conditions=SPECS, clock=Clock())
    for device in devices:
        state.apply(xid(device))
    return state


def restarted(tmp_path: Path, before: NodeState) -> NodeState:
    """Save ``before``'s conditions to the state directory, then a fresh state restored from it."""
    store = ConditionStore(health=StateDirHealth(path=tmp_path))
    store.save(before.snapshot().conditions)
    kept = store.load()
    assert kept is not None
    after = NodeState(conditions=SPECS, clock=Clock(2000.0), seeded=False)
    after.restore(kept)
    return after


def test_a_restart_restores_each_device_problem_as_it_was(tmp_path):
    before = failing(A, B).snapshot().condition("GpuXid")
    after = restarted(tmp_path, failing(A, B)).snapshot().condition("GpuXid")
    assert before is not None and after is not None
    assert after.devices == before.devices and [d.device.key for d in after.devices] == [A.key, B.key]
    assert (after.status, after.reason, after.message) == (before.status, before.reason, before.message)


def test_a_restored_device_heals_alone_and_the_message_names_only_those_left(tmp_path):
    state = restarted(tmp_path, failing(A, B))
    assert state.apply(xid(A, status=Status.FALSE, reason="GpuXidGood")) == []  # B still holds it
    cond = state.snapshot().condition("GpuXid")
    assert cond is not None and cond.status is Status.TRUE and [d.device.key for d in cond.devices] == [B.key]
    assert cond.message == "NVRM: Xid 79 [devices: gpu 0000:5d:00.0 (index 3)]"  # named once, not twice
    applied, _, events = state.clear("GpuXid", device=B.key, force=False, note="alice")
    assert applied and [e.status for e in events] == [Status.FALSE]  # the last device cleared: healthy


def test_a_restored_problem_that_named_no_device_stays_the_nodes(tmp_path):
    state = restarted(tmp_path, failing(None))
    assert state.apply(xid(A, status=Status.FALSE, reason="GpuXidGood")) == []
    cond = state.snapshot().condition("GpuXid")
    assert cond is not None and cond.status is Status.TRUE and cond.devices == ()


def good_entry(device: DeviceRef = B) -> dict[str, object]:
    return DeviceProblem(
        device=device, reason="GpuXid79", severity=Severity.CRITICAL, since=1000.0, last_update=1000.0
    ).to_json()


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        pytest.param("gpu:0000:3b:00.0", "not an object", id="a string"),
        pytest.param({**good_entry(A), "kind": "fpga"}, "kind", id="unknown kind"),
        pytest.param({**good_entry(A), "kind": ["gpu"]}, "kind", id="kind not a string"),
        pytest.param({**good_entry(A), "id": "0000:3B:00"}, "id", id="id not canonical"),
        pytest.param({**good_entry(A), "id": "x" * 300}, "id", id="id too long"),
        pytest.param({**good_entry(A), "id": 7}, "id", id="id a number"),
        pytest.param({**good_entry(A), "index": True}, "index", id="index a boolean"),
        pytest.param({**good_entry(A), "index": -1}, "index", id="index negative"),
        pytest.param({**good_entry(A), "pci": "somewhere"}, "pci", id="pci not an address"),
        pytest.param({**good_entry(A), "present": "yes"}, "present", id="present not a boolean"),
        pytest.param({**good_entry(A), "severity": "dire"}, "severity", id="unknown severity"),
        pytest.param({**good_entry(A), "reason": ""}, "reason", id="empty reason"),
        pytest.param({**good_entry(A), "since": "yesterday"}, "since", id="since not a number"),
        pytest.param({**good_entry(A), "lastUpdate": float("inf")}, "lastUpdate", id="lastUpdate infinite"),
        pytest.param({**good_entry(A), "uuid": {"a": 1}}, "uuid", id="uuid not a string"),
    ],
)
def test_a_corrupt_device_entry_is_dropped_and_logged_the_condition_kept(tmp_path, caplog, entry, field):
    with pytest.raises(BadDevice, match=field):
        device_problem_from_json(entry)
    state = failing(A, B)
    store = ConditionStore(health=StateDirHealth(path=tmp_path))
    store.save(state.snapshot().conditions)
    path = tmp_path / CONDITIONS_FILE
    data = json.loads(path.read_text())
    (cond,) = [c for c in data["conditions"] if c["type"] == "GpuXid"]
    cond["devices"][0] = entry
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        kept = store.load()
    assert kept is not None
    (restored,) = [c for c in kept if c.type == "GpuXid"]
    assert restored.status is Status.TRUE and [d.device.key for d in restored.devices] == [B.key]
    (said,) = [r.getMessage() for r in caplog.records if "device entry" in r.getMessage()]
    assert "condition GpuXid: device entry 0 dropped" in said and field in said


@pytest.mark.parametrize(
    ("devices", "keys"),
    [
        pytest.param(None, [], id="a file of an older agent: none"),
        pytest.param("gpu:0000:3b:00.0", [], id="not a list: none"),
        pytest.param([good_entry(A), good_entry(A)], [A.key], id="a device twice: once"),
        pytest.param([3, {"kind": "gpu"}], [], id="every entry corrupt: none, the node's problem"),
    ],
)
def test_what_a_condition_restores_of_its_devices(tmp_path, devices, keys):
    store = ConditionStore(health=StateDirHealth(path=tmp_path))
    store.save(failing(A).snapshot().conditions)
    path = tmp_path / CONDITIONS_FILE
    data = json.loads(path.read_text())
    for cond in data["conditions"]:
        cond.pop("devices")
        if cond["type"] == "GpuXid" and devices is not None:
            cond["devices"] = devices
    path.write_text(json.dumps(data))
    kept = store.load()
    assert kept is not None
    (restored,) = [c for c in kept if c.type == "GpuXid"]
    assert restored.status is Status.TRUE and [d.device.key for d in restored.devices] == keys
    state = NodeState(conditions=SPECS, clock=Clock(2000.0), seeded=False)
    state.restore(kept)
    if not keys:  # no device left: held by the node until it heals or is cleared whole
        assert state.apply(xid(A, status=Status.FALSE, reason="GpuXidGood")) == []
        assert state.snapshot().condition("GpuXid").status is Status.TRUE


def test_a_healthy_condition_keeps_no_devices(tmp_path):
    state = failing(A)
    state.apply(xid(A, status=Status.FALSE, reason="GpuXidGood"))
    after = restarted(tmp_path, state).snapshot().condition("GpuXid")
    assert after is not None and after.status is Status.FALSE and after.devices == ()
