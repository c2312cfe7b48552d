"""bench/run.py's wait for a detector's count: the full count, or the count once it stops rising."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.run import _settled


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _reads(values: list[float]) -> Callable[[], float]:
    """The count over time: one value per read, the last one repeated."""
    it = iter(values)
    last = [0.0]

    def read() -> float:
        last[0] = next(it, last[0])
        return last[0]

    return read


@pytest.mark.parametrize(
    ("counts", "expected", "settled", "reads_at_most"),
    [
        ([0, 5, 10], 10, 10, 3),  # reaches the count: returns at once
        ([0, 5, 7], 10, 7, 3 + 75),  # stops at 7: 15 s quiet (75 looks of 0.2 s), then returns what it has
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 10, 10, 11),  # slow but rising: waits it out
        ([3], 0, 3, 1),  # nothing expected: no wait
    ],
)
def test_settles_on_the_full_count_or_a_quiet_spell(
    counts: list[float], expected: float, settled: float, reads_at_most: int
) -> None:
    clock = _Clock()
    read = _reads([float(c) for c in counts])
    seen: list[float] = []

    def counted() -> float:
        seen.append(read())
        return seen[-1]

    assert _settled(counted, expected, timeout=300.0, quiet=15.0, clock=clock, sleep=clock.sleep) == settled
    assert len(seen) <= reads_at_most + 1


def test_a_count_still_rising_past_the_timeout_stops_the_run() -> None:
    clock = _Clock()
    rising = iter(range(10_000))
    with pytest.raises(SystemExit, match=r"did not complete in 10 s: \d+ of 100000"):
        _settled(lambda: float(next(rising)), 100_000, timeout=10.0, quiet=15.0, clock=clock, sleep=clock.sleep)
