"""The loop both log tailers share: one polling step at a time, until stopped, then close."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Poll:
    """One step of a reader: a chunk (or None), and how long to wait before the next step."""

    chunk: Any
    wait: float


def polled_chunks(
    *,
    poll_once: Callable[[], Poll],
    close: Callable[[], None],
    stop: threading.Event,
    sleep: Callable[[float], object] | None = None,
) -> Iterator[Any]:
    """Yield the chunks ``poll_once`` produces until ``stop`` is set; ``close`` when this ends."""
    wait = sleep if sleep is not None else stop.wait
    try:
        while not stop.is_set():
            step = poll_once()
            if step.chunk is not None:
                yield step.chunk
            if step.wait > 0 and not stop.is_set():
                wait(step.wait)
    finally:
        close()
