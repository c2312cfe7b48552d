"""Remedies as a ladder: reboot first, replace when the reboot did not help.

A policy rule with ``ladder: [reboot, replace]`` tries its remedies in turn, per condition reason:

* **reboot**: cordon, drain, then EC2 ``RebootInstances`` (:class:`Rebooter`). The request is recorded
  on the Node *before* the call, with this boot's id (``/proc/sys/kernel/random/boot_id``), in the
  history annotation :data:`HISTORY_ANNOTATION`, and in the attempt ledger (:mod:`agent.recovery.attempt`:
  reserved before the call, sent after it, finished on a new boot id or at its deadline); a restarted agent
  never requests it twice, whatever stopped it when.
* A reboot is **finished** when an agent sees a boot id other than the one recorded with the request.
  Only a reboot we requested is ever finished: a node rebooted by someone else has no request on
  record (or one of an older boot already finished), so its new boot id changes nothing.
* The **observation window** (``window``, default 20 min) starts when an agent on the new boot first
  sees it, by that agent's clock (recorded as ``windowEnd``): the requesting agent's clock, which may
  be skewed, never shortens it; a clock that went back only lengthens it.
* Healthy through the window: our cordon and taint are removed (never someone else's cordon) and the
  incident is closed. The history stays (bounded), for the climbing rules:
* **Climbing** to the next rung: the same condition reason comes back within the window (a new
  episode), or it is still there when the window ends (it survived the reboot), or the rule's
  ``repeat`` count of reboots for that reason falls within its period on this instance (a "lemon").
  A failed request (throttled, denied, an instance already stopping) is no rung: it is reported and
  retried, and never turns into a replace.
* The last rung is the last: ``replace`` is cordon and ``mark-unhealthy``.

The decision stays in :func:`agent.recovery.policy.decide`: :func:`effective_policy` (in
:mod:`agent.recovery.rungs`, the pure parts) turns each ladder rule into a plain rule with the current rung's
actions (for the reasons seen now), and :func:`refine` holds the uncordon of a rebooted node until its window
has passed; :class:`Ladder` here requests the reboot and writes the history and the ledger.
Everything the ladder decides is re-read from the Node at every step.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.timefmt import iso
from agent.recovery import attempt as attempts
from agent.recovery.model import DEFAULT_WINDOW, Incident, NodeView, RecoveryPolicy, Remedy
from agent.recovery.rungs import (
    FAILED,
    HISTORY_ANNOTATION,
    MAX_BOOT,
    MAX_OPENED,
    MAX_RUNGS,
    MAX_STEP,
    OK,
    REBOOT_GRACE,
    RECORD,
    REQUESTED,
    RETRY_INITIAL,
    RETRY_MAX,
    History,
    Opened,
    Plan,
    Rung,
    effective_policy,
    finish_reboots,
    history_text,
    last_reboot,
    parse_history,
    read_history,
    read_opened,
    refine,
    rung_actions,
    settle_rungs,
    step_for,
    with_opened,
)

# The pure parts live in agent.recovery.rungs; they are named here too, for the callers of this module.
__all__ = [
    "FAILED",
    "HISTORY_ANNOTATION",
    "History",
    "MAX_BOOT",
    "MAX_OPENED",
    "MAX_RUNGS",
    "MAX_STEP",
    "OK",
    "Opened",
    "Plan",
    "REBOOT_GRACE",
    "RECORD",
    "REQUESTED",
    "RETRY_INITIAL",
    "RETRY_MAX",
    "Rung",
    "effective_policy",
    "finish_reboots",
    "history_text",
    "last_reboot",
    "parse_history",
    "read_history",
    "read_opened",
    "refine",
    "rung_actions",
    "settle_rungs",
    "step_for",
    "with_opened",
    "Ladder",
    "RebootResult",
    "NotEc2Instance",
    "FAILURE_KINDS",
    "call_outcome_unknown",
    "failure_kind",
    "ladder_state",
    "record_opened",
    "store_history",
]

log = logging.getLogger(__name__)


def store_history(client: Any, *, node_name: str, rungs: tuple[Rung, ...], opened: tuple[Opened, ...] = ()) -> None:
    """Write the history annotation (a strategic merge patch of that one annotation)."""
    client.patch_node(node_name, {"metadata": {"annotations": {HISTORY_ANNOTATION: history_text(rungs, opened)}}})


def record_opened(
    client: Any, *, node_name: str, node: Mapping[str, Any], incident: Incident
) -> tuple[tuple[Opened, ...], float | None]:
    """Record on the Node (read as ``node``) that ``incident`` opened; (the opens now, seconds since the
    previous one). Used when no :class:`Ladder` holds the history."""
    rungs, before = read_history(node), read_opened(node)
    opened, between = with_opened(before, incident)
    if opened != before:
        store_history(client, node_name=node_name, rungs=rungs, opened=opened)
    return opened, between


# ---- the stateful helper the loop holds ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class RebootResult:
    """``rebooted``: RebootInstances was called now and EC2 accepted it; ``already``: it was requested for
    this incident before (accepted, or the boot id changed since); ``pending``: a request whose outcome is
    unknown (the agent stopped around the call, or its answer was lost) waits for a new boot id until its
    deadline, never asked again before; ``failed``: EC2 refused it (``code``; reported, retried later,
    never a replace instead); ``waiting``: a failed request waits for its retry; ``not_aws`` / ``no_ec2``:
    not an EC2 instance / AWS not configured.

    ``annotations``: what the caller writes on the Node together with the incident's ``done`` (one PATCH):
    the attempt ledger as ``sent`` and the history."""

    outcome: str
    message: str = ""
    code: str = ""  # AWS's error code
    kind: str = ""  # of a failure, for metrics (a bounded set): throttled, denied, wrong-state, failed
    instance_id: str = ""
    annotations: Mapping[str, str | None] = dataclasses.field(default_factory=dict)


class Ladder:
    """Reads and writes the history and the attempt ledger on the Node, chooses rungs, and requests reboots.

    ``reboot(view) -> instance id`` calls EC2 (:class:`agent.recovery.ec2.Ec2Rebooter`; None: AWS is not
    configured); ``boot_id()`` reads this boot's id."""

    def __init__(
        self,
        *,
        client: Any,
        node_name: str,
        boot_id: Callable[[], str],
        reboot: Callable[[NodeView], str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        deadline: float = attempts.DEADLINE,
    ) -> None:
        self._client = client
        self._note: Callable[[Mapping[str, str | None]], None] | None = None  # None: a record part is PATCHed at once
        self._node_name = node_name
        self._boot_id = boot_id
        self._reboot = reboot
        self._monotonic = monotonic
        self._deadline = deadline
        self._rungs: tuple[Rung, ...] = ()
        self._opened: tuple[Opened, ...] = ()
        self._boot = ""
        self._attempt: attempts.Attempt | None = None
        self.attempt_problem = ""  # why the ledger on the Node cannot be read ("" = it can, or there is none)
        self._corrupt_since: float | None = None  # when this process first found the ledger unreadable
        self._unsent: attempts.Attempt | None = None  # reserved by this process, and not sent
        self._sent: attempts.Attempt | None = None  # sent by this process (its record may not be written yet)
        self.plans: Mapping[str, Plan] = {}  # this step's rung per incident id (the plan's climb stage)
        self.problem = ""  # why the history read at the last prepare() is unreadable ("" = it is not)
        self._retry_at: dict[str, float] = {}  # incident id -> monotonic time of the next RebootInstances try
        self._retry_delay: dict[str, float] = {}

    def write_through(self, client: Any, note: Callable[[Mapping[str, str | None]], None]) -> None:
        """Write the Node through ``client`` (agent.recovery.record.RecordStore), and hand the parts that can
        wait for the step's next PATCH (the settled ledger, an opened incident) to ``note``."""
        self._client, self._note = client, note

    def _save(self, notes: Mapping[str, str | None]) -> None:
        if self._note is not None:
            self._note(notes)
        else:
            self._client.patch_node(self._node_name, {"metadata": {"annotations": dict(notes)}})

    @property
    def rungs(self) -> tuple[Rung, ...]:
        return self._rungs

    @property
    def attempt(self) -> attempts.Attempt | None:
        return self._attempt

    def load(
        self, history: History, attempt: attempts.Attempt | None, attempt_problem: str, *, now: float, enabled: bool
    ) -> None:
        """Take the history and the attempt ledger as read from the Node this step (agent.recovery.record);
        settle the ledger and mark finished reboots (written with the step's next PATCH). An unreadable
        history counts as none; :attr:`problem` says why (the loop tells it once). To plan with: :attr:`rungs`."""
        self._rungs, self._opened, self.problem = history.rungs, history.opened, history.problem
        self._boot = self._boot_id()
        self._attempt, self.attempt_problem = attempt, attempt_problem
        if not self.attempt_problem:
            self._corrupt_since = None
        elif self._corrupt_since is None:
            self._corrupt_since = now
        if enabled:
            self._settle(now)

    def _settle(self, now: float) -> None:
        attempt = self._attempt
        settled = attempts.settle(attempt, boot=self._boot, now=now) if attempt is not None else None
        rungs = self._rungs if settled is None else settle_rungs(self._rungs, settled)
        rungs = finish_reboots(rungs, boot=self._boot, now=now) or rungs
        if settled == attempt and rungs == self._rungs:
            return
        notes: dict[str, str | None] = {HISTORY_ANNOTATION: history_text(rungs, self._opened)}
        if settled != attempt:
            notes[attempts.ATTEMPT_ANNOTATION] = attempts.attempt_text(settled)
        self._save(notes)
        self._rungs, self._attempt = rungs[-MAX_RUNGS:], settled
        if settled is not None and settled != attempt:
            log.info(
                "recovery: the reboot requested at %s is %s: %s",
                iso(settled.at),
                settled.state,
                settled.message or f"boot id now {self._boot}",
            )
        else:
            log.info("recovery: the requested reboot finished (boot id now %s); the window starts", self._boot)

    def note_opened(self, incident: Incident) -> float | None:
        """Record that ``incident`` opened (in the history read at this step's :meth:`load`); the seconds
        since the previous incident opened on this node (None: none before, or already on record)."""
        opened, between = with_opened(self._opened, incident)
        if opened != self._opened:
            self._save({HISTORY_ANNOTATION: history_text(self._rungs, opened)})
            self._opened = opened
        return between

    def reboot(self, incident: Incident, view: NodeView, *, now: float) -> RebootResult:
        """Request the reboot of this node's instance for ``incident``: at most once per incident, whatever
        stops when (the ledger is written before the call)."""
        earlier = self._earlier(incident, now)
        if earlier is not None:
            return earlier
        if self._reboot is None:
            return RebootResult(outcome="no_ec2", message="AWS is not configured for this agent")
        if self._monotonic() < self._retry_at.get(incident.id, float("-inf")):
            return RebootResult(outcome="waiting")
        mine = self._unsent
        if mine is not None and self._attempt == mine and mine.incident == incident.id:
            attempt, rung = mine, self._rung_of(mine)  # our reservation is on record: the call was never made
        else:
            attempt, rung = self._reserve(incident, now)
        return self._call(incident, view, attempt, rung)

    def _earlier(self, incident: Incident, now: float) -> RebootResult | None:
        """The answer when a request on record (or one this process made) stands in the way; None: ask EC2."""
        attempt = self._attempt
        if self.attempt_problem:  # unreadable: as if a reboot were requested on this boot when first seen
            since = self._corrupt_since if self._corrupt_since is not None else now
            if now < since + self._deadline:
                return RebootResult(
                    outcome="pending",
                    message=f"the attempt record on the Node cannot be read ({self.attempt_problem[:160]}): no reboot "
                    f"is requested before {iso(since + self._deadline)} unless a new boot shows",
                )
            return None
        if attempt is None:
            return None
        ours = attempt.incident == incident.id
        if ours and attempt.state == attempts.FINISHED:
            return RebootResult(outcome="already", message=f"requested at {iso(attempt.at)}; {attempt.state}")
        sent = self._sent
        if ours and (attempt.state == attempts.SENT or (sent is not None and sent.at == attempt.at)):
            record = dataclasses.replace(attempt, state=attempts.SENT)
            return RebootResult(
                outcome="already",
                message=f"requested at {iso(attempt.at)}; waiting for a new boot id until {iso(attempt.deadline)}",
                annotations=self._sent_notes(record),
            )
        if attempt.open and not (ours and self._unsent == attempt):
            return RebootResult(
                outcome="pending",
                message=f"a reboot requested at {iso(attempt.at)} (boot id {attempt.boot}) may or may not have "
                f"reached EC2; it is not requested again before {iso(attempt.deadline)}, and counts as done if a new "
                "boot id shows first",
            )
        return None

    def _reserve(self, incident: Incident, now: float) -> tuple[attempts.Attempt, Rung]:
        """Write the intent (ledger ``reserved`` and the rung ``requested``, one PATCH) before the call."""
        plan = self.plans.get(incident.id)
        attempt = attempts.Attempt(
            incident=incident.id,
            remedy=Remedy.REBOOT.value,
            state=attempts.RESERVED,
            boot=self._boot if self._boot else attempts.UNKNOWN_BOOT,
            at=now,
            deadline=now + self._deadline,
        )
        rung = Rung(
            incident=incident.id,
            condition=incident.condition,
            reason=incident.reason,
            remedy=Remedy.REBOOT,
            step=plan.step if plan is not None else 0,
            at=now,
            boot=attempt.boot,
            window=plan.rule.window if plan is not None else DEFAULT_WINDOW,
            outcome=REQUESTED,
        )
        self._unsent = attempt  # should the write fail yet land, the next step still knows nothing was sent
        self._write((*self._without_failed(incident), rung), attempt)
        return attempt, rung

    def _call(self, incident: Incident, view: NodeView, attempt: attempts.Attempt, rung: Rung) -> RebootResult:
        from agent.adapters.aws import AwsError

        before = self._without(incident, rung)
        try:
            instance_id = self._reboot(view)  # type: ignore[misc]  # checked by reboot()
        except AwsError as exc:
            self._unsent = None
            if call_outcome_unknown(exc):  # it may have been carried out: the ledger stays reserved
                return RebootResult(
                    outcome="pending",
                    code=exc.code or "Unknown",
                    kind=failure_kind(exc),
                    message=f"{exc}; the request may have reached EC2: not requested again before "
                    f"{iso(attempt.deadline)}, and counted as done if a new boot id shows first",
                )
            delay = min(RETRY_MAX, self._retry_delay.get(incident.id, RETRY_INITIAL / 2) * 2)
            self._retry_delay[incident.id] = delay
            self._retry_at[incident.id] = self._monotonic() + delay
            failed = dataclasses.replace(attempt, state=attempts.FAILED, message=str(exc)[: attempts.MAX_MESSAGE])
            self._write((*before, dataclasses.replace(rung, outcome=FAILED, message=str(exc)[:300])), failed)
            return RebootResult(outcome="failed", code=exc.code or "Unknown", kind=failure_kind(exc), message=str(exc))
        except NotEc2Instance as exc:
            self._unsent = None
            self._write(before, None)
            return RebootResult(outcome="not_aws", message=str(exc))
        self._unsent, self._sent = None, dataclasses.replace(attempt, state=attempts.SENT)
        self._retry_at.pop(incident.id, None)
        self._retry_delay.pop(incident.id, None)
        self._rungs = (*before, dataclasses.replace(rung, outcome=OK, message=f"instance {instance_id}"))[-MAX_RUNGS:]
        return RebootResult(
            outcome="rebooted",
            instance_id=instance_id,
            message=f"instance {instance_id}",
            annotations=self._sent_notes(self._sent),
        )

    def _sent_notes(self, attempt: attempts.Attempt) -> dict[str, str | None]:
        """The ledger as ``sent`` and the history with the rung ``ok``, for the caller's incident write."""
        rungs = tuple(
            dataclasses.replace(r, outcome=OK)
            if r.incident == attempt.incident
            and r.at == attempt.at
            and r.remedy is Remedy.REBOOT
            and r.outcome == REQUESTED
            else r
            for r in self._rungs
        )
        self._rungs, self._attempt = rungs, attempt
        return {
            attempts.ATTEMPT_ANNOTATION: attempts.attempt_text(attempt),
            HISTORY_ANNOTATION: history_text(rungs, self._opened),
        }

    def _rung_of(self, attempt: attempts.Attempt) -> Rung:
        found = [r for r in self._rungs if r.incident == attempt.incident and r.at == attempt.at]
        if found:
            return found[-1]
        raise AssertionError("a reservation is written with its rung")  # pragma: no cover

    def _without(self, incident: Incident, rung: Rung) -> tuple[Rung, ...]:
        """The history without this incident's failed requests and without ``rung`` (to be replaced)."""
        return tuple(r for r in self._without_failed(incident) if not (r.incident == rung.incident and r.at == rung.at))

    def _without_failed(self, incident: Incident) -> tuple[Rung, ...]:
        return tuple(r for r in self._rungs if not (r.incident == incident.id and r.outcome == FAILED))

    def _write(self, rungs: tuple[Rung, ...], attempt: attempts.Attempt | None) -> None:
        """The history and the ledger in one strategic merge patch (an error propagates: no call follows)."""
        notes = {
            HISTORY_ANNOTATION: history_text(rungs, self._opened),
            attempts.ATTEMPT_ANNOTATION: attempts.attempt_text(attempt),
        }
        self._client.patch_node(self._node_name, {"metadata": {"annotations": notes}})
        self._rungs, self._attempt = rungs[-MAX_RUNGS:], attempt


def call_outcome_unknown(exc: Any) -> bool:
    """A failed AWS call (an AwsError) that may have been carried out all the same: no answer (a timeout, a
    connection lost) or a 5xx. A refusal (4xx) or an error raised before the request left is not."""
    if exc.status is not None:
        return bool(exc.status >= 500)
    return exc.code in ("Timeout", "ConnectionError")


# What failure_kind returns: the ``result`` values of a failed reboot (node_health_agent_recovery_actions_total).
FAILURE_KINDS = ("throttled", "denied", "wrong-state", "failed")


def failure_kind(exc: Any) -> str:
    """A failed RebootInstances (an AwsError) as one of a few words: throttled, denied, wrong-state, failed."""
    from agent.adapters.aws import ACCESS_DENIED_CODES, INSTANCE_STATE_CODES

    if exc.code in INSTANCE_STATE_CODES:
        return "wrong-state"
    if exc.code in ACCESS_DENIED_CODES or exc.status == 403:
        return "denied"
    return "throttled" if exc.transient else "failed"


class NotEc2Instance(Exception):
    """The Node's providerID names another cloud: there is no instance to reboot."""


def ladder_state(
    node: Mapping[str, Any], incident: Incident | None, policy: RecoveryPolicy, *, now: float
) -> dict[str, Any] | None:
    """For ``status``: the ladder step of the node's incident and the observation window's end (None = the
    incident stands on no rung)."""
    if incident is None:
        return None
    rung = last_reboot(read_history(node), incident.id)
    if rung is None:
        return None
    rule = next((r for r in policy.rules if r.condition == incident.condition and rung.remedy in r.ladder), None)
    total = len(rule.ladder) if rule is not None else rung.step + 1
    if rung.outcome == FAILED:
        state = f"request failed: {rung.message[:160]}"
    elif rung.window_end is None:
        state = f"waiting for the reboot (requested {iso(rung.at)}, boot id {rung.boot})"
    else:
        state = f"rebooted; window {'ends' if now < rung.window_end else 'ended'} {iso(rung.window_end)}"
    return {
        "step": rung.step + 1,
        "of": total,
        "remedy": rung.remedy.value,
        "next": rule.ladder[rung.step + 1].value if rule is not None and rung.step + 1 < total else None,
        "outcome": rung.outcome,
        "requestedAt": rung.at,
        "windowEnd": rung.window_end,
        "text": f"{rung.remedy.value} (rung {rung.step + 1} of {total}): {state}",
    }
