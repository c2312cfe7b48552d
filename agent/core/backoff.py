"""The one retry policy of the agent: exponential backoff with jitter, honouring ``Retry-After``.

Every part that retries (kmsg reader reopen, relay reconnect, Node reads, condition and Event
writes) uses this class, so a fleet of agents backs off the same way when the API server or the
kernel log is in trouble. It only computes delays; callers wait with their own injected
``sleep``/``stop.wait`` and clock, so tests never sleep for real.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Delays ``initial * multiplier**n`` up to ``maximum``, each spread by ``±jitter`` (a fraction).

    ``next_delay()`` returns the delay to wait now and advances; ``reset()`` after a success.
    A server's ``Retry-After`` and a caller's floor (e.g. a resync period) are lower bounds: the
    agent never retries sooner than the server asked, whatever the jitter says.
    """

    def __init__(
        self,
        *,
        initial: float,
        maximum: float,
        multiplier: float = 2.0,
        jitter: float = 0.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < initial <= maximum or multiplier < 1 or not 0 <= jitter < 1:
            raise ValueError("need 0 < initial <= maximum, multiplier >= 1 and 0 <= jitter < 1")
        self._initial = initial
        self._maximum = maximum
        self._multiplier = multiplier
        self._jitter = jitter
        self._rng = rng
        self._nominal = initial
        self.failures = 0  # consecutive failures since the last reset

    @property
    def delay(self) -> float:
        """The nominal (unjittered) delay the next failure will wait."""
        return self._nominal

    def reset(self) -> None:
        self._nominal = self._initial
        self.failures = 0

    def next_delay(self, *, retry_after: float | None = None, at_least: float = 0.0) -> float:
        """The delay to wait after one more failure; advances the schedule."""
        delay = self._nominal
        if self._jitter:
            delay *= 1 + self._jitter * (2 * self._rng() - 1)
        self._nominal = min(self._nominal * self._multiplier, self._maximum)
        self.failures += 1
        return max(delay, retry_after or 0.0, at_least)
