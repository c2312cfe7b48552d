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
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agent.core.backoff import Backoff
from agent.core.bus import Inbox, Notice, SnapshotFeed
from agent.core.latency import RECOVERY_BOUNDS, Histogram
from agent.core.types import Event, Severity, Snapshot
from agent.recovery import flaps
from agent.recovery.asg import MarkResult
from agent.recovery.attempt import ATTEMPT_ANNOTATION
from agent.recovery.holds import Hold, HoldGate
from agent.recovery.model import Action, Blocked, BudgetView, Decision, Incident, NodeView, RecoveryPolicy

if TYPE_CHECKING:  # annotations only: the loop imports its helpers in the functions that use them
    from agent.adapters.kube import KubeClient
    from agent.recovery.budget import ClusterBudget
    from agent.recovery.drain import DrainResult
    from agent.recovery.ladder import Ladder

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


# The phases recovery times, each from the problem's own time (Incident.since): the node cordoned, drained,
# its remedy requested (the instance marked unhealthy or rebooted), and the incident closed (healed).
PHASES = ("cordoned", "drained", "remedy", "closed")
REMEDIES = (Action.MARK_UNHEALTHY, Action.REBOOT)  # the actions that request a remedy (replace, reboot)
# Seconds between incidents on one node: a flap within minutes up to a month of quiet.
BETWEEN_BOUNDS = (60.0, 300.0, 900.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 86400.0, 3 * 86400.0, 7 * 86400.0, 30 * 86400.0)


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
    # Seconds from the problem's own time (the incident's since) to each phase, and how long incidents stay open.
    phases: dict[str, Histogram] = dataclasses.field(
        default_factory=lambda: {phase: Histogram(bounds=RECOVERY_BOUNDS) for phase in PHASES}
    )
    # (condition, remedy, outcome) -> incidents
    incidents: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # Seconds between consecutive incidents opened on this node (their problems' own times), from its history.
    between: Histogram = dataclasses.field(default_factory=lambda: Histogram(bounds=BETWEEN_BOUNDS))


class _Held(Exception):
    """A hold found right before a remedy: the step's remaining actions wait."""


