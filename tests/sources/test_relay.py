"""The kmsg relay and its client, end to end: real UNIX sockets, real threads, real files.

Every wait is bounded and no assertion depends on how fast the machine is: timing-sensitive
behaviour (stalls, /healthz) runs on an injected clock. Access control is in test_relay_access.py,
hello validation in test_relay_protocol.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import agent.sources.relay_client as relay_source
from agent.core.bus import Inbox
from agent.sources.kmsg.boot import boot_time_now, read_boot_id
from agent.sources.producer import SourceProducer
from agent.sources.relay_client import BATCH_MAX
from agent.sources.relay_protocol import HEADER, PROTO, Hello, encode_frame
from agent.sources.relay_server import run_relay

from helpers import kmsg_problem
from helpers.relay import (
    DEVICE,
    POLL,
    WAIT,
    Consumer,
    FakeClock,
    FakeRelay,
    Relay,
    chunk_frame,
    client,
    pending,
    raw_connect,
    read_chunk,
    read_frame,
    read_records,
    record,
    send_hello,
    wait_for,
    write_records,
)
from helpers.threads import wakeups_while_asleep

# --------------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory (AF_UNIX paths are limited to ~107 bytes; pytest's tmp_path can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="nha-relay-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# The wire protocol, seen by a raw socket client


def test_wire_protocol_hello_then_the_exact_kernel_bytes_then_heartbeats(sock_dir: Path) -> None:
    records = [
        record(1, "first"),
        record(2, "NVRM: Xid 79", prio=3, fields=" SUBSYSTEM=pci\n DEVICE=+pci:0000:10:1c.0\n"),
        record(3, "tab\\x09and caf\\xc3\\xa9"),
    ]
    source = sock_dir / "kmsg"
    write_records(source, records)
    relay = Relay(socket_path=sock_dir / "run" / "relay.sock", kmsg_path=source, heartbeat_interval=0.1)
    try:
        sock_path = sock_dir / "run" / "relay.sock"
        st = sock_path.stat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600  # client_uid alone (see test_relay_access.py)
        assert st.st_uid == os.geteuid()  # the default client_uid: the relay's own
        with raw_connect(sock_path) as conn:
            hello = json.loads(read_frame(conn) or b"")
            assert hello["proto"] == 2 and hello["source"] == "file"
            assert abs(hello["boot_time"] - boot_time_now()) < 1.0
            try:
                assert hello["boot_id"] == read_boot_id()
            except OSError:
                assert hello["boot_id"] is None
            chunk = read_chunk(conn)  # the file's records, verbatim, in one chunk with their sequence range
            assert chunk is not None and (chunk.data, chunk.first_seq, chunk.last_seq) == (b"".join(records), 1, 3)
            assert read_frame(conn, timeout=1.0) == b""  # idle: a heartbeat (empty frame)
            assert read_frame(conn, timeout=1.0) == b""
    finally:
        assert relay.stop() == 0
    assert not (sock_dir / "run" / "relay.sock").exists(), "the relay removes its socket on exit"


def test_frames_wider_than_the_socket_buffers_arrive_whole_to_a_client_that_reads_in_small_pieces(
    sock_dir: Path,
) -> None:
    """Each frame is sent as its headers and its records together; a socket with room for part of it takes part,
    and the rest follows: every record arrives once, in order, in frames whose ranges say what they hold."""
    records = [record(seq, f"record {seq} " + "x" * 200) for seq in range(1, 4001)]  # ~0.9 MB, 30 frames or more
    source = sock_dir / "kmsg"
    write_records(source, records)
    relay = Relay(socket_path=sock_dir / "relay.sock", kmsg_path=source)
    try:
        with raw_connect(sock_dir / "relay.sock") as conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel's least: most sends are partial
            assert json.loads(read_frame(conn) or b"")["source"] == "file"
            got: list[bytes] = []
            ranges: list[tuple[int, int]] = []
            while len(got) < len(records):
                chunk = read_chunk(conn)
                assert chunk is not None
                lines = chunk.data.splitlines(keepends=True)
                ranges.append((chunk.first_seq, chunk.last_seq))
                assert (chunk.first_seq, chunk.last_seq) == (len(got) + 1, len(got) + len(lines))
                got += lines
            assert got == records and len(ranges) > 1
    finally:
        assert relay.stop() == 0


def test_a_live_session_is_kept_and_the_next_client_gets_the_whole_buffer_once_it_hangs_up(sock_dir: Path) -> None:
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "a"), record(2, "b")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source)
    stats = relay.stats
    try:
        first = raw_connect(sock_dir / "s")
        assert read_frame(first) is not None  # hello
        assert read_records(first, 2) == [record(1, "a"), record(2, "b")]
        with raw_connect(sock_dir / "s") as second:
            assert read_frame(second) is None  # closed before any hello: the live session is not taken over
        assert stats.busy == 1
        assert read_frame(first) == b""  # the first client goes on undisturbed: a heartbeat
        first.close()

        def third_gets_the_buffer() -> bool:
            with raw_connect(sock_dir / "s") as third:
                if read_frame(third) is None:
                    return False  # the relay has not yet seen the first client hang up
                return read_records(third, 2) == [record(1, "a"), record(2, "b")]  # from the oldest

        wait_for(third_gets_the_buffer, what="a new session once the first client hung up")
    finally:
        assert relay.stop() == 0


TAKER = """
import socket, struct, sys
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.settimeout(float(sys.argv[2]))
conn.connect(sys.argv[1])
try:
    data = conn.recv(4)
