"""Everything a plugin run started, found and killed when the run ends; the agent reaps what it adopts.

A program the agent runs gets a session (and process group) of its own, and killing that group at
the end of a run used to be the whole clean-up. A child that calls ``setsid`` (a daemonizing
double fork, ``setsid cmd &``, ``nohup`` with a new session) leaves the group and escaped: one
process leaked per run. What this module adds, all of it unprivileged (no cgroup write access,
which a pod normally lacks, and no capability):

- **Child subreaper** (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``, :func:`become_subreaper`): an
  orphan of anything the agent started is re-parented to the agent instead of the node's init,
  so it stays inside the agent's process tree, where it can be found. (In a pod the agent is
  usually PID 1 of its own PID namespace, which has the same effect.)
- **A mark per run**: the program's environment gets ``NODE_HEALTH_AGENT_RUN=<agent pid>-<n>``,
  which every descendant inherits (``setsid`` does not change it), and which ``/proc/<pid>/environ``
  shows to the agent (same user).
- **At the end of a run** (exit, timeout or cancel), :func:`leftovers` walks ``/proc`` once: the run's
  own subtree, plus every process adopted by the agent that carries the run's mark (or the mark of a
  run that has already ended; or, when no other run is in flight, no mark at all: a plugin that also
  cleared its environment), is killed with SIGKILL, besides the run's process group. A second pass
  catches a child forked in between.
- **Reaping**: an adopted process that exits is the agent's zombie until the agent waits for it.
  :func:`reap_adopted` waits for every zombie child the agent did not start itself (a process it
  starts goes through :func:`start` and is waited for by its owner, :func:`wait`; nothing else is
  touched: a child in the agent's own session is never reaped here).

Limits, said plainly: a process that clears its environment while another run is in flight is
killed at the next run end with nothing else in flight; a process that changes user (a setuid
program) hides its environment and is found only by ancestry. The walk reads one small file per
process in the agent's PID namespace (a pod shows only the agent's own processes).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

RUN_MARK = "NODE_HEALTH_AGENT_RUN"
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
KILL_PASSES = 3  # walks at the end of a run (a leftover may fork while the first walk runs)
REAP_WAIT = 1.0  # seconds to wait for killed leftovers to die and be reaped

_marks = itertools.count(1)


@functools.cache
def become_subreaper() -> bool:
    """Make this process the child subreaper of everything it starts (Linux); True if it is now.

    Once per process; the setting is the process's own (children do not inherit it)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def new_mark() -> str:
    """A value of ``NODE_HEALTH_AGENT_RUN`` no other run of this agent has."""
    return f"{os.getpid()}-{next(_marks)}"


class _Started:
    """The children the agent started itself and waits for (plugin runs, journalctl), with the mark of
    each run ("" for other programs). Starting and reaping hold one lock, so a child is known before
    it could ever be mistaken for an adopted orphan."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.marks: dict[int, str] = {}


_STARTED = _Started()


def start(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None, mark: str = ""
) -> subprocess.Popen[bytes]:
    """Start a program in a session of its own (stdin /dev/null, stdout and stderr pipes). Wait for it
    with :func:`wait`, never with ``Popen.wait`` alone. ``mark`` (see :func:`new_mark`) marks a run."""
    with _STARTED.lock:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**env, RUN_MARK: mark} if mark else dict(env),
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
        _STARTED.marks[proc.pid] = mark
    return proc


def wait(proc: subprocess.Popen[bytes]) -> int:
    """Wait for a program :func:`start` started; its exit status (``-N``: killed by signal N)."""
    code = proc.wait()
    with _STARTED.lock:
        _STARTED.marks.pop(proc.pid, None)
    return code


@dataclass(frozen=True, slots=True)
class Proc:
    """One line of the process table: who a process's parent is, its group and session."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool


