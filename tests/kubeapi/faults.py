"""Fault injection: answer matching requests with an error, a hang or a dropped connection.

A fault never touches storage (the request is answered before it reaches the API logic), except
``slow``: the request is carried out, and only its answer is late; and ``applied``: the request is
carried out, and the answer is an error all the same (as from a proxy, or an API server whose
storage write committed after its own timeout).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Literal

FaultKind = Literal["status", "timeout", "drop", "slow", "applied"]


@dataclass
class FaultRule:
    """Matches requests by method, a regex searched in the path (query excluded) and optionally
    a regex searched in the request body (as text).

    ``count`` is how many requests it still answers (``None``: every one).
    """

    method: str | None = None
    path_regex: str | None = None
    kind: FaultKind = "status"
    status: int = 500
    count: int | None = 1
    retry_after: int | None = None
    delay: float = 5.0
    message: str | None = None
    hits: int = 0
    body_regex: str | None = None
    _pattern: re.Pattern[str] | None = field(default=None, repr=False)
    _body_pattern: re.Pattern[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._pattern = re.compile(self.path_regex) if self.path_regex else None
        self._body_pattern = re.compile(self.body_regex) if self.body_regex else None

    def matches(self, method: str, path: str, body: str = "") -> bool:
        if self.count is not None and self.count <= 0:
            return False
        if self.method and self.method.upper() != method.upper():
            return False
        if self._body_pattern is not None and self._body_pattern.search(body) is None:
            return False
        return self._pattern is None or self._pattern.search(path) is not None


class FaultInjector:
    """The rules of one server; the first matching rule with budget left answers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def add(
        self,
        *,
        method: str | None = None,
        path_regex: str | None = None,
        status: int = 500,
        count: int | None = 1,
        retry_after: int | None = None,
        kind: FaultKind = "status",
        delay: float = 5.0,
        message: str | None = None,
        body_regex: str | None = None,
    ) -> FaultRule:
        """Add a rule.  ``kind="status"`` answers ``status`` (429/500/503/504/...) with a Status
        body (and ``Retry-After`` when given); ``"timeout"`` waits ``delay`` seconds then closes the
        connection without answering; ``"drop"`` closes the connection at once; ``"slow"`` carries
        the request out (a create is stored) and answers only after ``delay`` seconds, so a client
        with a shorter timeout never learns the outcome; ``"applied"`` carries the request out and answers
        ``status`` anyway (the client sees an error for a write that happened).  ``body_regex`` narrows the rule to
        requests whose body text contains a match (e.g. one Event's reason)."""
        if kind not in ("status", "timeout", "drop", "slow", "applied"):
            raise ValueError(f"unknown fault kind {kind!r}")
        rule = FaultRule(
            method=method,
            path_regex=path_regex,
            kind=kind,
            status=status,
            count=count,
            retry_after=retry_after,
            delay=delay,
            message=message,
            body_regex=body_regex,
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def take(self, method: str, path: str, body: str = "") -> FaultRule | None:
        """The rule that answers this request (its budget is consumed), if any."""
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, path, body):
                    rule.hits += 1
                    if rule.count is not None:
                        rule.count -= 1
                    return rule
        return None

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for r in self._rules if r.count is None or r.count > 0)
