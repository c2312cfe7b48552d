"""The bus between the parts: one inbox into the one writer, one snapshot feed out of it (the
supervisor that runs the components is :mod:`agent.core.supervisor`).

::

    producers ──► Inbox ──► MainLoop (only writer of NodeState) ──► SnapshotFeed ──► consumers
    (kmsg reader, relay client, node seeder, ...)                   (condition/Event sinks, stdout, state store)

- A **component** is a long-lived part with ``name``, ``run(stop)`` and ``healthy(now)``
  (``now`` is ``time.monotonic()``). The :class:`Supervisor` runs each in its own thread, turns
  a component whose thread died into an unhealthy one, feeds ``/healthz`` and the
  ``component_healthy`` metric, and stops everything within one shared deadline. Idle, a component
  sleeps until it has something to do (each wakeup is idle CPU); one that sleeps on its own signal
  rather than on ``stop`` also has ``wake()``, which the supervisor calls at stop.
- **Producers** put :class:`RecordBatch`, :class:`~agent.checks.model.CheckReport` or :class:`SeedConditions` items
  into the bounded :class:`Inbox` and decide nothing.
- The :class:`MainLoop` is the only writer of :class:`~agent.core.state.NodeState`: it matches record
  batches, folds findings and seeds, and publishes a :class:`Publication` (snapshot, the events
  of that step, component health) on the :class:`SnapshotFeed`.
- **Consumers** read the feed (the latest publication; the events since the one they saw) and
  never write state. Consumers that keep what they were given durably (the Event outbox, the
  stdout log) *acknowledge* publication numbers; the kmsg cursor is saved only up to what every
  durable consumer acknowledged, so a SIGKILL can never skip an Event: the records after the
  cursor are replayed in full after a restart.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from agent.core.types import Condition, Event, LogRecord, Snapshot
from agent.core.validation import ValidationRecord

log = logging.getLogger(__name__)

# Batches (each up to 4096 records): small enough that a storm cannot pile up memory (and garbage-
# collector work) in the inbox; when full, producers wait and the kernel ring buffer absorbs the burst.
INBOX_ITEMS = 16
FEED_EVENTS = 100_000  # events the feed keeps for consumers that fall behind
CATCH_UP_WAIT = 0.02  # the longest one read waits for the main loop to fold what had come in (CaughtUp)
# The share of the time reads may spend waiting for it, all together. A scrape a second after a kernel line
# waits about a millisecond; 500 scrapes at once during a storm of records, a tenth let /healthz behind them
# wait up to 0.84 s (0.24-0.6 s without waiting at all, the same at 2 %).
CATCH_UP_SHARE = 0.02


# ---- inputs --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordBatch:
    """Kernel log records in read order, from one source: given, or to be decoded by the main loop.

    A source whose thread should only do I/O hands over raw data and its ``decode`` (parsing and
    sequence accounting, the source's own code); the main loop runs it (docs/benchmarks.md, "The kmsg
    fast path").
    """

    records: Sequence[LogRecord] = ()
    decode: Callable[[], Sequence[LogRecord]] | None = None
    monitor: str | None = None  # a log monitor's records (its own rules, no kmsg replay); None = the kernel log

    def resolve(self) -> Sequence[LogRecord]:
        return self.decode() if self.decode is not None else self.records


@dataclass(frozen=True, kw_only=True, slots=True)
class SeedConditions:
    """Our conditions as read back from the Node at startup, plus the Node's uid."""

    conditions: Sequence[Condition]
    node_uid: str | None = None
    validations: Sequence[ValidationRecord] = ()  # the Node's validation records (agent.sinks.validations)


@dataclass(frozen=True, kw_only=True, slots=True)
class Notice:
    """Events from a component that acts (recovery: cordoned, blocked by the budget, dry run ...).

    The main loop publishes them as they are, so they reach the same sinks (Kubernetes Events with
    their outbox, or stdout) as the detectors' events: one path to the world, no second writer."""

    events: Sequence[Event]


# What producers put: the items here, and the features' own (a check's CheckReport, the engine's Reconfigure).
# The bus never looks inside; the main loop tells them apart.
Input: TypeAlias = object


_WAKE = object()  # what Inbox.wake() puts: a get() returns None for it


class _CountingQueue(queue.Queue[Input]):
    """A queue that counts the inputs through it: ``_put``/``_get`` run under the queue's own lock, so each
    count moves with the item it counts (the wake sentinel is no input)."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize=maxsize)
        self.received = 0
        self.taken = 0

    def _put(self, item: Input) -> None:
        super()._put(item)
        if item is not _WAKE:
            self.received += 1

    def _get(self) -> Input:
        item = super()._get()
        if item is not _WAKE:
            self.taken += 1
        return item


class Inbox:
    """The bounded queue between producers and the main loop."""

    def __init__(self, *, maxsize: int = INBOX_ITEMS) -> None:
        self._queue = _CountingQueue(maxsize)
        self._woken = False
        self._enough = max(1, maxsize // 2)  # what ends a gather
        # A gather's own wait: notified by a put that leaves the inbox half full and by wake, not at each put (on
        # the queue's own condition, a flood's every chunk woke the gathering main loop only for it to find the
        # inbox not half full yet and sleep again).
        self._gathered = threading.Condition()

    @property
    def received(self) -> int:
        """Inputs put into the inbox so far (any thread)."""
        return self._queue.received

    @property
    def taken(self) -> int:
        """Inputs handed to the main loop so far."""
        return self._queue.taken

    def put(self, item: Input, *, stop: threading.Event, poll: float = 0.2) -> bool:
        """Wait for room (back-pressure); False if ``stop`` was set first."""
        while not stop.is_set():
            try:
                self._queue.put(item, timeout=poll)
            except queue.Full:
                continue
            if self._queue.qsize() >= self._enough:
                with self._gathered:
                    self._gathered.notify()
            return True
        return False

    def get(self, *, timeout: float | None) -> Input | None:
        """The next item, waiting up to ``timeout`` seconds (None: until one comes or :meth:`wake`)."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        return None if item is _WAKE else item

    def wake(self) -> None:
        """Make a waiting :meth:`get` return (None) now, and a :meth:`gather`: shutdown. With the queue full
        nobody waits."""
        self._woken = True
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_WAKE)  # never handed out
        with self._gathered:
            self._gathered.notify()

    def gather(self, *, timeout: float) -> None:
        """Wait up to ``timeout`` seconds while the inbox holds fewer than half the items it can, and
        :meth:`wake` was not called: the main loop letting a flood's chunks come in before it folds them,
        its producers never waiting on it."""
        with self._gathered:  # a put checks the inbox after its item is in, then notifies under this lock
            self._gathered.wait_for(lambda: self._woken or self._queue.qsize() >= self._enough, timeout=timeout)

    def get_nowait(self) -> Input | None:
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            return None
        return None if item is _WAKE else item


