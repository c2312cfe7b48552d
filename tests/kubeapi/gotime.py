"""Timestamps as the Kubernetes API server parses and prints them.

``metav1.Time`` is parsed with Go's ``time.RFC3339`` layout (fractional seconds are accepted and
dropped, a ``Z`` or ``+hh:mm`` zone is required) and printed in UTC with whole seconds.
``metav1.MicroTime`` is parsed with the layout ``2006-01-02T15:04:05.000000Z07:00``: exactly six
fractional digits are required, and it is printed in UTC with six digits.

Error texts follow Go's ``time.ParseError`` wording closely enough for a reader to recognise them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

TIME_LAYOUT = "2006-01-02T15:04:05Z07:00"
MICRO_TIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"

_DATE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})")
_ZONE = re.compile(r"Z|[+-](\d{2}):(\d{2})")


class TimeParseError(ValueError):
    """A timestamp the API server's JSON decoder would reject."""


def _fail(value: str, layout: str, rest: str, element: str) -> TimeParseError:
    return TimeParseError(f'parsing time "{value}" as "{layout}": cannot parse "{rest}" as "{element}"')


def _parse(value: str, *, micro: bool) -> datetime:
    layout = MICRO_TIME_LAYOUT if micro else TIME_LAYOUT
    head = _DATE_TIME.match(value)
    if head is None:
        raise _fail(value, layout, value, "2006")
    year, month, day, hour, minute, second = (int(g) for g in head.groups())
    rest = value[head.end() :]
    micros = 0
    if micro:
        if len(rest) < 7 or rest[0] not in ".," or not rest[1:7].isdigit():
            raise _fail(value, layout, rest, ".000000")
        micros = int(rest[1:7])
        rest = rest[7:]
    elif rest[:1] in (".", ",") and rest[1:2].isdigit():
        digits = re.match(r"\d+", rest[1:])
        assert digits is not None
        frac = digits.group(0)
        micros = int((frac + "000000")[:6])
        rest = rest[1 + len(frac) :]
    zone = _ZONE.match(rest)
    if zone is None:
        raise _fail(value, layout, rest, "Z07:00")
    if zone.end() != len(rest):
        raise TimeParseError(f'parsing time "{value}": extra text: "{rest[zone.end() :]}"')
    if zone.group(0) == "Z":
        tz: timezone = UTC
    else:
        hours, minutes = int(zone.group(1)), int(zone.group(2))
        if hours > 24 or minutes > 59:
            raise TimeParseError(f'parsing time "{value}": time zone offset out of range')
        offset = timedelta(hours=hours, minutes=minutes)
        tz = timezone(-offset if rest[0] == "-" else offset)
    try:
        return datetime(year, month, day, hour, minute, second, micros, tzinfo=tz)
    except ValueError as exc:
        raise TimeParseError(f'parsing time "{value}": {exc}') from exc


def parse_time(value: str) -> datetime:
    """Parse a ``metav1.Time`` string; raise :class:`TimeParseError` where Go would fail."""
    return _parse(value, micro=False)


def parse_micro_time(value: str) -> datetime:
    """Parse a ``metav1.MicroTime`` string; raise :class:`TimeParseError` where Go would fail."""
    return _parse(value, micro=True)


def format_time(moment: datetime) -> str:
    """Print like ``metav1.Time``: UTC, whole seconds, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """Print like ``metav1.MicroTime``: UTC, six fractional digits, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
