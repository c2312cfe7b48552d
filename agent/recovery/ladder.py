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

The decision stays in :func:`agent.recovery.policy.decide`: :meth:`Ladder.prepare` turns each ladder
rule into a plain rule with the current rung's actions (for the reasons seen now), and
:meth:`Ladder.refine` holds the uncordon of a rebooted node until its window has passed.
Everything the ladder decides is re-read from the Node at every step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.durations import format_duration
from agent.core.timefmt import MAX_TIME, iso
from agent.core.types import Snapshot, Status
from agent.recovery import attempt as attempts
from agent.recovery.fields import FUTURE_SLACK, CorruptRecord, Fields, load, show
from agent.recovery.model import (
    ACTION_ORDER,
    DEFAULT_WINDOW,
    DOMAIN,
    Action,
    Decision,
    Incident,
    NodeView,
    PolicyRule,
    RecoveryPolicy,
    Remedy,
)
from agent.recovery.policy import incident_id, rule_for

log = logging.getLogger(__name__)

# JSON {"rungs": [Rung.to_json(), ...], "opened": [Opened.to_json(), ...]}, each oldest first
HISTORY_ANNOTATION = f"{DOMAIN}/recovery-history"
RECORD = "history"  # the record's name in what a corrupt one says (agent.recovery.fields)
MAX_STEP = len(Remedy) - 1  # a rung's step: an index into a ladder, which names each remedy at most once
MAX_BOOT = 256  # characters of a boot id (36 in Linux's format)
MAX_RUNGS = 20  # history kept on the Node (the oldest are dropped)
MAX_OPENED = 20  # incident opens kept on the Node (the oldest are dropped)
REBOOT_GRACE = 3600.0  # a requested reboot not seen finished this long no longer counts as "within the window"
RETRY_INITIAL = 30.0  # seconds before a failed RebootInstances is tried again (doubling)
RETRY_MAX = 600.0

REQUESTED, OK, FAILED = "requested", "ok", "failed"


@dataclass(frozen=True, kw_only=True, slots=True)
class Rung:
    """One reboot recovery asked for, as recorded on the Node."""

    incident: str
    condition: str
    reason: str
    remedy: Remedy
    step: int  # its place in the rule's ladder (0 = first rung)
    at: float  # requested, by the requesting agent's clock
    boot: str  # boot id when requested
    window: float
    outcome: str  # REQUESTED (before the call), OK, FAILED
    message: str = ""
    finished_at: float | None = None  # an agent on a new boot first saw it (that agent's clock)
    finished_boot: str = ""
    window_end: float | None = None

    @property
    def counts(self) -> bool:
        """A rung the ladder stands on: requested or done, not a failed request."""
        return self.outcome != FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "incident": self.incident,
            "condition": self.condition,
            "reason": self.reason,
            "remedy": self.remedy.value,
            "step": self.step,
            "at": self.at,
            "boot": self.boot,
            "window": self.window,
            "outcome": self.outcome,
            "message": self.message,
            "finishedAt": self.finished_at,
            "finishedBoot": self.finished_boot,
            "windowEnd": self.window_end,
        }

    @staticmethod
    def from_json(data: Any, *, now: float | None = None) -> Rung:
        """One entry of ``rungs`` (a Mapping or :class:`Fields`); raises CorruptRecord naming the field."""
        fields = data if isinstance(data, Fields) else _object(data, "rungs[]")
        ahead = FUTURE_SLACK
        window = fields.number("window", low=0.0, high=MAX_TIME)
        if window <= 0:
            fields.fail("window", "must be longer than 0, got 0")
        return Rung(
            incident=fields.text("incident", default=""),
            condition=fields.text("condition", default=""),
            reason=fields.text("reason", default=""),
            remedy=Remedy(fields.choice("remedy", [r.value for r in Remedy])),
            step=fields.integer("step", low=0, high=MAX_STEP),  # a ladder names each remedy at most once
            at=fields.time("at", now=now, ahead=ahead),
            boot=fields.text("boot", default="", limit=MAX_BOOT),
            window=window,
            outcome=fields.choice("outcome", (REQUESTED, OK, FAILED)),
            message=fields.text("message", default=""),
            finished_at=fields.optional_time("finishedAt", now=now, ahead=ahead),
            finished_boot=fields.text("finishedBoot", default="", limit=MAX_BOOT),
            window_end=fields.optional_time("windowEnd", now=now, ahead=ahead + window),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Opened:
    """One incident recovery opened on this node: its id, condition type and the problem's own time."""

    incident: str
    condition: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"incident": self.incident, "condition": self.condition, "at": self.at}

    @staticmethod
    def from_json(data: Any, *, now: float | None = None) -> Opened:
        """One entry of ``opened`` (a Mapping or :class:`Fields`); raises CorruptRecord naming the field."""
        fields = data if isinstance(data, Fields) else _object(data, "opened[]")
        return Opened(
            incident=fields.text("incident"),
            condition=fields.text("condition"),
            at=fields.time("at", now=now, ahead=FUTURE_SLACK),
        )


