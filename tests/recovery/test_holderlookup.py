"""HolderLookup: the holders of a device, read from the real grpcio pod-resources server of
tests/helpers/podresources_server.py on a UNIX socket, with the device plugins' id shapes; the kubelet's
rate limit respected (List at most once per cache_s, GetAllocatableResources once); failures as answers."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent.core.devices import DeviceKind, DeviceRef
from agent.core.holders import Holder
from agent.recovery.holderlookup import HolderLookup

from helpers.podresources_server import (
    Container,
    Pod,
    PodResourcesServer,
    dra_node,
    gpu_uuid,
    mig_uuid,
    neuron_node,
    nvidia_node,
)

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-a"
LIST, ALLOCATABLE = "ListPodResourcesRequest", "AllocatableResourcesRequest"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sock(tmp_path: Path) -> str:
    return str(tmp_path / "kubelet.sock")


def gpu(index: int, *, uuid: bool = True) -> DeviceRef:
    pci = f"0000:{0x10 + index:02x}:00.0"
    return DeviceRef(
        kind=DeviceKind.GPU, id=pci, printed=pci, pci=pci, index=index, uuid=gpu_uuid(index) if uuid else None
    )


def neuron(index: int) -> DeviceRef:
    return DeviceRef(kind=DeviceKind.NEURON, id=f"neuron{index}", printed=str(index), index=index)


def efa(name: str) -> DeviceRef:
    return DeviceRef(kind=DeviceKind.RDMA, id=name, printed=name, name=name)


def mixed_node() -> tuple[list[Pod], dict[str, list[str]]]:
    """NVIDIA GPUs (UUIDs, MIG, a time-sliced replica), EFA, Neuron devices and cores, and DRA claims."""
    gpus, gpu_offer = nvidia_node()
    neurons, neuron_offer = neuron_node()
    replica = Pod("ml", "shared", [Container("s", {"nvidia.com/gpu.shared": [f"{gpu_uuid(3)}::2"]})])
    return [*gpus, replica, *neurons, *dra_node(NODE)], {**gpu_offer, **neuron_offer}


def pods_of(lookup: HolderLookup, device: DeviceRef) -> list[str]:
    return [f"{ns}/{name}" for ns, name in lookup.holders(device).pods]


# ---- who holds it ---------------------------------------------------------------------------------

DRA_SLICES = {
    "0000:10:00.0": frozenset({("gpu.nvidia.com", NODE, "gpu-0")}),
    "0000:11:00.0": frozenset({("gpu.nvidia.com", NODE, "gpu-1")}),
    "neuron1": frozenset({("neuron.aws.com", NODE, "neuron-1")}),
}
MIGS = {"0000:17:00.0": frozenset({mig_uuid(7, 0), mig_uuid(7, 1)})}

CASES = [
    # (device, the pods holding it, incomplete)
    (gpu(3), ["ml/shared", "ml/train-3"], None),  # by UUID, and a time-sliced replica <uuid>::<n>
    (gpu(5), ["ml/train-2x"], None),  # a pod holding two GPUs
    (gpu(7), ["ml/infer-a", "ml/infer-b"], None),  # a MIG-partitioned GPU: its MIG UUIDs
    (gpu(0), ["ml/dra-0", "ml/train-0"], None),  # a device-plugin pod and a DRA pod
    (gpu(1, uuid=False), ["ml/dra-1"], None),  # no UUID: DRA still matches
    (gpu(2, uuid=False), [], "the GPU's UUID is not known: device-plugin holders cannot be matched"),
    (neuron(0), ["ml/llm-0"], None),  # aws.amazon.com/neuron
    (neuron(3), ["ml/llm-1"], None),  # aws.amazon.com/neurondevice
    (neuron(5), ["ml/small"], None),  # aws.amazon.com/neuroncore 10 -> device 5 (2 cores per device)
    (neuron(1), ["ml/dra-1", "ml/llm-0"], None),  # a device-plugin pod and a DRA pod
    (efa("rdmap48s0"), ["ml/net-0"], None),  # vpc.amazonaws.com/efa by RDMA name
    (neuron(9), [], None),  # nobody holds it
]


@pytest.mark.parametrize(("device", "pods", "incomplete"), CASES, ids=[f"{c[0].key}" for c in CASES])
def test_the_holders_of_each_kind_of_device(sock, device, pods, incomplete):
    lookup = HolderLookup(
        socket_path=sock,
        timeout_s=10,
        dra=lambda d: DRA_SLICES.get(d.id, frozenset()),
        mig_uuids=lambda d: MIGS.get(d.id, frozenset()),
    )
    with PodResourcesServer(sock, *mixed_node()):
        answer = lookup.holders(device)
    assert [f"{ns}/{name}" for ns, name in answer.pods] == pods
    assert answer.incomplete == incomplete


def test_a_holder_says_through_which_resource_and_id(sock):
    with PodResourcesServer(sock, *mixed_node()):
        answer = HolderLookup(socket_path=sock, timeout_s=10).holders(gpu(3))
    assert answer.holders == (
        Holder("ml", "shared", "s", "nvidia.com/gpu.shared", f"{gpu_uuid(3)}::2"),
        Holder("ml", "train-3", "main", "nvidia.com/gpu", gpu_uuid(3)),
    )


# ---- the kubelet's rate limit ---------------------------------------------------------------------


def test_list_is_read_at_most_once_per_cache_s(sock):
    clock = Clock()
    lookup = HolderLookup(socket_path=sock, timeout_s=10, monotonic=clock, cache_s=2.0)
    with PodResourcesServer(sock, *nvidia_node()) as server:
        for index in range(8):  # eight GPUs fail together: one List
            lookup.holders(gpu(index))
        assert server.calls == [LIST]
        clock.now += 1.9
        lookup.holders(gpu(0))
        assert server.calls == [LIST]
        clock.now += 0.1
        server.pods = []  # the pods are gone: the next List says so
        assert lookup.holders(gpu(0)).pods == ()
        assert server.calls == [LIST, LIST]


def test_allocatable_is_read_once_and_only_for_neuron_devices(sock):
    clock = Clock()
    lookup = HolderLookup(socket_path=sock, timeout_s=10, monotonic=clock, cache_s=2.0)
    with PodResourcesServer(sock, *mixed_node()) as server:
        lookup.holders(gpu(0))
        assert server.calls == [LIST]
        for _ in range(3):
            clock.now += 5
            assert pods_of(lookup, neuron(4)) == ["ml/small"]
    assert server.calls == [LIST, LIST, ALLOCATABLE, LIST, LIST]


def test_a_failed_list_is_not_retried_within_cache_s(sock):
    clock = Clock()
    lookup = HolderLookup(socket_path=sock, timeout_s=10, monotonic=clock, cache_s=2.0)
    assert lookup.holders(gpu(0)).incomplete.startswith("socket-missing: ")
    with PodResourcesServer(sock, *nvidia_node()) as server:
        assert lookup.holders(gpu(0)).incomplete.startswith("socket-missing: "), "the failure is the cached answer"
        clock.now += 2
        assert pods_of(lookup, gpu(0)) == ["ml/train-0"]
    assert server.calls == [LIST]


# ---- failures are answers -------------------------------------------------------------------------


def test_no_socket_is_an_incomplete_answer(sock):
    answer = HolderLookup(socket_path=sock).holders(gpu(0))
    assert answer.holders == ()
    assert answer.incomplete == f"socket-missing: no socket at {sock}"


def test_a_kubelet_that_never_answers_is_a_deadline(sock):
    with PodResourcesServer(sock, mode="hang"):
        answer = HolderLookup(socket_path=sock, timeout_s=0.2).holders(gpu(0))
    assert answer.holders == () and answer.incomplete.startswith("deadline: List: DEADLINE_EXCEEDED")


def test_a_socket_nobody_serves_is_unavailable(sock):
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)  # bound, never listening: connections are refused
    try:
        answer = HolderLookup(socket_path=sock, timeout_s=10).holders(gpu(0))
    finally:
        s.close()
    assert answer.holders == () and answer.incomplete.startswith("unavailable: List: UNAVAILABLE")


def test_the_kubelets_limiter_saying_no(sock):
    with PodResourcesServer(sock, mode="rate-limited"):
        answer = HolderLookup(socket_path=sock, timeout_s=10).holders(gpu(0))
    assert answer.incomplete.startswith("rate-limited: ")


def test_without_allocatable_neuron_cores_are_left_unread(sock):
    """A kubelet whose GetAllocatableResources fails: devices still match, cores are said to be unread."""
    pods, _ = neuron_node()
    with PodResourcesServer(sock, pods, methods=("List",)):
        lookup = HolderLookup(socket_path=sock, timeout_s=10)
        device = lookup.holders(neuron(3))
        cores = lookup.holders(neuron(4))
    assert [p for _, p in device.pods] == ["llm-1"]
    assert device.incomplete == cores.incomplete == "NeuronCores are allocated but the cores per device are not known"
    assert cores.pods == ()


def test_a_failing_alias_source_leaves_the_device_plugin_ids(sock):
    def slices(device: DeviceRef) -> frozenset[tuple[str, str, str]]:
        raise RuntimeError("resourceslices: 503")

    with PodResourcesServer(sock, *mixed_node()):
        answer = HolderLookup(socket_path=sock, timeout_s=10, dra=slices).holders(gpu(0))
    assert [p for _, p in answer.pods] == ["train-0"]
    assert answer.incomplete == "DRA devices not read: RuntimeError: resourceslices: 503"


# ---- memory: nothing at import, the client at the first lookup ------------------------------------


def test_making_a_lookup_loads_no_grpc_the_first_lookup_does(sock):
    code = (
        "import sys\n"
        "from agent.recovery.holderlookup import HolderLookup\n"
        "from agent.core.devices import DeviceKind, DeviceRef\n"
        f"lookup = HolderLookup(socket_path={sock!r})\n"
        "print('grpc' in sys.modules)\n"
        f"s = __import__('socket').socket(__import__('socket').AF_UNIX); s.bind({sock!r})\n"
        "d = DeviceRef(kind=DeviceKind.NEURON, id='neuron0', printed='0', index=0)\n"
        "print(lookup.holders(d).incomplete.split(':')[0], 'grpc' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "unavailable", "True"]
