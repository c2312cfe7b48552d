"""What the sinks that write to the Kubernetes API share: the component loop over the snapshot
feed, waiting, one :class:`~agent.core.backoff.Backoff`, and what a failed write means.

A failed write is one of (:func:`classify`):

- **transient** (no answer or a timeout, 408, 409 Conflict, 429, 5xx): retried after a jittered
  backoff that honours the server's ``Retry-After`` and is never shorter than ``resync``;
- **permanent** (400, 401, 403, 404, 422 and every other 4xx): that write is dropped, counted by
  HTTP status in ``dropped`` and logged once per (status, reason); the sink goes on with the next;
- **gone** (404 when patching an aggregated Event: it expired): the sink creates it anew.

A failing API is not a health problem of the sink: ``healthy`` only says the loop still beats
(a dead or wedged thread is unhealthy); ``last_error`` says what the API answered, for /healthz.

An unexpected exception (a bug, or a value no sink should have met) never ends the loop: it is
counted in ``bugs``, logged with its traceback once per exception type and place, shown in
:meth:`SinkWorker.detail` (for /healthz details), and the loop goes on after a backoff. Sinks also
catch it per item (an Event, a metric), so one bad value is skipped and the others still go out.
"""

from __future__ import annotations

import collections
import enum
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Protocol

from agent.core.backoff import Backoff
from agent.core.bus import Publication, SnapshotFeed

log = logging.getLogger(__name__)

RESYNC = 10.0  # the shortest wait after a failed write
# Two sinks a node write to the API server (conditions, Events): backing off to 2 minutes keeps a fleet at
# under 2 requests per node-minute while the server is down (at 60 s: about 2.3, the ramp included).
MAX_BACKOFF = 120.0
BACKOFF_JITTER = 0.2
STALL = 60.0  # a loop that has not beaten this long after its planned wake-up is wedged
IDLE = 60.0  # the longest pause (a new publication ends it early); the loop beats at least this often


