"""Whom a pause reaches and what it covers: what ``pause`` checks before it writes, ``resume`` before it
lifts and ``status`` while it shows the pauses.

The agents are the pods labelled ``AGENT_SELECTOR`` in the agent's namespace (both the kustomize base
and the Helm chart label them so). From each pod's agent container (the one that runs ``run``) the
cluster name it runs with: ``--cluster-name`` in its args, else the env ``CLUSTER_NAME`` or
``NHA_CLUSTER_NAME`` as the agent reads them. A value from a ConfigMap, a Secret, ``envFrom`` or a
``$(VAR)`` reference cannot be told from the pod: ``cluster_name`` None. Every agent reads the
namespace's pause Lease; one with a cluster name also its cluster's own
(:func:`agent.recovery.holds.pause_lease_names`).

What a pause covers is judged against the Nodes as listed and the policy: the nodes named (a node
pause: that exact name), the nodes whose pool label has the value (a pool pause: the policy's pool
labels), the reasons it matches (a reason pause: the reasons the policy names and the reasons of our
conditions on the Nodes now; globs are case-sensitive, as the agents match them).

Pods and Nodes are hostile input: anything of a wrong type counts as absent, never as an error.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.adapters.kube import KubeError
from agent.app.flags import flag
from agent.recovery.holds import DEFAULT_PAUSE_LEASE, Pause, Scope, pause_lease_names
from agent.recovery.model import BUILTIN_CONDITIONS

AGENT_SELECTOR = "app.kubernetes.io/name=node-health-agent,app.kubernetes.io/component=agent"
LISTED = 5  # names shown before "+N more"


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentPod:
    """One agent pod: where it runs and the cluster name it runs with (None: cannot tell from the pod)."""

    name: str
    node: str = ""
    cluster_name: str | None = ""
    recovery: bool | None = None  # ENABLE_RECOVERY (None: cannot tell)

    @property
    def leases(self) -> tuple[str, ...]:
        """The pause Leases it reads; with its cluster name unknown, only the one it surely reads."""
        return pause_lease_names(self.cluster_name) if self.cluster_name is not None else (DEFAULT_PAUSE_LEASE,)


@dataclass(frozen=True, kw_only=True, slots=True)
class Agents:
    """The agent pods of a namespace; ``problem``: they could not be listed (who reads what is unknown)."""

    namespace: str
    pods: tuple[AgentPod, ...] = ()
    problem: str = ""

    def readers(self, lease: str) -> tuple[AgentPod, ...]:
        return tuple(p for p in self.pods if lease in p.leases)

    def unknown(self) -> tuple[AgentPod, ...]:
        return tuple(p for p in self.pods if p.cluster_name is None)

    def cluster_names(self) -> tuple[str, ...]:
        return tuple(sorted({p.cluster_name for p in self.pods if p.cluster_name}))

    def leases(self) -> tuple[str, ...]:
        """Every pause Lease some agent reads, the namespace's first."""
        return tuple(dict.fromkeys(name for p in self.pods for name in p.leases)) or (DEFAULT_PAUSE_LEASE,)

    def on(self, node: str) -> AgentPod | None:
        return next((p for p in self.pods if p.node == node), None)


def find_agents(client: Any, namespace: str) -> Agents:
    """The agent pods in ``namespace`` (RBAC: pods list there). Never raises for an API error: ``problem``."""
    try:
        pods = client.list_pods(namespace, label_selector=AGENT_SELECTOR)
    except KubeError as exc:
        return Agents(namespace=namespace, problem=f"cannot list the agent pods in {namespace}: {exc}")
    found = (agent_pod(pod) for pod in pods if isinstance(pod, Mapping))
    return Agents(namespace=namespace, pods=tuple(p for p in found if p is not None))


