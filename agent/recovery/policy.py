"""The recovery decision: a pure function of (snapshot, node, stored incident, policy, clock, budget).

:func:`decide` never remembers anything between calls: every call re-reads the current state, so an
agent restarted at any point decides the same thing again. What it must remember (what was done,
whether we cordoned, since when the node is healthy) lives in the :class:`~agent.recovery.model.Incident`
the loop stores on the Node; the decision hands back the record to store *before* acting.

What matches
    A condition matches a rule when it is ``True``, its type equals ``rule.condition``, its reason
    matches one of ``rule.reasons`` (shell globs, case-sensitive; no reasons = any reason) and the
    rule trusts the condition's owner (``rule.sources``, against ``snapshot.provenance``; no sources =
    anyone). A condition is governed by the *first* rule (policy order) whose type and reasons it
    matches: when that rule does not trust its owner, no rule acts on it. The **trigger** is the matching
    condition that has been True longest (ties: rule order); it names a new incident. Matching
    conditions are read from the snapshot at every call: when none is True the problem is gone, and
    an incident that healed while waiting (for persistence, startup or budget) is never acted on later.

Opening and continuing an incident
    No stored incident and a trigger → a new :class:`Incident` with id
    ``<condition>/<reason>/<node uid or name>/<int(since)>`` (since = the trigger's lastTransitionTime),
    ``opened = now``, ``dry_run = not enabled``. It is opened (and handed back to be stored) as soon as
    the problem is seen past the never-act and startup gates, even while it waits for persistence or
    budget. ``cordoned_by_us = not node.unschedulable`` is re-read at every call until the incident's
    first action is done, then fixed: a node someone else cordoned before we acted is never uncordoned
    by us (and its CORDON step is skipped).

    A stored incident goes on while any matching condition is True, unless a new episode began:
    its own condition type is True again with a different lastTransitionTime (in whole seconds, as
    the Node keeps it: it healed, maybe unseen, and came back), or the incident had healed
    (``healthy_since`` set) and a matching condition other than its own is True. A new episode is a
    new incident (new id, ``opened = now``) that keeps what is still in effect from the old one:
    CORDON when we cordoned and the node is still unschedulable (``cordoned_by_us`` stays True), TAINT
    when our taint is still there, the budget place (``budget_held``) and the devices still fenced
    (``fences``: agent.recovery.devicescope). Drain and mark-unhealthy
    are done again for the new episode.

Gates, in order (the first that applies decides)
    1. Control-plane node, or a node opted out (label ``OPT_OUT_LABEL``): never acted on, uncordon
       included. A stored incident is dropped (``incident=None``, ``release_budget=True``): opting a
       node out hands it to the operator; whatever we did (a cordon) stays, and its budget place is
       given back.
    2. The snapshot is not seeded yet, or ``now < started_at + policy.startup_delay``: nothing at all,
       not even clean-up (a condition not yet re-read must not look healed); the stored incident is
       kept unchanged and no new one is opened. Blocked ``StartupDelay``.
    3. Report only (``enabled`` False) while the stored incident was acted on for real
       (``dry_run`` False, e.g. ENABLE_RECOVERY was switched off mid-incident): the record is kept as
       it is (it is what lets us uncordon later), nothing is done. Blocked ``RecoveryDisabled``.
       Conversely a report-only incident met with recovery enabled starts over as a real one (same id,
       nothing done: the "done" steps were never carried out).
    4. No matching condition has persisted: ``now < condition.since + rule.persist`` for every one
       (a rule with ``lead_time`` also waits until ``now >= notBefore - lead_time``, the scheduled time
       its condition's message starts with). Blocked ``WaitingForPersistence`` (the incident is stored,
       nothing done).
    5. Nothing left: the actions of every persisted matching rule (their union, in ACTION_ORDER)
       minus ``incident.done``, and minus CORDON when ``cordoned_by_us`` is False. Blocked ``NothingLeft``.
    6. Budget: the remaining actions are all disruptive and need ``budget is not None and
       budget.can_start``; else blocked ``RecoveryBlocked`` (the message says why). When ``enabled``
       is False the budget is not consulted: report-only says what it *would* do. Pass
       ``budget=None`` first to learn whether the budget is needed at all (this gate is then the
       only reason for ``RecoveryBlocked``), read it, and decide again.
    Otherwise the decision lists the remaining actions (ACTION_ORDER) and the incident to store before
    the first one; ``rule`` is the persisted matching rule that has been True longest. The loop runs
    the actions in order and after each success stores ``with_done(incident, action)`` (report only:
    records them as "would have been done" without acting, the incident being ``dry_run``).

Healing (no matching condition is True)
    ``healthy_since`` is set to ``now`` the first time (kept after that) and the incident is handed
    back with it, unless it is closed (``incident=None``, ``release_budget=True``):

    * Marked unhealthy (MARK_UNHEALTHY done, for real): the instance is being replaced. The incident
      stays and keeps its budget place until the node leaves the cluster (the budget drops holders
      whose nodes are gone); it is never uncordoned, even with ``uncordon_after`` set — pods must
      not be scheduled onto an instance Auto Scaling is about to terminate.
    * Nothing of ours in effect (we did not cordon, or the node is schedulable again because an
      operator uncordoned it, and our taint is gone): closed, budget released.
    * Our cordon (``cordoned_by_us`` and CORDON done and the node still unschedulable) or our taint is
      in effect:
        - ``uncordon_after`` None (the default): the node **stays cordoned by us** and keeps its budget
          place — we never uncordon unless configured. It ends when the node leaves the cluster or
          an operator uncordons it (then nothing of ours is in effect: closed, released).
        - ``uncordon_after`` set: once ``now - healthy_since >= uncordon_after`` the decision is
          ``actions=(UNCORDON,)``, ``incident=None``, ``release_budget=True``. Uncordon never needs
          budget (a spent budget never blocks it); it is subject to gates 1-3 (report only: blocked
          ``RecoveryDisabled``). UNCORDON gives back only what the stored incident says we did: our
          taint, and ``spec.unschedulable`` only when ``cordoned_by_us``.
    * Report-only incidents are closed when healed (nothing is really in effect), after a would-be
      uncordon when ``uncordon_after`` is set and the cordon would have been ours. A report-only
      incident never holds a budget place: dropping one never asks for ``release_budget``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from fnmatch import fnmatchcase

from agent.core.durations import format_duration
from agent.core.timefmt import iso, read_not_before
from agent.core.types import Condition, Provenance, Snapshot, Status
from agent.recovery.model import (
    ACTION_ORDER,
    OPT_OUT_LABEL,
    Action,
    Blocked,
    BudgetView,
    Decision,
    DeviceFence,
    Incident,
    NodeView,
    PolicyRule,
    RecoveryPolicy,
    Scope,
)

__all__ = [
    "Match",
    "Proposal",
    "admit",
    "assess",
    "decide",
    "incident_id",
    "matching",
    "reason_matches",
    "rule_for",
    "trusts",
    "untrusted",
    "with_budget_held",
    "with_done",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class Match:
    """A True condition and the (first) policy rule that governs it."""

    condition: Condition
    rule: PolicyRule
    index: int  # the rule's position in the policy (ties of ``since`` go to the earlier rule)

    @property
    def since(self) -> float:
        return self.condition.last_transition

    @property
    def ripe_at(self) -> float:
        """When the condition has persisted long enough for its rule, and, with a ``lead_time``, when the
        scheduled time its message names is that close (an unreadable time: as soon as it persisted)."""
        ripe = self.condition.last_transition + self.rule.persist
        if self.rule.lead_time is not None:
            not_before = read_not_before(self.condition.message)
            if not_before is not None:
                ripe = max(ripe, not_before - self.rule.lead_time)
        return ripe


def reason_matches(rule: PolicyRule, reason: str) -> bool:
    """Whether ``reason`` matches one of the rule's globs (no globs = any reason)."""
    return not rule.reasons or any(fnmatchcase(reason, glob) for glob in rule.reasons)


