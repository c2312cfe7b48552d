"""The kmsg relay: a minimal privileged process that forwards ``/dev/kmsg`` to the agent as the kernel hands it out.

Why: on standard container runtimes an unprivileged container cannot open a host-mounted
``/dev/kmsg`` (the device cgroup denies it). In the DaemonSet a small privileged relay container
(same image, no API token, no ports, read-only root fs) opens ``/dev/kmsg`` read-only and serves
what it reads over a UNIX socket in a shared emptyDir; the unprivileged agent reads it with
:class:`agent.sources.relay_client.RelayClient` (``--kmsg-relay SOCKET``).

Small on purpose: this module, the wire protocol (:mod:`agent.sources.relay_protocol`), the socket
rules (:mod:`agent.sources.unixsocket`) and, with ``--forward-pod-resources``, the forwarder
(:mod:`agent.sources.socketforward`) are the whole relay: standard library only, nothing else of the
agent. ``node-health-agent kmsg-relay`` reaches :func:`main` through :mod:`agent.app.entry` without
importing the agent's command line (tests/sources/test_relay_imports.py checks which modules load).

What it sends: the device's reads as they were, many records a frame (a *chunk*: what one wake-up
found ready, up to ``CHUNK_BYTES``), with the first and last record's sequence numbers. It parses
nothing beyond those two numbers; the agent decodes a chunk as it decodes its own reads of the device
(:class:`agent.sources.kmsg.decoder.Mode` from the hello's ``source``). A catch-up request from the
client (a scrape came in) has the relay read the device at once and answer with a sync frame.

Access: the ring buffer may hold what ``dmesg_restrict`` hides from unprivileged users, so only
the agent may read it. The socket file is mode 0600 owned by ``client_uid`` (0660 with group
``client_gid`` when one is given), and every connection's ``SO_PEERCRED`` is checked against the
same: a peer that is not root, not ``client_uid`` and not ``client_gid`` is closed at once,
counted and logged (rate-limited); it never displaces the current session.

Every connection gets the whole ring buffer, oldest record first: each session opens the device
afresh, so an agent that reconnects can replay since boot and skip what it has already seen by
sequence number. One client at a time, and the first keeps it: while a session is live (its
client connected), a new connection, even an allowed one, is closed at once before the hello,
counted (``busy``) and logged (rate-limited). Any process of the agent's uid (an exec plugin) passes
the peer check; it must not take the agent's session away. When the session's client hangs up, the
next allowed connection gets it. A session whose device cannot be opened or read is closed (logged);
the client reconnects with backoff, and sees no heartbeats meanwhile. A slow client causes
back-pressure (the session waits to send, reading nothing); the kernel ring buffer overwrites
meanwhile and the client counts the gap from the sequence numbers.

One thread per session (polling the device and the client's socket together) and the accept loop:
an idle relay wakes once a poll interval in each.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import itertools
import logging
import os
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.sources.relay_protocol import (
    CATCH_UP,
    CHUNK_BYTES,
    FILE,
    KERNEL_DEVICE,
    OTHER_DEVICE,
    Chunk,
    current_hello,
    encode_frame,
    record_seq,
)
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
DEFAULT_KMSG = "/dev/kmsg"
DEFAULT_POD_RESOURCES_SOCKET = "/run/node-health-agent/pod-resources.sock"  # socketforward.DEFAULT_SOCKET
_DEVICE_READ_SIZE = 16 * 1024  # the kernel refuses (EINVAL) a read() too small for the next record (<= ~8 KiB)
_FILE_READ_SIZE = 64 * 1024
_KMSG_DEVICE = (1, 11)  # (major, minor) of the kernel's own /dev/kmsg
_POLLIN = select.POLLIN | select.POLLERR | select.POLLHUP


class RelayStats:
    """Connection counters of one :func:`run_relay` (its accept loop is the only writer)."""

    __slots__ = ("accepted", "busy", "refused")

    def __init__(self) -> None:
        self.accepted = 0  # allowed connections, each served by a session
        self.refused = 0  # connections closed at once: peer not allowed, or its credentials unreadable
        self.busy = 0  # allowed connections closed at once: another session is live


# --------------------------------------------------------------------------------------------------
# The source: the kernel's device, another device, or a file of records


class _ClientGone(Exception):
    pass


def source_kind(st: os.stat_result) -> str:
    """What ``st`` is, as the hello names it: the kernel's /dev/kmsg, another character device, or a file."""
    if stat.S_ISCHR(st.st_mode):
        return KERNEL_DEVICE if (os.major(st.st_rdev), os.minor(st.st_rdev)) == _KMSG_DEVICE else OTHER_DEVICE
    return FILE


