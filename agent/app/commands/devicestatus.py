"""What ``status`` shows of a node's devices and clears: the operator's clears its agent handled and the
per-device recovery work of its incident.

- Clears: the Node annotation :data:`~agent.core.clears.CLEARS_ANNOTATION` (written by
  :mod:`agent.sinks.clearack`): who cleared which condition (of which device), why, when, and whether the
  agent applied or refused it. The newest :data:`SHOWN_CLEARS` are shown; a node with nothing else to
  show gets a row for a clear of the last :data:`RECENT_CLEAR` seconds (the operator checking their clear).
- Validations: the Node annotation :data:`~agent.core.validation.VALIDATIONS_ANNOTATION` (written by
  :mod:`agent.sinks.validations`): per active check and device, the newest verdict, when, and whether a
  pass is still valid (not expired, not voided by a fault). A failed or voided validation of the last
  :data:`RECENT_CLEAR` seconds gives a node a row of its own.
- Device work: the incident annotation's ``"fences"`` key, a list of ``{"device": "<kind:id>", "fence":
  "<fence outcome or ''>", "rule": "<DeviceTaintRule>", "holders": ["ns/name"], "evicted": ["ns/name"]}``
  (absent: none).

Both annotations are hostile input: one that cannot be read is shown as unreadable (with why) and the
rest of the node still shown; an entry that cannot be read is shown as such, the others kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SHOWN_CLEARS = 3  # the newest clears a node's row lists
RECENT_CLEAR = 86400.0  # seconds: a clear this recent gives a healthy node a row of its own
MAX_FENCES = 64  # device entries shown (a node has at most a few dozen devices)
MAX_PODS = 8  # pods named per list (the rest: "and N more")
MAX_TEXT = 256  # characters of a text field read from a fence entry
MAX_ANNOTATION = 256 * 1024  # characters of an annotation read (the API server's limit for all of them)


def device_view(node: Mapping[str, Any], *, now: float) -> dict[str, Any]:
    """The node's ``clears`` (newest last) and device ``fences``, each with a ``...Unreadable`` reason where
    the annotation cannot be read; ``show``: whether this alone gives the node a row (a recent clear, an
    unreadable annotation)."""
    annotations = _annotations(node)
    view: dict[str, Any] = {}
    clears, problem = read_clears(annotations)
    if problem:
        view["clearsUnreadable"] = problem
    if clears:
        view["clears"] = clears[-SHOWN_CLEARS:]
    fences, problem = read_fences(annotations)
    if problem:
        view["fencesUnreadable"] = problem
    if fences:
        view["fences"] = fences
    attempts, problem = read_attempts(annotations)
    if problem and "fencesUnreadable" not in view:  # one incident annotation: said once
        view["attemptsUnreadable"] = problem
    if attempts:
        view["attempts"] = attempts
    validations, problem = read_validations(annotations, now=now)
    if problem:
        view["validationsUnreadable"] = problem
    if validations:
        view["validations"] = validations
    unreadable = any(f"{part}Unreadable" in view for part in ("clears", "fences", "attempts", "validations"))
    notable = any(now - v["at"] < RECENT_CLEAR and (v["verdict"] == "fail" or v["invalidatedBy"]) for v in validations)
    view["show"] = unreadable or notable or any(now - c["at"] < RECENT_CLEAR for c in clears)
    return view


def read_validations(annotations: Mapping[str, Any], *, now: float) -> tuple[list[dict[str, Any]], str]:
    """The validation records on the Node as plain data (``valid`` as of ``now``), and why they cannot be
    read ("" when they can)."""
    from agent.core.validation import VALIDATIONS_ANNOTATION, BadValidation, parse_records

    text = annotations.get(VALIDATIONS_ANNOTATION)
    if text is None:
        return [], ""
    if not isinstance(text, str):
        return [], "the validations annotation is not text"
    try:
        records = parse_records(text)
    except BadValidation as exc:
        return [], str(exc)[:200]
    return [
        {
            "check": r.check,
            "devices": list(r.devices),
            "verdict": r.verdict.value,
            "reason": r.reason,
            "at": r.at,
            "validUntil": r.valid_until,
            "invalidatedBy": r.invalidated_by,
            "valid": r.valid(now),
        }
        for r in records
    ], ""


def read_clears(annotations: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The clear records on the Node as plain data, and why they cannot be read ("" when they can)."""
    from agent.core.clears import CLEARS_ANNOTATION, BadClear, parse_records

    text = annotations.get(CLEARS_ANNOTATION)
    if text is None:
        return [], ""
    try:
        records = parse_records(text)
    except BadClear as exc:
        return [], str(exc)[:200]
    return [
        {
            "condition": r.request.condition,
            "device": r.request.device,
            "by": r.request.by,
            "reason": r.request.reason,
            "at": r.applied_at,
            "outcome": r.outcome,
            "detail": r.detail,
        }
        for r in records
    ], ""