except TimeoutError:
    data = b"timeout"
print("closed" if data == b"" else "served")
"""


def test_another_process_of_the_agents_uid_cannot_take_the_session(sock_dir: Path) -> None:
    """An exec plugin runs with the agent's uid and passes the peer check; the agent's session stays its own:
    the plugin's connection is closed unserved, and a new kernel line reaches the agent on the same session."""
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "boot")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source)
    stats = relay.stats
    try:
        reader = client(sock_dir / "s")
        consumer = Consumer(reader)
        try:
            assert [r.message for r in consumer.take(1)] == ["boot"]
            taker = subprocess.run(
                [sys.executable, "-c", TAKER, str(sock_dir / "s"), str(WAIT)],
                capture_output=True,
                text=True,
                timeout=WAIT * 2,
                check=True,
            )
            assert taker.stdout.strip() == "closed"
            assert stats.busy == 1 and stats.accepted == 1
            write_records(source, [record(2, "NVRM: Xid 79")], append=True)
            assert [r.message for r in consumer.take(1)] == ["NVRM: Xid 79"]
            assert reader.stats.reader_restarts == 0, "the agent's session was never interrupted"
        finally:
            consumer.finish()
    finally:
        assert relay.stop() == 0


# --------------------------------------------------------------------------------------------------
# RelayClient against the real relay


def test_client_receives_every_record_in_order_with_host_timestamps(sock_dir: Path) -> None:
    source = sock_dir / "kmsg"
    write_records(
        source,
        [
            record(1, "one", usec=5_000_000),
            record(2, "two", usec=5_000_100, prio=3, fields=" SUBSYSTEM=pci\n"),
            record(3, "caf\\xc3\\xa9", usec=6_250_000, prio=12),
        ],
    )
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source)
    c = client(sock_dir / "s")
    consumer = Consumer(c)
    try:
        got = consumer.take(3)
        assert c.hello is not None and abs(c.hello.boot_time - boot_time_now()) < 1.0
        boot = c.hello.boot_time
        assert [(r.seq, r.message) for r in got] == [(1, "one"), (2, "two"), (3, "café")]
        assert [r.timestamp for r in got] == [boot + 5.0, boot + 5.0001, boot + 6.25]
        assert [r.monotonic_usec for r in got] == [5_000_000, 5_000_100, 6_250_000]
        assert (got[1].priority, got[1].facility, dict(got[1].fields)) == (3, 0, {"SUBSYSTEM": "pci"})
        assert (got[2].priority, got[2].facility) == (4, 1)
        assert all(r.source == "kmsg" for r in got)

        write_records(source, [record(4, "appended later")], append=True)  # the relay follows its source
        assert [r.message for r in consumer.take(1)] == ["appended later"]

        s = c.stats
        assert (s.records_read, s.records_lost, s.parse_errors, s.reader_restarts, s.read_errors) == (4, 0, 0, 0, 0)
        assert s.connected
        assert s.last_record_time == pytest.approx(boot + 4 * 1000 / 1e6)
    finally:
        consumer.finish()
        relay.stop()
    assert not c.stats.connected


