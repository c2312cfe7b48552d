"""The kmsg relay: a minimal privileged process that copies raw ``/dev/kmsg`` records to the agent.

Why: on standard container runtimes an unprivileged container cannot open a host-mounted
``/dev/kmsg`` (the device cgroup denies it). In the DaemonSet a small privileged relay container
(same image, no API token, no ports, read-only root fs) opens ``/dev/kmsg`` read-only and serves
the records over a UNIX socket in a shared emptyDir; the unprivileged agent reads them with
:class:`agent.sources.relay_client.RelayClient` (``--kmsg-relay SOCKET``).

The wire protocol (hello, record and heartbeat frames) is in :mod:`agent.sources.relay_protocol`.
The same container can also forward the kubelet's pod-resources socket to the agent
(``--forward-pod-resources``): :mod:`agent.sources.socketforward`, with the same access rules
(:mod:`agent.sources.unixsocket`).

Access: the ring buffer may hold what ``dmesg_restrict`` hides from unprivileged users, so only
the agent may read it. The socket file is mode 0600 owned by ``client_uid`` (0660 with group
``client_gid`` when one is given), and every connection's ``SO_PEERCRED`` is checked against the
same: a peer that is not root, not ``client_uid`` and not ``client_gid`` is closed at once,
counted and logged (rate-limited); it never displaces the current session.

Every connection gets the whole ring buffer, oldest record first: each client gets its own fresh
:class:`~agent.sources.kmsg.reader.KmsgReader` (which also survives EPIPE overruns and reopens), so an
agent that reconnects can replay since boot and skip what it has already seen by sequence number.
One client at a time, and the first keeps it: while a session is live (its client connected), a new
connection, even an allowed one, is closed at once before the hello, counted (``busy``) and logged
(rate-limited). Any process of the agent's uid (an exec plugin) passes the peer check; it must not take the
agent's session away (the agent would reconnect, take it back, and lose seconds each time). When the
session's client hangs up, the next allowed connection gets it: an agent that restarts, or that
reconnects after a stall, is back within a poll interval or two (its client retries with backoff). A
process that holds the session instead of the agent starves the agent: no records and no heartbeats
reach it, so its ``/healthz`` turns red after the stall timeout and its reconnects are counted. A slow client
causes back-pressure (a small queue, then the reader waits); the kernel ring buffer overwrites
meanwhile and the client counts the gap from the sequence numbers. Records queued together go
out in one ``send()``.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import select
import socket
import threading
import time
from pathlib import Path

from agent.sources.kmsg.reader import KmsgReader
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.relay_protocol import HEADER, MAX_FRAME, current_hello, encode_frame
from agent.sources.unixsocket import (
    REFUSAL_LOG_INTERVAL,
    AccessPolicy,
    PeerCredentials,
    RefusalLog,
    SetupError,
    listen_unix,
    peer_of,
    remove_if_ours,
)

log = logging.getLogger(__name__)

HEARTBEAT_POLLS = 2  # default heartbeat interval, in poll intervals
_QUEUE_SIZE = 256  # records between a session's reader thread and its sender
_SEND_BYTES = 64 * 1024  # one send() carries queued records up to about this many bytes


# --------------------------------------------------------------------------------------------------
# Access control: agent.sources.unixsocket (shared with the pod-resources forwarder)


class RelayStats:
    """Connection counters of one :func:`run_relay` (its accept loop is the only writer)."""

    __slots__ = ("accepted", "busy", "refused")

    def __init__(self) -> None:
        self.accepted = 0  # allowed connections, each served by a session
        self.refused = 0  # connections closed at once: peer not allowed, or its credentials unreadable
        self.busy = 0  # allowed connections closed at once: another session is live


# --------------------------------------------------------------------------------------------------
# Relay


class _ClientGone(Exception):
    pass


def _check_source(kmsg_path: Path) -> str | None:
    try:
        os.close(os.open(kmsg_path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        denied = exc.errno in (errno.EPERM, errno.EACCES)
        hint = " (the relay container must be privileged to open the host's /dev/kmsg)" if denied else ""
        return f"cannot open {kmsg_path} for reading: {exc.strerror or exc}{hint}"
    return None


class _Session:
    """One client connection: a reader thread (fresh KmsgReader) feeding a sender thread."""

    def __init__(
        self,
        *,
        conn: socket.socket,
        number: int,
        kmsg_path: Path,
        poll_interval: float,
        heartbeat_interval: float,
    ) -> None:
        self._conn = conn
        self._name = f"client #{number}"
        self._kmsg_path = kmsg_path
        self._poll = poll_interval
        self._heartbeat_interval = heartbeat_interval
        self._stop = threading.Event()
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=_QUEUE_SIZE)
        self._reader_stats = KmsgStats()
        self._sent = 0
        self._sender = threading.Thread(target=self._send_loop, name=f"kmsg-relay-send-{number}", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name=f"kmsg-relay-read-{number}", daemon=True)

    def start(self) -> None:
        self._conn.setblocking(False)
        self._reader.start()
        self._sender.start()

    def live(self) -> bool:
        """The client is still connected: the sender ends as soon as it hangs up (or the relay stops)."""
        return self._sender.is_alive()

    def close(self) -> None:
        """Stop both threads and close the connection; returns within a few poll intervals."""
        self._stop.set()
        for thread in (self._sender, self._reader):
            thread.join(timeout=4 * self._poll + 1)
            if thread.is_alive():
                log.warning("kmsg relay: %s did not stop in time", thread.name)

    # -- reader thread -----------------------------------------------------------------------------

    def _read_loop(self) -> None:
        reader = KmsgReader(path=self._kmsg_path, stats=self._reader_stats, poll_interval=self._poll, logger=log)
        try:
            for raw in reader.raw_records(stop=self._stop):
                while not self._stop.is_set():
                    try:
                        self._queue.put(raw, timeout=self._poll)
                        break
                    except queue.Full:  # back-pressure from a slow client
                        continue
        except Exception:  # never expected; end the session so the client reconnects
            log.exception("kmsg relay: reading %s failed for %s", self._kmsg_path, self._name)
        finally:
            self._stop.set()

    # -- sender thread -----------------------------------------------------------------------------

    def _send_loop(self) -> None:
        reason = "relay stopping"
        try:
            self._send(encode_frame(current_hello().encode()))
            last_send = time.monotonic()
            while not self._stop.is_set():
                try:
                    raw = self._queue.get(timeout=self._poll)
                except queue.Empty:
                    self._check_client()
                    if time.monotonic() - last_send >= self._heartbeat_interval and self._reader_live():
                        self._send(encode_frame(b""))
                        last_send = time.monotonic()
                    continue
                data, count = self._frames(raw)
                if count:
                    self._send(data)
                    self._sent += count
                    last_send = time.monotonic()
        except _ClientGone as exc:
            reason = str(exc)
        except OSError as exc:
            reason = f"connection error: {exc}"
        finally:
            self._stop.set()
            self._conn.close()
            s = self._reader_stats
            log.info(
                "kmsg relay: %s done (%s): %d records sent, %d lost to overruns, %d read errors",
                self._name,
                reason,
                self._sent,
                s.records_lost,
                s.read_errors,
            )

    def _frames(self, first: bytes) -> tuple[bytes, int]:
        """``first`` and the records queued behind it (about ``_SEND_BYTES`` at most), framed; and their number."""
        parts: list[bytes] = []
        size = 0
        raw: bytes | None = first
        while raw is not None:
            if raw and len(raw) <= MAX_FRAME:
                parts += (HEADER.pack(len(raw)), raw)
                size += HEADER.size + len(raw)
            else:
                log.warning("kmsg relay: dropping a record of %d bytes that cannot be framed", len(raw))
            if size >= _SEND_BYTES:
                break
            try:
                raw = self._queue.get_nowait()
            except queue.Empty:
                raw = None
        return b"".join(parts), len(parts) // 2

    def _reader_live(self) -> bool:
        """The reader has its source open and polled it recently: only then is a heartbeat honest."""
        s = self._reader_stats
        return s.connected and s.last_activity is not None and time.monotonic() - s.last_activity < 3 * self._poll

    def _send(self, data: bytes) -> None:
        """Send all of ``data`` on the non-blocking socket, waiting for room in poll_interval slices."""
        view = memoryview(data)
        poller = select.poll()
        poller.register(self._conn, select.POLLOUT)
        while view:
            if self._stop.is_set():
                raise _ClientGone("relay stopping in the middle of a frame")
            try:
                sent = self._conn.send(view)
            except BlockingIOError:
                poller.poll(self._poll * 1000)
                continue
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _ClientGone("client disconnected") from exc
            view = view[sent:]

    def _check_client(self) -> None:
        """Notice a client that hung up while nothing is being sent; anything it sends is discarded."""
        try:
            data = self._conn.recv(4096)
        except BlockingIOError:
            return
        except ConnectionResetError as exc:
            raise _ClientGone("client disconnected") from exc
        if not data:
            raise _ClientGone("client disconnected")


def run_relay(
    *,
    socket_path: Path,
    kmsg_path: Path,
    stop: threading.Event,
    poll_interval: float = 1.0,
    heartbeat_interval: float | None = None,
    client_uid: int | None = None,
    client_gid: int | None = None,
    ready: threading.Event | None = None,
    stats: RelayStats | None = None,
) -> int:
    """Serve raw kmsg records from ``kmsg_path`` on the UNIX socket ``socket_path`` until ``stop`` is set.

    Only root, ``client_uid`` (default: this process's effective uid) and, when given, group
    ``client_gid`` may connect (socket mode 0600, or 0660 with ``client_gid``; peers checked with
    ``SO_PEERCRED``). ``ready`` is set once the socket accepts connections; ``stats`` receives the
    connection counters. ``heartbeat_interval`` defaults to ``HEARTBEAT_POLLS * poll_interval``.

    Returns 0 after ``stop``; 2 (after logging why) when ``kmsg_path`` cannot be opened or the
    socket cannot be created. The socket file is removed on exit if it is still ours.
    """
    if poll_interval <= 0 or (heartbeat_interval is not None and heartbeat_interval <= 0):
        raise ValueError("need poll_interval > 0 and heartbeat_interval > 0")
    policy = AccessPolicy(uid=os.geteuid() if client_uid is None else client_uid, gid=client_gid)
    heartbeat = heartbeat_interval if heartbeat_interval is not None else HEARTBEAT_POLLS * poll_interval
    stats = stats if stats is not None else RelayStats()
    socket_path = Path(socket_path)
    opened = _open(Path(kmsg_path), socket_path, policy)
    if opened is None:
        return 2
    server, inode = opened
    server.settimeout(poll_interval)
    log.info("kmsg relay: serving %s on %s to %s", kmsg_path, socket_path, policy.describe())
    if ready is not None:
        ready.set()
    try:
        _serve(
            server,
            stop=stop,
            gate=_Gate(policy=policy, stats=stats),
            stats=stats,
            kmsg_path=Path(kmsg_path),
            poll_interval=poll_interval,
            heartbeat_interval=heartbeat,
        )
    finally:
        server.close()
        remove_if_ours(socket_path, inode)
    log.info(
        "kmsg relay: stopped (%d connections served, %d refused, %d refused while a session was live)",
        stats.accepted,
        stats.refused,
        stats.busy,
    )
    return 0


def _open(kmsg_path: Path, socket_path: Path, policy: AccessPolicy) -> tuple[socket.socket, int] | None:
    """Check that ``kmsg_path`` opens, then listen on ``socket_path``; None (after logging why) if either fails."""
    problem = _check_source(kmsg_path)
    if problem is not None:
        log.error("kmsg relay: %s", problem)
        return None
    try:
        return listen_unix(socket_path, policy)
    except SetupError as exc:
        log.error("kmsg relay: %s", exc)
        return None


def _serve(
    server: socket.socket,
    *,
    stop: threading.Event,
    gate: _Gate,
    stats: RelayStats,
    kmsg_path: Path,
    poll_interval: float,
    heartbeat_interval: float,
) -> None:
    """The accept loop: each admitted connection gets a new session; the last one is closed on the way out."""
    session: _Session | None = None
    try:
        while not stop.is_set():
            conn = _accept(server, stop, poll_interval)
            if conn is None:
                continue
            peer = gate.admit(conn, session)
            if peer is None:
                continue
            stats.accepted += 1
            if session is not None:
                session.close()  # its client hung up: its threads are ending
            log.info("kmsg relay: client #%d connected (pid %d, uid %d)", stats.accepted, peer.pid, peer.uid)
            session = _Session(
                conn=conn,
                number=stats.accepted,
                kmsg_path=kmsg_path,
                poll_interval=poll_interval,
                heartbeat_interval=heartbeat_interval,
            )
            session.start()
    finally:
        if session is not None:
            session.close()


def _accept(server: socket.socket, stop: threading.Event, poll_interval: float) -> socket.socket | None:
    """The next connection; None when none came within a poll interval, or (after a wait) when accept failed."""
    try:
        conn, _ = server.accept()
    except TimeoutError:
        return None
    except OSError as exc:  # e.g. EMFILE: wait and retry rather than spin
        log.warning("kmsg relay: accept failed: %s", exc)
        stop.wait(poll_interval)
        return None
    return conn


class _Gate:
    """Who gets past the accept loop: an allowed peer, and only while no session is live."""

    def __init__(self, *, policy: AccessPolicy, stats: RelayStats) -> None:
        self._policy = policy
        self._stats = stats
        self._refusals = RefusalLog(policy=policy, interval=REFUSAL_LOG_INTERVAL, clock=time.monotonic, logger=log)
        self._busy = RefusalLog(
            policy=policy,
            interval=REFUSAL_LOG_INTERVAL,
            clock=time.monotonic,
            because="the agent's session is live and is never taken over",
            logger=log,
        )

    def admit(self, conn: socket.socket, session: _Session | None) -> PeerCredentials | None:
        """The peer of ``conn`` when it may have the session; otherwise counts, closes ``conn``, logs, and None."""
        peer, why = peer_of(conn)
        if peer is None or not self._policy.allows(peer):
            self._stats.refused += 1  # counted before the close, so whoever sees it closed sees it counted
            conn.close()  # before anything else: the current session goes on undisturbed
            self._refusals.note(peer, why=why)
            return None
        if session is not None and session.live():
            self._stats.busy += 1  # counted before the close, as a refusal
            conn.close()  # one client at a time: the live session is never taken over
            self._busy.note(peer)
            return None
        return peer
