"""Node conditions sink: keeps the Node's conditions for our types equal to the latest snapshot.

- Only our own condition types are written, with a strategic-merge PATCH of
  ``nodes/{name}/status`` (merge key ``type``), so kubelet's conditions are never touched.
- Nothing is written before a snapshot with ``seeded`` set (the state adopted the Node's existing
  conditions or our state dir), so a restart neither resets a problem to healthy nor moves
  ``lastTransitionTime``.
- Leading-edge coalescing: the first change after a quiet period is written at once; changes
  within ``coalesce`` seconds of a write merge into one write at the end of that window.
- A heartbeat re-sends every condition ``heartbeat`` to ``heartbeat * (1 + jitter)`` seconds after
  the last write (one-sided jitter: never more often); the first one ``heartbeat`` to ``2 * heartbeat``
  after the first write, so agents started together do not beat together (no pulse at the API server).
- Failures are handled by :class:`~agent.sinks.worker.SinkWorker`: transient ones are retried with
  backoff (never sooner than ``resync`` nor the server's ``Retry-After``); a permanent one drops
  that write until the next change or heartbeat.
- Reasons and messages are cut to the limits of :mod:`agent.core.bounds` (128 and 1024 bytes), as every
  sink cuts them.
- With a ``detection`` histogram, each problem the sink writes for the first time (a condition turned
  True after the first seeded snapshot) is observed as the seconds from its transition time (the
  kernel line's time for a log rule) to the successful write: time to detect, as the Node shows it.
- Condition types in ``delete_types`` (removed from the configuration) are deleted from the Node
  with ``$patch: delete`` in the first successful write; nothing else is ever deleted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from agent.adapters.kube import KubeClient, KubeError
from agent.core.bounds import bounded_message, bounded_reason
from agent.core.bus import Publication, SnapshotFeed
from agent.core.latency import Histogram
from agent.core.state import AGGREGATE_TYPE
from agent.core.timefmt import iso
from agent.core.types import Condition, Snapshot, Status, reserved_condition
from agent.sinks.worker import IDLE, MAX_BACKOFF, RESYNC, STALL, Failure, SinkWorker


def condition_dict(cond: Condition, *, heartbeat: str) -> dict[str, str]:
    """A condition as the Node keeps it: reason and message cut as every sink cuts them (:mod:`agent.core.bounds`)."""
    return {
        "type": cond.type,
        "status": cond.status.value,
        "reason": bounded_reason(cond.reason),
        "message": bounded_message(cond.message),
        "lastTransitionTime": iso(cond.last_transition),
        "lastHeartbeatTime": heartbeat,
    }


def writable(type_: str, *, aggregate: bool) -> bool:
    """Whether the sink may write (or delete) condition type ``type_``: never a type others own, except
    AcceleratedHardwareReady when it is the agent's own aggregate."""
    return reserved_condition(type_) is None or (aggregate and type_ == AGGREGATE_TYPE)


def patch_body(snapshot: Snapshot, *, now: float, delete_types: Sequence[str] = (), aggregate: bool = False) -> dict:
    """The status patch for ``snapshot``'s conditions, stamped with heartbeat time ``now`` (wall).

    A condition of a type others own (kubelet's ``Ready``, ...) is left out whatever the state holds:
    configuration refuses such types, and this is the last line of that defence."""
    heartbeat = iso(now)
    conditions: list[dict] = [
        condition_dict(c, heartbeat=heartbeat) for c in snapshot.conditions if writable(c.type, aggregate=aggregate)
    ]
    conditions.extend({"type": t, "$patch": "delete"} for t in delete_types if writable(t, aggregate=False))
    return {"status": {"conditions": conditions}}


def _key(snapshot: Snapshot) -> tuple:
    return tuple((c.type, c.status, c.reason, c.message, int(c.last_transition)) for c in snapshot.conditions)