def trusts(rule: PolicyRule, provenance: Provenance | None) -> bool:
    """Whether the rule acts on a problem whose condition is owned by ``provenance`` (None = unknown:
    only a rule that trusts anyone acts on it)."""
    return not rule.sources or provenance in rule.sources


def rule_for(
    policy: RecoveryPolicy, condition: Condition, provenance: Provenance | None = None
) -> tuple[int, PolicyRule] | None:
    """The first rule (and its index) whose condition type and reasons match ``condition`` and that
    trusts its owner ``provenance``; its status is not looked at."""
    for index, rule in enumerate(policy.rules):
        if rule.condition == condition.type and reason_matches(rule, condition.reason):
            return (index, rule) if trusts(rule, provenance) else None
    return None


def matching(snapshot: Snapshot, policy: RecoveryPolicy) -> tuple[Match, ...]:
    """The True conditions that match a rule trusting their owner, longest True first (ties: rule order)."""
    found = []
    for condition in snapshot.conditions:
        if condition.status is not Status.TRUE:
            continue
        hit = rule_for(policy, condition, snapshot.provenance.get(condition.type))
        if hit is not None:
            found.append(Match(condition=condition, rule=hit[1], index=hit[0]))
    return tuple(sorted(found, key=lambda m: (m.since, m.index)))