def read_fences(annotations: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The incident's device entries (``"fences"``; an entry that cannot be read is ``{"unreadable": why}``),
    and why the incident annotation cannot be read at all ("" when it can, or is absent)."""
    raw, problem = _incident_part(annotations, "fences")
    return [_fence(i, entry) for i, entry in enumerate(raw[:MAX_FENCES])], problem


def read_attempts(annotations: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The validation gate's attempts the incident records (``"validations"``: number, remedy, checks,
    outcome, reason; an entry that cannot be read is ``{"unreadable": why}``), and why they cannot be read."""
    raw, problem = _incident_part(annotations, "validations")
    return [_attempt(i, entry) for i, entry in enumerate(raw[:MAX_FENCES])], problem


def _incident_part(annotations: Mapping[str, Any], key: str) -> tuple[list[Any], str]:
    """The list under ``key`` of the incident annotation, and why it cannot be read ("" when it can, or is absent)."""
    from agent.recovery.model import INCIDENT_ANNOTATION

    text = annotations.get(INCIDENT_ANNOTATION)
    if text is None:
        return [], ""
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION:
        return [], "the incident annotation is not JSON text of a sane size"
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return [], f"the incident annotation is not JSON: {str(exc)[:80]}"
    if not isinstance(data, dict):
        return [], "the incident annotation is not a JSON object"
    raw = data.get(key)
    if raw is None:
        return [], ""
    if not isinstance(raw, list):
        return [], f"{key}: must be a list"
    return raw, ""


def _attempt(i: int, entry: object) -> dict[str, Any]:
    if not isinstance(entry, dict) or not isinstance(entry.get("number"), int):
        return {"unreadable": f"validations[{i}]: must be an object with a number"}
    try:
        return {
            "number": entry["number"],
            "remedy": _text(entry, "remedy"),
            "checks": _pods(entry, "checks", what="check names"),
            "outcome": _text(entry, "outcome"),
            "reason": _text(entry, "reason"),
        }
    except ValueError as exc:
        return {"unreadable": f"validations[{i}].{exc}"}


def _fence(i: int, entry: object) -> dict[str, Any]:
    if not isinstance(entry, dict):
        return {"unreadable": f"fences[{i}]: must be an object"}
    try:
        return {
            "device": _text(entry, "device", required=True),
            "fence": _text(entry, "fence"),
            "rule": _text(entry, "rule"),
            "holders": _pods(entry, "holders"),
            "evicted": _pods(entry, "evicted"),
            "steps": _pods(entry, "steps", what="actions"),  # the device actions done (fence-device, drain-device)
        }
    except ValueError as exc:
        return {"unreadable": f"fences[{i}].{exc}"}


def _text(entry: Mapping[str, Any], key: str, *, required: bool = False) -> str:
    value = entry.get(key, None if required else "")
    if not isinstance(value, str) or len(value) > MAX_TEXT or (required and not value):
        raise ValueError(f"{key}: must be a{' non-empty' if required else ''} string of at most {MAX_TEXT} characters")
    return value


def _pods(entry: Mapping[str, Any], key: str, *, what: str = "pods (namespace/name)") -> list[str]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(p, str) and len(p) <= MAX_TEXT for p in value):
        raise ValueError(f"{key}: must be a list of {what}")
    return value


def _annotations(node: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = node.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def device_lines(row: Mapping[str, Any], *, ago: Any) -> list[str]:
    """The lines under a node's rows in the table: one per device entry, then one per clear shown.
    ``ago``: seconds since the epoch -> "3h" (the table's own)."""
    lines = []
    if row.get("fencesUnreadable"):
        lines.append(f"devices: unreadable ({row['fencesUnreadable']})")
    for fence in row.get("fences") or ():
        lines.append(_fence_line(fence))
    if row.get("attemptsUnreadable"):
        lines.append(f"validation attempts: unreadable ({row['attemptsUnreadable']})")
    for attempt in row.get("attempts") or ():
        lines.append(_attempt_line(attempt))
    if row.get("validationsUnreadable"):
        lines.append(f"validations: unreadable ({row['validationsUnreadable']})")
    for record in row.get("validations") or ():
        lines.append(_validation_line(record, ago=ago))
    if row.get("clearsUnreadable"):
        lines.append(f"clears: unreadable ({row['clearsUnreadable']})")
    for clear in row.get("clears") or ():
        what = clear["condition"] + (f" of device {clear['device']}" if clear["device"] else "")
        detail = f": {clear['detail']}" if clear["detail"] else ""
        lines.append(
            f"cleared {what} by {clear['by']} {ago(clear['at'])} ago ({clear['reason']}): {clear['outcome']}{detail}"
        )
    return lines


def _validation_line(record: Mapping[str, Any], *, ago: Any) -> str:
    """``validation dcgm-diag of gpu:0000:3b:00.0: pass 3h ago, valid`` (or expired, voided by what, the
    reason of a fail)."""
    where = ", ".join(record["devices"]) or "the node"
    said = f"{record['verdict']} {ago(record['at'])} ago"
    if record["verdict"] != "pass":
        state = record["reason"] or "no reason"
    elif record["invalidatedBy"]:
        state = f"voided by {record['invalidatedBy']}"
    else:
        state = "valid" if record["valid"] else "expired"
    return f"validation {record['check']} of {where}: {said}, {state}"


def _attempt_line(attempt: Mapping[str, Any]) -> str:
    if "unreadable" in attempt:
        return f"validation attempt: unreadable ({attempt['unreadable']})"
    outcome = attempt["outcome"] or "open"
    reason = f" ({attempt['reason']})" if attempt["reason"] else ""
    checks = ", ".join(attempt["checks"]) or "none"
    return f"validation attempt #{attempt['number']} after {attempt['remedy'] or '?'} [{checks}]: {outcome}{reason}"


def _fence_line(fence: Mapping[str, Any]) -> str:
    if "unreadable" in fence:
        return f"device: unreadable ({fence['unreadable']})"
    parts = [f"fence {fence['fence'] or 'none'}" + (f" (rule {fence['rule']})" if fence["rule"] else "")]
    parts.append(f"holders {_names(fence['holders'])}")
    parts.append(f"evicted {_names(fence['evicted'])}")
    if fence.get("steps"):
        parts.append(f"done {', '.join(fence['steps'])}")
    return f"device {fence['device']}: " + "; ".join(parts)


def _names(pods: list[str]) -> str:
    if not pods:
        return "none"
    more = f" and {len(pods) - MAX_PODS} more" if len(pods) > MAX_PODS else ""
    return ", ".join(pods[:MAX_PODS]) + more
