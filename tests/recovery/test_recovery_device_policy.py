"""The policy file's device scope: ``scope: device``, ``maxDevices``, the device actions and the budget's
``maxDeviceActions``; every problem names the file, the line and the field, and ``validate-config`` exits 2."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.core.errors import ConfigError
from agent.recovery.model import Action, RecoveryPolicy, Remedy, Scope
from agent.recovery.policyfile import load_policy, policy_summary


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def without_sources(policy: RecoveryPolicy) -> RecoveryPolicy:
    return dataclasses.replace(policy, rules=tuple(dataclasses.replace(r, source="") for r in policy.rules))


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    return [str(p).replace(str(path), "policy.yaml") for p in info.value.problems]


DEVICE_RULE = """
base: none
rules:
  - condition: NeuronHealth
    reasons: ["NeuronHasError_*"]
    scope: device
    maxDevices: 1
    ladder: [replace]
budget:
  maxDeviceActions: 5
"""


@pytest.mark.parametrize(
    ("text", "scope", "actions", "max_devices"),
    [
        (DEVICE_RULE, Scope.DEVICE, (Action.FENCE_DEVICE, Action.DRAIN_DEVICE, Action.CORDON), 1),
        (  # the device's rung named: only the drain (a device-plugin node that isolates it itself)
            "base: none\nrules:\n  - {condition: GpuXid, scope: device, actions: [drain-device, cordon]}\n",
            Scope.DEVICE,
            (Action.DRAIN_DEVICE, Action.CORDON),
            2,
        ),
        (
            "base: none\nrules:\n  - {condition: GpuXid, scope: node, actions: [cordon]}\n",
            Scope.NODE,
            (Action.CORDON,),
            2,
        ),
        ("base: none\nrules:\n  - {condition: GpuXid, actions: [cordon]}\n", Scope.NODE, (Action.CORDON,), 2),
    ],
)
def test_scope_keys(tmp_path, text, scope, actions, max_devices):
    rule = load_policy(write(tmp_path, text)).rules[0]
    assert (rule.scope, rule.actions, rule.max_devices) == (scope, actions, max_devices)


def test_neuron_opts_into_the_device_scope_and_the_budget_sets_its_device_rate(tmp_path):
    policy = load_policy(write(tmp_path, DEVICE_RULE))
    assert policy.rules[0].ladder == (Remedy.REPLACE,)
    assert policy.rules[0].node_actions == (Action.CORDON,)
    assert policy.budget.max_device_actions == 5
    assert (
        "scope device (at most 1 at once): fence-device, drain-device, cordon; ladder replace"
        in (policy_summary(policy)[1])
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "rules:\n  - {condition: GpuXid, reasons: [GpuXid31], scope: devices, actions: [cordon]}\n",
            ["policy.yaml:2: rules[0].scope: must be one of node, device, got 'devices'"],
        ),
        (
            "rules:\n  - {condition: GpuXid, reasons: [GpuXid31], maxDevices: 3, actions: [cordon]}\n",
            [
                "policy.yaml:2: rules[0].maxDevices: counts the devices failing at once of a device rule: it needs "
                "scope: device"
            ],
        ),
        (
            "rules:\n  - {condition: GpuXid, reasons: [GpuXid31], actions: [fence-device, cordon]}\n",
            ["policy.yaml:2: rules[0].actions: fence-device and drain-device act on a device: they need scope: device"],
        ),
        (
            "rules:\n  - {condition: GpuXid, reasons: [GpuXid31], scope: device, maxDevices: 0}\n",
            ["policy.yaml:2: rules[0].maxDevices: must be an integer of at least 1, got 0"],
        ),
        (
            "rules:\n  - condition: GpuXid\n    reasons: [GpuXid31]\n    scope: device\n    maxDevices: two\n",
            ["policy.yaml:5: rules[0].maxDevices: must be an integer of at least 1, got 'two'"],
        ),
        (
            "rules:\n  - {condition: GpuXid, reasons: [GpuXid31], scope: device, actions: [fence-device, fence]}\n",
            [
                "policy.yaml:2: rules[0].actions[1]: unknown action 'fence' (known: fence-device, drain-device, "
                "cordon, taint, drain, mark-unhealthy)"
            ],
        ),
        (
            "budget:\n  maxDeviceActions: 0\n",
            ["policy.yaml:2: budget.maxDeviceActions: must be an integer of at least 1, got 0"],
        ),
    ],
)
def test_problems_name_file_line_and_field(tmp_path, text, expected):
    assert problems(tmp_path, text) == expected


def test_validate_config_refuses_a_bad_scope_with_exit_2(tmp_path, capsys):
    path = write(tmp_path, "rules:\n  - {condition: GpuXid, reasons: [GpuXid31], scope: gpu}\n")
    assert main(["validate-config", "--recovery-policy", str(path)]) == 2
    assert f"{path}:2: rules[0].scope" in capsys.readouterr().err


def test_print_policy_shows_the_scope_and_loads_back(tmp_path, capsys):
    assert main(["validate-config", "--print-policy", "--recovery-policy", str(write(tmp_path, DEVICE_RULE))]) == 0
    printed = capsys.readouterr().out
    assert "scope: device" in printed and "maxDevices: 1" in printed and "maxDeviceActions: 5" in printed
    again = load_policy(write(tmp_path, printed, "printed.yaml"))
    assert without_sources(again) == without_sources(load_policy(tmp_path / "policy.yaml"))
