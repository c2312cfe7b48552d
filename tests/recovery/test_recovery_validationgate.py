"""The validation gate's pure stages (agent.recovery.validationgate), table-driven with an injected clock:
a rebooted node (and an unfenced device) goes back into service only after every named check passed
after the remedy; a fail or the timeout holds it or climbs; UNKNOWN is never a pass."""

from __future__ import annotations

import dataclasses

import pytest

from agent.core.types import Snapshot
from agent.core.validation import ValidationRecord, ValidationRequest, Verdict
from agent.recovery import validationgate as vg
from agent.recovery.model import (
    Action,
    Decision,
    DeviceFence,
    Incident,
    OnFail,
    PolicyRule,
    RecoveryPolicy,
    Remedy,
    ValidationAttempt,
    ValidationSettings,
)
from agent.recovery.policy import Proposal
from agent.recovery.rungs import Rung

T = 1_767_225_600.0
REBOOTED = T - 2400.0  # when the reboot was seen finished (the remedy's time)
SET = ValidationSettings(checks=("dcgm-diag", "nccl-loopback"))
INCIDENT = Incident(
    id="GpuXid/GpuXid79/uid-1/1767222000",
    condition="GpuXid",
    reason="GpuXid79",
    since=T - 3600,
    opened=T - 3600,
    done=(Action.CORDON, Action.DRAIN, Action.REBOOT),
    cordoned_by_us=True,
    healthy_since=T - 2300,
)
RUNG = Rung(
    incident=INCIDENT.id,
    condition="GpuXid",
    reason="GpuXid79",
    remedy=Remedy.REBOOT,
    step=0,
    at=T - 2500,
    boot="boot-1",
    window=1200.0,
    outcome="ok",
    finished_at=REBOOTED,
    finished_boot="boot-2",
    window_end=REBOOTED + 1200,
)
UNCORDON = Decision(actions=(Action.UNCORDON,), incident=None, release_budget=True, message="window passed")
FIRST = f"{INCIDENT.id}#1"


def policy(settings: ValidationSettings | None = SET) -> RecoveryPolicy:
    rule = PolicyRule(
        condition="GpuXid", actions=(Action.CORDON,), ladder=(Remedy.REBOOT, Remedy.REPLACE), validation=settings
    )
    return RecoveryPolicy(rules=(rule,))


def record(
    check: str,
    verdict: Verdict = Verdict.PASS,
    *,
    at: float = T - 60,
    devices: tuple[str, ...] = (),
    voided: str = "",
    valid_for: float = 86_400.0,
) -> ValidationRecord:
    return ValidationRecord(
        check=check,
        devices=devices,
        verdict=verdict,
        reason="Passed" if verdict is Verdict.PASS else "Failed" if verdict is Verdict.FAIL else "DeviceBusy",
        message="",
        at=at,
        valid_until=at + valid_for if verdict is Verdict.PASS else None,
        invalidated_by=voided,
    )


def passes(**kwargs: object) -> tuple[ValidationRecord, ...]:
    return tuple(record(c, **kwargs) for c in SET.checks)  # type: ignore[arg-type]


def attempt(
    number: int = 1,
    *,
    at: float = T - 120,
    outcome: str = "",
    devices: tuple[str, ...] = (),
    remedy: str = vg.REBOOT,
    after: float = REBOOTED,
) -> ValidationAttempt:
    return ValidationAttempt(
        number=number,
        id=f"{INCIDENT.id}#{number}",
        remedy=remedy,
        checks=SET.checks,
        devices=devices,
        after=after,
        requested_at=at,
        outcome=outcome,
        settled_at=None if not outcome else at + 1,
    )


def gate(
    *,
    records: tuple[ValidationRecord, ...] = (),
    attempts: tuple[ValidationAttempt, ...] = (),
    requested: tuple[str, ...] = (),
    open_requests: tuple[str, ...] = (),
    settings: ValidationSettings | None = SET,
    now: float = T,
    decision: Decision = UNCORDON,
    incident: Incident = INCIDENT,
) -> Decision:
    snapshot = Snapshot(
        conditions=(),
        generated_at=now,
        validations=records,
        validation_requests=tuple(
            ValidationRequest(id=i, checks=SET.checks, requested_at=T - 120) for i in open_requests
        ),
    )
    stored = dataclasses.replace(incident, validations=attempts)
    if decision.incident is not None:
        decision = dataclasses.replace(decision, incident=dataclasses.replace(decision.incident, validations=attempts))
    return vg.gate(
        decision,
        stored=stored,
        rungs=(RUNG,),
        policy=policy(settings),
        snapshot=snapshot,
        now=now,
        requested=frozenset(requested),
    )


