"""Go-style duration strings ("300ms", "5m", "1h30m", "0") as used by node-problem-detector configs."""

from __future__ import annotations

import math
import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h|d)")


def parse_duration(value: object) -> float:
    """Seconds for a Go duration string (or a bare number of seconds). Raises ValueError with the reason."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '5m', got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):  # .nan or .inf in YAML: a NaN interval never comes due, yet never waits
            raise ValueError(f"duration must be a finite number of seconds, got {value!r}")
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value!r}")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a duration like '5m', got {value!r}")
    text = value.strip()
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"invalid duration {value!r} (use e.g. '30s', '5m', '1h30m')")
    if not math.isfinite(total):  # hundreds of digits
        raise ValueError(f"duration {value!r} is too long")
    return total


def format_duration(seconds: float) -> str:
    """A short human form: 90 → '1m30s'."""
    seconds = int(round(seconds))
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)
