"""``node-health-agent status`` (also ``kubectl node-health``): the cluster as recovery sees it.

For every Node with one of our problem conditions True, or with a recovery incident recorded on it:
the condition and reason, since when, and what recovery did (the incident annotation: actions done,
whether we cordoned it) or, where no incident is recorded, what it would do under the policy (the same
pure decision the agents take, in report-only form); under it, the per-device recovery work (the
incident's ``fences``: fence, rule, holder pods, pods evicted) and the operator's clears the node's agent
handled (who, why, when, which device, applied or refused; a healthy node cleared in the last day gets a
row too): :mod:`agent.app.commands.devicestatus`. Then the cluster budget: the Lease, the places
held and by whom, the limit and the disruptive steps in the current window.

Every pause in force, from every pause Lease an agent reads (the agent pods in the namespace say
which: :mod:`agent.app.commands.reach`), a warning for a Lease that holds a pause no agent reads, and
on a node's row the pause that holds its recovery ("held: paused by ..."). Everything from the
cluster is printed escaped (:mod:`agent.app.commands.terminal`).

Read only: it lists Nodes and the agent pods and reads a few Leases (RBAC: nodes list, pods list in
the agent's namespace, leases get; without pods list it says it cannot tell who reads which Lease).
Exit 0 when it could read the cluster, 2 on a configuration error (bad policy file, no credentials),
1 when the API server cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from agent.app.commands.devicestatus import device_lines, device_view
from agent.app.commands.terminal import printable
from agent.app.exitcodes import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK


def add_parser(sub: Any, *, parents: Sequence[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    import os

    status = sub.add_parser(
        "status",
        parents=list(parents),
        help="show nodes with problems, what recovery did or would do, and the cluster budget",
        description="The cluster view of recovery (read only). As a kubectl plugin: kubectl node-health.",
    )
    status.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
    status.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE") or "node-health-agent",
        help="the agent's namespace, where the budget Lease lives (default node-health-agent)",
    )
    status.add_argument(
        "--cluster-name",
        default=os.environ.get("CLUSTER_NAME", ""),
        help="the agents' --cluster-name (names the budget Lease; default: the one name the agent pods run with)",
    )
    status.add_argument(
        "--recovery-policy", default=None, metavar="FILE", help="the agents' recovery policy (default: built-in)"
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    return status


def status(args: argparse.Namespace, *, out: TextIO | None = None, now: float | None = None) -> int:
    from agent.adapters.kube import KubeClient, KubeConfigError, KubeError
    from agent.recovery.policyfile import DEFAULT_POLICY, load_policy

    out = out or sys.stdout
    policy = load_policy(Path(args.recovery_policy)) if args.recovery_policy else DEFAULT_POLICY  # bad: exit 2
    try:
        client = KubeClient.load(kubeconfig=args.kubeconfig)
    except KubeConfigError as exc:
        print(f"status: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        view = cluster_view(
            client=client,
            policy=policy,
            namespace=args.namespace,
            cluster_name=args.cluster_name,
            now=time.time() if now is None else now,
        )
    except KubeError as exc:
        print(f"status: cannot read the cluster: {printable(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        client.close()
    if args.json:
        print(json.dumps(view, indent=2, sort_keys=True), file=out)
    else:
        print_view(view, out=out)
    return EXIT_OK


def cluster_view(*, client: Any, policy: Any, namespace: str, cluster_name: str, now: float) -> dict[str, Any]:
    """Everything ``status`` shows, as plain data (what ``--json`` prints)."""
    from agent.app.commands.reach import find_agents

    nodes = client.list_nodes()
    agents = find_agents(client, namespace)
    pauses = pause_view(client, namespace, cluster_name, policy=policy, nodes=nodes, agents=agents)
    rows = [row for node in nodes if (row := node_row(node, policy=policy, now=now)) is not None]
    by_name = {str((n.get("metadata") or {}).get("name", "")): n for n in nodes}
    for row in rows:
        held = held_by_pause(row, by_name.get(row["node"], {}), pauses, agents=agents, policy=policy)
        if held is not None:
            row["held"] = held
    budget_name = cluster_name or (agents.cluster_names()[0] if len(agents.cluster_names()) == 1 else "")
    return {
        "nodes": rows,
        "budget": budget_view(client, namespace, budget_name, policy=policy, now=now),
        "nodesListed": len(nodes),
        "pauses": pauses,
    }


def node_row(node: Mapping[str, Any], *, policy: Any, now: float) -> dict[str, Any] | None:
    """The row of a Node with one of our problems or a recovery incident (None: neither)."""
    from agent.core.types import Snapshot, Status
    from agent.recovery.ladder import effective_policy, ladder_state, read_history
    from agent.recovery.model import BUILTIN_CONDITIONS
    from agent.recovery.node import read_incident, read_node_view
    from agent.recovery.policy import decide, rule_for

    types = {rule.condition for rule in policy.rules}
    view = read_node_view(node)
    incident = read_incident(node)
    conditions = _conditions(node, types=types, now=now)
    problems = [c for c in conditions if c.status is Status.TRUE]
    devices = device_view(node, now=now)
    show = devices.pop("show")
    if not problems and incident is None and not show:
        return None
    row: dict[str, Any] = {
        "node": view.name,
        "unschedulable": view.unschedulable,
        "problems": [
            {
                "condition": c.type,
                "reason": c.reason,
                "since": c.last_transition,
                "policy": rule_for(policy, c, BUILTIN_CONDITIONS.get(c.type)) is not None,
            }
            for c in problems
        ],
        **devices,
    }
    if incident is not None:
        row["recovery"] = {
            "incident": incident.id,
            "condition": incident.condition,
            "reason": incident.reason,
            "done": [a.value for a in incident.done],
            "cordonedByUs": incident.cordoned_by_us,
            "drain": incident.drain,
            "healthySince": incident.healthy_since,
        }
        ladder = ladder_state(node, incident, policy, now=now)
        if ladder is not None:
            row["recovery"]["ladder"] = ladder
        return row
    # The owners are those of the built-in configuration: the cluster does not say.
    snapshot = Snapshot(conditions=tuple(conditions), generated_at=now, provenance=BUILTIN_CONDITIONS)
    rungs = read_history(node)  # the ladder's rung for each problem, as the agent would choose it
    decision = decide(
        snapshot=snapshot,
        node=view,
        incident=None,
        policy=effective_policy(policy, snapshot=snapshot, view=view, rungs=rungs, now=now)[0],
        now=now,
        started_at=float("-inf"),
        budget=None,
        enabled=False,
    )
    row["wouldDo"] = [a.value for a in decision.actions]
    if decision.blocked is not None:
        row["blocked"] = decision.blocked.value
    return row


def budget_view(client: Any, namespace: str, cluster_name: str, *, policy: Any, now: float) -> dict[str, Any]:
    """The budget Lease: the places held, by whom, and the disruptive steps in the window."""
    from agent.adapters.kube import KubeError
    from agent.recovery.budget import BUDGET_ANNOTATION, budget_lease_name, decode_state

    lease_name = budget_lease_name(cluster_name)
    budget: dict[str, Any] = {"lease": f"{namespace}/{lease_name}"}
    try:
        lease = client.get_lease(namespace, lease_name)
    except KubeError as exc:
        if exc.status != 404:
            raise
        budget["state"] = "not created yet (no agent has needed it)"
    else:
        text = ((lease.get("metadata") or {}).get("annotations") or {}).get(BUDGET_ANNOTATION)
        try:
            state = decode_state(text)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # hostile content: never a crash
            budget["state"] = f"corrupt: {exc} (recovery is blocked cluster-wide until it is fixed or deleted)"
        else:
            window = policy.budget.window
            budget["holders"] = {
                domain: {"nodes": list(h.nodes), "incident": h.incident, "since": h.since}
                for domain, h in state.holders.items()
            }
            budget["actionsInWindow"] = sum(1 for t in state.actions if now - t < window)
            budget["maxActions"] = policy.budget.max_actions
            budget["window"] = window
            budget["lastWriter"] = (lease.get("spec") or {}).get("holderIdentity")
    budget["maxUnhealthy"] = policy.budget.max_unhealthy
    budget["maxUnhealthyCap"] = policy.budget.max_unhealthy_cap
    return budget


def pause_view(
    client: Any,
    namespace: str,
    cluster_name: str,
    *,
    policy: Any = None,
    nodes: Sequence[Mapping[str, Any]] = (),
    agents: Any = None,
) -> dict[str, Any]:
    """Every pause in force (``pauses``, each with its ``lease``) with who, why and when, read from every
    pause Lease an agent reads (and the one ``cluster_name`` names); ``leases``: each of those with the
    agent pods that read it; ``unread``: the Leases holding a pause that no agent is seen to read;
    ``problem`` when one the agents read is unreadable. A pool pause also names the pool labels the agents
    match with ``policy`` and how many ``nodes`` it covers."""
    from agent.app.commands.reach import Agents
    from agent.recovery.holds import DEFAULT_PAUSE_LEASE, POOL_LABELS, PauseStore, Scope, pause_lease_name, pool_labels

    agents = agents if agents is not None else Agents(namespace=namespace, problem="the agent pods were not listed")
    names = tuple(dict.fromkeys((*agents.leases(), pause_lease_name(cluster_name), DEFAULT_PAUSE_LEASE)))
    pools = pool_labels(policy.budget) if policy is not None else POOL_LABELS
    listed, leases, unread, problems = [], [], [], []
    for name in names:
        store = PauseStore(client=client, namespace=namespace, lease_name=name)
        pauses = store.read()
        readers = [p.name for p in agents.readers(name)]
        leases.append({"lease": store.where, "readBy": readers, "pauses": len(pauses.pauses)})
        if (pauses.pauses or pauses.problem) and not readers and not agents.problem:
            unread.append(store.where)
        if pauses.problem and (readers or agents.problem):
            problems.append(pauses.problem)
        for p in pauses.pauses:
            entry = {**p.to_json(), "lease": store.where}
            if p.scope is Scope.POOL:
                labels = [((n.get("metadata") or {}).get("labels") or {}) for n in nodes]
                entry["poolLabels"] = list(pools)
                entry["nodes"] = sum(
                    1
                    for lab in labels
                    if isinstance(lab, Mapping) and p.covers(node="", labels=lab, condition="", reason="", pools=pools)
                )
            listed.append(entry)
    view: dict[str, Any] = {
        "lease": f"{namespace}/{DEFAULT_PAUSE_LEASE}",
        "pauses": listed,
        "leases": leases,
        "unread": unread,
        "agents": {
            "pods": len(agents.pods),
            "clusterNames": list(agents.cluster_names()),
            "unknownClusterName": [p.name for p in agents.unknown()],
        },
    }
    if agents.problem:
        view["agents"]["problem"] = agents.problem
    if problems:
        view["problem"] = "; ".join(problems)
    return view


def held_by_pause(
    row: Mapping[str, Any], node: Mapping[str, Any], pauses: Mapping[str, Any], *, agents: Any, policy: Any
) -> dict[str, Any] | None:
    """Whether a pause holds the row's recovery, judged as the agent on that node does: the pauses of the
    Leases it reads (every listed one when its pod is not seen), for the incident's (or else the first
    problem's) condition and reason. None: not held."""
    from agent.recovery.holds import POOL_LABELS, Pause, Scope, pool_labels

    if pauses.get("problem"):
        return {"by": [], "pauses": [], "text": "held: paused everywhere (a pause Lease is unreadable)"}
    pod = agents.on(row["node"])
    reads = {f"{agents.namespace}/{name}" for name in pod.leases} if pod is not None else None
    subject = row.get("recovery") or (row["problems"][0] if row["problems"] else {})
    labels = (node.get("metadata") or {}).get("labels") or {}
    labels = labels if isinstance(labels, Mapping) else {}
    pools = pool_labels(policy.budget) if policy is not None else POOL_LABELS
    condition, reason = str(subject.get("condition", "")), str(subject.get("reason", ""))
    covering = []
    for entry in pauses["pauses"]:
        if reads is not None and entry["lease"] not in reads:
            continue
        pause = Pause(
            scope=Scope(entry["scope"]), value=entry["value"], by=entry["by"], why=entry["why"], since=entry["since"]
        )
        if pause.covers(node=row["node"], labels=labels, condition=condition, reason=reason, pools=pools):
            covering.append(pause)
    if not covering:
        return None
    text = "held: paused by " + ", ".join(f"{p.by or 'unknown'} ({p.key})" for p in covering)
    return {"by": [p.by for p in covering], "pauses": [p.key for p in covering], "text": text}


