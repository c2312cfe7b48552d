"""A kubelet pod-resources server for tests: the real grpcio server on a UNIX socket, serving
``v1.PodResourcesLister`` (``List``, ``GetAllocatableResources``, ``Get``).

The messages are built with the real ``protobuf`` package (a test dependency only) from a descriptor
written here from the wire facts of the kubelet's API (package ``v1``, message and field names,
numbers and types), so the agent's own hand-written reader is checked against an independent writer.
It also writes fields the agent does not read (``cpu_ids``, ``topology``, ``memory``, CDI devices), as
a kubelet does.

Fixtures are shaped like the device plugins' answers: :func:`nvidia_node` (eight GPUs by UUID, one
MIG-partitioned GPU), :func:`neuron_node`, EFA devices, and DRA claims (:func:`dra_node`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
STRING, INT64, UINT64, MESSAGE = _F.TYPE_STRING, _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_MESSAGE
ONE, MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# message -> (field name, number, type, label, message type); written from the wire facts of
# k8s.io/kubelet/pkg/apis/podresources/v1 (not copied from its .proto).
MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ListPodResourcesRequest": [],
    "AllocatableResourcesRequest": [],
    "NUMANode": [("ID", 1, INT64, ONE, "")],
    "TopologyInfo": [("nodes", 1, MESSAGE, MANY, "NUMANode")],
    "ContainerDevices": [
        ("resource_name", 1, STRING, ONE, ""),
        ("device_ids", 2, STRING, MANY, ""),
        ("topology", 3, MESSAGE, ONE, "TopologyInfo"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, STRING, ONE, ""),
        ("size", 2, UINT64, ONE, ""),
        ("topology", 3, MESSAGE, ONE, "TopologyInfo"),
    ],
    "CDIDevice": [("name", 1, STRING, ONE, "")],
    "ClaimResource": [
        ("cdi_devices", 1, MESSAGE, MANY, "CDIDevice"),
        ("driver_name", 2, STRING, ONE, ""),
        ("pool_name", 3, STRING, ONE, ""),
        ("device_name", 4, STRING, ONE, ""),
    ],
    "DynamicResource": [
        ("claim_name", 2, STRING, ONE, ""),
        ("claim_namespace", 3, STRING, ONE, ""),
        ("claim_resources", 4, MESSAGE, MANY, "ClaimResource"),
    ],
    "ContainerResources": [
        ("name", 1, STRING, ONE, ""),
        ("devices", 2, MESSAGE, MANY, "ContainerDevices"),
        ("cpu_ids", 3, INT64, MANY, ""),
        ("memory", 4, MESSAGE, MANY, "ContainerMemory"),
        ("dynamic_resources", 5, MESSAGE, MANY, "DynamicResource"),
    ],
    "PodResources": [
        ("name", 1, STRING, ONE, ""),
        ("namespace", 2, STRING, ONE, ""),
        ("containers", 3, MESSAGE, MANY, "ContainerResources"),
    ],
    "ListPodResourcesResponse": [("pod_resources", 1, MESSAGE, MANY, "PodResources")],
    "AllocatableResourcesResponse": [
        ("devices", 1, MESSAGE, MANY, "ContainerDevices"),
        ("cpu_ids", 2, INT64, MANY, ""),
        ("memory", 3, MESSAGE, MANY, "ContainerMemory"),
    ],
    "GetPodResourcesRequest": [("pod_name", 1, STRING, ONE, ""), ("pod_namespace", 2, STRING, ONE, "")],
    "GetPodResourcesResponse": [("pod_resources", 1, MESSAGE, ONE, "PodResources")],
}


def _classes() -> dict[str, type]:
    proto = descriptor_pb2.FileDescriptorProto(name="test_podresources_v1.proto", package="v1", syntax="proto3")
    for name, fields in MESSAGES.items():
        msg = proto.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            entry = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                entry.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{n}")) for n in MESSAGES}


PB = _classes()


# ---- fixtures --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name -> device ids
    claims: list[tuple[str, str, str]] = field(default_factory=list)  # (driver, pool, device)
    claim_name: str = "gpu-claim"


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    containers: list[Container]


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-44444444{i:04x}"


def mig_uuid(gpu: int, slot: int) -> str:
    return f"MIG-{gpu:04x}{slot:04x}-aaaa-bbbb-cccc-dddddddd{slot:04x}"


def nvidia_node() -> tuple[list[Pod], dict[str, list[str]]]:
    """A p5-like node: GPUs 0-6 by UUID (one pod per GPU, ``train-2`` holds GPUs 5 and 6), GPU 7 split
    into two MIG slices held by two pods, an EFA device beside each GPU pod."""
    pods = [Pod("ml", f"train-{i}", [Container("main", {"nvidia.com/gpu": [gpu_uuid(i)]})]) for i in range(5)]
    pods.append(Pod("ml", "train-2x", [Container("main", {"nvidia.com/gpu": [gpu_uuid(5), gpu_uuid(6)]})]))
    pods.append(Pod("ml", "infer-a", [Container("srv", {"nvidia.com/mig-3g.40gb": [mig_uuid(7, 0)]})]))
    pods.append(Pod("ml", "infer-b", [Container("srv", {"nvidia.com/mig-3g.40gb": [mig_uuid(7, 1)]})]))
    pods.append(Pod("ml", "net-0", [Container("nccl", {"vpc.amazonaws.com/efa": ["rdmap47s0", "rdmap48s0"]})]))
    pods.append(Pod("kube-system", "cni", [Container("cni", {})]))  # a pod without devices
    allocatable = {
        "nvidia.com/gpu": [gpu_uuid(i) for i in range(7)],
        "nvidia.com/mig-3g.40gb": [mig_uuid(7, 0), mig_uuid(7, 1)],
        "vpc.amazonaws.com/efa": ["rdmap47s0", "rdmap48s0"],
    }
    return pods, allocatable


def neuron_node() -> tuple[list[Pod], dict[str, list[str]]]:
    """A trn1-like node: 16 devices of 2 NeuronCores; one pod per device resource name, one by cores."""
    pods = [
        Pod("ml", "llm-0", [Container("w", {"aws.amazon.com/neuron": ["0", "1"]})]),
        Pod("ml", "llm-1", [Container("w", {"aws.amazon.com/neurondevice": ["3"]})]),
        Pod("ml", "small", [Container("w", {"aws.amazon.com/neuroncore": ["8", "9", "10"]})]),  # devices 4, 5
    ]
    allocatable = {
        "aws.amazon.com/neurondevice": [str(i) for i in range(16)],
        "aws.amazon.com/neuroncore": [str(i) for i in range(32)],
    }
    return pods, allocatable


def dra_node(node: str = "node-a") -> list[Pod]:
    """Pods whose GPUs come from a DRA driver (pool = the node name, as node-local drivers do)."""
    return [
        Pod("ml", "dra-0", [Container("c", claims=[("gpu.nvidia.com", node, "gpu-0")])]),
        Pod(
            "ml",
            "dra-1",
            [Container("c", claims=[("gpu.nvidia.com", node, "gpu-1"), ("neuron.aws.com", node, "neuron-1")])],
        ),
    ]


def _pod_message(pod: Pod):  # type: ignore[no-untyped-def]
    msg = PB["PodResources"](name=pod.name, namespace=pod.namespace)
    for c in pod.containers:
        cm = msg.containers.add(name=c.name, cpu_ids=[2, 3])
        cm.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
        for resource, ids in c.devices.items():
            cm.devices.add(resource_name=resource, device_ids=ids).topology.nodes.add(ID=1)
        if c.claims:
            dyn = cm.dynamic_resources.add(claim_name=c.claim_name, claim_namespace=pod.namespace)
            for driver, pool, device in c.claims:
                claim = dyn.claim_resources.add(driver_name=driver, pool_name=pool, device_name=device)
                claim.cdi_devices.add(name=f"{driver}/gpu={device}")
    return msg


# ---- the server ------------------------------------------------------------------------------------


class PodResourcesServer:
    """Serves ``pods`` and ``allocatable`` on ``socket_path``. ``mode``: ``serve``; ``hang`` (never
    answers until stopped); ``malformed`` (answers bytes that are no message); ``rate-limited`` (says
    no as the kubelet's limiter does). ``methods``: the methods served (a kubelet before 1.27 has no
    ``Get``)."""

    def __init__(
        self,
        socket_path: str,
        pods: Sequence[Pod] = (),
        allocatable: dict[str, list[str]] | None = None,
        *,
        mode: str = "serve",
        methods: Sequence[str] = ("List", "GetAllocatableResources", "Get"),
    ) -> None:
        self.socket_path = socket_path
        self.pods = list(pods)
        self.allocatable = allocatable or {}
        self.mode = mode
        self.calls: list[str] = []
        self._release = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "List": self._handler(self._list, "ListPodResourcesRequest"),
            "GetAllocatableResources": self._handler(self._allocatable, "AllocatableResourcesRequest"),
            "Get": self._handler(self._get, "GetPodResourcesRequest"),
        }
        handlers = {name: handler for name, handler in handlers.items() if name in methods}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),)
        )
        if self._server.add_insecure_port(f"unix:{socket_path}") == 0:
            raise RuntimeError(f"cannot listen on {socket_path}")

    def _handler(self, fn, request_type: str):  # type: ignore[no-untyped-def]
        def serve(request, context):  # type: ignore[no-untyped-def]
            self.calls.append(type(request).__name__)
            if self.mode == "hang":
                self._release.wait()
                context.abort(grpc.StatusCode.CANCELLED, "server stopped")
            if self.mode == "rate-limited":
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
            if self.mode == "malformed":
                return b"\x0a\xff\x01garbage"  # field 1, length 255: runs past the end
            return fn(request, context).SerializeToString()

        return grpc.unary_unary_rpc_method_handler(
            serve, request_deserializer=PB[request_type].FromString, response_serializer=None
        )

    def _list(self, request, context):  # type: ignore[no-untyped-def]
        return PB["ListPodResourcesResponse"](pod_resources=[_pod_message(p) for p in self.pods])

    def _allocatable(self, request, context):  # type: ignore[no-untyped-def]
        out = PB["AllocatableResourcesResponse"](cpu_ids=[0, 1, 2, 3])
        for resource, ids in self.allocatable.items():
            out.devices.add(resource_name=resource, device_ids=ids)
        return out

    def _get(self, request, context):  # type: ignore[no-untyped-def]
        for pod in self.pods:
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return PB["GetPodResourcesResponse"](pod_resources=_pod_message(pod))
        # the kubelet answers an unknown pod with a plain error (gRPC code Unknown)
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} not found in namespace {request.pod_namespace}")

    def __enter__(self) -> PodResourcesServer:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._server.stop(grace=None)
