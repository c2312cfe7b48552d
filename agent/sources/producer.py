"""The kernel log as a producer component: a source's record batches go into the inbox."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Protocol

from agent.runtime import Inbox, RecordBatch
from agent.sources.kmsg import KmsgStats
from agent.types import LogRecord


class Source(Protocol):
    """A kernel log source (``KmsgReader`` or ``RelayClient``): never raises, ends only on stop."""

    @property
    def stats(self) -> KmsgStats: ...

    def batches(self, *, stop: threading.Event) -> Iterator[list[LogRecord]]: ...


class SourceProducer:
    """Component ``kmsg_reader``: healthy while the source answers within ``stall_timeout``.

    The source refreshes ``stats.last_activity`` only while it is open and answering, so a missing
    or unreadable kernel log (EPERM under ``dmesg_restrict``), a silent relay, or a main loop that
    stopped taking batches (the put blocks) all turn it unhealthy.
    """

    name = "kmsg_reader"

    def __init__(self, *, source: Source, inbox: Inbox, stall_timeout: float) -> None:
        self.source = source
        self._inbox = inbox
        self._stall_timeout = stall_timeout

    def healthy(self, now: float) -> bool:
        last = self.source.stats.last_activity
        return last is not None and now - last < self._stall_timeout

    def detail(self) -> str | None:
        return getattr(self.source.stats, "last_error", None)

    def run(self, stop: threading.Event) -> None:
        for batch in self.source.batches(stop=stop):
            if batch and not self._inbox.put(RecordBatch(records=batch), stop=stop):
                return
