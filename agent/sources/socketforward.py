"""The pod-resources forwarder: the relay container passes the kubelet's pod-resources socket on to the agent.

Why: the kubelet's socket ``/var/lib/kubelet/pod-resources/kubelet.sock`` is root's (its folder 0750,
the socket 0755 under systemd's umask) and connecting to a UNIX socket needs write permission on it,
so the agent container (uid 65532, no capability) cannot call it. The relay container runs as root
already; with ``kmsg-relay --forward-pod-resources TARGET`` it listens on a second socket in the pod's
emptyDir, made and checked as the kmsg socket is (:mod:`agent.sources.unixsocket`: mode 0600 owned by
``--client-uid``, or 0660 with ``--client-gid``, and each peer's ``SO_PEERCRED``), and copies every
allowed connection's bytes to a new connection to TARGET and back. gRPC over a UNIX socket is an
HTTP/2 byte stream, so a byte copier suffices: the relay never loads grpc and never reads a message.

Bounds: at most ``max_connections`` at once (more are closed at once, counted ``busy`` and logged,
rate-limited); a connection with no byte either way for ``idle_timeout`` is closed; each direction
holds at most one read of ``_CHUNK`` bytes, and reads again only once that is sent (the slow side
holds the other back). A half-close passes through: when one side stops sending, the other side's
write end is shut once what was read is delivered, and the connection ends when both have stopped.
TARGET absent or refusing: the client connection is closed at once (its gRPC call fails
``unavailable``), counted ``unreachable`` and logged, rate-limited.

Threads: the accept loop (one, waiting in accept with the stop event checked every poll interval)
and one per open connection; none is left once :meth:`SocketForwarder.run` returns.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.sources.unixsocket import (
    REFUSAL_LOG_INTERVAL,
    AccessPolicy,
    PeerCredentials,
    RefusalLog,
    SetupError,
    Throttle,
    listen_unix,
    peer_of,
    remove_if_ours,
)

log = logging.getLogger(__name__)

LABEL = "pod-resources forwarder"
DEFAULT_SOCKET = "/run/node-health-agent/pod-resources.sock"
MAX_CONNECTIONS = 4  # the agent makes one call at a time (a channel per call); a few spare for plugins
IDLE_TIMEOUT_S = 60.0  # the agent's calls end within their deadline (5 s by default)
_CHUNK = 64 * 1024  # at most this many bytes held per direction
_HINTS = {
    errno.ENOENT: " (is the kubelet running, and its pod-resources folder mounted into this container?)",
    errno.EACCES: " (connecting needs write permission on the socket: the relay container must run as root)",
    errno.ECONNREFUSED: " (nobody listens there: the kubelet may be restarting)",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Forward:
    """What to forward: connections to ``socket_path`` (only ``policy`` may connect) go to ``target``."""

    socket_path: Path
    target: Path
    policy: AccessPolicy
    max_connections: int = MAX_CONNECTIONS
    idle_timeout: float = IDLE_TIMEOUT_S
    poll_interval: float = 1.0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.idle_timeout <= 0 or self.poll_interval <= 0:
            raise ValueError("need max_connections >= 1, idle_timeout > 0 and poll_interval > 0")


class ForwardStats:
    """Connection counters of one :class:`SocketForwarder` (its accept loop is the only writer)."""

    __slots__ = ("accepted", "busy", "refused", "unreachable")

    def __init__(self) -> None:
        self.accepted = 0  # connections forwarded to the target
        self.refused = 0  # closed at once: peer not allowed, or its credentials unreadable
        self.busy = 0  # allowed, but closed at once: max_connections were open
        self.unreachable = 0  # allowed, but closed at once: the target was absent or refused


class SocketForwarder:
    """Listens on ``forward.socket_path`` and copies each allowed connection to and from ``forward.target``."""

    def __init__(
        self,
        forward: Forward,
        *,
        stats: ForwardStats | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._forward = forward
        self.stats = stats if stats is not None else ForwardStats()
        self._monotonic = monotonic
        self._pipes: list[_Pipe] = []
        policy = forward.policy
        interval = REFUSAL_LOG_INTERVAL
        self._refusals = RefusalLog(policy=policy, interval=interval, clock=monotonic, label=LABEL, logger=log)
        self._busy = RefusalLog(
            policy=policy,
            interval=interval,
            clock=monotonic,
            because=f"{forward.max_connections} connections are open already",
            label=LABEL,
            logger=log,
        )
        self._unreachable = Throttle(interval=interval, clock=monotonic)

    def open_connections(self) -> int:
        """Connections being forwarded now."""
        return sum(pipe.alive() for pipe in self._pipes)

    def run(self, stop: threading.Event, *, ready: threading.Event | None = None) -> int:
        """Forward until ``stop`` is set; 0 then, with every connection closed and its thread ended.

        2 (after logging why) when the socket cannot be created. ``ready`` is set once it accepts.
        """
        f = self._forward
        try:
            server, inode = listen_unix(f.socket_path, f.policy)
        except SetupError as exc:
            log.error("%s: %s", LABEL, exc)
            return 2
        server.settimeout(f.poll_interval)
        log.info("%s: forwarding %s to %s for %s", LABEL, f.socket_path, f.target, f.policy.describe())
        if ready is not None:
            ready.set()
        try:
            while not stop.is_set():
                conn = self._accept(server, stop)
                if conn is not None:
                    self._admit(conn, stop)
        finally:
            server.close()
            remove_if_ours(f.socket_path, inode)
            self._join_all()
        s = self.stats
        log.info(
            "%s: stopped (%d connections forwarded, %d refused, %d over the limit, %d with the target unreachable)",
            LABEL,
            s.accepted,
            s.refused,
            s.busy,
            s.unreachable,
        )
        return 0

    def _accept(self, server: socket.socket, stop: threading.Event) -> socket.socket | None:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            return None
        except OSError as exc:  # e.g. EMFILE: wait and retry rather than spin
            log.warning("%s: accept failed: %s", LABEL, exc)
            stop.wait(self._forward.poll_interval)
            return None
        return conn

    def _admit(self, conn: socket.socket, stop: threading.Event) -> None:
        """Forward ``conn``, or count, close and log why not."""
        peer, why = peer_of(conn)
        if peer is None or not self._forward.policy.allows(peer):
            self.stats.refused += 1  # counted before the close: whoever sees it closed sees it counted
            conn.close()
            self._refusals.note(peer, why=why)
            return
        self._pipes = [pipe for pipe in self._pipes if pipe.alive()]
        if len(self._pipes) >= self._forward.max_connections:
            self.stats.busy += 1
            conn.close()
            self._busy.note(peer)
            return
        upstream = self._connect_target(peer)
        if upstream is None:
            self.stats.unreachable += 1
            conn.close()
            return
        self.stats.accepted += 1
        pipe = _Pipe(
            client=conn,
            upstream=upstream,
            name=f"connection #{self.stats.accepted}",
            thread_name=f"pod-resources-forward-{self.stats.accepted}",
            stop=stop,
            forward=self._forward,
            monotonic=self._monotonic,
        )
        self._pipes.append(pipe)
        pipe.start()

    def _connect_target(self, peer: PeerCredentials) -> socket.socket | None:
        target = self._forward.target
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.settimeout(self._forward.poll_interval)  # a full backlog would block connect()
        try:
            upstream.connect(str(target))
        except OSError as exc:
            upstream.close()
            held = self._unreachable.due()
            if held is not None:
                more = f"; {held} more since the last message" if held else ""
                reason = exc.strerror or str(exc)
                hint = _HINTS.get(exc.errno or 0, "")
                log.warning(
                    "%s: closed a connection from pid %d: cannot connect to %s: %s%s%s",
                    LABEL,
                    peer.pid,
                    target,
                    reason,
                    hint,
                    more,
                )
            return None
        return upstream

    def _join_all(self) -> None:
        for pipe in self._pipes:
            pipe.join(timeout=4 * self._forward.poll_interval + 1)
        self._pipes = [pipe for pipe in self._pipes if pipe.alive()]


class _Gone(Exception):
    """One side reset the connection or cannot take more bytes."""


class _Lane:
    """One direction: bytes read from ``src`` wait in ``pending`` (one read at most) until sent to ``dst``."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src = src
        self.dst = dst
        self.pending = memoryview(b"")
        self.eof = False  # src will send no more
        self.done = False  # eof, everything delivered, and dst's write end shut

    def wants_read(self) -> bool:
        return not self.eof and not self.pending

    def read(self) -> None:
        try:
            data = self.src.recv(_CHUNK)
        except BlockingIOError:
            return
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _Gone("reset by a peer") from exc
        if data:
            self.pending = memoryview(data)
            return
        self.eof = True
        self._finish_if_flushed()

    def write(self) -> None:
        try:
            sent = self.dst.send(self.pending)
        except BlockingIOError:
            return
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _Gone("a peer hung up") from exc
        self.pending = self.pending[sent:]
        self._finish_if_flushed()

    def _finish_if_flushed(self) -> None:
        if self.eof and not self.pending:
            with contextlib.suppress(OSError):  # dst is gone already: the other lane will notice
                self.dst.shutdown(socket.SHUT_WR)  # pass the half-close on
            self.done = True


