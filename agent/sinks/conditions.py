"""Node conditions sink: keeps the Node's conditions for our types equal to the state.

- Only our own condition types are written, with a strategic-merge PATCH of
  ``nodes/{name}/status`` (merge key ``type``), so kubelet's conditions are never touched.
- Coalesced: a burst of state changes becomes one PATCH (``coalesce`` seconds after the first
  change); a heartbeat re-sends every condition every ``heartbeat`` seconds (jittered so a fleet
  does not pulse); a failed sync is retried with backoff (tenacity) and then every ``resync``
  seconds until it succeeds. Detection never waits: ``publish`` only stores the snapshot.
- Before its first write it reads the Node (``seed``) so a restart neither resets a problem to
  healthy nor moves ``lastTransitionTime``.
- Condition types named in ``delete_types`` (removed from the configuration) are deleted from the
  Node with ``$patch: delete`` once; nothing else is ever deleted.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from agent.kube import KubeClient, KubeError
from agent.sinks.log import iso
from agent.types import Condition, Event, Severity, Snapshot, Status

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024


def condition_dict(cond: Condition, *, heartbeat: str) -> dict[str, str]:
    message = cond.message if len(cond.message) <= MAX_MESSAGE else cond.message[: MAX_MESSAGE - 3] + "..."
    return {
        "type": cond.type,
        "status": cond.status.value,
        "reason": cond.reason,
        "message": message,
        "lastTransitionTime": iso(cond.last_transition),
        "lastHeartbeatTime": heartbeat,
    }


def patch_body(snapshot: Snapshot, *, now: float, delete_types: Sequence[str] = ()) -> dict:
    heartbeat = iso(now)
    conditions: list[dict] = [condition_dict(c, heartbeat=heartbeat) for c in snapshot.conditions]
    conditions.extend({"type": t, "$patch": "delete"} for t in delete_types)
    return {"status": {"conditions": conditions}}


def parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def node_conditions(
    node: dict, *, types: Sequence[str], severity: Callable[[str, str], Severity], now: float
) -> list[Condition]:
    """Our condition types as found on a Node object (for seeding the state after a restart)."""
    found = []
    for raw in (node.get("status") or {}).get("conditions") or []:
        if raw.get("type") not in types:
            continue
        try:
            status = Status(raw.get("status"))
        except ValueError:
            continue
        transition = parse_time(raw.get("lastTransitionTime")) or now
        found.append(
            Condition(
                type=raw["type"],
                status=status,
                reason=raw.get("reason") or "",
                message=raw.get("message") or "",
                last_transition=transition,
                last_update=parse_time(raw.get("lastHeartbeatTime")) or now,
                severity=severity(raw["type"], raw.get("reason") or "") if status is Status.TRUE else Severity.INFO,
            )
        )
    return found


def _key(snapshot: Snapshot) -> tuple:
    return tuple((c.type, c.status, c.reason, c.message, int(c.last_transition)) for c in snapshot.conditions)


class ConditionSink:
    def __init__(
        self,
        *,
        client: KubeClient,
        node_name: str,
        heartbeat: float = 300.0,
        jitter: float = 0.1,
        coalesce: float = 0.2,
        resync: float = 10.0,
        delete_types: Sequence[str] = (),
        seed: Callable[[list[dict]], threading.Event] | None = None,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        retry_attempts: int = 5,
        retry_max_wait: float = 5.0,
    ) -> None:
        """``seed`` (when given) receives the Node's raw conditions before the first write and returns
        an event set once the state has adopted them; without it the caller seeded the state already."""
        self._client = client
        self._node = node_name
        self._heartbeat = heartbeat
        self._jitter = jitter
        self._coalesce = coalesce
        self._resync = resync
        self._pending_deletes = tuple(delete_types)
        self._seed = seed
        self._clock = clock
        self._rng = rng
        self._retry_attempts = retry_attempts
        self._retry_max_wait = retry_max_wait
        self._lock = threading.Lock()
        self._latest: Snapshot | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._written: tuple | None = None
        self._next_heartbeat = 0.0
        self._thread = threading.Thread(target=self._run, name="condition-sink", daemon=True)
        self.patches = 0  # successful PATCHes (for metrics and tests)
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def publish(self, *, events: Sequence[Event], snapshot: Snapshot) -> None:
        with self._lock:
            changed = self._latest is None or _key(self._latest) != _key(snapshot)
            self._latest = snapshot
        if changed:
            self._wake.set()

    def close(self, *, timeout: float = 2.0) -> None:
        """Stop; one last attempt to write pending changes, bounded by ``timeout``."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout)

    @property
    def in_sync(self) -> bool:
        with self._lock:
            return self._latest is not None and self._written == _key(self._latest)

    def _run(self) -> None:
        if self._seed is not None and not self._seed_from_node():
            return
        while True:
            now = self._clock()
            # Wake at least every second so an injected clock's heartbeat deadline is noticed too.
            timeout = max(0.0, min(self._next_heartbeat - now, self._resync if not self.in_sync else 1.0, 1.0))
            self._wake.wait(timeout=timeout if self._written is not None else 0)
            self._wake.clear()
            if self._stop.is_set():
                if not self.in_sync:
                    self._sync(final=True)
                return
            if self._coalesce:
                self._stop.wait(self._coalesce)  # let a burst of changes settle into one PATCH
            due = self._clock() >= self._next_heartbeat
            if due or not self.in_sync:
                self._sync(final=False)

    def _seed_from_node(self) -> bool:
        delay = 0.5
        while not self._stop.is_set():
            try:
                node = self._client.get_node(self._node)
            except KubeError as exc:
                log.warning("cannot read node %s before writing conditions (retrying): %s", self._node, exc)
                self._stop.wait(delay)
                delay = min(delay * 2, self._resync)
                continue
            done = self._seed(list((node.get("status") or {}).get("conditions") or []))  # type: ignore[misc]
            while not done.wait(0.1):
                if self._stop.is_set():
                    return False
            return True
        return False

    def _sync(self, *, final: bool) -> None:
        with self._lock:
            snapshot = self._latest
        if snapshot is None:
            return
        now = self._clock()
        body = patch_body(snapshot, now=now, delete_types=self._pending_deletes)
        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, KubeError) and e.transient),
            wait=wait_exponential_jitter(multiplier=0.2, max=self._retry_max_wait, jitter=0.1),
            stop=stop_after_attempt(1 if final else self._retry_attempts),
            sleep=lambda seconds: self._stop.wait(seconds),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    self._client.patch_node_status(self._node, body)
        except (KubeError, RetryError) as exc:
            self.failures += 1
            level = logging.ERROR if isinstance(exc, KubeError) and not exc.transient else logging.WARNING
            log.log(level, "cannot update node %s conditions (will retry in %.0fs): %s", self._node, self._resync, exc)
            return
        self.patches += 1
        self._pending_deletes = ()
        with self._lock:
            self._written = _key(snapshot)
        # One-sided jitter: never more often than the heartbeat, so writes per hour stay <= 3600/heartbeat.
        period = self._heartbeat * (1 + self._jitter * self._rng())
        self._next_heartbeat = now + period
