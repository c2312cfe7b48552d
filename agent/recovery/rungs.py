"""The ladder's pure parts: the history on the Node (rungs and opened incidents, its codec), the rung a rule
is on, the policy it implies, and the hold of a rebooted node through its window (:mod:`agent.recovery.ladder`
holds the I/O: the reboot request and the writes; :mod:`agent.recovery.plan` composes these as stages).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.durations import format_duration
from agent.core.timefmt import MAX_TIME, iso
from agent.core.types import Snapshot, Status
from agent.recovery import attempt as attempts
from agent.recovery.fields import FUTURE_SLACK, CorruptRecord, Fields, load, show
from agent.recovery.model import (
    ACTION_ORDER,
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
MAX_DEVICES = 64  # devices kept per incident open
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
    devices: tuple[str, ...] = ()  # the devices it fenced (keys): one failing again climbs (devicescope)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"incident": self.incident, "condition": self.condition, "at": self.at}
        if self.devices:
            out["devices"] = list(self.devices)
        return out

    @staticmethod
    def from_json(data: Any, *, now: float | None = None) -> Opened:
        """One entry of ``opened`` (a Mapping or :class:`Fields`); raises CorruptRecord naming the field."""
        fields = data if isinstance(data, Fields) else _object(data, "opened[]")
        return Opened(
            incident=fields.text("incident"),
            condition=fields.text("condition"),
            at=fields.time("at", now=now, ahead=FUTURE_SLACK),
            devices=fields.texts("devices", default=[], limit=300)[:MAX_DEVICES],
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


def with_opened(opened: tuple[Opened, ...], incident: Incident) -> tuple[tuple[Opened, ...], float | None]:
    """``opened`` with ``incident`` added (bounded), and the seconds since the previous incident opened
    (from its problem's time to this one's; None: no previous one, or this one is on record already).
    The devices the incident fences are kept with it (an entry on record gains those it lacks)."""
    devices = tuple(f.device for f in incident.fences)[:MAX_DEVICES]
    known = next((o for o in opened if o.incident == incident.id), None)
    if known is not None:
        more = tuple(d for d in devices if d not in known.devices)
        if not more:
            return opened, None
        grown = dataclasses.replace(known, devices=(*known.devices, *more)[:MAX_DEVICES])
        return tuple(grown if o is known else o for o in opened), None
    entry = Opened(incident=incident.id, condition=incident.condition, at=incident.since, devices=devices)
    between = max(0.0, incident.since - opened[-1].at) if opened else None
    return (*opened, entry)[-MAX_OPENED:], between


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
