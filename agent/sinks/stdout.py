"""Standalone output: one JSON object per line for every transition and temporary problem."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any, TextIO

from agent.core.bounds import bounded_reason
from agent.core.bus import SnapshotFeed
from agent.core.types import Condition, Event, Snapshot
from agent.core.validation import record_fields

log = logging.getLogger(__name__)


from agent.core.timefmt import iso  # noqa: E402


def event_json(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {
        "time": iso(event.timestamp),
        "kind": "condition" if event.condition else "event",
        "type": event.type,
        "reason": bounded_reason(event.reason),
        "severity": event.severity.value,
        "source": event.source,
        "message": event.message,
    }
    if event.condition:
        out["condition"] = event.condition
        out["status"] = event.status.value if event.status else None
    if event.rule:
        out["rule"] = event.rule
    if event.fields:
        out["fields"] = dict(event.fields)
    if event.pod is not None:
        out["pod"] = event.pod.key  # an Event about a Pod (a device fault told to a holder)
    return out


def condition_json(cond: Condition) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": cond.type,
        "status": cond.status.value,
        "reason": bounded_reason(cond.reason),
        "message": cond.message,
        "lastTransitionTime": iso(cond.last_transition),
        "severity": cond.severity.value,
        "fields": dict(cond.fields),
    }
    if cond.devices:  # the devices whose problems hold it (a condition that names none has no key)
        body["devices"] = [
            {**d.to_json(), "since": iso(d.since), "lastUpdate": iso(d.last_update)} for d in cond.devices
        ]
    return body


def snapshot_json(snapshot: Snapshot) -> dict[str, Any]:
    """``/conditions``: our conditions, the active checks' validation records (``valid`` as of the
    snapshot) and the open validation requests."""
    now = snapshot.generated_at
    return {
        "conditions": [condition_json(c) for c in snapshot.conditions],
        "problemCounts": dict(snapshot.problem_counts),
        "generatedAt": iso(now),
        "validations": [{**record_fields(r), "valid": r.valid(now)} for r in snapshot.validations],
        "validationRequests": [
            {
                "id": q.id,
                "checks": list(q.checks),
                "devices": list(q.devices),
                "requestedAt": iso(q.requested_at),
                "reason": q.reason,
            }
            for q in snapshot.validation_requests
        ],
    }


class StdoutSink:
    """Consumer component ``stdout``: each event as one JSON line (stdout by default), flushed.

    Acknowledges a publication once its events are written, so the kmsg cursor never passes an
    event that was not printed. A closed or failing stream is logged once and then skipped (it
    must not freeze the cursor or the agent). Any value prints (a field JSON cannot encode is
    printed as its ``str``); an event that still cannot be printed (a bug) is skipped, counted in
    ``bugs`` and shown in :meth:`detail`.

    ``poll``: how often it looks at ``stop`` while nothing is published (None: never; the supervisor
    closes the feed on stop, which wakes it at once, and each look would be an idle wakeup, issue 16).
    """

    name = "stdout"

    def __init__(self, *, feed: SnapshotFeed, stream: TextIO | None = None, poll: float | None = None) -> None:
        self._feed = feed
        self._stream = stream or sys.stdout
        self._poll = poll
        # one encoder for every line: json.dumps with options builds a new one per call (~1.5 us)
        self._encode = json.JSONEncoder(sort_keys=True, default=str).encode
        self._seen = 0
        self._index = 0
        self._acked = 0
        self._broken = False
        self.bugs = 0
        self.last_bug: str | None = None

    def detail(self) -> str | None:
        """For /healthz details: events that could not be printed (a bug)."""
        return f"{self.bugs} event(s) could not be printed, a bug (latest: {self.last_bug})" if self.bugs else None

    def acked(self) -> int:
        return self._acked

    def healthy(self, now: float) -> bool:
        return True  # nothing to stall on: a broken stream is skipped

    def run(self, stop: threading.Event) -> None:
        while True:
            pub = self._feed.wait_newer(self._seen, timeout=self._poll)
            if pub is not None:
                self._seen = pub.number
                events, self._index, _lost = self._feed.events_since(self._index)
                self._write(events)
                self._acked = pub.number
            elif stop.is_set():
                return

    def _write(self, events: Sequence[Event]) -> None:
        if not events or self._broken:
            return
        try:
            for event in events:
                line = self._line(event)
                if line is not None:
                    self._stream.write(line)
            self._stream.flush()
        except (OSError, ValueError) as exc:  # EPIPE, or a closed stream
            self._broken = True
            log.error("cannot write events to standard output any more: %s", exc)

    def _line(self, event: Event) -> str | None:
        try:
            return self._encode(event_json(event)) + "\n"
        except Exception as exc:  # one event that cannot be printed must not stop the others
            self.bugs += 1
            self.last_bug = f"{type(exc).__name__}: {str(exc)[:300]}"
            if self.bugs == 1:
                log.exception("cannot print an event (a bug; skipped, logged once)")
            return None
