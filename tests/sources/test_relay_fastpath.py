"""The relay at the direct path's cost: a small process (which modules the relay loads), the client's chunks on
the device reader's path (and only for the trusted relay), whole replayed chunks dropped, catch-up through the
relay. Fast: fake relays on real sockets, one real relay on a file; no timing assertions."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sources.kmsg.decoder import Mode
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.relay_client import RelayClient
from agent.sources.relay_protocol import CATCH_UP, FILE, KERNEL_DEVICE, OTHER_DEVICE

from helpers.relay import (
    POLL,
    WAIT,
    Consumer,
    FakeRelay,
    Relay,
    chunk_frame,
    client,
    raw_connect,
    read_chunk,
    read_frame,
    read_records,
    record,
    send_hello,
    wait_for,
    write_records,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="nha-fast-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# What the relay process may load of the agent: the relay, its protocol, its socket rules, the forwarder.
RELAY_MODULES = {
    "agent",
    "agent.app",
    "agent.app.entry",
    "agent.sources",
    "agent.sources.relay_server",
    "agent.sources.relay_protocol",
    "agent.sources.unixsocket",
    "agent.sources.socketforward",
}

# Runs without site (-S), so only what the relay itself imports is loaded: `node-health-agent kmsg-relay --help`
# through the executable's entry, then a relay serving one connection from a file, with the forwarder.
_RELAY_RUN = r"""
import contextlib, io, os, socket, sys, threading
from pathlib import Path
repo, tmp = sys.argv[1], Path(sys.argv[2])
sys.path.insert(0, repo)
sys.argv = ["node-health-agent", "kmsg-relay", "--help"]
from agent.app import entry
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    entry.entry()
from agent.sources import relay_server, socketforward
(tmp / "kmsg").write_bytes(b"6,1,1,-;hello\n")
stop, ready = threading.Event(), threading.Event()
t = threading.Thread(target=relay_server.run_relay, kwargs=dict(socket_path=tmp / "s", kmsg_path=tmp / "kmsg",
    stop=stop, ready=ready, poll_interval=0.05))
t.start()
ready.wait(10)
conn = socket.socket(socket.AF_UNIX)
conn.connect(str(tmp / "s"))
got = b""
while got.count(b"hello") < 1:
    got += conn.recv(65536)