def test_relay_restart_replays_the_buffer_and_the_client_skips_what_it_has(sock_dir: Path) -> None:
    first_source, second_source = sock_dir / "kmsg-1", sock_dir / "kmsg-2"
    write_records(first_source, [record(n, f"m{n}") for n in (1, 2, 3)])
    write_records(second_source, [record(n, f"m{n}") for n in (1, 2, 3, 4, 5)])  # same boot, two more records
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=first_source)
    c = client(sock_dir / "s")
    consumer = Consumer(c)
    try:
        assert [r.seq for r in consumer.take(3)] == [1, 2, 3]
        assert relay.stop() == 0
        wait_for(lambda: c.stats.reader_restarts >= 1, what="the client to notice the relay went away")
        relay = Relay(socket_path=sock_dir / "s", kmsg_path=second_source)
        assert [r.seq for r in consumer.take(2)] == [4, 5]  # 1..3 were replayed and skipped
        assert consumer.nothing_more()
        s = c.stats
        assert s.records_read == 5
        assert s.records_lost == 0
        assert s.reader_restarts >= 1
        wait_for(lambda: c.stats.connected, what="reconnected")
    finally:
        consumer.finish()
        relay.stop()


def test_records_overwritten_while_the_relay_was_away_count_as_lost(sock_dir: Path) -> None:
    first_source, second_source = sock_dir / "kmsg-1", sock_dir / "kmsg-2"
    write_records(first_source, [record(n, f"m{n}") for n in (1, 2, 3)])
    write_records(second_source, [record(n, f"m{n}") for n in (10, 11, 12)])  # the ring buffer wrapped: 4..9 gone
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=first_source)
    c = client(sock_dir / "s")
    consumer = Consumer(c)
    try:
        assert [r.seq for r in consumer.take(3)] == [1, 2, 3]
        relay.stop()
        relay = Relay(socket_path=sock_dir / "s", kmsg_path=second_source)
        assert [r.seq for r in consumer.take(3)] == [10, 11, 12]
        assert c.stats.records_lost == 6
        assert c.stats.records_read == 6
    finally:
        consumer.finish()
        relay.stop()


def test_an_idle_live_relay_keeps_last_activity_fresh_through_heartbeats(sock_dir: Path) -> None:
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "only")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source, heartbeat_interval=0.1)
    c = client(sock_dir / "s", stall_after=60.0)
    consumer = Consumer(c)
    try:
        consumer.take(1)
        seen = {c.stats.last_activity}
        assert None not in seen
        # No more records: only heartbeats can move last_activity, and they keep doing so.
        wait_for(lambda: seen.add(c.stats.last_activity) or len(seen) >= 4, what="three heartbeats")
        assert c.stats.reader_restarts == 0
        assert c.stats.records_read == 1
        assert consumer.nothing_more(within=0.05)
    finally:
        consumer.finish()
        relay.stop()


# --------------------------------------------------------------------------------------------------
# Stalls, protocol errors, boot changes (a scripted fake relay)


def test_a_stalled_relay_is_dropped_and_last_activity_stops_advancing(sock_dir: Path) -> None:
    def script(conn: socket.socket, n: int) -> None:
        send_hello(conn)
        if n == 1:
            conn.sendall(chunk_frame(record(1, "then silence")) + encode_frame(b""))
        # ... then silent: no records, no heartbeats, connection left open

    fake = FakeRelay(sock_dir / "s", script)
    clock = FakeClock()
    c = client(sock_dir / "s", stall_after=30.0, clock=clock)
    consumer = Consumer(c)
    try:
        assert [r.message for r in consumer.take(1)] == ["then silence"]
        frozen = c.stats.last_activity
        assert frozen == clock.now

        clock.advance(29.0)  # silent, but not yet for stall_after
        time.sleep(5 * POLL)  # several receive timeouts: none of them may count as a stall
        assert (fake.connections, c.stats.reader_restarts) == (1, 0)

        clock.advance(1.0)
        wait_for(lambda: fake.connections >= 2 and c.stats.reader_restarts >= 1, what="a reconnect after the stall")
        wait_for(lambda: clock.advance(5.0) or fake.connections >= 3, what="another reconnect after a stall")
        assert c.stats.reader_restarts >= 2
        assert c.stats.read_errors >= 2
        # Reconnecting and hello are no proof that kernel records flow: /healthz must go stale.
        assert c.stats.last_activity == frozen
        assert consumer.nothing_more(within=0.05)
    finally:
        consumer.finish()
        fake.close()