def _check_source(kmsg_path: Path) -> str | None:
    try:
        os.close(os.open(kmsg_path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        denied = exc.errno in (errno.EPERM, errno.EACCES)
        hint = " (the relay container must be privileged to open the host's /dev/kmsg)" if denied else ""
        return f"cannot open {kmsg_path} for reading: {exc.strerror or exc}{hint}"
    return None


def complete_end(buf: bytes) -> int:
    """How much of ``buf`` (records concatenated in a file) is complete records: where the last record that may
    still grow (by dictionary lines) starts, or the end of its last line when a record has begun after it."""
    end = buf.rfind(b"\n") + 1
    if end == 0 or (end < len(buf) and buf[end] != 0x20):
        return end
    return last_record_start(buf, end)


def last_record_start(buf: bytes, end: int | None = None) -> int:
    """Where the last record of ``buf[:end]`` (complete lines) starts: its last line not begun by a space."""
    line_end = (len(buf) if end is None else end) - 1
    while line_end > 0:
        start = buf.rfind(b"\n", 0, line_end) + 1
        if buf[start] != 0x20:
            return start
        line_end = start - 1
    return 0


def read_device(
    fd: int, *, limit: int = CHUNK_BYTES, read: Callable[[int, int], bytes] = os.read
) -> tuple[list[bytes], int, bool]:
    """The records ready on a device (one a ``read()``) up to about ``limit`` bytes: (reads, overruns, more).

    ``more``: it stopped at ``limit`` with records left. EPIPE (records overwritten before they were read)
    counts an overrun and reads on; other errors are raised.
    """
    reads: list[bytes] = []
    append, size, overruns = reads.append, 0, 0
    while size < limit:
        try:
            data = read(fd, _DEVICE_READ_SIZE)
        except BlockingIOError:
            return reads, overruns, False
        except BrokenPipeError:
            overruns += 1
            continue
        if not data:
            return reads, overruns, False
        append(data)
        size += len(data)
    return reads, overruns, True


def device_chunk(reads: Sequence[bytes]) -> Chunk | None:
    """A chunk of a device's reads (a newline added to one that lacks it, so records stay apart)."""
    if not reads:
        return None
    if not all(map(bytes.endswith, reads, itertools.repeat(b"\n"))):  # the kernel's always do
        reads = [data if data.endswith(b"\n") else data + b"\n" for data in reads]
    return Chunk(data=b"".join(reads), first_seq=record_seq(reads[0]), last_seq=record_seq(reads[-1]))


def file_chunk(data: bytes) -> Chunk | None:
    """A chunk of complete records from a file."""
    if not data:
        return None
    return Chunk(data=data, first_seq=record_seq(data), last_seq=record_seq(data[last_record_start(data) :]))


class _Session:
    """One client connection, served by one thread: the source read as it becomes ready, catch-up answered."""

    def __init__(
        self,
        *,
        conn: socket.socket,
        number: int,
        kmsg_path: Path,
        poll_interval: float,
        heartbeat_interval: float,
        stopping: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``stopping``: a descriptor that turns readable once the relay stops (:class:`_StopPipe`)."""
        self._conn = conn
        self._stopping = stopping
        self._name = f"client #{number}"
        self._kmsg_path = kmsg_path
        self._poll = poll_interval
        self._heartbeat_interval = heartbeat_interval
        self._clock = clock
        self._stop = threading.Event()
        self._sent = 0  # chunks
        self._overruns = 0
        self._pending = b""  # a file's incomplete last record
        self._asked = 0  # catch-up requests read from the client
        self._thread = threading.Thread(target=self._run, name=f"kmsg-relay-{number}", daemon=True)

    def start(self) -> None:
        self._conn.setblocking(False)
        self._thread.start()

    def live(self) -> bool:
        """The client is still connected: the session ends as soon as it hangs up (or the relay stops)."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the session and close the connection; returns within a few poll intervals."""
        self._stop.set()
        self._thread.join(timeout=4 * self._poll + 1)
        if self._thread.is_alive():
            log.warning("kmsg relay: %s did not stop in time", self._thread.name)

    def _run(self) -> None:
        reason = "relay stopping"
        fd: int | None = None
        try:
            fd = os.open(self._kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
            kind = source_kind(os.fstat(fd))
            self._send(encode_frame(current_hello(kind).encode()))
            self._serve(fd, device=kind != FILE)
        except _ClientGone as exc:
            reason = str(exc)
        except OSError as exc:
            reason = f"error: {exc}"
        except Exception:  # never expected; end the session so the client reconnects
            log.exception("kmsg relay: %s failed", self._name)
            reason = "unexpected error"
        finally:
            self._stop.set()
            self._conn.close()
            if fd is not None:
                os.close(fd)
            log.info(
                "kmsg relay: %s done (%s): %d chunks sent, %d overruns",
                self._name,
                reason,
                self._sent,
                self._overruns,
            )

    def _serve(self, fd: int, *, device: bool) -> None:
        """Until stop: wait for the source (a device) or the client, read what is ready, send it."""
        poller = select.poll()
        poller.register(self._conn, _POLLIN)
        poller.register(self._stopping, select.POLLIN)
        if device:
            poller.register(fd, select.POLLIN)
        conn_fd = self._conn.fileno()
        last_send = self._clock()
        more = True  # read at once on start: the ring buffer is waiting
        while not self._stop.is_set():
            # Idle, a device's session sleeps until a record, the client or stop, or its next heartbeat; a file
            # (always readable) is looked at again every poll interval.
            beat = max(0.0, self._heartbeat_interval - (self._clock() - last_send))
            ready = poller.poll(0 if more else 1000 * (beat if device else min(beat, self._poll)))
            if any(ready_fd == self._stopping for ready_fd, _ in ready):
                return
            asked = any(ready_fd == conn_fd for ready_fd, _ in ready) and self._requests()
            chunk, more = self._read(fd, device=device)
            if chunk is not None or asked:
                chunk = chunk if chunk is not None else Chunk(data=b"")
                self._send(*(chunk.answering(self._asked) if asked else chunk).encode_parts())
                self._sent += 1
                last_send = self._clock()
            elif self._clock() - last_send >= self._heartbeat_interval:
                self._send(encode_frame(b""))
                last_send = self._clock()

    def _read(self, fd: int, *, device: bool) -> tuple[Chunk | None, bool]:
        if device:
            reads, overruns, more = read_device(fd)
            if overruns:
                self._overruns += overruns
                log.warning("kmsg relay: ring buffer overrun: records were overwritten before they were read")
            return device_chunk(reads), more
        data = b""
        while len(data) < CHUNK_BYTES and (part := os.read(fd, _FILE_READ_SIZE)):
            data += part
        more = len(data) >= CHUNK_BYTES
        buf = self._pending + data
        # At the end of what is there, the last record is complete once its last line is.
        end = complete_end(buf) if more or not buf.endswith(b"\n") else len(buf)
        self._pending = buf[end:]
        return file_chunk(buf[:end]), more

    def _requests(self) -> bool:
        """Whether the client asked to catch up (anything else it sends is ignored); raises when it hung up."""
        try:
            data = self._conn.recv(4096)
        except BlockingIOError:
            return False
        except ConnectionResetError as exc:
            raise _ClientGone("client disconnected") from exc
        if not data:
            raise _ClientGone("client disconnected")
        asked = data.count(CATCH_UP)
        self._asked += asked
        return asked > 0

    def _send(self, *parts: bytes) -> None:
        """Send all of ``parts`` (one frame: its headers and its records) on the non-blocking socket, waiting for
        room in poll_interval slices. One ``sendmsg`` takes them together where the socket has room: the client
        wakes once for a frame, not for its headers and again for its records."""
        views = [memoryview(part) for part in parts if part]
        poller: select.poll | None = None
        while views:
            if self._stop.is_set():
                raise _ClientGone("relay stopping in the middle of a frame")
            try:
                sent = self._conn.sendmsg(views)
            except BlockingIOError:
                if poller is None:
                    poller = select.poll()
                    poller.register(self._conn, select.POLLOUT)
                poller.poll(self._poll * 1000)
                continue
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _ClientGone("client disconnected") from exc
            while views and sent >= len(views[0]):
                sent -= len(views.pop(0))
            if sent:
                views[0] = views[0][sent:]


# --------------------------------------------------------------------------------------------------
# Serving


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
    stopping = _StopPipe(stop)
    log.info("kmsg relay: serving %s on %s to %s", kmsg_path, socket_path, policy.describe())
    if ready is not None:
        ready.set()
    try:
        _serve(
            server,
            stop=stop,
            stopping=stopping.fileno(),
            gate=_Gate(policy=policy, stats=stats),
            stats=stats,
            kmsg_path=Path(kmsg_path),
            poll_interval=poll_interval,
            heartbeat_interval=heartbeat,
        )
    finally:
        server.close()
        stopping.close()
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
    stopping: int,
    gate: _Gate,
    stats: RelayStats,
    kmsg_path: Path,
    poll_interval: float,
    heartbeat_interval: float,
) -> None:
    """The accept loop: each admitted connection gets a new session; the last one is closed on the way out."""
    session: _Session | None = None
    waiting = select.poll()  # for a connection or stop, however long: no wakeup in between
    waiting.register(server, select.POLLIN)
    waiting.register(stopping, select.POLLIN)
    try:
        while not stop.is_set():
            if any(fd == stopping for fd, _ in waiting.poll()):
                break
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
                stopping=stopping,
            )
            session.start()
    finally:
        if session is not None:
            session.close()


class _StopPipe:
    """A descriptor that turns readable once ``stop`` is set, for the relay's waits to sleep on: a thread blocked
    in ``stop.wait()`` (no wakeup meanwhile) writes it a byte. The relay then wakes only for a connection, a
    record, a client's request or a heartbeat, never to look at ``stop``."""

    def __init__(self, stop: threading.Event) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()  # never a write to a descriptor closed (and reused) meanwhile
        self._closed = False
        threading.Thread(target=self._watch, args=(stop,), name="kmsg-relay-stop", daemon=True).start()

    def fileno(self) -> int:
        return self._read

    def _watch(self, stop: threading.Event) -> None:
        stop.wait()
        with self._lock:
            if not self._closed:
                os.write(self._write, b"\0")

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)


def _accept(server: socket.socket, stop: threading.Event, poll_interval: float) -> socket.socket | None:
    """The connection the server has ready; None when it is gone by now, or (after a wait) when accept failed."""
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


# --------------------------------------------------------------------------------------------------
# The command: ``node-health-agent kmsg-relay`` (reached through agent.app.entry, not agent.app.cli)


def _numeric_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"not a numeric uid/gid: {text!r}")
    return int(text)


