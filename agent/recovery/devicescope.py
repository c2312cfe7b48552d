"""The device scope of recovery (pure): a rule with ``scope: device`` acts on the devices its finding names.

Two plan stages (:mod:`agent.recovery.plan`):

* :func:`scope` (before the gates): for a device-scope rule whose True condition names its devices
  (``Condition.devices``), the proposal's node actions become device actions per device
  (``fence-device``, ``drain-device``; ``unfence-device`` for a device the condition no longer lists),
  recorded in the incident's ``fences``. It stays at the node (the rule's node actions and ladder, as
  the ``climb`` stage chose them) when:

  - the finding names no device;
  - more devices fail at once than the rule's ``maxDevices`` (default 2);
  - a device fails again within the rule's repeat period (``repeat.within``; a day without one): it
    was fenced by an earlier incident (the history's opened incidents keep their devices), or unfenced
    and listed again in this one;
  - fencing a device is not possible (:func:`fence_possible`): the cluster serves no DeviceTaintRule,
    or a device-plugin node whose plugin keeps scheduling onto the bad device;
  - the incident climbed already (a node action is done: it stays at the node), or the node's ladder
    did (the problem came back after a reboot: the ladder's rung is above the first).

* :func:`unfence` (after the gates): a healed incident (closed, or kept with ``healthy_since``) first
  unfences the devices it fenced. Giving a device back is never held, like closing an incident.

Device proposals ask the cluster budget for a device step (their own rate, ``maxDeviceActions``); they
take no node's place in ``maxUnhealthy``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from agent.core.devices import DeviceKind, DeviceRef
from agent.core.durations import format_duration
from agent.recovery.model import (
    ACTION_ORDER,
    DEVICE_REPEAT_PERIOD,
    Action,
    Blocked,
    Decision,
    DeviceFence,
    Incident,
    Scope,
)
from agent.recovery.policy import Proposal
from agent.recovery.rungs import Opened

# The NVIDIA device plugin marks a GPU Unhealthy on critical Xids except these (its
# ``DP_DISABLE_HEALTHCHECKS`` default skip list: application errors it leaves to the job): on a
# device-plugin node the plugin keeps scheduling onto a GPU with one of them.
NOT_ISOLATED_XIDS = (13, 31, 43, 45, 68, 109)
# What was written for a device and is ours to take back on unfence.
OURS = ("fenced",)
_XID = re.compile(r"^GpuXid(\d+)")


def device_ref(key: str) -> DeviceRef:
    """The device a fence records (``kind:id``), for the fencer and the holder lookup."""
    kind, _, ident = key.partition(":")
    return DeviceRef(kind=DeviceKind(kind), id=ident, printed=ident, pci=ident if ":" in ident else None)


def plugin_isolates(device: str, reason: str) -> bool:
    """On a device-plugin node (no DRA), whether the plugin stops scheduling onto ``device`` for ``reason``:
    the NVIDIA plugin does on an Xid it checks (all but :data:`NOT_ISOLATED_XIDS`); the Neuron plugin
    reports no per-device health we can rely on (unknown: no), nor does an RDMA device's."""
    if not device.startswith(f"{DeviceKind.GPU.value}:"):
        return False
    match = _XID.match(reason)
    return match is not None and int(match.group(1)) not in NOT_ISOLATED_XIDS


def fence_possible(fence: DeviceFence, reason: str) -> tuple[bool, str]:
    """Whether the device's fence (as recorded) keeps new pods off it, and why not."""
    if fence.fence == "no-api":
        return False, "the cluster serves no DeviceTaintRule"
    if fence.fence == "not-dra" and not plugin_isolates(fence.device, reason):
        return False, f"a device-plugin node whose plugin keeps scheduling onto {fence.device} ({reason})"
    return True, ""


def scope(
    assessed: Decision | Proposal | None, *, opened: Sequence[Opened], now: float, rung: int = 0
) -> Decision | Proposal | None:
    """A device-scope rule's proposal as device actions, or at the node (see the module docstring). ``rung``:
    the ladder's rung for the incident (above 0: the node's ladder climbed already, it stays at the node)."""
    if not isinstance(assessed, Proposal) or assessed.primary.rule.scope is not Scope.DEVICE:
        return assessed
    why = "the node's ladder climbed (the problem came back after a remedy)" if rung > 0 else ""
    why = why or at_node(assessed, opened=opened, now=now)
    if why:
        return _at_node(assessed, why)
    return _on_devices(assessed)


