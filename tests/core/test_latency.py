"""Latency histograms: cumulative buckets, and values that cannot be durations counted as 0."""

from __future__ import annotations

import math

import pytest

from agent.core.latency import Histogram


@pytest.mark.parametrize(
    ("observed", "buckets", "total"),
    [
        ([], [(1.0, 0), (10.0, 0), (math.inf, 0)], 0.0),
        ([0.5, 1.0, 2.0, 11.0], [(1.0, 2), (10.0, 3), (math.inf, 4)], 14.5),  # a bound is inclusive (le)
        ([math.nan, -3.0, math.inf], [(1.0, 3), (10.0, 3), (math.inf, 3)], 0.0),  # clock stepped back, junk
    ],
)
def test_buckets_are_cumulative_and_junk_counts_as_zero(observed, buckets, total):
    histogram = Histogram(bounds=(1, 10))
    for value in observed:
        histogram.observe(value)
    reading = histogram.snapshot()
    assert list(reading.buckets) == buckets
    assert reading.count == len(observed) and reading.total == total


@pytest.mark.parametrize("bounds", [(), (2, 1), (1, 1), (1, math.inf), (math.nan,)])
def test_bad_bounds_are_refused(bounds):
    with pytest.raises(ValueError, match="bounds"):
        Histogram(bounds=bounds)