def _object(data: Any, where: str) -> Fields:
    if not isinstance(data, Mapping):
        raise CorruptRecord(RECORD, where, f"must be an object, got {show(data)}")
    return Fields(record=RECORD, data=data, path=where)


@dataclass(frozen=True, kw_only=True, slots=True)
class History:
    """The history annotation as read: its rungs and opens (oldest first), or why it is unreadable."""

    rungs: tuple[Rung, ...] = ()
    opened: tuple[Opened, ...] = ()
    problem: str = ""  # non-empty: unreadable, ignored as if absent (its next write replaces it)


def parse_history(node: Mapping[str, Any], *, now: float | None = None) -> History:
    """The history on the Node by the rules of :mod:`agent.recovery.fields` (every rung and open checked; a
    time more than a day after ``now`` refused too). Unreadable: empty, with ``problem``. Never raises for
    what the annotation holds."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(HISTORY_ANNOTATION)
    try:
        fields = load(text, RECORD)
        if fields is None:
            return History()
        rungs = tuple(Rung.from_json(r, now=now) for r in fields.objects("rungs", default=[]))
        opened = tuple(Opened.from_json(o, now=now) for o in fields.objects("opened", default=[]))
    except CorruptRecord as exc:
        return History(problem=f"{exc}: {str(text)[:200]!r}")
    return History(rungs=rungs, opened=opened)


def read_history(node: Mapping[str, Any], *, now: float | None = None) -> tuple[Rung, ...]:
    """The rungs recorded on the Node, oldest first; () when none or unreadable (logged)."""
    history = parse_history(node, now=now)
    if history.problem:
        log.warning("ignoring annotation %s, which is not a recovery history (%s)", HISTORY_ANNOTATION, history.problem)
    return history.rungs


def read_opened(node: Mapping[str, Any], *, now: float | None = None) -> tuple[Opened, ...]:
    """The incident opens recorded on the Node, oldest first; () when none or the history is unreadable."""
    return parse_history(node, now=now).opened


def history_text(rungs: tuple[Rung, ...], opened: tuple[Opened, ...] = ()) -> str:
    data: dict[str, Any] = {"rungs": [r.to_json() for r in rungs[-MAX_RUNGS:]]}
    if opened:
        data["opened"] = [o.to_json() for o in opened[-MAX_OPENED:]]
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def store_history(client: Any, *, node_name: str, rungs: tuple[Rung, ...], opened: tuple[Opened, ...] = ()) -> None:
    """Write the history annotation (a strategic merge patch of that one annotation)."""
    client.patch_node(node_name, {"metadata": {"annotations": {HISTORY_ANNOTATION: history_text(rungs, opened)}}})


def with_opened(opened: tuple[Opened, ...], incident: Incident) -> tuple[tuple[Opened, ...], float | None]:
    """``opened`` with ``incident`` added (bounded), and the seconds since the previous incident opened
    (from its problem's time to this one's; None: no previous one, or this one is on record already)."""
    if any(o.incident == incident.id for o in opened):
        return opened, None
    entry = Opened(incident=incident.id, condition=incident.condition, at=incident.since)
    between = max(0.0, incident.since - opened[-1].at) if opened else None
    return (*opened, entry)[-MAX_OPENED:], between


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


# ---- the pure parts --------------------------------------------------------------------------------


def rung_actions(rule: PolicyRule, remedy: Remedy) -> tuple[Action, ...]:
    """The actions of ``rule`` at ``remedy``: its own plus the remedy's, in ACTION_ORDER."""
    extra = {
        Remedy.REBOOT: {Action.CORDON, Action.DRAIN, Action.REBOOT},
        Remedy.REPLACE: {Action.CORDON, Action.MARK_UNHEALTHY},
    }[remedy]
    wanted = set(rule.actions) | extra
    return tuple(a for a in ACTION_ORDER if a in wanted)


