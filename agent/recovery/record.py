"""What recovery keeps on the Node, read as one record.

:class:`NodeRecord` gathers the parts recovery stores in the Node's annotations: the open incident,
the ladder's history (rungs and opened incidents), the flap record and the reboot attempt ledger.
:func:`read_record` reads them all with their validated codecs (:mod:`agent.recovery.fields`); a part
that cannot be read counts as absent and comes back in ``problems`` (the loop tells each once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.recovery import attempt as attempts
from agent.recovery import events, flaps
from agent.recovery.model import INCIDENT_ANNOTATION, Incident
from agent.recovery.node import outcome_unknown, parse_incident
from agent.recovery.rungs import HISTORY_ANNOTATION, History, parse_history


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """A part of the record that cannot be read: its annotation, the text found there, and why."""

    annotation: str
    text: str
    problem: str
    template: str  # the catalogue's sentence (events.CORRUPT_*), with {problem}

    @property
    def what(self) -> str:
        return self.template.format(problem=self.problem)


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeRecord:
    """Recovery's state on one Node, as read at one step (``problems``: the parts that could not be read)."""

    incident: Incident | None = None
    history: History = History()
    flaps: flaps.FlapRecord | None = None
    attempt: attempts.Attempt | None = None
    problems: tuple[Problem, ...] = ()

    def problem(self, annotation: str) -> str:
        """Why the part in ``annotation`` cannot be read ("" = it can, or there is none)."""
        return next((p.problem for p in self.problems if p.annotation == annotation), "")


def _text(node: Mapping[str, Any], annotation: str) -> str:
    return str(((node.get("metadata") or {}).get("annotations") or {}).get(annotation))


def read_record(node: Mapping[str, Any], *, now: float) -> NodeRecord:
    """Every part of the record on ``node``; never raises for what the annotations hold."""
    incident, incident_problem = parse_incident(node, now=now)
    flap, flap_problem = flaps.parse_flaps(node, now=now)
    history = parse_history(node, now=now)
    attempt, attempt_problem = attempts.parse_attempt(node, now=now)
    found = (
        (INCIDENT_ANNOTATION, incident_problem, events.CORRUPT_INCIDENT),
        (flaps.FLAP_ANNOTATION, flap_problem, events.CORRUPT_FLAPS),
        (attempts.ATTEMPT_ANNOTATION, attempt_problem, events.CORRUPT_ATTEMPT),
        (HISTORY_ANNOTATION, history.problem, events.CORRUPT_HISTORY),
    )
    problems = tuple(
        Problem(annotation=annotation, text=_text(node, annotation), problem=problem, template=template)
        for annotation, problem, template in found
        if problem
    )
    return NodeRecord(incident=incident, history=history, flaps=flap, attempt=attempt, problems=problems)


class RecordStore:
    """Writes recovery's record to the Node: parts noted during a step ride along with the step's next
    Node PATCH, so a step writes the Node once where the API allows; :meth:`flush` writes what is left.

    It stands in for the Kubernetes client (``get_node``, ``patch_node``) of the record's writers
    (agent.recovery.node). A noted part stays noted until a PATCH carrying it succeeds."""

    def __init__(self, client: Any, node_name: str) -> None:
        self._client = client
        self._node_name = node_name
        self._pending: dict[str, str | None] = {}

    def note(self, annotations: Mapping[str, str | None]) -> None:
        """Parts to write with the next PATCH (a later write of the same annotation wins)."""
        self._pending.update(annotations)

    def get_node(self, name: str) -> dict[str, Any]:
        return self._client.get_node(name)

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._pending and name == self._node_name:
            meta = dict(body.get("metadata") or {})
            meta["annotations"] = {**self._pending, **(meta.get("annotations") or {})}
            body = {**body, "metadata": meta}
        answer = self._client.patch_node(name, body)
        if name == self._node_name:
            self._pending.clear()
        return answer

    def flush(self) -> None:
        """Write the noted parts no PATCH of this step carried (one whose answer was lost, or an error that
        may follow a carried-out write, is read back: there already, it is done)."""
        from agent.adapters.kube import KubeError

        if not self._pending:
            return
        notes = dict(self._pending)
        try:
            self.patch_node(self._node_name, {"metadata": {"annotations": {}}})
        except KubeError as exc:
            if not outcome_unknown(exc):
                raise
            have = (self._client.get_node(self._node_name).get("metadata") or {}).get("annotations") or {}
            if any(have.get(k) != v for k, v in notes.items()):
                raise
            self._pending.clear()
