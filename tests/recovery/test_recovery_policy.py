"""The recovery decision (agent.recovery.policy.decide) as tables: each gate, each transition of an
incident, report only, stale incidents, uncordon timing, someone else's cordon, persistence, reason
globs and several rules."""

from __future__ import annotations

import dataclasses

import pytest

from agent.core.types import Condition, Snapshot, Status
from agent.recovery.model import (
    BUILTIN_CONDITIONS,
    OPT_OUT_LABEL,
    Action,
    Blocked,
    BudgetView,
    Decision,
    Incident,
    NodeView,
    PolicyRule,
    RecoveryPolicy,
)
from agent.recovery.policy import decide, incident_id, matching, reason_matches, with_budget_held, with_done

CORDON, TAINT, DRAIN, MARK, UNCORDON = (
    Action.CORDON,
    Action.TAINT,
    Action.DRAIN,
    Action.MARK_UNHEALTHY,
    Action.UNCORDON,
)
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: when the problem condition turned True
STARTED = T0 - 3600.0  # the agent has been running for an hour
NOW = T0 + 10.0
NEURON = PolicyRule(condition="NeuronHealth", reasons=("NeuronHasError_*",), actions=(CORDON, MARK), source="p:3")
XID = PolicyRule(condition="GpuXid", actions=(CORDON, MARK), source="p:7")
POLICY = RecoveryPolicy(rules=(NEURON, XID), startup_delay=60.0)
NODE = NodeView(name="ip-10-0-0-1", uid="uid-1", unschedulable=False)
CORDONED = dataclasses.replace(NODE, unschedulable=True)
ROOM = BudgetView(holders=(), limit=1, actions_in_window=0, max_actions=10, this_node_holds=False)
FULL = dataclasses.replace(ROOM, holders=("ip-10-0-0-9",))
HOLDING_FULL = dataclasses.replace(ROOM, holders=("ip-10-0-0-1",), this_node_holds=True)
NO_ACTIONS_LEFT = dataclasses.replace(HOLDING_FULL, actions_in_window=10)
CORRUPT = dataclasses.replace(ROOM, problem="the budget Lease is unreadable")
ID = "NeuronHealth/NeuronHasError_DMA_ERROR/uid-1/1767225600"


def cond(
    type_: str = "NeuronHealth",
    reason: str = "NeuronHasError_DMA_ERROR",
    *,
    since: float = T0,
    status: Status = Status.TRUE,
) -> Condition:
    return Condition(type=type_, status=status, reason=reason, message="m", last_transition=since, last_update=since)


def snap(*conditions: Condition, seeded: bool = True) -> Snapshot:
    return Snapshot(conditions=conditions, generated_at=NOW, seeded=seeded, provenance=BUILTIN_CONDITIONS)


PROBLEM = snap(cond(), cond("GpuXid", "GpuXidGood", status=Status.FALSE))
HEALTHY = snap(cond(reason="NeuronHasNoError", status=Status.FALSE, since=T0 + 500))


def incident(**kw) -> Incident:
    values = dict(id=ID, condition="NeuronHealth", reason="NeuronHasError_DMA_ERROR", since=T0, opened=T0 + 1)
    values.update(kw)
    return Incident(**values)


def run(**kw) -> Decision:
    values = dict(
        snapshot=PROBLEM,
        node=NODE,
        incident=None,
        policy=POLICY,
        now=NOW,
        started_at=STARTED,
        budget=ROOM,
        enabled=True,
    )
    values.update(kw)
    return decide(**values)


def check(decision: Decision, *, actions=(), blocked=None, release=False, **incident_fields) -> None:
    """``incident_fields``: ``incident=None`` for no record, else field values the record must have."""
    assert (decision.actions, decision.blocked, decision.release_budget) == (tuple(actions), blocked, release), (
        decision.message
    )
    if "incident" in incident_fields:
        assert decision.incident == incident_fields.pop("incident")
    for name, value in incident_fields.items():
        assert decision.incident is not None, decision.message
        assert getattr(decision.incident, name) == value, (name, decision.incident)


