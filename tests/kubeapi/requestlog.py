"""A thread-safe record of the requests a server answered."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RequestRecord:
    """One request.  ``status`` is ``None`` when no response was sent (drop, timeout, outage);
    ``fault`` names the injected fault kind that answered it, if any; ``at`` is when it arrived
    (``time.monotonic()``: one clock for every process on the machine); ``objects`` how many API
    objects the answer carried."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    status: int | None
    body: Any = None
    fault: str | None = None
    at: float = field(default_factory=time.monotonic)
    objects: int = 0  # API objects in the answer: a list's items, 1 for one object (what the server sent)


class RequestLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def append(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def __getitem__(self, index: int) -> RequestRecord:
        with self._lock:
            return self._records[index]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def filter(
        self,
        *,
        method: str | None = None,
        path_regex: str | None = None,
        status: int | None = None,
        content_type: str | None = None,
    ) -> list[RequestRecord]:
        """Records matching every given criterion (``path_regex`` is searched in the path)."""
        pattern = re.compile(path_regex) if path_regex else None
        return [
            r
            for r in self.snapshot()
            if (method is None or r.method == method.upper())
            and (pattern is None or pattern.search(r.path))
            and (status is None or r.status == status)
            and (content_type is None or r.content_type == content_type)
        ]

    def count(self, **criteria: Any) -> int:
        return len(self.filter(**criteria))
