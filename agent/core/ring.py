"""A bounded ring of text lines, written by one thread and copied out by others (the kernel log as read)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable


class LineRing:
    """The newest lines, at most ``max_lines`` and ``max_bytes`` (UTF-8) in all; ``dropped`` counts the rest.

    The main loop appends every kernel log record it reads; the diagnostics bundle copies them out."""

    def __init__(self, *, max_lines: int = 5000, max_bytes: int = 1 << 20, max_line: int = 1024) -> None:
        if max_lines < 1 or max_bytes < 1 or max_line < 1:
            raise ValueError("a ring needs room for at least one line")
        self._lines: collections.deque[str] = collections.deque()
        self._bytes = 0
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._max_line = max_line
        self._lock = threading.Lock()
        self.dropped = 0

    def extend(self, lines: Iterable[str]) -> None:
        with self._lock:
            for line in lines:
                if len(line) > self._max_line:
                    line = line[: self._max_line] + "..."
                self._lines.append(line)
                self._bytes += len(line.encode("utf-8", "replace")) + 1
                while len(self._lines) > self._max_lines or (self._bytes > self._max_bytes and len(self._lines) > 1):
                    old = self._lines.popleft()
                    self._bytes -= len(old.encode("utf-8", "replace")) + 1
                    self.dropped += 1

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def clear(self) -> None:
        with self._lock:
            self._lines.clear()
            self._bytes = 0
