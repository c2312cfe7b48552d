"""The kernel log as a producer component: a source's record batches go into the inbox."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from agent.core.bus import Inbox, RecordBatch
from agent.core.supervisor import Wakeable
from agent.core.types import LogRecord
from agent.sources.kmsg.stats import KmsgStats


class Source(Protocol):
    """A kernel log source (``KmsgReader`` or ``RelayClient``): never raises, ends only on stop.

    ``chunks`` runs in the producer's thread and should only do I/O; ``decode`` turns one chunk into
    records and runs in the main loop, in chunk order.
    """

    @property
    def stats(self) -> KmsgStats: ...

    def chunks(self, *, stop: threading.Event) -> Iterator[Any]: ...

    def decode(self, chunk: Any) -> Sequence[LogRecord]: ...


@runtime_checkable
class CatchUp(Protocol):
    """A source that can tell whether records are waiting that it has not read, and then read them at once
    (``KmsgReader``: the device, whose readers the kernel wakes only at its next tick)."""

    def catch_up(self) -> bool:
        """Whether such records wait now; if so, the source reads them now (any thread, any time; cheap: one
        call per scrape)."""


class SourceProducer:
    """Component ``kmsg_reader`` (or ``log:<source>`` for a log monitor): healthy while the source
    answers within ``stall_timeout``.

    The source refreshes ``stats.last_activity`` only while it is open and answering, so a missing
    or unreadable kernel log (EPERM under ``dmesg_restrict``), a silent relay, or a main loop that
    stopped taking batches (the put blocks) all turn it unhealthy.
    """

    name = "kmsg_reader"

    def __init__(
        self,
        *,
        source: Source,
        inbox: Inbox,
        stall_timeout: float,
        name: str = "kmsg_reader",
        monitor: str | None = None,
    ) -> None:
        self.source = source
        self.name = name
        self._inbox = inbox
        self._stall_timeout = stall_timeout
        self._monitor = monitor
        self._catch_up = source.catch_up if isinstance(source, CatchUp) else None

    def healthy(self, now: float) -> bool:
        stats = self.source.stats
        if self._monitor is not None and not stats.connected:
            # A log monitor waiting for its file (or for journalctl) is the node's configuration, not a
            # fault of the agent: /healthz details say why, the component stays green.
            return True
        last = stats.last_activity
        return last is not None and now - last < self._stall_timeout

    def detail(self) -> str | None:
        return self.source.stats.last_error

    def catch_up(self) -> bool:
        """Whether the source has records it has not read yet, which it then reads at once; False where it
        cannot tell (a relay, a fake)."""
        return self._catch_up is not None and self._catch_up()

    def wake(self) -> None:
        """Stop was set: a source that sleeps on its file descriptor is told to look now."""
        if isinstance(self.source, Wakeable):
            self.source.wake()

    def run(self, stop: threading.Event) -> None:
        decode = self.source.decode
        for chunk in self.source.chunks(stop=stop):
            batch = RecordBatch(decode=functools.partial(decode, chunk), monitor=self._monitor)
            if not self._inbox.put(batch, stop=stop):
                return
