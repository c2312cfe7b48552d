"""Who holds a device: the mapping from a DeviceRef to the containers of a pod-resources answer.

The answers are shaped like the device plugins' (tests/helpers/podresources_server.py): the NVIDIA
plugin's GPU and MIG UUIDs, the Neuron plugin's device and core numbers, EFA device names, DRA triples.
"""

from __future__ import annotations

import pytest

from agent.core.devices import DeviceKind, DeviceRef
from agent.core.holders import (
    ClaimDevice,
    ContainerDevices,
    ContainerResources,
    DeviceAliases,
    Holder,
    PodResources,
    cores_per_device,
    holders_of,
)

from helpers.podresources_server import Container, Pod, dra_node, gpu_uuid, mig_uuid, neuron_node, nvidia_node


def answer(pods: list[Pod]) -> tuple[PodResources, ...]:
    """The fixture as the client decodes it (the wire round trip is tested in tests/adapters)."""
    return tuple(
        PodResources(
            name=p.name,
            namespace=p.namespace,
            containers=tuple(
                ContainerResources(
                    name=c.name,
                    devices=tuple(ContainerDevices(r, tuple(ids)) for r, ids in c.devices.items()),
                    claims=tuple(ClaimDevice(d, pool, dev) for d, pool, dev in c.claims),
                )
                for c in p.containers
            ),
        )
        for p in pods
    )


def gpu(index: int, uuid: str | None = None) -> DeviceRef:
    pci = f"0000:{0x10 + index:02x}:00.0"
    return DeviceRef(kind=DeviceKind.GPU, id=pci, printed=pci, pci=pci, index=index, uuid=uuid, present=True)


def neuron(n: int) -> DeviceRef:
    return DeviceRef(kind=DeviceKind.NEURON, id=f"neuron{n}", printed=str(n), index=n, present=True)


def rdma(name: str, pci: str | None = None) -> DeviceRef:
    return DeviceRef(kind=DeviceKind.RDMA, id=pci or name, printed=pci or name, pci=pci, name=name, present=True)


NVIDIA = answer(nvidia_node()[0])
NEURON = answer(neuron_node()[0])
DRA = answer(dra_node("node-a"))
MIG7 = DeviceAliases(mig_uuids=frozenset({mig_uuid(7, 0), mig_uuid(7, 1)}))


@pytest.mark.parametrize(
    ("device", "aliases", "pods", "expected"),
    [
        # GPU 3 of 8: exactly the pod holding it, none of the other seven GPUs' pods
        (gpu(3, gpu_uuid(3)), DeviceAliases(), NVIDIA, [("ml", "train-3", "nvidia.com/gpu", gpu_uuid(3))]),
        # a pod holding two GPUs is a holder of each
        (gpu(5, gpu_uuid(5)), DeviceAliases(), NVIDIA, [("ml", "train-2x", "nvidia.com/gpu", gpu_uuid(5))]),
        (gpu(6, gpu_uuid(6)), DeviceAliases(), NVIDIA, [("ml", "train-2x", "nvidia.com/gpu", gpu_uuid(6))]),
        # a MIG-partitioned GPU: the pods of both its slices, matched through the GPU's MIG UUIDs
        (
            gpu(7, gpu_uuid(7)),
            MIG7,
            NVIDIA,
            [
                ("ml", "infer-a", "nvidia.com/mig-3g.40gb", mig_uuid(7, 0)),
                ("ml", "infer-b", "nvidia.com/mig-3g.40gb", mig_uuid(7, 1)),
            ],
        ),
        # without its MIG UUIDs a partitioned GPU's slices are not found (the new MIG UUID names no parent)
        (gpu(7, gpu_uuid(7)), DeviceAliases(), NVIDIA, []),
        # a GPU no pod holds
        (gpu(0, "GPU-ffffffff-0000-0000-0000-000000000000"), DeviceAliases(), NVIDIA, []),
        # Neuron: by device number under both device resource names, and by NeuronCore (2 per device)
        (neuron(1), DeviceAliases(neuron_cores_per_device=2), NEURON, [("ml", "llm-0", "aws.amazon.com/neuron", "1")]),
        (
            neuron(3),
            DeviceAliases(neuron_cores_per_device=2),
            NEURON,
            [("ml", "llm-1", "aws.amazon.com/neurondevice", "3")],
        ),
        (
            neuron(4),
            DeviceAliases(neuron_cores_per_device=2),
            NEURON,
            [("ml", "small", "aws.amazon.com/neuroncore", "8"), ("ml", "small", "aws.amazon.com/neuroncore", "9")],
        ),
        (
            neuron(5),
            DeviceAliases(neuron_cores_per_device=2),
            NEURON,
            [("ml", "small", "aws.amazon.com/neuroncore", "10")],
        ),
        (neuron(9), DeviceAliases(neuron_cores_per_device=2), NEURON, []),
        # EFA: by RDMA device name, also where the kernel line printed the PCI address and the resolver
        # found the name
        (rdma("rdmap48s0"), DeviceAliases(), NVIDIA, [("ml", "net-0", "vpc.amazonaws.com/efa", "rdmap48s0")]),
        (
            rdma("rdmap47s0", pci="0000:2f:00.0"),
            DeviceAliases(),
            NVIDIA,
            [("ml", "net-0", "vpc.amazonaws.com/efa", "rdmap47s0")],
        ),
        # DRA: the triples of this device's ResourceSlice entry
        (
            gpu(1, gpu_uuid(1)),
            DeviceAliases(dra=frozenset({("gpu.nvidia.com", "node-a", "gpu-1")})),
            DRA,
            [("ml", "dra-1", "dra:gpu.nvidia.com", "node-a/gpu-1")],
        ),
        (
            neuron(1),
            DeviceAliases(dra=frozenset({("neuron.aws.com", "node-a", "neuron-1")})),
            DRA,
            [("ml", "dra-1", "dra:neuron.aws.com", "node-a/neuron-1")],
        ),
        # the same device name in another pool (another node's, or another driver's) is another device
        (gpu(1, gpu_uuid(1)), DeviceAliases(dra=frozenset({("gpu.nvidia.com", "node-b", "gpu-1")})), DRA, []),
    ],
    ids=[
        "gpu3-of-8",
        "two-gpus-first",
        "two-gpus-second",
        "mig-slices",
        "mig-without-aliases",
        "no-holder",
        "neuron-resource",
        "neurondevice-resource",
        "neuroncores-of-device",
        "neuroncore-partial",
        "neuron-idle",
        "efa-by-name",
        "efa-by-pci-with-name",
        "dra-gpu",
        "dra-neuron",
        "dra-other-pool",
    ],
)
def test_holders_of(device, aliases, pods, expected):
    found = holders_of(device, pods, aliases)
    assert [(h.namespace, h.pod, h.resource, h.device_id) for h in found.holders] == expected
    assert found.incomplete is None


