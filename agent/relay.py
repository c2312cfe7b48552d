"""The kmsg relay: a minimal privileged process that copies raw ``/dev/kmsg`` records to the agent.

Why: on standard container runtimes an unprivileged container cannot open a host-mounted
``/dev/kmsg`` (the device cgroup denies it). In the DaemonSet a small privileged relay container
(same image, no API token, no ports, read-only root fs) opens ``/dev/kmsg`` read-only and serves
the records over a UNIX socket in a shared emptyDir; the unprivileged agent reads them with
:class:`agent.sources.relay.RelayClient` (``--kmsg-relay SOCKET``).

The wire protocol (hello, record and heartbeat frames) is in :mod:`agent.relay_protocol`.

Every connection gets the whole ring buffer, oldest record first: each client gets its own fresh
:class:`~agent.sources.kmsg.KmsgReader` (which also survives EPIPE overruns and reopens), so an
agent that reconnects can replay since boot and skip what it has already seen by sequence number.
One client at a time: a new connection replaces (closes) the previous one. A slow client causes
back-pressure (a small queue, then the reader waits); the kernel ring buffer overwrites meanwhile
and the client counts the gap from the sequence numbers.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import select
import socket
import stat
import threading
import time
from pathlib import Path

from agent.relay_protocol import MAX_FRAME, current_hello, encode_frame
from agent.sources.kmsg import KmsgReader, KmsgStats

log = logging.getLogger(__name__)

HEARTBEAT_POLLS = 2  # default heartbeat interval, in poll intervals
SOCKET_MODE = 0o666  # the agent runs as another uid
_QUEUE_SIZE = 256  # records between a session's reader thread and its sender


# --------------------------------------------------------------------------------------------------
# Relay


class _SetupError(Exception):
    pass


class _ClientGone(Exception):
    pass


def _listen(socket_path: Path) -> tuple[socket.socket, int]:
    """Create the directory, remove a stale socket, bind, chmod 0666, listen; raises _SetupError.

    Returns the listening socket and the inode of its file (to remove only our own file on exit).
    """
    try:
        socket_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _SetupError(f"cannot create the socket directory {socket_path.parent}: {exc}") from exc
    try:
        mode = socket_path.lstat().st_mode
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _SetupError(f"cannot inspect {socket_path}: {exc}") from exc
    else:
        if not stat.S_ISSOCK(mode):
            raise _SetupError(f"{socket_path} exists and is not a socket; refusing to replace it")
        try:
            socket_path.unlink()
        except OSError as exc:
            raise _SetupError(f"cannot remove the stale socket {socket_path}: {exc}") from exc
        log.info("kmsg relay: removed a stale socket %s", socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(os.fspath(socket_path))
        os.chmod(socket_path, SOCKET_MODE)
        server.listen(4)
        inode = os.stat(socket_path).st_ino
    except OSError as exc:
        server.close()
        raise _SetupError(f"cannot listen on the UNIX socket {socket_path}: {exc}") from exc
    return server, inode


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
                if not raw or len(raw) > MAX_FRAME:
                    log.warning("kmsg relay: dropping a record of %d bytes that cannot be framed", len(raw))
                    continue
                self._send(encode_frame(raw))
                self._sent += 1
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
) -> int:
    """Serve raw kmsg records from ``kmsg_path`` on the UNIX socket ``socket_path`` until ``stop`` is set.

    Returns 0 after ``stop``; 2 (after logging why) when ``kmsg_path`` cannot be opened or the
    socket cannot be created. ``heartbeat_interval`` defaults to ``HEARTBEAT_POLLS * poll_interval``.
    The socket file is removed on exit if it is still ours.
    """
    if poll_interval <= 0 or (heartbeat_interval is not None and heartbeat_interval <= 0):
        raise ValueError("need poll_interval > 0 and heartbeat_interval > 0")
    heartbeat = heartbeat_interval if heartbeat_interval is not None else HEARTBEAT_POLLS * poll_interval
    socket_path = Path(socket_path)
    problem = _check_source(Path(kmsg_path))
    if problem is not None:
        log.error("kmsg relay: %s", problem)
        return 2
    try:
        server, inode = _listen(socket_path)
    except _SetupError as exc:
        log.error("kmsg relay: %s", exc)
        return 2
    server.settimeout(poll_interval)
    log.info("kmsg relay: serving %s on %s", kmsg_path, socket_path)
    session: _Session | None = None
    connections = 0
    try:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # e.g. EMFILE: wait and retry rather than spin
                log.warning("kmsg relay: accept failed: %s", exc)
                stop.wait(poll_interval)
                continue
            connections += 1
            if session is not None:
                session.close()  # one client at a time: the new connection replaces the old
            log.info("kmsg relay: client #%d connected", connections)
            session = _Session(
                conn=conn,
                number=connections,
                kmsg_path=Path(kmsg_path),
                poll_interval=poll_interval,
                heartbeat_interval=heartbeat,
            )
            session.start()
    finally:
        if session is not None:
            session.close()
        server.close()
        try:
            if os.stat(socket_path).st_ino == inode:
                socket_path.unlink()
        except OSError:
            pass
    log.info("kmsg relay: stopped")
    return 0