def _print_pauses(pauses: Mapping[str, Any] | None, *, out: TextIO, now: float) -> None:
    if pauses is None:
        return
    _say(out, "")
    if pauses.get("problem"):
        _say(out, f"PAUSED EVERYWHERE: {pauses['problem']}")
        return
    agents = pauses.get("agents") or {}
    _say(out, f"pauses ({_readers(pauses, agents)}):" + ("" if pauses["pauses"] else " none"))
    for p in pauses["pauses"]:
        what = p["scope"] if p["scope"] == "cluster" else f"{p['scope']}={p['value']}"
        if "poolLabels" in p:
            what += f" ({' or '.join(p['poolLabels'])}: {p['nodes']} nodes)"
        why = f": {p['why']}" if p["why"] else ""
        lease = "" if p.get("lease", pauses["lease"]) == pauses["lease"] else f" [Lease {p['lease']}]"
        _say(out, f"  {what} by {p['by'] or 'unknown'} {_ago(p['since'], now)} ago{why}{lease}")
    for lease in pauses.get("unread") or ():
        running = ", ".join(agents.get("clusterNames") or ()) or "none"
        _say(
            out,
            f"  WARNING: no agent reads the pause Lease {lease}: its pauses hold nothing "
            f"(the agents' cluster names: {running})",
        )


