"""The validation gate (pure): no node or device goes back into service unproven.

Two plan stages (:mod:`agent.recovery.plan`):

* :func:`gate` (after the gates, last): where a step would give the node or a device back — the uncordon
  after a reboot rung's window (:func:`agent.recovery.rungs.refine`), or an unfence
  (:func:`agent.recovery.devicescope.unfence`) — and the rule has a validation set
  (:meth:`~agent.recovery.model.RecoveryPolicy.validation_of`), the node stays cordoned (the fence stays)
  until every named check has a valid PASS newer than the remedy, for the incident's devices (or the node):

  - nothing asked yet: the decision carries a :class:`~agent.core.validation.ValidationRequest` (id
    ``<incident id>#<attempt>``) that the loop puts into the inbox once the incident recording it is stored;
  - a valid PASS of every check: the uncordon or unfence goes ahead (Event ``ValidationPassed``);
  - a FAIL: the attempt is ``permanent``; ``onFail: hold`` keeps it out of service with a report (Event
    ``ValidationFailed``), ``onFail: climb`` climbs the ladder at the next step (:func:`climb`);
  - no pass of every check within ``timeout`` of the remedy's first request: ``permanent`` too (reason
    ``ValidationTimedOut``; never asked again);
  - UNKNOWN (a tool absent, a device busy) is never a pass: a request closed without a verdict, or one
    lost with a restart (not open in the snapshot and not put by this process), is ``transient`` and asked
    again while the remedy has attempts left (``maxAttempts``), else the gate waits for the timeout.

  Without a validation set the node returns on silence (the window alone), as before, and one Event per
  incident (``RecoveryReturnedOnSilence``) says so.

* :func:`climb` (before the gates, last): an incident whose last validation failed for good under
  ``onFail: climb`` proposes the ladder's next rung (reboot -> replace; a device -> the node's first rung),
  so the holds and the budget apply to it as to any disruptive step.

The attempts are recorded in the incident (``validations``): a restart reads them, resumes, and never puts
a second request for an attempt on record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from agent.core.durations import format_duration
from agent.core.types import Condition, Snapshot, Status
from agent.core.validation import ValidationRecord, ValidationRequest, Verdict
from agent.recovery.devicescope import to_unfence
from agent.recovery.model import (
    ACTION_ORDER,
    Action,
    Decision,
    Incident,
    OnFail,
    PolicyRule,
    RecoveryPolicy,
    ValidationAttempt,
    ValidationNote,
    ValidationSettings,
)
from agent.recovery.policy import Match, Proposal, reason_matches
from agent.recovery.rungs import Rung, last_reboot, rung_actions

REBOOT, UNFENCE = "reboot", Action.UNFENCE_DEVICE.value  # the remedies a validation follows
SUCCEEDED, TRANSIENT, PERMANENT = "succeeded", "transient", "permanent"
PASSED, FAILED, TIMED_OUT = "ValidationPassed", "ValidationFailed", "ValidationTimedOut"
INCONCLUSIVE, LOST, REQUESTED = "ValidationInconclusive", "ValidationLost", "ValidationRequested"
HELD = "ValidationHeld"
ON_SILENCE = "RecoveryReturnedOnSilence"


@dataclass(frozen=True, kw_only=True, slots=True)
class Returning:
    """What a step would give back: after ``remedy`` (done at ``after``), the node or ``devices``."""

    remedy: str
    after: float
    devices: tuple[str, ...] = ()  # () = the node


def rule_of(policy: RecoveryPolicy, incident: Incident) -> PolicyRule | None:
    """The first rule of ``policy`` for the incident's condition and reason."""
    return next(
        (r for r in policy.rules if r.condition == incident.condition and reason_matches(r, incident.reason)), None
    )


# ---- after the gates: the gate ---------------------------------------------------------------------


