"""The active checks' seams: who holds the devices, the fleet slots, and the open validation requests.

- ``busy(kind)``: with ``--device-holders``, a holder lookup of its own (the recovery loop's is not
  thread-safe) asks the kubelet's pod-resources API about every device of that kind on the node; a
  device it cannot read fully counts as "cannot tell". Without the flag there is no proof that a device
  is idle, so every active check is skipped (``HoldersUnknown``): docs/checks-exec.md, "Active checks".
- the fleet slots: a Lease per pool or zone (:mod:`agent.checks.fleetslots`) in Kubernetes mode; none
  standalone (no fleet).
- ``requests()``: the open validation requests of the feed's latest snapshot.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.app.settings import Settings
from agent.checks.active import ActiveGates, Busy, holders_unknown
from agent.core.bus import SnapshotFeed
from agent.core.devices import DeviceKind, DeviceRef
from agent.core.validation import ValidationRequest

if TYPE_CHECKING:
    from agent.recovery.holderlookup import HolderLookup

_NEURON_DEV = re.compile(r"neuron(\d+)")
MAX_NAMED = 5  # holder pods named in a skip's message


def node_devices(kind: str, *, sys_root: Path, dev_root: Path, proc_root: Path = Path("/proc")) -> list[DeviceRef]:
    """Every device of ``kind`` on this node, as a finding would name it (the resolver fills in the rest)."""
    if kind == DeviceKind.GPU:
        gpus = proc_root / "driver/nvidia/gpus"
        found = sorted(p.name for p in gpus.iterdir()) if gpus.is_dir() else []
        return [DeviceRef(kind=DeviceKind.GPU, id=pci, printed=pci) for pci in found]
    if kind == DeviceKind.NEURON:
        numbers = sorted(int(m.group(1)) for p in _list(dev_root) if (m := _NEURON_DEV.fullmatch(p)))
        # the index is N of /dev/neuron<N>, what a device plugin's ids name (a finding sets it the same way)
        return [DeviceRef(kind=DeviceKind.NEURON, id=f"neuron{n}", printed=f"neuron{n}", index=n) for n in numbers]
    names = sorted(_list(sys_root / "class/infiniband"))
    return [DeviceRef(kind=DeviceKind.RDMA, id=name, printed=name) for name in names]


def _list(folder: Path) -> list[str]:
    try:
        return [p.name for p in folder.iterdir()]
    except OSError:
        return []


def lookup_busy(lookup: HolderLookup, devices: Callable[[str], list[DeviceRef]]) -> Busy:
    """``busy(kind)`` from a holder lookup: None when no pod holds a device of that kind; the holder pods;
    raises when the answer is incomplete (not proven idle)."""

    def busy(kind: str) -> str | None:
        pods: set[tuple[str, str]] = set()
        for device in devices(kind):
            found = lookup.holders(device)
            if found.incomplete:
                raise LookupError(f"{device.key}: {found.incomplete}")
            pods.update(found.pods)
        if not pods:
            return None
        named = ", ".join(f"{ns}/{name}" for ns, name in sorted(pods)[:MAX_NAMED])
        return named + (f" and {len(pods) - MAX_NAMED} more" if len(pods) > MAX_NAMED else "")

    return busy


def active_gates(settings: Settings, *, kube: Any | None) -> ActiveGates:
    """The gates' seams as the flags say (``kube``: the KubeSetup, None standalone)."""
    busy: Busy = holders_unknown
    if settings.device_holders:
        from agent.core.deviceresolver import DeviceResolver
        from agent.recovery.holderlookup import HolderLookup

        resolver = DeviceResolver(sys_root=settings.sys_root, dev_root=settings.dev_root)

        def devices(kind: str) -> list[DeviceRef]:
            found = node_devices(kind, sys_root=settings.sys_root, dev_root=settings.dev_root)
            return [resolver.resolve(d) for d in found]

        busy = lookup_busy(HolderLookup(socket_path=settings.pod_resources_socket), devices)
    slots = None
    if kube is not None:
        from agent.checks.fleetslots import FleetSlots

        slots = FleetSlots(
            client=kube.client,
            namespace=settings.pod_namespace,
            node_name=kube.node_name,
            share=settings.active_check_share,
        )
    return ActiveGates(busy=busy, slots=slots)


def open_requests(feed: SnapshotFeed) -> Callable[[], tuple[ValidationRequest, ...]]:
    """The open validation requests as the main loop last published them."""
    return lambda: feed.latest().snapshot.validation_requests
