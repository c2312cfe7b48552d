"""What the relay tests share: records in the kernel's format, a relay and a consumer in threads, raw
socket tools and a scripted fake relay.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.core.types import LogRecord
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.relay_client import RelayClient
from agent.sources.relay_protocol import HEADER, KERNEL_DEVICE, MAX_FRAME, PROTO, Chunk, Hello, encode_frame, record_seq
from agent.sources.relay_server import RelayStats, run_relay

POLL = 0.05  # relay and client poll interval in these tests


WAIT = 3.0  # upper bound for anything that should happen "soon"


DEVICE = "/dev/kmsg"


def record(seq: int, message: str, *, usec: int | None = None, prio: int = 6, fields: str = "") -> bytes:
    """One record in the kernel's /dev/kmsg format (what the relay sends verbatim)."""
    return f"{prio},{seq},{usec if usec is not None else seq * 1000},-;{message}\n{fields}".encode()


def write_records(path: Path, records: list[bytes], *, append: bool = False) -> None:
    with path.open("ab" if append else "wb") as f:
        f.write(b"".join(records))


def wait_for(predicate: Callable[[], object], *, timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class FakeClock:
    """A monotonic clock that only the test moves (read from other threads; a float store is atomic)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> bool:
        self.now += seconds
        return False  # so that ``clock.advance(x) or condition`` reads as a wait_for predicate


class Relay:
    """run_relay() in a thread, as the relay container runs it; construction waits until it listens."""

    def __init__(self, *, socket_path: Path, kmsg_path: Path | str, **kwargs) -> None:
        self.socket_path = socket_path
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.stats = RelayStats()
        self.rc: int | None = None
        kwargs.setdefault("poll_interval", POLL)

        def main() -> None:
            self.rc = run_relay(
                socket_path=socket_path,
                kmsg_path=Path(kmsg_path),
                stop=self.stop_event,
                ready=self.ready,
                stats=self.stats,
                **kwargs,
            )

        self.thread = threading.Thread(target=main, name="test-relay", daemon=True)
        self.thread.start()
        wait_for(lambda: self.ready.is_set() or not self.thread.is_alive(), what="the relay to listen")
        assert self.ready.is_set(), f"the relay exited with {self.rc} instead of listening"

    def stop(self, *, within: float = WAIT) -> int | None:
        self.stop_event.set()
        self.thread.join(timeout=within)
        assert not self.thread.is_alive(), f"relay did not stop within {within}s"
        return self.rc


class Consumer:
    """Drives RelayClient.records() in a thread, as the agent's reader thread does.

    With ``batches=True`` it drives ``batches()`` instead, keeping the lists in ``self.batches``.
    """

    def __init__(self, client: RelayClient, *, batches: bool = False) -> None:
        self.client = client
        self.stop_event = threading.Event()
        self.queue: queue.Queue[LogRecord] = queue.Queue()
        self.batches: list[list[LogRecord]] = []
        self.error: BaseException | None = None
        target = self._run_batches if batches else self._run
        self.thread = threading.Thread(target=target, name="test-consumer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for rec in self.client.records(stop=self.stop_event):
                self.queue.put(rec)
        except BaseException as exc:  # records() must never raise; the test checks this
            self.error = exc

    def _run_batches(self) -> None:
        try:
            for batch in self.client.batches(stop=self.stop_event):
                self.batches.append(batch)
                for rec in batch:
                    self.queue.put(rec)
        except BaseException as exc:  # batches() must never raise either
            self.error = exc

    def take(self, n: int, *, timeout: float = WAIT) -> list[LogRecord]:
        deadline = time.monotonic() + timeout
        got = []
        while len(got) < n:
            remaining = deadline - time.monotonic()
            try:
                got.append(self.queue.get(timeout=max(remaining, 0.001)))
            except queue.Empty:
                raise AssertionError(f"got {len(got)} of {n} records within {timeout}s: {got}") from None
        return got

    def nothing_more(self, *, within: float = 0.3) -> bool:
        try:
            extra = self.queue.get(timeout=within)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected extra record {extra}")

    def finish(self, *, wake: bool = False) -> None:
        """Set stop (then, with ``wake``, call the client's wake as the supervisor does); fail unless records()
        returns (without raising) within WAIT."""
        self.stop_event.set()
        if wake:
            self.client.wake()
        self.thread.join(timeout=WAIT)
        assert not self.thread.is_alive(), "records() did not return after stop"
        assert self.error is None, f"records() raised {self.error!r}"


def client(path: Path, **kwargs) -> RelayClient:
    """A client that trusts a relay of this process's uid (the tests' relays), as the agent trusts root's."""
    kwargs.setdefault("poll_interval", POLL)
    kwargs.setdefault("trusted_uid", os.geteuid())
    kwargs.setdefault("backoff_initial", POLL)
    kwargs.setdefault("backoff_max", 4 * POLL)
    return RelayClient(path=path, stats=KmsgStats(), **kwargs)


def read_frame(conn: socket.socket, *, timeout: float = WAIT) -> bytes | None:
    """Read one frame from a raw connection; None at end of stream."""
    conn.settimeout(timeout)

    def exactly(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    header = exactly(HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    assert length <= MAX_FRAME, f"frame length {length} exceeds MAX_FRAME: the stream lost its framing"
    payload = exactly(length) if length else b""
    assert payload is not None, "connection closed in the middle of a frame"
    return payload


def chunk_frame(*records: bytes, answered: int | None = None) -> bytes:
    """One chunk frame of these records, as the relay sends what it read at one wake-up (with ``answered``: a
    sync frame, the answer to that many catch-up requests)."""
    data = b"".join(records)
    first, last = (record_seq(records[0]), record_seq(records[-1])) if records else (0, 0)
    return Chunk(data=data, first_seq=first, last_seq=last, answered=answered).encode()


def read_chunk(conn: socket.socket, *, timeout: float = WAIT) -> Chunk | None:
    """The next chunk or sync frame from a raw connection (heartbeats passed over); None at end of stream."""
    while (payload := read_frame(conn, timeout=timeout)) is not None:
        if payload:
            return Chunk.decode(payload)
    return None


def read_records(conn: socket.socket, count: int, *, timeout: float = WAIT) -> list[bytes]:
    """The next ``count`` records from a raw connection, however the relay cut them into chunks."""
    found: list[bytes] = []
    while len(found) < count:
        chunk = read_chunk(conn, timeout=timeout)
        assert chunk is not None, f"the relay closed the connection after {len(found)} of {count} records"
        found += split_records(chunk.data)
    return found


def split_records(data: bytes) -> list[bytes]:
    """A chunk's records (each its first line and dictionary lines)."""
    records: list[bytes] = []
    for line in data.splitlines(keepends=True):
        if line.startswith(b" ") and records:
            records[-1] += line
        else:
            records.append(line)
    return records


def raw_connect(path: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(os.fspath(path))
    return conn


def pending(conn: socket.socket) -> int:
    """Bytes waiting in a socket's receive queue (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


class FakeRelay:
    """A scripted relay: ``script(conn, n)`` runs for the n-th connection (1-based) in the accept thread.

    A script that returns without closing leaves the connection open and silent (parked).
    """

    def __init__(self, path: Path, script: Callable[[socket.socket, int], None]) -> None:
        self.connections = 0
        self.closing = threading.Event()
        self._parked: list[socket.socket] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(os.fspath(path))
        self._server.listen(4)
        self._server.settimeout(0.02)
        self._script = script
        self._thread = threading.Thread(target=self._serve, name="fake-relay", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            self._parked.append(conn)
            with contextlib.suppress(OSError):  # the client went away
                self._script(conn, self.connections)

    def close(self) -> None:
        self.closing.set()
        self._thread.join(timeout=WAIT)
        self._server.close()
        for conn in self._parked:
            conn.close()


def send_hello(
    conn: socket.socket,
    *,
    boot_time: float = 1_700_000_000.0,
    boot_id: str | None = "boot-a",
    source: str = KERNEL_DEVICE,
) -> None:
    conn.sendall(encode_frame(Hello(proto=PROTO, boot_time=boot_time, boot_id=boot_id, source=source).encode()))