def _readers(pauses: Mapping[str, Any], agents: Mapping[str, Any]) -> str:
    """Which pause Leases the agents read, as the pause list's heading says it."""
    if agents.get("problem"):
        return f"Lease {pauses['lease']}; which Leases the agents read cannot be told: {agents['problem']}"
    read = [entry["lease"] for entry in pauses.get("leases") or () if entry["readBy"]]
    if not read:
        return f"Lease {pauses['lease']}; no agent pod seen in its namespace"
    unknown = agents.get("unknownClusterName") or ()
    tail = f"; {len(unknown)} with a cluster name that cannot be told" if unknown else ""
    return f"the agents ({agents.get('pods', 0)} pods{tail}) read Lease {' and '.join(read)}"


def _say(out: TextIO, line: str) -> None:
    """One line, every character from the cluster escaped (terminal control sequences never reach it)."""
    print(printable(line), file=out)


def _conditions(node: Mapping[str, Any], *, types: set[str], now: float) -> list[Any]:
    from agent.core.types import Severity
    from agent.sources.nodeseed import node_conditions

    return node_conditions(dict(node), types=sorted(types), severity=lambda _t, _r: Severity.CRITICAL, now=now)


def _ago(seconds: float | None, now: float) -> str:
    if seconds is None:
        return "-"
    left = max(0, int(now - seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= size:
            return f"{left // size}{unit}"
    return f"{left}s"


def print_view(view: Mapping[str, Any], *, out: TextIO, now: float | None = None) -> None:
    now = time.time() if now is None else now
    rows = view["nodes"]
    _say(out, f"{len(rows)} of {view['nodesListed']} nodes with problems, a recovery incident or a recent clear")
    if rows:
        table: list[tuple[str, ...]] = [("NODE", "CONDITION", "REASON", "SINCE", "RECOVERY")]
        for row in rows:
            problems = row["problems"] or [{"condition": "-", "reason": "(healed)", "since": None}]
            what = _recovery_text(row)
            # One row per problem: recovery acts once per node, so only the node's first row says what it did.
            for i, problem in enumerate(problems):
                cells = (row["node"], problem["condition"], problem["reason"], _ago(problem["since"], now))
                table.append((*(printable(c) for c in cells), printable(what) if i == 0 else ""))
            # Under the node's rows: its devices' recovery work and the operator's clears.
            table.extend(("  " + printable(line),) for line in device_lines(row, ago=lambda t: _ago(t, now)))
        widths = [max(len(r[i]) for r in table if len(r) > 1) for i in range(4)]
        for r in table:
            if len(r) == 1:
                print(r[0], file=out)
                continue
            print(("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]).rstrip(), file=out)
    _print_pauses(view.get("pauses"), out=out, now=now)
    budget = view["budget"]
    _say(out, "")
    _say(out, f"budget (Lease {budget['lease']}):")
    if "state" in budget:
        _say(out, f"  {budget['state']}")
        return
    cap = f", cap {budget['maxUnhealthyCap']}" if budget.get("maxUnhealthyCap") is not None else ""
    _say(out, f"  places held: {len(budget['holders'])} (maxUnhealthy {budget['maxUnhealthy']}{cap})")
    for domain, holder in sorted(budget["holders"].items()):
        _say(
            out, f"    {domain}: {', '.join(holder['nodes'])} since {_ago(holder['since'], now)} ({holder['incident']})"
        )
    steps = f"{budget['actionsInWindow']} of {budget['maxActions']}"
    _say(out, f"  disruptive steps in the last {int(budget['window'])}s: {steps}")


def _recovery_text(row: Mapping[str, Any]) -> str:
    """The RECOVERY column: what was done (or would be), and the pause that holds it."""
    if "recovery" in row:
        rec = row["recovery"]
        what = ", ".join(rec["done"]) or "nothing yet"
        what = f"done: {what}" + ("" if rec["cordonedByUs"] else " (cordon not ours)")
        if rec["drain"]:
            what += f"; drain {rec['drain']}"
        if rec.get("ladder"):
            what += f"; {rec['ladder']['text']}"
    else:
        what = "would: " + (", ".join(row["wouldDo"]) or "nothing")
        if row.get("blocked"):
            what += f" ({row['blocked']})"
    if row.get("held"):
        what += f"; {row['held']['text']}"
    return what