def untrusted(snapshot: Snapshot, policy: RecoveryPolicy) -> tuple[tuple[Condition, PolicyRule], ...]:
    """True conditions that a rule would govern but whose owner it does not trust (reported, not acted on)."""
    found = []
    for condition in snapshot.conditions:
        if condition.status is not Status.TRUE:
            continue
        provenance = snapshot.provenance.get(condition.type)
        for rule in policy.rules:
            if rule.condition == condition.type and reason_matches(rule, condition.reason):
                if not trusts(rule, provenance):
                    found.append((condition, rule))
                break
    return tuple(found)


def incident_id(*, condition: str, reason: str, node: NodeView, since: float) -> str:
    """``<condition>/<reason>/<node uid or name>/<int(since)>``: stable for one episode."""
    return f"{condition}/{reason}/{node.uid or node.name}/{int(since)}"


def with_done(incident: Incident, action: Action, devices: Collection[str] | None = None) -> Incident:
    """The record after ``action`` succeeded (or, report only, would have): ``done`` in ACTION_ORDER. A
    device action is a step of each of ``devices`` (None: every device of the incident)."""
    if action is Action.UNCORDON:
        raise ValueError("uncordon closes the incident: store None instead")
    if action.on_device:
        fences = tuple(
            dataclasses.replace(f, steps=(*f.steps, action))
            if (devices is None or f.device in devices) and action not in f.steps
            else f
            for f in incident.fences
        )
        incident = dataclasses.replace(incident, fences=fences)
        if action is Action.UNFENCE_DEVICE:
            return incident
    done = set(incident.done) | {action}
    return dataclasses.replace(incident, done=tuple(a for a in ACTION_ORDER if a in done))


def with_budget_held(incident: Incident, held: bool = True) -> Incident:
    """The record after the budget place was taken (``held``) or given back."""
    return dataclasses.replace(incident, budget_held=held)


# ---- the decision --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Proposal:
    """Gates 1-5 passed: ``actions`` are to be taken for ``incident``, once the budget (gate 6) admits them."""

    actions: tuple[Action, ...]
    incident: Incident
    primary: Match  # the persisted matching rule True longest
    scope: Scope = Scope.NODE  # DEVICE: device actions (agent.recovery.devicescope), the budget's device rate
    note: str = ""  # what the device scope made of it (devicescope: "devices ...", "at the node: why")


def decide(
    *,
    snapshot: Snapshot,
    node: NodeView,
    incident: Incident | None,
    policy: RecoveryPolicy,
    now: float,
    started_at: float,
    budget: BudgetView | None,
    enabled: bool,
) -> Decision:
    """What to do now (see the module docstring for the exact semantics): :func:`assess`, then :func:`admit`."""
    assessed = assess(
        snapshot=snapshot, node=node, incident=incident, policy=policy, now=now, started_at=started_at, enabled=enabled
    )
    return admit(assessed, budget=budget, enabled=enabled, now=now)


