"""What the relay's UNIX sockets share: who may connect, how the socket file is made, and rate-limited refusals.

A socket is created by :func:`listen_unix`: its directory made, a stale socket (and only a socket)
removed, the file bound, handed to the client (owner ``policy.uid``, group ``policy.gid``) with mode
0600, or 0660 with a group, and only then listened on, so nobody can connect before the file says who
may. Every accepted connection's ``SO_PEERCRED`` is then checked against the same
:class:`AccessPolicy`: the file check and the peer check agree, and the peer check still holds where
the file's mode was widened. Used by the kmsg relay (:mod:`agent.sources.relay_server`) and the
pod-resources forwarder (:mod:`agent.sources.socketforward`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600  # client_uid (the owner) only
GROUP_SOCKET_MODE = 0o660  # client_uid and client_gid
REFUSAL_LOG_INTERVAL = 60.0  # at most one "refused a connection" warning per this many seconds
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Frozen:
    """A frozen value of typed slots, compared and shown by them: what ``@dataclass(frozen=True, slots=True)``
    gives, for the relay's modules, which do not import :mod:`dataclasses` (it imports :mod:`inspect`: about a
    megabyte of the relay's 15 MiB, tests/sources/test_relay_fastpath.py). A subclass names its
    ``__slots__`` and sets them in ``__init__`` with :meth:`_set`."""

    __slots__: tuple[str, ...] = ()

    def _set(self, **fields: object) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({shown})"


class PeerCredentials(Frozen):
    """Who is at the other end of a UNIX socket connection, as the kernel recorded it at connect()."""

    __slots__ = ("pid", "uid", "gid")
    pid: int
    uid: int
    gid: int

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self._set(pid=pid, uid=uid, gid=gid)

    @classmethod
    def of(cls, conn: socket.socket) -> PeerCredentials:
        """The peer's ``SO_PEERCRED``; raises ``OSError`` when the kernel does not say."""
        pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        return cls(pid=pid, uid=uid, gid=gid)


class AccessPolicy(Frozen):
    """Who may connect: root, ``uid``, and (when set) processes whose group is ``gid``.

    The socket file's owner, group and mode say the same, so the file permissions and the peer
    check agree (except that the file check also honours supplementary groups; this one does not).
    """

    __slots__ = ("uid", "gid")
    uid: int
    gid: int | None

    def __init__(self, uid: int, gid: int | None = None) -> None:
        if uid < 0 or (gid is not None and gid < 0):
            raise ValueError(f"client uid/gid must not be negative: uid {uid}, gid {gid}")
        self._set(uid=uid, gid=gid)

    @property
    def mode(self) -> int:
        return SOCKET_MODE if self.gid is None else GROUP_SOCKET_MODE

    def allows(self, peer: PeerCredentials) -> bool:
        return peer.uid in (0, self.uid) or (self.gid is not None and peer.gid == self.gid)

    def describe(self) -> str:
        return f"uid {self.uid}" + (f" or gid {self.gid}" if self.gid is not None else "") + " or root"


def peer_of(conn: socket.socket) -> tuple[PeerCredentials | None, str]:
    """The peer's credentials, or None and why they could not be read."""
    try:
        return PeerCredentials.of(conn), ""
    except OSError as exc:
        return None, f"SO_PEERCRED failed: {exc}"


class Throttle:
    """At most one message per ``interval``: :meth:`due` says when the next may go out, and how many were held back."""

    def __init__(self, *, interval: float, clock: Callable[[], float]) -> None:
        self._interval = interval
        self._clock = clock
        self._next = float("-inf")
        self._suppressed = 0

    def due(self) -> int | None:
        """None: stay quiet (counted); otherwise the number held back since the last message (which is now)."""
        now = self._clock()
        if now < self._next:
            self._suppressed += 1
            return None
        held, self._suppressed = self._suppressed, 0
        self._next = now + self._interval
        return held


class RefusalLog:
    """Log refused peers: the first at once, then at most one line per ``interval`` with a count."""

    def __init__(
        self,
        *,
        policy: AccessPolicy,
        interval: float,
        clock: Callable[[], float],
        because: str = "",
        label: str = "kmsg relay",
        logger: logging.Logger | None = None,
    ) -> None:
        self._because = because or f"only {policy.describe()} may connect"
        self._throttle = Throttle(interval=interval, clock=clock)
        self._label = label
        self._log = logger if logger is not None else log

    def note(self, peer: PeerCredentials | None, *, why: str = "") -> None:
        held = self._throttle.due()
        if held is None:
            return
        who = f"pid {peer.pid} (uid {peer.uid}, gid {peer.gid})" if peer is not None else f"an unknown peer ({why})"
        more = f"; {held} more refused since the last message" if held else ""
        self._log.warning("%s: refused a connection from %s: %s%s", self._label, who, self._because, more)


class SetupError(Exception):
    """The socket could not be created; the message says why."""


def listen_unix(socket_path: Path, policy: AccessPolicy, *, backlog: int = 16) -> tuple[socket.socket, int]:
    """Create the directory, remove a stale socket, bind, set owner and mode, listen; raises SetupError.

    Nobody can connect before ``listen()``, so the file is never open to others. Returns the
    listening socket and the inode of its file (to remove only our own file on exit).
    """
    _make_room(socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = os.fspath(socket_path)
    try:
        server.bind(path)
        inode = os.lstat(path).st_ino
    except OSError as exc:
        server.close()
        raise SetupError(f"cannot listen on the UNIX socket {socket_path}: {exc}") from exc
    try:
        # follow_symlinks=False and the inode check: never chown or chmod something swapped in meanwhile.
        os.chown(path, policy.uid, -1 if policy.gid is None else policy.gid, follow_symlinks=False)
        st = os.lstat(path)
        if st.st_ino != inode or not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EEXIST, "the socket file was replaced during setup")
        os.chmod(path, policy.mode)
    except OSError as exc:
        server.close()
        remove_if_ours(socket_path, inode)
        raise SetupError(f"cannot hand the socket {socket_path} to {policy.describe()}: {exc}") from exc
    try:
        server.listen(backlog)
    except OSError as exc:
        server.close()
        remove_if_ours(socket_path, inode)
        raise SetupError(f"cannot listen on the UNIX socket {socket_path}: {exc}") from exc
    return server, inode


def _make_room(socket_path: Path) -> None:
    """The socket's directory exists and nothing but a stale socket (now removed) is at its path."""
    try:
        socket_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SetupError(f"cannot create the socket directory {socket_path.parent}: {exc}") from exc
    try:
        mode = socket_path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SetupError(f"cannot inspect {socket_path}: {exc}") from exc
    if not stat.S_ISSOCK(mode):
        raise SetupError(f"{socket_path} exists and is not a socket; refusing to replace it")
    try:
        socket_path.unlink()
    except OSError as exc:
        raise SetupError(f"cannot remove the stale socket {socket_path}: {exc}") from exc
    log.info("removed a stale socket %s", socket_path)


def remove_if_ours(socket_path: Path, inode: int) -> None:
    """Remove ``socket_path`` if it is still the file of inode ``inode`` (ours); errors are ignored."""
    try:
        if os.lstat(socket_path).st_ino == inode:
            socket_path.unlink()
    except OSError:
        pass