# ---- the feed ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Publication:
    """What the main loop published after one step."""

    number: int  # increases by one per publication
    snapshot: Snapshot
    events: tuple[Event, ...] = ()
    health: Mapping[str, bool] = field(default_factory=dict)  # component -> healthy, at publish time
    events_end: int = 0  # index after this publication's events in the feed's event sequence
    inputs: int = 0  # inputs folded in by now: the main loop's Inbox.taken when it published

    @property
    def agent_healthy(self) -> bool:
        return all(self.health.values())


class SnapshotFeed:
    """Latest publication plus a bounded backlog of events, for any number of consumers.

    Events are numbered 0, 1, 2, ... across publications; a consumer remembers the index after
    the last event it took and asks :meth:`events_since` for the rest.
    """

    def __init__(self, *, initial: Snapshot, max_events: int = FEED_EVENTS) -> None:
        self._cond = threading.Condition()
        self._latest = Publication(number=0, snapshot=initial)
        self._events: collections.deque[Event] = collections.deque(maxlen=max_events)
        self._end = 0  # index after the newest event
        self._closed = False

    def publish(
        self, *, snapshot: Snapshot, events: Sequence[Event], health: Mapping[str, bool], inputs: int = 0
    ) -> Publication:
        with self._cond:
            self._events.extend(events)
            self._end += len(events)
            pub = Publication(
                number=self._latest.number + 1,
                snapshot=snapshot,
                events=tuple(events),
                health=dict(health),
                events_end=self._end,
                inputs=inputs,
            )
            self._latest = pub
            self._cond.notify_all()
        return pub

    def latest(self) -> Publication:
        with self._cond:
            return self._latest

    def wait_newer(self, after: int, *, timeout: float | None) -> Publication | None:
        """The latest publication once its number is above ``after``; None on timeout or close."""
        with self._cond:
            if self._latest.number <= after and not self._closed:
                self._cond.wait_for(lambda: self._latest.number > after or self._closed, timeout=timeout)
            return self._latest if self._latest.number > after else None

    def covering(self, inputs: int, *, timeout: float) -> Publication:
        """The latest publication once it has folded in the first ``inputs`` inputs; as it is after
        ``timeout`` or once the feed is closed."""
        with self._cond:
            if self._latest.inputs < inputs and not self._closed:
                self._cond.wait_for(lambda: self._latest.inputs >= inputs or self._closed, timeout=timeout)
            return self._latest

    def events_since(self, index: int) -> tuple[list[Event], int, int]:
        """Events from ``index`` on: (events, the index after them, how many the backlog already lost)."""
        with self._cond:
            oldest = self._end - len(self._events)
            start = max(index, oldest)
            # Taken from the newest end: a consumer that keeps up asks for the last few of up to FEED_EVENTS
            # kept; skipping the others from the oldest end walked through all of them on every call, under
            # the lock the main loop publishes with.
            events = list(itertools.islice(reversed(self._events), max(0, self._end - start)))
            events.reverse()
            return events, self._end, start - index

    def close(self) -> None:
        """Wake every waiter (shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def iter_inputs(inbox: Inbox, *, first: Input, limit: int) -> Iterator[Input]:
    """``first`` plus whatever else is queued right now, at most ``limit`` items."""
    yield first
    for _ in range(limit - 1):
        item = inbox.get_nowait()
        if item is None:
            return
        yield item


class CaughtUp:
    """The latest publication once it holds every input the inbox had received when asked: for readers that
    answer someone (``/metrics``, ``/conditions``).

    A kernel line read a moment before a scrape is still in the inbox or in the main loop's hands; the
    latest publication as it is would show the node without it, and the line would show a scrape later
    (15-60 s for Prometheus). So a read waits for the main loop to fold what had come in when it was
    made, usually well under a millisecond, at most ``wait``; and reads together wait at most ``share`` of
    the time (a credit of at most ``wait`` seconds, refilled at ``share`` seconds per second): a stalled
    main loop or a storm of scrapes cannot hold the HTTP thread, whose other requests wait meanwhile.
    Past that, the latest publication as it is. Thread-safe.

    ``catch_up`` says whether the kernel log holds records its reader has not read yet, and has the reader
    read them now: the kernel marks /dev/kmsg readable as it stores a line but wakes its readers only at its
    next tick (up to 4 ms on 250 Hz kernels), so a line logged before the read came in may not even be in
    the inbox. Then the read waits for one input more than had been received, the reader's next batch,
    within the same bounds. (``received`` is taken first: a batch the reader takes between the two looks is
    not waited for, and what ``catch_up`` saw in the kernel can only come in after it.)
    """

    def __init__(
        self,
        *,
        inbox: Inbox,
        feed: SnapshotFeed,
        wait: float = CATCH_UP_WAIT,
        share: float = CATCH_UP_SHARE,
        monotonic: Callable[[], float] = time.monotonic,
        catch_up: Callable[[], bool] = lambda: False,
    ) -> None:
        self._inbox = inbox
        self._catch_up = catch_up
        self._feed = feed
        self._wait = wait
        self._share = share
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._credit = wait  # seconds of waiting left
        self._at = monotonic()  # when the credit was last refilled

    def __call__(self) -> Publication:
        received = self._inbox.received
        if self._catch_up():
            received += 1
        latest = self._feed.latest()
        if latest.inputs >= received:
            return latest
        with self._lock:
            now = self._monotonic()
            self._credit = min(self._wait, self._credit + (now - self._at) * self._share)
            self._at = now
            allowed = self._credit
        if allowed <= 0:
            return latest
        begun = self._monotonic()
        try:
            return self._feed.covering(received, timeout=allowed)
        finally:
            waited = self._monotonic() - begun
            with self._lock:
                self._credit -= waited
