"""A policy file extends the built-in policy (agent.recovery.policymerge): merged by condition and reason
set, ``base: none`` to start from no rule, the built-in rules left out named (validate-config, the
agent's log at start), and ``validate-config --print-policy`` printing a policy file that loads back
to the same policy."""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.app.commands.policy import left_out, log_left_out
from agent.core.errors import ConfigError
from agent.core.types import Condition, Provenance, Status
from agent.recovery.model import Action, RecoveryPolicy, Remedy
from agent.recovery.policy import rule_for
from agent.recovery.policyfile import DEFAULT_POLICY, DEFAULT_RULES, load_policy

KERNEL = Provenance.KERNEL_LOG
REBOOT_FIRST = (Remedy.REBOOT, Remedy.REPLACE)

# docs/recovery.md, "Scheduled maintenance": the snippet as an operator copies it into a policy file.
SCHEDULED_SNIPPET = """
rules:
  - condition: ScheduledMaintenance
    actions: [cordon, drain]
    leadTime: 1h        # cordon and drain this long before NotBefore (default 1h)
"""


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def true(type_: str, reason: str) -> Condition:
    return Condition(type=type_, status=Status.TRUE, reason=reason, message="", last_transition=0.0, last_update=0.0)


def governing(policy: RecoveryPolicy, type_: str, reason: str):
    hit = rule_for(policy, true(type_, reason), KERNEL)
    assert hit is not None, (type_, reason)
    return hit[1]


def without_sources(policy: RecoveryPolicy) -> RecoveryPolicy:
    return dataclasses.replace(policy, rules=tuple(dataclasses.replace(r, source="") for r in policy.rules))


# ---- the bar: a one-rule policy file keeps the built-in rules ------------------------------------


def test_the_documented_one_rule_file_keeps_the_built_in_xid79_reboot(tmp_path):
    path = write(tmp_path, SCHEDULED_SNIPPET)
    policy = load_policy(path)
    assert len(policy.rules) == len(DEFAULT_RULES) + 1
    assert policy.rules[1:] == DEFAULT_RULES  # the built-in rules, as built in
    added = governing(policy, "ScheduledMaintenance", "ScheduledInstanceRetirement")
    assert (added.actions, added.lead_time, added.source) == ((Action.CORDON, Action.DRAIN), 3600.0, f"{path}:2")
    xid79 = governing(policy, "GpuXid", "GpuXid79")
    assert (xid79.ladder, xid79.source) == (REBOOT_FIRST, "built-in")
    assert governing(policy, "NeuronHealth", "NeuronHasError_DMA_ERROR").actions == (
        Action.CORDON,
        Action.MARK_UNHEALTHY,
    )
    assert left_out(policy) == []


def test_base_none_starts_from_no_rule_and_names_every_built_in_rule_left_out(tmp_path, caplog):
    path = write(tmp_path, "base: none\n" + textwrap.dedent(SCHEDULED_SNIPPET).lstrip("\n"))
    policy = load_policy(path)
    assert [r.condition for r in policy.rules] == ["ScheduledMaintenance"]
    assert rule_for(policy, true("GpuXid", "GpuXid79"), KERNEL) is None
    lines = left_out(policy)
    assert len(lines) == len(DEFAULT_RULES)
    assert lines[0] == "NeuronHealth [NeuronHasError_*]: left out: the policy starts from no rule (base: none)"
    assert any(line.startswith("GpuXid [GpuXid46, GpuXid48, GpuXid62, GpuXid74, GpuXid79,") for line in lines)
    with caplog.at_level(logging.WARNING, logger="agent.app.commands.policy"):
        log_left_out(policy, path)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert f"recovery policy {path}: {len(DEFAULT_RULES)} built-in rule(s) not in force" in record.getMessage()
    assert all(line in record.getMessage() for line in lines)


def test_no_file_and_a_file_keeping_every_built_in_rule_log_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="agent.app.commands.policy"):
        log_left_out(DEFAULT_POLICY, None)
        log_left_out(load_policy(write(tmp_path, SCHEDULED_SNIPPET)), tmp_path / "policy.yaml")
    assert caplog.records == []


