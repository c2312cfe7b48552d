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

A write answered with no answer, a timeout or a 5xx may have been applied all the same: the Node is
read back, and a write found applied is a success (so it is counted, and told, as done).
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
from agent.recovery.fields import FUTURE_SLACK, CorruptRecord, Fields, load, read_fences
from agent.recovery.model import (
    INCIDENT_ANNOTATION,
    TAINT_KEY,
    UNVALIDATED_TAINT_KEY,
    VALIDATION_OUTCOMES,
    Action,
    DeviceFence,
    Incident,
    NodeView,
    ValidationAttempt,
)

log = logging.getLogger(__name__)

CONFLICT_ATTEMPTS = 5  # reads + conditional patches per step before a 409 is handed to the caller
TAINT_EFFECT = "NoSchedule"
MAX_LABEL_VALUE = 63
_KEEP: Any = object()  # _Want.incident default: leave the annotation as it is
CLAIM_TTL = 600.0  # seconds: a claim on a mark older than this is stale (its agent is gone)
RECORD = "incident"  # the record's name in what a corrupt one says (agent.recovery.fields)
MAX_EVIDENCE = 1024  # characters of one bundle location kept


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


def incident_from_json(data: Any, *, now: float | None = None) -> Incident:
    """The :class:`Incident` of an annotation body (``Incident.to_json()``), every field checked by the rules
    of :mod:`agent.recovery.fields`; a time more than ``FUTURE_SLACK`` after ``now`` (given) is refused too.
    Raises CorruptRecord (a ValueError) naming the field, and nothing else. Action names this version
    does not know are ignored (a newer agent wrote them)."""
    if not isinstance(data, Mapping):
        raise CorruptRecord(RECORD, "", f"expected a JSON object, got {type(data).__name__}")
    return _incident(Fields(record=RECORD, data=data), now=now)


def _incident(fields: Fields, *, now: float | None) -> Incident:
    known = {a.value for a in Action}

    def time(key: str) -> float:
        return fields.time(key, now=now, ahead=FUTURE_SLACK)

    def optional(key: str) -> float | None:
        return fields.optional_time(key, now=now, ahead=FUTURE_SLACK)

    return Incident(
        id=fields.text("id"),
        condition=fields.text("condition"),
        reason=fields.text("reason"),
        since=time("since"),
        opened=time("opened"),
        done=tuple(dict.fromkeys(Action(a) for a in fields.texts("done", default=[]) if a in known)),
        cordoned_by_us=fields.flag("cordonedByUs", default=False),
        drain=fields.text("drain", default=""),
        budget_held=fields.flag("budgetHeld", default=False),
        healthy_since=optional("healthySince"),
        dry_run=fields.flag("dryRun", default=False),
        claim=fields.text("claim", default=""),
        claimed_at=optional("claimedAt"),
        evidence=tuple(v[:MAX_EVIDENCE] for v in fields.texts("evidence", default=[]))[-8:],
        fences=tuple(
            DeviceFence(
                device=f.device,
                fence=f.fence,
                rule=f.rule,
                holders=f.holders,
                evicted=f.evicted,
                steps=tuple(Action(step) for step in f.steps),
            )
            for f in read_fences(fields)
        ),
        validations=_validations(fields, now=now),
    )


VALIDATION_KEYS = (
    "number",
    "id",
    "remedy",
    "checks",
    "devices",
    "after",
    "requestedAt",
    "outcome",
    "reason",
    "message",
    "settledAt",
)
MAX_VALIDATIONS = 16  # attempts kept per incident (maxAttempts per remedy, a few remedies)


def _validations(fields: Fields, *, now: float | None) -> tuple[ValidationAttempt, ...]:
    """The incident's ``validations`` (absent: none), each entry checked like every other field."""
    found = []
    for entry in fields.objects("validations", default=[]):
        entry.only(VALIDATION_KEYS)
        found.append(
            ValidationAttempt(
                number=entry.integer("number", low=1, high=1000),
                id=entry.text("id", limit=400, nonempty=True),
                remedy=entry.text("remedy", limit=64),
                checks=entry.texts("checks", limit=253),
                devices=entry.texts("devices", default=[], limit=300),
                after=entry.time("after", now=now, ahead=FUTURE_SLACK),
                requested_at=entry.time("requestedAt", now=now, ahead=FUTURE_SLACK),
                outcome=entry.choice("outcome", VALIDATION_OUTCOMES, default=""),
                reason=entry.text("reason", default="", limit=64),
                message=entry.text("message", default="", limit=600),
                settled_at=entry.optional_time("settledAt", now=now, ahead=FUTURE_SLACK),
            )
        )
    return tuple(found[-MAX_VALIDATIONS:])


