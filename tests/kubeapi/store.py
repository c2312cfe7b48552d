"""Object storage with a global resourceVersion, a bounded change history and watchers.

Like etcd behind the API server: every write gets the next revision, watchers receive changes in
revision order, and a watch that starts from a revision older than the retained history fails
with 410 Gone ("too old resource version").
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Change:
    """One stored change; ``obj`` is the new state (the last state for ``DELETED``)."""

    type: str  # ADDED, MODIFIED, DELETED
    storage: str
    namespace: str
    name: str
    revision: int
    obj: Obj
    prev: Obj | None


class TooOldResourceVersion(Exception):
    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")


@dataclass(eq=False)
class Watcher:
    """Receives the changes of one storage key (optionally one namespace) through a queue."""

    storage: str
    namespace: str | None
    changes: queue.Queue[Change | None] = field(default_factory=queue.Queue)

    def wants(self, change: Change) -> bool:
        return change.storage == self.storage and self.namespace in (None, change.namespace)

    def close(self) -> None:
        """Wake the consumer with ``None``: the stream must end."""
        self.changes.put(None)


class Store:
    """Thread-safe storage; ``lock`` may be held by callers that need a read-modify-write."""

    def __init__(self, history_size: int = 1000, first_revision: int = 1000) -> None:
        self.lock = threading.RLock()
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self._revision = first_revision
        self._history: deque[Change] = deque()
        self._history_size = history_size
        self._compacted = first_revision
        self._watchers: set[Watcher] = set()

    @property
    def revision(self) -> int:
        with self.lock:
            return self._revision

    def get(self, storage: str, namespace: str, name: str) -> Obj | None:
        with self.lock:
            obj = self._objects.get(storage, {}).get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, storage: str, namespace: str | None = None) -> list[Obj]:
        with self.lock:
            items = self._objects.get(storage, {})
            keys = sorted(k for k in items if namespace is None or k[0] == namespace)
            return [copy.deepcopy(items[k]) for k in keys]

    @property
    def compacted(self) -> int:
        """The oldest revision the retained history can rebuild."""
        with self.lock:
            return self._compacted

    def at(self, storage: str, revision: int, namespace: str | None = None) -> list[Obj]:
        """The objects of ``storage`` as they were at ``revision`` (sorted as :meth:`list`): the current ones
        with every retained change after ``revision`` undone. Raises :class:`TooOldResourceVersion` when
        the history no longer reaches back to it."""
        with self.lock:
            if revision >= self._revision:
                return self.list(storage, namespace)
            if revision < self._compacted:
                raise TooOldResourceVersion(revision, self._compacted)
            items = {k: v for k, v in self._objects.get(storage, {}).items() if namespace is None or k[0] == namespace}
            for change in reversed(self._history):
                if change.revision <= revision:
                    break
                if change.storage != storage or (namespace is not None and change.namespace != namespace):
                    continue
                key = (change.namespace, change.name)
                if change.prev is None:
                    items.pop(key, None)
                else:
                    items[key] = change.prev
            return [copy.deepcopy(items[k]) for k in sorted(items)]

    def put(self, storage: str, obj: Obj) -> Obj:
        """Create or replace ``obj``; sets ``metadata.resourceVersion``; returns a copy."""
        with self.lock:
            meta = obj["metadata"]
            key = (meta.get("namespace") or "", meta["name"])
            bucket = self._objects.setdefault(storage, {})
            prev = bucket.get(key)
            self._revision += 1
            stored = copy.deepcopy(obj)
            stored["metadata"]["resourceVersion"] = str(self._revision)
            bucket[key] = stored
            self._record(
                Change("ADDED" if prev is None else "MODIFIED", storage, key[0], key[1], self._revision, stored, prev)
            )
            return copy.deepcopy(stored)

    def delete(self, storage: str, namespace: str, name: str) -> Obj | None:
        """Remove an object; returns its last state carrying the deletion's resourceVersion."""
        with self.lock:
            prev = self._objects.get(storage, {}).pop((namespace, name), None)
            if prev is None:
                return None
            self._revision += 1
            last = copy.deepcopy(prev)
            last["metadata"]["resourceVersion"] = str(self._revision)
            self._record(Change("DELETED", storage, namespace, name, self._revision, last, prev))
            return copy.deepcopy(last)

    def _record(self, change: Change) -> None:
        self._history.append(change)
        while len(self._history) > self._history_size:
            self._compacted = self._history.popleft().revision
        for watcher in list(self._watchers):
            if watcher.wants(change):
                watcher.changes.put(change)

    def compact(self) -> None:
        """Forget all history (like an etcd compaction): older watches get 410 Gone."""
        with self.lock:
            self._history.clear()
            self._compacted = self._revision

    def watch(self, storage: str, namespace: str | None, since: int | None) -> tuple[list[Change], Watcher]:
        """Register a watcher.

        ``since=None`` starts with synthetic ``ADDED`` changes for every current object; otherwise
        the retained changes after ``since`` are replayed.  Raises :class:`TooOldResourceVersion`.
        """
        with self.lock:
            watcher = Watcher(storage, namespace)
            if since is None:
                backlog = [
                    Change(
                        "ADDED",
                        storage,
                        o["metadata"].get("namespace") or "",
                        o["metadata"]["name"],
                        int(o["metadata"]["resourceVersion"]),
                        o,
                        None,
                    )
                    for o in self.list(storage, namespace)
                ]
            else:
                if since < self._compacted:
                    raise TooOldResourceVersion(since, self._compacted)
                backlog = [c for c in self._history if c.revision > since and watcher.wants(c)]
            self._watchers.add(watcher)
            return backlog, watcher

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers.discard(watcher)

    def close_watchers(self) -> None:
        """End every open watch stream (server stop or outage)."""
        with self.lock:
            for watcher in self._watchers:
                watcher.close()
            self._watchers.clear()
