"""Correlated failure: hold recovery in a zone or pool whose nodes fail together.

Pure: it reads the fleet census the cluster budget already reads (no extra API call;
:mod:`agent.recovery.census`). The group budgets (a limit per zone or pool) are in :mod:`agent.recovery.budget`.

Correlated failure (``budget.correlation``)
    When more than ``share`` of a group's nodes (and at least ``min_nodes``) show a problem of the
    same condition type at once, the cause is rarely the nodes (a driver rollout, a switch, a bad
    rule): recovery of that type in that group **holds**: it reports and waits, never acts. Likewise
    when ``new_node_repeats`` nodes of a group created within ``new_node_window`` show the same
    problem type: replacements coming back with the problem they replaced. A node counts as showing
    a problem when one of ``types`` (the agent's own problem condition types) is True on it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent.recovery.model import CONTROL_PLANE_LABELS, CorrelationSettings

if TYPE_CHECKING:
    from agent.recovery.census import Census

Node = Mapping[str, Any]


def labels_of(node: Node) -> Mapping[str, str]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def counted(node: Node) -> bool:
    return not any(key in labels_of(node) for key in CONTROL_PLANE_LABELS)


def problem_types(node: Node, types: Collection[str]) -> set[str]:
    conditions = (node.get("status") or {}).get("conditions") or []
    if not isinstance(conditions, list):
        return set()
    found = (c.get("type") for c in conditions if isinstance(c, Mapping) and c.get("status") == "True")
    return {t for t in found if isinstance(t, str) and t in types}


def created_at(node: Node) -> float | None:
    text = (node.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def correlated_hold(
    settings: CorrelationSettings | None,
    *,
    own_node: Node | None,
    census: Census | None,
    types: Collection[str],
    now: float,
    problem: str = "",
) -> str:
    """Why recovery on this node holds for a correlated failure in one of its groups ("" = it does not).

    ``census``: the fleet's counts (:mod:`agent.recovery.census`; None: none yet, nothing holds).
    ``problem``: the condition type this node's recovery is about (it counts as showing it whatever its
    Node object says yet: when its Node does not show it, the census did not count it, and it is added)."""
    if settings is None or own_node is None or census is None:
        return ""
    own_shown = problem_types(own_node, types)
    own_problems = own_shown | ({problem} if problem else set())
    created = created_at(own_node)
    own_young = created is not None and now - settings.new_node_window <= created <= now + 300
    for label in settings.labels:
        value = labels_of(own_node).get(label)
        if value is None:
            continue
        group = census.group(label, value)
        members = max(group.nodes, 1)
        for type_ in sorted(own_problems):
            added = 0 if type_ in own_shown else 1  # the census counted this node only where its Node showed it
            showing = group.showing.get(type_, 0) + added
            if showing >= settings.min_nodes and showing > settings.share * members:
                return (
                    f"{label}={value}: {showing} of its {members} nodes show {type_} problems at once "
                    f"(more than {settings.share:.0%}): the cause is likely not the nodes"
                )
            young = group.young.get(type_, 0) + (added if own_young else 0)
            if young >= settings.new_node_repeats:
                return (
                    f"{label}={value}: {young} of its nodes created in the last "
                    f"{settings.new_node_window / 3600:g} h show {type_} problems: replacements come back with the "
                    "problem they replaced"
                )
    return ""
