"""An operator's clear: the request on the Node, what the agent applied, and the boundary it keeps.

``node-health-agent clear`` writes a :class:`ClearRequest` as JSON in the Node's annotation
:data:`CLEAR_REQUEST_ANNOTATION`. The agent's main loop applies it (the condition, or one device's
problems, go back to healthy) and keeps a :class:`ClearRecord`: who, why, when, and the **boundary**,
the boot id and the last kernel record sequence number it had folded then. Records up to the boundary
never raise what was cleared again (a permanent rule replays the whole ring buffer at each start); a
new boot id voids the boundary (the ring is new). The records live in the state directory and, as the
acknowledgement the CLI waits for, in the Node's annotation :data:`CLEARS_ANNOTATION`.

The codec reads what anyone with write access to the Node may have put there, as strictly as
configuration: JSON objects of known fields, bounded strings, finite times, whole sequence numbers.
A broken value raises :class:`BadClear` (a ``ValueError``) naming the field; nothing else leaves it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.devices import DeviceRef, normalize_pci

CLEAR_REQUEST_ANNOTATION = "node-health-agent.io/clear-request"  # the operator's (the CLI writes it)
CLEARS_ANNOTATION = "node-health-agent.io/clears"  # the agent's: the clears it applied or refused, newest last
MAX_CLEARS = 16  # records kept (state directory and Node): the newest win
MAX_BLOB = 64 * 1024  # characters of one annotation value the codec reads
MAX_REASON = 512
MAX_WHO = 128
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z
APPLIED = "applied"
REFUSED = "refused"

_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_CONDITION = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")
_BOOT = re.compile(r"[A-Za-z0-9-]{1,64}")
_NEURON = re.compile(r"(?:neuron|nd)(\d{1,4})")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


class BadClear(ValueError):
    """A clear request or record breaks a rule; the message names the field."""


def normalize_device(text: str) -> str:
    """The device an operator names, in the form a finding's device carries: ``neuron3`` for ``nd3``, a PCI
    address as ``dddd:bb:ss.f``, ``kind:id`` kept (its id normalized), a GPU UUID or RDMA name as given."""
    text = text.strip()
    kind, sep, rest = text.partition(":")
    if sep and kind in ("gpu", "neuron", "rdma"):
        return f"{kind}:{normalize_device(rest)}"
    if (match := _NEURON.fullmatch(text.lower())) is not None:
        return f"neuron{int(match.group(1))}"
    if (pci := normalize_pci(text)) is not None:
        return pci
    if _NAME.fullmatch(text) is None:
        raise BadClear(f"device: not a device name: {text[:60]!r}")
    return text


def device_matches(ref: DeviceRef, device: str) -> bool:
    """Whether ``device`` (normalized) names ``ref``: its key, its id, its UUID or its name."""
    return device in (ref.key, ref.id, ref.uuid, ref.name, ref.pci)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClearRequest:
    """What an operator asked: clear ``condition`` (only ``device``'s problems when given)."""

    id: str
    condition: str
    device: str | None
    reason: str
    by: str
    at: float  # wall time of the request
    force: bool = False  # clear a device even where the agent does not see it failing

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "condition": self.condition,
            "device": self.device,
            "reason": self.reason,
            "by": self.by,
            "at": self.at,
            "force": self.force,
        }

    def describe(self) -> str:
        what = f"{self.condition} of device {self.device}" if self.device else self.condition
        return f"{what}, by {self.by}: {self.reason}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ClearRecord:
    """A request the agent handled: ``outcome`` applied or refused (``detail`` says what or why), and the
    boundary: records of boot ``boot_id`` up to sequence number ``seq`` no longer raise what it cleared."""

    request: ClearRequest
    outcome: str
    detail: str
    applied_at: float
    boot_id: str
    seq: int | None  # None: no kernel record folded yet (nothing before it to hold back)

    def holds_back(self, *, boot_id: str, seq: int | None) -> bool:
        """Whether the record ``seq`` of boot ``boot_id`` is before this clear's boundary."""
        return (
            self.outcome == APPLIED
            and self.seq is not None
            and seq is not None
            and boot_id == self.boot_id
            and seq <= self.seq
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.request.to_json(),
            "outcome": self.outcome,
            "detail": self.detail,
            "appliedAt": self.applied_at,
            "bootId": self.boot_id,
            "seq": self.seq,
        }


def _text(data: Mapping[str, Any], key: str, *, limit: int, pattern: re.Pattern[str] | None = None) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise BadClear(f"{key}: must be a string of 1 to {limit} characters, got {_show(value)}")
    if pattern is not None and pattern.fullmatch(value) is None:
        raise BadClear(f"{key}: must match {pattern.pattern}, got {_show(value)}")
    if not value.isprintable():
        raise BadClear(f"{key}: must be printable text, got {_show(value)}")
    return value