def assess(
    *,
    snapshot: Snapshot,
    node: NodeView,
    incident: Incident | None,
    policy: RecoveryPolicy,
    now: float,
    started_at: float,
    enabled: bool,
) -> Decision | Proposal:
    """Gates 1 to 5: a decision, or the actions that only the budget (gate 6) may still hold back."""
    found = matching(snapshot, policy) if snapshot.seeded else ()
    gated = _never(node, incident, found)
    if gated is None:
        gated = _starting(snapshot, policy, incident, found, now=now, started_at=started_at)
    if gated is not None:
        return gated

    stored = incident
    if stored is not None and stored.dry_run and enabled:
        # Decided while report only: nothing was really done. Start over for real, same episode.
        stored = dataclasses.replace(
            stored, done=(), dry_run=False, cordoned_by_us=not node.unschedulable, budget_held=False, drain=""
        )

    if not found:
        return Decision() if stored is None else _heal(stored, node=node, policy=policy, now=now, enabled=enabled)

    trigger = found[0]
    new_episode = stored is not None and _new_episode(stored, found)

    # 3. Report only, but the stored incident was acted on for real: keep it as recorded.
    if stored is not None and not stored.dry_run and not enabled:
        return _disabled(stored, found, new_episode=new_episode, now=now)

    if stored is None or new_episode:
        current = _open(trigger, node=node, now=now, enabled=enabled, previous=stored)
    else:
        current = dataclasses.replace(stored, healthy_since=None)
        if not current.done:
            current = dataclasses.replace(current, cordoned_by_us=not node.unschedulable)

    # 4. Persistence.
    ripe = [m for m in found if now >= m.ripe_at]
    if not ripe:
        soonest = min(found, key=lambda m: m.ripe_at)
        return Decision(
            blocked=Blocked.PERSIST,
            incident=current,
            rule=soonest.rule,
            message=_waiting(soonest, now=now),
        )
    primary = ripe[0]

    # 5. What is left to do.
    remaining = _remaining(found, current, now=now)
    if not remaining:
        return Decision(
            blocked=Blocked.NOTHING_LEFT,
            incident=current,
            rule=primary.rule,
            message=f"{_describe(primary)}: every action is done ({_names(current.done) or 'none needed'})",
        )
    return Proposal(actions=remaining, incident=current, primary=primary)


def admit(assessed: Decision | Proposal, *, budget: BudgetView | None, enabled: bool, now: float) -> Decision:
    """Gate 6, the cluster budget (report only: what it would do, budget not consulted)."""
    if isinstance(assessed, Decision):
        return assessed
    primary, remaining, current = assessed.primary, assessed.actions, assessed.incident
    # a device step only with a grant for it (a refused device step's view may still show node places)
    allowed = budget is not None and (budget.granted if assessed.scope is Scope.DEVICE else budget.can_start)
    if enabled and not allowed:
        return Decision(
            blocked=Blocked.CORRELATED if budget is not None and budget.correlated else Blocked.BUDGET,
            incident=current,
            rule=primary.rule,
            message=f"{_describe(primary)}: {_names(remaining)} blocked: {_budget_reason(budget)}",
        )
    verb = "" if enabled else "would "
    note = f" ({assessed.note})" if assessed.note else ""
    true_for = format_duration(now - primary.since)
    return Decision(
        actions=remaining,
        incident=current,
        rule=primary.rule,
        message=f"{_describe(primary)} True for {true_for}: {verb}{_names(remaining)}{note}",
    )


def _never(node: NodeView, incident: Incident | None, found: tuple[Match, ...]) -> Decision | None:
    """Gate 1: never act on a control-plane or opted-out node (None: the node is neither)."""
    if not (node.control_plane or node.opted_out):
        return None
    if incident is None and not found:
        return Decision()
    blocked = Blocked.CONTROL_PLANE if node.control_plane else Blocked.OPTED_OUT
    why = (
        "is a control-plane node"
        if node.control_plane
        else f"is opted out ({OPT_OUT_LABEL}={node.labels.get(OPT_OUT_LABEL, '')})"
    )
    if incident is None:
        return Decision(blocked=blocked, message=f"{node.name} {why}: recovery never acts on it")
    return Decision(
        blocked=blocked,
        incident=None,
        release_budget=not incident.dry_run,
        message=f"{node.name} {why}: incident {incident.id} handed to the operator (record dropped, budget "
        "place given back; nothing it did is undone)",
    )