def processes(proc_root: Path = Path("/proc")) -> dict[int, Proc]:
    """Every process ``proc_root`` shows (empty where there is no /proc)."""
    table: dict[int, Proc] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            raw = (proc_root / name / "stat").read_bytes()
        except OSError:  # gone meanwhile
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) ": the name may hold anything
        if len(fields) < 4:
            continue
        pid = int(name)
        table[pid] = Proc(
            pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), sid=int(fields[3]), zombie=fields[0] in (b"Z", b"X")
        )
    return table


def descendants(root: int, table: Mapping[int, Proc]) -> set[int]:
    """The pids below ``root`` in ``table`` (its children, theirs, ...)."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def mark_of(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The ``NODE_HEALTH_AGENT_RUN`` a process was started with, or None (none, or not readable)."""
    try:
        environ = (proc_root / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = RUN_MARK.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode("ascii", "replace")
    return None


def leftovers(run_pid: int, mark: str, *, proc_root: Path = Path("/proc")) -> set[int]:
    """The live processes the run ``run_pid`` (marked ``mark``) left behind: its own subtree, and among the
    orphans the agent adopted (and their subtrees) those that carry its mark, the mark of a run of this
    agent that has ended, or (when no other run is in flight) no mark of this agent at all."""
    table = processes(proc_root)
    me, my_session = os.getpid(), os.getsid(0)
    with _STARTED.lock:
        started = dict(_STARTED.marks)
    in_flight = {m for pid, m in started.items() if m and pid != run_pid}
    ours = f"{me}-"
    found = descendants(run_pid, table)
    # Adopted: a child of the agent it did not start, outside its own session (so a plugin's).
    adopted = [p.pid for p in table.values() if p.ppid == me and p.pid not in started and p.sid != my_session]
    candidates = {*adopted, *(d for pid in adopted for d in descendants(pid, table))}
    for pid in candidates - found:
        if table[pid].zombie:
            continue
        owner = mark_of(pid, proc_root)
        if owner is not None and not owner.startswith(ours):
            owner = None  # another agent's mark means nothing here
        if owner == mark or (owner is not None and owner not in in_flight) or (owner is None and not in_flight):
            found.add(pid)
    return {pid for pid in found if not table[pid].zombie}


def kill_leftovers(run_pid: int, mark: str, *, proc_root: Path = Path("/proc")) -> set[int]:
    """SIGKILL what the run left (see :func:`leftovers`), walking again until nothing new is found; the pids."""
    killed: set[int] = set()
    for _ in range(KILL_PASSES):
        found = leftovers(run_pid, mark, proc_root=proc_root) - killed
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= found
    return killed


def reap_adopted(*, proc_root: Path = Path("/proc")) -> int:
    """Wait for (reap) every zombie child of this process that it did not start through :func:`start` and
    that is outside its own session; how many. A subreaper must, or adopted orphans pile up as zombies."""
    me, my_session = os.getpid(), os.getsid(0)
    reaped = 0
    with _STARTED.lock:  # held: a program start()ed meanwhile is known before it can be taken for an orphan
        for p in processes(proc_root).values():
            if p.ppid != me or not p.zombie or p.sid == my_session or p.pid in _STARTED.marks:
                continue
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(p.pid, os.WNOHANG)[0] == p.pid:
                    reaped += 1
    return reaped


def settle(killed: Iterable[int], *, proc_root: Path = Path("/proc"), timeout: float = REAP_WAIT) -> None:
    """Reap adopted zombies until every pid in ``killed`` is gone, or is a zombie that another process
    (not one of ``killed``) must reap, or ``timeout`` passes (a process stuck in the kernel cannot be hurried)."""
    me = os.getpid()
    pending = set(killed)
    deadline = time.monotonic() + timeout
    while True:
        reap_adopted(proc_root=proc_root)
        if not pending:
            return
        table = processes(proc_root)
        pending = {
            pid
            for pid in pending
            if pid in table and not (table[pid].zombie and table[pid].ppid != me and table[pid].ppid not in pending)
        }
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(0.01)
