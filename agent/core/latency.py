"""Latency histograms the agent keeps and exports at scrape time (Prometheus ``histogram`` type).

A :class:`Histogram` is filled by the component that sees both ends of an interval (the condition
sink: a kernel line's time to the Node write) and read by the metrics collector; observing is one
lock and one bucket search, so it costs nothing on the hot path. Values that cannot be a duration
(NaN, infinities, negative: a clock stepped back) are counted in the lowest bucket as 0, never dropped
silently and never raising.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.core import HistogramMetricFamily

# Seconds: from well under the agent's own p99 (about 11 ms) to the 10 minutes past which nobody waits.
DETECTION_BOUNDS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
# Seconds: recovery's phases, from a cordon a second after detection to an incident open for a day.
RECOVERY_BOUNDS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 21600, 86400)


@dataclass(frozen=True, kw_only=True, slots=True)
class HistogramSnapshot:
    """One reading: cumulative counts per upper bound (the last bound is +Inf), their sum and count."""

    buckets: tuple[tuple[float, int], ...]
    total: float
    count: int


class Histogram:
    """A thread-safe fixed-bucket histogram of durations in seconds."""

    def __init__(self, *, bounds: Sequence[float] = DETECTION_BOUNDS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds or not all(math.isfinite(b) for b in bounds):
            raise ValueError("histogram bounds must be finite, distinct and ascending")
        self._bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._total = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        value = seconds if math.isfinite(seconds) and seconds > 0 else 0.0
        index = bisect.bisect_left(self._bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._total += value

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            counts = list(self._counts)
            total = self._total
        cumulative: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self._bounds, math.inf), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return HistogramSnapshot(buckets=tuple(cumulative), total=total, count=running)


def histogram_metric(name: str, doc: str, value: HistogramSnapshot) -> HistogramMetricFamily:
    """``value`` as a Prometheus histogram family (cumulative buckets, +Inf last)."""
    family = HistogramMetricFamily(name, doc)
    buckets = [("+Inf" if math.isinf(bound) else repr(float(bound)), count) for bound, count in value.buckets]
    family.add_metric([], buckets=buckets, sum_value=value.total)
    return family