def _starting(
    snapshot: Snapshot,
    policy: RecoveryPolicy,
    incident: Incident | None,
    found: tuple[Match, ...],
    *,
    now: float,
    started_at: float,
) -> Decision | None:
    """Gate 2, startup: nothing at all until the conditions are re-read and the delay has passed."""
    if snapshot.seeded and now >= started_at + policy.startup_delay:
        return None
    if incident is None and not found and snapshot.seeded:
        return Decision()
    why = (
        "the node's conditions are not read yet"
        if not snapshot.seeded
        else f"no recovery in the first {format_duration(policy.startup_delay)} after start "
        f"({format_duration(started_at + policy.startup_delay - now)} left)"
    )
    return Decision(blocked=Blocked.STARTUP_DELAY, incident=incident, message=why)


def _disabled(stored: Incident, found: tuple[Match, ...], *, new_episode: bool, now: float) -> Decision:
    """Gate 3: report only, but the stored incident was acted on for real: kept as recorded."""
    kept = stored if new_episode else dataclasses.replace(stored, healthy_since=None)
    would = _remaining(found, kept, now=now)
    also = f"; would do: {_names(would)}" if would and not new_episode else ""
    return Decision(
        blocked=Blocked.DISABLED,
        incident=kept,
        rule=found[0].rule,
        message=f"recovery is disabled (report only): incident {stored.id} was acted on for real "
        f"(done: {_names(stored.done) or 'nothing'}) and is kept as recorded{also}",
    )


# ---- pieces ----------------------------------------------------------------------------------------


def _names(actions: tuple[Action, ...]) -> str:
    return ", ".join(a.value for a in actions)


def _waiting(match: Match, *, now: float) -> str:
    if match.rule.lead_time is not None and match.ripe_at > match.since + match.rule.persist:
        return (
            f"{_describe(match)}: scheduled; the rule acts {format_duration(match.rule.lead_time)} ahead, at "
            f"{iso(match.ripe_at)} ({format_duration(match.ripe_at - now)} from now)"
        )
    return (
        f"{_describe(match)} has been True for {format_duration(now - match.since)}; the rule "
        f"waits for {format_duration(match.rule.persist)} ({format_duration(match.ripe_at - now)} more)"
    )


def _describe(match: Match) -> str:
    return f"{match.condition.type}={match.condition.reason}"


def _cordon_in_effect(incident: Incident, node: NodeView) -> bool:
    """We cordoned and the node is still unschedulable (report only: would have cordoned)."""
    return incident.cordoned_by_us and Action.CORDON in incident.done and (incident.dry_run or node.unschedulable)


def _taint_in_effect(incident: Incident, node: NodeView) -> bool:
    return Action.TAINT in incident.done and (incident.dry_run or node.has_our_taint)


def _new_episode(stored: Incident, found: tuple[Match, ...]) -> bool:
    own = next((m for m in found if m.condition.type == stored.condition), None)
    if own is not None:
        # Whole seconds: a condition read back from the Node after a restart has lost its fraction.
        return int(own.since) != int(stored.since)
    return stored.healthy_since is not None


def _open(trigger: Match, *, node: NodeView, now: float, enabled: bool, previous: Incident | None) -> Incident:
    """A new incident for ``trigger``, keeping what is still in effect from ``previous``."""
    done: list[Action] = []
    cordoned_by_us = not node.unschedulable
    budget_held = False
    fences: tuple[DeviceFence, ...] = ()  # fenced devices stay fenced (and are unfenced when they heal)
    if previous is not None:  # same mode as now (a real incident never reaches here in report only)
        if _cordon_in_effect(previous, node):
            done.append(Action.CORDON)
            cordoned_by_us = True
        if _taint_in_effect(previous, node):
            done.append(Action.TAINT)
        budget_held = previous.budget_held
        fences = tuple(f for f in previous.fences if _fence_in_effect(f))
    condition = trigger.condition
    return Incident(
        id=incident_id(condition=condition.type, reason=condition.reason, node=node, since=condition.last_transition),
        condition=condition.type,
        reason=condition.reason,
        since=condition.last_transition,
        opened=now,
        done=tuple(done),
        cordoned_by_us=cordoned_by_us,
        budget_held=budget_held,
        dry_run=not enabled,
        fences=fences,
    )


