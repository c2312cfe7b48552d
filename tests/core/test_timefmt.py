"""Times as Kubernetes prints them: iso() shows the second datetime shows, whatever the float."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from agent.core.timefmt import MAX_TIME, iso


def _datetime_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (0.0, "1970-01-01T00:00:00Z"),
        (1.9999994, "1970-01-01T00:00:01Z"),  # rounds to x.999999: still second 1
        (1.9999996, "1970-01-01T00:00:02Z"),  # rounds to the next microsecond: second 2
        (1_700_000_000.5, "2023-11-14T22:13:20Z"),
        (-5.0, "1970-01-01T00:00:00Z"),  # clamped
        (float("nan"), "1970-01-01T00:00:00Z"),
        (float("inf"), "9999-12-31T23:59:59Z"),
        (MAX_TIME, "9999-12-31T23:59:59Z"),
    ],
)
def test_iso_prints_seconds_as_kubernetes_does(ts: float, expected: str) -> None:
    assert iso(ts) == expected


def test_iso_agrees_with_datetime_on_every_kind_of_fraction() -> None:
    rng = random.Random(16)
    stamps = [rng.uniform(0, 4e9) for _ in range(2000)]
    stamps += [s + d for s in (1.0, 1_700_000_000.0) for d in (-1e-7, -5e-7, -4.9e-7, 0.0, 4.9e-7, 5e-7)]
    stamps += [1_700_000_000 + k + 0.9999995 for k in range(50)]  # half a microsecond below the next second
    for ts in stamps:
        assert iso(ts) == _datetime_iso(ts), ts
    for ts in stamps:  # a second time: from the memo, the same
        assert iso(ts) == _datetime_iso(ts), ts