def parse_incident(node: Mapping[str, Any], *, now: float | None = None) -> tuple[Incident | None, str]:
    """The incident recorded on the Node (None when there is none or it cannot be read) and, when it
    cannot be read, why ("" otherwise). Nothing is logged: the caller reports it (once). Never raises
    for what the annotation holds."""
    meta = node.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(INCIDENT_ANNOTATION)
    try:
        fields = load(text, RECORD)
        return (None if fields is None else _incident(fields, now=now)), ""
    except CorruptRecord as exc:
        return None, f"{exc}: {str(text)[:200]!r}"


def read_incident(node: Mapping[str, Any], *, now: float | None = None) -> Incident | None:
    """The incident recorded on the Node; None when there is none or it cannot be read (logged)."""
    incident, problem = parse_incident(node, now=now)
    if problem:
        log.warning(
            "node %s: ignoring annotation %s, which is not an incident record (%s)",
            (node.get("metadata") or {}).get("name") or "?",
            INCIDENT_ANNOTATION,
            problem,
        )
    return incident


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
        view, stored = read_node_view(node), parse_incident(node)[0]
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


def uncordon(
    client: NodeClient, *, node_name: str, incident: Incident, annotations: Mapping[str, str] | None = None
) -> NodeUpdate:
    """Give the Node back: remove our taint and the incident record; make it schedulable only when
    ``incident`` and the record on the Node both say we cordoned it (``cordoned_by_us`` with
    ``cordon`` done). A Node without our record is never made schedulable (someone may have
    cordoned it since we let go). Call it while the record is still on the Node: it removes it.
    ``annotations`` are set in the same patch (the flap record)."""

    def want(node: dict[str, Any]) -> _Want:
        stored = parse_incident(node)[0]
        by_us = _cordoned(incident) and stored is not None and _cordoned(stored)
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if not _is_ours(t)]
        return _Want(
            unschedulable=False if by_us else None, taints=taints, incident=None, annotations=dict(annotations or {})
        )

    return _apply(client, node_name, want)


def has_unvalidated(node: Mapping[str, Any]) -> bool:
    """The Node carries the startup validation's taint (startupValidation)."""
    return any(t.get("key") == UNVALIDATED_TAINT_KEY for t in (node.get("spec") or {}).get("taints") or [])


def remove_unvalidated(client: NodeClient, *, node_name: str) -> NodeUpdate:
    """Remove the startup validation's taint (after the node's first pass); others' taints are kept."""

    def want(node: dict[str, Any]) -> _Want:
        return _Want(
            taints=[t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != UNVALIDATED_TAINT_KEY]
        )

    return _apply(client, node_name, want)


def store_incident(
    client: NodeClient,
    *,
    node_name: str,
    incident: Incident | None,
    expect: Any = _KEEP,
    now: float | None = None,
    annotations: Mapping[str, str | None] | None = None,
) -> None:
    """Write the incident annotation (None removes it). No read needed: a strategic merge patch of
    one annotation leaves every other annotation alone. With ``expect`` (the record as the caller read
    it), the write is conditional: a record changed since (another agent given the same node name)
    is never overwritten; that answers 409 Conflict and the caller decides again. ``now``: as when the
    caller read it (a record read as corrupt then reads so again). ``annotations``: others set in the
    same patch (unconditional writes only: the ladder's ledger and history after a reboot)."""
    if expect is not _KEEP:

        def want(node: dict[str, Any]) -> _Want:
            if parse_incident(node, now=now)[0] != expect:
                raise KubeError(
                    f"node {node_name}: the incident record changed since it was read (another agent?)",
                    status=409,
                    reason="Conflict",
                )
            return _Want(incident=incident)

        _apply(client, node_name, want)
        return
    value = None if incident is None else incident_text(incident)
    notes = {**(annotations or {}), INCIDENT_ANNOTATION: value}
    try:
        client.patch_node(node_name, {"metadata": {"annotations": notes}})
    except KubeError as exc:
        if not outcome_unknown(exc):
            raise
        after = _read_back(client, node_name)
        have = ((after or {}).get("metadata") or {}).get("annotations") or {}
        if after is None or any(have.get(k) != v for k, v in notes.items()):
            raise
        log.info("node %s: the incident write answered %s, but it was applied (read back)", node_name, exc)


