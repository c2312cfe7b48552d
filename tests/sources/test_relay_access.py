"""Who may read the kmsg relay: the socket's owner and mode, and the SO_PEERCRED check behind them.

The ring buffer can hold what dmesg_restrict hides, and each accepted connection replaces the
current session, so another local user must neither read it nor disturb the agent's stream.
The peers are child processes that drop to another uid/gid before connecting (needs root).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.app.cli import build_parser, main
from agent.sources import relay_server, socketforward
from agent.sources.relay_server import run_relay
from agent.sources.unixsocket import REFUSAL_LOG_INTERVAL, AccessPolicy, PeerCredentials, RefusalLog

from helpers.relay import WAIT, Consumer, Relay, client, raw_connect, record, wait_for, write_records

AGENT_UID = 65532  # the agent container's runAsUser in daemonset/agent/daemonset.yaml
NOBODY = 65534
OTHER_GID = 65533

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run peers as other uids and to chown")

# A peer: drop to uid/gid, then connect `tries` times; for each, report how it ended and the bytes it got.
PEER = r"""
import json, os, socket, sys
path, uid, gid, tries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
results = []
for _ in range(tries):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(float(sys.argv[5]))
    try:
        conn.connect(path)
        received = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                results.append(["closed", len(received)])
                break
            received += chunk
            if len(received) >= 4 and len(received) >= 4 + int.from_bytes(received[:4], "big"):
                results.append(["hello", len(received)])  # at least one complete frame: served
                break
    except OSError as exc:
        results.append(["error", exc.errno])
    finally:
        conn.close()
print(json.dumps({"pid": os.getpid(), "results": results}))
"""


def peer(path: Path, *, uid: int, gid: int | None = None, tries: int = 1) -> subprocess.Popen[str]:
    """Start a peer process as ``uid`` (and ``gid``, default the same number); see :func:`outcome`."""
    gid = uid if gid is None else gid
    args = [sys.executable, "-I", "-c", PEER, os.fspath(path), str(uid), str(gid), str(tries), str(WAIT)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def outcome(process: subprocess.Popen[str]) -> tuple[int, list[list]]:
    """The peer's pid and its per-connection results: ["closed", n] / ["hello", n] / ["error", errno]."""
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0, f"peer failed: {out!r}"
    report = json.loads(out)
    return report["pid"], report["results"]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory that other uids can traverse (like the pod's emptyDir)."""
    path = Path(tempfile.mkdtemp(prefix="nha-access-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]


# --------------------------------------------------------------------------------------------------
# The socket file


@needs_root
def test_the_socket_is_0600_and_owned_by_the_client_uid(sock_dir: Path) -> None:
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "secret")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source, client_uid=AGENT_UID)
    try:
        st = (sock_dir / "s").lstat()
        assert stat.S_ISSOCK(st.st_mode)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, AGENT_UID)
        assert outcome(peer(sock_dir / "s", uid=NOBODY))[1] == [["error", 13]]  # EACCES: the file says no
        assert outcome(peer(sock_dir / "s", uid=AGENT_UID))[1][0][0] == "hello"  # the agent's uid is served
        assert (relay.stats.accepted, relay.stats.refused) == (1, 0)
    finally:
        assert relay.stop() == 0


@needs_root
def test_with_a_client_gid_the_socket_is_0660_and_that_group_may_connect(sock_dir: Path) -> None:
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "x")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source, client_uid=AGENT_UID, client_gid=OTHER_GID)
    try:
        st = (sock_dir / "s").lstat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o660, AGENT_UID, OTHER_GID)
        assert outcome(peer(sock_dir / "s", uid=NOBODY, gid=OTHER_GID))[1][0][0] == "hello"
        assert outcome(peer(sock_dir / "s", uid=NOBODY))[1] == [["error", 13]]
        (sock_dir / "s").chmod(0o666)  # past the file check, the peer check still refuses the other group
        assert outcome(peer(sock_dir / "s", uid=NOBODY))[1] == [["closed", 0]]
        assert (relay.stats.accepted, relay.stats.refused) == (1, 1)
    finally:
        assert relay.stop() == 0