def _problems(snapshot: Snapshot) -> set[tuple[str, float]]:
    """(type, transition time) of every problem in ``snapshot`` (the aggregate is derived, not detected)."""
    return {
        (c.type, c.last_transition) for c in snapshot.conditions if c.status is Status.TRUE and c.type != AGGREGATE_TYPE
    }


class ConditionSink(SinkWorker):
    """The ``condition_sink`` component."""

    name = "condition_sink"

    def __init__(
        self,
        *,
        client: KubeClient,
        feed: SnapshotFeed,
        node_name: str,
        heartbeat: float = 300.0,
        jitter: float = 0.1,
        coalesce: float = 0.2,
        resync: float = RESYNC,
        max_backoff: float = MAX_BACKOFF,
        delete_types: Sequence[str] = (),
        aggregate: bool = False,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
        rng: Callable[[], float] = random.random,
        stall: float = STALL,
        detection: Histogram | None = None,
    ) -> None:
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
        self._heartbeat = heartbeat
        self._jitter = jitter
        self._coalesce = coalesce
        self._rng = rng
        self._pending_deletes = tuple(delete_types)
        self._aggregate = aggregate  # AcceleratedHardwareReady is ours (the aggregate) and may be written
        self._latest: Snapshot | None = None  # newest seeded snapshot
        self._written: tuple | None = None  # key of the snapshot the Node has
        self._handled: tuple | None = None  # key of the snapshot last written or dropped
        self._last_attempt = float("-inf")  # monotonic
        self._next_heartbeat = float("-inf")  # monotonic
        self._detection = detection
        self._reported: set[tuple[str, float]] | None = None  # problems (type, since) already on the Node

    @property
    def in_sync(self) -> bool:
        """The Node has the conditions of the newest seeded snapshot."""
        latest = self._latest
        return latest is not None and self._written == _key(latest)

    def take(self, pub: Publication) -> None:
        if pub.snapshot.seeded:
            self._latest = pub.snapshot
            if self._reported is None:  # what the Node or the state directory held before this run
                self._reported = _problems(pub.snapshot)

    def work(self, now: float) -> float:
        latest = self._latest
        if latest is None:
            return IDLE
        if _key(latest) == self._handled and now < self._next_heartbeat:
            return self._next_heartbeat - now
        not_before = max(self._last_attempt + self._coalesce, now + self.retry_in(now))
        if now < not_before:
            return not_before - now
        self._write(latest, now)
        return 0.0

    def finish(self, now: float) -> None:
        latest = self._latest
        if latest is not None and _key(latest) != self._handled and not self.in_backoff(now):
            self._write(latest, now)

    def _write(self, snapshot: Snapshot, now: float) -> None:
        key = _key(snapshot)
        body = patch_body(snapshot, now=self._clock(), delete_types=self._pending_deletes, aggregate=self._aggregate)
        self._last_attempt = now
        self.beat()
        try:
            self._client.patch_node_status(self._node, body)
        except KubeError as exc:
            if self.failed(exc, what=f"update of node {self._node} conditions", now=now) is Failure.PERMANENT:
                self._handled = key  # dropped: the next change or heartbeat tries again
                self._schedule_heartbeat(now)
            return
        self.succeeded()
        self._observe(snapshot)
        self._pending_deletes = ()
        self._written = self._handled = key
        self._schedule_heartbeat(now)

    def _observe(self, snapshot: Snapshot) -> None:
        problems = _problems(snapshot)
        if self._detection is not None and self._reported is not None:
            written = self._clock()
            for _, since in problems - self._reported:
                self._detection.observe(written - since)
        self._reported = problems

    def _schedule_heartbeat(self, now: float) -> None:
        # The first heartbeat comes one to two periods after the first write, anywhere in between: agents
        # that start together (a rollout, a node pool created at once) then beat at spread-out phases. With
        # only the one-sided jitter they would beat together, hours on: a pulse of writes at the API server.
        spread = 1.0 if self._next_heartbeat == float("-inf") else self._jitter
        self._next_heartbeat = now + self._heartbeat * (1 + spread * self._rng())
