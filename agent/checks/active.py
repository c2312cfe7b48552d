"""The gates before an active check starts, and the validation records its run leaves.

An active check (``active: true``) is exclusive and may load the devices it exercises, so before it
starts, in this order:

1. never two active checks at once on a node (the scheduler holds the others back: ``ActiveCheckRunning``
   is what :func:`decide` says if asked anyway);
2. no pod holds a device of its kind: ``busy(kind)`` answers None, or a text naming the holder pods
   (skip ``DeviceBusy``); a ``busy`` that raises cannot tell (no pod-resources API: ``--device-holders``
   off), and without proof that the devices are idle the check is skipped too (``HoldersUnknown``);
3. the fleet share (:mod:`agent.checks.fleetslots`): a slot of the pool's or zone's share, else skip
   ``FleetShareFull``; an API error skips ``FleetSlotsUnavailable`` (never run unguarded). Without a
   Kubernetes API (standalone mode) there is no fleet and no share.

A skip is an UNKNOWN with that reason, never a fail: it counts toward no threshold, leaves no
validation record and the scheduler retries it later, with jitter. :func:`decide` is the pure decision;
:class:`ActiveGates` asks the seams in that order and stops at the first skip.

:func:`records_of` turns a finished run into :class:`~agent.core.validation.ValidationRecord` s: one per
device its results name (the worst verdict for that device), or one for the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.checks.fleetslots import FULL, GRANTED, SlotAnswer
from agent.checks.model import ActiveSpec, CheckReport, CheckResult, CheckStatus
from agent.core.validation import MAX_TEXT, ValidationRecord, Verdict

log = logging.getLogger(__name__)

ACTIVE_RUNNING = "ActiveCheckRunning"
DEVICE_BUSY = "DeviceBusy"
HOLDERS_UNKNOWN = "HoldersUnknown"
FLEET_SHARE_FULL = "FleetShareFull"
FLEET_SLOTS_UNAVAILABLE = "FleetSlotsUnavailable"
SKIP_REASONS = frozenset({ACTIVE_RUNNING, DEVICE_BUSY, HOLDERS_UNKNOWN, FLEET_SHARE_FULL, FLEET_SLOTS_UNAVAILABLE})

Busy = Callable[[str], "str | None"]  # device kind -> None (idle), or the holder pods; raises: cannot tell


class Slots(Protocol):
    """What the gates need of :class:`agent.checks.fleetslots.FleetSlots`."""

    def acquire(self, *, check: str, timeout: float) -> SlotAnswer: ...

    def release(self) -> None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Skip:
    reason: str  # one of SKIP_REASONS
    message: str

    def result(self) -> CheckResult:
        return CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason=self.reason, message=self.message)


@dataclass(frozen=True, kw_only=True, slots=True)
class Holders:
    """What ``busy`` answered: the holder pods' text (None: idle), or why it cannot tell."""

    pods: str | None = None
    unknown: str | None = None


def decide(
    *, check: str, devices: str, running: str | None, holders: Holders | None, slot: SlotAnswer | None
) -> Skip | None:
    """The gates as a pure decision over what was found (None: not asked yet). None: the check may start."""
    if running is not None:
        return Skip(reason=ACTIVE_RUNNING, message=f"active check {running} is running on this node")
    if holders is not None and holders.unknown is not None:
        return Skip(
            reason=HOLDERS_UNKNOWN,
            message=f"cannot tell whether a pod holds the {devices} devices ({holders.unknown}): {check} not started",
        )
    if holders is not None and holders.pods is not None:
        return Skip(reason=DEVICE_BUSY, message=f"{devices} devices held by {holders.pods}: {check} not started")
    if slot is not None and slot.outcome == FULL:
        return Skip(reason=FLEET_SHARE_FULL, message=f"the fleet share of active checks is full ({slot.detail})")
    if slot is not None and slot.outcome != GRANTED:
        return Skip(reason=FLEET_SLOTS_UNAVAILABLE, message=f"fleet slots cannot be read ({slot.detail})")
    return None


class ActiveGates:
    """The seams of the gates: the holder lookup and the fleet slots (None: standalone, no fleet)."""

    def __init__(self, *, busy: Busy, slots: Slots | None = None) -> None:
        self._busy = busy
        self._slots = slots

    def admit(self, *, check: str, spec: ActiveSpec, timeout: float) -> Skip | None:
        """Ask the seams in order (holders, then a fleet slot); a skip, or None with a slot taken (give it
        back with :meth:`done`)."""
        holders = self._holders(spec.devices)
        skip = decide(check=check, devices=spec.devices, running=None, holders=holders, slot=None)
        if skip is not None or self._slots is None:
            return skip
        return decide(
            check=check,
            devices=spec.devices,
            running=None,
            holders=holders,
            slot=self._slots.acquire(check=check, timeout=timeout),
        )

    def done(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def _holders(self, kind: str) -> Holders:
        try:
            return Holders(pods=self._busy(kind))
        except Exception as exc:  # the lookup cannot tell: not proven idle
            return Holders(unknown=str(exc)[:200] or type(exc).__name__)


def holders_unknown(kind: str) -> str | None:
    """The ``busy`` of an agent without the pod-resources API (``--device-holders`` off): it cannot tell."""
    raise LookupError("no pod-resources API: --device-holders is off")


_VERDICT = {CheckStatus.OK: Verdict.PASS, CheckStatus.PROBLEM: Verdict.FAIL, CheckStatus.UNKNOWN: Verdict.UNKNOWN}
_RANK = {Verdict.PASS: 0, Verdict.UNKNOWN: 1, Verdict.FAIL: 2}


def records_of(report: CheckReport) -> tuple[ValidationRecord, ...]:
    """The validation records of an active check's finished run (none for a skipped or passive one)."""
    spec = report.active
    if spec is None or report.skipped:
        return ()
    worst: dict[tuple[str, ...], CheckResult] = {}
    for result in report.results:
        keys: list[tuple[str, ...]] = [(d,) for d in result.devices] or [()]
        for key in keys:
            old = worst.get(key)
            if old is None or _RANK[_VERDICT[result.status]] > _RANK[_VERDICT[old.status]]:
                worst[key] = result
    if not worst:
        worst[()] = CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason="NoResult", message="no result")
    out = []
    for devices, result in sorted(worst.items()):
        verdict = _VERDICT[result.status]
        out.append(
            ValidationRecord(
                check=report.check,
                devices=devices,
                verdict=verdict,
                reason=result.reason[:MAX_TEXT],
                message=result.message[:MAX_TEXT],
                at=report.finished_at,
                valid_until=report.finished_at + spec.valid_for if verdict is Verdict.PASS else None,
            )
        )
    return tuple(out)
