"""What ``/metrics`` and ``/conditions`` show: the latest publication once it holds every input the inbox had
received when asked (issue 16: a kernel line read just before a scrape showed only at the next one), with
the waiting bounded per read and in total, so a stalled main loop or a storm of scrapes cannot hold the
HTTP thread."""

from __future__ import annotations

import threading

import pytest

from agent.core.bus import CaughtUp, Inbox, Notice, Publication, SnapshotFeed
from agent.core.state import NodeState

from helpers import wait_for
from helpers.mainloop import Clock
from helpers.threads import wchan

STOP = threading.Event()


def feed() -> SnapshotFeed:
    return SnapshotFeed(initial=NodeState(conditions=(), clock=Clock()).snapshot())


def publish(on: SnapshotFeed, *, inputs: int) -> Publication:
    return on.publish(snapshot=on.latest().snapshot, events=[], health={}, inputs=inputs)


def test_the_inbox_counts_the_inputs_put_and_taken_but_not_its_wake() -> None:
    inbox = Inbox(maxsize=4)
    assert (inbox.received, inbox.taken) == (0, 0)
    for _ in range(3):
        assert inbox.put(Notice(events=()), stop=STOP)
    inbox.wake()
    assert (inbox.received, inbox.taken) == (3, 0)
    assert inbox.get(timeout=0) is not None and inbox.get_nowait() is not None
    assert (inbox.received, inbox.taken) == (3, 2)
    assert inbox.get(timeout=0) is not None
    assert inbox.get(timeout=0) is None  # the wake: no input
    assert (inbox.received, inbox.taken) == (3, 3)


def test_covering_waits_for_the_publication_that_folds_the_inputs() -> None:
    on = feed()
    publish(on, inputs=1)
    got: list[Publication] = []
    waiter = threading.Thread(target=lambda: got.append(on.covering(3, timeout=30.0)))
    waiter.start()
    wait_asleep(waiter)
    publish(on, inputs=2)  # not yet: it sleeps on
    wait_asleep(waiter)
    assert not got
    third = publish(on, inputs=3)
    waiter.join(timeout=30)
    assert got == [third]


def test_covering_gives_the_latest_at_once_when_covered_after_its_timeout_or_once_closed() -> None:
    on = feed()
    latest = publish(on, inputs=5)
    assert on.covering(5, timeout=30.0) is latest
    assert on.covering(6, timeout=0.0) is latest  # not covered: as it is
    on.close()
    assert on.covering(6, timeout=30.0) is latest  # closed: at once


def wait_asleep(thread: threading.Thread) -> None:
    """Until ``thread`` sleeps on a lock or condition (the feed's)."""
    assert thread.native_id is not None
    wait_for(lambda: "futex" in wchan(thread.native_id))


