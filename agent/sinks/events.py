"""Kubernetes Events sink: an Event per temporary problem and per condition transition.

``involvedObject`` is the Node (``apiVersion: v1``, kind, name, uid) so ``kubectl describe node``
and ``kubectl events --for node/<n>`` show them. Warning for problems, Normal for recoveries.

Storm control: repeats of the same (type, reason, message) within ``aggregate_window`` update one
Event object (``count``, ``lastTimestamp``) instead of creating new ones, and each such series is
written at most once per ``min_interval`` (the count keeps accumulating in between). A per-reason
token bucket (``burst`` Events, then one per ``refill`` seconds) limits how many distinct Events a
reason can create. So an error storm of 100k lines yields a handful of API writes. ``publish``
only folds events into the bounded series table (O(1) each, so no count is ever lost to a full
queue); a worker thread writes them, and a failing API never blocks detection.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.kube import KubeClient, KubeError
from agent.sinks.log import iso
from agent.types import Event, Snapshot

log = logging.getLogger(__name__)

COMPONENT = "node-health-agent"
MAX_MESSAGE = 1024
MAX_SERIES = 4096


@dataclass(kw_only=True)
class _Series:
    """One aggregated Event object on the server."""

    name: str | None  # None until created
    first: float
    last: float
    count: int  # occurrences so far
    written_count: int  # count the server has
    last_write: float
    event: Event


class EventSink:
    def __init__(
        self,
        *,
        client: KubeClient,
        node_name: str,
        node_uid: Callable[[], str | None],
        namespace: str = "default",
        aggregate_window: float = 600.0,
        min_interval: float = 30.0,
        burst: int = 10,
        refill: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._node = node_name
        self._node_uid = node_uid
        self._namespace = namespace
        self._window = aggregate_window
        self._min_interval = min_interval
        self._burst = burst
        self._refill = refill
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._series: collections.OrderedDict[tuple, _Series] = collections.OrderedDict()
        self._tokens: dict[str, tuple[float, float]] = {}  # reason -> (tokens, last refill time)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-sink", daemon=True)
        self.writes = 0
        self.dropped = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def publish(self, *, events: Sequence[Event], snapshot: Snapshot) -> None:
        if not events:
            return
        with self._lock:
            for event in events:
                self._record(event)
        self._wake.set()

    def close(self, *, timeout: float = 2.0) -> None:
        """Stop after one last flush of pending counts (bounded by ``timeout``)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout)

    def idle(self) -> bool:
        """Every series written as far as the server knows (for tests)."""
        with self._lock:
            return all(s.written_count == s.count for s in self._series.values())

    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            stopping = self._stop.is_set()
            self._flush(final=stopping)
            if stopping:
                return

    def _record(self, event: Event) -> None:
        now = self._clock()
        key = (event.type, event.reason, event.message[:MAX_MESSAGE])
        series = self._series.get(key)
        if series is not None and now - series.last <= self._window:
            series.count += 1
            series.last = now
            series.event = event
            self._series.move_to_end(key)
            return
        if not self._take_token(event.reason, now):
            self.dropped += 1
            return
        self._series[key] = _Series(
            name=None, first=now, last=now, count=1, written_count=0, last_write=0.0, event=event
        )
        self._series.move_to_end(key)
        while len(self._series) > MAX_SERIES:
            self._series.popitem(last=False)

    def _take_token(self, reason: str, now: float) -> bool:
        tokens, since = self._tokens.get(reason, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - since) / self._refill)
        if tokens < 1:
            self._tokens[reason] = (tokens, now)
            return False
        self._tokens[reason] = (tokens - 1, now)
        return True

    def _flush(self, *, final: bool) -> None:
        now = self._clock()
        with self._lock:
            due = [
                (series, series.count, series.last, series.event)
                for series in self._series.values()
                if series.written_count != series.count
                and (series.name is None or final or now - series.last_write >= self._min_interval)
            ]
        for series, count, last, event in due:
            try:
                self._write(series, count=count, last=last, event=event)
            except KubeError as exc:
                self.failures += 1
                log.warning("cannot write Event %s for node %s (will retry): %s", event.reason, self._node, exc)
                return  # keep order; retry on the next flush
            with self._lock:
                series.written_count = count
                series.last_write = now
            self.writes += 1

    def _write(self, series: _Series, *, count: int, last: float, event: Event) -> None:
        if series.name is None:
            name = f"{self._node}.{time.time_ns():x}"
            self._client.create_event(self._namespace, self._body(name, series, count=count, last=last, event=event))
            series.name = name
        else:
            self._client.patch_event(
                self._namespace,
                series.name,
                {"count": count, "lastTimestamp": iso(last), "message": event.message[:MAX_MESSAGE]},
            )

    def _body(self, name: str, series: _Series, *, count: int, last: float, event: Event) -> dict:
        involved = {"apiVersion": "v1", "kind": "Node", "name": self._node}
        uid = self._node_uid()
        if uid:
            involved["uid"] = uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": self._namespace},
            "involvedObject": involved,
            "reason": event.reason,
            "message": event.message[:MAX_MESSAGE],
            "type": event.type,
            "count": count,
            "firstTimestamp": iso(series.first),
            "lastTimestamp": iso(last),
            "source": {"component": COMPONENT, "host": self._node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._node,
        }