def _window_end(rung: Rung) -> float:
    """When being "within the window" of ``rung`` ends (a reboot never seen finished expires too)."""
    if rung.window_end is not None:
        return rung.window_end
    return rung.at + REBOOT_GRACE + rung.window


def step_for(
    rule: PolicyRule, *, incident: str, condition: str, reason: str, rungs: tuple[Rung, ...], now: float
) -> tuple[int, str]:
    """The rung (index into ``rule.ladder``) for the incident ``incident`` of ``condition=reason`` now, and
    why it climbed ("" = it did not)."""
    top = len(rule.ladder) - 1
    own = [r for r in rungs if r.counts and r.condition == condition and r.reason == reason]
    mine = [r for r in own if r.incident == incident]
    if mine:  # this incident stands on a rung already: stay there, unless the problem outlived the window
        last = mine[-1]
        if last.window_end is not None and now >= last.window_end and last.step < top:
            return last.step + 1, f"still {reason} when the window after the {last.remedy.value} ended"
        return min(last.step, top), ""
    if not own:
        return 0, ""
    last = own[-1]
    if now < _window_end(last):
        step = min(top, last.step + 1)
        return step, f"{reason} again within the window after the {last.remedy.value}" if step > last.step else ""
    if rule.repeat_count:
        recent = [r for r in own if r.at >= now - rule.repeat_period]
        if recent and len(recent) + 1 >= rule.repeat_count:
            step = min(top, recent[-1].step + 1)
            if step > 0:
                return step, (
                    f"{reason} for the {len(recent) + 1}th time within {format_duration(rule.repeat_period)} "
                    "on this instance"
                )
    return 0, ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The rung chosen for one incident (by its would-be id) at the last :meth:`Ladder.prepare`."""

    rule: PolicyRule  # the policy's ladder rule
    step: int
    climbed: str  # why it climbed ("" = it did not)

    @property
    def remedy(self) -> Remedy:
        return self.rule.ladder[self.step]


def _escape(reason: str) -> str:
    """``reason`` as a glob matching only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in reason)


def effective_policy(
    policy: RecoveryPolicy, *, snapshot: Snapshot, view: NodeView, rungs: tuple[Rung, ...], now: float
) -> tuple[RecoveryPolicy, dict[str, Plan]]:
    """``policy`` with, ahead of its rules, one plain rule per True condition a ladder rule governs:
    that reason only, with the actions of its current rung; and the plans by incident id."""
    plans: dict[str, Plan] = {}
    specials: list[PolicyRule] = []
    for condition in snapshot.conditions:
        if condition.status is not Status.TRUE:
            continue
        hit = rule_for(policy, condition, snapshot.provenance.get(condition.type))
        if hit is None or not hit[1].ladder:
            continue
        rule = hit[1]
        iid = incident_id(condition=condition.type, reason=condition.reason, node=view, since=condition.last_transition)
        step, climbed = step_for(
            rule, incident=iid, condition=condition.type, reason=condition.reason, rungs=rungs, now=now
        )
        plan = Plan(rule=rule, step=step, climbed=climbed)
        plans[iid] = plan
        specials.append(
            dataclasses.replace(
                rule,
                reasons=(_escape(condition.reason),),
                actions=rung_actions(rule, plan.remedy),
                source=f"{rule.source} (rung {step + 1}: {plan.remedy.value})",
            )
        )
    if not specials:
        return policy, plans
    return dataclasses.replace(policy, rules=(*specials, *policy.rules)), plans


