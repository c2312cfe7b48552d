"""Validation records and requests: what the active checks proved about this node and its devices.

An active check's run (see :mod:`agent.checks.active`) leaves one :class:`ValidationRecord` per device it
judged (or one for the node): PASS, FAIL or UNKNOWN. A PASS is valid until ``valid_until`` (``validFor``
after the run) and is voided **at once** when a new fault lands on one of its devices (a node-scoped
fault voids every pass). A :class:`ValidationRequest` (from recovery, or "startup") asks for checks to
run; it is open until every check it names has a record newer than the request for its devices, or until
it is withdrawn (:class:`ValidationWithdrawn`).

:class:`ValidationBook` keeps the newest record per (check, device key or ``""``) and the open requests.
It has one owner (the main loop, through :class:`~agent.core.state.NodeState`).

The Node annotation :data:`VALIDATIONS_ANNOTATION` carries the records as a compact JSON list
(:func:`records_text`, bounded to :data:`MAX_RECORDS`); :func:`parse_records` reads it back for
``status``, strictly: a broken value raises :class:`BadValidation` naming the field.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

VALIDATIONS_ANNOTATION = "node-health-agent.io/validations"
MAX_RECORDS = 64  # records on the Node (the newest win)
MAX_REQUESTS = 32  # open requests kept (the oldest are dropped, logged by the caller)
MAX_TEXT = 256  # characters of a reason, message or invalidation kept in a record
MAX_BLOB = 64 * 1024  # characters of an annotation value the codec reads
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationRecord:
    """The newest verdict of one active check for one device (``devices`` its keys; ``()`` the node)."""

    check: str
    devices: tuple[str, ...]
    verdict: Verdict
    reason: str
    message: str
    at: float  # when the run finished (wall clock)
    valid_until: float | None  # a pass: at + validFor; None otherwise
    invalidated_by: str = ""  # "<condition>/<reason> on <device key>" when a new fault voided the pass

    def valid(self, now: float) -> bool:
        """A PASS, not voided by a fault, not expired."""
        return (
            self.verdict is Verdict.PASS
            and not self.invalidated_by
            and self.valid_until is not None
            and now < self.valid_until
        )

    @property
    def key(self) -> tuple[str, str]:
        """(check, device key or "" for the node): one record per key is kept."""
        return self.check, ",".join(self.devices)


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationRequest:
    """A request to run ``checks`` (their results for ``devices`` count; ``()`` = the node)."""

    id: str  # unique (the requester's incident id + attempt, or "startup")
    checks: tuple[str, ...]
    devices: tuple[str, ...] = ()
    requested_at: float
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationWithdrawn:
    """An inbox item: the request ``id`` is no longer wanted (closed without an answer)."""

    id: str


def answered(request: ValidationRequest, records: Iterable[ValidationRecord]) -> bool:
    """Every check the request names has a record newer than the request for its devices: for each device
    it names, a record of that device or of the node; for the node (``()``), any record of the check."""
    fresh = [r for r in records if r.at >= request.requested_at]
    for check in request.checks:
        mine = [r for r in fresh if r.check == check]
        if not mine:
            return False
        node = any(not r.devices for r in mine)
        seen = {d for r in mine for d in r.devices}
        if request.devices and not node and not set(request.devices) <= seen:
            return False
    return True


class ValidationBook:
    """The newest record per (check, device) and the open requests. Not thread-safe: one owner."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], ValidationRecord] = {}
        self._requests: dict[str, ValidationRequest] = {}

    @property
    def records(self) -> tuple[ValidationRecord, ...]:
        return tuple(sorted(self._records.values(), key=lambda r: (r.check, r.devices)))

    @property
    def requests(self) -> tuple[ValidationRequest, ...]:
        return tuple(self._requests.values())

    def record(self, records: Iterable[ValidationRecord]) -> bool:
        """Keep the records of a run (each replaces the older one of its key); close the requests they
        answer. Whether anything changed."""
        changed = False
        for record in records:
            old = self._records.get(record.key)
            if old is not None and old.at > record.at:
                continue
            self._records[record.key] = record
            changed = True
        for request in [q for q in self._requests.values() if answered(q, self._records.values())]:
            del self._requests[request.id]
            changed = True
        return changed

    def request(self, request: ValidationRequest) -> bool:
        """Open a request (the same id again changes nothing). Whether it was new."""
        if request.id in self._requests:
            return False
        if len(self._requests) >= MAX_REQUESTS:
            oldest = min(self._requests.values(), key=lambda q: q.requested_at)
            del self._requests[oldest.id]
        self._requests[request.id] = request
        return True

    def withdraw(self, request_id: str) -> bool:
        return self._requests.pop(request_id, None) is not None

    def void(self, *, device: str | None, cause: str) -> bool:
        """A new fault: the passes on ``device`` and the node-wide passes (they cover every device) are voided
        at once; ``device`` None (a node-scoped fault) voids every pass. ``invalidated_by`` says ``cause``."""
        changed = False
        for key, record in self._records.items():
            if record.verdict is not Verdict.PASS or record.invalidated_by:
                continue
            if device is not None and record.devices and device not in record.devices:
                continue
            where = device or "node"
            self._records[key] = replace(record, invalidated_by=f"{cause} on {where}"[:MAX_TEXT])
            changed = True
        return changed


