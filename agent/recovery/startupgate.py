"""The startup gate (pure): a new node proves itself once before it takes work (policy ``startupValidation``).

The node registers with the NoSchedule taint :data:`~agent.recovery.model.UNVALIDATED_TAINT_KEY` (put there
by its provisioning: Karpenter's ``startupTaints``, a managed node group's taints), so no pod lands first.
While the taint is there, the agent asks for the startup checks (request id ``startup``; again after
:data:`RETRY` when a request closed without a pass of every check, or a restart lost it) and removes the
taint after the first pass of every check. A fail keeps the taint, with a report (Event
``StartupValidationFailed``): the node never takes work unproven. The agent never adds the taint itself (a
taint added after registration comes too late: pods may have landed).

``taint: false``: nothing is gated; the startup checks are asked for once when the agent starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.types import Snapshot
from agent.core.validation import ValidationRequest, Verdict
from agent.recovery.model import StartupValidation
from agent.recovery.validationgate import Returning, judge

STARTUP_ID = "startup"
RETRY = 600.0  # seconds before a startup request that brought no verdict is asked again
PASSED, FAILED = "StartupValidationPassed", "StartupValidationFailed"


@dataclass(frozen=True, kw_only=True, slots=True)
class StartupStep:
    """What the loop does for the startup gate now: put ``request``, remove the taint, tell ``reason``."""

    request: ValidationRequest | None = None
    untaint: bool = False
    reason: str = ""
    message: str = ""


def startup(
    settings: StartupValidation | None,
    *,
    tainted: bool,
    snapshot: Snapshot,
    now: float,
    asked_at: float | None,  # when this process last put the startup request (None: never)
) -> StartupStep | None:
    """The startup gate's step (None: nothing to do, now or ever again in this process)."""
    if settings is None:
        return None
    ask = StartupStep(
        request=ValidationRequest(id=STARTUP_ID, checks=settings.checks, requested_at=now, reason="a new node")
    )
    if not settings.taint:
        return ask if asked_at is None else None
    if not tainted:
        return None
    verdict, detail = judge(settings.checks, Returning(remedy=STARTUP_ID, after=0.0), snapshot.validations, now=now)
    if verdict is Verdict.PASS:
        return StartupStep(untaint=True, reason=PASSED, message=f"{', '.join(settings.checks)} passed: untainted")
    if verdict is Verdict.FAIL:
        return StartupStep(reason=FAILED, message=f"{detail}; the node keeps its startup taint (never takes work)")
    open_ = any(r.id == STARTUP_ID for r in snapshot.validation_requests)
    if asked_at is None or (not open_ and now >= asked_at + RETRY):
        return ask
    return StartupStep()