def gate(
    decision: Decision,
    *,
    stored: Incident | None,
    rungs: tuple[Rung, ...] | None,
    policy: RecoveryPolicy,
    snapshot: Snapshot,
    now: float,
    requested: Collection[str] = frozenset(),
) -> Decision:
    """``decision``, held back until the validation set passed (see the module docstring). ``requested``:
    the request ids this process put into the inbox."""
    incident = decision.incident or stored
    if decision.blocked is not None or incident is None or incident.dry_run:
        return decision
    if decision.incident is None:  # an uncordon closes the incident: kept open (healthy) while it waits
        incident = dataclasses.replace(incident, healthy_since=incident.healthy_since or now)
    if Action.MARK_UNHEALTHY in incident.done:
        return decision  # replaced: nothing goes back into service
    returning = _returning(decision, incident, rungs, snapshot, now)
    if returning is None:
        return decision
    settings = policy.validation_of(rule_of(policy, incident))
    if settings is None:
        said = "the node returns after its quiet window alone (no validation set is configured)"
        note = ValidationNote(reason=ON_SILENCE, message=f"incident {incident.id}: {said}", once=ON_SILENCE)
        return dataclasses.replace(decision, validation=note)
    return _judged(decision, incident, returning, settings, snapshot=snapshot, now=now, requested=requested)


def _returning(
    decision: Decision, incident: Incident, rungs: tuple[Rung, ...] | None, snapshot: Snapshot, now: float
) -> Returning | None:
    """What ``decision`` gives back, and after which remedy (None: nothing a validation guards)."""
    rung = last_reboot(rungs, incident.id) if rungs is not None else None
    if rung is not None and Action.UNCORDON in decision.actions:
        return Returning(remedy=REBOOT, after=rung.finished_at or rung.at)
    if Action.UNFENCE_DEVICE not in decision.actions:
        return None
    condition = snapshot.condition(incident.condition)
    listed = {d.device.key for d in condition.devices} if condition and condition.status is Status.TRUE else set()
    devices = tuple(f.device for f in incident.fences if to_unfence(f) and f.device not in listed)
    earlier = [a for a in incident.validations if a.remedy == UNFENCE and a.devices == devices]
    after = earlier[0].after if earlier else (incident.healthy_since or now)
    return Returning(remedy=UNFENCE, after=after, devices=devices)


def _judged(
    decision: Decision,
    incident: Incident,
    returning: Returning,
    settings: ValidationSettings,
    *,
    snapshot: Snapshot,
    now: float,
    requested: Collection[str],
) -> Decision:
    attempts = _attempts(incident, returning)
    last = attempts[-1] if attempts else None
    if last is not None and last.outcome == PERMANENT:
        return _failed(decision, incident, last, settings, told=False)
    verdict, detail = judge(settings.checks, returning, snapshot.validations, now=now)
    if verdict is Verdict.PASS:
        message = f"incident {incident.id}: {', '.join(settings.checks)} passed after the {returning.remedy}"
        note = ValidationNote(reason=PASSED, message=message, once=f"{PASSED}:{returning.remedy}:{returning.after}")
        if last is not None and not last.outcome and decision.incident is not None:  # it stays open: recorded
            done = _settle(last, SUCCEEDED, PASSED, "", now)
            decision = dataclasses.replace(decision, incident=_with(decision.incident, done))
        return dataclasses.replace(decision, validation=note)
    if verdict is Verdict.FAIL:
        if last is not None and last.outcome != SUCCEEDED:
            last = _settle(last, PERMANENT, FAILED, detail, now)
        else:
            last = _attempt(incident, returning, settings, now, outcome=PERMANENT, reason=FAILED, detail=detail)
        return _failed(decision, _with(incident, last), last, settings, told=True)
    if last is not None and now >= attempts[0].requested_at + settings.timeout:
        why = f"no pass of every check within {format_duration(settings.timeout)} ({detail})"
        last = _settle(last, PERMANENT, TIMED_OUT, why, now)
        return _failed(decision, _with(incident, last), last, settings, told=True)
    return _waiting(decision, incident, returning, settings, snapshot=snapshot, now=now, requested=requested)