# ---- the annotation codec ------------------------------------------------------------------------------


def record_fields(record: ValidationRecord) -> dict[str, Any]:
    """One record as plain JSON fields (short names: the annotation is bounded)."""
    out: dict[str, Any] = {"check": record.check, "verdict": record.verdict.value, "at": round(record.at, 3)}
    if record.devices:
        out["devices"] = list(record.devices)
    if record.reason:
        out["reason"] = record.reason[:MAX_TEXT]
    if record.message:
        out["message"] = record.message[:MAX_TEXT]
    if record.valid_until is not None:
        out["validUntil"] = round(record.valid_until, 3)
    if record.invalidated_by:
        out["invalidatedBy"] = record.invalidated_by[:MAX_TEXT]
    return out


def records_text(records: Iterable[ValidationRecord]) -> str:
    """The annotation's value: the newest :data:`MAX_RECORDS` records, compact JSON, oldest first."""
    newest = sorted(records, key=lambda r: r.at)[-MAX_RECORDS:]
    return json.dumps([record_fields(r) for r in newest], separators=(",", ":"), sort_keys=True)


class BadValidation(ValueError):
    """A validations annotation breaks a rule; the message names the field."""


def _time(item: Mapping[str, Any], key: str, where: str, *, required: bool) -> float | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadValidation(f"{where}.{key}: must be a number of seconds")
    if not 0 <= value <= MAX_TIME:
        raise BadValidation(f"{where}.{key}: out of range")
    return float(value)


def _str(item: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = item.get(key, None if required else "")
    if not isinstance(value, str) or (required and not value) or len(value) > MAX_TEXT:
        raise BadValidation(f"{where}.{key}: must be a string of at most {MAX_TEXT} characters")
    return value


def _record(item: object, where: str) -> ValidationRecord:
    if not isinstance(item, dict):
        raise BadValidation(f"{where}: must be an object")
    devices = item.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(d, str) and 0 < len(d) <= MAX_TEXT for d in devices):
        raise BadValidation(f"{where}.devices: must be a list of device keys")
    try:
        verdict = Verdict(str(item.get("verdict")))
    except ValueError:
        raise BadValidation(f"{where}.verdict: must be one of pass, fail, unknown") from None
    at = _time(item, "at", where, required=True)
    assert at is not None
    return ValidationRecord(
        check=_str(item, "check", where, required=True),
        devices=tuple(devices),
        verdict=verdict,
        reason=_str(item, "reason", where),
        message=_str(item, "message", where),
        at=at,
        valid_until=_time(item, "validUntil", where, required=False),
        invalidated_by=_str(item, "invalidatedBy", where),
    )


def parse_records(text: str) -> tuple[ValidationRecord, ...]:
    """The records of an annotation written by :func:`records_text` (BadValidation naming the field)."""
    if len(text) > MAX_BLOB:
        raise BadValidation(f"validations: longer than {MAX_BLOB} characters")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise BadValidation("validations: not JSON") from None
    if not isinstance(data, list) or len(data) > MAX_RECORDS:
        raise BadValidation(f"validations: must be a list of at most {MAX_RECORDS} records")
    return tuple(_record(item, f"validations[{i}]") for i, item in enumerate(data))