class RecoveryLoop:
    """The ``recovery`` component (Kubernetes mode only)."""

    name = "recovery"

    def __init__(
        self,
        *,
        feed: SnapshotFeed,
        inbox: Inbox,
        client: KubeClient,
        node_name: str,
        policy: RecoveryPolicy,
        enabled: bool,
        budget: ClusterBudget | None = None,  # required when enabled
        mark_unhealthy: MarkUnhealthy | None = None,  # None: mark-unhealthy reports that AWS is off
        # runs a drain: (stop, report(kind, message)) -> DrainResult; the loop turns reports into Events
        drainer: Callable[[threading.Event, Callable[[str, str], None]], DrainResult] | None = None,
        # evidence before a remedy: (action, incident) -> incident with the bundle's locations (recovery.bundle)
        bundle: Callable[[Action, Incident], Incident] | None = None,
        ladder: Ladder | None = None,  # rules with a ladder (reboot, then replace)
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        interval: float = INTERVAL,
        stall_timeout: float = 600.0,
        holds: HoldGate | None = None,  # pauses, vetoes, agent health (None: health and vetoes only)
        budget_retry: float = BUDGET_RETRY,  # first wait of a refused node before it asks again (grows x20)
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
        self._bundle = bundle
        self._ladder = ladder
        self._clock = clock
        self._monotonic = monotonic
        self._interval = interval
        self._stall_timeout = stall_timeout
        self._started_at = clock()
        self._beat = monotonic()
        self._draining_until = float("-inf")  # while a drain runs: alive until its timeout (+ grace)
        self._backoff = Backoff(initial=interval, maximum=MAX_BACKOFF)
        self._budget_backoff = Backoff(
            initial=budget_retry, maximum=budget_retry * BUDGET_RETRY_MAX / BUDGET_RETRY, jitter=BUDGET_RETRY_JITTER
        )
        self._budget_retry_at = float("-inf")  # clock time before which a refused node does not ask again
        self._dry: Incident | None = None  # report-only keeps its incident here, never on the Node
        # The last step found no open incident: until the policy matches a problem, the Node need not be
        # read every interval (one GET per node every 5 s adds up across a fleet). False at start, so the
        # first step reads the Node and finds an incident a previous run left.
        self._quiet = False
        self._node: Mapping[str, Any] = {}  # the Node as read at this step
        self._said: set[tuple[str, str]] = set()  # (incident id, what) already told in an Event
        self._flaps: flaps.FlapRecord | None = None  # the flap record read at this step
        self._token = uuid.uuid4().hex  # this agent process, in a claim on the Node (never a secret)
        self._stop = threading.Event()
        self.stats = RecoveryStats(enabled=enabled)
        self.holds = holds or HoldGate(store=None, client=client, node_name=node_name, monotonic=monotonic)

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
            pub = self._feed.wait_newer(seen, timeout=min(wait, self.holds.due_in()))
            if stop.is_set():
                return
            if pub is not None:
                seen = pub.number
            self._beat = self._monotonic()
            self.holds.poll(self.stats.incident)  # the pause Lease, when due: idle agents know of a pause too
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
        from agent.adapters.kube import KubeError
        from agent.recovery.node import read_node_view
        from agent.recovery.policy import decide, matching, with_budget_held

        publication = self._feed.latest()
        snapshot = publication.snapshot
        if not snapshot.seeded:
            return None  # our conditions are not adopted yet: nothing to judge
        self._note_untrusted(snapshot)
        if self._quiet and not matching(snapshot, self._policy):
            return Decision()  # no open incident and no problem the policy covers: nothing to read the Node for
        self.stats.steps += 1
        node = self._client.get_node(self._node_name)
        self._node = node  # as read this step (the incident history on it: _note_opened)
        view = read_node_view(node)
        now = self._clock()
        incident = self._stored_incident(node, now) if self._enabled else self._dry
        self._flaps = self._flap_record(node, now) if self._enabled else None
        policy = flaps.damped(self._policy, self._flaps, incident)  # a flapping node is held cordoned longer
        if policy is not self._policy and incident is not None:
            self._note_flapping(incident, policy)
        if self._ladder is not None:  # the current rung of each ladder rule, from the history on the Node
            policy = self._ladder.prepare(
                policy, snapshot=snapshot, node=node, view=view, now=now, enabled=self._enabled
            )
            if self._ladder.attempt_problem and self._enabled:
                self._tell_corrupt(
                    node,
                    ATTEMPT_ANNOTATION,
                    f"is not a valid reboot attempt record ({self._ladder.attempt_problem}); as a reboot may be in "
                    "flight, none is requested until its deadline has passed (or a new boot id shows); the next "
                    "request replaces it",
                )
            self._note_history(node)

        def decided(budget: BudgetView | None) -> Decision:
            return decide(
                snapshot=snapshot,
                node=view,
                incident=incident,
                policy=policy,
                now=now,
                started_at=self._started_at,
                budget=budget,
                enabled=self._enabled,
            )

        decision = decided(None)  # the budget is read only when a decision needs it
        asks = decision.blocked is Blocked.BUDGET and self._enabled and now >= self._budget_retry_at
        if decision.actions or decision.blocked is Blocked.BUDGET:  # about to act: a hold comes first
            # Only a step about to act or to ask the budget reads the pause Lease from etcd; one waiting out
            # the budget's backoff reads the API server's cache (a fleet-wide misfire: thousands of agents).
            hold = self.holds.check(
                publication=publication,
                node=node,
                incident=decision.incident or incident,
                fresh=bool(decision.actions) or asks,
            )
            if hold is not None:
                return self._holding(hold, decision, decision.incident or incident)
        else:
            self.holds.clear()
        if asks:
            pending = decision.incident or incident
            assert pending is not None
            assert self._budget is not None  # enabled: required in __init__
            try:
                answer = self._budget.acquire(
                    incident_id=pending.id, counts=not flaps.is_flap(self._flaps, pending), problem=pending.condition
                )
            except KubeError as exc:  # every round lost to other askers: back off as refused, not 5 s and again
                if exc.status == 409:
                    self._budget_retry_at = now + self._budget_backoff.next_delay()
                raise
            self.stats.budget = answer
            if answer.granted:
                self._budget_backoff.reset()
                self._budget_retry_at = float("-inf")
                # Asking takes seconds at fleet scale (a LIST, Lease conflicts): a pause written meanwhile holds
                # this step too, and a place this step took is given back (bench/fleetsim.py pause_mid_wave).
                hold = self.holds.check(publication=publication, node=node, incident=pending)
                if hold is not None:
                    if not (incident is not None and incident.budget_held):
                        self.stats.budget = self._budget.release()
                    return self._holding(hold, decision, pending)
                decision = decided(answer)
                if decision.incident is not None:
                    decision = dataclasses.replace(decision, incident=with_budget_held(decision.incident))
            elif answer.correlated:  # held, not blocked: the zone or pool fails together
                decision = decided(answer)
                self._budget_retry_at = now + self._budget_backoff.next_delay()
            else:  # refused: still blocked, and not asking again on every step
                self._budget_retry_at = now + self._budget_backoff.next_delay()
        elif decision.blocked is Blocked.BUDGET and self._enabled and self.stats.budget is not None:
            decision = decided(self.stats.budget)  # backing off: the last refusal still says why
        elif decision.blocked is not Blocked.BUDGET:  # no longer waiting: a later incident asks at once
            self._budget_backoff.reset()
            self._budget_retry_at = float("-inf")
        if self._ladder is not None:
            decision = self._ladder.refine(decision, stored=incident, now=now)
            self._note_climb(decision)
        self.stats.incident = decision.incident
        self._note_blocked(decision)
        if self._enabled:
            self._act(decision, view, stored=incident)
        else:
            self._pretend(decision)
        self._quiet = (self.stats.incident if self._enabled else self._dry) is None
        return decision

    def _stored_incident(self, node: Mapping[str, Any], now: float) -> Incident | None:
        """The incident on the Node; one that cannot be read (a hand edit: NaN, a wrong type, an absurd time)
        is ignored, as if absent, and told once (Event and log) until it changes; the next record replaces it."""
        from agent.recovery.model import INCIDENT_ANNOTATION
        from agent.recovery.node import parse_incident

        incident, problem = parse_incident(node, now=now)
        if problem:
            self._tell_corrupt(
                node,
                INCIDENT_ANNOTATION,
                f"is not a valid incident record and is ignored ({problem}); recovery "
                "decides afresh and its next record replaces it",
            )
        return incident

    def _flap_record(self, node: Mapping[str, Any], now: float) -> flaps.FlapRecord | None:
        """The flap record on the Node; one that cannot be read is ignored (no damping) and told once."""
        record, problem = flaps.parse_flaps(node, now=now)
        if problem:
            self._tell_corrupt(
                node,
                flaps.FLAP_ANNOTATION,
                f"is not a valid flap record and is ignored ({problem}); the next uncordon replaces it",
            )
        return record

    def _note_history(self, node: Mapping[str, Any]) -> None:
        """The ladder's history as read by its prepare(): one that cannot be read counts as none, told once."""
        from agent.recovery.ladder import HISTORY_ANNOTATION

        if self._ladder is not None and self._ladder.problem:
            self._tell_corrupt(
                node,
                HISTORY_ANNOTATION,
                f"is not a valid recovery history and is ignored ({self._ladder.problem}); the ladder starts "
                "over from its first rung and its next write replaces it",
            )

    def _tell_corrupt(self, node: Mapping[str, Any], annotation: str, what: str) -> None:
        """Tell once per annotation text (a problem may name the time) that a record on the Node is corrupt."""
        text = str(((node.get("metadata") or {}).get("annotations") or {}).get(annotation))
        if (text, annotation) in self._said:
            return
        self._said.add((text, annotation))
        log.warning("recovery: node %s: annotation %s %s", self._node_name, annotation, what)
        self._event(
            None, "Warning", "RecoveryCorruptRecord", f"annotation {annotation} on node {self._node_name} {what}"
        )

    def _note_flapping(self, incident: Incident, policy: RecoveryPolicy) -> None:
        from agent.core.durations import format_duration

        record = self._flaps
        assert record is not None and policy.uncordon_after is not None
        self._tell_once(
            incident,
            "flapping",
            "Warning",
            "RecoveryFlapping",
            f"{incident.condition}={incident.reason}: the problem came back "
            f"{format_duration(incident.opened - record.last_uncordon)} after recovery uncordoned the node "
            f"({record.count} uncordons in a row): the node stays cordoned until healthy for "
            f"{format_duration(policy.uncordon_after)} (doubling with each flap, at most "
            f"{format_duration(max(flaps.MAX_HOLD, self._policy.uncordon_after or 0.0))}); a flap takes no new step "
            "of the cluster budget",
        )

    def _holding(self, hold: Hold, decision: Decision, incident: Incident | None) -> Decision:
        """This step is held before it acts: told, and the Node read again at the next step."""
        self._held(hold, incident)
        self._quiet = False
        return dataclasses.replace(decision, actions=(), message=hold.message)

    def _held(self, hold: Hold, incident: Incident | None) -> None:
        """Count a step held by a pause, a veto or the agent's own health; tell once per incident and why."""
        self.stats.blocked[hold.kind.value] += 1
        if incident is not None:
            self._tell_once(incident, f"held:{hold.message}", "Warning", f"Recovery{hold.kind.value}", hold.message)

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
        if decision.blocked is Blocked.CORRELATED and incident is not None and self.stats.budget is not None:
            self._tell_once(
                incident,
                "correlated",
                "Warning",
                "RecoveryHeldCorrelated",
                f"{incident.condition}={incident.reason}: recovery holds: {self.stats.budget.correlated}; it reports "
                "and waits, and goes on by itself once fewer nodes of the group show the problem",
            )
        if decision.blocked is Blocked.BUDGET and incident is not None:
            budget = self.stats.budget
            held = f" ({budget.why_blocked})" if budget and budget.why_blocked else ""
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
        if decision.incident is not None and (stored is None or stored.id != decision.incident.id):
            self._note_opened(decision.incident)  # recorded first: a failed store below meets it on record
        if decision.actions and decision.incident is not None and decision.incident != stored:
            node_actions.store_incident(
                self._client, node_name=self._node_name, incident=incident, expect=stored, now=self._clock()
            )
        for action in decision.actions:
            if self._stop.is_set():
                return
            assert incident is not None
            try:
                incident, go_on = self._do(action, incident, view)
            except _Held:
                return  # a pause or veto came before the remedy: the node stays cordoned, the next step goes on
            except Exception:
                self.stats.actions[(action.value, "failed")] += 1
                raise
            if go_on or action is not Action.REBOOT:  # a reboot not requested counts by its failure's kind
                self.stats.actions[(action.value, "ok")] += 1
                self._observe(action, incident)
            if action is Action.UNCORDON:
                incident = None
            self.stats.incident = incident
            if not go_on:
                return
        if not decision.actions and decision.incident != stored:
            node_actions.store_incident(
                self._client, node_name=self._node_name, incident=decision.incident, expect=stored, now=self._clock()
            )
        if decision.release_budget and self._budget is not None:
            self.stats.budget = self._budget.release()
        if stored is not None and decision.incident is None and not stored.dry_run:
            self._closed(stored)  # healed (uncordoned by this step, or nothing left to undo)

    def _observe(self, action: Action, incident: Incident) -> None:
        """Time a phase an action completed (a drain only once done), from the problem's own time."""
        elapsed = self._clock() - incident.since
        if action is Action.CORDON:
            self.stats.phases["cordoned"].observe(elapsed)
        elif action is Action.DRAIN and incident.drain == "done":
            self.stats.phases["drained"].observe(elapsed)
        elif action in REMEDIES:
            self.stats.phases["remedy"].observe(elapsed)
            self.stats.incidents[(incident.condition, action.value, "remedy-requested")] += 1

    def _note_opened(self, incident: Incident) -> None:
        """A new incident: record it in the Node's history and time it from the previous one's opening. A
        figure only: a failed write is logged, never a reason to hold the step."""
        from agent.adapters.kube import KubeError
        from agent.recovery.ladder import record_opened

        try:
            if self._ladder is not None:  # it holds the history read this step: one writer of the annotation
                between = self._ladder.note_opened(incident)
            else:
                _, between = record_opened(self._client, node_name=self._node_name, node=self._node, incident=incident)
        except KubeError as exc:
            log.warning("recovery: cannot record incident %s in the Node's history: %s", incident.id, exc)
            return
        if between is not None:
            self.stats.between.observe(between)

    def _closed(self, incident: Incident) -> None:
        """The incident healed and was closed: how long it was open, and with what remedy."""
        self.stats.phases["closed"].observe(self._clock() - incident.since)
        remedy = next((a.value for a in reversed(incident.done) if a.disruptive), "none")
        self.stats.incidents[(incident.condition, remedy, "healed")] += 1

    def _do(self, action: Action, incident: Incident, view: NodeView) -> tuple[Incident, bool]:
        """Carry out one action; the incident after it and whether the next actions may follow.

        A drain that did not finish (a pod past its deadline, the total timeout, a stop) is not
        done: the node stays cordoned, it is reported, and the next step tries the drain again;
        the instance is not marked unhealthy over pods that could not leave."""
        from agent.recovery import node as node_actions
        from agent.recovery.policy import with_done

        now = self._clock()
        what = f"{incident.condition}={incident.reason}"
        if self._bundle is not None and (kept := self._bundle(action, incident)) != incident:
            incident = kept  # a reboot or replace: its evidence is taken first (30 s at most) and recorded now
            node_actions.store_incident(self._client, node_name=self._node_name, incident=incident)
        if action in REMEDIES:  # seconds after the step's hold check (cordon, drain, evidence): ask again
            node = self._client.get_node(self._node_name)
            hold = self.holds.check(publication=self._feed.latest(), node=node, incident=incident)
            if hold is not None:
                self._held(hold, incident)
                raise _Held(hold.message)
        if action is Action.CORDON:
            update = node_actions.cordon(
                self._client, node_name=self._node_name, incident=incident, reason=incident.reason, now=now
            )
            assert update.incident is not None
            if not update.changed:
                # Already so, with a record saying it: another agent given this node name got there first
                # (a conflict, then a read) and reports it; a second Event would tell it twice.
                log.info("node %s: %s: already cordoned with the incident recorded", self._node_name, what)
            elif update.incident.cordoned_by_us:
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
        elif action is Action.REBOOT:
            notes = self._reboot(incident, view, now=now)
            if notes is None:
                return incident, False  # not requested: reported, tried again later, never another remedy
            incident = with_done(incident, action)  # one PATCH: done, with the ledger as sent and the history
            node_actions.store_incident(self._client, node_name=self._node_name, incident=incident, annotations=notes)
            return incident, True
        elif action is Action.MARK_UNHEALTHY:
            incident = self._claim(incident, now)
            self._mark(incident, view)
        elif action is Action.UNCORDON:
            record = flaps.after_uncordon(self._flaps, incident, now)  # left on the Node, read by the next incident
            node_actions.uncordon(
                self._client,
                node_name=self._node_name,
                incident=incident,
                annotations={flaps.FLAP_ANNOTATION: flaps.flap_text(record)},
            )
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

        halt = self.holds.halt(self._stop, publication=self._feed.latest, incident=incident)
        try:
            result = self._drainer(halt, report)
            if halt.hold is not None:
                self._held(halt.hold, incident)
                self._event(
                    incident, "Warning", "RecoveryDrainHeld", f"drain stopped before the next pod: {halt.hold.message}"
                )
        finally:
            self._draining_until = float("-inf")
            self._beat = self._monotonic()
        self.stats.drains[result.outcome] += 1
        return result.outcome

    def _claim(self, incident: Incident, now: float) -> Incident:
        """Claim the mark on the Node first: of two agents given one node name, only one marks."""
        from agent.adapters.kube import KubeError
        from agent.recovery.node import claim_mark

        claimed = claim_mark(self._client, node_name=self._node_name, incident=incident, token=self._token, now=now)
        if claimed is not None:
            return claimed
        self._tell_once(
            incident,
            "claimed",
            "Warning",
            "RecoveryClaimedElsewhere",
            f"{incident.condition}={incident.reason}: another agent with node name {self._node_name} marks (or "
            "marked) this node's instance: this one stands back (two agents must never be given one node name)",
        )
        raise KubeError(
            f"node {self._node_name}: another agent claimed mark-unhealthy for {incident.id}",
            status=409,
            reason="Conflict",
        )

    def _reboot(self, incident: Incident, view: NodeView, *, now: float) -> Mapping[str, str | None] | None:
        """Request the reboot (agent.recovery.ladder); None: not requested (now or before), else the
        annotations to write with the incident's ``done``."""
        what = f"{incident.condition}={incident.reason}"
        result = self._ladder.reboot(incident, view, now=now) if self._ladder is not None else None
        if result is None or result.outcome == "no_ec2":
            self._tell_once(
                incident,
                "reboot-skipped",
                "Warning",
                "RecoveryRebootSkipped",
                f"{what}: reboot skipped: AWS is not configured for this agent; the node stays cordoned",
            )
            return None
        if result.outcome == "rebooted":
            self._event(
                incident,
                "Warning",
                "RecoveryRebootRequested",
                f"{what}: EC2 RebootInstances requested for "
                f"{result.instance_id}; once it is back (a new boot id) it is watched before it is uncordoned",
            )
        elif result.outcome == "not_aws":
            self._tell_once(
                incident, "reboot-not-aws", "Normal", "RecoveryNotAnEC2Instance", f"{what}: {result.message}"
            )
        elif result.outcome == "failed":
            self.stats.actions[(Action.REBOOT.value, result.kind)] += 1
            self._tell_once(
                incident,
                f"reboot-failed-{result.code}",
                "Warning",
                "RecoveryRebootFailed",
                f"{what}: {result.message}; the node stays cordoned and the reboot is tried again "
                "later (no other remedy is taken instead)",
            )
        elif result.outcome == "pending":
            if result.code:  # this step's call: its answer was lost or an error that may follow a carried-out call
                self.stats.actions[(Action.REBOOT.value, result.kind)] += 1
            self._tell_once(
                incident,
                f"reboot-pending-{result.code}",
                "Warning",
                "RecoveryRebootUnconfirmed",
                f"{what}: {result.message}; the node stays cordoned",
            )
        return result.annotations if result.outcome in ("rebooted", "already") else None

    def _note_climb(self, decision: Decision) -> None:
        incident = decision.incident
        plan = self._ladder.plans.get(incident.id) if incident is not None and self._ladder is not None else None
        if incident is not None and plan is not None and plan.climbed and decision.actions:
            self._tell_once(
                incident,
                f"climb-{plan.step}",
                "Warning",
                "RecoveryLadderClimbed",
                f"{plan.climbed}: next remedy {plan.remedy.value} (rung {plan.step + 1} of {len(plan.rule.ladder)})",
            )

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
        from agent.adapters.aws import AwsError  # importing agent.adapters.aws does not load boto3

        try:
            result = self._mark_unhealthy(view)
        except AwsError as exc:  # told once per incident and error code; the step fails and is retried
            kept = "stays cordoned" if Action.CORDON in incident.done else "stays as it is"
            self._tell_once(
                incident,
                f"mark-failed/{exc.code}",
                "Warning",
                "RecoveryMarkUnhealthyFailed",
                f"{what}: the node {kept} but is not replaced: mark-unhealthy failed ({exc}); retried with backoff",
            )
            raise
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
