"""A value rebuilt only when what it is built from changes.

The metrics collectors build their families on every scrape from figures that rarely move between two
scrapes; with the family objects unchanged, the ``/metrics`` renderer (:mod:`agent.app.exposition`)
recognises them and reuses their text instead of writing ~470 samples again (issue 16: a scrape held
the interpreter lock 3-4 ms, which the kernel log reader and the main loop waited out).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """``memo(key)`` is ``build(key)``, built again only when ``key`` differs (``!=``) from the last one.

    Keys must be values (tuples, frozen dataclasses), never objects changed in place after the call.
    Safe to call from several threads: each call sees a (key, value) pair that belongs together, at worst
    two threads build at once.
    """

    def __init__(self, build: Callable[[K], V]) -> None:
        self._build = build
        self._last: tuple[K, V] | None = None

    def __call__(self, key: K) -> V:
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        value = self._build(key)
        self._last = (key, value)
        return value


def written_alike(sample: Any, before: Any) -> bool:
    """Whether two prometheus ``Sample``s are written alike: equal, and a zero of the same sign (NaN never
    equals itself, so a NaN is written again)."""
    if sample is before:
        return True
    return sample == before and (
        sample.value != 0 or math.copysign(1.0, sample.value) == math.copysign(1.0, before.value)
    )
