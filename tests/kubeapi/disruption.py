"""PodDisruptionBudget status and the eviction decision.

The real disruption controller fills ``PodDisruptionBudget.status`` asynchronously; here it is
computed on every read from the pods currently stored (so ``observedGeneration`` always equals
``metadata.generation``).

Expected pod count: for an integer ``minAvailable`` it is the number of matching pods, as in the
real controller.  For percentages and ``maxUnavailable`` the real controller reads the owning
controller's scale; there are no controllers here, so the caller passes the largest number of
matching pods seen so far (``scale``), which models a controller that has not yet replaced evicted
pods (the situation during a drain).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from .errors import ApiError, internal, too_many_requests
from .selectors import label_selector_object_matcher

Obj = dict[str, Any]

EVICTION_BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_PDBS = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def is_healthy(pod: Obj) -> bool:
    """Ready condition True and not being deleted (what the disruption controller counts)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def selects(pdb: Obj, pod: Obj) -> bool:
    if (pdb["metadata"].get("namespace") or "") != (pod["metadata"].get("namespace") or ""):
        return False
    selector = (pdb.get("spec") or {}).get("selector")
    return label_selector_object_matcher(selector)(pod["metadata"].get("labels") or {})


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"(\d+)%", str(value))
    if match is None:
        return 0
    return math.ceil(int(match.group(1)) * total / 100)


def matching_count(pdb: Obj, pods: list[Obj]) -> int:
    return sum(1 for p in pods if selects(pdb, p) and not is_terminal(p))


def pdb_status(pdb: Obj, pods: list[Obj], scale: int = 0) -> Obj:
    """The status the disruption controller would report for ``pdb``."""
    matching = [p for p in pods if selects(pdb, p) and not is_terminal(p)]
    current = sum(1 for p in matching if is_healthy(p))
    spec = pdb.get("spec") or {}
    int_min_available = isinstance(spec.get("minAvailable"), int) and spec.get("maxUnavailable") is None
    expected = len(matching) if int_min_available else max(scale, len(matching))
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    elif spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected)
    else:
        desired = 0
    allowed = max(0, current - desired)
    condition_status = "True" if allowed > 0 else "False"
    return {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": current,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": condition_status,
                "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                "message": "",
                "observedGeneration": pdb["metadata"].get("generation", 1),
                "lastTransitionTime": pdb["metadata"].get("creationTimestamp"),
            }
        ],
    }


def check_eviction(pod: Obj, pdbs: list[Obj], pods: list[Obj], scale: Callable[[Obj], int]) -> ApiError | None:
    """``None`` when the pod may be evicted now, else the error the eviction endpoint returns."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
        return None
    covering = [p for p in pdbs if selects(p, pod)]
    if not covering:
        return None
    if len(covering) > 1:
        return internal(MULTIPLE_PDBS)
    pdb = covering[0]
    status = pdb_status(pdb, pods, scale(pdb))
    policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
    if not is_healthy(pod):
        if policy == "AlwaysAllow":
            return None
        if status["currentHealthy"] >= status["desiredHealthy"] and status["desiredHealthy"] > 0:
            return None
    if status["disruptionsAllowed"] > 0:
        return None
    cause = {
        "reason": "DisruptionBudget",
        "message": f"The disruption budget {pdb['metadata']['name']} needs {status['desiredHealthy']} healthy "
        f"pods and has {status['currentHealthy']} currently",
    }
    return too_many_requests(EVICTION_BLOCKED, causes=[cause])
