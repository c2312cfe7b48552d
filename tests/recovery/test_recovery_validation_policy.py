"""The policy file's validation sets: ``validation`` per rule and as the policy's default, and
``startupValidation``; every problem names the file, the line and the field, ``validate-config`` exits 2, and
``--print-policy`` loads back to the same policy."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.core.errors import ConfigError
from agent.recovery.model import OnFail, RecoveryPolicy, StartupValidation, ValidationSettings
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


VALIDATED = """
base: none
validation:
  checks: [dcgm-diag]
startupValidation:
  checks: [dcgm-diag, nccl-loopback]
rules:
  - condition: GpuXid
    ladder: [reboot, replace]
    validation:
      checks: [dcgm-diag, nccl-loopback]
      timeout: 45m
      onFail: hold
      maxAttempts: 3
  - condition: NeuronHealth
    ladder: [reboot, replace]
"""


def test_a_rule_s_own_set_and_the_policy_s_default(tmp_path):
    policy = load_policy(write(tmp_path, VALIDATED))
    gpu, neuron = policy.rules
    assert gpu.validation == ValidationSettings(
        checks=("dcgm-diag", "nccl-loopback"), timeout=2700.0, on_fail=OnFail.HOLD, max_attempts=3
    )
    assert neuron.validation is None
    assert policy.validation_of(neuron) == ValidationSettings(checks=("dcgm-diag",))  # 30m, climb, 2
    assert policy.validation_of(gpu) is gpu.validation
    assert policy.startup_validation == StartupValidation(checks=("dcgm-diag", "nccl-loopback"), taint=True)
    assert any(line.startswith("validation: dcgm-diag pass within 30m") for line in policy_summary(policy))


def test_no_validation_set_is_today_s_behaviour_and_the_summary_says_so(tmp_path):
    policy = load_policy(write(tmp_path, "base: none\nrules:\n  - {condition: GpuXid, ladder: [reboot]}\n"))
    assert policy.validation is None and policy.validation_of(policy.rules[0]) is None
    assert policy.startup_validation is None
    assert "returns after its quiet window alone" in "\n".join(policy_summary(policy))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "validation: {timeout: 5m}\n",
            [
                "policy.yaml:1: validation.checks: must be a non-empty list of check names, e.g. "
                "[dcgm-diag, nccl-loopback]"
            ],
        ),
        (
            "validation:\n  checks: [dcgm-diag, dcgm-diag]\n",
            ["policy.yaml:2: validation.checks[1]: dcgm-diag is listed twice"],
        ),
        (
            "validation:\n  checks: [dcgm-diag]\n  onFail: retry\n",
            ["policy.yaml:3: validation.onFail: must be one of climb, hold, got 'retry'"],
        ),
        (
            "validation:\n  checks: [dcgm-diag]\n  timeout: 0s\n",
            ["policy.yaml:3: validation.timeout: must be longer than 0, got '0s'"],
        ),
        (
            "validation:\n  checks: [dcgm-diag]\n  maxAttempts: 0\n",
            ["policy.yaml:3: validation.maxAttempts: must be an integer of at least 1, got 0"],
        ),
        (
            "validation:\n  checks: [dcgm-diag]\n  onfail: hold\n",
            ["policy.yaml:3: validation.onfail: unknown key 'onfail' (did you mean 'onFail'?)"],
        ),
        (
            "validation: [dcgm-diag]\n",
            [
                "policy.yaml:1: validation: must be a mapping: {checks: [...], timeout: 30m, "
                "onFail: climb | hold, maxAttempts: 2}"
            ],
        ),
        (
            "base: none\nrules:\n  - condition: GpuXid\n    ladder: [reboot]\n"
            "    validation:\n      checks: ['bad name']\n",
            [
                "policy.yaml:6: rules[0].validation.checks[0]: must be a check name (letters, digits and _.-), "
                "got 'bad name'"
            ],
        ),
        (
            "startupValidation:\n  checks: [dcgm-diag]\n  taint: yes please\n",
            ["policy.yaml:3: startupValidation.taint: must be true or false, got 'yes please'"],
        ),
    ],
)
def test_problems_name_the_file_the_line_and_the_field(tmp_path, text, expected):
    assert problems(tmp_path, text) == expected


def test_validate_config_refuses_a_bad_set_with_exit_2(tmp_path, capsys):
    path = write(tmp_path, "validation:\n  checks: []\n")
    assert main(["validate-config", "--recovery-policy", str(path)]) == 2
    assert "validation.checks" in capsys.readouterr().err


def test_print_policy_shows_the_sets_and_loads_back(tmp_path, capsys):
    assert main(["validate-config", "--print-policy", "--recovery-policy", str(write(tmp_path, VALIDATED))]) == 0
    printed = capsys.readouterr().out
    assert "onFail: hold" in printed and "startupValidation:" in printed
    again = load_policy(write(tmp_path, printed, "printed.yaml"))
    assert without_sources(again) == without_sources(load_policy(tmp_path / "policy.yaml"))