def _time(data: Mapping[str, Any], key: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadClear(f"{key}: must be a time in seconds, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise BadClear(f"{key}: must be a time in seconds, got {_show(value)}") from None
    if not (math.isfinite(number) and 0 <= number <= MAX_TIME):
        raise BadClear(f"{key}: must be a time from 1970 to 9999, got {_show(value)}")
    return number


def _show(value: object) -> str:
    if isinstance(value, str):
        return repr(value[:60]) + (f" (of {len(value)} characters)" if len(value) > 60 else "")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "an integer too large"
    if isinstance(value, dict | list):
        return f"a {type(value).__name__}"
    return repr(value)


_REQUEST_FIELDS = {"id", "condition", "device", "reason", "by", "at", "force"}
_RECORD_FIELDS = _REQUEST_FIELDS | {"outcome", "detail", "appliedAt", "bootId", "seq"}


def request_from_json(data: object, *, extra: Iterable[str] = ()) -> ClearRequest:
    """A :class:`ClearRequest` from its JSON object (raises :class:`BadClear`)."""
    if not isinstance(data, dict):
        raise BadClear(f"must be a JSON object, got {_show(data)}")
    unknown = sorted(str(k)[:40] for k in data if k not in _REQUEST_FIELDS | set(extra))
    if unknown:
        raise BadClear(f"unknown field(s) {', '.join(unknown)}")
    device = data.get("device")
    if device is not None and not isinstance(device, str):
        raise BadClear(f"device: must be a string or null, got {_show(device)}")
    force = data.get("force", False)
    if not isinstance(force, bool):
        raise BadClear(f"force: must be true or false, got {_show(force)}")
    return ClearRequest(
        id=_text(data, "id", limit=63, pattern=_ID),
        condition=_text(data, "condition", limit=63, pattern=_CONDITION),
        device=normalize_device(_text({"device": device}, "device", limit=140)) if device is not None else None,
        reason=_text(data, "reason", limit=MAX_REASON),
        by=_text(data, "by", limit=MAX_WHO),
        at=_time(data, "at"),
        force=force,
    )


def record_from_json(data: object) -> ClearRecord:
    """A :class:`ClearRecord` from its JSON object (raises :class:`BadClear`)."""
    request = request_from_json(data, extra=_RECORD_FIELDS)
    assert isinstance(data, dict)
    outcome = data.get("outcome")
    if outcome not in (APPLIED, REFUSED):
        raise BadClear(f"outcome: must be {APPLIED!r} or {REFUSED!r}, got {_show(outcome)}")
    seq = data.get("seq")
    if seq is not None and (type(seq) is not int or not 0 <= seq < 2**63):
        raise BadClear(f"seq: must be a whole number from 0, or null, got {_show(seq)}")
    detail = data.get("detail", "")
    if not isinstance(detail, str) or len(detail) > MAX_REASON:
        raise BadClear(f"detail: must be a string of at most {MAX_REASON} characters, got {_show(detail)}")
    return ClearRecord(
        request=request,
        outcome=outcome,
        detail=detail,
        applied_at=_time(data, "appliedAt"),
        boot_id=_text(data, "bootId", limit=64, pattern=_BOOT),
        seq=seq,
    )


def _loads(text: object, what: str) -> object:
    if not isinstance(text, str) or len(text) > MAX_BLOB:
        raise BadClear(f"{what}: must be JSON text of at most {MAX_BLOB} characters")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadClear(f"{what}: not JSON: {str(exc)[:80]}") from None


def parse_request(text: object) -> ClearRequest:
    """The request annotation's value (raises :class:`BadClear`, naming ``clear-request``)."""
    try:
        return request_from_json(_loads(text, "clear-request"))
    except BadClear as exc:
        raise BadClear(str(exc) if str(exc).startswith("clear-request") else f"clear-request: {exc}") from None


def parse_records(text: object) -> tuple[ClearRecord, ...]:
    """The records annotation's (or file's) value: ``{"clears": [...]}`` (raises :class:`BadClear`)."""
    data = _loads(text, "clears")
    if not isinstance(data, dict) or set(data) != {"clears"} or not isinstance(data["clears"], list):
        raise BadClear('clears: must be a JSON object {"clears": [...]}')
    items = data["clears"]
    if len(items) > 4 * MAX_CLEARS:
        raise BadClear(f"clears: at most {4 * MAX_CLEARS} records, got {len(items)}")
    records = []
    for i, item in enumerate(items):
        try:
            records.append(record_from_json(item))
        except BadClear as exc:
            raise BadClear(f"clears[{i}].{exc}") from None
    return tuple(records)


def records_text(records: Iterable[ClearRecord]) -> str:
    """The JSON text of ``records`` (the newest :data:`MAX_CLEARS`)."""
    kept = list(records)[-MAX_CLEARS:]
    return json.dumps({"clears": [r.to_json() for r in kept]}, sort_keys=True, separators=(",", ":"))


def merged(mine: Iterable[ClearRecord], theirs: Iterable[ClearRecord]) -> tuple[ClearRecord, ...]:
    """Both sets of records, one per request id (``mine`` wins), ordered by when applied, the newest kept."""
    by_id: dict[str, ClearRecord] = {r.request.id: r for r in theirs}
    by_id.update({r.request.id: r for r in mine})
    ordered = sorted(by_id.values(), key=lambda r: r.applied_at)
    return tuple(ordered[-MAX_CLEARS:])


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeClears:
    """Inbox item: what a producer read on the Node: the pending request (None: none, or ``problem`` says
    why it is unreadable) and the records the Node keeps."""

    request: ClearRequest | None
    records: tuple[ClearRecord, ...] = ()
    problem: str | None = None
