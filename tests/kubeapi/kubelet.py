"""A simulated kubelet for the test server: it confirms that terminating pods have stopped.

A graceful DELETE or eviction of a pod bound to a node leaves the pod in place with
``metadata.deletionTimestamp`` and ``metadata.deletionGracePeriodSeconds`` > 0 (see
``KubeApi._delete``).  On a real cluster the pod's kubelet stops the containers and then deletes
the pod with ``gracePeriodSeconds=0`` and a UID precondition; only then is it gone (or, with
finalizers left, it stays with ``deletionGracePeriodSeconds: 0`` until they are removed).  Here a
test decides when that happens: ``confirm()`` now, or ``auto_confirm(delay)`` in the background.

The kubelet's own status write before that DELETE (terminal phase, container states) is not
simulated, and nothing distinguishes real nodes: every bound pod has a "kubelet".
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .errors import ApiError
from .gotime import TimeParseError, parse_time

if TYPE_CHECKING:
    from .api import KubeApi

Obj = dict[str, Any]

POLL_SECONDS = 0.02


def awaiting_kubelet(pod: Obj) -> bool:
    """Terminating and not yet confirmed: deletionTimestamp set, deletionGracePeriodSeconds > 0."""
    meta = pod.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) and int(meta.get("deletionGracePeriodSeconds") or 0) > 0


class Kubelet:
    """``KubeApiServer.kubelet``.  Off by default: terminating pods stay until a test calls
    :meth:`confirm` or turns on :meth:`auto_confirm`."""

    def __init__(self, api: KubeApi, *, clock: Callable[[], datetime], available: Callable[[], bool]) -> None:
        self._api = api
        self._clock = clock
        self._available = available
        self._cond = threading.Condition()
        self._delay: float | None = None
        self._marked: dict[str, datetime] = {}  # pod uid -> when the API server marked it terminating
        self._enabled = False
        self._thread: threading.Thread | None = None
        self._passes = 0
        api.on_pod_terminating = self._observe

    # --- test-facing API ------------------------------------------------------------------------

    def terminating(self, node: str | None = None, namespace: str | None = None, name: str | None = None) -> list[str]:
        """Names of the pods waiting for their kubelet (optionally on one node / in one namespace /
        one name), in (namespace, name) order."""
        return [p["metadata"]["name"] for p in self._pods(node, namespace, name)]

    def confirm(self, node: str | None = None, namespace: str | None = None, name: str | None = None) -> list[str]:
        """Confirm every terminating pod (optionally only on ``node``, in ``namespace``, named
        ``name``) as its kubelet does once the containers stopped: DELETE with
        ``gracePeriodSeconds=0`` and a UID precondition.  The pods are gone (a watch sees MODIFIED
        with period 0, then DELETED) unless finalizers keep them.  Returns their names in
        (namespace, name) order.  Works whatever ``auto_confirm`` is set to, and during an outage."""
        with self._api.store.lock:
            pods = self._pods(node, namespace, name)
            for pod in pods:
                self._confirm(pod)
        return [p["metadata"]["name"] for p in pods]

    def auto_confirm(self, delay: float | None) -> None:
        """Confirm each terminating pod automatically ``delay`` seconds (by the server's clock)
        after the API server marked it terminating, or when its grace period runs out if that is
        sooner (the kubelet kills the containers then).  ``None`` turns it off (the default).
        Pods already terminating count from when they were marked.  Paused while the server is
        in an outage (the kubelet cannot reach it); runs while the server is started."""
        if delay is not None and delay < 0:
            raise ValueError(f"delay must be >= 0 or None, not {delay!r}")
        with self._cond:
            self._delay = delay
            self._cond.notify_all()
        self._ensure_thread()

    @property
    def auto_confirm_delay(self) -> float | None:
        return self._delay

    @property
    def running(self) -> bool:
        """Whether the background loop of ``auto_confirm`` is running."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def sync(self, timeout: float = 5.0) -> None:
        """Wait until the ``auto_confirm`` loop has made a whole pass that began after this call
        (so it saw the clock as it is now); returns at once when the loop is not running."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._thread is None:
                return
            target = self._passes + 2  # the pass under way may have read the clock before the call
            self._cond.notify_all()
            while self._thread is not None and self._passes < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the simulated kubelet made no pass within {timeout} s")
                self._cond.wait(remaining)

    # --- lifecycle (KubeApiServer.start / stop) -------------------------------------------------

    def start(self) -> None:
        with self._cond:
            self._enabled = True
        self._ensure_thread()

    def stop(self) -> None:
        with self._cond:
            self._enabled = False
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # --- internals ------------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._cond:
            if not self._enabled or self._delay is None or self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="kubeapi-kubelet", daemon=True)
            self._thread = thread
        thread.start()

    def _observe(self, pod: Obj) -> None:
        """``KubeApi.on_pod_terminating`` (called with the store lock held)."""
        with self._cond:
            self._marked.setdefault(pod["metadata"]["uid"], self._clock())
            self._cond.notify_all()

    def _pods(self, node: str | None, namespace: str | None, name: str | None) -> list[Obj]:
        return [
            p
            for p in self._api.store.list("pods", namespace)
            if awaiting_kubelet(p)
            and (node is None or (p.get("spec") or {}).get("nodeName") == node)
            and (name is None or p["metadata"]["name"] == name)
        ]

    def _confirm(self, pod: Obj) -> None:
        """The kubelet's final DELETE; the caller holds the store lock."""
        meta = pod["metadata"]
        pods_rt = self._api.resource("", "v1", "pods")
        assert pods_rt is not None
        options = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        self._api._delete(pods_rt, meta.get("namespace"), meta["name"], options)
        with self._cond:
            self._marked.pop(meta["uid"], None)

    def _marked_at(self, pod: Obj, now: datetime) -> datetime:
        """When ``pod`` was marked; for a pod the server did not see marked (seeded with
        ``put_object``), deletionTimestamp minus its grace period (whole seconds)."""
        meta = pod["metadata"]
        with self._cond:
            known = self._marked.get(meta["uid"])
        if known is not None:
            return known
        try:
            deadline = parse_time(meta["deletionTimestamp"])
        except TimeParseError:
            return now
        return deadline - timedelta(seconds=int(meta.get("deletionGracePeriodSeconds") or 0))

    def _confirm_due(self, delay: float) -> None:
        now = self._clock()
        with self._api.store.lock:
            pods = self._pods(None, None, None)
            for pod in pods:
                grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                if now >= self._marked_at(pod, now) + timedelta(seconds=min(delay, grace)):
                    with contextlib.suppress(ApiError):
                        self._confirm(pod)
            present = {p["metadata"]["uid"] for p in pods}
            with self._cond:
                for uid in [u for u in self._marked if u not in present]:
                    del self._marked[uid]

    def _run(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                with self._cond:
                    if self._thread is not me or not self._enabled or self._delay is None:
                        self._leave(me)  # in the same locked section as the check: see _ensure_thread
                        return
                    delay = self._delay
                if self._available():
                    self._confirm_due(delay)
                with self._cond:
                    self._passes += 1
                    self._cond.notify_all()
                    if self._thread is me and self._enabled and self._delay == delay:
                        self._cond.wait(POLL_SECONDS)
        except BaseException:
            with self._cond:
                self._leave(me)
            raise

    def _leave(self, me: threading.Thread) -> None:
        """The loop ends (the caller holds ``_cond``)."""
        if self._thread is me:
            self._thread = None
        self._cond.notify_all()
