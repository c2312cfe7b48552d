"""The pod-resources client over the real grpcio server of tests/helpers/podresources_server.py, on a
UNIX socket, with answers written by the real protobuf package; the wire reader; the import cost."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agent.adapters import protowire
from agent.adapters.podresources import Failure, PodResourcesClient, PodResourcesError, decode_list
from agent.core.devices import DeviceKind, DeviceRef
from agent.core.holders import ClaimDevice, ContainerDevices, DeviceAliases, cores_per_device, holders_of

from helpers.podresources_server import (
    PB,
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


@pytest.fixture
def sock(tmp_path: Path) -> str:
    return str(tmp_path / "kubelet.sock")


# ---- the calls -------------------------------------------------------------------------------------


def test_list_returns_every_pod_with_its_devices(sock):
    pods, allocatable = nvidia_node()
    with PodResourcesServer(sock, pods, allocatable) as server:
        answer = PodResourcesClient(sock, timeout_s=10).list()
    assert server.calls == ["ListPodResourcesRequest"]
    assert [(p.namespace, p.name) for p in answer] == [(p.namespace, p.name) for p in pods]
    two = next(p for p in answer if p.name == "train-2x")
    assert two.containers[0].name == "main"
    assert two.containers[0].devices == (ContainerDevices("nvidia.com/gpu", (gpu_uuid(5), gpu_uuid(6))),)
    assert next(p for p in answer if p.name == "cni").containers[0].devices == ()


def test_list_reads_dra_claims(sock):
    with PodResourcesServer(sock, dra_node("node-a")):
        answer = PodResourcesClient(sock, timeout_s=10).list()
    claims = {p.name: p.containers[0].claims for p in answer}
    assert claims["dra-1"] == (
        ClaimDevice("gpu.nvidia.com", "node-a", "gpu-1", claim_name="gpu-claim", claim_namespace="ml"),
        ClaimDevice("neuron.aws.com", "node-a", "neuron-1", claim_name="gpu-claim", claim_namespace="ml"),
    )


def test_get_returns_one_pod_or_none(sock):
    pods, _ = nvidia_node()
    with PodResourcesServer(sock, pods) as server:
        client = PodResourcesClient(sock, timeout_s=10)
        pod = client.get("ml", "infer-b")
        missing = client.get("ml", "no-such-pod")
    assert server.calls == ["GetPodResourcesRequest", "GetPodResourcesRequest"]
    assert pod is not None and (pod.namespace, pod.name) == ("ml", "infer-b")
    assert pod.containers[0].devices == (ContainerDevices("nvidia.com/mig-3g.40gb", (mig_uuid(7, 1),)),)
    assert missing is None


def test_allocatable_lists_what_the_node_offers(sock):
    pods, allocatable = neuron_node()
    with PodResourcesServer(sock, pods, allocatable):
        offered = PodResourcesClient(sock, timeout_s=10).allocatable()
    assert {d.resource_name: len(d.device_ids) for d in offered} == {
        "aws.amazon.com/neurondevice": 16,
        "aws.amazon.com/neuroncore": 32,
    }
    assert cores_per_device(offered) == 2


def test_gpu_3_of_8_through_the_socket(sock):
    """The lookup end to end: List over the socket, then the mapping: only GPU 3's pod."""
    pods, _ = nvidia_node()
    with PodResourcesServer(sock, pods):
        answer = PodResourcesClient(sock, timeout_s=10).list()
    ref = DeviceRef(kind=DeviceKind.GPU, id="0000:13:00.0", printed="0000:13:00", index=3, uuid=gpu_uuid(3))
    assert holders_of(ref, answer, DeviceAliases()).pods == (("ml", "train-3"),)


# ---- failures --------------------------------------------------------------------------------------


def failure(call) -> Failure:  # type: ignore[no-untyped-def]
    with pytest.raises(PodResourcesError) as err:
        call()
    return err.value.reason


def test_a_server_that_never_answers_is_a_deadline(sock):
    with PodResourcesServer(sock, mode="hang"):
        assert failure(PodResourcesClient(sock, timeout_s=0.2).list) is Failure.DEADLINE


def test_the_kubelets_rate_limit(sock):
    with PodResourcesServer(sock, mode="rate-limited"):
        assert failure(PodResourcesClient(sock, timeout_s=10).list) is Failure.RATE_LIMITED


def test_a_kubelet_without_get(sock):
    with PodResourcesServer(sock, nvidia_node()[0], methods=("List", "GetAllocatableResources")):
        client = PodResourcesClient(sock, timeout_s=10)
        assert failure(lambda: client.get("ml", "train-3")) is Failure.UNIMPLEMENTED
        assert len(client.list()) == len(nvidia_node()[0])


def test_no_socket(sock):
    assert failure(PodResourcesClient(sock).list) is Failure.SOCKET_MISSING


def test_a_file_that_is_no_socket(tmp_path):
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    assert failure(PodResourcesClient(str(path)).list) is Failure.SOCKET_MISSING


def test_a_socket_nobody_listens_on_is_unavailable(sock):
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)  # bound, never listening: connections are refused
    try:
        assert failure(PodResourcesClient(sock, timeout_s=10).list) is Failure.UNAVAILABLE
    finally:
        s.close()