def _waiting(
    decision: Decision,
    incident: Incident,
    returning: Returning,
    settings: ValidationSettings,
    *,
    snapshot: Snapshot,
    now: float,
    requested: Collection[str],
) -> Decision:
    """No verdict yet: ask (again, while attempts are left), or wait for the open request."""
    attempts = _attempts(incident, returning)
    last = attempts[-1] if attempts else None
    if last is not None and not last.outcome:
        why = _stalled(last, settings, snapshot, requested)
        if not why:
            return _hold(decision, incident, f"waiting for {', '.join(settings.checks)} (request {last.id})")
        reason, detail = why
        incident = _with(incident, _settle(last, TRANSIENT, reason, detail, now))
    if len(attempts) >= settings.max_attempts:
        end = attempts[0].requested_at + settings.timeout
        return _hold(
            decision,
            incident,
            f"{len(attempts)} of {settings.max_attempts} requests made; waiting for a "
            f"pass of every check until the timeout ({format_duration(end - now)} left)",
        )
    new = _attempt(incident, returning, settings, now)
    request = ValidationRequest(
        id=new.id,
        checks=new.checks,
        devices=new.devices,
        requested_at=now,
        reason=f"{incident.condition}={incident.reason}: after the {returning.remedy}",
    )
    note = ValidationNote(
        request=request,
        reason=REQUESTED,
        message=f"incident {incident.id}: asked for {', '.join(new.checks)} (request {new.id})",
        once=new.id,
    )
    held = _hold(decision, _with(incident, new), f"validation requested ({new.id})")
    return dataclasses.replace(held, validation=note)


def _stalled(
    last: ValidationAttempt,
    settings: ValidationSettings,
    snapshot: Snapshot,
    requested: Collection[str],
) -> tuple[str, str] | None:
    """Why the open attempt will bring no verdict (None: it still may)."""
    if _answered(last, settings.checks, snapshot.validations):
        return INCONCLUSIVE, "every check answered, not every one passed (UNKNOWN is never a pass)"
    if last.id not in requested and all(r.id != last.id for r in snapshot.validation_requests):
        return LOST, "the request is not open and was not put by this agent (a restart): asked again"
    return None


def _failed(
    decision: Decision, incident: Incident, last: ValidationAttempt, settings: ValidationSettings, *, told: bool
) -> Decision:
    """A permanent outcome: held with a report; with ``onFail: climb`` the next step climbs (:func:`climb`)."""
    then = (
        "climbs to the ladder's next rung (none left: held)"
        if settings.on_fail is OnFail.CLIMB
        else "holds it out of service until an operator acts"
    )
    message = f"incident {incident.id}: validation {last.id} {last.reason}: {last.message}; recovery {then}"
    held = _hold(decision, incident, message)
    if not told:
        return held
    note = ValidationNote(reason=last.reason, message=message, warning=True, once=f"{last.reason}:{last.id}")
    return dataclasses.replace(held, validation=note)


def _hold(decision: Decision, incident: Incident, why: str) -> Decision:
    """The node stays cordoned, the fences stay: no action, the incident kept."""
    return Decision(incident=incident, rule=decision.rule, message=f"{why}; kept out of service")


# ---- the records -----------------------------------------------------------------------------------


def _attempts(incident: Incident, returning: Returning) -> list[ValidationAttempt]:
    return [
        a
        for a in incident.validations
        if a.remedy == returning.remedy and a.after == returning.after and a.devices == returning.devices
    ]


def _attempt(
    incident: Incident,
    returning: Returning,
    settings: ValidationSettings,
    now: float,
    *,
    outcome: str = "",
    reason: str = "",
    detail: str = "",
) -> ValidationAttempt:
    number = max((a.number for a in incident.validations), default=0) + 1
    return ValidationAttempt(
        number=number,
        id=f"{incident.id}#{number}",
        remedy=returning.remedy,
        checks=settings.checks,
        devices=returning.devices,
        after=returning.after,
        requested_at=now,
        outcome=outcome,
        reason=reason,
        message=detail[:600],
        settled_at=now if outcome else None,
    )


def _settle(last: ValidationAttempt, outcome: str, reason: str, detail: str, now: float) -> ValidationAttempt:
    return dataclasses.replace(last, outcome=outcome, reason=reason, message=detail[:600], settled_at=now)


def _with(incident: Incident, attempt: ValidationAttempt) -> Incident:
    """``incident`` with ``attempt`` recorded (replacing the one of its number)."""
    others = tuple(a for a in incident.validations if a.number != attempt.number)
    return dataclasses.replace(incident, validations=tuple(sorted((*others, attempt), key=lambda a: a.number)))


