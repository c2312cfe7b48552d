"""Conversion between ``events.k8s.io/v1`` Events and the core/v1 shape they are stored in.

Both API groups serve the same stored objects; ``events.k8s.io/v1`` renames some fields.
"""

from __future__ import annotations

from typing import Any

# events.k8s.io/v1 name -> core/v1 name
_RENAMES = {
    "regarding": "involvedObject",
    "note": "message",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
    "reportingController": "reportingComponent",
}
_REVERSE = {core: events for events, core in _RENAMES.items()}

# events.k8s.io/v1 field selector labels -> core/v1 labels (events/v1 field label conversion)
FIELD_LABELS = {
    "regarding.kind": "involvedObject.kind",
    "regarding.namespace": "involvedObject.namespace",
    "regarding.name": "involvedObject.name",
    "regarding.uid": "involvedObject.uid",
    "regarding.apiVersion": "involvedObject.apiVersion",
    "regarding.resourceVersion": "involvedObject.resourceVersion",
    "regarding.fieldPath": "involvedObject.fieldPath",
    "reportingController": "reportingComponent",
    "reason": "reason",
    "type": "type",
    "metadata.name": "metadata.name",
    "metadata.namespace": "metadata.namespace",
}


def to_core(event: dict[str, Any]) -> dict[str, Any]:
    """An ``events.k8s.io/v1`` Event in core/v1 shape."""
    out = {_RENAMES.get(key, key): value for key, value in event.items()}
    out["apiVersion"] = "v1"
    out["kind"] = "Event"
    return out


def from_core(event: dict[str, Any]) -> dict[str, Any]:
    """A stored (core/v1 shaped) Event as ``events.k8s.io/v1`` serves it."""
    out = {_REVERSE.get(key, key): value for key, value in event.items()}
    out["apiVersion"] = "events.k8s.io/v1"
    out["kind"] = "Event"
    return out