# ---- matching ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reasons", "reason", "expected"),
    [
        (("NeuronHasError_*",), "NeuronHasError_DMA_ERROR", True),
        (("NeuronHasError_*",), "NeuronHasError_", True),
        (("NeuronHasError_*",), "NeuronHasNoError", False),
        (("NeuronHasError_*",), "neuronhaserror_dma_error", False),  # case-sensitive
        (("NeuronHasError_DMA_ERROR", "NeuronHasError_HBM_*"), "NeuronHasError_HBM_UNCORRECTABLE_ERROR", True),
        (("NeuronHasError_DMA_ERROR", "NeuronHasError_HBM_*"), "NeuronHasError_SRAM_UNCORRECTABLE_ERROR", False),
        (("GpuXid7?",), "GpuXid79", True),
        (("GpuXid7?",), "GpuXid790", False),
        ((), "anything at all", True),
    ],
)
def test_reason_globs(reasons, reason, expected):
    rule = PolicyRule(condition="C", reasons=reasons)
    assert reason_matches(rule, reason) is expected


def test_matching_orders_longest_true_first_then_rule_order_and_skips_false_and_unknown():
    found = matching(
        snap(
            cond("GpuXid", "GpuXid79", since=T0),
            cond(since=T0),
            cond("GpuEcc", "GpuEccUncorrectable", since=T0 - 50),  # no rule
            cond("NeuronHealth", "NeuronHasNoError", status=Status.FALSE),
        ),
        POLICY,
    )
    assert [m.condition.type for m in found] == ["NeuronHealth", "GpuXid"]  # same since: rule order
    found = matching(snap(cond("GpuXid", "GpuXid79", since=T0 - 5), cond(since=T0)), POLICY)
    assert [m.condition.type for m in found] == ["GpuXid", "NeuronHealth"]
    assert matching(snap(cond("GpuXid", "GpuXid79", status=Status.UNKNOWN)), POLICY) == ()


def test_incident_id_uses_the_uid_else_the_name():
    assert incident_id(condition="C", reason="R", node=NODE, since=T0 + 0.9) == "C/R/uid-1/1767225600"
    assert incident_id(condition="C", reason="R", node=dataclasses.replace(NODE, uid=""), since=T0) == (
        "C/R/ip-10-0-0-1/1767225600"
    )


def test_with_done_keeps_action_order_and_refuses_uncordon():
    rec = with_done(with_done(incident(), MARK), CORDON)
    assert rec.done == (CORDON, MARK)
    assert with_done(rec, CORDON).done == (CORDON, MARK)
    assert with_budget_held(rec).budget_held is True
    with pytest.raises(ValueError):
        with_done(rec, UNCORDON)


# ---- a new problem ----------------------------------------------------------------------------------


def test_a_new_problem_opens_an_incident_and_acts():
    d = run()
    check(
        d,
        actions=(CORDON, MARK),
        id=ID,
        condition="NeuronHealth",
        reason="NeuronHasError_DMA_ERROR",
        since=T0,
        opened=NOW,
        done=(),
        cordoned_by_us=True,
        dry_run=False,
        healthy_since=None,
        budget_held=False,
    )
    assert d.rule is NEURON


# ---- the gates, in order ------------------------------------------------------------------------------