class WaitsOut(SnapshotFeed):
    """A feed whose main loop never folds what is pending: each wait runs to its end (on the test's clock)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(initial=NodeState(conditions=(), clock=Clock()).snapshot())
        self.clock = clock
        self.waits: list[float] = []

    def covering(self, inputs: int, *, timeout: float) -> Publication:
        self.waits.append(timeout)
        self.clock.now += timeout
        return self.latest()


# (seconds passed since the last read ended, inputs pending, the wait the read may take: None = no wait at all).
# The credit refills at a tenth of the time passed, the waits' own time included, up to one full wait.
READS = [
    (0.0, 1, 0.02),  # a full credit: the longest wait, all spent (t = 0.02)
    (0.0, 1, 0.002),  # what the 20 ms of that wait refilled (t = 0.022)
    (0.05, 1, 0.0052),  # 52 ms since the last refill (t = 0.0772)
    (0.0, 0, None),  # nothing pending: no wait, nothing spent
    (0.1, 1, 0.01052),  # 105.2 ms since the last refill
    (5.0, 1, 0.02),  # a quiet while: never more than one full wait
]


def test_reads_wait_at_most_the_wait_each_and_a_share_of_the_time_all_together() -> None:
    clock = Clock(0.0)
    on = WaitsOut(clock)
    inbox = Inbox(maxsize=8)
    current = CaughtUp(inbox=inbox, feed=on, wait=0.02, share=0.1, monotonic=clock)
    for passed, pending, wait in READS:
        clock.now += passed
        if pending:
            assert inbox.put(Notice(events=()), stop=STOP)
        before = len(on.waits)
        assert current() is on.latest()
        assert on.waits[before:] == ([] if wait is None else [pytest.approx(wait)])
        while inbox.get_nowait() is not None:  # the loop catches up between reads
            pass
        publish(on, inputs=inbox.taken)


def test_a_storm_of_reads_on_a_stalled_main_loop_waits_a_share_of_the_time() -> None:
    clock = Clock(0.0)
    on = WaitsOut(clock)
    inbox = Inbox(maxsize=8)
    assert inbox.put(Notice(events=()), stop=STOP)  # never folded
    current = CaughtUp(inbox=inbox, feed=on, wait=0.02, share=0.1, monotonic=clock)
    for _ in range(500):
        current()
        clock.now += 0.001  # the render of each scrape
    assert sum(on.waits) <= 0.02 + 0.1 * clock.now + 1e-9
    assert len(on.waits) == 500  # each read waited a little: the credit refills as time passes


def test_a_read_shows_what_the_main_loop_folds_while_it_waits() -> None:
    """End to end through the real feed: an input put before the read is folded by another thread; the
    read gives that publication, not the one before it."""
    on = feed()
    inbox = Inbox(maxsize=8)
    current = CaughtUp(inbox=inbox, feed=on, wait=30.0)
    assert inbox.put(Notice(events=()), stop=STOP)
    got: list[Publication] = []
    reader = threading.Thread(target=lambda: got.append(current()))
    reader.start()
    wait_asleep(reader)
    assert inbox.get_nowait() is not None
    folded = publish(on, inputs=inbox.taken)
    reader.join(timeout=30)
    assert got == [folded]


class Asked(SnapshotFeed):
    """A feed that records the inputs each wait asks to be covered, and never folds them."""

    def __init__(self) -> None:
        super().__init__(initial=NodeState(conditions=(), clock=Clock()).snapshot())
        self.asked: list[int] = []

    def covering(self, inputs: int, *, timeout: float) -> Publication:
        self.asked.append(inputs)
        return self.latest()


# (inputs received, inputs published, the kernel holds records unread, the inputs the read waits for: None =
# no wait). Records unread are the reader's next batch: one input more than received.
UNREAD = [
    (2, 2, False, None),
    (2, 2, True, 3),
    (3, 2, False, 3),
    (3, 2, True, 4),
]


@pytest.mark.parametrize(("received", "published", "unread", "asked"), UNREAD)
def test_records_the_reader_has_not_read_are_waited_for_as_its_next_batch(
    received: int, published: int, unread: bool, asked: int | None
) -> None:
    on = Asked()
    inbox = Inbox(maxsize=8)
    for _ in range(received):
        assert inbox.put(Notice(events=()), stop=STOP)
    publish(on, inputs=published)
    reader_asked: list[None] = []

    def catch_up() -> bool:
        reader_asked.append(None)
        return unread

    current = CaughtUp(inbox=inbox, feed=on, wait=0.02, catch_up=catch_up)
    assert current() is on.latest()
    assert on.asked == ([] if asked is None else [asked])
    assert len(reader_asked) == 1  # every read has the reader catch up: records unread are read now


def test_a_read_with_records_unread_shows_the_batch_the_reader_hands_over_next() -> None:
    """End to end through the real feed: the main loop had folded all the inbox received, but the kernel
    holds a line its reader has not read; the read sleeps until the batch with it is folded."""
    on = feed()
    inbox = Inbox(maxsize=8)
    assert inbox.put(Notice(events=()), stop=STOP)
    assert inbox.get_nowait() is not None
    caught_up = publish(on, inputs=inbox.taken)
    current = CaughtUp(inbox=inbox, feed=on, wait=30.0, catch_up=lambda: True)
    got: list[Publication] = []
    reader = threading.Thread(target=lambda: got.append(current()))
    reader.start()
    wait_asleep(reader)
    assert not got  # not the publication that had folded everything received
    assert inbox.put(Notice(events=()), stop=STOP)  # the reader's batch
    assert inbox.get_nowait() is not None
    folded = publish(on, inputs=inbox.taken)
    reader.join(timeout=30)
    assert got == [folded] and folded is not caught_up