LOG_LEVELS = ("debug", "info", "warning", "error")
HELP = "forward /dev/kmsg over a UNIX socket as the kernel hands it out (the DaemonSet's only privileged part)"
DESCRIPTION = "Open the kernel log read-only and stream what it reads to one agent over a UNIX socket."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The relay's flags (also on ``node-health-agent kmsg-relay`` in agent.app.cli's parser, for its help)."""
    parser.add_argument("--socket", required=True, metavar="PATH", help="UNIX socket to create")
    parser.add_argument("--kmsg-path", default=DEFAULT_KMSG, help=f"kernel log device (default {DEFAULT_KMSG})")
    parser.add_argument(
        "--client-uid",
        type=_numeric_id,
        default=None,
        metavar="UID",
        help="the uid that may connect (besides root and --client-gid); the socket is mode 0600 owned by it "
        "(default: the relay's own effective uid)",
    )
    parser.add_argument(
        "--client-gid",
        type=_numeric_id,
        default=None,
        metavar="GID",
        help="also let this group connect: the socket becomes mode 0660 with this group (default: none)",
    )
    parser.add_argument(
        "--forward-pod-resources",
        default=None,
        metavar="TARGET",
        help="also forward the kubelet's pod-resources API: connections to --pod-resources-socket are copied "
        "byte for byte to the UNIX socket TARGET (e.g. /var/lib/kubelet/pod-resources/kubelet.sock), for the same "
        "peers as the kmsg socket (default: off)",
    )
    parser.add_argument(
        "--pod-resources-socket",
        default=DEFAULT_POD_RESOURCES_SOCKET,
        metavar="PATH",
        help=f"where --forward-pod-resources listens (default {DEFAULT_POD_RESOURCES_SOCKET})",
    )


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, told its width: its default asks ``shutil``, whose import brings zlib, bz2
    and lzma (about 0.6 MiB of the relay's resident memory, for a width the relay rarely prints)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, width or _terminal_columns() - 2)


def _terminal_columns() -> int:
    """The width ``shutil.get_terminal_size`` would give: $COLUMNS, else the terminal's, else 80."""
    with contextlib.suppress(ValueError):
        columns = int(os.environ.get("COLUMNS", ""))
        if columns > 0:
            return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 80
    except (OSError, ValueError, AttributeError):
        return 80


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """``node-health-agent [--log-level L] kmsg-relay [--log-level L] FLAGS``: the relay's own parser."""
    env = os.environ if environ is None else environ
    level = env.get("NHA_LOG_LEVEL", "info")
    parser = argparse.ArgumentParser(prog="node-health-agent", description=DESCRIPTION, formatter_class=_Formatter)
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=level if level in LOG_LEVELS else "info")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    relay = sub.add_parser("kmsg-relay", help=HELP, description=DESCRIPTION, formatter_class=_Formatter)
    relay.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        help="diagnostic log level on stderr (env NHA_LOG_LEVEL; default info)",
    )
    add_arguments(relay)
    return parser