STORED = incident(done=(CORDON,), cordoned_by_us=True, budget_held=True)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("healthy node, nothing stored", dict(snapshot=HEALTHY), dict()),
        (
            "control-plane node",
            dict(node=dataclasses.replace(NODE, labels={"node-role.kubernetes.io/control-plane": ""})),
            dict(blocked=Blocked.CONTROL_PLANE, incident=None),
        ),
        (
            "legacy master label",
            dict(node=dataclasses.replace(NODE, labels={"node-role.kubernetes.io/master": ""})),
            dict(blocked=Blocked.CONTROL_PLANE, incident=None),
        ),
        (
            "opted out",
            dict(node=dataclasses.replace(NODE, labels={OPT_OUT_LABEL: "disabled"})),
            dict(blocked=Blocked.OPTED_OUT, incident=None),
        ),
        (
            "opted out with an open incident: handed over, place released",
            dict(node=dataclasses.replace(CORDONED, labels={OPT_OUT_LABEL: "false"}), incident=STORED),
            dict(blocked=Blocked.OPTED_OUT, incident=None, release=True),
        ),
        (
            "opted out beats the startup delay",
            dict(node=dataclasses.replace(NODE, labels={OPT_OUT_LABEL: "Off"}), started_at=NOW),
            dict(blocked=Blocked.OPTED_OUT, incident=None),
        ),
        (
            "startup delay: no incident opened",
            dict(started_at=NOW - 59),
            dict(blocked=Blocked.STARTUP_DELAY, incident=None),
        ),
        (
            "startup delay: the stored incident is kept as it is, even when healed",
            dict(started_at=NOW - 59, snapshot=HEALTHY, incident=STORED, node=CORDONED),
            dict(blocked=Blocked.STARTUP_DELAY, incident=STORED),
        ),
        (
            "startup delay over",
            dict(started_at=NOW - 60),
            dict(actions=(CORDON, MARK), id=ID),
        ),
        (
            "startup delay 0",
            dict(started_at=NOW, policy=dataclasses.replace(POLICY, startup_delay=0.0)),
            dict(actions=(CORDON, MARK), id=ID),
        ),
        (
            "conditions not read yet: nothing, even clean-up",
            dict(snapshot=snap(seeded=False), incident=STORED, node=CORDONED),
            dict(blocked=Blocked.STARTUP_DELAY, incident=STORED),
        ),
        (
            "persistence: the incident is recorded, nothing done",
            dict(policy=RecoveryPolicy(rules=(dataclasses.replace(NEURON, persist=300.0),))),
            dict(blocked=Blocked.PERSIST, id=ID, done=()),
        ),
        (
            "persistence elapsed",
            dict(policy=RecoveryPolicy(rules=(dataclasses.replace(NEURON, persist=300.0),)), now=T0 + 300),
            dict(actions=(CORDON, MARK)),
        ),
        (
            "nothing left",
            dict(incident=incident(done=(CORDON, MARK), cordoned_by_us=True), node=CORDONED),
            dict(blocked=Blocked.NOTHING_LEFT, done=(CORDON, MARK)),
        ),
        ("budget not read", dict(budget=None), dict(blocked=Blocked.BUDGET, id=ID)),
        ("budget: no place left", dict(budget=FULL), dict(blocked=Blocked.BUDGET, id=ID)),
        ("budget: this node already holds a place", dict(budget=HOLDING_FULL), dict(actions=(CORDON, MARK))),
        ("budget: no action left in the window", dict(budget=NO_ACTIONS_LEFT), dict(blocked=Blocked.BUDGET)),
        ("budget: unreadable Lease", dict(budget=CORRUPT), dict(blocked=Blocked.BUDGET)),
        (
            "report only: the budget is not consulted",
            dict(budget=None, enabled=False),
            dict(actions=(CORDON, MARK), dry_run=True, id=ID),
        ),
    ],
)
def test_gates(name, kwargs, expected):
    check(run(**kwargs), **expected)


def test_blocked_messages_say_why():
    assert "1 of 1 budget places are taken (ip-10-0-0-9)" in run(budget=FULL).message
    assert "10 of 10 disruptive actions" in run(budget=NO_ACTIONS_LEFT).message
    assert "the budget Lease is unreadable" in run(budget=CORRUPT).message
    assert "needs the cluster budget" in run(budget=None).message
    persist = run(policy=RecoveryPolicy(rules=(dataclasses.replace(NEURON, persist=300.0),)))
    assert persist.message == (
        "NeuronHealth=NeuronHasError_DMA_ERROR has been True for 10s; the rule waits for 5m (4m50s more)"
    )
    assert "1m" in run(started_at=NOW - 30).message


# ---- someone else's cordon ----------------------------------------------------------------------------