@pytest.mark.parametrize("folder_mode", [0o755, 0o700], ids=["socket-not-writable", "folder-not-searchable"])
def test_a_socket_we_may_not_write(folder_mode):
    """Connecting to a UNIX socket needs write access to it and search access to its folder (the
    kubelet's is root's). As root the client runs as nobody (setpriv): root may connect to any socket."""
    folder = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    os.chmod(folder, folder_mode)
    sock = str(folder / "kubelet.sock")
    code = (
        "from agent.adapters.podresources import PodResourcesClient, PodResourcesError\n"
        f"try:\n    PodResourcesClient({sock!r}, timeout_s=10).list()\n"
        "except PodResourcesError as e:\n    print(e.reason)\n"
    )
    command = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot drop the right to connect")
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    with PodResourcesServer(sock):
        os.chmod(sock, 0o755)  # nobody may read, not write
        out = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
    shutil.rmtree(folder)
    assert out.stdout.strip() == "permission"


def test_a_malformed_answer(sock):
    with PodResourcesServer(sock, mode="malformed"):
        client = PodResourcesClient(sock, timeout_s=10)
        assert failure(client.list) is Failure.MALFORMED
        assert failure(client.allocatable) is Failure.MALFORMED


def test_the_timeout_must_be_positive(sock):
    with pytest.raises(ValueError, match="timeout_s"):
        PodResourcesClient(sock, timeout_s=0)


# ---- the wire reader -------------------------------------------------------------------------------


def test_fields_the_reader_does_not_know_are_skipped():
    """A newer kubelet's fields (any wire type) are skipped; the ones read keep their values."""
    pod = PB["PodResources"](name="p", namespace="ns")
    pod.containers.add(name="c", cpu_ids=[1, 2, 300]).devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-1"])
    extra = bytes([0x78, 0x05])  # field 15, varint 5
    extra += bytes([0x81, 0x01]) + b"\x00" * 8  # field 16, fixed64
    extra += bytes([0x8D, 0x01]) + b"\x00" * 4  # field 17, fixed32
    extra += bytes([0x92, 0x01, 0x02]) + b"\x08\x01"  # field 18, a nested message
    pod_bytes = pod.SerializeToString() + extra
    data = bytes([0x0A, len(pod_bytes)]) + pod_bytes
    (decoded,) = decode_list(data)
    assert (decoded.name, decoded.namespace) == ("p", "ns")
    assert decoded.containers[0].devices == (ContainerDevices("nvidia.com/gpu", ("GPU-1",)),)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x0a\x05abc", "past the end"),  # a length beyond the data
        (b"\x08", "truncated varint"),
        (b"\x08" + b"\xff" * 11, "longer than 10"),
        (b"\x0b", "groups"),  # field 1, wire type 3 (start group)
        (b"\x00\x00", "field number 0"),
        (b"\x09\x00\x00", "truncated fixed"),
    ],
)
def test_malformed_bytes_are_refused(data, problem):
    with pytest.raises(protowire.WireError, match=problem):
        list(protowire.fields(data))


@pytest.mark.parametrize(
    "data",
    [
        b"\x08\x01",  # pod_resources (a message) sent as a varint
        bytes([0x0A, 0x03, 0x0A, 0x01, 0xFF]),  # a pod name that is not UTF-8
    ],
    ids=["wrong-wire-type", "not-utf8"],
)
def test_a_known_field_of_the_wrong_shape_is_refused(data):
    with pytest.raises(protowire.WireError):
        decode_list(data)


def test_strings_round_trip_through_the_real_protobuf():
    request = PB["GetPodResourcesRequest"].FromString(
        protowire.encode_text(1, "trainer-ü") + protowire.encode_text(2, "ml")
    )
    assert (request.pod_name, request.pod_namespace) == ("trainer-ü", "ml")


# ---- memory: grpc only when the lookup is used -------------------------------------------------------


def test_the_agent_does_not_import_grpc_until_a_lookup():
    code = (
        "import sys, agent.app.cli, agent.app.assembly, agent.engine.mainloop, agent.adapters.podresources, "
        "agent.core.holders; print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_lookup_imports_grpc_and_never_protobuf(sock):
    code = (
        "import sys\n"
        "from agent.adapters.podresources import PodResourcesClient, PodResourcesError\n"
        f"try:\n    PodResourcesClient({str(Path(sock).parent / 'none.sock')!r}).list()\n"
        "except PodResourcesError:\n    pass\n"
        f"s = __import__('socket').socket(__import__('socket').AF_UNIX); s.bind({sock!r})\n"
        f"try:\n    PodResourcesClient({sock!r}, timeout_s=5).list()\n"
        "except PodResourcesError as e:\n    print(e.reason)\n"
        "print('grpc' in sys.modules, 'google.protobuf' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["unavailable", "True", "False"]


def test_a_pod_without_containers_is_read(sock):
    with PodResourcesServer(sock, [Pod("ml", "empty", []), Pod("ml", "one", [Container("c")])]):
        answer = PodResourcesClient(sock, timeout_s=10).list()
    assert [(p.name, len(p.containers)) for p in answer] == [("empty", 0), ("one", 1)]
