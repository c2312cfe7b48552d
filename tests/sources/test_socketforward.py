"""The pod-resources forwarder: the relay container passes the kubelet's socket on, byte for byte, to the agent.

Behind it the real grpcio pod-resources server (tests/helpers/podresources_server.py); in front the agent's
own client (PodResourcesClient, HolderLookup). Peers of other uids are child processes that the kernel
starts as that uid (needs root, as the relay is).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.adapters.podresources import Failure, PodResourcesClient, PodResourcesError
from agent.app.cli import build_parser
from agent.core.devices import DeviceKind, DeviceRef
from agent.recovery.holderlookup import HolderLookup
from agent.sources.socketforward import DEFAULT_SOCKET, Forward, ForwardStats, SocketForwarder
from agent.sources.unixsocket import AccessPolicy

from helpers.podresources_server import PodResourcesServer, gpu_uuid, nvidia_node
from helpers.relay import POLL, WAIT, FakeClock, raw_connect, read_frame, record, wait_for, write_records

AGENT_UID = 65532  # the agent container's runAsUser
NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run peers as other uids and to chown")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory other uids can traverse (like the pod's emptyDir)."""
    path = Path(tempfile.mkdtemp(prefix="nha-fwd-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Running:
    """SocketForwarder.run() in a thread, as the relay runs it; construction waits until it listens."""

    def __init__(self, sock_dir: Path, *, clock: FakeClock | None = None, **kwargs) -> None:
        kwargs.setdefault("policy", AccessPolicy(uid=AGENT_UID))
        kwargs.setdefault("poll_interval", POLL)
        self.path = sock_dir / "pr.sock"
        self.target = sock_dir / "kubelet.sock"
        self.forwarder = SocketForwarder(
            Forward(socket_path=self.path, target=self.target, **kwargs),
            stats=ForwardStats(),
            **({"monotonic": clock} if clock else {}),
        )
        self.stats = self.forwarder.stats
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.rc: int | None = None
        self.thread = threading.Thread(target=self._main, name="test-forwarder", daemon=True)
        self.thread.start()
        wait_for(lambda: self.ready.is_set() or not self.thread.is_alive(), what="the forwarder to listen")
        assert self.ready.is_set(), f"the forwarder exited with {self.rc} instead of listening"

    def _main(self) -> None:
        self.rc = self.forwarder.run(self.stop_event, ready=self.ready)

    def stop(self) -> int | None:
        self.stop_event.set()
        self.thread.join(timeout=WAIT)
        assert not self.thread.is_alive(), "the forwarder did not stop"
        return self.rc


@pytest.fixture
def forwarding(sock_dir: Path) -> Iterator[Running]:
    running = Running(sock_dir)
    yield running
    assert running.stop() == 0


def forward_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pod-resources-forward")]


def idle(running: Running) -> None:
    wait_for(lambda: running.forwarder.open_connections() == 0, what="every forwarded connection to end")


def failure(client: PodResourcesClient) -> Failure:
    with pytest.raises(PodResourcesError) as raised:
        client.list()
    return raised.value.reason


# ---- through the forwarder ---------------------------------------------------------------------------


@needs_root
def test_a_list_goes_through_and_its_connection_ends_with_the_call(forwarding: Running) -> None:
    pods, allocatable = nvidia_node()
    st = forwarding.path.lstat()
    assert stat.S_ISSOCK(st.st_mode) and (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, AGENT_UID)
    with PodResourcesServer(str(forwarding.target), pods, allocatable) as server:
        client = PodResourcesClient(str(forwarding.path), timeout_s=WAIT)
        answer = client.list()
        assert [(p.namespace, p.name) for p in answer] == [(p.namespace, p.name) for p in pods]
        assert client.get("ml", "infer-b") is not None and client.get("ml", "nobody") is None
        lookup = HolderLookup(socket_path=str(forwarding.path), timeout_s=WAIT)
        gpu = DeviceRef(kind=DeviceKind.GPU, id="0000:3b:00.0", printed="GPU 0", uuid=gpu_uuid(0), present=True)
        holders = lookup.holders(gpu)
        assert (holders.pods, holders.incomplete) == ((("ml", "train-0"),), None)
        idle(forwarding)  # each call's channel closed: its connection (and thread) is gone
    assert server.calls[0] == "ListPodResourcesRequest" and len(server.calls) == 4
    assert 1 <= forwarding.stats.accepted <= 4  # grpc may reuse a connection for the next channel
    assert (forwarding.stats.refused, forwarding.stats.unreachable, forwarding.stats.busy) == (0, 0, 0)
    assert forward_threads() == []


# A peer: the agent's client, loaded as root (the interpreter lives under /root), then run as another uid
# (gid the same, no supplementary groups); prints how its List ended.
PEER = r"""
import json, os, sys
import grpc
from agent.adapters.podresources import PodResourcesClient, PodResourcesError
grpc.insecure_channel("unix:/nonexistent").close()  # loads the rest of grpc while the files are readable
uid = int(sys.argv[2])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
try:
    print(json.dumps({"pods": len(PodResourcesClient(sys.argv[1], timeout_s=10).list())}))
except PodResourcesError as err:
    print(json.dumps({"failure": err.reason.value}))
"""


def as_peer(path: Path, uid: int) -> dict[str, object]:
    """The List of a child process that runs as ``uid``."""
    proc = subprocess.run(
        [sys.executable, "-c", PEER, os.fspath(path), str(uid)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_root
@pytest.mark.parametrize(
    ("uid", "widened", "expected"),
    [
        (AGENT_UID, False, {"pods": 10}),  # the agent's uid: served
        (NOBODY, False, {"failure": "permission"}),  # the file (0600, the agent's) says no
        (NOBODY, True, {"failure": "unavailable"}),  # past a widened file mode, SO_PEERCRED says no
    ],
    ids=["agent", "other-uid", "other-uid-past-the-file-mode"],
)
def test_only_the_agents_uid_gets_through(forwarding: Running, uid: int, widened: bool, expected: dict) -> None:
    pods, _ = nvidia_node()
    if widened:
        forwarding.path.chmod(0o666)
    with PodResourcesServer(str(forwarding.target), pods) as server:
        assert as_peer(forwarding.path, uid) == expected
    allowed = uid == AGENT_UID
    assert bool(server.calls) is allowed, "a refused peer never reaches the kubelet"
    assert (forwarding.stats.accepted > 0) is allowed
    assert (forwarding.stats.refused > 0) is (widened and not allowed)


# ---- the target absent, the limit, hang-ups, idle, stop -----------------------------------------------


@needs_root
def test_the_target_absent_closes_the_client_at_once_and_says_so_once(sock_dir: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="agent.sources.socketforward")
    clock = FakeClock()
    running = Running(sock_dir, clock=clock)
    try:
        client = PodResourcesClient(str(running.path), timeout_s=WAIT)
        for _ in range(3):
            assert failure(client) is Failure.UNAVAILABLE
        assert running.stats.unreachable >= 1 and running.stats.accepted == 0  # grpc may fail fast in its backoff
        lines = [r.getMessage() for r in caplog.records if "cannot connect to" in r.getMessage()]
        assert len(lines) == 1, lines  # rate-limited
        assert str(running.target) in lines[0] and "mounted into this container" in lines[0]
        pods, _ = nvidia_node()
        with PodResourcesServer(str(running.target), pods):  # the kubelet is back
            assert len(client.list()) == len(pods)
            idle(running)
    finally:
        assert running.stop() == 0


@needs_root
def test_more_than_the_limit_are_refused_until_one_ends(sock_dir: Path) -> None:
    pods, _ = nvidia_node()
    running = Running(sock_dir, max_connections=2)
    with PodResourcesServer(str(running.target), pods):
        held = [raw_connect(running.path) for _ in range(2)]  # two connections that say nothing
        try:
            wait_for(lambda: running.forwarder.open_connections() == 2, what="two forwarded connections")
            client = PodResourcesClient(str(running.path), timeout_s=WAIT)
            assert failure(client) is Failure.UNAVAILABLE
            assert running.stats.busy >= 1 and running.stats.accepted == 2
            held.pop().close()
            wait_for(lambda: running.forwarder.open_connections() == 1, what="the closed one to end")
            assert len(client.list()) == len(pods)
        finally:
            for conn in held:
                conn.close()
        idle(running)
        assert running.stop() == 0


@needs_root
def test_a_client_hanging_up_mid_call_ends_its_connection(forwarding: Running) -> None:
    with PodResourcesServer(str(forwarding.target), mode="hang") as server:
        assert failure(PodResourcesClient(str(forwarding.path), timeout_s=0.5)) is Failure.DEADLINE
        assert server.calls == ["ListPodResourcesRequest"]  # the call reached the kubelet and hung there
        idle(forwarding)  # the client closed its channel: the forwarder let go of both sides
        accepted = forwarding.stats.accepted
        with raw_connect(forwarding.path) as conn:  # a client gone halfway through the HTTP/2 preface
            conn.sendall(b"PRI * HTTP/2.0\r\n")
        wait_for(lambda: forwarding.stats.accepted == accepted + 1, what="the connection to be forwarded")
        idle(forwarding)
    assert forward_threads() == []


class Target:
    """A plain UNIX socket server: ``echo_count`` reads until the client half-closes, then answers with the
    byte count and closes; ``silent`` accepts and says nothing."""

    def __init__(self, path: Path, behaviour: str) -> None:
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(os.fspath(path))
        self._server.listen(4)
        self._server.settimeout(0.02)
        self._closing = threading.Event()
        self._behaviour = behaviour
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, name="test-target", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self._conns.append(conn)
            if self._behaviour == "echo_count":
                total = 0
                while chunk := conn.recv(65536):
                    total += len(chunk)
                conn.sendall(b"got %d" % total)
                conn.close()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=WAIT)
        self._server.close()
        for conn in self._conns:
            conn.close()


def read_all(conn: socket.socket) -> bytes:
    conn.settimeout(WAIT)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


@needs_root
def test_a_half_close_passes_through_and_more_than_a_buffer_goes_across(forwarding: Running) -> None:
    target = Target(forwarding.target, "echo_count")
    try:
        with raw_connect(forwarding.path) as conn:
            conn.sendall(b"x" * 1_000_000)  # many times what the forwarder holds per direction
            conn.shutdown(socket.SHUT_WR)  # "no more from me": the target sees the end and answers
            assert read_all(conn) == b"got 1000000"
        idle(forwarding)
    finally:
        target.close()


@needs_root
def test_an_idle_connection_is_closed_after_the_idle_timeout(sock_dir: Path) -> None:
    clock = FakeClock()
    running = Running(sock_dir, clock=clock, idle_timeout=30.0)
    target = Target(running.target, "silent")
    try:
        with raw_connect(running.path) as conn:
            wait_for(lambda: running.forwarder.open_connections() == 1, what="the connection to be forwarded")
            clock.advance(29.0)
            assert running.forwarder.open_connections() == 1
            wait_for(lambda: clock.advance(0.5) or running.forwarder.open_connections() == 0, what="the idle close")
            assert read_all(conn) == b""  # closed by the forwarder
    finally:
        target.close()
        assert running.stop() == 0


@needs_root
def test_stop_closes_every_connection_and_leaves_no_thread(sock_dir: Path) -> None:
    running = Running(sock_dir)
    target = Target(running.target, "silent")
    conns = [raw_connect(running.path) for _ in range(2)]
    try:
        wait_for(lambda: running.forwarder.open_connections() == 2, what="both connections to be forwarded")
        assert sorted(forward_threads()) == ["pod-resources-forward-1", "pod-resources-forward-2"]
        assert running.stop() == 0
        assert forward_threads() == [] and not running.path.exists()
        assert [read_all(c) for c in conns] == [b"", b""]  # both closed by the forwarder
    finally:
        for conn in conns:
            conn.close()
        target.close()


def test_the_socket_cannot_be_made(sock_dir: Path, caplog) -> None:
    (sock_dir / "pr.sock").write_text("not a socket")
    forwarder = SocketForwarder(
        Forward(socket_path=sock_dir / "pr.sock", target=sock_dir / "t", policy=AccessPolicy(uid=os.geteuid()))
    )
    assert forwarder.run(threading.Event()) == 2
    assert any("is not a socket" in r.getMessage() for r in caplog.records)
    assert (sock_dir / "pr.sock").read_text() == "not a socket"


@pytest.mark.parametrize(
    "bad",
    [{"max_connections": 0}, {"idle_timeout": 0.0}, {"poll_interval": -1.0}],
    ids=["no-connections", "no-idle-timeout", "negative-poll"],
)
def test_bad_bounds_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="need max_connections"):
        Forward(socket_path=Path("s"), target=Path("t"), policy=AccessPolicy(uid=0), **bad)


# ---- the relay command ----------------------------------------------------------------------------------


def test_the_relay_command_line_forwards_only_when_asked() -> None:
    args = build_parser().parse_args(["kmsg-relay", "--socket", "/run/s"])
    assert (args.forward_pod_resources, args.pod_resources_socket) == (None, DEFAULT_SOCKET)
    target = "/var/lib/kubelet/pod-resources/kubelet.sock"
    args = build_parser().parse_args(
        ["kmsg-relay", "--socket", "/run/s", "--forward-pod-resources", target, "--pod-resources-socket", "/run/p"]
    )
    assert (args.forward_pod_resources, args.pod_resources_socket) == (target, "/run/p")


def relay_process(sock_dir: Path, forward_socket: Path) -> subprocess.Popen[str]:
    write_records(sock_dir / "kmsg", [record(1, "hello from the kernel")])
    args = [
        *("kmsg-relay", "--socket", os.fspath(sock_dir / "kmsg.sock"), "--kmsg-path", os.fspath(sock_dir / "kmsg")),
        *("--client-uid", str(AGENT_UID), "--forward-pod-resources", os.fspath(sock_dir / "kubelet.sock")),
        *("--pod-resources-socket", os.fspath(forward_socket)),
    ]
    return subprocess.Popen([sys.executable, "-m", "agent", *args], cwd=REPO, stderr=subprocess.PIPE, text=True)


def terminated(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


@needs_root
def test_the_relay_command_serves_kmsg_and_forwards_pod_resources(sock_dir: Path) -> None:
    pods, _ = nvidia_node()
    with PodResourcesServer(str(sock_dir / "kubelet.sock"), pods):
        proc = relay_process(sock_dir, sock_dir / "pr.sock")
        try:
            wait_for(lambda: (sock_dir / "pr.sock").exists() and (sock_dir / "kmsg.sock").exists(), timeout=30)
            assert len(PodResourcesClient(str(sock_dir / "pr.sock"), timeout_s=WAIT).list()) == len(pods)
            with raw_connect(sock_dir / "kmsg.sock") as conn:
                assert read_frame(conn) is not None  # the hello: the kmsg relay serves beside it
        finally:
            rc, err = terminated(proc)
    assert rc == 0, err
    assert not (sock_dir / "pr.sock").exists() and not (sock_dir / "kmsg.sock").exists()
    assert "pod-resources forwarder: stopped (1 connections forwarded" in err


@needs_root
def test_a_forwarder_that_cannot_start_leaves_the_kmsg_relay_running(sock_dir: Path) -> None:
    (sock_dir / "taken").write_text("a file where the socket would go")
    proc = relay_process(sock_dir, sock_dir / "taken")
    try:
        wait_for(lambda: (sock_dir / "kmsg.sock").exists(), timeout=30)
        with raw_connect(sock_dir / "kmsg.sock") as conn:
            assert read_frame(conn) is not None
    finally:
        rc, err = terminated(proc)
    assert rc == 0, err
    assert "pod-resources forwarder: " in err and "is not a socket" in err