# --------------------------------------------------------------------------------------------------
# SO_PEERCRED: the check that holds even where the file mode does not (here: chmod 0666 by the test)


@needs_root
def test_a_peer_with_another_uid_is_refused_and_the_agent_keeps_streaming(sock_dir: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="agent.sources.relay_server")
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "a"), record(2, "b")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source, client_uid=AGENT_UID)
    c = client(sock_dir / "s")  # this process is root: always allowed
    consumer = Consumer(c)
    try:
        assert [r.seq for r in consumer.take(2)] == [1, 2]
        (sock_dir / "s").chmod(0o666)
        pid, results = outcome(peer(sock_dir / "s", uid=NOBODY))
        assert results == [["closed", 0]]  # not one byte: no hello, no record
        wait_for(lambda: relay.stats.refused == 1, what="the refusal to be counted")
        (line,) = refusal_lines(caplog)
        assert f"pid {pid} (uid {NOBODY}, gid {NOBODY})" in line and f"uid {AGENT_UID}" in line

        write_records(source, [record(3, "c")], append=True)
        assert [r.seq for r in consumer.take(1)] == [3]
        assert (c.stats.reader_restarts, relay.stats.accepted) == (0, 1)  # never displaced
        assert c.stats.connected
    finally:
        consumer.finish()
        assert relay.stop() == 0


@needs_root
def test_a_refused_peer_spamming_reconnects_does_not_disturb_the_agent(sock_dir: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="agent.sources.relay_server")
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "before")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source, client_uid=AGENT_UID)
    c = client(sock_dir / "s")
    consumer = Consumer(c)
    try:
        assert [r.seq for r in consumer.take(1)] == [1]
        (sock_dir / "s").chmod(0o666)
        spammer = peer(sock_dir / "s", uid=NOBODY, tries=50)
        for n in range(2, 12):  # records keep coming while the spammer reconnects
            write_records(source, [record(n, f"during {n}")], append=True)
        _, results = outcome(spammer)
        assert results == [["closed", 0]] * 50
        write_records(source, [record(12, "after")], append=True)

        got = consumer.take(11)
        assert [r.seq for r in got] == list(range(2, 13))  # in order, none lost, none repeated
        assert (c.stats.records_lost, c.stats.reader_restarts, c.stats.read_errors) == (0, 0, 0)
        wait_for(lambda: relay.stats.refused == 50, what="50 refusals")
        assert relay.stats.accepted == 1
        assert len(refusal_lines(caplog)) == 1  # rate-limited: one line for the burst
    finally:
        consumer.finish()
        assert relay.stop() == 0


def test_the_access_policy() -> None:
    policy = AccessPolicy(uid=AGENT_UID)
    creds = lambda uid, gid: PeerCredentials(pid=1, uid=uid, gid=gid)  # noqa: E731
    assert policy.allows(creds(AGENT_UID, AGENT_UID)) and policy.allows(creds(0, 5))
    assert not policy.allows(creds(NOBODY, AGENT_UID))
    assert policy.mode == 0o600
    grouped = AccessPolicy(uid=AGENT_UID, gid=OTHER_GID)
    assert grouped.allows(creds(NOBODY, OTHER_GID)) and not grouped.allows(creds(NOBODY, NOBODY))
    assert grouped.mode == 0o660
    with pytest.raises(ValueError, match="negative"):
        AccessPolicy(uid=-1)
    with pytest.raises(ValueError, match="negative"):
        run_relay(socket_path=Path("s"), kmsg_path=Path("k"), stop=threading.Event(), client_gid=-2)