def test_healthz_goes_red_while_the_relay_is_silent_and_green_again_when_it_beats(sock_dir: Path) -> None:
    beating = threading.Event()
    beating.set()
    finished: set[int] = set()

    def script(conn: socket.socket, n: int) -> None:
        try:
            send_hello(conn)
            while not fake.closing.is_set():
                if beating.is_set():
                    conn.sendall(encode_frame(b""))
                elif n == 1:
                    return  # the relay goes silent, connection left open
                time.sleep(POLL)
        finally:
            finished.add(n)

    fake = FakeRelay(sock_dir / "s", script)
    clock = FakeClock()  # the client's clock and the "now" given to healthy(): /healthz compares the two
    source = client(sock_dir / "s", stall_after=100.0, clock=clock)
    producer = SourceProducer(source=source, inbox=Inbox(), stall_timeout=10.0)  # the kmsg_reader component

    def healthy() -> bool:
        return producer.healthy(clock.now)

    stop = threading.Event()
    runner = threading.Thread(target=producer.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_for(healthy, what="healthy")
        clock.advance(11.0)  # past stall_timeout: only a heartbeat received from now on keeps it green
        wait_for(lambda: (source.stats.last_activity or 0) >= clock.now, what="a heartbeat")
        assert healthy()
        assert source.stats.reader_restarts == 0

        beating.clear()  # the relay is still there and accepts reconnects, but sends nothing
        wait_for(lambda: 1 in finished, what="the relay to go silent")
        wait_for(lambda: clock.advance(1.0) or not healthy(), what="/healthz to turn red")
        wait_for(lambda: clock.advance(5.0) or fake.connections >= 2, what="a reconnect after the stall")
        assert not healthy()  # a fresh connection and hello are not enough
        assert source.stats.reader_restarts >= 1
        assert "not even a heartbeat" in (producer.detail() or "")

        beating.set()
        wait_for(healthy, what="/healthz to turn green again")
        assert producer.detail() is None
    finally:
        beating.clear()
        stop.set()
        runner.join(timeout=WAIT)
        fake.close()
    assert not runner.is_alive()


def test_garbage_is_counted_and_the_stream_goes_on(sock_dir: Path) -> None:
    def script(conn: socket.socket, n: int) -> None:
        if n == 1:
            conn.sendall(encode_frame(b'{"proto": 99}'))  # a protocol this client does not speak
            conn.close()
            return
        send_hello(conn)
        if n == 2:
            conn.sendall(chunk_frame(b"not a kmsg record\n") + chunk_frame(record(1, "good")))
            conn.sendall(HEADER.pack(2**31))  # an absurd frame length
            return
        conn.sendall(chunk_frame(record(1, "good")) + chunk_frame(record(2, "after")))

    fake = FakeRelay(sock_dir / "s", script)
    c = client(sock_dir / "s")
    consumer = Consumer(c)
    try:
        assert [r.message for r in consumer.take(2)] == ["good", "after"]
        assert fake.connections == 3
        assert c.stats.parse_errors == 1
        assert (c.stats.reader_restarts, c.stats.read_errors) == (2, 2)  # bad hello, bad frame length
        assert consumer.nothing_more(within=0.1)
    finally:
        consumer.finish()
        fake.close()


def test_a_new_boot_id_starts_sequence_accounting_afresh(sock_dir: Path) -> None:
    def script(conn: socket.socket, n: int) -> None:
        if n == 1:
            send_hello(conn, boot_id="boot-a")
            conn.sendall(chunk_frame(record(500, "old boot")))
            conn.close()
        else:
            send_hello(conn, boot_id="boot-b", boot_time=1_800_000_000.0)
            conn.sendall(chunk_frame(record(1, "new boot")))

    fake = FakeRelay(sock_dir / "s", script)
    c = client(sock_dir / "s")
    consumer = Consumer(c)
    try:
        old, new = consumer.take(2)
        assert (old.seq, new.seq) == (500, 1)
        assert new.timestamp == 1_800_000_000.0 + 0.001
        assert c.stats.records_lost == 0
    finally:
        consumer.finish()
        fake.close()


def test_a_hello_with_an_impossible_boot_time_is_a_protocol_error(sock_dir: Path) -> None:
    def script(conn: socket.socket, n: int) -> None:
        if n == 1:  # NaN would make every record's timestamp NaN
            conn.sendall(encode_frame(b'{"proto": 2, "boot_time": NaN, "boot_id": "boot-a"}'))
            conn.sendall(chunk_frame(record(1, "poisoned")))
            return
        send_hello(conn)
        conn.sendall(chunk_frame(record(1, "good")))

    fake = FakeRelay(sock_dir / "s", script)
    c = client(sock_dir / "s")
    consumer = Consumer(c)
    try:
        (got,) = consumer.take(1)
        assert (got.message, got.timestamp) == ("good", 1_700_000_000.0 + 0.001)
        assert (c.stats.reader_restarts, c.stats.read_errors, c.stats.records_read) == (1, 1, 1)
        assert c.hello is not None and c.hello.boot_time == 1_700_000_000.0
    finally:
        consumer.finish()
        fake.close()


# --------------------------------------------------------------------------------------------------
# Batches: many records per yield on the client, many frames per send() on the relay


def frames_of(records: list[bytes]) -> bytes:
    """A chunk frame per record (an empty one: a heartbeat)."""
    return b"".join(chunk_frame(r) if r else encode_frame(b"") for r in records)


def test_batches_hand_out_all_received_records_at_once_in_order(sock_dir: Path) -> None:
    count = 3000
    hello = Hello(proto=PROTO, boot_time=1_700_000_000.0, boot_id="boot-a", source="kernel-device").encode()

    def script(conn: socket.socket, n: int) -> None:
        conn.sendall(encode_frame(hello) + frames_of([record(i, f"m{i}") for i in range(1, count + 1)]))

    fake = FakeRelay(sock_dir / "s", script)
    c = client(sock_dir / "s")
    consumer = Consumer(c, batches=True)
    try:
        got = consumer.take(count)
        assert [r.seq for r in got] == list(range(1, count + 1))
        assert all(0 < len(batch) <= BATCH_MAX for batch in consumer.batches)
        assert len(consumer.batches) <= count // 10  # lists of what each recv() brought, not one per record
        assert c.stats.records_read == count
        assert c.stats.last_record_time == got[-1].timestamp
        assert c.stats.reader_restarts == 0
    finally:
        consumer.finish()
        fake.close()


def test_batches_are_capped_and_never_empty(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_source, "BATCH_MAX", 100)
    noise = [b"", b"not a kmsg record\n", record(1, "m1"), b""]  # heartbeats, garbage, a duplicate of record 1

    def script(conn: socket.socket, n: int) -> None:
        send_hello(conn)
        conn.sendall(frames_of([*noise, *(record(i, f"m{i}") for i in range(1, 1001))]))

    fake = FakeRelay(sock_dir / "s", script)
    c = client(sock_dir / "s")
    consumer = Consumer(c, batches=True)
    try:
        got = consumer.take(1000)
        assert [r.seq for r in got] == list(range(1, 1001))
        sizes = [len(batch) for batch in consumer.batches]
        assert 0 not in sizes
        assert max(sizes) == 100
        assert c.stats.parse_errors == 1
        assert consumer.nothing_more(within=0.05)
    finally:
        consumer.finish()
        fake.close()


# --------------------------------------------------------------------------------------------------
# Stop is honoured everywhere (finish() fails unless records() returns within WAIT)


def test_an_idle_relay_on_a_device_sleeps_between_heartbeats_and_stops_at_once(sock_dir: Path) -> None:
    """Idle CPU is wakeups (issue 37): between heartbeats neither the accept loop nor the session wakes, not
    even once a poll interval to look at stop; stop still ends both at once. The device is a terminal nobody
    writes to (pollable, like /dev/kmsg, and quiet whatever else logs meanwhile)."""
    controller, terminal = os.openpty()
    try:
        relay = Relay(
            socket_path=sock_dir / "s", kmsg_path=os.ttyname(terminal), heartbeat_interval=600.0, poll_interval=0.05
        )
        with raw_connect(sock_dir / "s") as conn:
            assert json.loads(read_frame(conn) or b"")["source"] == "other-device"
            session = next(
                t for t in threading.enumerate() if t.name.startswith("kmsg-relay-") and t.name[-1].isdigit()
            )
            assert relay.thread.native_id is not None and session.native_id is not None
            for tid in (relay.thread.native_id, session.native_id):
                assert wakeups_while_asleep(tid, sleeps_in=["poll"], window=0.5) == 0  # 10 poll intervals
            assert relay.stop() == 0
            assert not session.is_alive()
    finally:
        os.close(controller)
        os.close(terminal)


def test_stop_while_connected_and_idle(sock_dir: Path) -> None:
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "x")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source)
    c = client(sock_dir / "s", poll_interval=0.2, stall_after=600.0)
    consumer = Consumer(c)
    try:
        consumer.take(1)
        consumer.finish()
        assert not c.stats.connected
    finally:
        relay.stop()