class Failure(enum.StrEnum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    GONE = "gone"


class SeamError(Protocol):
    """What the failure policy reads of an adapter's error (:class:`agent.adapters.kube.KubeError`,
    :class:`agent.adapters.aws.AwsError`): every sink fails the same way whatever it writes to."""

    @property
    def transient(self) -> bool: ...  # the same call may succeed later (5xx, 429, timeouts, throttling)

    @property
    def status(self) -> int | None: ...  # the HTTP status, None when no answer arrived

    @property
    def reason(self) -> str: ...  # the server's reason or error code (a refusal is logged once per status and reason)

    @property
    def retry_after(self) -> float | None: ...  # the server's Retry-After, seconds


def classify(exc: SeamError, *, gone_on_404: bool = False) -> Failure:
    """What a failed write means; ``gone_on_404`` for writes to objects that may expire (Events)."""
    if exc.transient:
        return Failure.TRANSIENT
    if exc.status == 404 and gone_on_404:
        return Failure.GONE
    return Failure.PERMANENT


class SinkWorker:
    """Base of a sink component: ``run(stop)`` loops ``take`` (each new publication), ``work``
    (the writes that are due) and a pause, then ``finish`` once ``stop`` is set.

    Time is injected: ``clock`` (wall, for timestamps), ``monotonic`` (scheduling) and ``wait``
    (``wait(seconds) -> stopping``; the default returns at the end of the pause, on ``stop``, or
    early when the feed has a newer publication, so a sink never sleeps through new input).
    Subclasses set ``name`` and implement ``take``, ``work`` and ``finish``.
    """

    name = "sink"

    def __init__(
        self,
        *,
        feed: SnapshotFeed,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
        resync: float = RESYNC,
        max_backoff: float = MAX_BACKOFF,
        rng: Callable[[], float] = random.random,
        stall: float = STALL,
    ) -> None:
        self._feed = feed
        self._clock = clock
        self._monotonic = monotonic
        self._wait = wait
        self._resync = resync
        self._stall = stall
        self._backoff = Backoff(initial=resync, maximum=max(resync, max_backoff), jitter=BACKOFF_JITTER, rng=rng)
        self._retry_at: float | None = None  # monotonic time before which no write is tried
        self._quiet_until = float("-inf")  # monotonic time before which the loop does nothing (after a bug)
        self._seen = -1  # number of the newest publication taken (the feed's initial one is 0)
        self._deadline = monotonic() + stall  # healthy while the loop beats before this
        self._exited = False
        self._logged: set[tuple[int | None, str]] = set()
        self.writes = 0  # successful API writes
        self.failures: collections.Counter[str] = collections.Counter()  # failed writes by Failure kind
        self.dropped: collections.Counter[int] = collections.Counter()  # writes given up, by HTTP status
        self.last_error: str | None = None  # the latest failure, None again after a success
        self.bugs = 0  # unexpected exceptions caught (each skipped an item or a loop turn)
        self.last_bug: str | None = None
        self._bug_places: set[tuple[str, str]] = set()

    # ---- for subclasses ------------------------------------------------------------------------

    def take(self, pub: Publication) -> None:
        """Adopt a new publication (the newest; earlier ones may have been skipped)."""
        raise NotImplementedError

    def work(self, now: float) -> float:
        """Do the writes that are due at ``now`` (monotonic); seconds until something is due again."""
        raise NotImplementedError

    def finish(self, now: float) -> None:
        """``stop`` is set: a last, bounded attempt at what is pending."""
        raise NotImplementedError

    @property
    def resync(self) -> float:
        """The shortest wait after a failed write (and the floor of every backoff)."""
        return self._resync

    def in_backoff(self, now: float) -> bool:
        return self._retry_at is not None and now < self._retry_at

    def retry_in(self, now: float) -> float:
        """Seconds until writes may be tried again (0 when not backing off)."""
        return max(0.0, self._retry_at - now) if self._retry_at is not None else 0.0

    def beat(self, expect: float = 0.0) -> None:
        """The loop is alive and will beat again within ``expect`` seconds (plus the stall bound)."""
        self._deadline = self._monotonic() + expect + self._stall

    def succeeded(self) -> None:
        self.writes += 1
        self.last_error = None
        self._retry_at = None
        self._backoff.reset()

    def failed(
        self, exc: SeamError, *, what: str, now: float, gone_on_404: bool = False, retry_refused: bool = False
    ) -> Failure:
        """The one failure policy of every sink: count, log and schedule the retry of a failed write;
        returns what the failure means.

        Transient: retried after the backoff (never sooner than ``resync`` nor the server's
        ``Retry-After``). Permanent (refused): dropped until the next change, or with ``retry_refused``
        (a sink whose next write is a new one, as a CloudWatch round) retried after the backoff too;
        logged once per status and reason. Gone (``gone_on_404``): the caller creates the object anew."""
        kind = classify(exc, gone_on_404=gone_on_404)
        self.failures[kind] += 1
        self.last_error = str(exc)
        if kind is Failure.GONE:
            log.info("%s: the object is gone, creating it anew: %s", what, exc)
            return kind
        delay = None
        if kind is Failure.TRANSIENT or retry_refused:
            delay = self._backoff.next_delay(retry_after=exc.retry_after, at_least=self._resync)
            self._retry_at = now + delay
        if kind is Failure.TRANSIENT:
            log.warning("%s failed (retrying in %.1fs): %s", what, delay, exc)
            return kind
        key = (exc.status, exc.reason)
        level = logging.DEBUG if key in self._logged else logging.ERROR
        self._logged.add(key)
        if delay is None:
            self.dropped[exc.status or 0] += 1
            log.log(level, "%s refused, dropped (not retried; logged once per status and reason): %s", what, exc)
        else:
            log.log(level, "%s refused (retrying in %.0fs; logged once per status and reason): %s", what, delay, exc)
        return kind

    def unexpected(self, exc: Exception, *, what: str) -> None:
        """An exception no sink code expects while doing ``what``: count it, log it once per type and
        place (with the traceback), keep it for :meth:`detail`. The caller skips the item."""
        self.bugs += 1
        self.last_bug = f"{what}: {type(exc).__name__}: {str(exc)[:300]}"
        place = (type(exc).__name__, what)
        if place in self._bug_places:
            log.debug("%s: unexpected %s again (%d so far): %s", self.name, type(exc).__name__, self.bugs, exc)
        else:
            self._bug_places.add(place)
            log.exception("%s: unexpected error (a bug; skipped, the sink goes on): %s", self.name, what)

    def detail(self) -> str | None:
        """What /healthz details say about this sink: the API's latest failure and any bug met."""
        bug = f"{self.bugs} unexpected error(s), a bug (latest: {self.last_bug})" if self.bugs else None
        return "; ".join(p for p in (self.last_error, bug) if p) or None

    # ---- the component -------------------------------------------------------------------------

    def healthy(self, now: float) -> bool:
        """The loop runs and beat within the stall bound; API failures do not count."""
        return not self._exited and now <= self._deadline

    def run(self, stop: threading.Event) -> None:
        wait = self._wait or (lambda seconds: self._default_wait(stop, seconds))
        try:
            while not stop.is_set():
                if wait(self.turn()):
                    break
            try:
                self._take_newest()
                self.finish(self._monotonic())
            except Exception as exc:
                self.unexpected(exc, what="the last flush")
        finally:
            self._exited = True

    def turn(self) -> float:
        """One turn of the loop: take the newest publication and do the writes that are due; the seconds to
        pause before the next turn (a newer publication may end the pause early). ``run`` turns and waits;
        a stepped simulation (bench/fleetstep.py) calls it at the simulated time the pause ends."""
        now = self._monotonic()
        if now < self._quiet_until:  # after a bug: a wait cut short by a publication is no retry
            pause = self._quiet_until - now
        else:
            try:
                self._take_newest()
                pause = min(max(0.0, self.work(self._monotonic())), IDLE)
            except Exception as exc:  # a bug must not end the sink: count, report, back off, go on
                self.unexpected(exc, what="the sink loop")
                pause = self._backoff.next_delay(at_least=self._resync)
                self._retry_at = self._quiet_until = self._monotonic() + pause
        self.beat(pause)
        return pause

    def _take_newest(self) -> None:
        pub = self._feed.wait_newer(self._seen, timeout=0)
        if pub is not None:
            self._seen = pub.number
            self.take(pub)

    def _default_wait(self, stop: threading.Event, seconds: float) -> bool:
        """Up to ``seconds`` (real time), ending early on a newer publication or a closed feed and ``stop``.

        It sleeps on the feed alone, not in slices that look at ``stop`` (each look is an idle wakeup,
        issue 16): the supervisor closes the feed at stop, which wakes it at once."""
        end = time.monotonic() + seconds
        while not stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            started = time.monotonic()
            if self._feed.wait_newer(self._seen, timeout=left) is not None:
                return False
            rest = left - (time.monotonic() - started)
            if rest > 0.001:  # the feed was closed: it no longer blocks, so wait on stop instead
                stop.wait(rest)
        return True
