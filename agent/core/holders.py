"""Who holds a device: the kubelet's pod-resources answer, and which of its pods hold one :class:`DeviceRef`.

The types below are what :mod:`agent.adapters.podresources` decodes from the kubelet's
``v1.PodResourcesLister`` (only the fields we read); :func:`holders_of` is pure: it maps a device to the
containers the answer says hold it. The ids each device plugin reports (docs/devices.md, "Who holds a
device", has the sources):

- ``nvidia.com/*`` (the NVIDIA device plugin: ``nvidia.com/gpu``, MIG ``nvidia.com/mig-<profile>``,
  renamed shared resources): the GPU UUID ``GPU-...`` or the MIG UUID ``MIG-...``; with time-slicing or
  MPS a replica id ``<uuid>::<n>``. ``deviceIDStrategy=index`` changes only what the container is told
  (``NVIDIA_VISIBLE_DEVICES``), not the id the kubelet records. A MIG UUID of drivers since R470 names
  no parent: the caller passes the MIG UUIDs of the GPU (:class:`DeviceAliases`); the older form
  ``MIG-GPU-<uuid>/<gi>/<ci>`` carries its parent and matches by itself.
- ``aws.amazon.com/neuron`` and ``aws.amazon.com/neurondevice``: the device number N of ``/dev/neuronN``;
  ``aws.amazon.com/neuroncore``: the node-wide NeuronCore number, on device ``core // cores per device``.
- ``vpc.amazonaws.com/efa``: the RDMA device name (``rdmap47s0``).
- DRA: the ``driver``/``pool``/``device`` triple of each allocated device (the caller knows which
  triples name the device, from this node's ResourceSlices: :class:`DeviceAliases`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from agent.core.devices import DeviceKind, DeviceRef, normalize_pci

NVIDIA_PREFIX = "nvidia.com/"
NEURON_DEVICE_RESOURCES = frozenset({"aws.amazon.com/neuron", "aws.amazon.com/neurondevice"})
NEURON_CORE_RESOURCE = "aws.amazon.com/neuroncore"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
REPLICA_SEPARATOR = "::"  # the NVIDIA plugin's replica ids under time-slicing / MPS: <uuid>::<n>
LEGACY_MIG_PREFIX = "MIG-GPU-"  # MIG-GPU-<parent uuid>/<gi>/<ci>, drivers before R470

Match = Callable[[str, str], bool]  # (resource name, device id) -> the id names the device


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """Devices of one device-plugin resource (``ContainerDevices``): the resource name and its ids."""

    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device a DRA claim allocated to a container (``ClaimResource``): driver, pool, device name."""

    driver: str
    pool: str
    device: str
    claim_name: str = ""
    claim_namespace: str = ""


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()
    claims: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceAliases:
    """What else names the device, as the node knows it: the MIG UUIDs on a GPU, the DRA triples
    (driver, pool, device) of its ResourceSlice entries, the NeuronCores per Neuron device."""

    mig_uuids: frozenset[str] = frozenset()
    dra: frozenset[tuple[str, str, str]] = frozenset()
    neuron_cores_per_device: int | None = None


@dataclass(frozen=True, slots=True, order=True)
class Holder:
    """A container that holds the device: through which resource, under which id."""

    namespace: str
    pod: str
    container: str
    resource: str  # the device-plugin resource name, or "dra:<driver>"
    device_id: str  # the plugin's id, or "<pool>/<device>" for DRA


@dataclass(frozen=True, slots=True)
class Holders:
    """The holders found, and why the answer may be incomplete (None: nothing was left unread)."""

    holders: tuple[Holder, ...]
    incomplete: str | None = None

    @property
    def pods(self) -> tuple[tuple[str, str], ...]:
        """(namespace, name) of each holder pod, once, sorted."""
        return tuple(sorted({(h.namespace, h.pod) for h in self.holders}))


