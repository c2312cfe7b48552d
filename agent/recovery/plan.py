"""The recovery plan of one step: pure stages of one signature, composed in one place.

A :class:`Planning` carries what a step read (the snapshot, the Node, the record on it) and what the
stages so far made of it. Each stage is a plain function ``Planning -> Planning``:

* :data:`BEFORE_GATES` — ``damp`` (a flapping node is held cordoned longer), ``climb`` (the ladder's
  rung for each rule), ``assess`` (the decision's gates 1 to 5, :func:`agent.recovery.policy.assess`),
  ``scope`` (a ``scope: device`` rule acts on the devices its finding names, or climbs to the node:
  :func:`agent.recovery.devicescope.scope`), ``revalidate`` (a remedy whose validation failed for good
  under ``onFail: climb`` proposes the ladder's next rung: :func:`agent.recovery.validationgate.climb`);
* the loop's gates come between: the holds (pauses, vetoes, the agent's health) and the cluster budget
  are read there, as only a step about to act reads them;
* :data:`AFTER_GATES` — ``admit`` (gate 6: the budget's answer; a device step takes no node's place),
  ``refine`` (a rebooted node is watched through its window before it is uncordoned), ``unfence`` (a
  healed incident gives its fenced devices back: :func:`agent.recovery.devicescope.unfence`), ``validate``
  (no node or device goes back into service before its validation set passed:
  :func:`agent.recovery.validationgate.gate`).

A new concern is one more stage in one of the tuples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agent.core.types import Snapshot
from agent.recovery import devicescope, flaps, validationgate
from agent.recovery import rungs as ladder  # the ladder's pure parts
from agent.recovery.model import BudgetView, Decision, Incident, NodeView, RecoveryPolicy, Scope
from agent.recovery.policy import Proposal, admit, assess, with_budget_held


@dataclass(frozen=True, kw_only=True, slots=True)
class Planning:
    """One step's inputs and what the stages made of them so far."""

    snapshot: Snapshot
    view: NodeView
    stored: Incident | None  # the incident as recorded (report only: as kept in memory)
    now: float
    started_at: float
    enabled: bool
    policy: RecoveryPolicy  # as the stages so far adjusted it
    flaps: flaps.FlapRecord | None = None
    rungs: tuple[ladder.Rung, ...] | None = None  # the ladder's history (None: no ladder)
    opened: tuple[ladder.Opened, ...] = ()  # the incidents opened on this node (with the devices they fenced)
    plans: Mapping[str, ladder.Plan] = field(default_factory=dict)  # the ladder's rung per incident id
    flap_hold: float | None = None  # damped: how long the flapping node must stay healthy before it is uncordoned
    assessed: Decision | Proposal | None = None
    budget: BudgetView | None = None  # the budget's answer for admit (None: not read)
    decision: Decision | None = None
    requested: frozenset[str] = frozenset()  # validation request ids this process put into the inbox

    @property
    def acts(self) -> bool:
        """The assessment takes actions without the budget (an uncordon; report only: what it would do)."""
        if isinstance(self.assessed, Proposal):
            return not self.enabled
        return self.assessed is not None and bool(self.assessed.actions)

    @property
    def needs_budget(self) -> bool:
        """The assessment's actions wait for the cluster budget (gate 6)."""
        return isinstance(self.assessed, Proposal) and self.enabled

    @property
    def on_devices(self) -> bool:
        """The assessment's actions are device actions (the budget's device rate, no node place)."""
        return isinstance(self.assessed, Proposal) and self.assessed.scope is Scope.DEVICE

    @property
    def pending(self) -> Incident | None:
        """The incident the step is about: the one assessed, else the one recorded."""
        found = self.assessed.incident if self.assessed is not None else None
        return found or self.stored


Stage = Callable[[Planning], Planning]