class _Pipe:
    """One forwarded connection: a thread copying both ways until both sides stop, idle, error or stop."""

    def __init__(
        self,
        *,
        client: socket.socket,
        upstream: socket.socket,
        name: str,
        thread_name: str,
        stop: threading.Event,
        forward: Forward,
        monotonic: Callable[[], float],
    ) -> None:
        self._client = client
        self._upstream = upstream
        self._name = name
        self._stop = stop
        self._poll = forward.poll_interval
        self._idle_timeout = forward.idle_timeout
        self._monotonic = monotonic
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            log.warning("%s: %s did not stop in time", LABEL, self._thread.name)

    def _run(self) -> None:
        try:
            reason = self._copy()
        except (_Gone, OSError) as exc:
            reason = str(exc)
        finally:
            self._client.close()
            self._upstream.close()
        log.debug("%s: %s done (%s)", LABEL, self._name, reason)

    def _copy(self) -> str:
        """Copy until done; returns why it ended."""
        for conn in (self._client, self._upstream):
            conn.setblocking(False)
        lanes = (_Lane(self._client, self._upstream), _Lane(self._upstream, self._client))
        last = self._monotonic()
        while not self._stop.is_set():
            live = [lane for lane in lanes if not lane.done]
            if not live:
                return "both sides closed"
            readable, writable, _ = select.select(
                [lane.src for lane in live if lane.wants_read()],
                [lane.dst for lane in live if lane.pending],
                [],
                self._poll,
            )
            if not readable and not writable:
                if self._monotonic() - last >= self._idle_timeout:
                    return f"idle for {self._idle_timeout:g}s"
                continue
            last = self._monotonic()
            for lane in live:
                if lane.src in readable:
                    lane.read()
                if lane.dst in writable and lane.pending:
                    lane.write()
        return "forwarder stopping"


def start_forwarder(forward: Forward, *, stop: threading.Event) -> threading.Thread:
    """Run a :class:`SocketForwarder` in a daemon thread until ``stop``; join the thread to wait for it.

    Whatever goes wrong in it is logged and ends only the forwarder: the kmsg relay beside it goes on.
    """

    def main() -> None:
        try:
            SocketForwarder(forward).run(stop)
        except Exception:
            log.exception("%s: failed; the kmsg relay goes on without it", LABEL)

    thread = threading.Thread(target=main, name="pod-resources-forwarder", daemon=True)
    thread.start()
    return thread
