"""``Inbox.gather``: the main loop's wait in a flood. It ends once the inbox is half full (the reader, which
waits only on a full inbox, never waits on it), at ``wake`` (stop), or at its timeout; it takes nothing."""

from __future__ import annotations

import threading

import pytest

from agent.core.bus import Inbox, Notice

from helpers import wait_for
from helpers.threads import switches, wchan

STOP = threading.Event()
HOUR = 3600.0  # a wait that only something other than its timeout can end within a test's time


def gathering(inbox: Inbox) -> threading.Thread:
    """A thread gathering for an hour, once it sleeps in the kernel."""
    thread = threading.Thread(target=inbox.gather, kwargs={"timeout": HOUR}, daemon=True)
    thread.start()
    wait_for(lambda: thread.native_id is not None and "futex" in wchan(thread.native_id))
    return thread


def fill(inbox: Inbox, count: int) -> None:
    for _ in range(count):
        assert inbox.put(Notice(events=()), stop=STOP)


@pytest.mark.parametrize(("maxsize", "queued"), [(16, 8), (16, 16), (2, 1), (1, 1), (3, 1)])
def test_a_half_full_inbox_ends_the_wait_at_once(maxsize: int, queued: int) -> None:
    inbox = Inbox(maxsize=maxsize)
    fill(inbox, queued)
    done = threading.Thread(target=inbox.gather, kwargs={"timeout": HOUR}, daemon=True)
    done.start()
    done.join(timeout=30)
    assert not done.is_alive()
    assert inbox.taken == 0 and inbox.received == queued  # nothing taken


def test_the_wait_ends_when_the_inbox_fills_to_half_meanwhile() -> None:
    inbox = Inbox(maxsize=16)
    fill(inbox, 3)
    thread = gathering(inbox)
    fill(inbox, 4)  # 7 of 16: not yet
    assert thread.is_alive()
    fill(inbox, 1)
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_wake_ends_the_wait_and_every_later_one() -> None:
    inbox = Inbox(maxsize=16)
    thread = gathering(inbox)
    inbox.wake()
    thread.join(timeout=30)
    assert not thread.is_alive()
    inbox.gather(timeout=HOUR)  # at once: stopping


def test_below_half_the_wait_ends_at_its_timeout() -> None:
    inbox = Inbox(maxsize=16)
    fill(inbox, 7)
    inbox.gather(timeout=0.01)
    assert inbox.taken == 0


def test_puts_below_half_leave_the_gathering_thread_asleep() -> None:
    """A flood's chunks come one by one: each put until the inbox is half full wakes nobody (its thread is not
    switched in once), the put that makes it half full ends the wait."""
    inbox = Inbox(maxsize=16)
    thread = gathering(inbox)
    assert thread.native_id is not None
    before = switches(thread.native_id)
    fill(inbox, 7)
    threading.Event().wait(0.2)  # a wakeup the puts caused would have run by now
    assert switches(thread.native_id) == before and "futex" in wchan(thread.native_id)
    fill(inbox, 1)
    thread.join(timeout=30)
    assert not thread.is_alive()
