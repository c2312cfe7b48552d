"""The kubelet's pod-resources seam: the only module that imports grpc, and only inside functions.

The kubelet serves gRPC service ``v1.PodResourcesLister`` on the UNIX socket
``/var/lib/kubelet/pod-resources/kubelet.sock`` (``List``, ``GetAllocatableResources``, ``Get``; the
messages of ``k8s.io/kubelet/pkg/apis/podresources/v1``). grpcio carries the calls; the messages are
read with :mod:`agent.adapters.protowire` (only the fields :mod:`agent.core.holders` needs, unknown
fields skipped), so the ``protobuf`` package is never loaded. Importing grpc costs memory
(docs/devices.md gives the figure): it happens at the first call, never on the idle path.

Each call opens a channel, makes one request under a deadline and closes the channel (the kubelet
limits this API to 100 requests per second, burst 10: callers look up when a device fails, not in a
loop). Every failure is a :class:`PodResourcesError` whose ``reason`` says what went wrong.
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Callable
from typing import Any, TypeVar

from agent.adapters import protowire as wire
from agent.core.holders import ClaimDevice, ContainerDevices, ContainerResources, PodResources

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT_S = 5.0
SERVICE = "v1.PodResourcesLister"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the kubelet's own pod-resources clients allow 16 MiB
T = TypeVar("T")


class Failure(enum.StrEnum):
    SOCKET_MISSING = "socket-missing"  # no socket at the path (kubelet down, or not mounted)
    PERMISSION = "permission"  # the socket is there but we may not connect (needs write access)
    UNAVAILABLE = "unavailable"  # the kubelet did not serve the call (refused, closed, other error)
    DEADLINE = "deadline"  # no answer within the timeout
    RATE_LIMITED = "rate-limited"  # the kubelet's limit (100/s, burst 10) said no
    NOT_FOUND = "not-found"  # Get: no such pod on this node
    UNIMPLEMENTED = "unimplemented"  # this kubelet has no such method (Get before 1.27, or gated off)
    MALFORMED = "malformed"  # the answer is not a well-formed message of the expected type


class PodResourcesError(Exception):
    """A pod-resources call failed; ``reason`` is a :class:`Failure`."""

    def __init__(self, reason: Failure, message: str) -> None:
        super().__init__(f"pod-resources {reason.value}: {message}")
        self.reason = reason


# ---- messages (field numbers of k8s.io/kubelet/pkg/apis/podresources/v1) ---------------------------


def _container_devices(data: bytes) -> ContainerDevices:
    resource, ids = "", []
    for number, _, value in wire.fields(data):
        if number == 1:  # resource_name
            resource = wire.text(value, number)
        elif number == 2:  # device_ids (repeated string)
            ids.append(wire.text(value, number))
    return ContainerDevices(resource_name=resource, device_ids=tuple(ids))


def _claim_resources(data: bytes) -> list[ClaimDevice]:
    """A ``DynamicResource``: claim_name (2), claim_namespace (3), claim_resources (4: ClaimResource
    with driver_name 2, pool_name 3, device_name 4)."""
    name, namespace, triples = "", "", []
    for number, _, value in wire.fields(data):
        if number == 2:
            name = wire.text(value, number)
        elif number == 3:
            namespace = wire.text(value, number)
        elif number == 4:
            parts = {2: "", 3: "", 4: ""}
            for inner, _, field in wire.fields(wire.message(value, number)):
                if inner in parts:
                    parts[inner] = wire.text(field, inner)
            triples.append((parts[2], parts[3], parts[4]))
    return [ClaimDevice(d, p, n, claim_name=name, claim_namespace=namespace) for d, p, n in triples]


def _container(data: bytes) -> ContainerResources:
    name, devices, claims = "", [], []
    for number, _, value in wire.fields(data):
        if number == 1:  # name
            name = wire.text(value, number)
        elif number == 2:  # devices
            devices.append(_container_devices(wire.message(value, number)))
        elif number == 5:  # dynamic_resources
            claims.extend(_claim_resources(wire.message(value, number)))
    return ContainerResources(name=name, devices=tuple(devices), claims=tuple(claims))


def _pod(data: bytes) -> PodResources:
    name, namespace, containers = "", "", []
    for number, _, value in wire.fields(data):
        if number == 1:
            name = wire.text(value, number)
        elif number == 2:
            namespace = wire.text(value, number)
        elif number == 3:
            containers.append(_container(wire.message(value, number)))
    return PodResources(name=name, namespace=namespace, containers=tuple(containers))


def decode_list(data: bytes) -> tuple[PodResources, ...]:
    """A ``ListPodResourcesResponse``: pod_resources (1)."""
    return tuple(_pod(wire.message(v, n)) for n, _, v in wire.fields(data) if n == 1)


def decode_get(data: bytes) -> PodResources | None:
    """A ``GetPodResourcesResponse``: pod_resources (1), or None where it has none."""
    pods = decode_list(data)  # the same field number and type
    return pods[-1] if pods else None  # a repeated singular field: the last one wins


def decode_allocatable(data: bytes) -> tuple[ContainerDevices, ...]:
    """An ``AllocatableResourcesResponse``: devices (1)."""
    return tuple(_container_devices(wire.message(v, n)) for n, _, v in wire.fields(data) if n == 1)


def encode_get(namespace: str, name: str) -> bytes:
    """A ``GetPodResourcesRequest``: pod_name (1), pod_namespace (2)."""
    return wire.encode_text(1, name) + wire.encode_text(2, namespace)


# ---- the client ----------------------------------------------------------------------------------


class PodResourcesClient:
    """Calls the kubelet's pod-resources API on ``socket_path``, each call under ``timeout_s``."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def list(self) -> tuple[PodResources, ...]:
        """Every pod on the node with the devices its containers hold."""
        return self._decoded("List", b"", decode_list)

    def get(self, namespace: str, name: str) -> PodResources | None:
        """One pod's resources (``Get``, kubelet 1.27+; beta and on from 1.34); None: no such pod here."""
        try:
            return self._decoded("Get", encode_get(namespace, name), decode_get)
        except PodResourcesError as err:
            if err.reason is Failure.NOT_FOUND:
                return None
            raise

    def allocatable(self) -> tuple[ContainerDevices, ...]:
        """The devices the node offers (``GetAllocatableResources``), per resource."""
        return self._decoded("GetAllocatableResources", b"", decode_allocatable)

    def _decoded(self, method: str, request: bytes, decode: Callable[[bytes], T]) -> T:
        answer = self._call(method, request)
        try:
            return decode(answer)
        except wire.WireError as err:
            raise PodResourcesError(Failure.MALFORMED, f"{method}: {err}") from err

    def _check_socket(self) -> None:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError as err:
            raise PodResourcesError(Failure.SOCKET_MISSING, f"no socket at {self.socket_path}") from err
        except PermissionError as err:
            raise PodResourcesError(Failure.PERMISSION, f"cannot reach {self.socket_path}: {err}") from err
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError(Failure.SOCKET_MISSING, f"{self.socket_path} is not a socket")
        if not os.access(self.socket_path, os.W_OK):
            raise PodResourcesError(Failure.PERMISSION, f"no write access to {self.socket_path} (connecting needs it)")

    def _call(self, method: str, request: bytes) -> bytes:
        self._check_socket()
        import grpc  # here, not at the top: grpc costs memory the idle agent does not spend

        # A channel of its own subchannels: grpc's process-wide pool would hand this call a subchannel still in
        # the reconnect backoff of an earlier failed call (a busy forwarder, a kubelet restart), and the call
        # would fail fast with that old error instead of trying the socket that works again.
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 0),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        with grpc.insecure_channel(f"unix://{self.socket_path}", options=options) as channel:
            call = channel.unary_unary(f"/{SERVICE}/{method}")  # bytes in, bytes out: no serializers
            try:
                answer = call(request, timeout=self.timeout_s)
            except grpc.RpcError as err:
                raise _failure(method, err, grpc) from err
        if not isinstance(answer, bytes):
            raise PodResourcesError(Failure.MALFORMED, f"{method}: answer of type {type(answer).__name__}")
        return answer


def _failure(method: str, err: Any, grpc: Any) -> PodResourcesError:
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else "") or ""
    reasons = {
        grpc.StatusCode.DEADLINE_EXCEEDED: Failure.DEADLINE,
        grpc.StatusCode.PERMISSION_DENIED: Failure.PERMISSION,
        grpc.StatusCode.UNAUTHENTICATED: Failure.PERMISSION,
        grpc.StatusCode.RESOURCE_EXHAUSTED: Failure.RATE_LIMITED,
        grpc.StatusCode.UNIMPLEMENTED: Failure.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL: Failure.MALFORMED if "parse" in details.lower() else Failure.UNAVAILABLE,
    }
    reason = reasons.get(code, Failure.UNAVAILABLE)
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.NOT_FOUND) and "not found" in details.lower():
        reason = Failure.NOT_FOUND  # the kubelet's Get answers an unknown pod with a plain error
    if reason is Failure.UNAVAILABLE and "permission denied" in details.lower():
        reason = Failure.PERMISSION
    name = code.name if code is not None else "unknown"
    return PodResourcesError(reason, f"{method}: {name}: {details}")
