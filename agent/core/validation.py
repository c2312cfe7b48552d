"""Validation records and requests (issue 36 contract): what an active check proved, and what recovery asks
to be proved before a node or device goes back into service."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationRecord:
    check: str
    devices: tuple[str, ...]  # device keys; () = node
    verdict: Verdict
    reason: str
    message: str
    at: float  # when the run finished (wall clock)
    valid_until: float | None  # a pass: at + validFor; None otherwise
    invalidated_by: str = ""  # "<condition>/<reason> on <device key>" when a new fault voided a pass

    def valid(self, now: float) -> bool:
        """A pass, not invalidated, and not expired."""
        return (
            self.verdict is Verdict.PASS
            and not self.invalidated_by
            and self.valid_until is not None
            and now < self.valid_until
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationRequest:
    id: str  # unique (the requester's incident id + attempt, or "startup")
    checks: tuple[str, ...]  # check names
    devices: tuple[str, ...] = ()  # only these devices' results count; () = the node
    requested_at: float
    reason: str = ""
