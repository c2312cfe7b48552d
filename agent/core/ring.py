"""A bounded ring of kernel log lines, written by one thread and copied out by others (the log as read)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

from agent.core.columns import RecordColumns
from agent.core.timefmt import iso
from agent.core.types import LogRecord

_STAMP = len("2026-01-01T00:00:00Z ")  # what each line gets in front of its message


class LineRing:
    """The newest records as lines (``<RFC 3339 time> <message>``), at most ``max_lines`` and ``max_bytes``
    (UTF-8, a newline each) in all, a message cut at ``max_line`` characters; ``dropped`` counts the rest.

    The main loop hands over every kernel log record it reads; the diagnostics bundle copies them out as
    lines. Kept as (time, message, bytes) and written as text only when copied out (docs/benchmarks.md,
    "The kmsg fast path")."""

    def __init__(self, *, max_lines: int = 5000, max_bytes: int = 1 << 20, max_line: int = 1024) -> None:
        if max_lines < 1 or max_bytes < 1 or max_line < 1:
            raise ValueError("a ring needs room for at least one line")
        self._entries: collections.deque[tuple[float, str, int]] = collections.deque()
        self._bytes = 0
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._max_line = max_line
        self._lock = threading.Lock()
        self.dropped = 0

    def extend(self, records: Sequence[LogRecord]) -> None:
        newest = RecordColumns.of(records)[-self._max_lines :]  # older ones could not stay
        entries, max_line, max_lines, max_bytes = self._entries, self._max_line, self._max_lines, self._max_bytes
        with self._lock:
            self.dropped += len(records) - len(newest)
            for timestamp, message in zip(newest.timestamps, newest.messages, strict=True):
                if len(message) > max_line:
                    message = message[:max_line] + "..."
                size = _STAMP + (len(message) if message.isascii() else len(message.encode("utf-8", "replace"))) + 1
                entries.append((timestamp, message, size))
                self._bytes += size
                while len(entries) > max_lines or (self._bytes > max_bytes and len(entries) > 1):
                    self._bytes -= entries.popleft()[2]
                    self.dropped += 1

    def lines(self) -> list[str]:
        with self._lock:
            entries = list(self._entries)
        return [f"{iso(timestamp)} {message}" for timestamp, message, _ in entries]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
