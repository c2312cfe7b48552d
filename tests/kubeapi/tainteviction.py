"""A simulated device-taint eviction controller: it writes ``DeviceTaintRule.status``.

Modelled on kube-controller-manager's ``pkg/controller/devicetainteviction``
(``maybeUpdateRuleStatus``): one condition, ``EvictionInProgress``, with ``observedGeneration``.

* ``effect: None``: written once per spec change (generation).  Status False, reason
  ``NoEffect``, and a message saying what ``NoExecute`` would do: "<n> published devices
  selected. <m> allocated devices selected. <k> pods would be evicted in <j> different namespaces
  if the effect was NoExecute. ..." (singular forms for 1).  The pods are those not being deleted
  that use (``spec.resourceClaims`` / ``status.resourceClaimStatuses``) a ResourceClaim of their
  namespace whose ``status.allocation.devices.results`` holds a selected device without a
  toleration of the taint.
* ``NoSchedule``: reason ``OtherEffect``, "Eviction only happens for the NoExecute effect."
* ``NoExecute``: reason ``PodsPendingEviction`` (True, "<k> pods need to be evicted in ...") or
  ``NotStarted``.  Pods are not deleted here (a gap: the test server does not evict).

Off by default: ``reconcile()`` writes what is due now; ``auto(True)`` does it in the background
every few milliseconds (paused during an outage, like ``kubelet``).  The write
goes straight to storage (watchers see MODIFIED), past ``faults`` and ``requests``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .gotime import format_time

if TYPE_CHECKING:
    from .api import KubeApi

Obj = dict[str, Any]

STORAGE = "devicetaintrules.resource.k8s.io"
CONDITION = "EvictionInProgress"
POLL_SECONDS = 0.02


def _plural(count: int, one: str, many: str) -> str:
    return one if count == 1 else many.format(count)


def _selects(selector: Obj, driver: str, pool: str, device: str) -> bool:
    """``ruleMatchesDevice``: every field set must match; no selector matches nothing."""
    wanted = {"driver": driver, "pool": pool, "device": device}
    return all(selector.get(k) in (None, v) for k, v in wanted.items())


def _tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    """``DeviceToleration.ToleratesTaint`` against the taint with effect NoExecute (simulation)."""
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", "NoExecute"):
            continue
        key = toleration.get("key") or ""
        if (toleration.get("operator") or "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _pod_claim_names(pod: Obj) -> list[str]:
    """``resourceclaim.Name``: a direct ``resourceClaimName``, else the generated one recorded in
    ``status.resourceClaimStatuses``."""
    generated = {
        s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names = []
    for claim in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = claim.get("resourceClaimName") or generated.get(claim.get("name"))
        if name:
            names.append(name)
    return names


class DeviceTaintController:
    """``KubeApiServer.device_taints``."""

    def __init__(self, api: KubeApi, *, clock: Callable[[], datetime], available: Callable[[], bool]) -> None:
        self._api = api
        self._clock = clock
        self._available = available
        self._cond = threading.Condition()
        self._auto = False
        self._running = False
        self._thread: threading.Thread | None = None

    # --- test-facing API -------------------------------------------------------------------------

    def reconcile(self) -> list[str]:
        """Write every rule's condition that is due now; returns the rules written, by name."""
        written = []
        with self._api.store.lock:
            for rule in self._api.store.list(STORAGE):
                condition = self._condition(rule)
                if condition is not None:
                    rule.setdefault("status", {})["conditions"] = [
                        c for c in (rule.get("status") or {}).get("conditions") or [] if c.get("type") != CONDITION
                    ] + [condition]
                    self._api.store.put(STORAGE, rule)
                    written.append(rule["metadata"]["name"])
        return written

    def auto(self, enabled: bool) -> None:
        """Reconcile in the background, every few milliseconds, while the server is started."""
        with self._cond:
            self._auto = enabled
            self._cond.notify_all()
        self._ensure_thread()

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            self._running = True
        self._ensure_thread()

    def stop(self) -> None:
        with self._cond:
            self._running = False
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _ensure_thread(self) -> None:
        with self._cond:
            if not (self._running and self._auto) or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="kubeapi-device-taints", daemon=True)
            thread = self._thread
        thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                if self._thread is not me or not (self._running and self._auto):
                    if self._thread is me:
                        self._thread = None
                    return
            if self._available():
                self.reconcile()
            with self._cond:
                self._cond.wait(POLL_SECONDS)

    # --- the controller's computation --------------------------------------------------------------

    def _condition(self, rule: Obj) -> Obj | None:
        generation = int(rule["metadata"].get("generation") or 1)
        existing = next(
            (c for c in (rule.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None
        )
        if existing is not None and int(existing.get("observedGeneration") or 0) == generation:
            return None
        spec = rule.get("spec") or {}
        taint, effect = spec.get("taint") or {}, (spec.get("taint") or {}).get("effect")
        selector = spec.get("deviceSelector")
        status, reason, message = "False", "OtherEffect", "Eviction only happens for the NoExecute effect."
        if effect in ("None", "NoExecute"):
            published, allocated, pods, namespaces = self._count(selector, taint)
            if effect == "None":
                reason = "NoEffect"
                message = (
                    _plural(published, "1 published device selected. ", "{} published devices selected. ")
                    + _plural(allocated, "1 allocated device selected. ", "{} allocated devices selected. ")
                    + _plural(pods, "1 pod would be evicted in ", "{} pods would be evicted in ")
                    + _plural(namespaces, "1 namespace ", "{} different namespaces ")
                    + "if the effect was NoExecute. This information will not be updated again. "
                    "Recreate the DeviceTaintRule to trigger an update."
                )
            elif pods:
                status, reason = "True", "PodsPendingEviction"
                message = _plural(pods, "1 pod needs to be evicted in ", "{} pods need to be evicted in ") + _plural(
                    namespaces, "1 namespace.", "{} different namespaces."
                )
            else:
                reason, message = "NotStarted", ""
        return {
            "type": CONDITION,
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": format_time(self._clock()),
        }

    def _count(self, selector: Obj | None, taint: Obj) -> tuple[int, int, int, int]:
        """(published devices, allocated devices, pods, namespaces) the rule selects."""
        if selector is None:
            return 0, 0, 0, 0
        store = self._api.store
        published = sum(
            1
            for s in store.list("resourceslices.resource.k8s.io")
            for d in (s.get("spec") or {}).get("devices") or []
            if _selects(selector, s["spec"].get("driver", ""), (s["spec"].get("pool") or {}).get("name", ""), d["name"])
        )
        allocated = 0
        evicting: set[tuple[str, str]] = set()  # (namespace, claim) whose pods would go
        for claim in store.list("resourceclaims.resource.k8s.io"):
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            hits = [
                r for r in results if _selects(selector, r.get("driver", ""), r.get("pool", ""), r.get("device", ""))
            ]
            allocated += len(hits)
            if any(not _tolerates(r.get("tolerations") or [], taint) for r in hits):
                evicting.add((claim["metadata"].get("namespace") or "", claim["metadata"]["name"]))
        pods = [
            p
            for p in store.list("pods")
            if not p["metadata"].get("deletionTimestamp")
            and any((p["metadata"].get("namespace") or "", n) in evicting for n in _pod_claim_names(p))
        ]
        return published, allocated, len(pods), len({p["metadata"].get("namespace") for p in pods})