def agent_pod(pod: Mapping[str, Any]) -> AgentPod | None:
    """The agent of a pod (None: a finished pod, which reads nothing)."""
    metadata = _map(pod.get("metadata"))
    spec = _map(pod.get("spec"))
    if _map(pod.get("status")).get("phase") in ("Succeeded", "Failed"):
        return None
    name, node = str(metadata.get("name", "")), spec.get("nodeName")
    containers = [c for c in _list(spec.get("containers")) if isinstance(c, Mapping)]
    agent = next((c for c in containers if "run" in _tokens(c) and "kmsg-relay" not in _tokens(c)), None)
    if agent is None:  # labelled as an agent, but no container runs one: cannot tell
        return AgentPod(name=name, node=node if isinstance(node, str) else "", cluster_name=None)
    recovery = _setting(agent, "--enable-recovery", flag("enable-recovery").env)
    return AgentPod(
        name=name,
        node=node if isinstance(node, str) else "",
        cluster_name=_setting(agent, "--cluster-name", flag("cluster-name").env),
        recovery=None if recovery is None else recovery.strip().lower() == "true",
    )


def _setting(container: Mapping[str, Any], flag: str, env_names: Sequence[str]) -> str | None:
    """The value the agent reads for ``flag``: the flag in its args, else the first non-empty env var of
    ``env_names`` (as the CLI's defaults read them); None when the pod does not say it."""
    tokens = _tokens(container)
    value: str | None = None
    for i, token in enumerate(tokens):
        if token == flag and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif token.startswith(flag + "="):
            value = token.partition("=")[2]
    if value is not None:
        return None if "$(" in value else value
    env: dict[str, str | None] = {}
    for entry in _list(container.get("env")):
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            raw = entry.get("value", "")
            known = "valueFrom" not in entry and isinstance(raw, str) and "$(" not in raw
            env[entry["name"]] = raw if known else None
    from_elsewhere = bool(_list(container.get("envFrom")))
    for name in env_names:
        if name not in env:
            if from_elsewhere:
                return None
            continue
        if env[name] is None or env[name]:
            return env[name]
    return ""


def _tokens(container: Mapping[str, Any]) -> list[str]:
    return [t for t in [*_list(container.get("command")), *_list(container.get("args"))] if isinstance(t, str)]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# ---- what a pause covers ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Coverage:
    """What a pause covers: ``nodes`` (named, of the pool, or with a matching problem now) and, for a
    reason pause, the known ``reasons`` it matches; ``hint``: why it covers nothing and what would."""

    scope: Scope
    nodes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    listed: int = 0  # Nodes listed
    hint: str = ""

    @property
    def empty(self) -> bool:
        return not self.nodes and not self.reasons and self.scope is not Scope.CLUSTER

    def summary(self) -> str:
        if self.scope is Scope.CLUSTER:
            return f"every node ({self.listed} listed)"
        if self.scope is Scope.REASON:
            now = f"; {len(self.nodes)} node(s) with such a problem now"
            return f"reasons {names(self.reasons)}{now}" + (f": {names(self.nodes)}" if self.nodes else "")
        return f"{len(self.nodes)} node(s): {names(self.nodes)}"


def names(items: Sequence[str], limit: int = LISTED) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "") if items else "none"


def coverage(pause: Pause, *, nodes: Sequence[Mapping[str, Any]], pools: Sequence[str], policy: Any) -> Coverage:
    """What ``pause`` covers among ``nodes`` (as listed) under ``policy`` (its pool labels: ``pools``)."""
    listed = [(str(_map(n.get("metadata")).get("name", "")), _labels(n)) for n in nodes if isinstance(n, Mapping)]
    if pause.scope is Scope.CLUSTER:
        return Coverage(scope=pause.scope, nodes=tuple(n for n, _ in listed), listed=len(listed))
    if pause.scope is Scope.NODE:
        found = tuple(n for n, _ in listed if n == pause.value)
        near = [n for n, _ in listed if n.lower() == pause.value.lower()]
        hint = f"no Node is named {pause.value!r}" + (f" (names are exact: did you mean {near[0]!r}?)" if near else "")
        return Coverage(scope=pause.scope, nodes=found, listed=len(listed), hint="" if found else hint)
    if pause.scope is Scope.POOL:
        found = tuple(
            n for n, labels in listed if pause.covers(node=n, labels=labels, condition="", reason="", pools=pools)
        )
        hint = "" if found else _pool_hint(pause, listed, pools)
        return Coverage(scope=pause.scope, nodes=found, listed=len(listed), hint=hint)
    return _reason_coverage(pause, nodes=nodes, listed=listed, policy=policy)


