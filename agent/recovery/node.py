"""The Node side of recovery: read the Node, cordon, taint, uncordon, record the incident.

Every step is idempotent: it reads the Node, computes the Node it wants, and patches only what
differs (nothing when nothing differs), so repeating a step after a restart changes nothing.

One step = one conditional strategic merge patch: ``metadata.resourceVersion`` from the read goes
into the patch, so a Node changed by someone else in between answers 409 Conflict and the step
reads again and redoes (at most ``CONFLICT_ATTEMPTS`` times). That is required for taints:
``NodeSpec.taints`` has no patch strategy, so a patch carrying ``spec.taints`` *replaces* the whole
list; only a read-modify-write on the latest version keeps taints added by others.

* :func:`cordon` sets ``spec.unschedulable``, adds our NoSchedule taint ``TAINT_KEY`` (value = the
  reason) and records the incident (with ``cordon`` in ``done``) in one patch. A Node that was
  already unschedulable when we came is left as it is and the incident says ``cordoned_by_us``
  False: then no one here ever makes it schedulable again.
* :func:`taint` (Action.TAINT without cordon) adds only the taint (and records the incident, with
  ``taint`` in ``done``, when given one).
* :func:`uncordon` removes our taint and our incident record, and sets ``spec.unschedulable`` back
  to false only when both the caller's incident and the one stored on the Node say we cordoned it.
  Taints of other keys are never removed, and a Node we did not cordon stays unschedulable.
* :func:`store_incident` writes or removes the incident annotation alone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent.adapters.kube import KubeError
from agent.core.timefmt import iso
from agent.recovery.model import INCIDENT_ANNOTATION, TAINT_KEY, Action, Incident, NodeView

log = logging.getLogger(__name__)

CONFLICT_ATTEMPTS = 5  # reads + conditional patches per step before a 409 is handed to the caller
TAINT_EFFECT = "NoSchedule"
MAX_LABEL_VALUE = 63


class NodeClient(Protocol):
    """The part of :class:`agent.adapters.kube.KubeClient` these steps use."""

    def get_node(self, name: str) -> dict[str, Any]: ...

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeUpdate:
    """The outcome of one step: the Node as it now is, the incident now stored on it (None = no
    annotation) and whether this call changed anything (False = it was already so)."""

    view: NodeView
    incident: Incident | None
    changed: bool


# ---- reading -----------------------------------------------------------------------------------


def read_node_view(node: Mapping[str, Any]) -> NodeView:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    return NodeView(
        name=meta.get("name") or "",
        unschedulable=bool(spec.get("unschedulable")),
        labels=dict(meta.get("labels") or {}),
        has_our_taint=any(_is_ours(t) for t in spec.get("taints") or []),
        provider_id=spec.get("providerID") or "",
        uid=meta.get("uid") or "",
    )


def incident_from_json(data: Any) -> Incident:
    """The :class:`Incident` of an annotation body (``Incident.to_json()``); ValueError when the
    shape is wrong. Action names this version does not know are ignored (a newer agent wrote them)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")

    def text(key: str, default: str | None = None) -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            raise ValueError(f"{key!r} must be a string, got {value!r}")
        return value

    def number(key: str) -> float:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key!r} must be a number, got {value!r}")
        return float(value)

    def flag(key: str) -> bool:
        value = data.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(f"{key!r} must be true or false, got {value!r}")
        return value

    done = data.get("done", [])
    if not isinstance(done, list) or not all(isinstance(a, str) for a in done):
        raise ValueError(f"'done' must be a list of action names, got {done!r}")
    known = {a.value for a in Action}
    return Incident(
        id=text("id"),
        condition=text("condition"),
        reason=text("reason"),
        since=number("since"),
        opened=number("opened"),
        done=tuple(dict.fromkeys(Action(a) for a in done if a in known)),
        cordoned_by_us=flag("cordonedByUs"),
        drain=text("drain", ""),
        budget_held=flag("budgetHeld"),
        healthy_since=None if data.get("healthySince") is None else number("healthySince"),
        dry_run=flag("dryRun"),
        evidence=_evidence(data.get("evidence")),
    )


def _evidence(value: Any) -> tuple[str, ...]:
    """The bundle locations of a record; what is not a list of strings is dropped (it only points to files)."""
    if not isinstance(value, list):
        return ()
    return tuple(v[:1024] for v in value if isinstance(v, str))[-8:]


def read_incident(node: Mapping[str, Any]) -> Incident | None:
    """The incident recorded on the Node; None when there is none or it cannot be read (logged)."""
    meta = node.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(INCIDENT_ANNOTATION)
    if text is None:
        return None
    try:
        return incident_from_json(json.loads(text))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        log.warning(
            "node %s: ignoring annotation %s, which is not an incident record (%s): %.200r",
            meta.get("name") or "?",
            INCIDENT_ANNOTATION,
            exc,
            text,
        )
        return None


def incident_text(incident: Incident) -> str:
    """The annotation value: compact JSON with sorted keys (the same incident gives the same text)."""
    return json.dumps(incident.to_json(), sort_keys=True, separators=(",", ":"))