def test_base_none_without_rules_has_no_rule(tmp_path):
    policy = load_policy(write(tmp_path, "base: none\n"))
    assert policy.rules == ()
    assert load_policy(write(tmp_path, "base: none\nrules: []\n")).rules == ()
    assert load_policy(write(tmp_path, "base: builtin\n")).rules == DEFAULT_RULES


# ---- merged by key --------------------------------------------------------------------------------------

XID_REBOOT_REASONS = DEFAULT_RULES[3].reasons  # the built-in reboot-first Xids (after the device-first ones)


@pytest.mark.parametrize(
    ("rules", "expected", "left"),
    [
        # The key of a built-in rule (condition and reason set, in any order): replaces it, in its place.
        (
            "- {condition: GpuEcc, reasons: [GpuRetiredPagesPending, GpuEccUncorrectable, GpuRowRemapPending], "
            "ladder: [replace]}",
            {
                ("GpuEcc", "GpuEccUncorrectable"): ("file", 8, (Remedy.REPLACE,)),
                ("GpuXid", "GpuXid79"): ("built-in", 3, REBOOT_FIRST),
            },
            ["GpuEcc [GpuEccUncorrectable, GpuRowRemapPending, GpuRetiredPagesPending]: replaced by {file}:1"],
        ),
        # A built-in catch-all replaced: the built-in rules for named reasons still come first.
        (
            "- {condition: GpuXid, actions: [cordon, taint]}",
            {("GpuXid", "GpuXid13Repeated"): ("file", 4, ()), ("GpuXid", "GpuXid79"): ("built-in", 3, REBOOT_FIRST)},
            ["GpuXid [any reason]: replaced by {file}:1"],
        ),
        # A new, narrower rule goes ahead of the built-in rules: it governs its reason, the others keep theirs.
        (
            "- {condition: GpuXid, reasons: [GpuXid79], ladder: [replace]}",
            {
                ("GpuXid", "GpuXid79"): ("file", 0, (Remedy.REPLACE,)),
                ("GpuXid", "GpuXid95"): ("built-in", 4, REBOOT_FIRST),
                ("GpuXid", "GpuXid46"): ("built-in", 3, REBOOT_FIRST),  # the device-first rule's climb
            },
            [],
        ),
        # A new rule taking every reason of a built-in one: that built-in rule is left out, and said so.
        (
            "- {condition: NeuronHealth, actions: [cordon]}",
            {("NeuronHealth", "NeuronHasError_DMA_ERROR"): ("file", 0, ())},
            ["NeuronHealth [NeuronHasError_*]: left out: {file}:1 (NeuronHealth [any reason]) takes all its reasons"],
        ),
        # A condition of the operator's own: added, every built-in rule kept.
        (
            "- {condition: MyFabric, actions: [cordon]}",
            {("MyFabric", "LinkDown"): ("file", 0, ()), ("GpuXid", "GpuXid79"): ("built-in", 4, REBOOT_FIRST)},
            [],
        ),
    ],
)
def test_file_rules_merge_into_the_built_in_rules_by_condition_and_reason_set(tmp_path, rules, expected, left):
    path = write(tmp_path, "rules:\n" + textwrap.indent(rules, "  ") + "\n")
    policy = load_policy(path)
    for (type_, reason), (origin, index, ladder) in expected.items():
        rule = governing(policy, type_, reason)
        assert policy.rules.index(rule) == index, (type_, reason)
        assert rule.source == ("built-in" if origin == "built-in" else f"{path}:2"), (type_, reason)
        assert rule.ladder == ladder, (type_, reason)
    assert left_out(policy) == [line.replace("{file}:1", f"{path}:2") for line in left]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "base: nothing\n",
            "policy.yaml:1: base: must be builtin (the file's rules extend the built-in rules; the "
            "default) or none (only the file's rules), got 'nothing'",
        ),
        ("base: [none]\nrules: []\n", "policy.yaml:1: base: must be builtin"),
        (
            "rules: []\n",
            "policy.yaml:1: rules: [] adds no rule to the built-in rules; for no rule at all (recovery "
            "never acts) set base: none",
        ),
        # A replacement (in the built-in rule's place) behind a new rule (ahead of all) that takes its reasons.
        (
            "rules:\n  - {condition: NeuronHealth, reasons: ['NeuronHasError_*'], actions: [cordon]}\n"
            "  - {condition: NeuronHealth, actions: [cordon, taint]}\n",
            "policy.yaml:2: rules[0]: never matches: rules[1], line 3 (NeuronHealth [any reason]) goes first and "
            "takes every reason listed here",
        ),
    ],
)
def test_a_bad_base_or_a_merge_that_cannot_work_exits_2_with_file_line_and_field(tmp_path, text, problem):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        load_policy(path)
    assert any(str(p).replace(str(path), "policy.yaml").startswith(problem) for p in refused.value.problems), [
        str(p) for p in refused.value.problems
    ]


