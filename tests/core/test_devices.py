"""Devices a finding names: the forms printed, the resolver over fixture trees, NodeState's per-device fold.

The fixture trees hold what the drivers really write: ``/proc/driver/nvidia/gpus/<pci>/information`` as
``nv_procfs_read_gpu_info`` prints it (NVIDIA/open-gpu-kernel-modules ``kernel-open/nvidia/nv-procfs.c``:
``"GPU UUID: \\t %s\\n"``, ``"Bus Location: \\t %04x:%02x:%02x.%x\\n"``, ``"Device Minor: \\t %u\\n"``; the
directory named ``"%04x:%02x:%02x.%1x"`` by ``nv_procfs_add_gpu``), ``/dev/neuron<N>`` and the
``neuron_device`` class (aws-neuron-driver ``neuron_cdev.c``), ``/sys/class/infiniband/<name>/device``
linking to the PCI device (Linux ``drivers/infiniband/core/sysfs.c``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.core.deviceresolver import DeviceResolver, read_nvidia_information
from agent.core.devices import DeviceKind, DeviceRef, device_from, normalize_pci
from agent.core.state import NodeState
from agent.core.types import ConditionSpec, Finding, RuleType, Severity, Status


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:3b:00", "0000:3b:00.0"),  # the Xid printer: "PCI:%04x:%02x:%02x", no function (kernel_rc.c)
        ("0009:01:00", "0009:01:00.0"),  # GB200: a non-zero domain
        ("0000:3B:00.0", "0000:3b:00.0"),  # upper case
        ("3b:00.1", "0000:3b:00.1"),  # no domain (some prints)
        ("00000009:01:00.0", "0009:01:00.0"),  # a domain printed 8 digits wide
        ("0001:ff:1f.7", "0001:ff:1f.7"),  # the largest slot and function
        ("0000:3b:20.0", None),  # slot 0x20 does not exist (5 bits)
        ("0000:3b:00.8", None),  # function 8 does not exist (3 bits)
        ("<unknown>", None),
        ("", None),
        ("3b", None),
    ],
)
def test_normalize_pci(text: str, expected: str | None) -> None:
    assert normalize_pci(text) == expected


@pytest.mark.parametrize(
    ("kind", "value", "key"),
    [
        (DeviceKind.GPU, "0000:84:00", "gpu:0000:84:00.0"),
        (DeviceKind.GPU, "not-an-address", None),  # the fallback rule's group takes any text: node-scoped
        (DeviceKind.NEURON, 0, "neuron:neuron0"),  # nd-id=0 (fieldTypes: int)
        (DeviceKind.NEURON, "12", "neuron:neuron12"),
        (DeviceKind.NEURON, "neuron3", "neuron:neuron3"),
        (DeviceKind.NEURON, "nd3", "neuron:neuron3"),
        (DeviceKind.NEURON, "x", None),
        (DeviceKind.RDMA, "efa_0", "rdma:efa_0"),
        (DeviceKind.RDMA, "rdmap0s29", "rdma:rdmap0s29"),
        (DeviceKind.RDMA, "0000:17:00.1", "rdma:0000:17:00.1"),
        (DeviceKind.RDMA, "(null)", None),  # ibdev_printk before the device has a name
    ],
)
def test_device_from(kind: DeviceKind, value: object, key: str | None) -> None:
    ref = device_from(kind, value)
    assert (ref.key if ref else None) == key


# ---- the resolver over fixture trees -------------------------------------------------------------

UUID0 = "GPU-5a1c7e2d-9f3b-4c61-8d0e-2b7f4a9c1e30"
UUID1 = "GPU-0b8e11f2-4d7a-4e2c-9a65-c3d1f0e7b812"


def information(*, uuid: str, bus: str, minor: int) -> str:
    """The file as nv_procfs_read_gpu_info prints it (nv-procfs.c), in its order."""
    return (
        "Model: \t\t NVIDIA H100 80GB HBM3\n"
        "IRQ:   \t\t 353\n"
        f"GPU UUID: \t {uuid}\n"
        "Video BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        f"Bus Location: \t {bus}\n"
        f"Device Minor: \t {minor}\n"
        "GPU Firmware: \t 550.54.15\n"
        "GPU Excluded:\t No\n"
    )


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    sys_root, proc, dev = tmp_path / "sys", tmp_path / "proc", tmp_path / "dev"
    for bus, uuid, minor in (("0000:3b:00.0", UUID0, 0), ("0000:5d:00.0", UUID1, 1)):
        (sys_root / "bus/pci/devices" / bus).mkdir(parents=True)
        gpu = proc / "driver/nvidia/gpus" / bus
        gpu.mkdir(parents=True)
        (gpu / "information").write_text(information(uuid=uuid, bus=bus, minor=minor))
    dev.mkdir()
    (dev / "neuron3").touch()
    (sys_root / "devices/virtual/neuron_device/neuron3").mkdir(parents=True)
    efa_pci = sys_root / "devices/pci0000:00/0000:00:1c.0"
    (efa_pci / "infiniband/efa_0").mkdir(parents=True)
    (sys_root / "bus/pci/devices/0000:00:1c.0").symlink_to(efa_pci)
    (sys_root / "class/infiniband/efa_0").mkdir(parents=True)
    os.symlink(efa_pci, sys_root / "class/infiniband/efa_0/device")
    return {"sys_root": sys_root, "proc_root": proc, "dev_root": dev}


def test_information_lines() -> None:
    assert read_nvidia_information(information(uuid=UUID1, bus="0000:5d:00.0", minor=1)) == (UUID1, 1)
    assert read_nvidia_information("Model: \t\t x\nGPU Excluded:\t No\n") == (None, None)


@pytest.mark.parametrize(
    ("kind", "printed", "expected"),
    [
        (DeviceKind.GPU, "0000:5d:00", {"present": True, "index": 1, "uuid": UUID1, "pci": "0000:5d:00.0"}),
        (DeviceKind.GPU, "0000:3b:00", {"present": True, "index": 0, "uuid": UUID0}),
        (DeviceKind.GPU, "0000:99:00", {"present": False, "index": None, "uuid": None}),  # not on this node
        (DeviceKind.NEURON, "3", {"present": True, "index": 3, "pci": None}),  # sysfs has no PCI link for it
        (DeviceKind.NEURON, "7", {"present": False}),
        (DeviceKind.RDMA, "efa_0", {"present": True, "pci": "0000:00:1c.0"}),
        (DeviceKind.RDMA, "0000:00:1c.0", {"present": True, "name": "efa_0"}),
        (DeviceKind.RDMA, "mlx5_9", {"present": False, "pci": None}),
    ],
)
def test_resolver(roots: dict[str, Path], kind: DeviceKind, printed: str, expected: dict[str, object]) -> None:
    ref = device_from(kind, printed)
    assert ref is not None
    resolved = DeviceResolver(**roots).resolve(ref)
    assert {k: getattr(resolved, k) for k in expected} == expected
    assert resolved.key == ref.key and resolved.printed == printed


def test_resolver_remembers_and_looks_again_for_a_missing_device(roots: dict[str, Path]) -> None:
    now = [0.0]
    resolver = DeviceResolver(**roots, retry=60.0, clock=lambda: now[0])
    ref = device_from(DeviceKind.NEURON, "5")
    assert ref is not None
    assert not resolver.resolve(ref).present
    (roots["dev_root"] / "neuron5").touch()  # the driver loads later
    assert not resolver.resolve(ref).present  # remembered: a storm of lines costs one look
    now[0] = 61.0
    assert resolver.resolve(ref).present


def test_resolver_unreadable_root_says_nothing(tmp_path: Path) -> None:
    ref = device_from(DeviceKind.GPU, "0000:3b:00")
    assert ref is not None
    assert DeviceResolver(sys_root=tmp_path / "no", proc_root=tmp_path / "no", dev_root=tmp_path / "no").resolve(
        ref
    ) == DeviceRef(kind=DeviceKind.GPU, id="0000:3b:00.0", printed="0000:3b:00", pci="0000:3b:00.0")


# ---- NodeState: the per-device fold --------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


SPECS = (
    ConditionSpec(type="GpuXid", reason="GpuXidGood", message="GPU XID is ok", clear_after=600.0, source="nvidia"),
    ConditionSpec(type="GpuHealth", reason="GpuHealthy", message="GPUs healthy", source="check"),
)


def gpu(pci: str, *, uuid: str | None = None) -> DeviceRef:
    ref = device_from(DeviceKind.GPU, pci)
    assert ref is not None
    return DeviceRef(kind=ref.kind, id=ref.id, printed=pci, pci=ref.pci, uuid=uuid, present=True)


def xid(
    reason: str,
    device: DeviceRef | None,
    *,
    condition: str = "GpuXid",
    status: Status = Status.TRUE,
    severity: Severity = Severity.CRITICAL,
) -> Finding:
    return Finding(
        rule="nvidia/xid-node",
        type=RuleType.PERMANENT,
        condition=condition,
        reason=reason,
        severity=severity,
        message=f"NVRM: Xid {reason}",
        timestamp=990.0,
        source="nvidia-monitor",
        status=status,
        device=device,
    )


A, B = gpu("0000:3b:00", uuid=UUID0), gpu("0000:5d:00")


def test_two_gpus_fail_then_one_heals_by_quiet() -> None:
    clock = Clock()
    state = NodeState(conditions=SPECS, clock=clock)
    assert [e.status for e in state.apply(xid("GpuXid79", A))] == [Status.TRUE]
    generation = state.generation
    clock.now = 1100.0
    assert state.apply(xid("GpuXid79", B)) == []  # same reason: no new transition Event ...
    cond = state.snapshot().condition("GpuXid")
    assert cond is not None and state.generation > generation  # ... but the Node's message must change
    assert [d.device.key for d in cond.devices] == ["gpu:0000:3b:00.0", "gpu:0000:5d:00.0"]
    assert cond.devices[0].since == 1000.0 and cond.devices[1].since == 1100.0
    assert cond.message.endswith(f"[devices: gpu 0000:3b:00.0 ({UUID0}); gpu 0000:5d:00.0]")
    assert state.next_expiry() == 1600.0  # A's quiet period ends first
    clock.now = 1650.0  # A quiet for clearAfter, B not: A alone heals
    assert state.expire() == []
    cond = state.snapshot().condition("GpuXid")
    assert cond is not None and cond.status is Status.TRUE
    assert [d.device.key for d in cond.devices] == ["gpu:0000:5d:00.0"]
    assert "3b:00" not in cond.message
    clock.now = 1700.0  # B quiet too: the condition heals as before, naming no device
    assert [e.status for e in state.expire()] == [Status.FALSE]
    cond = state.snapshot().condition("GpuXid")
    assert cond is not None and cond.devices == () and "devices" not in cond.message


def test_a_healthy_finding_about_one_device_closes_only_its_problem() -> None:
    state = NodeState(conditions=SPECS, clock=Clock())
    state.apply(xid("GpuLost", A, condition="GpuHealth"))
    state.apply(xid("GpuLost", B, condition="GpuHealth"))
    assert state.apply(xid("GpuHealthy", A, condition="GpuHealth", status=Status.FALSE)) == []
    cond = state.snapshot().condition("GpuHealth")
    assert cond is not None and cond.status is Status.TRUE and [d.device.id for d in cond.devices] == ["0000:5d:00.0"]
    events = state.apply(xid("GpuHealthy", B, condition="GpuHealth", status=Status.FALSE))
    assert [(e.status, e.reason) for e in events] == [(Status.FALSE, "GpuHealthy")]


def test_a_problem_that_names_no_device_keeps_the_condition() -> None:
    state = NodeState(conditions=SPECS, clock=Clock())
    state.apply(xid("GpuLost", A, condition="GpuHealth"))
    state.apply(xid("GpuLost", None, condition="GpuHealth"))  # node-scoped: "rm_init_adapter failed" etc.
    assert state.apply(xid("GpuHealthy", A, condition="GpuHealth", status=Status.FALSE)) == []
    cond = state.snapshot().condition("GpuHealth")
    assert cond is not None and cond.status is Status.TRUE and cond.devices == ()
    assert cond.message == "NVRM: Xid GpuLost"


def test_findings_without_a_device_fold_as_before() -> None:
    state = NodeState(conditions=SPECS, clock=Clock())
    events = state.apply(xid("GpuXid79", None))
    assert events[0].message == "Node condition GpuXid is now: True, reason: GpuXid79, message: 'NVRM: Xid GpuXid79'"
    cond = state.snapshot().condition("GpuXid")
    assert cond is not None and cond.devices == () and cond.message == "NVRM: Xid GpuXid79"


def test_a_weaker_finding_never_replaces_a_device_reason() -> None:
    state = NodeState(conditions=SPECS, clock=Clock())
    state.apply(xid("GpuXid79", A))
    state.apply(xid("GpuXid13", A, severity=Severity.WARNING))
    cond = state.snapshot().condition("GpuXid")
    assert cond is not None and [(d.reason, d.severity) for d in cond.devices] == [("GpuXid79", Severity.CRITICAL)]
