"""Drain: move a cordoned node's pods off through the Eviction API, within bounds.

One :meth:`Drainer.run` lists the node's pods again and again (every ``poll`` seconds while it waits)
and carries on from what it finds, so a drain stopped halfway (agent restart, SIGTERM) is resumed
by simply running it again: a pod already leaving (``metadata.deletionTimestamp`` set, by our
eviction or anyone's) is waited for and never evicted again.

* Skipped (left on the node, not waited for): DaemonSet pods, mirror (static) pods, pods that
  already ended (Succeeded/Failed).
* Protected: a pod annotated ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` is never
  evicted and never deleted, whatever ``on_deadline`` says. The drain waits for it to leave on its
  own (a Job finishing) until its per-pod deadline, then reports it and leaves it there.
* Evicted: a 429 (a PodDisruptionBudget forbids it now) is retried with backoff (never sooner than
  ``Retry-After``) until the pod's deadline (``pod_deadline`` after this run first tried it). Then
  ``OnDeadline.REPORT`` leaves the pod and reports it; ``OnDeadline.DELETE`` deletes it (bypassing
  the budget). A 404 means the pod is already gone.
* After an eviction (or deletion) the pod keeps running until its kubelet confirms termination:
  the drain waits for it to disappear, at most ``wait_for_deletion``; a pod still there then is
  reported and counted in ``remaining``.
* ``evictions_per_second`` caps eviction and delete requests (retries included) over the drain.
* No answer from the API server (an outage) is retried with backoff until the total ``timeout``.
  Another answer that is not worth retrying (403, 400, ...) fails that pod; the drain goes on with
  the others and ends "failed".

``report(reason, message)`` is called for a few outcome Events: ``DrainStarted`` once the pods are
known, at most one per pod (``DrainPodDeadline``, ``DrainPodFailed``) and one at the end
(``DrainSucceeded``, ``DrainIncomplete``, ``DrainTimeout``, ``DrainFailed``; none when stopped).
The per-pod deadline and the total timeout count from the start of each run.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent.adapters.kube import KubeError
from agent.core.backoff import Backoff
from agent.recovery.model import MIRROR_POD_ANNOTATION, SAFE_TO_EVICT_ANNOTATION, DrainSettings, OnDeadline

log = logging.getLogger(__name__)

POLL = 2.0  # seconds between listings while pods are leaving or protected
STOP_CHECK = 1.0  # the longest single sleep: a stop is noticed within this
POD_RETRY = (5.0, 30.0)  # backoff (initial, maximum) for a pod whose eviction was refused (PDB)
API_RETRY = (1.0, 30.0)  # backoff (initial, maximum) while the API server does not answer


class DrainClient(Protocol):
    """The part of :class:`agent.adapters.kube.KubeClient` a drain uses."""

    def list_pods_on_node(self, node_name: str) -> list[dict[str, Any]]: ...

    def evict_pod(self, namespace: str, name: str, *, grace_period: int | None = None) -> dict[str, Any]: ...

    def delete_pod(self, namespace: str, name: str, *, grace_period: int | None = None) -> dict[str, Any]: ...


class DrainOutcome(enum.StrEnum):
    DONE = "done"  # every pod to move has left
    DEADLINE = "deadline"  # some pods could not leave in time (PDB, safe-to-evict=false, kubelet slow)
    TIMEOUT = "timeout"  # the whole drain ran out of time
    STOPPED = "stopped"  # asked to stop; running the drain again resumes it
    FAILED = "failed"  # the API refused something for good (e.g. 403 on evictions)


class DrainReport(enum.StrEnum):
    """The ``report`` kinds (usable as Event reasons)."""

    STARTED = "DrainStarted"
    POD_DEADLINE = "DrainPodDeadline"
    POD_FAILED = "DrainPodFailed"
    SUCCEEDED = "DrainSucceeded"
    INCOMPLETE = "DrainIncomplete"
    TIMEOUT = "DrainTimeout"
    FAILED = "DrainFailed"


_END_REPORT = {
    DrainOutcome.DONE: DrainReport.SUCCEEDED,
    DrainOutcome.DEADLINE: DrainReport.INCOMPLETE,
    DrainOutcome.TIMEOUT: DrainReport.TIMEOUT,
    DrainOutcome.FAILED: DrainReport.FAILED,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class SkippedPod:
    pod: str  # namespace/name
    why: str  # "DaemonSet" | "mirror pod" | "Succeeded" | "Failed"


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainResult:
    """What one run did: pods evicted and deleted by it, pods skipped, pods still on the node that
    should have left (``remaining``; the message says why for each)."""

    outcome: DrainOutcome
    evicted: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    skipped: tuple[SkippedPod, ...] = ()
    remaining: tuple[str, ...] = ()
    message: str = ""


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def skip_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a drain leaves this pod alone, or None when it has to leave the node."""
    meta = pod.get("metadata") or {}
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return "DaemonSet"
    if MIRROR_POD_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror pod"
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return phase
    return None


