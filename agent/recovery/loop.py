"""The ``recovery`` component: reads the snapshot feed, decides (pure policy), acts, records.

Each step (on a new publication, and at least every ``interval`` seconds):

1. the latest snapshot (never a remembered one: an incident that healed meanwhile is not acted on);
2. the Node, read fresh (unschedulable, labels, our taint, the incident annotation);
3. :func:`agent.recovery.policy.decide`; when it needs budget, the cluster budget is asked
   (:class:`~agent.recovery.budget.ClusterBudget`) and the decision taken again with its answer;
4. the actions in order, each recorded on the Node (the incident annotation) as soon as it is
   done, so a restarted agent never repeats one (no second ``SetInstanceHealth``, no re-cordon);
5. Events (through the main loop, as :class:`~agent.core.bus.Notice`) and counters.

Report-only (``ENABLE_RECOVERY`` not ``true``) decides the same way but does none of the side
effects: no Node writes, no budget, no AWS call. It counts ``would`` actions and says "dry run" in
one Event per action and incident (kept in memory: a restart may say it again).

The loop never writes NodeState; a failing API (Kubernetes or AWS) is retried with backoff on the
next steps and never stops detection.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agent.core.backoff import Backoff
from agent.core.bus import Inbox, Notice, SnapshotFeed
from agent.core.types import Event, Severity, Snapshot
from agent.recovery.asg import MarkResult
from agent.recovery.model import Action, Blocked, BudgetView, Decision, Incident, NodeView, RecoveryPolicy

log = logging.getLogger(__name__)

INTERVAL = 5.0  # seconds between steps when nothing is published
MAX_BACKOFF = 60.0
# A node the budget refused asks again only after a jittered backoff growing up to the budget's default
# window: every ask reads the Lease and LISTs every Node, so N blocked nodes asking every step would make
# N/5 LISTs of N Nodes a second (a fleet-wide misfire at 2,000 nodes: 400 a second).
BUDGET_RETRY = 30.0
BUDGET_RETRY_MAX = 600.0
BUDGET_RETRY_JITTER = 0.5
DRAIN_GRACE = 60.0  # beyond a drain's own timeout before a drain that does not return counts as stalled
SOURCE = "recovery"
UNTRUSTED = "UntrustedSource"  # blocked-counter key: a problem whose owner the rule does not trust


class MarkUnhealthy(Protocol):
    """The Auto Scaling side (:class:`agent.recovery.asg.AsgMarker`): mark this node's instance Unhealthy."""

    def __call__(self, node: NodeView) -> MarkResult: ...


@dataclass
class RecoveryStats:
    """What the collector exports (``node_health_agent_recovery_*``)."""

    actions: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (action, result)
    would: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # action
    blocked: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # Blocked value
    drains: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # outcome
    errors: int = 0
    steps: int = 0
    last_error: str | None = None
    incident: Incident | None = None
    budget: BudgetView | None = None
    enabled: bool = False


