"""What this node knows about a device a finding names: present or not, index, UUID, PCI address.

Read from the host's roots (injected, so tests read fixture trees), never written:

- NVIDIA GPU ``<pci>``: ``<sys>/bus/pci/devices/<pci>`` (present), and the driver's
  ``<proc>/driver/nvidia/gpus/<pci>/information`` (``kernel-open/nvidia/nv-procfs.c``,
  ``nv_procfs_read_gpu_info``: ``"GPU UUID: \\t %s\\n"``, ``"Device Minor: \\t %u\\n"``, the directory
  named ``"%04x:%02x:%02x.%1x"`` by ``nv_procfs_add_gpu``). The index is the device minor, the N of
  ``/dev/nvidia<N>``; the UUID is the stable name (what the device plugin reports).
- Neuron ``neuron<N>``: ``<dev>/neuron<N>`` or ``<sys>/class/neuron_device/neuron<N>`` (present). The
  driver creates that device without a parent (``aws-neuron-driver:neuron_cdev.c``,
  ``ncdev_init_device_node``: ``device_create(neuron_dev_class, NULL, ...)``) and numbers it from the
  firmware's routing id, so sysfs holds no link to its PCI address: that stays unknown here.
- RDMA ``<name>``: ``<sys>/class/infiniband/<name>/device``, a link to its PCI device; an RDMA device
  printed by PCI address: ``<sys>/bus/pci/devices/<pci>/infiniband/<name>``.

A lookup is remembered (at most ``capacity`` devices; one that was not found is looked up again after
``retry`` seconds, so a device that appears later is found and a storm of lines costs one look).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from agent.core.devices import DeviceKind, DeviceRef, normalize_pci

MAX_INFORMATION_BYTES = 8192  # /proc/driver/nvidia/gpus/*/information is a dozen short lines


def read_nvidia_information(text: str) -> tuple[str | None, int | None]:
    """(GPU UUID, Device Minor) from the text of ``/proc/driver/nvidia/gpus/<pci>/information``."""
    uuid: str | None = None
    minor: int | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        value = value.strip()
        if key.strip() == "GPU UUID" and value:
            uuid = value.split()[0]
        elif key.strip() == "Device Minor" and value.isdigit():
            minor = int(value)
    return uuid, minor


class DeviceResolver:
    """Adds what the roots show to a :class:`DeviceRef`. One owner (the main loop); no locks."""

    def __init__(
        self,
        *,
        sys_root: Path = Path("/sys"),
        proc_root: Path = Path("/proc"),
        dev_root: Path = Path("/dev"),
        capacity: int = 256,
        retry: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Roots as text: a look joins and stats a few paths, each on every new device of a storm (pathlib's
        # objects cost more than the stat itself).
        self._sys = os.fspath(sys_root)
        self._proc = os.fspath(proc_root)
        self._dev = os.fspath(dev_root)
        self._capacity = capacity
        self._retry = retry
        self._clock = clock
        self._known: collections.OrderedDict[str, tuple[DeviceRef, float]] = collections.OrderedDict()

    def resolve(self, ref: DeviceRef) -> DeviceRef:
        """``ref`` with what the node shows about it (``present`` False where nothing does)."""
        now = self._clock()
        cached = self._known.get(ref.key)
        if cached is not None and (cached[0].present or now - cached[1] < self._retry):
            self._known.move_to_end(ref.key)
            known = cached[0]
            return known if known.printed == ref.printed else dataclasses.replace(known, printed=ref.printed)
        resolved = self._look(ref)
        self._known[ref.key] = (resolved, now)
        self._known.move_to_end(ref.key)
        while len(self._known) > self._capacity:
            self._known.popitem(last=False)
        return resolved

    def _look(self, ref: DeviceRef) -> DeviceRef:
        try:
            if ref.kind is DeviceKind.GPU:
                return self._gpu(ref)
            if ref.kind is DeviceKind.NEURON:
                return self._neuron(ref)
            return self._rdma(ref)
        except (OSError, ValueError):  # an unreadable root says nothing about the device
            return ref

    def _gpu(self, ref: DeviceRef) -> DeviceRef:
        pci = ref.pci or ref.id
        uuid, minor = None, None
        try:
            with open(os.path.join(self._proc, "driver", "nvidia", "gpus", pci, "information"), "rb") as f:
                uuid, minor = read_nvidia_information(f.read(MAX_INFORMATION_BYTES).decode("utf-8", "replace"))
            found = True
        except OSError:
            found = False
        present = found or os.path.exists(os.path.join(self._sys, "bus", "pci", "devices", pci))
        return dataclasses.replace(ref, uuid=uuid, index=minor, present=present)

    def _neuron(self, ref: DeviceRef) -> DeviceRef:
        places = (
            os.path.join(self._dev, ref.id),
            os.path.join(self._sys, "class", "neuron_device", ref.id),
            os.path.join(self._sys, "devices", "virtual", "neuron_device", ref.id),
        )
        return dataclasses.replace(ref, present=any(map(os.path.exists, places)))

    def _rdma(self, ref: DeviceRef) -> DeviceRef:
        if ref.pci is not None:
            device = os.path.join(self._sys, "bus", "pci", "devices", ref.pci)
            rdma = os.path.join(device, "infiniband")
            names = sorted(os.listdir(rdma)) if os.path.isdir(rdma) else []
            return dataclasses.replace(ref, name=names[0] if names else None, present=os.path.exists(device))
        named = os.path.join(self._sys, "class", "infiniband", ref.id)
        link = os.path.join(named, "device")
        if not os.path.exists(link):
            return dataclasses.replace(ref, present=os.path.exists(named))
        pci = normalize_pci(os.path.basename(os.path.realpath(link)))
        return dataclasses.replace(ref, pci=pci, present=True)
