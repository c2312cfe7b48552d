"""The device scope's parts in the wiring (agent.app.wiring.recovery.device_parts): made only when recovery
acts with a ``scope: device`` rule; the holder lookup (with ``--device-holders``) matches DRA devices by the
triples the fence reads from this node's ResourceSlices."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.app.settings import Settings
from agent.app.wiring.kube import KubeSetup
from agent.app.wiring.recovery import device_parts
from agent.core.bus import Inbox
from agent.recovery.model import PolicyRule, Scope
from agent.recovery.policyfile import DEFAULT_POLICY

NODE_POLICY = dataclasses.replace(DEFAULT_POLICY, rules=(PolicyRule(condition="NeuronHealth"),))
KUBE = KubeSetup(client=object(), node_name="node-1", node=None)  # type: ignore[arg-type]


def settings(*, enable_recovery: bool) -> Settings:
    return Settings(
        standalone=False, config_files=(), plugins_dirs=(), kmsg_path=Path("/nonexistent"), kmsg_relay=None,
        listen=None, state_dir=Path("/nonexistent"), lookback=300.0, stall_timeout=60.0, node_name="node-1",
        enable_recovery=enable_recovery,
    )  # fmt: skip


def parts(settings: Settings, policy: Any = DEFAULT_POLICY) -> dict[str, Any]:
    return device_parts(settings, kube=KUBE, policy=policy, inbox=Inbox(), clock=lambda: 0.0, stopping=threading.Event)


@pytest.mark.parametrize(
    ("enabled", "policy"),
    [(False, DEFAULT_POLICY), (True, NODE_POLICY)],
    ids=["report-only", "no-device-rule"],
)
def test_no_device_parts_unless_acting_with_a_device_rule(enabled, policy):
    assert set(parts(settings(enable_recovery=enabled), policy).values()) == {None}


def test_acting_with_a_device_rule_builds_the_fence_and_the_device_drain():
    from agent.recovery.fence import DeviceFencer

    made = parts(settings(enable_recovery=True))
    assert DEFAULT_POLICY.rules[2].scope is Scope.DEVICE  # the built-in policy has a device rule
    assert isinstance(made["fencer"], DeviceFencer)
    assert made["device_drainer"] is not None
    assert made["holders"] is None and made["holder_teller"] is None  # --device-holders is off


def test_device_holders_build_the_lookup_with_the_fences_dra_triples(tmp_path):
    from agent.core.devices import DeviceKind, device_from
    from agent.recovery.fence import DraDevice
    from agent.recovery.holderlookup import HolderLookup
    from agent.recovery.holdertell import HolderTeller

    on = dataclasses.replace(
        settings(enable_recovery=True), device_holders=True, pod_resources_socket=str(tmp_path / "kubelet.sock")
    )
    made = parts(on)
    assert isinstance(made["holders"], HolderLookup) and isinstance(made["holder_teller"], HolderTeller)
    gpu = device_from(DeviceKind.GPU, "0000:3b:00.0")
    assert gpu is not None
    made["fencer"].dra_device = lambda device: DraDevice(driver="gpu.nvidia.com", pool="node-1", device="gpu-3")
    assert made["holders"]._dra(gpu) == frozenset({("gpu.nvidia.com", "node-1", "gpu-3")})
    made["fencer"].dra_device = lambda device: None  # a device-plugin node: no triple
    assert made["holders"]._dra(gpu) == frozenset()