def _pool_hint(pause: Pause, listed: Sequence[tuple[str, Mapping[str, str]]], pools: Sequence[str]) -> str:
    hint = f"no Node has {pause.value!r} under a pool label ({' or '.join(pools)})"
    elsewhere = sorted({k for _, labels in listed for k, v in labels.items() if v == pause.value and k not in pools})
    if elsewhere:
        hint += (
            f"; label {elsewhere[0]} has that value: if the agents' policy names it in budget.groups, pass "
            "--recovery-policy FILE (the agents' policy)"
        )
    values = sorted({labels[k] for _, labels in listed for k in pools if k in labels})
    near = [v for v in values if v.lower() == pause.value.lower()]
    if near:
        hint += f" (values are exact: did you mean {near[0]!r}?)"
    elif values:
        hint += f" (pools: {names(values)})"
    return hint


def _reason_coverage(
    pause: Pause, *, nodes: Sequence[Mapping[str, Any]], listed: Sequence[tuple[str, Any]], policy: Any
) -> Coverage:
    known = known_reasons(policy, nodes)
    glob = pause.value
    matched = tuple(sorted({s for s in _subjects(known, glob) if _overlap(s, glob)}))
    with_problem = tuple(
        sorted(
            {
                name
                for node, (name, _) in zip((n for n in nodes if isinstance(n, Mapping)), listed, strict=True)
                for condition, reason, status in _conditions(node)
                if status == "True" and pause.covers(node=name, labels={}, condition=condition, reason=reason)
            }
        )
    )
    hint = ""
    if not matched and not with_problem:
        near = sorted({s for s in _subjects(known, glob) if _overlap(s.lower(), glob.lower())})
        hint = f"{glob!r} matches no reason the policy names or the Nodes have"
        if near:
            hint += f" (globs are case-sensitive: {names(near)} match when case is ignored)"
        else:
            hint += f" (known: {names(sorted(_subjects(known, glob)))})"
    return Coverage(scope=pause.scope, nodes=with_problem, reasons=matched, listed=len(listed), hint=hint)


def known_reasons(policy: Any, nodes: Iterable[Mapping[str, Any]]) -> set[tuple[str, str | None]]:
    """(condition, reason) pairs: the policy's reasons (globs included; None = a rule for any reason of
    its condition) and the reasons of our condition types on the Nodes now (any status)."""
    known: set[tuple[str, str | None]] = set()
    for rule in policy.rules:
        known.update((rule.condition, r) for r in rule.reasons)
        if not rule.reasons:
            known.add((rule.condition, None))
    types = {rule.condition for rule in policy.rules} | set(BUILTIN_CONDITIONS)
    for node in nodes:
        if isinstance(node, Mapping):
            known.update((c, r) for c, r, _ in _conditions(node) if c in types and r)
    return known


def _subjects(known: Iterable[tuple[str, str | None]], glob: str) -> set[str]:
    """What a glob is matched against: ``CONDITION/REASON`` for a glob with ``/``, else the reason."""
    if "/" in glob:
        return {f"{c}/{r if r is not None else '*'}" for c, r in known}
    return {r for _, r in known if r is not None}


def _overlap(subject: str, glob: str) -> bool:
    """Whether a glob matches a reason, or overlaps a reason glob of the policy (either matches the other)."""
    return fnmatch.fnmatchcase(subject, glob) or fnmatch.fnmatchcase(glob, subject)


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    labels = _map(_map(node.get("metadata")).get("labels"))
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def _conditions(node: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    found = []
    for c in _list(_map(node.get("status")).get("conditions")):
        if isinstance(c, Mapping) and all(isinstance(c.get(k), str) for k in ("type", "reason", "status")):
            found.append((c["type"], c["reason"], c["status"]))
    return found
