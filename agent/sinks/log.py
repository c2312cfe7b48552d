"""Standalone output: one JSON object per line for every transition and temporary problem."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from agent.types import Condition, Event, Snapshot


def iso(ts: float) -> str:
    """RFC 3339 UTC with seconds precision, as Kubernetes prints times."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_json(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {
        "time": iso(event.timestamp),
        "kind": "condition" if event.condition else "event",
        "type": event.type,
        "reason": event.reason,
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
    return out


def condition_json(cond: Condition) -> dict[str, Any]:
    return {
        "type": cond.type,
        "status": cond.status.value,
        "reason": cond.reason,
        "message": cond.message,
        "lastTransitionTime": iso(cond.last_transition),
        "severity": cond.severity.value,
        "fields": dict(cond.fields),
    }


def snapshot_json(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "conditions": [condition_json(c) for c in snapshot.conditions],
        "problemCounts": dict(snapshot.problem_counts),
        "generatedAt": iso(snapshot.generated_at),
    }


class LogSink:
    """Writes each event as one JSON line (to stdout by default) and flushes."""

    def __init__(self, *, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout

    def publish(self, *, events: Sequence[Event], snapshot: Snapshot) -> None:
        for event in events:
            self._stream.write(json.dumps(event_json(event), sort_keys=True) + "\n")
        if events:
            self._stream.flush()

    def close(self) -> None:
        self._stream.flush()
