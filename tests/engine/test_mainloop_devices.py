"""Per-device state through the main loop (the one writer): kernel lines naming two GPUs, one healing, as
``/conditions``, the Node condition's message and ``node_health_agent_device_problem`` show it."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.config import load_rule_set
from agent.core.bus import RecordBatch
from agent.core.deviceresolver import DeviceResolver
from agent.sinks.metrics import AgentCollector, build_registry
from agent.sinks.stdout import snapshot_json

from helpers.mainloop import Loop, record
from helpers.sinks import IDLE_STATS

PACK = """
source: nvidia-monitor
conditions:
  - {type: GpuXid, reason: GpuXidGood, message: GPU XID is ok, clearAfter: 10m}
rules:
  - name: nvidia/xid
    type: permanent
    condition: GpuXid
    reason: 'GpuXid{xid}'
    severity: critical
    pattern: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-fA-F:.]+)\\): (?P<xid>\\d+),.*'
    device: {kind: gpu, field: pci}
"""
UUIDS = {
    "0000:3b:00.0": "GPU-5a1c7e2d-9f3b-4c61-8d0e-2b7f4a9c1e30",
    "0000:5d:00.0": "GPU-0b8e11f2-4d7a-4e2c-9a65-c3d1f0e7b812",
}
STATS = IDLE_STATS


def node(tmp_path: Path) -> DeviceResolver:
    """Two GPUs as the NVIDIA driver shows them (nv-procfs.c nv_procfs_read_gpu_info)."""
    for minor, (bus, uuid) in enumerate(UUIDS.items()):
        (tmp_path / "sys/bus/pci/devices" / bus).mkdir(parents=True)
        gpu = tmp_path / "proc/driver/nvidia/gpus" / bus
        gpu.mkdir(parents=True)
        (gpu / "information").write_text(
            f"Model: \t\t NVIDIA H100\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
        )
    return DeviceResolver(sys_root=tmp_path / "sys", proc_root=tmp_path / "proc", dev_root=tmp_path / "dev")


def device_series(loop: Loop) -> dict[tuple[str, str, str], float]:
    registry = build_registry(AgentCollector(snapshot=loop.state.snapshot, stats=lambda: STATS))
    return {
        (s.labels["device"], s.labels["condition"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "node_health_agent_device_problem"
    }


def gpu_xid(loop: Loop) -> dict:
    return next(c for c in snapshot_json(loop.state.snapshot())["conditions"] if c["type"] == "GpuXid")


def test_two_gpus_fail_one_heals(tmp_path: Path) -> None:
    pack = tmp_path / "pack.yaml"
    pack.write_text(PACK, encoding="utf-8")
    state = tmp_path / "state"
    state.mkdir()
    loop = Loop(load_rule_set([pack]), state, devices=node(tmp_path))
    t0 = loop.clock.now
    loop.put(RecordBatch(records=[record(1, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", ts=t0)]))
    loop.step()
    loop.clock.now = t0 + 300
    loop.put(RecordBatch(records=[record(2, "NVRM: Xid (PCI:0000:5d:00): 79, pid=7, name=x, Ch 1", ts=t0 + 300)]))
    loop.put(RecordBatch(records=[record(3, "NVRM: Xid (PCI:0000:99:00): 79, pid=7, name=x, Ch 1", ts=t0 + 300)]))
    loop.step()

    cond = gpu_xid(loop)
    assert cond["status"] == "True"
    assert [(d["id"], d.get("index"), d.get("uuid"), d["present"]) for d in cond["devices"]] == [
        ("0000:3b:00.0", 0, UUIDS["0000:3b:00.0"], True),
        ("0000:5d:00.0", 1, UUIDS["0000:5d:00.0"], True),
        ("0000:99:00.0", None, None, False),  # a line may name any address: not on this node
    ]
    assert "gpu 0000:3b:00.0 (index 0, GPU-5a1c" in cond["message"]
    assert device_series(loop) == {
        ("gpu:0000:3b:00.0", "GpuXid", "GpuXid79"): 1.0,
        ("gpu:0000:5d:00.0", "GpuXid", "GpuXid79"): 1.0,
        ("Other", "GpuXid", "GpuXid79"): 1.0,
    }

    loop.clock.now = t0 + 650  # 3b:00 quiet for clearAfter (10m); the others seen 350 s ago
    loop.step()
    cond = gpu_xid(loop)
    assert cond["status"] == "True" and [d["id"] for d in cond["devices"]] == ["0000:5d:00.0", "0000:99:00.0"]
    assert cond["message"].endswith(
        "[devices: gpu 0000:5d:00.0 (index 1, GPU-0b8e11f2-4d7a-4e2c-9a65-c3d1f0e7b812); gpu 0000:99:00.0]"
    )
    assert ("gpu:0000:3b:00.0", "GpuXid", "GpuXid79") not in device_series(loop)

    loop.clock.now = t0 + 950
    loop.step()
    cond = gpu_xid(loop)
    assert cond["status"] == "False" and "devices" not in cond
    assert device_series(loop) == {}
