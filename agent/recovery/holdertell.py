"""Telling the pods that hold a failing device: one Warning Event per holder pod, reason ``DeviceFault``.

The Event is about the Pod (its involvedObject; this Node is its ``related`` object) and says which device
(:meth:`DeviceRef.describe`), which fault (the condition and its reason) and what recovery will do and when
(the ``plan`` sentence the caller writes). One reason for all, so consumers can watch for it:
``kubectl get events -A --field-selector involvedObject.kind=Pod,reason=DeviceFault``.

The Events go out through ``put`` (the main loop's inbox) to the Event sink, which aggregates and
rate-limits them as it does the Node's (agent.sinks.events): the same pod, device, fault and plan again
bumps the count of one Event. The holders come from this node's pod-resources API, so every pod told is a
pod on this node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.core.devices import DeviceRef
from agent.core.holders import Holders
from agent.core.types import Event, PodRef, Severity

log = logging.getLogger(__name__)

REASON = "DeviceFault"
WARNING = "Warning"
SOURCE = "recovery"


def fault_message(*, device: DeviceRef, containers: tuple[str, ...], condition: str, reason: str, plan: str) -> str:
    """What a holder pod is told: the device, its containers that hold it, the fault, the plan."""
    held = ", ".join(containers)
    text = f"{device.describe()}, held by container {held} of this pod, has a fault: {condition} {reason}."
    return f"{text} {plan}".strip()


class HolderTeller:
    """Puts one ``DeviceFault`` Event per holder pod of a device."""

    def __init__(self, *, put: Callable[[Event], None], node_name: str, clock: Callable[[], float] = time.time) -> None:
        self._put = put
        self._node_name = node_name
        self._clock = clock

    def tell(self, *, device: DeviceRef, holders: Holders, condition: str, reason: str, plan: str) -> int:
        """One Warning Event per pod in ``holders``; the number of Events put."""
        containers: dict[tuple[str, str], set[str]] = {}
        for holder in holders.holders:
            containers.setdefault((holder.namespace, holder.pod), set()).add(holder.container)
        now = self._clock()
        for (namespace, name), held in sorted(containers.items()):
            message = fault_message(
                device=device, containers=tuple(sorted(held)), condition=condition, reason=reason, plan=plan
            )
            self._put(
                Event(
                    type=WARNING,
                    reason=REASON,
                    message=message,
                    timestamp=now,
                    source=SOURCE,
                    severity=Severity.WARNING,
                    fields={
                        "device": device.key,
                        "condition": condition,
                        "faultReason": reason,
                        "node": self._node_name,
                    },
                    pod=PodRef(namespace=namespace, name=name),
                )
            )
        if containers:
            log.info("told %d pod(s) holding %s about %s/%s", len(containers), device.key, condition, reason)
        return len(containers)