# ---- validate-config ------------------------------------------------------------------------------------

FULL_FILE = """
startupDelay: 2m
uncordonAfter: 15m
respectGracePeriod: false
rules:
  - condition: NeuronHealth
    reasons: ["NeuronHasError_DMA_ERROR", "NeuronHasError_HBM_*"]
    actions: [mark-unhealthy, drain, cordon]
    persist: 1.5s
  - condition: GpuXid
    reasons: [GpuXid79]
    ladder: [reboot, replace]
    window: 30m
    repeat: {count: 2, within: 1d}
  - condition: ScheduledMaintenance
    actions: [cordon, drain]
    leadTime: 90m
  - condition: MyFabric
    actions: [taint]
drain:
  podDeadline: 2m
  onDeadline: delete
  evictionsPerSecond: 0.5
  timeout: 20m
  waitForDeletion: 0
budget:
  maxUnhealthy: 2
  maxActions: 4
  window: 1h
  nodeSelector: "role=gpu, !excluded"
  groups:
    - {label: topology.kubernetes.io/zone, maxUnhealthy: 1}
    - {label: karpenter.sh/nodepool, maxUnhealthy: 33.3%, maxUnhealthyCap: 3}
  correlation:
    labels: [topology.kubernetes.io/zone]
    share: 45.5%
    minNodes: 4
"""


@pytest.mark.parametrize(
    "text",
    [
        None,  # the built-in policy
        SCHEDULED_SNIPPET,
        FULL_FILE,
        "base: none\nrules: []\nbudget:\n  correlation: null\n  maxUnhealthyCap: null\n",
    ],
    ids=["built-in", "snippet", "full", "no-rule"],
)
def test_print_policy_prints_a_policy_file_that_loads_back_to_the_same_policy(tmp_path, capsys, text):
    args = ["validate-config", "--print-policy"]
    if text is not None:
        args += ["--recovery-policy", str(write(tmp_path, text))]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# The effective recovery policy")
    assert "\nbase: none\n" in printed  # loaded back, nothing is merged a second time
    again = load_policy(write(tmp_path, printed, "printed.yaml"))
    effective = load_policy(tmp_path / "policy.yaml") if text is not None else DEFAULT_POLICY
    assert without_sources(again) == without_sources(effective)
    assert left_out(again) == left_out(effective)


def test_validate_config_names_the_built_in_rules_a_file_leaves_out(tmp_path, capsys):
    path = write(tmp_path, "rules:\n  - {condition: GpuCount, actions: [cordon, mark-unhealthy]}\n")
    assert main(["validate-config", "--recovery-policy", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"  note: built-in rule GpuCount [any reason]: replaced by {path}:2\n" in out
    assert "  recovery rules: 13\n" in out
    assert "validate-config --print-policy prints the effective policy" in out


def test_print_policy_refuses_a_bad_file_like_validate_config(tmp_path, capsys):
    path = write(tmp_path, "base: all\n")
    assert main(["validate-config", "--print-policy", "--recovery-policy", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{path}:1: base: must be builtin" in captured.err
