"""The fleet census: the counts the budget needs of the whole fleet, taken by one agent at a time.

Why
    The budget's limit is a share of the fleet's failure domains, a zone or pool budget a share of its
    group's, and a correlated-failure hold compares a group's nodes showing a problem with its size. Read
    by every asking agent, each of those is a LIST of every Node: in a fleet-wide misfire N blocked agents
    asking makes O(N²) objects for the API server. Instead one agent counts (one LIST, from the API server's
    watch cache, ``resourceVersion=0``) and writes the counts into the budget Lease (key ``census`` of its
    JSON); every other agent reads them with the Lease it reads anyway. The fleet pays one LIST per
    ``CENSUS_MAX_AGE``: O(N) objects per unit of time in all.

What is counted (:func:`take`)
    The nodes the budget's ``node_selector`` lists, control-plane nodes left out (as the limit counts them):
    their failure domains, and per ``label=value`` of every group label (``budget.groups`` and the
    correlation's labels): its nodes, its failure domains, and per problem condition type the nodes showing
    it (the type ``True`` on the Node), and of those the nodes created within ``new_node_window``; and the
    budget's holders it found, with their group labels (``holders``): an asker takes a holder named there
    as present, in those groups, without reading its Node (one found gone at the next count frees its place).

Freshness
    A census older than ``CENSUS_MAX_AGE`` (by the reader's clock), or counted with other settings
    (``key``: the selector, the labels, the types, the window), is stale. An agent that finds it stale
    first claims the count (``censusClaim`` written with the Lease's resourceVersion: one agent wins,
    every other gets 409 and goes on with the stale census), then counts, then writes the census with its
    next write of the Lease. A claim older than ``CLAIM_TTL`` is void (its agent died). Agents of other
    settings count for themselves and keep their census in memory only.

Safety
    The census sets the limit and the groups' sizes; it never decides who holds a place. Places are taken
    only by a conditional write of the Lease (the resourceVersion read): whatever census two agents read,
    they can never both take the last place. A census a minute old moves the limit as a fleet a minute
    smaller or larger would: the bound is the census's, held exactly. A census that cannot be read (a hand
    edit) is a cache, not a record: it is counted again, never refused.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.recovery.correlation import counted, created_at, labels_of, problem_types

CENSUS_KEY = "census"  # in the budget Lease's JSON
CLAIM_KEY = "censusClaim"
CENSUS_MAX_AGE = 60.0  # seconds: older is counted again (by one agent)
CLAIM_TTL = 30.0  # seconds: a claim older than this is void (its agent died while counting)

Node = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupCount:
    """One ``label=value`` group of the fleet."""

    nodes: int = 0
    domains: int = 0
    showing: Mapping[str, int] = field(default_factory=dict)  # condition type -> nodes showing it
    young: Mapping[str, int] = field(default_factory=dict)  # ... of them created within new_node_window


@dataclass(frozen=True, kw_only=True, slots=True)
class Census:
    at: float  # wall-clock seconds of the count
    by: str  # the node that counted
    key: str  # what was counted (census_key): a census of other settings is not this agent's
    domains: int  # failure domains the limit counts
    groups: Mapping[str, GroupCount] = field(default_factory=dict)  # "label=value" -> its counts
    # The budget's holders found in the count -> their group labels: no asker reads their Nodes again
    holders: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def group(self, label: str, value: str) -> GroupCount:
        return self.groups.get(f"{label}={value}", GroupCount())

    def fresh(self, now: float, key: str, max_age: float = CENSUS_MAX_AGE) -> bool:
        return self.key == key and -max_age < now - self.at < max_age


def census_key(*, selector: str, labels: Iterable[str], types: Collection[str], new_node_window: float) -> str:
    """A short digest of the settings a census is counted with."""
    text = json.dumps([selector, sorted(set(labels)), sorted(types), new_node_window])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def take(
    nodes: Iterable[Node],
    *,
    now: float,
    by: str,
    key: str,
    labels: Iterable[str],
    types: Collection[str],
    new_node_window: float,
    domain_of: Callable[[Node], str],
    holders: Collection[str] = (),
) -> Census:
    """Count ``nodes`` (the Nodes the selector lists); ``holders``: the budget's holders' node names, whose
    group labels the census keeps when it finds them."""
    labels = tuple(dict.fromkeys(labels))
    wanted = frozenset(holders)
    found: dict[str, dict[str, str]] = {}
    domains: set[str] = set()
    members: Counter[str] = Counter()
    group_domains: dict[str, set[str]] = {}
    showing: dict[str, Counter[str]] = {}
    young: dict[str, Counter[str]] = {}
    for node in nodes:
        if not counted(node):
            continue
        name = str((node.get("metadata") or {}).get("name", ""))
        domain = domain_of(node) or name
        domains.add(domain)
        shown = problem_types(node, types)
        created = created_at(node)
        new = created is not None and now - new_node_window <= created <= now + 300
        node_labels = labels_of(node)
        if name in wanted:
            found[name] = {label: str(node_labels[label]) for label in labels if label in node_labels}
        for label in labels:
            value = node_labels.get(label)
            if value is None:
                continue
            group = f"{label}={value}"
            members[group] += 1
            group_domains.setdefault(group, set()).add(domain)
            for type_ in shown:
                showing.setdefault(group, Counter())[type_] += 1
                if new:
                    young.setdefault(group, Counter())[type_] += 1
    groups = {
        g: GroupCount(
            nodes=n, domains=len(group_domains[g]), showing=dict(showing.get(g, {})), young=dict(young.get(g, {}))
        )
        for g, n in members.items()
    }
    return Census(at=now, by=by, key=key, domains=len(domains), groups=groups, holders=found)


def encode(census: Census) -> dict[str, Any]:
    groups: dict[str, Any] = {}
    for name, g in sorted(census.groups.items()):
        entry: dict[str, Any] = {"nodes": g.nodes, "domains": g.domains}
        if g.showing:
            entry["showing"] = dict(sorted(g.showing.items()))
        if g.young:
            entry["young"] = dict(sorted(g.young.items()))
        groups[name] = entry
    out = {"at": census.at, "by": census.by, "key": census.key, "domains": census.domains, "groups": groups}
    if census.holders:
        out["holders"] = {name: dict(sorted(labels.items())) for name, labels in sorted(census.holders.items())}
    return out


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError(f"not a count: {value!r}")
    return value


def _counts(value: object) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise ValueError("not an object")
    return {str(k): _count(v) for k, v in value.items()}


def _consistent(group: GroupCount) -> bool:
    """Counts a count can give: no more failure domains, nodes showing a type, or young ones than nodes."""
    return (
        group.domains <= group.nodes
        and all(n <= group.nodes for n in group.showing.values())
        and all(n <= group.showing.get(t, 0) for t, n in group.young.items())
    )


def decode(value: object) -> Census | None:
    """The census in the Lease's JSON; None when absent or unreadable (it is counted again)."""
    if not isinstance(value, Mapping):
        return None
    try:
        at = value["at"]
        if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < 1e11:
            return None
        raw = value.get("groups") or {}
        if not isinstance(raw, Mapping) or not all(isinstance(g, Mapping) for g in raw.values()):
            return None
        groups = {
            str(name): GroupCount(
                nodes=_count(g.get("nodes", 0)),
                domains=_count(g.get("domains", 0)),
                showing=_counts(g.get("showing", {})),
                young=_counts(g.get("young", {})),
            )
            for name, g in raw.items()
        }
        if not all(_consistent(g) for g in groups.values()):
            return None
        holders = value.get("holders") or {}
        if not isinstance(holders, Mapping) or not all(
            isinstance(labels, Mapping) and all(isinstance(v, str) for v in labels.values())
            for labels in holders.values()
        ):
            return None
        return Census(
            at=float(at),
            by=str(value.get("by", "")),
            key=str(value.get("key", "")),
            domains=_count(value["domains"]),
            groups=groups,
            holders={str(name): {str(k): v for k, v in labels.items()} for name, labels in holders.items()},
        )
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


def claim_holder(value: object, now: float) -> str:
    """The node whose claim to count is still valid ("" = none)."""
    if not isinstance(value, Mapping):
        return ""
    at = value.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float) or not -CLAIM_TTL < now - at < CLAIM_TTL:
        return ""
    return str(value.get("by", ""))