def outcome(decision: Decision) -> tuple[str, str]:
    assert decision.incident is not None
    last = decision.incident.validations[-1]
    return last.outcome, last.reason


# ---- asked once, and nothing goes back before every check passed ------------------------------------


def test_no_pass_yet_holds_the_node_and_asks_once_with_the_incident_s_attempt_id():
    first = gate()
    assert first.actions == () and not first.release_budget, "the node stays cordoned, the budget place held"
    assert first.validation is not None and first.validation.request == ValidationRequest(
        id=FIRST, checks=SET.checks, devices=(), requested_at=T, reason="GpuXid=GpuXid79: after the reboot"
    )
    assert first.incident is not None and first.incident.validations == (attempt(at=T),)
    again = gate(attempts=first.incident.validations, requested=(FIRST,), open_requests=(FIRST,), now=T + 5)
    assert again.actions == () and again.validation is None, "the open request is not put a second time"


@pytest.mark.parametrize(
    ("records", "why"),
    [
        (passes(at=REBOOTED - 1), "a pass older than the reboot"),
        (passes(voided="GpuXid/GpuXid79 on gpu:0000:3b:00.0"), "a pass a new fault voided"),
        (passes(at=T - 120, valid_for=60), "a pass that expired"),
        ((record("dcgm-diag"),), "one check of two passed"),
        ((record("dcgm-diag"), record("nccl-loopback", Verdict.UNKNOWN)), "UNKNOWN (a device busy) is no pass"),
    ],
)
def test_what_is_not_a_valid_pass_keeps_the_node_out(records, why):
    held = gate(records=records, attempts=(attempt(),), requested=(FIRST,), open_requests=(FIRST,))
    assert held.actions == (), why
    assert outcome(held) == ("", ""), why


def test_every_check_passing_after_the_reboot_uncordons_as_today():
    passed = gate(records=passes(), attempts=(attempt(),), requested=(FIRST,))
    assert passed.actions == (Action.UNCORDON,) and passed.release_budget and passed.incident is None
    assert passed.validation is not None and passed.validation.reason == vg.PASSED


def test_a_pass_already_there_needs_no_request():
    passed = gate(records=passes())
    assert passed.actions == (Action.UNCORDON,)
    assert passed.validation is not None and passed.validation.request is None


def test_without_a_validation_set_the_node_returns_on_silence_and_an_event_says_so():
    back = gate(settings=None)
    assert back.actions == (Action.UNCORDON,)
    assert back.validation is not None and back.validation.reason == vg.ON_SILENCE
    assert back.validation.once == vg.ON_SILENCE, "one Event per incident"


# ---- fail, timeout, UNKNOWN, attempts ------------------------------------------------------------------


@pytest.mark.parametrize("on_fail", list(OnFail))
def test_a_fail_is_permanent_and_told(on_fail):
    settings = dataclasses.replace(SET, on_fail=on_fail)
    failed = gate(
        records=(record("dcgm-diag", Verdict.FAIL), record("nccl-loopback")),
        attempts=(attempt(),),
        requested=(FIRST,),
        settings=settings,
    )
    assert failed.actions == () and outcome(failed) == (vg.PERMANENT, vg.FAILED)
    assert failed.validation is not None and failed.validation.reason == vg.FAILED and failed.validation.warning
    assert failed.validation.request is None
    later = gate(
        records=(record("dcgm-diag", Verdict.FAIL),),
        attempts=failed.incident.validations,
        settings=settings,
        now=T + 600,
    )
    assert later.actions == () and later.validation is None, "held; told once, never asked again"


def test_climb_proposes_the_ladder_s_next_rung_and_hold_does_not():
    failed = (attempt(outcome=vg.PERMANENT),)
    stored = dataclasses.replace(INCIDENT, validations=failed)
    healed = Decision(incident=stored, message="healed; stays cordoned")
    climbed = vg.climb(healed, stored=stored, rungs=(RUNG,), policy=policy())
    assert isinstance(climbed, Proposal) and climbed.actions == (Action.MARK_UNHEALTHY,), "reboot -> replace"
    held = vg.climb(healed, stored=stored, rungs=(RUNG,), policy=policy(dataclasses.replace(SET, on_fail=OnFail.HOLD)))
    assert held is healed
    replaced = dataclasses.replace(stored, done=(*stored.done, Action.MARK_UNHEALTHY))
    assert vg.climb(healed, stored=replaced, rungs=(RUNG,), policy=policy()) is healed, "climbed once"


def test_the_timeout_is_permanent_and_never_asks_again():
    late = T - 120 + SET.timeout
    timed_out = gate(attempts=(attempt(),), requested=(FIRST,), open_requests=(FIRST,), now=late)
    assert timed_out.actions == () and outcome(timed_out) == (vg.PERMANENT, vg.TIMED_OUT)
    assert timed_out.validation is not None and timed_out.validation.request is None
    assert gate(records=passes(at=late + 10), attempts=timed_out.incident.validations, now=late + 20).actions == (), (
        "a pass after the timeout changes nothing: the outcome is final"
    )