@pytest.mark.parametrize(
    "device_id",
    [
        gpu_uuid(3),
        f"{gpu_uuid(3)}::0",  # time-slicing / MPS replica
        f"{gpu_uuid(3)}::12",
        gpu_uuid(3).upper(),
        f"MIG-{gpu_uuid(3)}/1/0",  # the MIG UUID of drivers before R470 carries its parent
    ],
)
def test_gpu_ids_the_nvidia_plugin_reports(device_id):
    pods = answer([Pod("ml", "p", [Container("c", {"nvidia.com/gpu.shared": [device_id]})])])
    found = holders_of(gpu(3, gpu_uuid(3)), pods)
    assert [(h.pod, h.device_id) for h in found.holders] == [("p", device_id)]


def test_index_strategy_still_reports_uuids():
    """``deviceIDStrategy=index`` changes NVIDIA_VISIBLE_DEVICES in the container, not the ids the plugin
    lists to the kubelet (internal/plugin/server.go, deviceIDsFromAnnotatedDeviceIDs): the kubelet
    records UUIDs, and a bare index is not taken for a GPU (it could be any plugin's number)."""
    pods = answer(nvidia_node()[0])
    assert holders_of(gpu(3, gpu_uuid(3)), pods).pods == (("ml", "train-3"),)
    by_index = answer([Pod("ml", "p", [Container("c", {"nvidia.com/gpu": ["3"]})])])
    assert holders_of(gpu(3, gpu_uuid(3)), by_index).holders == ()


def test_other_vendors_ids_never_match():
    """A Neuron device number is not an EFA or GPU id, an NVIDIA UUID is not a Neuron id."""
    mixed = answer(neuron_node()[0]) + answer(nvidia_node()[0])
    assert {h.resource for h in holders_of(neuron(0), mixed, DeviceAliases(neuron_cores_per_device=2)).holders} == {
        "aws.amazon.com/neuron"
    }
    assert holders_of(rdma("0"), mixed).holders == ()


@pytest.mark.parametrize(
    ("device", "aliases", "reason"),
    [
        (gpu(3), DeviceAliases(), "UUID is not known"),
        (neuron(4), DeviceAliases(), "cores per device are not known"),
    ],
)
def test_an_incomplete_answer_says_why(device, aliases, reason):
    found = holders_of(device, NVIDIA + NEURON, aliases)
    assert found.incomplete is not None and reason in found.incomplete


def test_holders_are_each_once_and_sorted():
    twice = NVIDIA + NVIDIA
    found = holders_of(gpu(5, gpu_uuid(5)), twice)
    assert found.holders == (Holder("ml", "train-2x", "main", "nvidia.com/gpu", gpu_uuid(5)),)
    assert found.pods == (("ml", "train-2x"),)


@pytest.mark.parametrize(
    ("allocatable", "expected"),
    [
        (
            {
                "aws.amazon.com/neurondevice": [str(i) for i in range(16)],
                "aws.amazon.com/neuroncore": [str(i) for i in range(32)],
            },
            2,
        ),
        (
            {
                "aws.amazon.com/neuron": [str(i) for i in range(16)],
                "aws.amazon.com/neuroncore": [str(i) for i in range(128)],
            },
            8,
        ),
        ({"aws.amazon.com/neurondevice": ["0", "1", "2"], "aws.amazon.com/neuroncore": ["0", "1", "2", "3"]}, None),
        ({"aws.amazon.com/neuroncore": ["0", "1"]}, None),
        ({"nvidia.com/gpu": [gpu_uuid(0)]}, None),
    ],
    ids=["trn1", "trn2", "uneven", "cores-only", "no-neuron"],
)
def test_cores_per_device_from_allocatable(allocatable, expected):
    entries = tuple(ContainerDevices(r, tuple(ids)) for r, ids in allocatable.items())
    assert cores_per_device(entries) == expected