def is_relay_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (without the program name) runs ``kmsg-relay``: its first word past ``--log-level``."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--log-level":
            i += 2
        elif word.startswith("--log-level="):
            i += 1
        else:
            return word == "kmsg-relay"
    return False


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def main(argv: Sequence[str] | None = None) -> int:
    """The relay, and beside it (when asked) the pod-resources forwarder, which stops with it and never stops it."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return run(args)


def run(args: argparse.Namespace) -> int:
    """``kmsg-relay`` with parsed flags (from :func:`build_parser` or agent.app.cli's parser)."""
    stop = _stop_on_signals()
    forwarder = None
    if args.forward_pod_resources:
        from agent.sources import socketforward

        policy = AccessPolicy(uid=os.geteuid() if args.client_uid is None else args.client_uid, gid=args.client_gid)
        forward = socketforward.Forward(
            socket_path=Path(args.pod_resources_socket), target=Path(args.forward_pod_resources), policy=policy
        )
        forwarder = socketforward.start_forwarder(forward, stop=stop)
    try:
        return run_relay(
            socket_path=Path(args.socket),
            kmsg_path=Path(args.kmsg_path),
            stop=stop,
            client_uid=args.client_uid,
            client_gid=args.client_gid,
        )
    finally:
        if forwarder is not None:
            stop.set()  # the relay ended (stopped, or could not start): the forwarder ends with it
            forwarder.join()
