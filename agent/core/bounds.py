"""Bounds on what input can make the agent write: the length of a reason or a message, and how many
distinct reasons a condition or a rule may spread over label values.

A kernel line, a plugin's output or a hand-edited state file may carry text of any length, and a
storm may carry any number of distinct values. What the agent writes (Node conditions, Events,
Prometheus series, CloudWatch metrics) must stay valid for its receiver and bounded in number. The
limits and the one way of cutting a value live here, so that every rule and every sink cuts the
same value the same way and they never disagree.

- **Reasons** are at most :data:`MAX_REASON` bytes (UTF-8), the Kubernetes limit on an Event's
  reason. A longer one keeps its first characters, then ``_`` and 8 hex digits of the SHA-256 of
  the whole reason (:func:`bounded_reason`): the same text always gives the same reason, distinct
  long texts stay distinct, and a short reason is never changed.
- **Messages** are at most :data:`MAX_MESSAGE` bytes (an Event's note limit), cut with ``...``.
- **Distinct reasons**: each condition type and each temporary rule counts at most
  :data:`MAX_REASONS` distinct reasons that the configuration did not declare; occurrences of any
  further reason are counted under :data:`OVERFLOW_REASON` (:class:`ProblemCounts`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Iterable

MAX_REASON = 128  # bytes: an Event's reason (events.k8s.io validation); CloudWatch names allow 255
MAX_MESSAGE = 1024  # bytes: an Event's note (events.k8s.io validation)
MAX_REASONS = 64  # distinct undeclared reasons per condition type or temporary rule, in metrics
OVERFLOW_REASON = "Other"  # the reason label counting the rest
_DIGEST = 8  # hex digits of the SHA-256 that end a cut reason


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "replace")  # a lone surrogate (never from our sources) becomes "?"


def _cut(data: bytes, limit: int) -> str:
    """The longest prefix of ``data`` within ``limit`` bytes that ends on a whole character."""
    return data[:limit].decode("utf-8", "ignore")


def bounded_reason(reason: str, limit: int = MAX_REASON) -> str:
    """``reason`` if it fits in ``limit`` UTF-8 bytes, else its first characters + ``_`` + 8 hex digits
    of the SHA-256 of the whole reason (``limit`` bytes at most)."""
    if len(reason) <= limit and reason.isascii():
        return reason  # the usual case, without encoding
    data = _utf8(reason)
    if len(data) <= limit:
        return data.decode("utf-8")
    digest = hashlib.sha256(data).hexdigest()[:_DIGEST]
    return f"{_cut(data, limit - _DIGEST - 1)}_{digest}"


def bounded_message(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` if it fits in ``limit`` UTF-8 bytes, else cut to fit with ``...`` at the end."""
    if len(message) <= limit and message.isascii():
        return message
    data = _utf8(message)
    if len(data) <= limit:
        return data.decode("utf-8")
    return _cut(data, limit - 3) + "..."


class ProblemCounts:
    """NPD's problem counts (by reason) and the (condition type, reason) pairs seen, bounded.

    An *owner* (a condition type, or a temporary rule's name) counts at most ``limit`` distinct
    reasons besides the declared ones (the configuration's literal reasons, which are bounded by
    it); each occurrence of a further reason is counted under :data:`OVERFLOW_REASON`, and in
    ``overflowed`` by owner. Reasons are cut by :func:`bounded_reason` first. Not thread-safe.
    """

    def __init__(
        self, *, reasons: Iterable[str] = (), pairs: Iterable[tuple[str, str]] = (), limit: int = MAX_REASONS
    ) -> None:
        self._counts: Counter[str] = Counter({r: 0 for r in reasons})
        self._pairs: dict[tuple[str, str], None] = dict.fromkeys(pairs)
        self._declared = frozenset(self._counts) | {reason for _, reason in self._pairs}
        self._limit = limit
        self._seen: dict[str, set[str]] = {}  # owner -> undeclared reasons counted under their own name
        self._overflowed: Counter[str] = Counter()  # owner -> occurrences counted as OVERFLOW_REASON

    def _label(self, owner: str, reason: str) -> str | None:
        """The label an occurrence of ``reason`` for ``owner`` is counted under; None = past the limit."""
        reason = bounded_reason(reason)
        if reason in self._declared:
            return reason
        seen = self._seen.setdefault(owner, set())
        if reason in seen:
            return reason
        if len(seen) < self._limit:
            seen.add(reason)
            return reason
        return None

    def count(self, owner: str, reason: str) -> None:
        """One occurrence of ``reason`` (a temporary problem, or a condition turning to it)."""
        label = self._label(owner, reason)
        if label is None:
            self._overflowed[owner] += 1
        self._counts[label or OVERFLOW_REASON] += 1

    def pair(self, condition: str, reason: str) -> None:
        """Condition type ``condition`` was True with ``reason`` (the pairs ``problem_gauge`` reports)."""
        self._pairs.setdefault((condition, self._label(condition, reason) or OVERFLOW_REASON), None)

    @property
    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._pairs)

    @property
    def overflowed(self) -> dict[str, int]:
        return dict(self._overflowed)


def counted_reason(condition: str, reason: str, *, pairs: Collection[tuple[str, str]]) -> str:
    """The label of ``condition``'s current ``reason`` among the ``pairs`` a snapshot lists (pass a set):
    the (cut) reason, or :data:`OVERFLOW_REASON` when the condition overflowed and the reason is not listed."""
    label = bounded_reason(reason)
    if (condition, label) not in pairs and (condition, OVERFLOW_REASON) in pairs:
        return OVERFLOW_REASON
    return label
