"""The ``recovery`` component: reads the snapshot feed, plans (pure stages), acts, records.

Each step (on a new publication, and at least every ``interval`` seconds) is a straight line:

1. the latest snapshot (never a remembered one: an incident that healed meanwhile is not acted on);
2. the Node, read fresh, and recovery's record on it (:func:`agent.recovery.record.read_record`);
3. the plan's stages before the gates (:mod:`agent.recovery.plan`: flaps, the ladder, the decision);
4. the gates: the holds (pauses, vetoes, the agent's health) and, when the plan needs it, the cluster
   budget (:class:`~agent.recovery.budget.ClusterBudget`); then the stages after the gates;
5. the actions in order (:mod:`agent.recovery.actions`), each recorded on the Node as soon as it is
   done, so a restarted agent never repeats one (no second ``SetInstanceHealth``, no re-cordon);
6. Events (the catalogue :mod:`agent.recovery.events`, through the main loop) and counters.

Report-only (``ENABLE_RECOVERY`` not ``true``) plans the same way but does none of the side
effects: no Node writes, no budget, no AWS call. It counts ``would`` actions and says "dry run" in
one Event per action and incident (kept in memory: a restart may say it again).

The loop never writes NodeState; a failing API (Kubernetes or AWS) is retried with backoff on the
next steps and never stops detection.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent.core.backoff import Backoff
from agent.core.bus import Inbox, Publication, SnapshotFeed
from agent.core.types import Snapshot
from agent.recovery import events, flaps
from agent.recovery.actions import REMEDIES, Actor, Drainer, MarkUnhealthy, Outcome
from agent.recovery.attempt import ATTEMPT_ANNOTATION
from agent.recovery.gates import BUDGET_RETRY, BUDGET_RETRY_JITTER, Gates
from agent.recovery.holds import Hold, HoldGate
from agent.recovery.model import INCIDENT_ANNOTATION, Action, Decision, Incident, NodeView, RecoveryPolicy
from agent.recovery.plan import Planning, conclude, plan
from agent.recovery.policy import admit
from agent.recovery.record import RecordStore
from agent.recovery.rungs import History
from agent.recovery.stats import UNTRUSTED, RecoveryStats
from agent.recovery.tell import Herald

if TYPE_CHECKING:  # annotations only: the loop imports its helpers in the functions that use them
    from agent.adapters.kube import KubeClient
    from agent.recovery.budget import ClusterBudget
    from agent.recovery.deviceactions import DeviceDrainer, DeviceFencing, HolderFinding, HolderTelling
    from agent.recovery.ladder import Ladder

__all__ = ["BUDGET_RETRY", "BUDGET_RETRY_JITTER", "INTERVAL", "REMEDIES", "UNTRUSTED", "RecoveryLoop", "RecoveryStats"]

log = logging.getLogger(__name__)

INTERVAL = 5.0  # seconds between steps when nothing is published
MAX_BACKOFF = 60.0


@dataclasses.dataclass(frozen=True)
class Pause:
    """How long the loop pauses after a turn (:meth:`RecoveryLoop.turn`): ``seconds``, ended early by a new
    publication or the pause Lease's next read unless ``wakes_on_publication`` is False (a failed step's
    backoff, waited out in full)."""

    seconds: float
    wakes_on_publication: bool = True


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
        drainer: Drainer | None = None,  # (stop, report(kind, message)) -> DrainResult; reports become Events
        # evidence before a remedy: (action, incident) -> incident with the bundle's locations (recovery.bundle)
        bundle: Callable[[Action, Incident], Incident] | None = None,
        ladder: Ladder | None = None,  # rules with a ladder (reboot, then replace)
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        interval: float = INTERVAL,
        stall_timeout: float = 600.0,
        holds: HoldGate | None = None,  # pauses, vetoes, agent health (None: health and vetoes only)
        budget_retry: float = BUDGET_RETRY,  # first wait of a refused node before it asks again (grows x20)
        # the device scope (agent.recovery.deviceactions): DeviceFencer, HolderLookup, HolderTeller, and a
        # drain of only some pods ((stop, report, pod keys) -> DrainResult); None each where not wired
        fencer: DeviceFencing | None = None,
        holders: HolderFinding | None = None,
        holder_teller: HolderTelling | None = None,
        device_drainer: DeviceDrainer | None = None,
    ) -> None:
        if enabled and budget is None:
            raise ValueError("recovery that acts needs the cluster budget")
        self._feed, self._inbox, self._client, self._node_name = feed, inbox, client, node_name
        self._policy, self._enabled, self._budget, self._ladder = policy, enabled, budget, ladder
        self._clock, self._monotonic = clock, monotonic
        self._interval, self._stall_timeout = interval, stall_timeout
        self._started_at = clock()
        self._beat = monotonic()
        self._backoff = Backoff(initial=interval, maximum=MAX_BACKOFF)
        self._dry: Incident | None = None  # report-only keeps its incident here, never on the Node
        # The last step found no open incident: until the policy matches a problem, the Node need not be
        # read every interval (one GET per node every 5 s adds up across a fleet). False at start, so the
        # first step reads the Node and finds an incident a previous run left.
        self._quiet = False
        self._history = History()  # the ladder's history as read at this step (without a ladder)
        self._trouble = ""  # why this step stood back as failed (retried with backoff, like an error)
        self._requested: set[str] = set()  # validation requests this process put into the inbox (by id)
        self._startup_asked: float | None = None  # when this process put the startup validation request
        self._startup_done = policy.startup_validation is None or not enabled  # nothing (more) for the startup gate
        self._startup_told: set[str] = set()
        self._stop = threading.Event()
        self.stats = RecoveryStats(enabled=enabled)
        self._herald = Herald(inbox=inbox, node_name=node_name, clock=lambda: self._clock())  # a test may swap it
        self._store = RecordStore(client, node_name)  # every Node write of a step, the record's parts with the next
        if ladder is not None:
            ladder.write_through(self._store, self._store.note)
        self.holds = holds or HoldGate(store=None, client=client, node_name=node_name, monotonic=monotonic)
        self._gates = Gates(holds=self.holds, budget=budget, stats=self.stats, retry=budget_retry)
        self._actor = Actor(
            client=self._store,
            node_name=node_name,
            policy=policy,
            holds=self.holds,
            latest=feed.latest,
            tell=self._herald.tell,
            count=lambda action, kind: self.stats.actions.update([(action.value, kind)]),
            count_hold=lambda hold: self.stats.blocked.update([hold.kind.value]),
            drains=lambda outcome: self.stats.drains.update([outcome]),
            monotonic=monotonic,
            token=uuid.uuid4().hex,
            note=self._store.note,
            mark_unhealthy=mark_unhealthy,
            drainer=drainer,
            bundle=bundle,
            ladder=ladder,
            fencer=fencer,
            holders=holders,
            holder_teller=holder_teller,
            device_drainer=device_drainer,
            fences=lambda outcome: self.stats.fences.update([outcome]),
        )

    @property
    def _drainer(self) -> Drainer | None:
        return self._actor.drainer

    @_drainer.setter
    def _drainer(self, drainer: Drainer | None) -> None:
        self._actor.drainer = drainer

    # ---- component -------------------------------------------------------------------------------

    def healthy(self, now: float) -> bool:
        """Alive: the loop turned within the stall timeout, or a drain (bounded by its own timeout, which
        may be longer) is running: a liveness restart must not cut a drain short."""
        beat = max(self._beat, self._actor.drain_ended)
        return now - beat < self._stall_timeout or now < self._actor.draining_until

    @property
    def stopping(self) -> threading.Event:
        """The stop event of :meth:`run` (a holder Event waiting for room in the inbox ends with it)."""
        return self._stop

    @property
    def last_error(self) -> str | None:
        return self.stats.last_error

    def run(self, stop: threading.Event) -> None:
        self.attach(stop)
        seen = 0
        pause = Pause(self._interval)
        while not stop.is_set():
            if not pause.wakes_on_publication:
                if stop.wait(pause.seconds):
                    return
                pause = Pause(0.0)  # the backoff pause is over: turn again now (not after a second pause)
            pub = self._feed.wait_newer(seen, timeout=min(pause.seconds, self.holds.due_in()))
            if stop.is_set():
                return
            if pub is not None:
                seen = pub.number
            pause = self.turn()

    def attach(self, stop: threading.Event) -> None:
        """The stop that ends a drain or a wait for room in the inbox (``run`` attaches its own)."""
        self._stop = self._actor.stop = self._herald.stop = stop

    def turn(self) -> Pause:
        """One turn of the loop on the latest publication: the pause Lease when due, then a step. Returns
        how long to pause before the next turn: a new publication or the pause Lease's next read ends it
        early, except after a failed step (its backoff is waited out). ``run`` turns and waits; a stepped
        simulation (bench/fleetstep.py) calls it at the simulated time the pause ends."""
        self._beat = self._monotonic()
        # The pause Lease, when due: idle agents know of a pause too. One waiting out the budget's backoff acts on
        # nothing before it asks again (and reads the pause Lease then): it polls as an idle one does.
        waiting = self._gates.retry_in(self._clock()) > 0
        self.holds.poll(None if waiting else self.stats.incident)
        self._trouble = ""
        try:
            self.step()
        except Exception as exc:  # an API outage or a bug: never fatal, retried with backoff
            self._failed(f"{type(exc).__name__}: {exc}", exc)
            return Pause(self._backoff.next_delay(), wakes_on_publication=False)
        if self._trouble:  # a step that stood back (another agent's claim) is retried like a failed one
            self._failed(self._trouble, None)
            return Pause(self._backoff.next_delay(), wakes_on_publication=False)
        self._backoff.reset()
        self.stats.last_error = None  # /healthz details show current trouble only (the count stays)
        # Refused by the budget: nothing to do before the budget's backoff ends (a new publication still wakes
        # the loop at once): every blocked node of a fleet-wide misfire stepping every 5 s would read its Node
        # and the pause Lease 2N/5 times a second.
        return Pause(max(self._interval, self._gates.retry_in(self._clock())))

    def _failed(self, message: str, exc: Exception | None) -> None:
        self.stats.errors += 1
        self.stats.last_error = message
        if exc is None or _expected(exc):
            log.warning("recovery step failed (retrying): %s", exc or message)
        else:
            log.exception("recovery step failed (retrying)")

    # ---- one step --------------------------------------------------------------------------------

    def step(self) -> Decision | None:
        """Plan on the latest snapshot and the fresh Node; act; return the decision (None: not yet)."""
        from agent.recovery.policy import matching

        publication = self._feed.latest()
        snapshot = publication.snapshot
        if not snapshot.seeded:
            return None  # our conditions are not adopted yet: nothing to judge
        if told := self._herald.untrusted(snapshot, self._policy):
            self.stats.blocked[UNTRUSTED] += told
        if self._quiet and self._startup_done and not matching(snapshot, self._policy):
            return Decision()  # no open incident and no problem the policy covers: nothing to read the Node for
        self.stats.steps += 1
        try:
            return self._step(publication)
        finally:
            self._store.flush()  # the record's parts no PATCH of this step carried

    def _step(self, publication: Publication) -> Decision:
        snapshot = publication.snapshot
        node = self._client.get_node(self._node_name)
        planning = plan(self._read(snapshot, node, self._clock()))
        if self._ladder is not None:  # the rungs chosen, for the reboot it may request
            self._ladder.plans = planning.plans
        if planning.flap_hold is not None:
            self._note_flapping(planning)
        gated = self._gates.check(planning, publication, node)
        if isinstance(gated, Hold):
            return self._holding(gated, planning)
        decision = conclude(planning, gated)
        if self._enabled and decision.validation is not None and decision.validation.request is not None:
            hold = self.holds.check(publication=publication, node=node, incident=decision.incident)
            if hold is not None:  # a validation request is held like any disruptive step: not even recorded
                return self._holding(hold, planning)
        self._note_climb(decision, planning)
        self._note_scope(decision, planning)
        self.stats.incident = decision.incident
        self._note_blocked(decision, devices=planning.on_devices)
        if self._enabled:
            self._act(decision, planning.view, stored=planning.stored)
            self._validation(decision, stored=planning.stored)
        else:
            self._pretend(decision)
        self._quiet = (self.stats.incident if self._enabled else self._dry) is None
        if not self._startup_done:
            self._startup(snapshot, node)
        return decision

    def _read(self, snapshot: Snapshot, node: Mapping[str, Any], now: float) -> Planning:
        """The plan's inputs: the Node's view and recovery's record on it (each unreadable part told once)."""
        from agent.recovery.node import read_node_view
        from agent.recovery.record import read_record
        from agent.recovery.rungs import HISTORY_ANNOTATION

        record = read_record(node, now=now)
        self._history = record.history
        told = {INCIDENT_ANNOTATION, flaps.FLAP_ANNOTATION} if self._enabled else set()
        if self._ladder is not None:
            self._ladder.load(
                record.history, record.attempt, record.problem(ATTEMPT_ANNOTATION), now=now, enabled=self._enabled
            )
            told |= {HISTORY_ANNOTATION, ATTEMPT_ANNOTATION} if self._enabled else {HISTORY_ANNOTATION}
        for problem in record.problems:
            if problem.annotation in told:
                self._herald.corrupt(problem.annotation, problem.text, problem.what)
        self._actor.flap_record = record.flaps if self._enabled else None
        return Planning(
            snapshot=snapshot,
            view=read_node_view(node),
            stored=record.incident if self._enabled else self._dry,
            now=now,
            started_at=self._started_at,
            enabled=self._enabled,
            policy=self._policy,
            flaps=self._actor.flap_record,
            rungs=self._ladder.rungs if self._ladder is not None else None,
            opened=record.history.opened,
            requested=frozenset(self._requested),
        )

    def _holding(self, hold: Hold, p: Planning) -> Decision:
        """This step is held before it acts: told, and the Node read again at the next step."""
        assert p.assessed is not None
        self._actor.held(hold, p.pending)
        self._quiet = False
        decision = admit(p.assessed, budget=None, enabled=self._enabled, now=p.now)
        return dataclasses.replace(decision, actions=(), message=hold.message)

    # ---- acting ------------------------------------------------------------------------------------

    def _act(self, decision: Decision, view: NodeView, *, stored: Incident | None) -> None:
        """Carry out ``decision``; ``stored`` is the incident as read from the Node this step."""
        from agent.recovery import node as node_actions

        # An uncordon decision carries no incident (there is none after it): act on the stored one.
        incident = decision.incident or stored
        if decision.incident is not None and (stored is None or _fences_grew(stored, decision.incident)):
            self._note_opened(decision.incident)  # written with the incident, in the same PATCH
        if decision.actions and decision.incident is not None and decision.incident != stored:
            node_actions.store_incident(
                self._store, node_name=self._node_name, incident=incident, expect=stored, now=self._clock()
            )
        for action in decision.actions:
            if self._stop.is_set():
                return
            assert incident is not None
            try:
                incident, outcome = self._actor.do(action, incident, view, self._clock())
            except Exception:
                self.stats.actions[(action.value, "failed")] += 1
                raise
            if outcome is Outcome.HELD:
                return  # a pause or veto came before the remedy: the node stays cordoned, the next step goes on
            if outcome is Outcome.REFUSED:
                self.stats.actions[(action.value, "failed")] += 1
                self._trouble = self._actor.refused
                return
            if outcome is not Outcome.NOT_REQUESTED:  # a reboot not requested counts by its failure's kind
                self.stats.actions[(action.value, "ok")] += 1
                self._observe(action, incident)
            self.stats.incident = incident = None if action is Action.UNCORDON else incident
            if not outcome.go_on:
                return
        if not decision.actions and decision.incident != stored:
            node_actions.store_incident(
                self._store, node_name=self._node_name, incident=decision.incident, expect=stored, now=self._clock()
            )
        elif decision.actions and decision.incident is None and Action.UNCORDON not in decision.actions:
            # healed and closed after its devices were unfenced: nothing else of ours in effect
            node_actions.store_incident(self._store, node_name=self._node_name, incident=None)
            self.stats.incident = None
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
        """A new incident: note it in the Node's history (written with the incident) and time it from the
        previous one's opening."""
        from agent.recovery.rungs import HISTORY_ANNOTATION, history_text, with_opened

        if self._ladder is not None:  # it holds the history read this step: one writer of the annotation
            between = self._ladder.note_opened(incident)
        else:
            opened, between = with_opened(self._history.opened, incident)
            if opened != self._history.opened:
                self._store.note({HISTORY_ANNOTATION: history_text(self._history.rungs, opened)})
        if between is not None:
            self.stats.between.observe(between)

    def _closed(self, incident: Incident) -> None:
        """The incident healed and was closed: how long it was open, and with what remedy."""
        self.stats.phases["closed"].observe(self._clock() - incident.since)
        remedy = next((a.value for a in reversed(incident.done) if a.disruptive), "none")
        self.stats.incidents[(incident.condition, remedy, "healed")] += 1

    def _pretend(self, decision: Decision) -> None:
        """Report only: count and tell what would be done, and keep the incident in memory."""
        from agent.recovery.deviceactions import unfence_targets
        from agent.recovery.policy import with_done

        # An uncordon decision carries no incident (there is none after it): it acts on the kept one. A
        # decision without actions hands back the record as it is now: None = closed, forget it.
        incident = (decision.incident or self._dry) if decision.actions else decision.incident
        for action in decision.actions:
            assert incident is not None
            self.stats.would[action.value] += 1
            self._herald.tell(incident, events.dry_run(incident, action))
            if action is Action.UNFENCE_DEVICE:  # only the devices no longer listed (all, when it healed)
                listed = self._actor.devices.listed(incident)
                incident = with_done(incident, action, devices=unfence_targets(incident, listed))
            else:
                incident = with_done(incident, action) if action is not Action.UNCORDON else None
        self._dry = incident if decision.incident is not None or not decision.actions else None

    def _validation(self, decision: Decision, *, stored: Incident | None) -> None:
        """The validation gate's request into the inbox, once the incident recording it is stored (by
        :meth:`_act`, which raised otherwise: nothing is put for an attempt not on record); its Event."""
        note = decision.validation
        if note is None:
            return
        request = note.request
        if request is not None and request.id not in self._requested:
            if not self._inbox.put(request, stop=self._stop):
                return  # stopping: the attempt on record is found lost by the next agent, and asked again
            self._requested.add(request.id)
        self._herald.tell(decision.incident or stored, events.validation(note))

    def _startup(self, snapshot: Snapshot, node: Mapping[str, Any]) -> None:
        """The startup gate (agent.recovery.startupgate): ask for the checks; untaint after the first pass."""
        from agent.recovery import node as node_actions
        from agent.recovery.startupgate import FAILED, startup

        tainted = node_actions.has_unvalidated(node)
        step = startup(
            self._policy.startup_validation, tainted=tainted, snapshot=snapshot, now=self._clock(),
            asked_at=self._startup_asked,
        )  # fmt: skip
        if step is None:
            self._startup_done = True
            return
        if step.request is not None and self._inbox.put(step.request, stop=self._stop):
            self._startup_asked = step.request.requested_at
        if step.untaint:
            node_actions.remove_unvalidated(self._store, node_name=self._node_name)
            self._startup_done = True
        if step.reason and step.reason not in self._startup_told:  # each once per process
            self._startup_told.add(step.reason)
            told = events.Told(
                type=events.WARNING if step.reason == FAILED else events.NORMAL,
                reason=step.reason,
                message=step.message,
            )
            self._herald.tell(None, told)

    # ---- telling -----------------------------------------------------------------------------------

    def _note_flapping(self, p: Planning) -> None:
        record, incident = p.flaps, p.stored
        assert record is not None and incident is not None and p.flap_hold is not None
        most = max(flaps.MAX_HOLD, self._policy.uncordon_after or 0.0)
        since = incident.opened - record.last_uncordon
        told = events.flapping(incident, since_uncordon=since, count=record.count, hold=p.flap_hold, most=most)
        self._herald.tell(incident, told)

    def _note_climb(self, decision: Decision, p: Planning) -> None:
        incident = decision.incident
        plan_ = p.plans.get(incident.id) if incident is not None else None
        if incident is not None and plan_ is not None and plan_.climbed and decision.actions:
            told = events.ladder_climbed(
                plan_.climbed, remedy=plan_.remedy.value, step=plan_.step, rungs=len(plan_.rule.ladder)
            )
            self._herald.tell(incident, told)

    def _note_scope(self, decision: Decision, p: Planning) -> None:
        """A device-scope rule acting at the node says why (once per incident)."""
        from agent.recovery.policy import Proposal

        assessed = p.assessed
        if isinstance(assessed, Proposal) and assessed.note.startswith("at the node: ") and decision.actions:
            assert decision.incident is not None
            why = assessed.note.removeprefix("at the node: ")
            self._herald.tell(decision.incident, events.device_scope_at_node(decision.incident, why))

    def _note_blocked(self, decision: Decision, *, devices: bool = False) -> None:
        from agent.recovery.model import Blocked

        if decision.blocked is None or decision.blocked is Blocked.NOTHING_LEFT:
            return
        self.stats.blocked[decision.blocked.value] += 1
        incident = decision.incident
        if decision.blocked is Blocked.CORRELATED and incident is not None and self.stats.budget is not None:
            self._herald.tell(incident, events.correlated(incident, self.stats.budget))
        if decision.blocked is Blocked.BUDGET and incident is not None:
            self._herald.tell(incident, events.blocked(incident, self.stats.budget, devices=devices))


def _fences_grew(stored: Incident, incident: Incident) -> bool:
    """A new incident, or one that fences a device more (the history keeps the devices it fenced)."""
    return stored.id != incident.id or len(incident.fences) > len(stored.fences)


def _expected(exc: Exception) -> bool:
    """API trouble (logged in one line) rather than a bug (logged with its traceback)."""
    from agent.adapters.aws import AwsError  # importing agent.adapters.aws does not load boto3
    from agent.adapters.kube import KubeError

    return isinstance(exc, KubeError | AwsError)