def claim_mark(
    client: NodeClient, *, node_name: str, incident: Incident, token: str, now: float, ttl: float = CLAIM_TTL
) -> Incident | None:
    """Claim the mark-unhealthy of ``incident`` for agent ``token`` before calling AWS: one conditional
    patch of the record (resourceVersion), so of two agents claiming one node name only one marks.
    None: another agent holds a claim younger than ``ttl`` on this incident, or it is marked already."""
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        node = client.get_node(node_name)
        stored = parse_incident(node)[0]
        if stored is not None and stored.id == incident.id:
            if Action.MARK_UNHEALTHY in stored.done:
                return None
            fresh = stored.claimed_at is not None and now - stored.claimed_at < ttl
            if stored.claim and stored.claim != token and fresh:
                return None
        record = dataclasses.replace(incident, claim=token, claimed_at=now)
        version = (node.get("metadata") or {}).get("resourceVersion")
        patch = {"metadata": {"resourceVersion": version, "annotations": {INCIDENT_ANNOTATION: incident_text(record)}}}
        try:
            client.patch_node(node_name, patch)
        except KubeError as exc:
            if exc.status == 409 and attempt < CONFLICT_ATTEMPTS:
                continue
            after = _read_back(client, node_name) if outcome_unknown(exc) else None
            if after is not None and parse_incident(after)[0] == record:
                return record  # applied all the same
            raise
        return record
    raise AssertionError("unreachable")  # pragma: no cover


def outcome_unknown(exc: KubeError) -> bool:
    """A write answered so that it may or may not have been applied: no answer, a timeout, a 5xx (a proxy,
    or an API server whose storage committed after its own timeout). Only reading back tells."""
    return exc.status is None or exc.status >= 500


def _read_back(client: NodeClient, node_name: str) -> dict[str, Any] | None:
    try:
        return client.get_node(node_name)
    except KubeError as exc:
        log.debug("node %s: reading back after a failed write failed too: %s", node_name, exc)
        return None


# ---- the read-modify-write ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class _Want:
    """What a step wants of the Node; ``None`` (or _KEEP for the incident) = leave as it is."""

    unschedulable: bool | None = None
    taints: list[dict[str, Any]] | None = None
    incident: Any = _KEEP  # Incident | None | _KEEP
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)  # others to set


def _apply(client: NodeClient, node_name: str, want_of: Callable[[dict[str, Any]], _Want]) -> NodeUpdate:
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        node = client.get_node(node_name)
        want = want_of(node)
        patch = _patch(node, want)
        if not patch:
            return NodeUpdate(view=read_node_view(node), incident=parse_incident(node)[0], changed=False)
        patch.setdefault("metadata", {})["resourceVersion"] = (node.get("metadata") or {}).get("resourceVersion")
        try:
            updated = client.patch_node(node_name, patch)
        except KubeError as exc:
            if exc.status == 409 and attempt < CONFLICT_ATTEMPTS:
                log.debug("node %s changed while we wrote it (attempt %d): reading it again", node_name, attempt)
                continue
            if outcome_unknown(exc):  # applied or not? the Node as it is now says
                after = _read_back(client, node_name)
                if after is not None and not _patch(after, want):
                    log.info("node %s: the write answered %s, but it was applied (read back)", node_name, exc)
                    return NodeUpdate(view=read_node_view(after), incident=parse_incident(after)[0], changed=True)
            raise
        return NodeUpdate(view=read_node_view(updated), incident=parse_incident(updated)[0], changed=True)
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
    have = (node.get("metadata") or {}).get("annotations") or {}
    notes: dict[str, str | None] = {k: v for k, v in want.annotations.items() if have.get(k) != v}
    if want.incident is not _KEEP:
        value = None if want.incident is None else incident_text(want.incident)
        if have.get(INCIDENT_ANNOTATION) != value:
            notes[INCIDENT_ANNOTATION] = value
    if notes:
        patch["metadata"] = {"annotations": notes}
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
