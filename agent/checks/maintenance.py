"""EC2 scheduled events as the condition ``ScheduledMaintenance`` (the agent's own check, issue 15).

EC2 tells an instance about maintenance it has scheduled through the instance metadata service,
``/latest/meta-data/events/maintenance/scheduled``: a JSON list of events, each with ``Code``
(``instance-reboot``, ``system-reboot``, ``system-maintenance``, ``instance-retirement``,
``instance-stop``), ``NotBefore``/``NotAfter`` as EC2 prints them (``21 Jan 2026 09:00:00 GMT``),
``State`` (``active``, ``completed``, ``canceled``), ``EventId`` and ``Description``. Completed and
canceled events stay listed for a while; they do not count.

:class:`ScheduledMaintenanceCheck` polls that path (through the agent's IMDSv2 client, handed in as
``fetch``; its whole-request deadline ends a slow or trickling answer before this check's timeout, so
the next poll always comes) and reports:

- ``PROBLEM`` on ``ScheduledMaintenance`` while an event is pending, with the reason of the earliest
  one (``ScheduledInstanceRetirement``, ...; an unknown code is ``ScheduledMaintenanceOther``) and a
  message that starts with ``notBefore=<RFC 3339>`` (what the recovery policy's ``leadTime`` reads,
  :func:`agent.core.timefmt.read_not_before`), then the code, the window and the event id;
- ``OK`` when none is pending;
- ``UNKNOWN`` when the answer cannot be had or read (not on EC2, a refused token, an answer not done
  by the client's deadline: ``ImdsTimeout``, a body that is not a JSON list, an event without a readable
  ``NotBefore``, year 0000 included): the condition keeps what it was.

The answer is hostile input: the IMDS client reads at most 64 KiB; at most :data:`MAX_EVENTS` events
are looked at; every text is cut and stripped of control characters before it reaches a message.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.checks.model import CheckResult, CheckStatus
from agent.core.timefmt import iso, not_before_prefix
from agent.core.types import ConditionSpec, Severity

CONDITION = "ScheduledMaintenance"
IMDS_PATH = "meta-data/events/maintenance/scheduled"
INTERVAL = 300.0  # seconds between polls: EC2 schedules events days (at least hours) ahead
TIMEOUT = 10.0  # token + one GET: the IMDS client's whole-request deadline (5 s) ends them well before
MAX_EVENTS = 32  # events looked at in one answer (EC2 lists a handful at most)
MAX_TEXT = 120  # characters of any text taken from the answer into a message

# EC2's event codes -> our reasons (CamelCase, as every reason).
REASONS = {
    "instance-reboot": "ScheduledInstanceReboot",
    "system-reboot": "ScheduledSystemReboot",
    "system-maintenance": "ScheduledSystemMaintenance",
    "instance-retirement": "ScheduledInstanceRetirement",
    "instance-stop": "ScheduledInstanceStop",
}
OTHER = "ScheduledMaintenanceOther"  # a code this agent does not know (reported, never a crash)
NONE_PENDING = "NoScheduledMaintenance"
DONE_STATES = frozenset({"completed", "canceled", "cancelled"})

SPEC = ConditionSpec(
    type=CONDITION,
    reason=NONE_PENDING,
    message="no EC2 scheduled event is pending for this instance",
    source="scheduled-maintenance",
    declared_in="the agent (--scheduled-maintenance)",
)

_MONTHS = {
    m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)
}
# "21 Jan 2026 09:00:00 GMT" (EC2's format; the day may have one digit)
_EC2_TIME = re.compile(r"^(\d{1,2}) ([A-Z][a-z]{2}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) (?:GMT|UTC)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class EventError(ValueError):
    """An answer (or one event in it) that cannot be read; the message says which field and why."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduledEvent:
    code: str
    reason: str
    not_before: float  # epoch seconds
    not_after: float | None
    state: str
    event_id: str
    description: str


def parse_ec2_time(text: object, *, field: str) -> float:
    """``21 Jan 2026 09:00:00 GMT`` -> epoch seconds; EventError naming ``field`` otherwise."""
    if not isinstance(text, str):
        raise EventError(f"{field} must be a string like '21 Jan 2026 09:00:00 GMT', got {type(text).__name__}")
    match = _EC2_TIME.match(text.strip())
    month = _MONTHS.get(match.group(2)) if match else None
    if match is None or month is None:
        raise EventError(f"{field} {_clean(text)!r} is not a time like '21 Jan 2026 09:00:00 GMT'")
    day, year, hour, minute, second = (int(match.group(i)) for i in (1, 3, 4, 5, 6))
    if year < 1:  # the calendar starts at year 1: "0000" is no date (and must not raise out of the check)
        raise EventError(f"{field} {_clean(text)!r} is not a valid date and time (year {year:04d})")
    if not (1 <= day <= calendar.monthrange(year, month)[1] and hour < 24 and minute < 60 and second < 60):
        raise EventError(f"{field} {_clean(text)!r} is not a valid date and time")
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 1, 0)))


