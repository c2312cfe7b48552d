"""Times as Kubernetes prints them."""

from __future__ import annotations

from datetime import UTC, datetime

MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z, the largest time RFC 3339 (and Kubernetes) can print


def iso(ts: float) -> str:
    """RFC 3339 UTC with seconds precision, as Kubernetes prints times; out-of-range times are clamped."""
    ts = min(max(ts, 0.0), MAX_TIME) if ts == ts else 0.0  # NaN -> epoch
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
