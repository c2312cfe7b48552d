"""Node conditions sink: keeps the Node's conditions for our types equal to the latest snapshot.

- Only our own condition types are written, with a strategic-merge PATCH of
  ``nodes/{name}/status`` (merge key ``type``), so kubelet's conditions are never touched.
- Nothing is written before a snapshot with ``seeded`` set (the state adopted the Node's existing
  conditions or our state dir), so a restart neither resets a problem to healthy nor moves
  ``lastTransitionTime``.
- Leading-edge coalescing: the first change after a quiet period is written at once; changes
  within ``coalesce`` seconds of a write merge into one write at the end of that window.
- A heartbeat re-sends every condition at the node's own phase of a cycle of ``heartbeat * (1 + jitter)``
  seconds: at the first anchor (the phase, then every cycle on the monotonic clock) at least ``heartbeat``
  after the last write. So never sooner than ``heartbeat`` after a write, one cycle apart when nothing
  changes, at most ``heartbeat`` plus a cycle after a change. The phase is a stable hash of the node name,
  not the time of a write: the nodes of a fleet beat at spread phases, and a write every node makes at one
  instant (agents started together, a rule misfiring everywhere, the API server back after an outage, a
  rollout changing a condition) does not bring their next heartbeats together (no pulse at the API server).
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

import hashlib
import math
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


def phase(node_name: str, cycle: float) -> float:
    """The node's heartbeat phase in ``[0, cycle)``: a stable hash of its name (the same in every run and
    process, unlike ``hash()``), so the nodes of a fleet get phases spread evenly over the cycle."""
    digest = hashlib.blake2b(node_name.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / 2**53 * cycle  # 53 bits: exact as a float, below 1


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
        if not (0 < heartbeat < math.inf and 0 < jitter < 1):  # also refuses NaN
            raise ValueError(
                f"need heartbeat > 0 and 0 < jitter < 1 (the cycle must be longer than the heartbeat), "
                f"got heartbeat={heartbeat!r}, jitter={jitter!r}"
            )
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
        self._cycle = heartbeat * (1 + jitter)
        self._phase = phase(node_name, self._cycle)
        self._coalesce = coalesce
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
        # The first anchor at least a heartbeat after this write. Anchored to the node's phase, not to the
        # write: a write every node makes at one instant (agents started together, a misfire everywhere, the
        # API server back) would otherwise bring their next heartbeats together, a pulse at the API server
        # that jitter relative to the write undoes only slowly (a random walk). The cycle is longer than the
        # heartbeat (by jitter * heartbeat, 30 s by default), so a heartbeat or a change written a little
        # after an anchor still beats at the next one; with no margin it would skip a whole cycle.
        cycles = math.ceil((now + self._heartbeat - self._phase) / self._cycle)
        self._next_heartbeat = self._phase + cycles * self._cycle
