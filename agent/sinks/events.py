"""Kubernetes Events sink: an Event per temporary problem and per condition transition.

``involvedObject`` is the Node (``apiVersion: v1``, kind, name, uid) so ``kubectl describe node``
and ``kubectl events --for node/<n>`` show them. Warning for problems, Normal for recoveries.

An Event with a ``pod`` (a device fault told to a Pod that holds the device, agent.recovery.holdertell) is
about that Pod instead: ``involvedObject`` is the Pod, ``related`` this Node, and it is written into the
Pod's namespace (``--event-namespace`` is for Node Events only). It is aggregated like a Node Event (its
series is keyed by the Pod too) and rate-limited by its own bucket, keyed by reason and Pod: one busy Pod
cannot use up another's Events, nor the Node's; and its reasons are counted apart from the Node's
(:func:`owner_of`), so a storm of Node reasons never turns it into a ``TooManyReasons`` summary.

Storm control: repeats of the same (type, reason, message) within ``aggregate_window`` seconds
(by the events' own timestamps) update one Event object (``count``, ``lastTimestamp``) instead of
creating new ones, and each such series is patched at most once per ``min_interval`` (the count
keeps accumulating in between). A per-reason token bucket (``burst`` new series, then one per
``refill`` seconds) limits how many distinct Events a reason can create. So an error storm of 100k
lines yields a handful of API writes.

Bounded by value too: a reason is cut to 128 bytes and a message to 1 KiB (:mod:`agent.core.bounds`, the
API's limits for Events). Each *owner* (the condition of a transition, else the temporary rule,
else the source) starts series for at most ``max_reasons`` distinct reasons within
``aggregate_window``; every further event of that owner in the window is counted in one summary
series per owner and type (reason ``TooManyReasons``, its ``count`` says how many), so a storm of
thousands of distinct reasons is a handful of Events too. An event the sink cannot fold (a bug) is
skipped, counted and reported (:meth:`~agent.sinks.worker.SinkWorker.detail`); so is a series whose
write raises anything but an API error: it is dropped, and the others are still written.

Delivery: events taken from the feed are folded into the :class:`~agent.sinks.outbox.Outbox`,
which is saved at most every ``persist_interval`` seconds (and at shutdown); only then is the
publication acknowledged (:meth:`EventSink.acked`), so the kmsg cursor never passes an Event that
is neither delivered nor on disk. An unwritable state directory is reported in
``last_persist_error`` and the sink goes on in memory (still acknowledging). Event names are
deterministic (node name + a hash of type, reason, message and first timestamp), so a create
whose answer was lost and is retried meets 409 AlreadyExists and becomes a PATCH: never a copy.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.adapters.kube import KubeClient, KubeError
from agent.core.bounds import bounded_message, bounded_reason
from agent.core.bus import Publication, SnapshotFeed
from agent.core.durations import format_duration
from agent.core.timefmt import iso
from agent.core.types import Event, PodRef
from agent.sinks.outbox import MAX_SERIES, OUTBOX_FILE, Outbox, Series
from agent.sinks.worker import IDLE, MAX_BACKOFF, RESYNC, STALL, Failure, SinkWorker

log = logging.getLogger(__name__)

COMPONENT = "node-health-agent"
MAX_NAME = 253  # a DNS subdomain
MAX_REASONS = 10  # distinct reasons an owner starts series for within the aggregation window
SUMMARY_REASON = "TooManyReasons"
MAX_BUCKETS = 1024  # reason buckets kept before the full ones are forgotten
PERSIST_INTERVAL = 0.5
WRITES_PER_ROUND = 32  # then the loop takes new events and saves before writing on
FINAL_FLUSH = 2.0  # seconds the last flush at shutdown may start writes in


def event_name(node: str, *, type_: str, reason: str, message: str, first: float, pod: PodRef | None = None) -> str:
    """``<node>.<16 hex>`` (``<pod>.<16 hex>`` for an Event about a Pod, whose hash also covers the node and
    the Pod): the same series always gets the same name (a valid DNS subdomain)."""
    parts: tuple[str, ...] = (type_, reason, message, str(round(first * 1e9)))
    if pod is not None:
        parts = (*parts, node, pod.namespace, pod.name)
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    owner = node if pod is None else pod.name
    prefix = owner.lower()[: MAX_NAME - len(digest) - 1].rstrip(".-")
    return f"{prefix}.{digest}" if prefix else digest


def bucket_of(reason: str, pod: PodRef | None) -> str:
    """The rate-limit bucket of an Event: its reason, and for an Event about a Pod, the Pod too."""
    return reason if pod is None else f"{reason}\0{pod.key}"


class ReasonBuckets:
    """One token bucket per reason: ``burst`` tokens, refilled one per ``refill`` seconds.

    Bounded: past ``max_buckets`` reasons, the buckets that have refilled (the same as none) are forgotten."""

    def __init__(self, *, burst: int, refill: float, max_buckets: int = MAX_BUCKETS) -> None:
        self._burst = float(burst)
        self._refill = refill
        self._max = max_buckets
        self._tokens: dict[str, tuple[float, float]] = {}  # reason -> (tokens, at)

    def __len__(self) -> int:
        return len(self._tokens)

    def _level(self, reason: str, now: float) -> float:
        tokens, since = self._tokens.get(reason, (self._burst, now))
        return min(self._burst, tokens + max(0.0, now - since) / self._refill)

    def take(self, reason: str, now: float) -> bool:
        tokens = self._level(reason, now)
        if reason not in self._tokens and len(self._tokens) >= self._max:
            self._tokens = {r: v for r, v in self._tokens.items() if self._level(r, now) < self._burst}
        if tokens < 1:
            self._tokens[reason] = (tokens, now)
            return False
        self._tokens[reason] = (tokens - 1, now)
        return True


class ReasonWindow:
    """Which reasons each owner may start series for: at most ``limit`` distinct ones seen within ``window``
    seconds (by the events' own timestamps). Memory: ``limit`` reasons per owner."""

    def __init__(self, *, limit: int, window: float) -> None:
        self._limit = limit
        self._window = window
        self._seen: dict[str, dict[str, float]] = {}  # owner -> reason -> last seen

    def admit(self, owner: str, reason: str, at: float) -> bool:
        seen = self._seen.setdefault(owner, {})
        if reason not in seen and len(seen) >= self._limit:
            for old in [r for r, last in seen.items() if last < at - self._window]:
                del seen[old]
            if len(seen) >= self._limit:
                return False
        seen[reason] = max(at, seen.get(reason, at))
        return True


def owner_of(event: Event) -> str:
    """Whose reasons an event's reason counts among: its condition's, else its rule's, else its source's; an
    Event about a Pod counts among that owner's pod Events (the Node's many reasons never crowd them out)."""
    owner = event.condition or event.rule or event.source
    return owner if event.pod is None else f"{owner} (pods)"


class EventSink(SinkWorker):
    """The ``event_sink`` component."""

    name = "event_sink"

    def __init__(
        self,
        *,
        client: KubeClient,
        feed: SnapshotFeed,
        node_name: str,
        state_dir: Path | None,
        namespace: str = "default",
        aggregate_window: float = 600.0,
        min_interval: float = 30.0,
        burst: int = 10,
        refill: float = 300.0,
        max_reasons: int = MAX_REASONS,
        persist_interval: float = PERSIST_INTERVAL,
        max_series: int = MAX_SERIES,
        resync: float = RESYNC,
        max_backoff: float = MAX_BACKOFF,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
        rng: Callable[[], float] = random.random,
        stall: float = STALL,
    ) -> None:
        """``state_dir`` None keeps the outbox in memory only."""
        super().__init__(
            feed=feed,
            clock=clock,
            monotonic=monotonic,
            wait=wait,
            resync=resync,
            max_backoff=max_backoff,
            rng=rng,
            stall=stall,
        )
        self._client = client
        self._node = node_name
        self._namespace = namespace
        self._window = aggregate_window
        self._min_interval = min_interval
        self._persist_interval = persist_interval
        self._buckets = ReasonBuckets(burst=burst, refill=refill)
        self._reasons = ReasonWindow(limit=max_reasons, window=aggregate_window)
        self._max_reasons = max_reasons
        self.outbox = Outbox(path=None if state_dir is None else Path(state_dir) / OUTBOX_FILE, max_series=max_series)
        self._node_uid: str | None = None
        self._index = 0  # the feed's index after the last event taken
        self._folded = 0  # newest publication whose events are in the outbox
        self._acked = 0
        self._unsaved = False  # the outbox changed since it was saved
        self._unsaved_events = False  # ... by events taken from the feed (the ack waits for the save)
        self._next_save = float("-inf")  # monotonic
        self.throttled = 0  # events that would have started a series, refused by the reason's bucket
        self.summarized = 0  # events counted in their owner's TooManyReasons summary
        self.lost = 0  # events the feed's backlog lost before we took them
        self.last_persist_error: str | None = None

    def acked(self) -> int:
        """The newest publication whose events are delivered or durably in the outbox."""
        return self._acked

    @property
    def overflowed(self) -> int:
        """Series dropped undelivered because the outbox was full."""
        return self.outbox.dropped

    def pending(self) -> int:
        """Series with occurrences the server does not have yet."""
        return sum(1 for s in self.outbox if s.pending)

    # ---- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        loaded = self.outbox.load()
        if loaded:
            log.info("Event outbox: %d series loaded from %s", loaded, self.outbox.path)
        super().run(stop)

    def take(self, pub: Publication) -> None:
        events, self._index, lost = self._feed.events_since(self._index)
        if lost:
            self.lost += lost
            log.warning("the Event sink fell behind: %d events lost from the feed's backlog", lost)
        now = self._clock()
        for event in events:
            try:
                self._fold(event, now)
            except Exception as exc:  # one bad event must not stop the others (nor be taken again forever)
                self.unexpected(exc, what=f"folding an Event {event.reason[:80]!r}")
        self._node_uid = pub.snapshot.node_uid or self._node_uid
        self._folded = pub.number
        if events:
            self._unsaved = True
            durable = self.outbox.path is not None and self.last_persist_error is None
            self._unsaved_events = durable  # in memory only: nothing to wait for
        if not self._unsaved_events:
            self._acked = pub.number

    def work(self, now: float) -> float:
        if self._unsaved and now >= self._next_save:
            self._save(now)
        if not self.in_backoff(now):
            self._flush(now, limit=WRITES_PER_ROUND)
        return self._next_wake(now)

    def finish(self, now: float) -> None:
        if self._unsaved:
            self._save(now)
        if not self.in_backoff(now):
            self._flush(now, final=True, until=self._monotonic() + FINAL_FLUSH)
        if self._unsaved:
            self._save(now)

    # ---- folding and saving --------------------------------------------------------------------

    def _fold(self, event: Event, now: float) -> None:
        reason, message = bounded_reason(event.reason), bounded_message(event.message)
        owner = owner_of(event)
        if not self._reasons.admit(owner, reason, event.timestamp):
            self.summarized += 1
            if self.summarized == 1 or self.summarized % 1000 == 0:
                log.warning(
                    "%s: more than %d distinct Event reasons within %s; the rest are counted in one %s Event "
                    "(%d so far, latest %s)",
                    owner,
                    self._max_reasons,
                    format_duration(self._window),
                    SUMMARY_REASON,
                    self.summarized,
                    reason,
                )
            reason = SUMMARY_REASON
            message = bounded_message(
                f"{owner}: more Events with reasons other than the {self._max_reasons} shown within "
                f"{format_duration(self._window)}; this Event's count says how many"
            )
        pod = event.pod
        series = self.outbox.current((event.type, reason, message, pod.key if pod else ""))
        if series is not None and event.timestamp - series.last <= self._window:
            series.count += 1
            series.last = max(series.last, event.timestamp)
            self.outbox.touch(series)
            return
        if not self._buckets.take(bucket_of(reason, pod), now):
            self.throttled += 1
            return
        name = event_name(self._node, type_=event.type, reason=reason, message=message, first=event.timestamp, pod=pod)
        self.outbox.add(
            Series(
                name=name,
                type=event.type,
                reason=reason,
                message=message,
                first=event.timestamp,
                last=event.timestamp,
                pod=pod,
            )
        )

    def _save(self, now: float) -> None:
        """Save the outbox (or note why not), then acknowledge what was folded."""
        self.outbox.forget(delivered_before=self._clock() - self._window)
        try:
            self.outbox.save()
        except OSError as exc:
            error = f"cannot write {self.outbox.path}: {exc.strerror or exc}"
            if error != self.last_persist_error:
                log.error("Event outbox: %s (going on in memory)", error)
            self.last_persist_error = error
            self._next_save = now + max(self._persist_interval, self.resync)
        else:
            if self.last_persist_error is not None:
                log.info("Event outbox: %s can be written again", self.outbox.path)
            self.last_persist_error = None
            self._unsaved = False
            self._next_save = now + self._persist_interval
        self._unsaved_events = False
        self._acked = self._folded

    def _next_wake(self, now: float) -> float:
        wake = IDLE
        if self._unsaved:
            wake = min(wake, self._next_save - now)
        for series in self.outbox:
            if not series.pending:
                continue
            if self.in_backoff(now):
                return min(wake, self.retry_in(now))
            wake = min(wake, series.last_write + self._min_interval - now if series.created else 0.0)
        return max(0.0, wake)

    # ---- writing -------------------------------------------------------------------------------

    def _flush(self, now: float, *, final: bool = False, limit: int | None = None, until: float | None = None) -> None:
        """Write the due series in order until a transient failure, ``limit`` writes or ``until``."""
        writes = 0
        for series in self.outbox:
            if not series.pending or (series.created and not final and now - series.last_write < self._min_interval):
                continue
            if (limit is not None and writes >= limit) or (until is not None and self._monotonic() >= until):
                return
            writes += 1
            if not self._deliver(series, now):
                return

    def _deliver(self, series: Series, now: float) -> bool:
        """One series' write; False after a transient failure (writes stop until the backoff ends)."""
        count, last = series.count, series.last
        self.beat()
        try:
            self._send(series, count=count, last=last, now=now)
        except KubeError as exc:
            about = f"pod {series.pod.key}" if series.pod else f"node {self._node}"
            what = f"Event {series.reason} for {about} ({self._namespace_of(series)}/{series.name})"
            if self.failed(exc, what=what, now=now) is Failure.TRANSIENT:
                return False
        except Exception as exc:  # dropped like a refused write: the series behind it must still go out
            self.unexpected(exc, what=f"writing Event {series.reason!r} ({series.name})")
        else:
            self.succeeded()
            series.created = True
        series.written_count = count  # written, or dropped for good after a permanent error
        series.last_write = now
        self._unsaved = True
        return True

    def _send(self, series: Series, *, count: int, last: float, now: float) -> None:
        if series.created:
            try:
                self._patch(series, count=count, last=last)
                return
            except KubeError as exc:
                if exc.status != 404:
                    raise
                what = f"patch of Event {self._namespace_of(series)}/{series.name}"
                self.failed(exc, what=what, now=now, gone_on_404=True)
                series.created = False
        try:
            self._client.create_event(self._namespace_of(series), self._body(series, count=count, last=last))
        except KubeError as exc:
            if not exc.already_exists:
                raise
            self._patch(series, count=count, last=last)  # an earlier create was stored; its answer was lost

    def _namespace_of(self, series: Series) -> str:
        """Where the series' Event lives: its Pod's namespace, or --event-namespace for the Node's."""
        return series.pod.namespace if series.pod else self._namespace

    def _patch(self, series: Series, *, count: int, last: float) -> None:
        self._client.patch_event(
            self._namespace_of(series),
            series.name,
            {"count": count, "lastTimestamp": iso(last), "message": series.message},
        )

    def _node_ref(self) -> dict[str, str]:
        node = {"apiVersion": "v1", "kind": "Node", "name": self._node}
        if self._node_uid:
            node["uid"] = self._node_uid
        return node

    def _body(self, series: Series, *, count: int, last: float) -> dict:
        about: dict[str, dict[str, str]] = {"involvedObject": self._node_ref()}
        if series.pod is not None:
            pod = {"apiVersion": "v1", "kind": "Pod", "namespace": series.pod.namespace, "name": series.pod.name}
            if series.pod.uid:
                pod["uid"] = series.pod.uid
            about = {"involvedObject": pod, "related": self._node_ref()}
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": series.name, "namespace": self._namespace_of(series)},
            **about,
            "reason": series.reason,
            "message": series.message,
            "type": series.type,
            "count": count,
            "firstTimestamp": iso(series.first),
            "lastTimestamp": iso(last),
            "source": {"component": COMPONENT, "host": self._node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._node,
        }