def test_a_node_cordoned_by_someone_else_is_not_cordoned_nor_ever_uncordoned_by_us():
    d = run(node=CORDONED)
    check(d, actions=(MARK,), cordoned_by_us=False)
    rec = with_done(d.incident, MARK)
    # The operator uncordons it later while the problem is still there: we do not cordon it again.
    check(run(node=NODE, incident=rec), blocked=Blocked.NOTHING_LEFT)
    # Healed: marked unhealthy, so it stays (being replaced); never uncordoned.
    policy = dataclasses.replace(POLICY, uncordon_after=0.0)
    check(run(snapshot=HEALTHY, node=CORDONED, incident=rec, policy=policy), healthy_since=NOW)


def test_cordon_only_rule_on_a_node_cordoned_by_someone_else_closes_without_uncordon():
    policy = RecoveryPolicy(rules=(dataclasses.replace(NEURON, actions=(CORDON,)),), uncordon_after=0.0)
    d = run(node=CORDONED, policy=policy)
    check(d, blocked=Blocked.NOTHING_LEFT, cordoned_by_us=False)
    check(run(snapshot=HEALTHY, node=CORDONED, incident=d.incident, policy=policy), incident=None, release=True)


def test_cordoned_by_us_is_read_again_until_the_first_action_is_done():
    waiting = incident(cordoned_by_us=True)  # opened while waiting for budget, node schedulable then
    check(run(node=CORDONED, incident=waiting), actions=(MARK,), cordoned_by_us=False)
    check(
        run(node=NODE, incident=dataclasses.replace(waiting, cordoned_by_us=False)),
        actions=(CORDON, MARK),
        cordoned_by_us=True,
    )
    started = incident(cordoned_by_us=True, done=(CORDON,))
    check(run(node=CORDONED, incident=started), actions=(MARK,), cordoned_by_us=True, done=(CORDON,))


# ---- healing, uncordon and release ---------------------------------------------------------------------

CORDON_ONLY = RecoveryPolicy(rules=(dataclasses.replace(NEURON, actions=(CORDON,)),))
UNCORDON_10M = dataclasses.replace(CORDON_ONLY, uncordon_after=600.0)
OURS = incident(done=(CORDON,), cordoned_by_us=True, budget_held=True)
OURS_MARKED = incident(done=(CORDON, MARK), cordoned_by_us=True, budget_held=True)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        (
            "uncordon off: stays cordoned by us and keeps its place",
            dict(policy=CORDON_ONLY, incident=OURS, node=CORDONED),
            dict(healthy_since=NOW, done=(CORDON,), budget_held=True),
        ),
        (
            "uncordon off, an operator uncordoned it: nothing of ours left, closed and released",
            dict(policy=CORDON_ONLY, incident=OURS, node=NODE),
            dict(incident=None, release=True),
        ),
        (
            "marked unhealthy, uncordon off: stays (the instance is being replaced)",
            dict(incident=OURS_MARKED, node=CORDONED),
            dict(healthy_since=NOW, budget_held=True),
        ),
        (
            "marked unhealthy, uncordoned by an operator: still stays until the node leaves",
            dict(incident=OURS_MARKED, node=NODE),
            dict(healthy_since=NOW),
        ),
        (
            "marked unhealthy, uncordon on: never uncordoned",
            dict(policy=dataclasses.replace(POLICY, uncordon_after=0.0), incident=OURS_MARKED, node=CORDONED),
            dict(healthy_since=NOW),
        ),
        (
            "uncordon on: waits uncordonAfter from the first healthy sight",
            dict(policy=UNCORDON_10M, incident=OURS, node=CORDONED),
            dict(healthy_since=NOW),
        ),
        (
            "uncordon on: 1 s early",
            dict(policy=UNCORDON_10M, incident=dataclasses.replace(OURS, healthy_since=NOW - 599), node=CORDONED),
            dict(healthy_since=NOW - 599),
        ),
        (
            "uncordon on: due, never needs budget",
            dict(
                policy=UNCORDON_10M,
                incident=dataclasses.replace(OURS, healthy_since=NOW - 600),
                node=CORDONED,
                budget=None,
            ),
            dict(actions=(UNCORDON,), incident=None, release=True),
        ),
        (
            "uncordon on: a spent budget does not block it",
            dict(
                policy=UNCORDON_10M,
                incident=dataclasses.replace(OURS, healthy_since=NOW - 600),
                node=CORDONED,
                budget=NO_ACTIONS_LEFT,
            ),
            dict(actions=(UNCORDON,), incident=None, release=True),
        ),
        (
            "uncordon on, but the cordon was someone else's: closed, not uncordoned",
            dict(
                policy=UNCORDON_10M,
                incident=dataclasses.replace(OURS, cordoned_by_us=False, done=(), healthy_since=NOW - 600),
                node=CORDONED,
            ),
            dict(incident=None, release=True),
        ),
        (
            "uncordon on: our taint alone is given back too",
            dict(
                policy=UNCORDON_10M,
                incident=incident(done=(TAINT,), cordoned_by_us=False, healthy_since=NOW - 600),
                node=dataclasses.replace(CORDONED, has_our_taint=True),
            ),
            dict(actions=(UNCORDON,), incident=None, release=True),
        ),
        (
            "healed while waiting for persistence: never acted on, closed",
            dict(incident=incident(cordoned_by_us=True)),
            dict(incident=None, release=True),
        ),
        (
            "healed while waiting for budget: closed",
            dict(incident=incident(cordoned_by_us=True), budget=FULL),
            dict(incident=None, release=True),
        ),
        (
            "healthy_since is kept once set",
            dict(policy=CORDON_ONLY, incident=dataclasses.replace(OURS, healthy_since=T0 + 1), node=CORDONED),
            dict(healthy_since=T0 + 1),
        ),
        (
            "stale incident of a condition no longer in the policy: heals like any other",
            dict(
                snapshot=snap(cond("OldCondition", "Broken")),
                incident=incident(condition="OldCondition", reason="Broken", done=(CORDON,), cordoned_by_us=True),
                node=NODE,
            ),
            dict(incident=None, release=True),
        ),
    ],
)
def test_healing(name, kwargs, expected):
    kwargs.setdefault("snapshot", HEALTHY)
    check(run(**kwargs), **expected)