def holders_of(device: DeviceRef, pods: Iterable[PodResources], aliases: DeviceAliases = DeviceAliases()) -> Holders:
    """The containers in ``pods`` (a ``List`` answer) that hold ``device``, sorted, each once."""
    match = _matcher(device, aliases)
    found: set[Holder] = set()
    unread_cores = False
    for pod in pods:
        for container in pod.containers:
            for entry in container.devices:
                if entry.resource_name == NEURON_CORE_RESOURCE and device.kind is DeviceKind.NEURON:
                    unread_cores = unread_cores or aliases.neuron_cores_per_device is None
                for device_id in entry.device_ids:
                    if match(entry.resource_name, device_id):
                        found.add(Holder(pod.namespace, pod.name, container.name, entry.resource_name, device_id))
            for claim in container.claims:
                if (claim.driver, claim.pool, claim.device) in aliases.dra:
                    ident = f"{claim.pool}/{claim.device}"
                    found.add(Holder(pod.namespace, pod.name, container.name, f"dra:{claim.driver}", ident))
    return Holders(tuple(sorted(found)), _incomplete(device, aliases, unread_cores))


def _incomplete(device: DeviceRef, aliases: DeviceAliases, unread_cores: bool) -> str | None:
    if device.kind is DeviceKind.GPU and device.uuid is None and not aliases.dra:
        return "the GPU's UUID is not known: device-plugin holders cannot be matched"
    if device.kind is DeviceKind.NEURON and device.index is None and not aliases.dra:
        return "the Neuron device number is not known"
    if unread_cores:
        return "NeuronCores are allocated but the cores per device are not known"
    return None


def _matcher(device: DeviceRef, aliases: DeviceAliases) -> Match:
    """A predicate (resource name, device id) -> bool for the device-plugin ids that name ``device``."""
    if device.kind is DeviceKind.GPU:
        return _gpu_matcher(device, aliases)
    if device.kind is DeviceKind.NEURON:
        return _neuron_matcher(device, aliases)
    names = {n for n in (device.name, device.id) if n and normalize_pci(n) is None}

    def rdma(resource: str, device_id: str) -> bool:
        return resource == EFA_RESOURCE and device_id in names

    return rdma


def _gpu_matcher(device: DeviceRef, aliases: DeviceAliases) -> Match:
    uuid = (device.uuid or "").lower()
    migs = {m.lower() for m in aliases.mig_uuids}

    def gpu(resource: str, device_id: str) -> bool:
        if not resource.startswith(NVIDIA_PREFIX) or not uuid:
            return False
        ident = device_id.split(REPLICA_SEPARATOR, 1)[0].lower()
        if ident == uuid or ident in migs:
            return True
        return ident.startswith(LEGACY_MIG_PREFIX.lower()) and ident[len("MIG-") :].split("/", 1)[0] == uuid

    return gpu


def _neuron_matcher(device: DeviceRef, aliases: DeviceAliases) -> Match:
    index = device.index
    per_device = aliases.neuron_cores_per_device

    def neuron(resource: str, device_id: str) -> bool:
        if index is None or not device_id.isdigit():
            return False
        if resource in NEURON_DEVICE_RESOURCES:
            return int(device_id) == index
        if resource == NEURON_CORE_RESOURCE and per_device:
            return int(device_id) // per_device == index
        return False

    return neuron


def cores_per_device(allocatable: Sequence[ContainerDevices]) -> int | None:
    """NeuronCores per Neuron device, from a ``GetAllocatableResources`` answer: the cores the node
    offers over the devices it offers, where both are offered and divide evenly; else None."""
    devices = {i for e in allocatable if e.resource_name in NEURON_DEVICE_RESOURCES for i in e.device_ids}
    cores = {i for e in allocatable if e.resource_name == NEURON_CORE_RESOURCE for i in e.device_ids}
    if not devices or not cores or len(cores) % len(devices):
        return None
    return len(cores) // len(devices)
