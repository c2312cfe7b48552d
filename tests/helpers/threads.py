"""How often a thread wakes: its context switches and where it sleeps, from /proc (issue 16).

A sleeping thread is switched out once and in once when it wakes, so a thread that sleeps through a
window without waking shows no new context switch in it, however loaded the machine is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from helpers import wait_for

WINDOW = 1.2  # seconds watched: a thread that polls once a second wakes at least once in it


def switches(tid: int) -> int:
    """Voluntary + involuntary context switches of one thread of this process so far."""
    text = Path(f"/proc/self/task/{tid}/status").read_text()
    return sum(int(line.split()[1]) for line in text.splitlines() if "ctxt_switches:" in line)


def wchan(tid: int) -> str:
    """The kernel function the thread sleeps in ('' while it runs)."""
    return Path(f"/proc/self/task/{tid}/wchan").read_text()


def wakeups_while_asleep(tid: int, *, sleeps_in: Iterable[str], window: float = WINDOW) -> int:
    """Once the thread sleeps in one of ``sleeps_in`` (parts of a kernel function name, e.g. "poll"
    for select/poll/epoll, "futex" for a lock or condition), its context switches over ``window``."""
    where = tuple(sleeps_in)
    wait_for(lambda: any(part in wchan(tid) for part in where))
    before = switches(tid)
    threading.Event().wait(window)
    return switches(tid) - before