def at_node(p: Proposal, *, opened: Sequence[Opened], now: float) -> str:
    """Why a device-scope proposal stays at the node ("" = it acts on the devices)."""
    rule, condition, incident = p.primary.rule, p.primary.condition, p.incident
    if any(a.disruptive and not a.on_device for a in incident.done):
        return "the incident climbed to the node already"
    keys = tuple(dict.fromkeys(d.device.key for d in condition.devices))
    if not keys:
        return "the finding names no device"
    if len(keys) > rule.max_devices:
        return f"{len(keys)} devices failing at once, more than maxDevices {rule.max_devices}"
    period = rule.repeat_period or DEVICE_REPEAT_PERIOD
    for key in keys:
        fence = incident.fence_of(key)
        earlier = any(o.incident != incident.id and key in o.devices and o.at >= now - period for o in opened)
        if earlier or (fence is not None and Action.UNFENCE_DEVICE in fence.steps):
            return f"{key} failed again within {format_duration(period)}"
    for fence in incident.fences:
        possible, why = fence_possible(fence, condition.reason)
        if not possible:
            return f"fencing {fence.device} is not possible: {why}"
    return ""


def _at_node(p: Proposal, why: str) -> Decision | Proposal:
    """The rule's node actions (its rung's, with a ladder) not done yet: the climb from the device."""
    rule, incident = p.primary.rule, p.incident
    wanted = set(rule.node_actions)
    actions = tuple(
        a
        for a in ACTION_ORDER
        if a in wanted and a not in incident.done and not (a is Action.CORDON and not incident.cordoned_by_us)
    )
    if not actions:
        message = f"at the node ({why}): every action is done"
        return Decision(blocked=Blocked.NOTHING_LEFT, incident=incident, rule=rule, message=message)
    return dataclasses.replace(p, actions=actions, scope=Scope.NODE, note=f"at the node: {why}")


def _on_devices(p: Proposal) -> Decision | Proposal:
    rule, condition, incident = p.primary.rule, p.primary.condition, p.incident
    listed = tuple(dict.fromkeys(d.device.key for d in condition.devices))
    fences = (*incident.fences, *(DeviceFence(device=k) for k in listed if incident.fence_of(k) is None))
    incident = dataclasses.replace(incident, fences=fences)
    wanted = rule.device_actions
    actions = [a for a in wanted if any(a not in f.steps for f in fences if f.device in listed)]
    if any(to_unfence(f) for f in fences if f.device not in listed):
        actions.append(Action.UNFENCE_DEVICE)
    names = ", ".join(listed)
    if not actions:
        return Decision(
            blocked=Blocked.NOTHING_LEFT, incident=incident, rule=rule, message=f"devices {names}: every action is done"
        )
    if actions == [Action.UNFENCE_DEVICE]:  # giving back needs no budget
        return Decision(actions=tuple(actions), incident=incident, rule=rule, message="unfence the healed devices")
    note = f"devices {names}"
    return dataclasses.replace(p, actions=tuple(actions), incident=incident, scope=Scope.DEVICE, note=note)


def to_unfence(fence: DeviceFence) -> bool:
    """Our fence is in place (a vendor's taint, a plugin's own health and no fence at all are not ours)."""
    return Action.FENCE_DEVICE in fence.steps and Action.UNFENCE_DEVICE not in fence.steps and fence.fence in OURS


def unfence(decision: Decision, *, stored: Incident | None) -> Decision:
    """A healed incident gives its fenced devices back first (after the gates: never held)."""
    if decision.blocked is not None or stored is None or Action.UNFENCE_DEVICE in decision.actions:
        return decision
    healed = decision.incident is None or decision.incident.healthy_since is not None
    if not healed or decision.actions not in ((), (Action.UNCORDON,)):
        return decision
    source = decision.incident or stored
    if not any(to_unfence(f) for f in source.fences):
        return decision
    return dataclasses.replace(
        decision,
        actions=(Action.UNFENCE_DEVICE, *decision.actions),
        message=f"{decision.message}; unfence its devices first" if decision.message else "unfence its devices",
    )
