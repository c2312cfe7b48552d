"""Times as Kubernetes prints them."""

from __future__ import annotations

import functools
import math
import re
from datetime import UTC, datetime

MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z, the largest time RFC 3339 (and Kubernetes) can print


def iso(ts: float) -> str:
    """RFC 3339 UTC with seconds precision, as Kubernetes prints times; out-of-range times are clamped."""
    ts = min(max(ts, 0.0), MAX_TIME) if ts == ts else 0.0  # NaN -> epoch
    fraction, whole = math.modf(ts)
    # the second datetime.fromtimestamp(ts) shows: it rounds to the microsecond first (x.9999996 -> x+1)
    return _iso_second(int(whole) + (round(fraction * 1e6) >= 1_000_000))


@functools.lru_cache(maxsize=64)
def _iso_second(second: int) -> str:
    """Formatting a time costs ~5 us; a flood of events prints the same few seconds again and again."""
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A condition message that starts with ``notBefore=<RFC 3339>`` names when something scheduled begins
# (ScheduledMaintenance, from EC2's scheduled events); the recovery policy's ``leadTime`` reads it.
_NOT_BEFORE = re.compile(r"^notBefore=(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)(?:\s|$)")


def not_before_prefix(ts: float) -> str:
    """``notBefore=2026-01-21T09:00:00Z``: how a message starts that names a scheduled time."""
    return f"notBefore={iso(ts)}"


def read_not_before(message: str) -> float | None:
    """The time a message starts with (:func:`not_before_prefix`), else None."""
    match = _NOT_BEFORE.match(message)
    if match is None:
        return None
    try:
        return datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:  # 2026-13-45T...: not a time
        return None