def damp(p: Planning) -> Planning:
    """A node that flaps (its problem back soon after recovery uncordoned it) is held cordoned longer."""
    policy = flaps.damped(p.policy, p.flaps, p.stored)
    if policy is p.policy or p.stored is None:
        return dataclasses.replace(p, policy=policy)
    return dataclasses.replace(p, policy=policy, flap_hold=policy.uncordon_after)


def climb(p: Planning) -> Planning:
    """The ladder's current rung of each ladder rule, from the history on the Node."""
    if p.rungs is None:
        return p
    policy, plans = ladder.effective_policy(p.policy, snapshot=p.snapshot, view=p.view, rungs=p.rungs, now=p.now)
    return dataclasses.replace(p, policy=policy, plans=plans)


def assess_stage(p: Planning) -> Planning:
    assessed = assess(
        snapshot=p.snapshot,
        node=p.view,
        incident=p.stored,
        policy=p.policy,
        now=p.now,
        started_at=p.started_at,
        enabled=p.enabled,
    )
    return dataclasses.replace(p, assessed=assessed)


def scope_stage(p: Planning) -> Planning:
    """A device-scope rule's actions on the devices its finding names, or at the node (devicescope)."""
    pending = p.assessed.incident if p.assessed is not None else None
    plan_ = p.plans.get(pending.id) if pending is not None else None
    rung = plan_.step if plan_ is not None else 0
    return dataclasses.replace(p, assessed=devicescope.scope(p.assessed, opened=p.opened, now=p.now, rung=rung))


def admit_stage(p: Planning) -> Planning:
    """Gate 6 with the budget's answer; a place granted for this step is held by the incident (a device
    step takes none)."""
    assert p.assessed is not None
    decision = admit(p.assessed, budget=p.budget, enabled=p.enabled, now=p.now)
    if p.budget is not None and p.budget.granted and decision.incident is not None and not p.on_devices:
        decision = dataclasses.replace(decision, incident=with_budget_held(decision.incident))
    return dataclasses.replace(p, decision=decision)


def refine(p: Planning) -> Planning:
    """A rebooted node stays cordoned until the reboot finished and it stayed healthy through the window."""
    if p.rungs is None or p.decision is None:
        return p
    return dataclasses.replace(p, decision=ladder.refine(p.decision, stored=p.stored, rungs=p.rungs, now=p.now))


def unfence_stage(p: Planning) -> Planning:
    """A healed incident gives its fenced devices back first (devicescope)."""
    if p.decision is None:
        return p
    return dataclasses.replace(p, decision=devicescope.unfence(p.decision, stored=p.stored))


def revalidate(p: Planning) -> Planning:
    """A remedy whose validation failed for good under ``onFail: climb``: the ladder's next rung (the gates apply)."""
    assessed = validationgate.climb(p.assessed, stored=p.stored, rungs=p.rungs, policy=p.policy)
    return dataclasses.replace(p, assessed=assessed)


def validate(p: Planning) -> Planning:
    """An uncordon after a reboot's window, or an unfence, waits for the validation set (validationgate)."""
    if p.decision is None:
        return p
    decision = validationgate.gate(
        p.decision,
        stored=p.stored,
        rungs=p.rungs,
        policy=p.policy,
        snapshot=p.snapshot,
        now=p.now,
        requested=p.requested,
    )
    return dataclasses.replace(p, decision=decision)


BEFORE_GATES: tuple[Stage, ...] = (damp, climb, assess_stage, scope_stage, revalidate)
AFTER_GATES: tuple[Stage, ...] = (admit_stage, refine, unfence_stage, validate)


def run(p: Planning, stages: tuple[Stage, ...]) -> Planning:
    for stage in stages:
        p = stage(p)
    return p


def plan(p: Planning) -> Planning:
    """The stages before the gates: what the step would do, and whether it needs the budget."""
    return run(p, BEFORE_GATES)


def conclude(p: Planning, budget: BudgetView | None) -> Decision:
    """The stages after the gates, with the budget's answer (None: not read, or refused this step)."""
    done = run(dataclasses.replace(p, budget=budget), AFTER_GATES)
    assert done.decision is not None
    return done.decision
