"""The Event outbox: the aggregated Event series the sink owes the API server, kept durably.

One :class:`Series` per Event object (its deterministic name, first/last occurrence, count and
the count the server has, and the Pod it is about where it is not about the Node). The table lives
in ``<state_dir>/events-outbox.json`` (written atomically) so that Events not yet delivered when the
agent is killed are sent after a restart.
It is bounded: past ``max_series`` the oldest delivered series is forgotten, else the oldest
series, which is counted in ``dropped``.
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.core.statedir import atomic_write
from agent.core.types import PodRef

log = logging.getLogger(__name__)

OUTBOX_FILE = "events-outbox.json"
MAX_SERIES = 4096
_FORMAT = 1

Key = tuple[str, str, str, str]  # (type, reason, message, the Pod's namespace/name or "" for the Node)


@dataclass(kw_only=True, slots=True)
class Series:
    """One aggregated Event object: ``count`` occurrences so far, ``written_count`` on the server."""

    name: str
    type: str
    reason: str
    message: str
    first: float  # wall-clock seconds
    last: float
    count: int = 1
    written_count: int = 0
    created: bool = False  # the object exists on the server (as far as we know)
    last_write: float = float("-inf")  # monotonic; not kept across restarts
    pod: PodRef | None = None  # the Pod the Event is about; None: the Node

    @property
    def key(self) -> Key:
        return (self.type, self.reason, self.message, self.pod.key if self.pod else "")

    @property
    def pending(self) -> bool:
        return self.written_count != self.count

    def to_json(self) -> dict:
        out = {
            "name": self.name,
            "type": self.type,
            "reason": self.reason,
            "message": self.message,
            "first": self.first,
            "last": self.last,
            "count": self.count,
            "writtenCount": self.written_count,
            "created": self.created,
        }
        if self.pod is not None:
            out["pod"] = {"namespace": self.pod.namespace, "name": self.pod.name, "uid": self.pod.uid or ""}
        return out

    @classmethod
    def from_json(cls, raw: object) -> Series:
        """Raises KeyError/TypeError/ValueError for anything but a series we wrote."""
        if not isinstance(raw, dict):
            raise TypeError(f"not an object: {raw!r}")
        texts = {k: raw[k] for k in ("name", "type", "reason", "message")}
        if not all(isinstance(v, str) for v in texts.values()) or not texts["name"]:
            raise TypeError("name, type, reason and message must be strings")
        return cls(
            **texts,
            first=float(raw["first"]),
            last=float(raw["last"]),
            count=int(raw["count"]),
            written_count=int(raw["writtenCount"]),
            created=bool(raw["created"]),
            pod=_pod_from_json(raw.get("pod")),
        )


def _pod_from_json(raw: object) -> PodRef | None:
    """The ``pod`` of a saved series (absent in files written before pod Events: the Node)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError(f"pod is not an object: {raw!r}")
    namespace, name, uid = raw["namespace"], raw["name"], raw.get("uid", "")
    if not all(isinstance(v, str) for v in (namespace, name, uid)) or not namespace or not name:
        raise TypeError("pod namespace and name must be non-empty strings")
    return PodRef(namespace=namespace, name=name, uid=uid or None)


class Outbox:
    """The series table, oldest first (updating a series makes it the newest). Not thread-safe."""

    def __init__(self, *, path: Path | None, max_series: int = MAX_SERIES) -> None:
        """``path`` None: in memory only."""
        self.path = path
        self._max = max_series
        self._series: collections.OrderedDict[str, Series] = collections.OrderedDict()  # by name
        self._current: dict[Key, str] = {}  # key -> name of its newest series
        self.dropped = 0  # series forgotten with undelivered occurrences (table full)

    def __len__(self) -> int:
        return len(self._series)

    def __iter__(self) -> Iterator[Series]:
        return iter(list(self._series.values()))

    def current(self, key: Key) -> Series | None:
        """The newest series of ``key``."""
        name = self._current.get(key)
        return None if name is None else self._series.get(name)

    def add(self, series: Series) -> None:
        """Add (or replace) a series as the newest; evicts one when the table is full."""
        self._series[series.name] = series
        self._series.move_to_end(series.name)
        self._current[series.key] = series.name
        while len(self._series) > self._max:
            self._evict()

    def touch(self, series: Series) -> None:
        """``series`` was updated: it becomes the newest."""
        self._series.move_to_end(series.name)

    def forget(self, *, delivered_before: float) -> int:
        """Remove delivered series whose last occurrence is before ``delivered_before`` (wall)."""
        old = [s for s in self._series.values() if not s.pending and s.last < delivered_before]
        for series in old:
            self._remove(series)
        return len(old)

    def _evict(self) -> None:
        victim = next((s for s in self._series.values() if not s.pending), None)
        if victim is None:
            victim = next(iter(self._series.values()))
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning(
                    "Event outbox full (%d series): dropped the oldest undelivered series %s %r (%d dropped so far)",
                    self._max,
                    victim.reason,
                    victim.message[:80],
                    self.dropped,
                )
        self._remove(victim)

    def _remove(self, series: Series) -> None:
        del self._series[series.name]
        if self._current.get(series.key) == series.name:
            del self._current[series.key]

    def load(self) -> int:
        """Read the file (a missing or corrupt one gives an empty table); the number of series loaded."""
        if self.path is None:
            return 0
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError("unknown format")
            loaded = [Series.from_json(raw) for raw in data["series"]]
        except FileNotFoundError:
            return 0
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the Event outbox %s (unreadable: %r)", self.path, exc)
            return 0
        for series in loaded:  # oldest first, as saved
            self.add(series)
        return len(loaded)

    def save(self) -> None:
        """Write the table atomically (temp file, fsync, rename). Raises OSError."""
        if self.path is None:
            return
        body = {"format": _FORMAT, "series": [s.to_json() for s in self._series.values()]}
        atomic_write(self.path, json.dumps(body, separators=(",", ":")).encode())