def test_uncordon_timing_over_successive_decisions():
    rec, node = OURS, CORDONED
    d = run(policy=UNCORDON_10M, snapshot=HEALTHY, incident=rec, node=node, now=T0 + 100)
    assert d.incident.healthy_since == T0 + 100 and "uncordon in 10m" in d.message
    for now in (T0 + 101, T0 + 699.9):
        d = run(policy=UNCORDON_10M, snapshot=HEALTHY, incident=d.incident, node=node, now=now)
        check(d, healthy_since=T0 + 100)
    d = run(policy=UNCORDON_10M, snapshot=HEALTHY, incident=d.incident, node=node, now=T0 + 700)
    check(d, actions=(UNCORDON,), incident=None, release=True)


def test_a_relapse_before_uncordon_resets_the_healthy_time():
    d = run(policy=UNCORDON_10M, snapshot=HEALTHY, incident=OURS, node=CORDONED, now=T0 + 100)
    # Same episode (same lastTransitionTime: it never went False as far as the state knows).
    d = run(policy=UNCORDON_10M, snapshot=PROBLEM, incident=d.incident, node=CORDONED, now=T0 + 200)
    check(d, blocked=Blocked.NOTHING_LEFT, id=ID, healthy_since=None)
    d = run(policy=UNCORDON_10M, snapshot=HEALTHY, incident=d.incident, node=CORDONED, now=T0 + 300)
    check(d, healthy_since=T0 + 300)


# ---- new episodes ---------------------------------------------------------------------------------------

