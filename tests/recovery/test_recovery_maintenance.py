"""Scheduled maintenance in the recovery policy: a rule on ScheduledMaintenance acts ``leadTime`` before the
event's NotBefore (the time its message starts with), within the budget; the policy file's ``leadTime``."""

from __future__ import annotations

import textwrap

import pytest

from agent.core.errors import ConfigError
from agent.core.timefmt import not_before_prefix, read_not_before
from agent.core.types import Condition, Snapshot, Status
from agent.recovery.model import (
    BUILTIN_CONDITIONS,
    DEFAULT_LEAD_TIME,
    TRUSTED_FOR_BUILTIN,
    Action,
    Blocked,
    BudgetView,
    NodeView,
    PolicyRule,
    RecoveryPolicy,
)
from agent.recovery.policy import decide
from agent.recovery.policyfile import load_policy, policy_summary

CORDON, DRAIN = Action.CORDON, Action.DRAIN
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the event was scheduled (the condition turned True)
NOT_BEFORE = T0 + 3 * 86400  # three days later
RULE = PolicyRule(condition="ScheduledMaintenance", actions=(CORDON, DRAIN), lead_time=3600.0, source="p:2")
POLICY = RecoveryPolicy(rules=(RULE,), startup_delay=0.0)
NODE = NodeView(name="ip-10-0-0-1", uid="uid-1", unschedulable=False)
ROOM = BudgetView(holders=(), limit=1, actions_in_window=0, max_actions=10, this_node_holds=False)
FULL = BudgetView(holders=("ip-10-0-0-9",), limit=1, actions_in_window=0, max_actions=10, this_node_holds=False)


def scheduled(message: str) -> Snapshot:
    condition = Condition(
        type="ScheduledMaintenance",
        status=Status.TRUE,
        reason="ScheduledInstanceRetirement",
        message=message,
        last_transition=T0,
        last_update=T0,
    )
    return Snapshot(conditions=(condition,), generated_at=T0, provenance=BUILTIN_CONDITIONS)


EVENT = scheduled(f"{not_before_prefix(NOT_BEFORE)} EC2 scheduled event: instance-retirement ...")


@pytest.mark.parametrize(
    ("snapshot", "now", "budget", "actions", "blocked"),
    [
        (EVENT, T0 + 60, ROOM, (), Blocked.PERSIST),  # scheduled: waits
        (EVENT, NOT_BEFORE - 3601, ROOM, (), Blocked.PERSIST),  # a second before the lead time
        (EVENT, NOT_BEFORE - 3600, ROOM, (CORDON, DRAIN), None),  # the lead time reached: cordon and drain
        (EVENT, NOT_BEFORE + 60, ROOM, (CORDON, DRAIN), None),  # late (the agent was down): at once
        (EVENT, NOT_BEFORE - 3600, FULL, (), Blocked.BUDGET),  # within the budget, as every rule
        # A message without a readable time: act as soon as the rule's persistence allows (never wait forever).
        (scheduled("EC2 scheduled event"), T0 + 60, ROOM, (CORDON, DRAIN), None),
        (scheduled("notBefore=2026-13-45T00:00:00Z x"), T0 + 60, ROOM, (CORDON, DRAIN), None),
    ],
)
def test_lead_time(snapshot, now, budget, actions, blocked):
    decision = decide(
        snapshot=snapshot,
        node=NODE,
        incident=None,
        policy=POLICY,
        now=now,
        started_at=T0 - 3600,
        budget=budget,
        enabled=True,
    )
    assert (decision.actions, decision.blocked) == (actions, blocked)


def test_the_wait_says_when():
    decision = decide(
        snapshot=EVENT, node=NODE, incident=None, policy=POLICY, now=T0 + 60, started_at=T0, budget=None, enabled=True
    )
    assert decision.message == (
        "ScheduledMaintenance=ScheduledInstanceRetirement: scheduled; the rule acts 1h ahead, at "
        "2026-01-03T23:00:00Z (70h59m from now)"
    )
    assert decision.incident is not None  # opened (and stored) at once: status shows it


def test_without_lead_time_a_rule_acts_when_the_condition_is_true():
    plain = RecoveryPolicy(rules=(PolicyRule(condition="ScheduledMaintenance", actions=(CORDON,)),), startup_delay=0)
    decision = decide(
        snapshot=EVENT, node=NODE, incident=None, policy=plain, now=T0 + 60, started_at=T0, budget=ROOM, enabled=True
    )
    assert decision.actions == (CORDON,)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("notBefore=2026-01-21T09:00:00Z EC2 ...", 1_768_986_000.0),
        ("notBefore=2026-01-21T09:00:00Z", 1_768_986_000.0),
        ("notBefore=2026-01-21T09:00:00ZEC2", None),
        ("EC2 notBefore=2026-01-21T09:00:00Z", None),
        ("notBefore=2026-02-30T09:00:00Z x", None),
        ("", None),
    ],
)
def test_read_not_before(message, expected):
    assert read_not_before(message) == expected


# ---- the policy file ------------------------------------------------------------------------------


def load(tmp_path, text: str) -> RecoveryPolicy:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return load_policy(path)


def test_lead_time_in_the_policy_file(tmp_path):
    policy = load(
        tmp_path,
        """
        rules:
          - condition: ScheduledMaintenance
            actions: [cordon, drain]
          - condition: GpuXid
            actions: [cordon]
        base: none
        """,
    )
    assert [r.lead_time for r in policy.rules] == [DEFAULT_LEAD_TIME, None]
    assert policy.rules[0].sources == TRUSTED_FOR_BUILTIN  # built-in owners only, as every built-in condition
    policy = load(tmp_path, "rules:\n  - {condition: ScheduledMaintenance, actions: [cordon], leadTime: 6h}\n")
    assert policy.rules[0].lead_time == 6 * 3600.0
    line = (
        "  ScheduledMaintenance [any reason, raised by kernel-log or builtin-check]: cordon (no remedy), 6h before the "
    )
    assert line + "scheduled time" in policy_summary(policy)


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        (
            "{condition: GpuXid, actions: [cordon], leadTime: 1h}",
            "policy.yaml:2: rules[0].leadTime: only for ScheduledMaintenance (its message names when the event "
            "begins); GpuXid has no scheduled time: use persist",
        ),
        (
            "{condition: ScheduledMaintenance, actions: [cordon], leadTime: soon}",
            "policy.yaml:2: rules[0].leadTime: invalid duration 'soon'",
        ),
    ],
)
def test_lead_time_problems(tmp_path, rule, problem):
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, f"rules:\n  - {rule}\n")
    (found,) = [str(p).replace(str(tmp_path / "policy.yaml"), "policy.yaml") for p in refused.value.problems]
    assert found.startswith(problem), found