def test_unknown_answers_ask_again_while_attempts_are_left_then_wait_for_the_timeout():
    unknown = tuple(record(c, Verdict.UNKNOWN, at=T - 60) for c in SET.checks)
    second = gate(records=unknown, attempts=(attempt(),), requested=(FIRST,))
    assert second.incident is not None
    assert [(a.number, a.outcome, a.reason) for a in second.incident.validations] == [
        (1, vg.TRANSIENT, vg.INCONCLUSIVE),
        (2, "", ""),
    ]
    assert second.validation is not None and second.validation.request is not None
    assert second.validation.request.id == f"{INCIDENT.id}#2"
    unknown_again = tuple(record(c, Verdict.UNKNOWN, at=T + 30) for c in SET.checks)
    waiting = gate(
        records=unknown_again, attempts=second.incident.validations, requested=(FIRST, f"{INCIDENT.id}#2"), now=T + 60
    )
    assert waiting.actions == () and waiting.validation is None, "maxAttempts 2: no third request"
    assert outcome(waiting) == (vg.TRANSIENT, vg.INCONCLUSIVE)
    timed_out = gate(records=unknown_again, attempts=waiting.incident.validations, now=T - 120 + SET.timeout)
    assert outcome(timed_out) == (vg.PERMANENT, vg.TIMED_OUT)


def test_a_request_lost_with_a_restart_is_transient_and_asked_again_under_a_new_id():
    resumed = gate(attempts=(attempt(),), requested=(), open_requests=())  # a new process: it put nothing
    assert resumed.incident is not None
    assert [(a.number, a.outcome, a.reason) for a in resumed.incident.validations] == [
        (1, vg.TRANSIENT, vg.LOST),
        (2, "", ""),
    ]
    assert resumed.validation is not None and resumed.validation.request is not None
    assert resumed.validation.request.id != FIRST, "never a second request for attempt 1"
    still_open = gate(attempts=(attempt(),), requested=(), open_requests=(FIRST,))  # restored by the main loop
    assert still_open.validation is None and outcome(still_open) == ("", "")


# ---- a device fence ----------------------------------------------------------------------------------


GPU0, GPU1 = "gpu:0000:3b:00.0", "gpu:0000:3c:00.0"
FENCED = dataclasses.replace(
    INCIDENT,
    done=(Action.FENCE_DEVICE, Action.DRAIN_DEVICE),
    fences=(DeviceFence(device=GPU0, fence="fenced", steps=(Action.FENCE_DEVICE, Action.DRAIN_DEVICE)),),
    healthy_since=T - 600,
)
UNFENCE = Decision(actions=(Action.UNFENCE_DEVICE,), incident=None, message="healed: unfence")


def device_gate(records: tuple[ValidationRecord, ...], attempts: tuple[ValidationAttempt, ...] = ()) -> Decision:
    return gate(
        records=records, attempts=attempts, requested=tuple(a.id for a in attempts), decision=UNFENCE, incident=FENCED
    )


def test_the_fence_stays_until_the_device_passed_and_asks_for_that_device():
    first = device_gate(())
    assert first.actions == ()
    assert first.validation is not None and first.validation.request is not None
    assert first.validation.request.devices == (GPU0,)
    assert first.incident is not None
    mine = first.incident.validations
    assert mine[0].remedy == vg.UNFENCE and mine[0].after == T - 600
    assert device_gate(tuple(record(c, devices=(GPU1,)) for c in SET.checks), mine).actions == (), "another GPU's"
    assert device_gate(tuple(record(c, devices=(GPU0,)) for c in SET.checks), mine).actions == (Action.UNFENCE_DEVICE,)
    assert device_gate(passes(), mine).actions == (Action.UNFENCE_DEVICE,), "a node-wide pass covers the device"


def test_a_device_that_failed_validation_climbs_to_the_node_s_first_rung():
    stored = dataclasses.replace(
        FENCED, validations=(attempt(outcome=vg.PERMANENT, remedy=vg.UNFENCE, devices=(GPU0,), after=T - 600),)
    )
    stored = dataclasses.replace(stored, done=(Action.FENCE_DEVICE, Action.DRAIN_DEVICE))
    healed = Decision(incident=None, message="healed")
    climbed = vg.climb(healed, stored=stored, rungs=(), policy=policy())
    assert isinstance(climbed, Proposal)
    assert climbed.actions == (Action.CORDON, Action.DRAIN, Action.REBOOT), "the node's reboot rung"