BACK = snap(cond(since=T0 + 1000))
NEW_ID = "NeuronHealth/NeuronHasError_DMA_ERROR/uid-1/1767226600"


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        (
            "healed, then back: a new incident keeping our cordon",
            dict(incident=dataclasses.replace(OURS_MARKED, healthy_since=T0 + 500), node=CORDONED),
            dict(actions=(MARK,), id=NEW_ID, done=(CORDON,), cordoned_by_us=True, budget_held=True, opened=T0 + 1010),
        ),
        (
            "healed, an operator uncordoned it meanwhile, then back: cordoned again",
            dict(incident=dataclasses.replace(OURS_MARKED, healthy_since=T0 + 500), node=NODE),
            dict(actions=(CORDON, MARK), id=NEW_ID, done=(), cordoned_by_us=True),
        ),
        (
            "healed, someone else cordoned it meanwhile: their cordon",
            dict(incident=incident(done=(MARK,), cordoned_by_us=True, healthy_since=T0 + 500), node=CORDONED),
            dict(actions=(MARK,), id=NEW_ID, done=(), cordoned_by_us=False),
        ),
        (
            "healed unseen (a new lastTransitionTime): a new incident",
            dict(incident=OURS_MARKED, node=CORDONED),
            dict(actions=(MARK,), id=NEW_ID, done=(CORDON,), cordoned_by_us=True, healthy_since=None),
        ),
        (
            "our taint carries over too",
            dict(
                incident=incident(done=(CORDON, TAINT, MARK), cordoned_by_us=True, healthy_since=T0 + 500),
                node=dataclasses.replace(CORDONED, has_our_taint=True),
                policy=RecoveryPolicy(rules=(dataclasses.replace(NEURON, actions=(CORDON, TAINT, MARK)),)),
            ),
            dict(actions=(MARK,), id=NEW_ID, done=(CORDON, TAINT)),
        ),
        (
            "back but not persisted yet: the new incident waits",
            dict(
                incident=dataclasses.replace(OURS_MARKED, healthy_since=T0 + 500),
                node=CORDONED,
                policy=RecoveryPolicy(rules=(dataclasses.replace(NEURON, persist=60.0),)),
            ),
            dict(blocked=Blocked.PERSIST, id=NEW_ID, done=(CORDON,)),
        ),
    ],
)
def test_new_episodes(name, kwargs, expected):
    check(run(snapshot=BACK, now=T0 + 1010, **kwargs), **expected)


def test_a_condition_read_back_after_a_restart_in_whole_seconds_is_the_same_episode():
    rec = incident(since=T0 + 0.75, done=(CORDON, MARK), cordoned_by_us=True)
    check(run(incident=rec, node=CORDONED), blocked=Blocked.NOTHING_LEFT, id=ID)


def test_another_matching_condition_keeps_the_incident_open():
    rec = incident(done=(CORDON, MARK), cordoned_by_us=True)
    both = snap(cond(since=T0), cond("GpuXid", "GpuXid79", since=T0 + 50))
    check(run(snapshot=both, incident=rec, node=CORDONED, now=T0 + 100), blocked=Blocked.NOTHING_LEFT, id=ID)
    only_xid = snap(
        cond(reason="NeuronHasNoError", status=Status.FALSE, since=T0 + 150), cond("GpuXid", "GpuXid79", since=T0 + 50)
    )
    check(run(snapshot=only_xid, incident=rec, node=CORDONED, now=T0 + 200), blocked=Blocked.NOTHING_LEFT, id=ID)


def test_after_healing_a_different_condition_starts_a_new_incident():
    rec = incident(done=(CORDON, MARK), cordoned_by_us=True, healthy_since=T0 + 100)
    d = run(snapshot=snap(cond("GpuXid", "GpuXid79", since=T0 + 200)), incident=rec, node=CORDONED, now=T0 + 200)
    check(d, actions=(MARK,), id="GpuXid/GpuXid79/uid-1/1767225800", done=(CORDON,))
    assert d.rule is XID


# ---- report only -------------------------------------------------------------------------------------


def test_report_only_records_what_it_would_do_then_closes_when_healed():
    d = run(enabled=False, budget=None)
    check(d, actions=(CORDON, MARK), dry_run=True)
    assert d.message == "NeuronHealth=NeuronHasError_DMA_ERROR True for 10s: would cordon, mark-unhealthy"
    rec = with_done(with_done(d.incident, CORDON), MARK)
    check(run(enabled=False, incident=rec), blocked=Blocked.NOTHING_LEFT, dry_run=True)
    check(run(enabled=False, incident=rec, snapshot=HEALTHY), incident=None)  # never held a place


