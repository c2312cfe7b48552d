"""``node-health-agent status`` (also ``kubectl node-health``): the cluster as recovery sees it.

For every Node with one of our problem conditions True, or with a recovery incident recorded on it:
the condition and reason, since when, and what recovery did (the incident annotation: actions done,
whether we cordoned it) or, where no incident is recorded, what it would do under the policy (the same
pure decision the agents take, in report-only form). Then the cluster budget: the Lease, the places
held and by whom, the limit and the disruptive steps in the current window.

Read only: it lists Nodes and reads one Lease (RBAC: nodes list, leases get). Exit 0 when it could
read the cluster, 2 on a configuration error (bad policy file, no credentials), 1 when the API
server cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

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
        help="the agents' --cluster-name (names the budget Lease)",
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
        print(f"status: cannot read the cluster: {exc}", file=sys.stderr)
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
    from agent.adapters.kube import KubeError
    from agent.core.types import Snapshot, Status
    from agent.recovery.budget import BUDGET_ANNOTATION, budget_lease_name, decode_state
    from agent.recovery.ladder import effective_policy, ladder_state, read_history
    from agent.recovery.model import BUILTIN_CONDITIONS
    from agent.recovery.node import read_incident, read_node_view
    from agent.recovery.policy import decide, rule_for

    nodes = client.list_nodes()
    types = {rule.condition for rule in policy.rules}
    rows = []
    for node in nodes:
        view = read_node_view(node)
        incident = read_incident(node)
        conditions = _conditions(node, types=types, now=now)
        problems = [c for c in conditions if c.status is Status.TRUE]
        if not problems and incident is None:
            continue
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
        }
        if incident is not None:
            row["recovery"] = {
                "incident": incident.id,
                "done": [a.value for a in incident.done],
                "cordonedByUs": incident.cordoned_by_us,
                "drain": incident.drain,
                "healthySince": incident.healthy_since,
            }
            ladder = ladder_state(node, incident, policy, now=now)
            if ladder is not None:
                row["recovery"]["ladder"] = ladder
        else:
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
        rows.append(row)
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
        except ValueError as exc:
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
    return {
        "nodes": rows,
        "budget": budget,
        "nodesListed": len(nodes),
        "pauses": pause_view(client, namespace, cluster_name, policy=policy, nodes=nodes),
    }


def pause_view(
    client: Any, namespace: str, cluster_name: str, *, policy: Any = None, nodes: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """Every pause in force (``pauses``) with who, why and when; ``problem`` when the Lease is unreadable.
    A pool pause also names the pool labels the agents match with ``policy`` and how many ``nodes`` it covers."""
    from agent.recovery.holds import POOL_LABELS, PauseStore, Scope, pause_lease_name, pool_labels

    store = PauseStore(client=client, namespace=namespace, lease_name=pause_lease_name(cluster_name))
    pauses = store.read()
    pools = pool_labels(policy.budget) if policy is not None else POOL_LABELS
    listed = []
    for p in pauses.pauses:
        entry = p.to_json()
        if p.scope is Scope.POOL:
            labels = [((n.get("metadata") or {}).get("labels") or {}) for n in nodes]
            entry["poolLabels"] = list(pools)
            entry["nodes"] = sum(
                1
                for lab in labels
                if isinstance(lab, Mapping) and p.covers(node="", labels=lab, condition="", reason="", pools=pools)
            )
        listed.append(entry)
    view: dict[str, Any] = {"lease": store.where, "pauses": listed}
    if pauses.problem:
        view["problem"] = pauses.problem
    return view


def _print_pauses(pauses: Mapping[str, Any] | None, *, out: TextIO, now: float) -> None:
    if pauses is None:
        return
    if pauses.get("problem"):
        print(f"\nPAUSED EVERYWHERE: {pauses['problem']}", file=out)
        return
    if not pauses["pauses"]:
        print(f"\npauses (Lease {pauses['lease']}): none", file=out)
        return
    print(f"\npauses (Lease {pauses['lease']}):", file=out)
    for p in pauses["pauses"]:
        what = p["scope"] if p["scope"] == "cluster" else f"{p['scope']}={p['value']}"
        if "poolLabels" in p:
            what += f" ({' or '.join(p['poolLabels'])}: {p['nodes']} nodes)"
        why = f": {p['why']}" if p["why"] else ""
        print(f"  {what} by {p['by'] or 'unknown'} {_ago(p['since'], now)} ago{why}", file=out)


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
    print(f"{len(rows)} of {view['nodesListed']} nodes with problems or a recovery incident", file=out)
    if rows:
        table = [("NODE", "CONDITION", "REASON", "SINCE", "RECOVERY")]
        for row in rows:
            problems = row["problems"] or [{"condition": "-", "reason": "(healed)", "since": None}]
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
            # One row per problem: recovery acts once per node, so only the node's first row says what it did.
            for i, problem in enumerate(problems):
                table.append(
                    (
                        row["node"],
                        problem["condition"],
                        problem["reason"],
                        _ago(problem["since"], now),
                        what if i == 0 else "",
                    )
                )
        widths = [max(len(str(r[i])) for r in table) for i in range(4)]
        for r in table:
            print(
                ("  ".join(str(c).ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]).rstrip(),
                file=out,
            )
    _print_pauses(view.get("pauses"), out=out, now=now)
    budget = view["budget"]
    print(f"\nbudget (Lease {budget['lease']}):", file=out)
    if "state" in budget:
        print(f"  {budget['state']}", file=out)
        return
    cap = f", cap {budget['maxUnhealthyCap']}" if budget.get("maxUnhealthyCap") is not None else ""
    print(f"  places held: {len(budget['holders'])} (maxUnhealthy {budget['maxUnhealthy']}{cap})", file=out)
    for domain, holder in sorted(budget["holders"].items()):
        print(
            f"    {domain}: {', '.join(holder['nodes'])} since {_ago(holder['since'], now)} ({holder['incident']})",
            file=out,
        )
    steps = f"{budget['actionsInWindow']} of {budget['maxActions']}"
    print(f"  disruptive steps in the last {int(budget['window'])}s: {steps}", file=out)