def finish_reboots(rungs: tuple[Rung, ...], *, boot: str, now: float) -> tuple[Rung, ...] | None:
    """The history with every requested reboot whose boot id is no longer this one marked finished (the
    window starts now); None when nothing changed. An unknown boot id (now, or when it was requested)
    tells nothing: such a reboot finishes at its deadline (:data:`agent.recovery.attempt.DEADLINE`)."""
    changed = False
    out = []
    for rung in rungs:
        if rung.counts and rung.remedy is Remedy.REBOOT and rung.finished_at is None:
            if not attempts.known(rung.boot):  # nothing to compare: its deadline decides
                done = now >= rung.at + attempts.DEADLINE
            else:
                done = attempts.known(boot) and rung.boot != boot
            if done:
                new_boot = boot if attempts.known(boot) else ""
                rung = dataclasses.replace(rung, finished_at=now, finished_boot=new_boot, window_end=now + rung.window)
                changed = True
        out.append(rung)
    return tuple(out) if changed else None


def settle_rungs(rungs: tuple[Rung, ...], attempt: attempts.Attempt) -> tuple[Rung, ...]:
    """The history with the rung of ``attempt`` (same incident, same request time) as the attempt now stands."""
    out = []
    for rung in rungs:
        if rung.remedy is Remedy.REBOOT and rung.incident == attempt.incident and rung.at == attempt.at:
            if attempt.state == attempts.FAILED and rung.outcome != FAILED:
                rung = dataclasses.replace(rung, outcome=FAILED, message=attempt.message[:300])
            elif attempt.state == attempts.FINISHED and rung.finished_at is None and rung.counts:
                assert attempt.finished_at is not None
                rung = dataclasses.replace(
                    rung,
                    finished_at=attempt.finished_at,
                    finished_boot=attempt.finished_boot,
                    window_end=attempt.finished_at + rung.window,
                )
        out.append(rung)
    return tuple(out)


def last_reboot(rungs: tuple[Rung, ...], incident: str) -> Rung | None:
    found = [r for r in rungs if r.counts and r.remedy is Remedy.REBOOT and r.incident == incident]
    return found[-1] if found else None


def refine(decision: Decision, *, stored: Incident | None, rungs: tuple[Rung, ...], now: float) -> Decision:
    """Hold a rebooted node cordoned until the reboot finished and it stayed healthy through the window,
    then uncordon it (ours only). Other decisions pass unchanged."""
    if decision.blocked is not None or (decision.actions and decision.actions != (Action.UNCORDON,)):
        return decision
    incident = decision.incident if decision.incident is not None else stored
    if incident is None or incident.dry_run or Action.MARK_UNHEALTHY in incident.done:
        return decision
    rung = last_reboot(rungs, incident.id)
    if rung is None:
        return decision
    uncordoning = decision.actions == (Action.UNCORDON,)
    healed = decision.incident.healthy_since if decision.incident is not None else None
    if not uncordoning and healed is None:
        return decision  # the problem is there (or closed as nothing of ours is in effect): not ours to hold
    since = healed if healed is not None else (stored.healthy_since if stored and stored.healthy_since else now)
    kept = dataclasses.replace(incident, healthy_since=since)
    if rung.finished_at is None or rung.window_end is None:
        return Decision(
            incident=kept,
            message=f"incident {incident.id}: waiting for the reboot requested at {iso(rung.at)} (boot id still "
            f"{rung.boot}); the node stays cordoned",
        )
    end = max(rung.window_end, since + rung.window)
    if now < end:
        return Decision(
            incident=kept,
            message=f"incident {incident.id}: rebooted; observing until {iso(end)} "
            f"({format_duration(end - now)} left); the node stays cordoned",
        )
    return Decision(
        actions=(Action.UNCORDON,),
        incident=None,
        release_budget=True,
        message=f"incident {incident.id}: healthy through the {format_duration(rung.window)} window after the "
        "reboot: uncordon",
    )


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
