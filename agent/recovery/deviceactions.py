"""The device actions of a ``scope: device`` rule: fence a device, drain only its pods, unfence it.

Each handler records on the Node, device by device, what it did as soon as it is done (the incident's
``fences``: :class:`~agent.recovery.model.DeviceFence`), so a restarted agent never repeats a device's
step; a fence written but not yet recorded when the agent died is written again (the fencer is
idempotent). The node is never cordoned here and pods of other devices are never touched.

Outcomes of a fence (:class:`agent.recovery.fence.FenceOutcome`):

* ``fenced`` (our DeviceTaintRule) or ``vendor`` (the DRA driver tainted it already): the drain follows;
* ``not-dra`` (a device-plugin node): where the plugin stops scheduling onto the device itself (the
  NVIDIA plugin on most Xids, :func:`agent.recovery.devicescope.plugin_isolates`) the drain follows;
  else fencing is not possible;
* ``no-api`` (the cluster serves no DeviceTaintRule): not possible.

Not possible: told once, and the step ends; the next step's plan climbs to the rule's node ladder.
The seams (:class:`DeviceFencing`, :class:`HolderFinding`, :class:`HolderTelling`) are ours: the real
ones are :class:`agent.recovery.fence.DeviceFencer`, :class:`agent.recovery.holderlookup.HolderLookup`
and :class:`agent.recovery.holdertell.HolderTeller`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agent.core.bus import Publication
from agent.core.devices import DeviceRef
from agent.core.types import Status
from agent.recovery import devicescope, events
from agent.recovery import node as node_actions
from agent.recovery.events import Told
from agent.recovery.model import Action, DeviceFence, Incident
from agent.recovery.policy import with_done

if TYPE_CHECKING:
    from agent.core.holders import Holders
    from agent.recovery.drain import DrainResult


class DeviceFencing(Protocol):
    """``agent.recovery.fence.DeviceFencer``: its ``fence`` answers a Fence (outcome, rule, message)."""

    def fence(self, device: DeviceRef, *, reason: str, incident_id: str) -> Any: ...

    def unfence(self, device: DeviceRef) -> bool: ...


class HolderFinding(Protocol):
    """``agent.recovery.holderlookup.HolderLookup``: never raises (an incomplete answer says why)."""

    def holders(self, device: DeviceRef) -> Holders: ...


class HolderTelling(Protocol):
    """``agent.recovery.holdertell.HolderTeller``: one Event per holder pod."""

    def tell(self, *, device: DeviceRef, holders: Holders, condition: str, reason: str, plan: str) -> int: ...


# (stop, report(kind, message), pod keys) -> DrainResult: a drain of only those pods (agent.recovery.drain)
DeviceDrainer = Callable[[threading.Event, Callable[[str, str], None], frozenset[str]], "DrainResult"]
FENCE_PLAN = "recovery fences the device now (no new pods on it), then evicts the pods holding it through the "
FENCE_PLAN += "Eviction API (PodDisruptionBudgets respected); the node stays schedulable"


def pod_keys(holders: Holders) -> tuple[str, ...]:
    return tuple(f"{namespace}/{name}" for namespace, name in holders.pods)


@dataclass(kw_only=True)
class DeviceActor:
    """The I/O of the device actions (the Actor hands them over); ``store`` records an incident on the Node."""

    client: Any
    node_name: str
    latest: Callable[[], Publication]
    tell: Callable[[Incident | None, Told], None]
    count: Callable[[str], None]  # a fence's outcome
    drains: Callable[[str], None]  # a device drain's outcome
    run_drain: Callable[[Incident, frozenset[str], DeviceDrainer], DrainResult]  # under the holds, like a node drain
    fencer: DeviceFencing | None = None
    holders: HolderFinding | None = None
    holder_teller: HolderTelling | None = None
    drainer: DeviceDrainer | None = None

    # ---- helpers -------------------------------------------------------------------------------------

    def listed(self, incident: Incident) -> frozenset[str]:
        """The devices the incident's condition lists now (none when it is not True)."""
        for condition in self.latest().snapshot.conditions:
            if condition.type == incident.condition and condition.status is Status.TRUE:
                return frozenset(d.device.key for d in condition.devices)
        return frozenset()

    def device(self, incident: Incident, key: str) -> DeviceRef:
        """The device as the snapshot knows it (index, UUID), else as recorded."""
        for condition in self.latest().snapshot.conditions:
            if condition.type == incident.condition:
                found = next((d.device for d in condition.devices if d.device.key == key), None)
                if found is not None:
                    return found
        return devicescope.device_ref(key)

    def _store(self, incident: Incident, fence: DeviceFence) -> Incident:
        incident = dataclasses.replace(
            incident, fences=tuple(fence if f.device == fence.device else f for f in incident.fences)
        )
        node_actions.store_incident(self.client, node_name=self.node_name, incident=incident)
        return incident

    # ---- fence ---------------------------------------------------------------------------------------

    def fence(self, incident: Incident) -> tuple[Incident, bool]:
        """Fence each device not fenced yet; False when one cannot be fenced (the plan climbs next step)."""
        possible = True
        for todo in [f for f in incident.fences if Action.FENCE_DEVICE not in f.steps]:
            device = self.device(incident, todo.device)
            holders = self._holders(incident, device)
            if self.holder_teller is not None and holders is not None and holders.pods:
                self._tell_holders(incident, device, holders)
            outcome, rule, message = self._fence(incident, device)
            self.count(outcome)
            fence = dataclasses.replace(
                todo,
                fence=outcome,
                rule=rule,
                holders=pod_keys(holders) if holders is not None else todo.holders,
                steps=(*todo.steps, Action.FENCE_DEVICE),
            )
            incident = self._store(incident, fence)
            ok, why = devicescope.fence_possible(fence, incident.reason)
            if ok:
                self.tell(incident, events.device_fenced(incident, fence.device, outcome, message))
            else:
                possible = False
                self.tell(incident, events.device_fence_not_possible(incident, fence.device, why))
        return with_done(incident, Action.FENCE_DEVICE, devices=()), possible

    def _tell_holders(self, incident: Incident, device: DeviceRef, holders: Holders) -> None:
        assert self.holder_teller is not None
        self.holder_teller.tell(
            device=device, holders=holders, condition=incident.condition, reason=incident.reason, plan=FENCE_PLAN
        )

    def _fence(self, incident: Incident, device: DeviceRef) -> tuple[str, str, str]:
        if self.fencer is None:
            return "no-api", "", "no device fencer is configured"
        result = self.fencer.fence(device, reason=incident.reason, incident_id=incident.id)
        return str(result.outcome.value), str(result.rule), str(result.message)

    def _holders(self, incident: Incident, device: DeviceRef) -> Holders | None:
        if self.holders is None:
            return None
        found = self.holders.holders(device)
        if found.incomplete and not found.pods:
            self.tell(incident, events.device_holders_unknown(incident, device.key, found.incomplete))
        return found

    # ---- drain ---------------------------------------------------------------------------------------

    def drain(self, incident: Incident) -> tuple[Incident, bool]:
        """Evict only the pods holding each fenced device; False when a drain did not finish."""
        for todo in [f for f in incident.fences if _drains(f)]:
            device = self.device(incident, todo.device)
            holders = self._holders(incident, device)
            keys = pod_keys(holders) if holders is not None else ()
            if holders is None:
                self.tell(incident, events.device_holders_unknown(incident, todo.device, "no holder lookup"))
            outcome: str = "done"
            evicted: tuple[str, ...] = ()
            if keys and self.drainer is not None:
                result = self.run_drain(incident, frozenset(keys), self.drainer)
                outcome, evicted = str(result.outcome), (*result.evicted, *result.deleted)
                self.drains(str(outcome))
            done = outcome in ("done", "skipped")
            steps = (*todo.steps, Action.DRAIN_DEVICE) if done else todo.steps
            fence = dataclasses.replace(
                todo, holders=keys or todo.holders, evicted=tuple(dict.fromkeys((*todo.evicted, *evicted))), steps=steps
            )
            incident = self._store(incident, fence)
            self.tell(incident, events.device_drained(incident, fence.device, fence.evicted, str(outcome)))
            if not done:
                return incident, False
        return with_done(incident, Action.DRAIN_DEVICE, devices=()), True

    # ---- unfence -------------------------------------------------------------------------------------

    def unfence(self, incident: Incident) -> Incident:
        """Lift the fence of each device the condition no longer lists (all, when it healed)."""
        for key in unfence_targets(incident, self.listed(incident)):
            fence = incident.fence_of(key)
            assert fence is not None
            if self.fencer is not None:
                self.fencer.unfence(self.device(incident, key))
            incident = self._store(incident, dataclasses.replace(fence, steps=(*fence.steps, Action.UNFENCE_DEVICE)))
            self.tell(incident, events.device_unfenced(incident, key))
        return incident


def _drains(fence: DeviceFence) -> bool:
    """Not drained yet, not healed, and fenced (a fence not possible climbs to the node instead)."""
    steps = fence.steps
    fenced = Action.FENCE_DEVICE not in steps or fence.fence in ("fenced", "vendor", "not-dra")
    return Action.DRAIN_DEVICE not in steps and Action.UNFENCE_DEVICE not in steps and fenced


def unfence_targets(incident: Incident, listed: Collection[str]) -> tuple[str, ...]:
    """The devices to unfence: our fence in place, no longer listed by the condition."""
    return tuple(f.device for f in incident.fences if devicescope.to_unfence(f) and f.device not in listed)
