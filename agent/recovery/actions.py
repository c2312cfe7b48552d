"""One handler per recovery action, each returning the incident after it and an :class:`Outcome`.

The loop runs a decision's actions in order through :meth:`Actor.do`; a handler records what it did
on the Node (the incident annotation) as soon as it is done, so a restarted agent never repeats it.
Events come from the catalogue (:mod:`agent.recovery.events`) through ``tell``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agent.core.bus import Publication
from agent.recovery import events, flaps
from agent.recovery import node as node_actions
from agent.recovery.asg import MarkResult
from agent.recovery.events import Told
from agent.recovery.holds import Hold, HoldGate
from agent.recovery.model import INCIDENT_ANNOTATION, Action, Incident, NodeView, RecoveryPolicy
from agent.recovery.policy import with_done

if TYPE_CHECKING:
    from agent.recovery.deviceactions import DeviceActor, DeviceDrainer, DeviceFencing, HolderFinding, HolderTelling
    from agent.recovery.drain import DrainResult
    from agent.recovery.ladder import Ladder

log = logging.getLogger(__name__)

DRAIN_GRACE = 60.0  # beyond a drain's own timeout before a drain that does not return counts as stalled
REMEDIES = (Action.MARK_UNHEALTHY, Action.REBOOT)  # the actions that request a remedy (replace, reboot)


class Outcome(enum.Enum):
    """How an action ended, for the loop: go on, or leave the rest of the step's actions to a later step."""

    DONE = "done"  # done and recorded: the next action may follow
    UNFINISHED = "unfinished"  # a drain that did not finish: counted, recorded, the next step tries again
    NOT_REQUESTED = "not-requested"  # a reboot not requested (now or before): reported, tried again later
    HELD = "held"  # a pause or veto came before the remedy: the node stays cordoned
    REFUSED = "refused"  # another agent claimed the mark: this one stands back; the step counts as failed

    @property
    def go_on(self) -> bool:
        return self is Outcome.DONE


class MarkUnhealthy(Protocol):
    """The Auto Scaling side (:class:`agent.recovery.asg.AsgMarker`): mark this node's instance Unhealthy."""

    def __call__(self, node: NodeView) -> MarkResult: ...


Drainer = Callable[[threading.Event, Callable[[str, str], None]], "DrainResult"]
Handler = Callable[[Incident, NodeView, float], tuple[Incident, Outcome]]