class RecoveryLoop:
    """The ``recovery`` component (Kubernetes mode only)."""

    name = "recovery"

    def __init__(
        self,
        *,
        feed: SnapshotFeed,
        inbox: Inbox,
        client: Any,  # agent.adapters.kube.KubeClient
        node_name: str,
        policy: RecoveryPolicy,
        enabled: bool,
        budget: Any = None,  # agent.recovery.budget.ClusterBudget; required when enabled
        mark_unhealthy: MarkUnhealthy | None = None,  # None: mark-unhealthy reports that AWS is off
        # runs a drain: (stop, report(kind, message)) -> DrainResult; the loop turns reports into Events
        drainer: Callable[[threading.Event, Callable[[str, str], None]], Any] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        interval: float = INTERVAL,
        stall_timeout: float = 600.0,
    ) -> None:
        if enabled and budget is None:
            raise ValueError("recovery that acts needs the cluster budget")
        self._feed = feed
        self._inbox = inbox
        self._client = client
        self._node_name = node_name
        self._policy = policy
        self._enabled = enabled
        self._budget = budget
        self._mark_unhealthy = mark_unhealthy
        self._drainer = drainer
        self._clock = clock
        self._monotonic = monotonic
        self._interval = interval
        self._stall_timeout = stall_timeout
        self._started_at = clock()
        self._beat = monotonic()
        self._draining_until = float("-inf")  # while a drain runs: alive until its timeout (+ grace)
        self._backoff = Backoff(initial=interval, maximum=MAX_BACKOFF)
        self._budget_backoff = Backoff(initial=BUDGET_RETRY, maximum=BUDGET_RETRY_MAX, jitter=BUDGET_RETRY_JITTER)
        self._budget_retry_at = float("-inf")  # clock time before which a refused node does not ask again
        self._dry: Incident | None = None  # report-only keeps its incident here, never on the Node
        # The last step found no open incident: until the policy matches a problem, the Node need not be
        # read every interval (one GET per node every 5 s adds up across a fleet). False at start, so the
        # first step reads the Node and finds an incident a previous run left.
        self._quiet = False
        self._said: set[tuple[str, str]] = set()  # (incident id, what) already told in an Event
        self._stop = threading.Event()
        self.stats = RecoveryStats(enabled=enabled)

    # ---- component -------------------------------------------------------------------------------

    def healthy(self, now: float) -> bool:
        """Alive: the loop turned within the stall timeout, or a drain (bounded by its own timeout, which
        may be longer) is running: a liveness restart must not cut a drain short."""
        return now - self._beat < self._stall_timeout or now < self._draining_until

    @property
    def last_error(self) -> str | None:
        return self.stats.last_error

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        seen = 0
        wait = self._interval
        while not stop.is_set():
            pub = self._feed.wait_newer(seen, timeout=wait)
            if stop.is_set():
                return
            if pub is not None:
                seen = pub.number
            self._beat = self._monotonic()
            try:
                self.step()
            except Exception as exc:  # an API outage or a bug: never fatal, retried with backoff
                self.stats.errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                if _expected(exc):
                    log.warning("recovery step failed (retrying): %s", exc)
                else:
                    log.exception("recovery step failed (retrying)")
                stop.wait(self._backoff.next_delay())
                wait = 0.0  # the backoff pause is over: step again now (not after a second pause)
                continue
            self._backoff.reset()
            self.stats.last_error = None  # /healthz details show current trouble only (the count stays)
            wait = self._interval

    # ---- one step --------------------------------------------------------------------------------

    def step(self) -> Decision | None:
        """Decide on the latest snapshot and the fresh Node; act; return the decision (None: not yet)."""
        from agent.recovery.node import read_incident, read_node_view
        from agent.recovery.policy import decide, matching, with_budget_held

        snapshot = self._feed.latest().snapshot
        if not snapshot.seeded:
            return None  # our conditions are not adopted yet: nothing to judge
        self._note_untrusted(snapshot)
        if self._quiet and not matching(snapshot, self._policy):
            return Decision()  # no open incident and no problem the policy covers: nothing to read the Node for
        self.stats.steps += 1
        node = self._client.get_node(self._node_name)
        view = read_node_view(node)
        incident = read_incident(node) if self._enabled else self._dry
        now = self._clock()

        def decided(budget: BudgetView | None) -> Decision:
            return decide(
                snapshot=snapshot,
                node=view,
                incident=incident,
                policy=self._policy,
                now=now,
                started_at=self._started_at,
                budget=budget,
                enabled=self._enabled,
            )

        decision = decided(None)  # the budget is read only when a decision needs it
        if decision.blocked is Blocked.BUDGET and self._enabled and now >= self._budget_retry_at:
            pending = decision.incident or incident
            assert pending is not None
            answer = self._budget.acquire(incident_id=pending.id)
            self.stats.budget = answer
            if answer.granted:
                self._budget_backoff.reset()
                self._budget_retry_at = float("-inf")
                decision = decided(answer)
                if decision.incident is not None:
                    decision = dataclasses.replace(decision, incident=with_budget_held(decision.incident))
            else:  # refused: still blocked, and not asking again on every step
                self._budget_retry_at = now + self._budget_backoff.next_delay()
        elif decision.blocked is not Blocked.BUDGET:  # no longer waiting: a later incident asks at once
            self._budget_backoff.reset()
            self._budget_retry_at = float("-inf")
        self.stats.incident = decision.incident
        self._note_blocked(decision)
        if self._enabled:
            self._act(decision, view, stored=incident)
        else:
            self._pretend(decision)
        self._quiet = (self.stats.incident if self._enabled else self._dry) is None
        return decision

    def _note_untrusted(self, snapshot: Snapshot) -> None:
        """Tell once per episode about a problem a rule would act on but whose owner it does not trust."""
        from agent.recovery.policy import untrusted

        for condition, rule in untrusted(snapshot, self._policy):
            key = (f"{condition.type}/{condition.reason}/{int(condition.last_transition)}", "untrusted")
            if key in self._said:
                continue
            self._said.add(key)
            self.stats.blocked[UNTRUSTED] += 1
            owner = snapshot.provenance.get(condition.type)
            kind = owner.value if owner else "source of unknown kind"
            self._event(
                None,
                "Warning",
                "RecoveryUntrustedSource",
                f"{condition.type}={condition.reason} is raised by a {kind}, which the recovery rule ({rule.source}) "
                "does not trust "
                f"(sources: {', '.join(p.value for p in rule.sources)}): reported, not acted on",
            )

    def _note_blocked(self, decision: Decision) -> None:
        if decision.blocked is None or decision.blocked is Blocked.NOTHING_LEFT:
            return
        self.stats.blocked[decision.blocked.value] += 1
        incident = decision.incident
        if decision.blocked is Blocked.BUDGET and incident is not None:
            budget = self.stats.budget
            held = (
                f" ({len(budget.holders)} of {budget.limit} places held: {', '.join(budget.holders)})" if budget else ""
            )
            self._tell_once(
                incident,
                "blocked",
                "Warning",
                "RecoveryBlocked",
                f"{incident.condition}={incident.reason}: recovery waits for the cluster budget{held}; it goes on "
                "by itself as other nodes recover or leave",
            )

    # ---- acting ------------------------------------------------------------------------------------

    def _act(self, decision: Decision, view: NodeView, *, stored: Incident | None) -> None:
        """Carry out ``decision``; ``stored`` is the incident as read from the Node this step."""
        from agent.recovery import node as node_actions

        # An uncordon decision carries no incident (there is none after it): act on the stored one.
        incident = decision.incident or stored
        if decision.actions and decision.incident is not None and decision.incident != stored:
            node_actions.store_incident(self._client, node_name=self._node_name, incident=incident)
        for action in decision.actions:
            if self._stop.is_set():
                return
            assert incident is not None
            try:
                incident, go_on = self._do(action, incident, view)
            except Exception:
                self.stats.actions[(action.value, "failed")] += 1
                raise
            self.stats.actions[(action.value, "ok")] += 1
            if action is Action.UNCORDON:
                incident = None
            self.stats.incident = incident
            if not go_on:
                return
        if not decision.actions and decision.incident != stored:
            node_actions.store_incident(self._client, node_name=self._node_name, incident=decision.incident)
        if decision.release_budget and self._budget is not None:
            self.stats.budget = self._budget.release()

    def _do(self, action: Action, incident: Incident, view: NodeView) -> tuple[Incident, bool]:
        """Carry out one action; the incident after it and whether the next actions may follow.

        A drain that did not finish (a pod past its deadline, the total timeout, a stop) is not
        done: the node stays cordoned, it is reported, and the next step tries the drain again;
        the instance is not marked unhealthy over pods that could not leave."""
        from agent.recovery import node as node_actions
        from agent.recovery.policy import with_done

        now = self._clock()
        what = f"{incident.condition}={incident.reason}"
        if action is Action.CORDON:
            update = node_actions.cordon(
                self._client, node_name=self._node_name, incident=incident, reason=incident.reason, now=now
            )
            assert update.incident is not None
            if update.incident.cordoned_by_us:
                self._event(
                    update.incident, "Warning", "RecoveryCordoned", f"{what}: cordoned (no new pods) and tainted"
                )
            else:
                self._event(
                    update.incident,
                    "Normal",
                    "RecoveryAlreadyCordoned",
                    f"{what}: the node was already cordoned by someone else; recovery will never uncordon it",
                )
            return update.incident, True  # cordon recorded itself (with what it found) on the Node
        elif action is Action.TAINT:
            node_actions.taint(self._client, node_name=self._node_name, reason=incident.reason, now=now)
            self._event(incident, "Warning", "RecoveryTainted", f"{what}: tainted NoSchedule")
        elif action is Action.DRAIN:
            incident = dataclasses.replace(incident, drain="running")
            node_actions.store_incident(self._client, node_name=self._node_name, incident=incident)
            outcome = self._drain(incident)
            incident = dataclasses.replace(incident, drain=outcome)
            if outcome not in ("done", "skipped"):
                node_actions.store_incident(self._client, node_name=self._node_name, incident=incident)
                return incident, False
        elif action is Action.MARK_UNHEALTHY:
            self._mark(incident, view)
        elif action is Action.UNCORDON:
            node_actions.uncordon(self._client, node_name=self._node_name, incident=incident)
            self._event(incident, "Normal", "RecoveryUncordoned", f"{what}: healthy again; uncordoned")
            return incident, True
        incident = with_done(incident, action)
        node_actions.store_incident(self._client, node_name=self._node_name, incident=incident)
        return incident, True

    def _drain(self, incident: Incident) -> str:
        if self._drainer is None:
            self._event(incident, "Warning", "RecoveryDrainSkipped", "drain is not configured")
            return "skipped"
        self._draining_until = self._monotonic() + self._policy.drain.timeout + DRAIN_GRACE

        def report(kind: str, message: str) -> None:
            progress = kind in ("DrainStarted", "DrainSucceeded")
            self._event(incident, "Normal" if progress else "Warning", f"Recovery{kind}", message)

        try:
            result = self._drainer(self._stop, report)
        finally:
            self._draining_until = float("-inf")
            self._beat = self._monotonic()
        self.stats.drains[result.outcome] += 1
        return result.outcome

    def _mark(self, incident: Incident, view: NodeView) -> None:
        what = f"{incident.condition}={incident.reason}"
        if self._mark_unhealthy is None:
            self._event(
                incident,
                "Warning",
                "RecoveryNoAutoScaling",
                f"{what}: mark-unhealthy skipped: AWS is not configured for this agent",
            )
            return
        result = self._mark_unhealthy(view)
        if result.outcome == "not_aws":
            self._event(incident, "Normal", "RecoveryNotAnEC2Instance", f"{what}: {result.message}")
        elif result.outcome == "no_group":
            self._event(
                incident,
                "Warning",
                "RecoveryNoAutoScalingGroup",
                f"{what}: instance {result.instance_id} is in no Auto Scaling group (Karpenter or self-managed); "
                "condition AcceleratedHardwareReady=False hands it to node repair",
            )
        else:
            self._event(incident, "Warning", "RecoveryMarkedUnhealthy", f"{what}: {result.message}")

    # ---- report-only -------------------------------------------------------------------------------

    def _pretend(self, decision: Decision) -> None:
        from agent.recovery.policy import with_done

        # An uncordon decision carries no incident (there is none after it): it acts on the kept one. A
        # decision without actions hands back the record as it is now: None = closed, forget it.
        incident = (decision.incident or self._dry) if decision.actions else decision.incident
        for action in decision.actions:
            assert incident is not None
            self.stats.would[action.value] += 1
            self._tell_once(
                incident,
                f"would-{action.value}",
                "Warning" if action.disruptive else "Normal",
                "RecoveryDryRun",
                f"dry run (ENABLE_RECOVERY is not true): would {action.value} for "
                f"{incident.condition}={incident.reason}",
            )
            incident = with_done(incident, action) if action is not Action.UNCORDON else None
        self._dry = incident

    # ---- telling -----------------------------------------------------------------------------------

    def _tell_once(self, incident: Incident, key: str, type_: str, reason: str, message: str) -> None:
        if (incident.id, key) in self._said:
            return
        self._said.add((incident.id, key))
        self._event(incident, type_, reason, message)

    def _event(self, incident: Incident | None, type_: str, reason: str, message: str) -> None:
        log.info("recovery: %s: %s", reason, message)
        event = Event(
            type=type_,
            reason=reason,
            message=message,
            timestamp=self._clock(),
            source=SOURCE,
            severity=Severity.WARNING if type_ == "Warning" else Severity.INFO,
            fields={"incident": incident.id} if incident is not None else {},
        )
        self._inbox.put(Notice(events=[event]), stop=self._stop)


def _expected(exc: Exception) -> bool:
    """API trouble (logged in one line) rather than a bug (logged with its traceback)."""
    from agent.adapters.aws import AwsError  # importing agent.adapters.aws does not load boto3
    from agent.adapters.kube import KubeError

    return isinstance(exc, KubeError | AwsError)