@pytest.mark.parametrize("phase", ["streaming", "before the hello"])
def test_wake_ends_a_wait_that_no_frame_and_no_timeout_would_end_soon(sock_dir: Path, phase: str) -> None:
    """The agent's reader waits on the socket for long (IDLE_WAIT; heartbeats come every couple of seconds):
    stop, then wake (what the supervisor does), ends that wait at once: here no heartbeat comes for 10 min."""
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "x")])
    relay = fake = None
    if phase == "streaming":
        relay = Relay(socket_path=sock_dir / "s", kmsg_path=source, heartbeat_interval=600.0)
    else:
        fake = FakeRelay(sock_dir / "s", lambda conn, n: None)  # accepts, says nothing
    c = client(sock_dir / "s", poll_interval=600.0, stall_after=1200.0)
    consumer = Consumer(c)
    try:
        if relay is not None:
            consumer.take(1)
        else:
            wait_for(lambda: c.stats.connected, what="the connection")
        consumer.finish(wake=True)
        assert not c.stats.connected and c.stats.reader_restarts == 0
    finally:
        if relay is not None:
            relay.stop()
        if fake is not None:
            fake.close()


def test_stop_while_the_relay_is_absent_and_the_client_backs_off(sock_dir: Path) -> None:
    c = client(sock_dir / "missing.sock", poll_interval=0.2, backoff_initial=600.0, backoff_max=600.0)
    consumer = Consumer(c)
    wait_for(lambda: c.stats.reader_restarts >= 1, what="a failed connect")
    consumer.finish()  # inside a 600 s backoff: only stop can end it within WAIT
    assert c.stats.read_errors >= 1
    assert not c.stats.connected
    assert c.stats.last_activity is None  # never heard from a relay: /healthz is red from the start
    assert "cannot connect to" in (c.stats.last_error or "") and "missing.sock" in (c.stats.last_error or "")