def test_report_only_would_uncordon_after_the_delay():
    rec = incident(done=(CORDON,), cordoned_by_us=True, dry_run=True)  # node not really cordoned
    d = run(enabled=False, policy=UNCORDON_10M, snapshot=HEALTHY, incident=rec)
    check(d, healthy_since=NOW)
    assert "would uncordon in 10m" in d.message
    d = run(enabled=False, policy=UNCORDON_10M, snapshot=HEALTHY, incident=d.incident, now=NOW + 600)
    check(d, actions=(UNCORDON,), incident=None)
    assert "would uncordon" in d.message


def test_enabling_recovery_starts_a_report_only_incident_over_for_real():
    rec = incident(done=(CORDON, MARK), cordoned_by_us=True, dry_run=True, opened=T0 + 2)
    check(run(incident=rec), actions=(CORDON, MARK), id=ID, done=(), dry_run=False, opened=T0 + 2)
    check(run(incident=rec, budget=FULL), blocked=Blocked.BUDGET, dry_run=False, done=())
    check(run(incident=rec, snapshot=HEALTHY), incident=None, release=True)


def test_disabling_recovery_keeps_a_real_incident_as_recorded():
    rec = incident(done=(CORDON,), cordoned_by_us=True, budget_held=True)
    d = run(enabled=False, incident=rec, node=CORDONED)
    check(d, blocked=Blocked.DISABLED, incident=rec)
    assert "would do: mark-unhealthy" in d.message
    due = dataclasses.replace(rec, healthy_since=NOW - 600)
    d = run(enabled=False, policy=UNCORDON_10M, snapshot=HEALTHY, incident=due, node=CORDONED)
    check(d, blocked=Blocked.DISABLED, healthy_since=NOW - 600, done=(CORDON,))
    # Nothing of ours in effect any more: the record is closed even while disabled.
    check(
        run(enabled=False, policy=UNCORDON_10M, snapshot=HEALTHY, incident=due, node=NODE), incident=None, release=True
    )


# ---- several rules -------------------------------------------------------------------------------------


def test_the_first_matching_rule_governs_a_condition():
    slow_dma = PolicyRule(condition="NeuronHealth", reasons=("NeuronHasError_DMA_*",), actions=(CORDON,), persist=600)
    anything = PolicyRule(condition="NeuronHealth", actions=(CORDON, MARK))
    policy = RecoveryPolicy(rules=(slow_dma, anything))
    check(run(policy=policy), blocked=Blocked.PERSIST)
    d = run(policy=policy, snapshot=snap(cond(reason="NeuronHasError_HBM_UNCORRECTABLE_ERROR")))
    check(d, actions=(CORDON, MARK))
    assert d.rule is anything


def test_every_persisted_rule_contributes_its_actions_and_the_trigger_names_the_incident():
    waits = PolicyRule(condition="NeuronHealth", actions=(CORDON, DRAIN), persist=3600)
    now_ = PolicyRule(condition="GpuXid", actions=(CORDON, MARK))
    policy = RecoveryPolicy(rules=(waits, now_))
    conditions = snap(cond(since=T0), cond("GpuXid", "GpuXid79", since=T0 + 5))
    d = run(policy=policy, snapshot=conditions)
    check(d, actions=(CORDON, MARK), id=ID)  # NeuronHealth has been True longest: it names the incident
    assert d.rule is now_
    d = run(policy=policy, snapshot=conditions, now=T0 + 3600, incident=with_done(with_done(d.incident, CORDON), MARK))
    check(d, actions=(DRAIN,), id=ID)
    assert d.rule is waits


def test_rule_actions_run_in_action_order():
    rule = PolicyRule(condition="NeuronHealth", actions=(MARK, DRAIN, TAINT, CORDON))
    check(run(policy=RecoveryPolicy(rules=(rule,))), actions=(CORDON, TAINT, DRAIN, MARK))