@dataclass(kw_only=True)
class Actor:
    """The I/O side of the actions: the Node, the drain, EC2 and Auto Scaling, and the holds before a remedy."""

    client: Any
    node_name: str
    policy: RecoveryPolicy
    holds: HoldGate
    latest: Callable[[], Publication]
    tell: Callable[[Incident | None, Told], None]
    count: Callable[[Action, str], None]  # an action's result by kind (a reboot's failure kind)
    count_hold: Callable[[Hold], None]  # a step held by a pause, a veto or the agent's health
    drains: Callable[[str], None]  # a drain's outcome
    monotonic: Callable[[], float]
    token: str  # this agent process, in a claim on the Node (never a secret)
    note: Callable[[Mapping[str, str | None]], None]  # a record part for the step's next PATCH (RecordStore.note)
    mark_unhealthy: MarkUnhealthy | None = None
    drainer: Drainer | None = None
    bundle: Callable[[Action, Incident], Incident] | None = None
    ladder: Ladder | None = None
    # the device scope (agent.recovery.deviceactions): the fence, who holds a device, telling them, their drain
    fencer: DeviceFencing | None = None
    holders: HolderFinding | None = None
    holder_teller: HolderTelling | None = None
    device_drainer: DeviceDrainer | None = None
    fences: Callable[[str], None] = lambda outcome: None  # a fence's outcome (counted)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    flap_record: flaps.FlapRecord | None = None  # as read at this step (the uncordon leaves the next one)
    draining_until: float = float("-inf")  # while a drain runs: alive until its timeout (+ grace)
    drain_ended: float = float("-inf")  # monotonic time the last drain returned
    refused: str = ""  # why the last REFUSED outcome stood back

    def do(self, action: Action, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        """Carry out ``action``: its evidence first (a remedy's bundle), then a hold check before a remedy."""
        if self.bundle is not None and (kept := self.bundle(action, incident)) != incident:
            # A reboot or replace: its evidence is taken first (30 s at most) and recorded with the next PATCH
            # of the step (the reboot's intent, the mark's claim), before any call; held, at the step's end.
            incident = kept
            self.note({INCIDENT_ANNOTATION: node_actions.incident_text(incident)})
        if action in REMEDIES:  # seconds after the step's hold check (cordon, drain, evidence): ask again
            node = self.client.get_node(self.node_name)
            hold = self.holds.check(publication=self.latest(), node=node, incident=incident)
            if hold is not None:
                self.held(hold, incident)
                return incident, Outcome.HELD
        handler: Handler = {
            Action.CORDON: self.cordon,
            Action.TAINT: self.taint,
            Action.DRAIN: self.drain,
            Action.REBOOT: self.reboot,
            Action.MARK_UNHEALTHY: self.mark,
            Action.UNCORDON: self.uncordon,
            Action.FENCE_DEVICE: self.fence_device,
            Action.DRAIN_DEVICE: self.drain_device,
            Action.UNFENCE_DEVICE: self.unfence_device,
        }[action]
        return handler(incident, view, now)

    def held(self, hold: Hold, incident: Incident | None) -> None:
        """Tell once per incident and why (the loop counts it)."""
        self.count_hold(hold)
        if incident is not None:
            self.tell(incident, events.held(hold.kind.value, hold.message))

    def _done(self, incident: Incident, action: Action) -> tuple[Incident, Outcome]:
        incident = with_done(incident, action)
        node_actions.store_incident(self.client, node_name=self.node_name, incident=incident)
        return incident, Outcome.DONE

    # ---- the handlers ------------------------------------------------------------------------------

    def cordon(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        update = node_actions.cordon(
            self.client, node_name=self.node_name, incident=incident, reason=incident.reason, now=now
        )
        assert update.incident is not None
        if not update.changed:
            # Already so, with a record saying it: another agent given this node name got there first
            # (a conflict, then a read) and reports it; a second Event would tell it twice.
            log.info("node %s: %s: already cordoned with the incident recorded", self.node_name, events.what(incident))
        elif update.incident.cordoned_by_us:
            self.tell(update.incident, events.cordoned(update.incident))
        else:
            self.tell(update.incident, events.already_cordoned(update.incident))
        return update.incident, Outcome.DONE  # cordon recorded itself (with what it found) on the Node

    def taint(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        node_actions.taint(self.client, node_name=self.node_name, reason=incident.reason, now=now)
        self.tell(incident, events.tainted(incident))
        return self._done(incident, Action.TAINT)

    def drain(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        """A drain that did not finish (a pod past its deadline, the total timeout, a stop) is not done: the
        node stays cordoned, it is reported, and the next step tries the drain again."""
        incident = dataclasses.replace(incident, drain="running")
        node_actions.store_incident(self.client, node_name=self.node_name, incident=incident)
        incident = dataclasses.replace(incident, drain=self._drain(incident))
        if incident.drain not in ("done", "skipped"):
            node_actions.store_incident(self.client, node_name=self.node_name, incident=incident)
            return incident, Outcome.UNFINISHED
        return self._done(incident, Action.DRAIN)

    def _drain(self, incident: Incident) -> str:
        if self.drainer is None:
            self.tell(incident, events.drain_skipped())
            return "skipped"
        self.draining_until = self.monotonic() + self.policy.drain.timeout + DRAIN_GRACE

        def report(kind: str, message: str) -> None:
            self.tell(incident, events.drain_progress(kind, message))

        halt = self.holds.halt(self.stop, publication=self.latest, incident=incident)
        try:
            result = self.drainer(halt, report)
            if halt.hold is not None:
                self.held(halt.hold, incident)
                self.tell(incident, events.drain_held(halt.hold.message))
        finally:
            self.draining_until = float("-inf")
            self.drain_ended = self.monotonic()
        self.drains(result.outcome)
        return result.outcome

    # ---- the device actions (agent.recovery.deviceactions) -------------------------------------------

    @property
    def devices(self) -> DeviceActor:
        from agent.recovery.deviceactions import DeviceActor

        return DeviceActor(
            client=self.client,
            node_name=self.node_name,
            latest=self.latest,
            tell=self.tell,
            count=self.fences,
            drains=self.drains,
            run_drain=self._device_drain,
            fencer=self.fencer,
            holders=self.holders,
            holder_teller=self.holder_teller,
            drainer=self.device_drainer,
        )

    def fence_device(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        """A fence not possible ends the step: the next step's plan climbs to the node's ladder."""
        incident, possible = self.devices.fence(incident)
        node_actions.store_incident(self.client, node_name=self.node_name, incident=incident)
        return incident, Outcome.DONE if possible else Outcome.UNFINISHED

    def drain_device(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        """Only the holder pods; one that did not finish is tried again at the next step (not cordoned)."""
        incident, finished = self.devices.drain(incident)
        if not finished:
            return incident, Outcome.UNFINISHED
        node_actions.store_incident(self.client, node_name=self.node_name, incident=incident)
        return incident, Outcome.DONE

    def unfence_device(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        return self.devices.unfence(incident), Outcome.DONE

    def _device_drain(self, incident: Incident, keys: frozenset[str], drainer: DeviceDrainer) -> DrainResult:
        """A drain of ``keys`` under the holds and the liveness grace of a node drain."""
        self.draining_until = self.monotonic() + self.policy.drain.timeout + DRAIN_GRACE

        def report(kind: str, message: str) -> None:
            self.tell(incident, events.drain_progress(kind, message))

        halt = self.holds.halt(self.stop, publication=self.latest, incident=incident)
        try:
            result = drainer(halt, report, keys)
            if halt.hold is not None:
                self.held(halt.hold, incident)
                self.tell(incident, events.drain_held(halt.hold.message))
        finally:
            self.draining_until = float("-inf")
            self.drain_ended = self.monotonic()
        return result

    def reboot(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        notes = self._reboot(incident, view, now=now)
        if notes is None:
            return incident, Outcome.NOT_REQUESTED  # reported, tried again later, never another remedy
        incident = with_done(incident, Action.REBOOT)  # one PATCH: done, with the ledger as sent and the history
        node_actions.store_incident(self.client, node_name=self.node_name, incident=incident, annotations=notes)
        return incident, Outcome.DONE

    def _reboot(self, incident: Incident, view: NodeView, *, now: float) -> Mapping[str, str | None] | None:
        """Request the reboot (agent.recovery.ladder); None: not requested (now or before), else the
        annotations to write with the incident's ``done``."""
        result = self.ladder.reboot(incident, view, now=now) if self.ladder is not None else None
        if result is None or result.outcome == "no_ec2":
            self.tell(incident, events.reboot_skipped(incident))
            return None
        if result.outcome == "rebooted":
            self.tell(incident, events.reboot_requested(incident, result.instance_id))
        elif result.outcome == "not_aws":
            self.tell(incident, events.not_ec2(incident, result.message, once="reboot-not-aws"))
        elif result.outcome == "failed":
            self.count(Action.REBOOT, result.kind)
            self.tell(incident, events.reboot_failed(incident, result.message, result.code))
        elif result.outcome == "pending":
            if result.code:  # this step's call: its answer was lost or an error that may follow a carried-out call
                self.count(Action.REBOOT, result.kind)
            self.tell(incident, events.reboot_unconfirmed(incident, result.message, result.code))
        return result.annotations if result.outcome in ("rebooted", "already") else None

    def mark(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        """Claim the mark on the Node first: of two agents given one node name, only one marks."""
        claimed = node_actions.claim_mark(
            self.client, node_name=self.node_name, incident=incident, token=self.token, now=now
        )
        if claimed is None:
            self.tell(incident, events.claimed_elsewhere(incident, self.node_name))
            self.refused = f"node {self.node_name}: another agent claimed mark-unhealthy for {incident.id}"
            return incident, Outcome.REFUSED
        self._mark(claimed, view)
        return self._done(claimed, Action.MARK_UNHEALTHY)

    def _mark(self, incident: Incident, view: NodeView) -> None:
        if self.mark_unhealthy is None:
            self.tell(incident, events.no_auto_scaling(incident))
            return
        from agent.adapters.aws import AwsError  # importing agent.adapters.aws does not load boto3

        try:
            result = self.mark_unhealthy(view)
        except AwsError as exc:  # told once per incident and error code; the step fails and is retried
            self.tell(incident, events.mark_failed(incident, exc, exc.code))
            raise
        if result.outcome == "not_aws":
            self.tell(incident, events.not_ec2(incident, result.message))
        elif result.outcome == "no_group":
            self.tell(incident, events.no_auto_scaling_group(incident, result.instance_id))
        else:
            self.tell(incident, events.marked_unhealthy(incident, result.message))

    def uncordon(self, incident: Incident, view: NodeView, now: float) -> tuple[Incident, Outcome]:
        record = flaps.after_uncordon(self.flap_record, incident, now)  # left on the Node, read by the next incident
        node_actions.uncordon(
            self.client,
            node_name=self.node_name,
            incident=incident,
            annotations={flaps.FLAP_ANNOTATION: flaps.flap_text(record)},
        )
        self.tell(incident, events.uncordoned(incident))
        return incident, Outcome.DONE