def test_stop_while_waiting_for_the_hello(sock_dir: Path) -> None:
    fake = FakeRelay(sock_dir / "s", lambda conn, n: None)  # accepts, says nothing
    c = client(sock_dir / "s", poll_interval=0.2, stall_after=600.0)
    consumer = Consumer(c)
    try:
        wait_for(lambda: fake.connections >= 1 and c.stats.connected, what="the connection")
        consumer.finish()
        assert c.stats.reader_restarts == 0
    finally:
        fake.close()


def test_relay_stops_with_a_client_that_does_not_read(sock_dir: Path) -> None:
    source = sock_dir / "kmsg"
    write_records(source, [record(n, "x" * 200) for n in range(1, 20_001)])  # ~4 MB: more than socket buffers
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source)
    with raw_connect(sock_dir / "s") as conn:
        wait_for(lambda: pending(conn) >= 64 * 1024, what="the relay to fill the socket buffer")
        assert relay.stop() == 0  # blocked on back-pressure, and still stops within WAIT
        conn.settimeout(WAIT)
        received = 0
        while chunk := conn.recv(1 << 16):  # the last frame may be cut short: the relay stopped mid-send
            received += len(chunk)
        assert 0 < received < source.stat().st_size  # hello and some records, then the relay closed


# --------------------------------------------------------------------------------------------------
# Setup errors: exit code 2 with a message that says what is wrong