def test_refusals_are_logged_at_most_once_per_interval_with_a_count(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="agent.sources.relay_server")
    now = [0.0]
    refusals = RefusalLog(policy=AccessPolicy(uid=AGENT_UID), interval=REFUSAL_LOG_INTERVAL, clock=lambda: now[0])
    nobody = PeerCredentials(pid=42, uid=NOBODY, gid=NOBODY)
    for _ in range(50):
        refusals.note(nobody)
        now[0] += 1.0  # 50 s: all within one interval
    now[0] = REFUSAL_LOG_INTERVAL
    refusals.note(None, why="SO_PEERCRED failed")
    lines = refusal_lines(caplog)
    assert len(lines) == 2
    assert "pid 42 (uid 65534, gid 65534)" in lines[0] and "more refused" not in lines[0]
    assert "an unknown peer (SO_PEERCRED failed)" in lines[1] and "49 more refused since the last message" in lines[1]


def test_peer_credentials_of_a_connection(sock_dir: Path) -> None:
    (sock_dir / "kmsg").write_bytes(record(1, "x"))
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=sock_dir / "kmsg")  # client_uid: our own euid
    try:
        with raw_connect(sock_dir / "s") as conn:
            assert PeerCredentials.of(conn) == PeerCredentials(pid=os.getpid(), uid=os.geteuid(), gid=os.getegid())
        assert stat.S_IMODE((sock_dir / "s").lstat().st_mode) == 0o600
    finally:
        assert relay.stop() == 0


# --------------------------------------------------------------------------------------------------
# The command line


@pytest.mark.parametrize(
    ("build", "run"),
    [(build_parser, main), (relay_server.build_parser, relay_server.main)],
    ids=["agent.app.cli", "relay_server (what the executable runs)"],
)
def test_the_relay_command_line(monkeypatch: pytest.MonkeyPatch, build, run) -> None:
    args = build().parse_args(["kmsg-relay", "--socket", "/run/s"])
    assert (args.client_uid, args.client_gid, args.kmsg_path) == (None, None, "/dev/kmsg")
    args = build().parse_args(["kmsg-relay", "--socket", "/run/s", "--client-uid", "65532", "--client-gid", "7"])
    assert (args.client_uid, args.client_gid) == (65532, 7)
    args = build().parse_args(["--log-level", "debug", "kmsg-relay", "--socket", "/run/s", "--log-level", "error"])
    assert args.log_level == "error"  # accepted before and after the command, the later one wins
    for bad in ("-1", "abc"):
        with pytest.raises(SystemExit) as exited:
            build().parse_args(["kmsg-relay", "--socket", "/run/s", "--client-uid", bad])
        assert exited.value.code == 2

    seen: dict = {}
    monkeypatch.setattr("agent.sources.relay_server.run_relay", lambda **kwargs: seen.update(kwargs) or 0)
    monkeypatch.setattr("agent.sources.relay_server._stop_on_signals", threading.Event)
    assert run(["kmsg-relay", "--socket", "/run/s", "--client-uid", "65532"]) == 0
    assert (seen["socket_path"], seen["client_uid"], seen["client_gid"]) == (Path("/run/s"), 65532, None)


@pytest.mark.parametrize(
    ("argv", "relay"),
    [
        (["kmsg-relay", "--socket", "s"], True),
        (["--log-level", "debug", "kmsg-relay"], True),
        (["--log-level=debug", "kmsg-relay", "--help"], True),
        (["run", "--kmsg-relay", "s"], False),
        (["--log-level", "kmsg-relay", "run"], False),  # kmsg-relay is the level's value here (argparse refuses it)
        (["--version"], False),
        ([], False),
    ],
)
def test_the_executable_sends_kmsg_relay_to_the_relay_alone(argv: list[str], relay: bool) -> None:
    assert relay_server.is_relay_command(argv) is relay


def test_the_relay_forwards_to_the_socket_the_forwarder_defaults_to() -> None:
    assert relay_server.DEFAULT_POD_RESOURCES_SOCKET == socketforward.DEFAULT_SOCKET
