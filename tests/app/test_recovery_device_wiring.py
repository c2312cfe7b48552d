"""The device scope's parts in the wiring (agent.app.wiring.recovery.device_parts): made only when recovery
acts with a ``scope: device`` rule; the DRA fence, holder lookup and pod Events come from their own modules,
imported by name (a build without the fence acts on the node, and says so)."""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import types
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


class FakeFencer:
    def __init__(self, *, client: Any, node_name: str) -> None:
        self.client, self.node_name = client, node_name


def test_the_fence_is_built_from_its_module_when_there_is_one(monkeypatch):
    module = types.ModuleType("agent.recovery.fence")
    module.DeviceFencer = FakeFencer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agent.recovery.fence", module)
    made = parts(settings(enable_recovery=True))
    assert DEFAULT_POLICY.rules[2].scope is Scope.DEVICE  # the built-in policy has a device rule
    assert isinstance(made["fencer"], FakeFencer) and made["fencer"].node_name == "node-1"
    assert made["device_drainer"] is not None
    assert made["holders"] is None and made["holder_teller"] is None  # --device-holders is off


def test_a_build_without_the_fence_says_so_and_fences_nothing(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "agent.recovery.fence", None)  # import fails: ModuleNotFoundError
    with caplog.at_level(logging.WARNING):
        made = parts(settings(enable_recovery=True))
    assert made["fencer"] is None and made["device_drainer"] is not None
    assert "no device fence in this build" in caplog.text