def test_exit_2_when_the_socket_directory_cannot_be_created(sock_dir: Path, caplog) -> None:
    (sock_dir / "file").write_text("")
    (sock_dir / "kmsg").write_bytes(record(1, "x"))
    with caplog.at_level(logging.ERROR):
        rc = run_relay(socket_path=sock_dir / "file" / "sub" / "s", kmsg_path=sock_dir / "kmsg", stop=threading.Event())
    assert rc == 2
    assert "cannot create the socket directory" in caplog.text


def test_exit_2_instead_of_replacing_something_that_is_not_a_socket(sock_dir: Path, caplog) -> None:
    (sock_dir / "s").write_text("precious")
    (sock_dir / "kmsg").write_bytes(record(1, "x"))
    with caplog.at_level(logging.ERROR):
        rc = run_relay(socket_path=sock_dir / "s", kmsg_path=sock_dir / "kmsg", stop=threading.Event())
    assert rc == 2
    assert "is not a socket" in caplog.text
    assert (sock_dir / "s").read_text() == "precious"


def test_exit_2_when_the_socket_path_is_too_long(sock_dir: Path, caplog) -> None:
    (sock_dir / "kmsg").write_bytes(record(1, "x"))
    with caplog.at_level(logging.ERROR):
        rc = run_relay(socket_path=sock_dir / ("x" * 200), kmsg_path=sock_dir / "kmsg", stop=threading.Event())
    assert rc == 2
    assert "cannot listen on the UNIX socket" in caplog.text


def test_exit_2_when_the_kernel_log_cannot_be_opened(sock_dir: Path, caplog) -> None:
    with caplog.at_level(logging.ERROR):
        rc = run_relay(socket_path=sock_dir / "s", kmsg_path=sock_dir / "no-kmsg", stop=threading.Event())
    assert rc == 2
    assert "cannot open" in caplog.text and "no-kmsg" in caplog.text
    assert not (sock_dir / "s").exists()


def test_a_stale_socket_is_replaced(sock_dir: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.fspath(sock_dir / "s"))
    stale.close()  # the file stays behind, like after a crash
    source = sock_dir / "kmsg"
    write_records(source, [record(1, "fresh")])
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=source)
    consumer = Consumer(client(sock_dir / "s"))
    try:
        assert [r.message for r in consumer.take(1)] == ["fresh"]
    finally:
        consumer.finish()
        assert relay.stop() == 0


# --------------------------------------------------------------------------------------------------
# The real /dev/kmsg


@pytest.mark.kmsg
@pytest.mark.skipif(kmsg_problem() is not None, reason=kmsg_problem() or "")
def test_relay_on_the_real_dev_kmsg(sock_dir: Path) -> None:
    relay = Relay(socket_path=sock_dir / "s", kmsg_path=DEVICE)
    c = client(sock_dir / "s")
    stop = threading.Event()
    timer = threading.Timer(5.0, stop.set)  # never hang, whatever the kernel does
    timer.start()
    marker = f"node-health-agent-relay-test-{uuid.uuid4()}"
    try:
        fd = os.open(DEVICE, os.O_WRONLY)
        try:
            os.write(fd, f"<4>{marker}\n".encode())
        finally:
            os.close(fd)
        seen = []
        for rec in c.records(stop=stop):
            seen.append(rec)
            if marker in rec.message:
                break
    finally:
        stop.set()
        timer.cancel()
        relay.stop()
    assert seen and marker in seen[-1].message, "marker not relayed within 5 s"
    mine = seen[-1]
    assert (mine.priority, mine.facility) == (4, 1)
    assert abs(mine.timestamp - time.time()) < 60
    numbers = [r.seq for r in seen]
    assert numbers == sorted(set(numbers))
    assert c.hello is not None and c.hello.boot_id == read_boot_id()
    assert c.stats.parse_errors == 0