stop.set()
t.join(10)
print("\n".join(sorted(sys.modules)))
"""


def test_the_relay_loads_the_standard_library_and_its_own_modules_only(sock_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-S", "-c", _RELAY_RUN, str(REPO), str(sock_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    loaded = set(out.split())
    ours = {name for name in loaded if name == "agent" or name.startswith("agent.")}
    assert ours <= RELAY_MODULES, f"the relay loaded more of the agent: {sorted(ours - RELAY_MODULES)}"
    assert "agent.sources.relay_server" in ours
    others = {name.split(".")[0] for name in loaded - ours}
    third_party = sorted(name for name in others if name not in sys.stdlib_module_names and name != "__main__")
    assert not third_party, f"the relay loaded modules beyond the standard library: {third_party}"
    never = ("agent.app.cli", "agent.core", "agent.sources.kmsg", "json", "prometheus_client", "yaml", "shutil", "lzma")
    for absent in never:
        assert absent not in loaded


@pytest.mark.parametrize(
    ("source", "trusted", "mode"),
    [
        (KERNEL_DEVICE, True, Mode.KERNEL_DEVICE),  # the relay (root in the DaemonSet) reading /dev/kmsg
        (KERNEL_DEVICE, False, Mode.OTHER_DEVICE),  # a socket served by another uid: every line checked
        (OTHER_DEVICE, True, Mode.OTHER_DEVICE),
        (FILE, True, Mode.FILE),
    ],
)
def test_the_kernel_device_fast_path_is_for_the_trusted_relay_only(
    sock_dir: Path, source: str, trusted: bool, mode: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    def script(conn: socket.socket, n: int) -> None:
        send_hello(conn, source=source)
        conn.sendall(chunk_frame(record(1, "a"), record(2, "b")))

    fake = FakeRelay(sock_dir / "s", script)
    uid = os.geteuid() if trusted else os.geteuid() + 1
    c = client(sock_dir / "s", trusted_uid=uid)
    consumer = Consumer(c)
    try:
        with caplog.at_level(logging.WARNING, logger="agent.sources.relay_client"):
            assert [r.message for r in consumer.take(2)] == ["a", "b"]
        assert c.mode is mode
        assert ("checked line by line" in caplog.text) is (source == KERNEL_DEVICE and not trusted)
    finally:
        consumer.finish()
        fake.close()


def test_a_chunk_the_client_has_seen_whole_is_dropped_by_its_range(sock_dir: Path) -> None:
    def script(conn: socket.socket, n: int) -> None:
        send_hello(conn)
        records = [record(i, f"m{i}") for i in range(1, 4)]
        conn.sendall(chunk_frame(*records))  # each connection replays the ring buffer
        if n == 1:
            conn.close()
        else:
            conn.sendall(chunk_frame(record(4, "new")))

    fake = FakeRelay(sock_dir / "s", script)
    c = client(sock_dir / "s")
    chunks: list[bytes] = []
    stop = threading.Event()

    def run() -> None:
        for chunk in c.chunks(stop=stop):
            chunks.append(chunk.data)
            c.decode(chunk)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: c.stats.records_read == 4, what="the records of both connections")
        assert chunks[0].count(b"\n") == 3 and chunks[-1] == record(4, "new")
        assert all(b"m1" not in data for data in chunks[1:])  # the replay never reached the decoder
        assert (c.stats.records_lost, c.stats.reader_restarts) == (0, 1)
    finally:
        stop.set()
        thread.join(timeout=5)
        fake.close()


def test_catch_up_asks_the_relay_and_says_whether_its_answer_brought_records(sock_dir: Path) -> None:
    """The fake relay sends nothing after the hello until asked; then a chunk it had (sent before the answer)
    and the answer: the client hands both on together, so the scrape waiting for one input sees both. Asked
    again, it answers with nothing: the scrape need not wait."""

    def script(conn: socket.socket, n: int) -> None:
        send_hello(conn)
        conn.settimeout(5)
        assert conn.recv(1) == CATCH_UP
        conn.sendall(chunk_frame(record(1, "in flight")))
        conn.sendall(chunk_frame(record(2, "logged before the scrape"), answered=1))
        assert conn.recv(1) == CATCH_UP
        conn.sendall(chunk_frame(answered=2))

    fake = FakeRelay(sock_dir / "s", script)
    c = client(sock_dir / "s", stall_after=600.0, answer_wait=WAIT)  # no answer is late: what it says counts
    assert not c.catch_up()  # not connected: nothing asked
    consumer = Consumer(c, batches=True)
    try:
        wait_for(lambda: c.stats.connected and c.mode is not None, what="a connected client")
        wait_for(c.catch_up, what="an answer with records")
        assert [r.message for r in consumer.take(2)] == ["in flight", "logged before the scrape"]
        assert [len(batch) for batch in consumer.batches] == [2]
        assert c.catch_up() is False  # answered with nothing: no chunk either
        assert consumer.nothing_more(within=0.05)
    finally:
        consumer.finish()
        fake.close()


def test_the_relay_answers_a_catch_up_request_with_a_sync_chunk(sock_dir: Path) -> None:
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "a")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source, heartbeat_interval=60.0)
    try:
        with raw_connect(sock_dir / "s") as conn:
            assert json.loads(read_frame(conn) or b"")["source"] == FILE
            assert read_records(conn, 1) == [record(1, "a")]
            conn.sendall(CATCH_UP)
            answer = read_chunk(conn)
            assert answer is not None and (answer.answered, answer.data) == (1, b"")  # nothing new: an empty answer
            write_records(source, [record(2, "b")], append=True)
            conn.sendall(CATCH_UP * 3)  # requests found together: one answer, counting all
            while (answer := read_chunk(conn)) is not None and answer.answered != 4:
                assert answer.answered in (None, 2, 3)  # the relay's own read of the file, or fewer at once
            assert answer is not None
    finally:
        assert relay.stop() == 0


def test_a_client_without_a_relay_has_nothing_to_catch_up(sock_dir: Path) -> None:
    assert RelayClient(path=sock_dir / "absent", stats=KmsgStats(), poll_interval=POLL).catch_up() is False