# ---- the verdict -----------------------------------------------------------------------------------


def _targets(returning: Returning) -> tuple[str, ...]:
    return returning.devices or ("",)


def _relevant(records: Sequence[ValidationRecord], check: str, target: str, after: float) -> list[ValidationRecord]:
    """The results of ``check`` newer than ``after`` that speak for ``target`` (a device key; "" = the node:
    every result of the check)."""
    return [
        r for r in records if r.check == check and r.at > after and (not target or not r.devices or target in r.devices)
    ]


def judge(
    checks: Sequence[str], returning: Returning, records: Sequence[ValidationRecord], *, now: float
) -> tuple[Verdict, str]:
    """PASS: every check has results newer than the remedy for each target, all valid passes; FAIL: one
    failed; UNKNOWN otherwise (with what is missing)."""
    missing = []
    for check in checks:
        for target in _targets(returning):
            found = _relevant(records, check, target, returning.after)
            failed = next((r for r in found if r.verdict is Verdict.FAIL), None)
            if failed is not None:
                on = f" on {', '.join(failed.devices)}" if failed.devices else ""
                return Verdict.FAIL, f"{check} failed{on}: {failed.reason}: {failed.message}"[:600]
            if not found or not all(r.valid(now) for r in found):
                missing.append(f"{check}{' on ' + target if target else ''}")
    if missing:
        return Verdict.UNKNOWN, f"no valid pass yet of {', '.join(missing)}"
    return Verdict.PASS, ""


def _answered(attempt: ValidationAttempt, checks: Sequence[str], records: Sequence[ValidationRecord]) -> bool:
    """Every check has a result newer than the request for each target (the request is closed)."""
    returning = Returning(remedy=attempt.remedy, after=attempt.requested_at, devices=attempt.devices)
    return all(_relevant(records, c, t, attempt.requested_at) for c in checks for t in _targets(returning))


# ---- before the gates: the climb -------------------------------------------------------------------


def climb(
    assessed: Decision | Proposal | None,
    *,
    stored: Incident | None,
    rungs: tuple[Rung, ...] | None,
    policy: RecoveryPolicy,
) -> Decision | Proposal | None:
    """A healed incident whose last validation failed for good under ``onFail: climb``: the next rung as a
    proposal (the holds and the budget decide); anything else unchanged."""
    if not isinstance(assessed, Decision) or assessed.blocked is not None or stored is None or stored.dry_run:
        return assessed
    if assessed.actions not in ((), (Action.UNCORDON,)) or not stored.validations:
        return assessed
    last = stored.validations[-1]
    rule = rule_of(policy, stored)
    settings = policy.validation_of(rule)
    if rule is None or settings is None or settings.on_fail is not OnFail.CLIMB or last.outcome != PERMANENT:
        return assessed
    actions = _next_rung(rule, stored, rungs, last)
    if not actions:
        return assessed  # the top of the ladder, or climbed already: the gate holds it with its report
    incident = assessed.incident or stored
    condition = Condition(
        type=stored.condition,
        status=Status.TRUE,
        reason=stored.reason,
        message="",
        last_transition=stored.since,
        last_update=stored.since,
    )
    note = f"validation {last.id} {last.reason}: the ladder's next rung"
    return Proposal(
        actions=actions, incident=incident, primary=Match(condition=condition, rule=rule, index=0), note=note
    )


def _next_rung(
    rule: PolicyRule, incident: Incident, rungs: tuple[Rung, ...] | None, last: ValidationAttempt
) -> tuple[Action, ...]:
    """The actions of the rung above the remedy ``last`` validated, not done yet (() = none left)."""
    if last.remedy == REBOOT:
        rung = last_reboot(rungs or (), incident.id)
        step = rung.step + 1 if rung is not None else len(rule.ladder)
        wanted = rung_actions(rule, rule.ladder[step]) if step < len(rule.ladder) else ()
    else:
        wanted = rung_actions(rule, rule.ladder[0]) if rule.ladder else rule.node_actions
    return tuple(
        a
        for a in ACTION_ORDER
        if a in wanted
        and not a.on_device
        and a not in incident.done
        and not (a is Action.CORDON and not incident.cordoned_by_us)
    )