def taint_value(reason: str) -> str:
    """``reason`` as a valid label value (a taint's value): at most 63 of ``[A-Za-z0-9_.-]``,
    beginning and ending alphanumeric; other characters become ``_``; may be empty."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "_", reason)[:MAX_LABEL_VALUE]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


# ---- the steps ---------------------------------------------------------------------------------


def cordon(client: NodeClient, *, node_name: str, incident: Incident, reason: str, now: float) -> NodeUpdate:
    """Make the Node unschedulable (unless it already is), add our NoSchedule taint and record
    ``incident`` with ``cordon`` done and ``cordoned_by_us`` decided here, in one patch."""

    def want(node: dict[str, Any]) -> _Want:
        view, stored = read_node_view(node), read_incident(node)
        # Ours when we set it now, or when a record (the caller's or the Node's) says we did it earlier.
        # A record's cordoned_by_us alone is a plan made before acting: someone may have cordoned since.
        by_us = not view.unschedulable or _cordoned(incident) or (stored is not None and _cordoned(stored))
        record = dataclasses.replace(incident, cordoned_by_us=by_us, done=_with(incident.done, Action.CORDON))
        return _Want(unschedulable=True, taints=_with_our_taint(node, reason, now), incident=record)

    return _apply(client, node_name, want)


def taint(
    client: NodeClient, *, node_name: str, reason: str, now: float, incident: Incident | None = None
) -> NodeUpdate:
    """Add our NoSchedule taint (Action.TAINT on its own: ``spec.unschedulable`` untouched) and,
    when ``incident`` is given, record it with ``taint`` done in the same patch."""

    def want(node: dict[str, Any]) -> _Want:
        if incident is None:
            return _Want(taints=_with_our_taint(node, reason, now))
        record = dataclasses.replace(incident, done=_with(incident.done, Action.TAINT))
        return _Want(taints=_with_our_taint(node, reason, now), incident=record)

    return _apply(client, node_name, want)


def uncordon(client: NodeClient, *, node_name: str, incident: Incident) -> NodeUpdate:
    """Give the Node back: remove our taint and the incident record; make it schedulable only when
    ``incident`` and the record on the Node both say we cordoned it (``cordoned_by_us`` with
    ``cordon`` done). A Node without our record is never made schedulable (someone may have
    cordoned it since we let go). Call it while the record is still on the Node: it removes it."""

    def want(node: dict[str, Any]) -> _Want:
        stored = read_incident(node)
        by_us = _cordoned(incident) and stored is not None and _cordoned(stored)
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if not _is_ours(t)]
        return _Want(unschedulable=False if by_us else None, taints=taints, incident=None)

    return _apply(client, node_name, want)


def store_incident(client: NodeClient, *, node_name: str, incident: Incident | None) -> None:
    """Write the incident annotation (None removes it). No read needed: a strategic merge patch of
    one annotation leaves every other annotation alone."""
    value = None if incident is None else incident_text(incident)
    client.patch_node(node_name, {"metadata": {"annotations": {INCIDENT_ANNOTATION: value}}})


# ---- the read-modify-write ---------------------------------------------------------------------

_KEEP = object()  # _Want.incident default: leave the annotation as it is


@dataclass(frozen=True, kw_only=True, slots=True)
class _Want:
    """What a step wants of the Node; ``None`` (or _KEEP for the incident) = leave as it is."""

    unschedulable: bool | None = None
    taints: list[dict[str, Any]] | None = None
    incident: Any = _KEEP  # Incident | None | _KEEP


def _apply(client: NodeClient, node_name: str, want_of: Callable[[dict[str, Any]], _Want]) -> NodeUpdate:
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        node = client.get_node(node_name)
        want = want_of(node)
        patch = _patch(node, want)
        if not patch:
            return NodeUpdate(view=read_node_view(node), incident=read_incident(node), changed=False)
        patch.setdefault("metadata", {})["resourceVersion"] = (node.get("metadata") or {}).get("resourceVersion")
        try:
            updated = client.patch_node(node_name, patch)
        except KubeError as exc:
            if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                raise
            log.debug("node %s changed while we wrote it (attempt %d): reading it again", node_name, attempt)
            continue
        return NodeUpdate(view=read_node_view(updated), incident=read_incident(updated), changed=True)
    raise AssertionError("unreachable")  # pragma: no cover


def _patch(node: dict[str, Any], want: _Want) -> dict[str, Any]:
    """The strategic merge patch taking ``node`` to ``want``; {} when nothing differs."""
    spec = node.get("spec") or {}
    patch: dict[str, Any] = {}
    if want.unschedulable is not None and bool(spec.get("unschedulable")) != want.unschedulable:
        patch.setdefault("spec", {})["unschedulable"] = want.unschedulable
    if want.taints is not None and want.taints != (spec.get("taints") or []):
        # The whole list (no patch strategy: it replaces); [] and not null so the field is cleared.
        patch.setdefault("spec", {})["taints"] = want.taints
    if want.incident is not _KEEP:
        value = None if want.incident is None else incident_text(want.incident)
        if ((node.get("metadata") or {}).get("annotations") or {}).get(INCIDENT_ANNOTATION) != value:
            patch["metadata"] = {"annotations": {INCIDENT_ANNOTATION: value}}
    return patch


def _is_ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") == TAINT_KEY and taint.get("effect") == TAINT_EFFECT


def _with_our_taint(node: Mapping[str, Any], reason: str, now: float) -> list[dict[str, Any]]:
    """The Node's taints plus ours (an existing one of ours is kept as it is, time and all)."""
    taints = [dict(t) for t in (node.get("spec") or {}).get("taints") or []]
    if not any(_is_ours(t) for t in taints):
        taints.append({"key": TAINT_KEY, "value": taint_value(reason), "effect": TAINT_EFFECT, "timeAdded": iso(now)})
    return taints


def _cordoned(incident: Incident) -> bool:
    """The record says we did cordon the Node (not just that we meant to)."""
    return incident.cordoned_by_us and Action.CORDON in incident.done


def _with(done: tuple[Action, ...], action: Action) -> tuple[Action, ...]:
    return done if action in done else (*done, action)