def _fence_in_effect(fence: DeviceFence) -> bool:
    return Action.FENCE_DEVICE in fence.steps and Action.UNFENCE_DEVICE not in fence.steps


def _remaining(found: tuple[Match, ...], incident: Incident, *, now: float) -> tuple[Action, ...]:
    """The actions of every persisted match, in ACTION_ORDER, not done yet (CORDON only if ours to do)."""
    wanted = {a for m in found if now >= m.ripe_at for a in m.rule.actions}
    return tuple(
        a
        for a in ACTION_ORDER
        if a in wanted and a not in incident.done and not (a is Action.CORDON and not incident.cordoned_by_us)
    )


def _budget_reason(budget: BudgetView | None) -> str:
    if budget is None:
        return "needs the cluster budget (not read)"
    if budget.problem:
        return f"the cluster budget cannot be used: {budget.problem}"
    if budget.correlated:
        return f"held for a correlated failure: {budget.correlated}"
    reasons = []
    if budget.group_full and not budget.this_node_holds:
        reasons.append(f"the group budget of {budget.group_full}")
    if not budget.this_node_holds and len(budget.holders) >= budget.limit:
        held = f" ({', '.join(budget.holders)})" if budget.holders else ""
        reasons.append(f"{len(budget.holders)} of {budget.limit} budget places are taken{held}")
    if budget.actions_in_window >= budget.max_actions:
        reasons.append(f"{budget.actions_in_window} of {budget.max_actions} disruptive actions in the window are used")
    if budget.max_device_actions and budget.device_actions_in_window >= budget.max_device_actions:
        reasons.append(
            f"{budget.device_actions_in_window} of {budget.max_device_actions} device actions in the window are used"
        )
    return "; ".join(reasons) or "the cluster budget is spent"


def _heal(stored: Incident, *, node: NodeView, policy: RecoveryPolicy, now: float, enabled: bool) -> Decision:
    """No matching condition is True: uncordon, keep or close the incident."""
    healthy_since = stored.healthy_since if stored.healthy_since is not None else now
    kept = dataclasses.replace(stored, healthy_since=healthy_since)
    healthy_for = now - healthy_since
    closed = Decision(
        incident=None, release_budget=not stored.dry_run, message=f"incident {stored.id} healed and closed"
    )
    cordon, taint = _cordon_in_effect(stored, node), _taint_in_effect(stored, node)
    marked = Action.MARK_UNHEALTHY in stored.done
    uncordon_after = policy.uncordon_after

    if marked and not stored.dry_run:
        return Decision(
            incident=kept,
            message=f"incident {stored.id} healed, but the instance was marked unhealthy: it is being replaced "
            "(never uncordoned; keeps its budget place until the node leaves the cluster)",
        )
    if not (cordon or taint):
        return closed
    if uncordon_after is None or marked:  # marked: report only here (a real one stays, above)
        if stored.dry_run:
            return closed
        return Decision(
            incident=kept,
            message=f"incident {stored.id} healed; the node stays cordoned by us (uncordonAfter is off) until an "
            "operator uncordons it or it leaves the cluster",
        )
    if healthy_for < uncordon_after:
        verb = "would uncordon" if stored.dry_run else "uncordon"
        return Decision(
            incident=kept,
            message=f"incident {stored.id} healed {format_duration(healthy_for)} ago; {verb} in "
            f"{format_duration(uncordon_after - healthy_for)}",
        )
    if not enabled and not stored.dry_run:
        return Decision(
            blocked=Blocked.DISABLED,
            incident=kept,
            message=f"incident {stored.id} healed {format_duration(healthy_for)} ago: would uncordon, but recovery "
            "is disabled (report only); the record is kept",
        )
    verb = "would uncordon" if stored.dry_run else "uncordon"
    return Decision(
        actions=(Action.UNCORDON,),
        incident=None,
        release_budget=not stored.dry_run,
        message=f"incident {stored.id} healed {format_duration(healthy_for)} ago: {verb}",
    )