def protected(pod: Mapping[str, Any]) -> bool:
    """Annotated ``safe-to-evict: "false"``: never evicted nor deleted by a drain."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(SAFE_TO_EVICT_ANNOTATION, "")).strip().lower() == "false"


@dataclass(frozen=True, kw_only=True, slots=True)
class Drainer:
    """Drains ``node_name``; every :meth:`run` starts from what the API says now.

    ``clock``: monotonic seconds. ``sleep(seconds)``: the wait (None = wait on the run's ``stop``
    event); the drain never sleeps longer than ``STOP_CHECK`` at once, so a stop is prompt either
    way. ``rng`` spreads the retry delays (jitter)."""

    client: DrainClient
    node_name: str
    settings: DrainSettings
    clock: Callable[[], float]
    report: Callable[[str, str], None]
    sleep: Callable[[float], object] | None = None
    poll: float = POLL
    rng: Callable[[], float] = random.random
    # a device drain (agent.recovery.deviceactions): only these pods ("namespace/name") move; others are
    # never touched nor reported; the node is not cordoned for it
    only: frozenset[str] | None = None

    def run(self, stop: threading.Event) -> DrainResult:
        return _Run(self, stop).run()


# ---- one run -----------------------------------------------------------------------------------


class _State(enum.Enum):
    EVICT = "evict"  # to be evicted (retried until its deadline)
    DELETE = "delete"  # past its deadline under OnDeadline.DELETE: to be deleted
    PROTECTED = "protected"  # safe-to-evict=false: waiting for it to leave on its own
    LEAVING = "leaving"  # deletionTimestamp set (or our eviction/deletion accepted): waiting for it to go
    GIVEN_UP = "given up"  # reported; stays on the node
    FAILED = "failed"  # the API refused it for good


_PENDING = (_State.EVICT, _State.DELETE, _State.PROTECTED, _State.LEAVING)


@dataclass(slots=True)
class _Pod:
    """A pod this run wants off the node (mutable bookkeeping, private to the run)."""

    key: str
    namespace: str
    name: str
    first_seen: float
    state: _State
    backoff: Backoff
    next_try: float = 0.0
    leaving_since: float = 0.0
    why: str = ""  # why it is still there (for messages)
    reported: bool = False  # its one per-pod report is out


class _Run:
    """One run of a drain: the bookkeeping lives as long as the run."""

    def __init__(self, drainer: Drainer, stop: threading.Event) -> None:
        self.drainer = drainer
        self.stop = stop
        self.pods: dict[str, _Pod] = {}  # by uid: the pods to move that are still on the node
        self.skipped: dict[str, str] = {}  # namespace/name -> why, as last listed
        self.evicted: list[str] = []
        self.deleted: list[str] = []
        self.started = False
        self.next_slot = 0.0  # the rate cap: no eviction or deletion before this
        self.end = drainer.clock() + drainer.settings.timeout
        self.api_backoff = Backoff(initial=API_RETRY[0], maximum=API_RETRY[1], jitter=0.1, rng=drainer.rng)

    def run(self) -> DrainResult:
        d = self.drainer
        while True:
            if self.stop.is_set():
                return self.finish(DrainOutcome.STOPPED)
            if d.clock() >= self.end:
                return self.finish(DrainOutcome.TIMEOUT)
            try:
                self.observe(d.client.list_pods_on_node(d.node_name))
                if self.settled():
                    return self.finish(self.settled_outcome())
                self.act()
                if self.settled():  # the last pods were given up: nothing to wait for
                    return self.finish(self.settled_outcome())
            except KubeError as exc:  # the listing failed, or no answer to an eviction (see ``remove``)
                if exc.transient:
                    self.api_trouble(exc)
                    continue
                return self.finish(DrainOutcome.FAILED, f"cannot list the pods on {d.node_name}: {exc}")
            self.api_backoff.reset()
            self.pause_until(self.next_wake())

    # ---- what is on the node -------------------------------------------------------------------

    def observe(self, listed: list[dict[str, Any]]) -> None:
        now = self.drainer.clock()
        present: set[str] = set()
        self.skipped = {}
        for pod in listed:
            key, meta = pod_key(pod), pod.get("metadata") or {}
            if self.drainer.only is not None and key not in self.drainer.only:
                continue  # another device's pod, or one on no device: never touched
            why = skip_reason(pod)
            if why is not None:
                self.skipped[key] = why
                continue
            uid = meta.get("uid") or key
            present.add(uid)
            tracked = self.pods.get(uid)
            if tracked is None:
                tracked = self.pods[uid] = _Pod(
                    key=key,
                    namespace=meta.get("namespace") or "default",
                    name=meta.get("name") or "",
                    first_seen=now,
                    state=_State.PROTECTED if protected(pod) else _State.EVICT,
                    backoff=Backoff(initial=POD_RETRY[0], maximum=POD_RETRY[1], jitter=0.1, rng=self.drainer.rng),
                    why="safe-to-evict=false" if protected(pod) else "",
                )
            if meta.get("deletionTimestamp") and tracked.state in (_State.EVICT, _State.DELETE, _State.PROTECTED):
                self.leaving(tracked, now)
        for uid in [u for u in self.pods if u not in present]:
            del self.pods[uid]  # gone (or ended, or now skipped): nothing left to do for it
        if not self.started:
            self.started = True
            what = "node" if self.drainer.only is None else f"{len(self.drainer.only)} device holder pods of node"
            self.say(
                DrainReport.STARTED,
                f"draining {what} {self.drainer.node_name}: {len(self.pods)} pods to move, {len(self.skipped)} left "
                "in place (DaemonSet, mirror or finished pods)",
            )

    def leaving(self, pod: _Pod, now: float) -> None:
        pod.state, pod.leaving_since, pod.why = _State.LEAVING, now, "terminating"

    # ---- acting --------------------------------------------------------------------------------

    def act(self) -> None:
        s = self.drainer.settings
        for pod in sorted(self.pods.values(), key=lambda p: (p.first_seen, p.key)):
            if self.stop.is_set() or self.drainer.clock() >= self.end:
                return
            now = self.drainer.clock()
            if pod.state is _State.LEAVING and now >= pod.leaving_since + s.wait_for_deletion:
                self.give_up(pod, f"still terminating {s.wait_for_deletion:g}s after it was asked to go")
            elif pod.state is _State.PROTECTED and now >= pod.first_seen + s.pod_deadline:
                self.give_up(pod, f"annotated {SAFE_TO_EVICT_ANNOTATION}=false: never evicted")
            elif pod.state is _State.EVICT and now >= pod.first_seen + s.pod_deadline:
                if s.on_deadline is OnDeadline.DELETE:
                    pod.state, pod.next_try = _State.DELETE, now
                    self.remove(pod, delete=True)
                else:
                    self.give_up(pod, f"not evicted within {s.pod_deadline:g}s ({pod.why or 'eviction refused'})")
            elif pod.state in (_State.EVICT, _State.DELETE) and now >= pod.next_try:
                self.remove(pod, delete=pod.state is _State.DELETE)

    def remove(self, pod: _Pod, *, delete: bool) -> None:
        """One eviction (or deletion) request, within the rate cap."""
        d = self.drainer
        if not self.wait_for_slot():
            return
        try:
            if delete:
                d.client.delete_pod(pod.namespace, pod.name)
            else:
                d.client.evict_pod(pod.namespace, pod.name)
        except KubeError as exc:
            now = d.clock()
            if exc.status == 404:
                pod.state, pod.why = _State.LEAVING, "gone"  # the next listing drops it
                pod.leaving_since = now
            elif exc.status is None:
                raise  # no answer at all: the API server is in trouble; run() backs off and lists again
            elif exc.transient:  # 429: a PodDisruptionBudget forbids it now; 5xx: try this pod again later
                pod.why = "PodDisruptionBudget" if exc.status == 429 else f"HTTP {exc.status}"
                pod.next_try = now + pod.backoff.next_delay(retry_after=exc.retry_after)
                log.debug("drain %s: %s: retrying in %.1fs", d.node_name, exc, pod.next_try - now)
            else:
                pod.state, pod.why = _State.FAILED, str(exc)
                self.say_once(pod, DrainReport.POD_FAILED, f"pod {pod.key} cannot be removed: {exc}")
            return
        now = d.clock()
        if delete:
            self.deleted.append(pod.key)
            self.say_once(
                pod,
                DrainReport.POD_DEADLINE,
                f"pod {pod.key} deleted: not evicted within {d.settings.pod_deadline:g}s "
                f"({pod.why or 'eviction refused'}); its disruption budget was bypassed",
            )
        else:
            self.evicted.append(pod.key)
        self.leaving(pod, now)

    def give_up(self, pod: _Pod, why: str) -> None:
        pod.state, pod.why = _State.GIVEN_UP, why
        self.say_once(pod, DrainReport.POD_DEADLINE, f"pod {pod.key} stays on node {self.drainer.node_name}: {why}")

    def wait_for_slot(self) -> bool:
        rate = self.drainer.settings.evictions_per_second
        if not self.pause_until(self.next_slot):
            return False
        if rate > 0:
            self.next_slot = max(self.next_slot, self.drainer.clock()) + 1.0 / rate
        return True

    # ---- waiting -------------------------------------------------------------------------------

    def next_wake(self) -> float:
        d, s = self.drainer, self.drainer.settings
        now = d.clock()
        wakes = [now + d.poll]  # a listing now and then: pods leaving, protected, or new
        for pod in self.pods.values():
            if pod.state in (_State.EVICT, _State.DELETE):
                wakes.append(pod.next_try)
                if pod.state is _State.EVICT:
                    wakes.append(pod.first_seen + s.pod_deadline)
            elif pod.state is _State.PROTECTED:
                wakes.append(pod.first_seen + s.pod_deadline)
            elif pod.state is _State.LEAVING:
                wakes.append(pod.leaving_since + s.wait_for_deletion)
        return min(wakes)

    def api_trouble(self, error: KubeError) -> None:
        delay = self.api_backoff.next_delay(retry_after=error.retry_after)
        log.warning("drain %s: %s; retrying in %.1fs", self.drainer.node_name, error, delay)
        self.pause_until(self.drainer.clock() + delay)

    def pause_until(self, when: float) -> bool:
        """Wait until ``when`` (never past the total timeout); False when stopped or out of time."""
        d = self.drainer
        while True:
            if self.stop.is_set():
                return False
            now = d.clock()
            if now >= self.end:
                return False
            if now >= when:
                return True
            seconds = min(when, self.end, now + STOP_CHECK) - now
            if d.sleep is None:
                self.stop.wait(seconds)
            else:
                d.sleep(seconds)

    # ---- the end -------------------------------------------------------------------------------

    def settled(self) -> bool:
        return not any(p.state in _PENDING for p in self.pods.values())

    def settled_outcome(self) -> DrainOutcome:
        if not self.pods:
            return DrainOutcome.DONE
        if any(p.state is _State.FAILED for p in self.pods.values()):
            return DrainOutcome.FAILED
        return DrainOutcome.DEADLINE

    def finish(self, outcome: DrainOutcome, problem: str = "") -> DrainResult:
        d = self.drainer
        remaining = sorted(self.pods.values(), key=lambda p: p.key)
        parts = [f"evicted {len(self.evicted)}"]
        if self.deleted:
            parts.append(f"deleted {len(self.deleted)}")
        if remaining:
            parts.append(
                f"{len(remaining)} remain ({'; '.join(f'{p.key}: {p.why or p.state.value}' for p in remaining)})"
            )
        summary = f"drain of node {d.node_name} {outcome.value}: {', '.join(parts)}"
        message = f"{summary}; {problem}" if problem else summary
        report = _END_REPORT.get(outcome)
        if report is not None:
            self.say(report, message)
        return DrainResult(
            outcome=outcome,
            evicted=tuple(self.evicted),
            deleted=tuple(self.deleted),
            skipped=tuple(SkippedPod(pod=k, why=w) for k, w in sorted(self.skipped.items())),
            remaining=tuple(p.key for p in remaining),
            message=message,
        )

    def say_once(self, pod: _Pod, kind: DrainReport, message: str) -> None:
        if not pod.reported:
            pod.reported = True
            self.say(kind, message)

    def say(self, kind: DrainReport, message: str) -> None:
        try:
            self.drainer.report(kind.value, message)
        except Exception:  # a broken report must not break the drain
            log.exception("drain %s: reporting %s failed", self.drainer.node_name, kind.value)