def _clean(value: object) -> str:
    text = _CONTROL.sub(" ", str(value)).strip()
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def parse_events(body: str) -> tuple[list[ScheduledEvent], list[str]]:
    """The pending events of an IMDS answer (earliest ``NotBefore`` first) and what was odd about it
    (unknown codes, events past :data:`MAX_EVENTS`). Raises EventError when the answer cannot be read:
    not JSON, not a list, an event that is not an object or whose pending ``NotBefore`` is unreadable."""
    text = body.strip()
    if not text:
        return [], []  # EC2 answers [] when nothing is scheduled; an empty body says the same
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EventError(f"the answer is not JSON ({_clean(exc)})") from None
    if not isinstance(data, list):
        raise EventError(f"the answer must be a JSON list of events, got {type(data).__name__}")
    notes = []
    if len(data) > MAX_EVENTS:
        notes.append(f"{len(data)} events listed, the first {MAX_EVENTS} looked at")
    pending: list[ScheduledEvent] = []
    for index, item in enumerate(data[:MAX_EVENTS]):
        where = f"event {index}"
        if not isinstance(item, dict):
            raise EventError(f"{where} must be a JSON object, got {type(item).__name__}")
        state = _clean(item.get("State", "active")).lower()
        description = _clean(item.get("Description", ""))
        if state in DONE_STATES or description.lower().startswith(("[completed]", "[canceled]", "[cancelled]")):
            continue
        code = _clean(item.get("Code", ""))
        reason = REASONS.get(code, OTHER)
        if reason == OTHER:
            notes.append(f"unknown event code {code!r}")
        not_before = parse_ec2_time(item.get("NotBefore"), field=f"{where}.NotBefore")
        not_after = None
        if item.get("NotAfter") not in (None, ""):
            not_after = parse_ec2_time(item.get("NotAfter"), field=f"{where}.NotAfter")
        pending.append(
            ScheduledEvent(
                code=code,
                reason=reason,
                not_before=not_before,
                not_after=not_after,
                state=state,
                event_id=_clean(item.get("EventId", "")),
                description=description,
            )
        )
    pending.sort(key=lambda e: e.not_before)
    return pending, notes


def describe(events: Sequence[ScheduledEvent], notes: Sequence[str] = ()) -> str:
    """The condition's message: ``notBefore=<first>`` first (read back by the recovery policy), then each event."""
    first = events[0]
    parts = []
    for e in events:
        window = f"{iso(e.not_before)}" + (f" to {iso(e.not_after)}" if e.not_after is not None else "")
        said = f": {e.description}" if e.description else ""
        parts.append(f"{e.code or '(no code)'} {window} ({e.event_id or 'no id'}{said})")
    extra = f"; {'; '.join(notes)}" if notes else ""
    return f"{not_before_prefix(first.not_before)} EC2 scheduled event: {'; '.join(parts)}{extra}"


class ScheduledMaintenanceCheck:
    """The check (see the module docstring). ``fetch(path)`` is the IMDSv2 client's ``get``; it raises
    on failure (``agent.adapters.aws.AwsError``: anything it raises is UNKNOWN with its text)."""

    def __init__(
        self, *, fetch: Callable[[str], str], name: str = "scheduled-maintenance", interval: float = INTERVAL
    ) -> None:
        self._fetch = fetch
        self._name = name
        self._interval = interval

    @property
    def name(self) -> str:
        return self._name

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def timeout(self) -> float:
        return TIMEOUT

    @property
    def conditions(self) -> Sequence[ConditionSpec]:
        return (SPEC,)

    def run(self) -> list[CheckResult]:
        try:
            body = self._fetch(IMDS_PATH)
        except Exception as exc:  # the IMDS client's AwsError (not on EC2, token refused, timeout): not the node's
            reason = "ImdsTimeout" if getattr(exc, "code", "") == "ImdsTimeout" else "ImdsUnavailable"
            return [self._unknown(reason, f"cannot read EC2 scheduled events: {_clean(exc)}")]
        try:
            events, notes = parse_events(body)
        except EventError as exc:
            return [self._unknown("ScheduledEventsUnreadable", f"EC2 scheduled events answer refused: {exc}")]
        if not events:
            return [CheckResult(status=CheckStatus.OK, condition=CONDITION, reason=NONE_PENDING, message=SPEC.message)]
        return [
            CheckResult(
                status=CheckStatus.PROBLEM,
                condition=CONDITION,
                reason=events[0].reason,
                message=describe(events, notes),
                severity=Severity.WARNING,
            )
        ]

    def _unknown(self, reason: str, message: str) -> CheckResult:
        return CheckResult(status=CheckStatus.UNKNOWN, condition=CONDITION, reason=reason, message=message)
