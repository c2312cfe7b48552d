"""``node-health-agent pause`` and ``resume`` (also ``kubectl node-health pause|resume``): the off switch.

A pause is written to the namespace's pause Lease (:mod:`agent.recovery.holds`) with who, why and
when; every agent in the namespace reads it, whatever cluster name it runs with, before it acts and
while it drains, so it takes effect at their next step (seconds), without a rollout. ``--cluster-name
NAME`` writes that cluster's Lease instead, which only the agents running with NAME read. One Event in
the agent's namespace (about the Lease) records each change.

``pause`` with no selector pauses the whole cluster; ``--pool``, ``--node`` or ``--condition-reason``
narrow it. Before it writes, ``pause`` checks (:mod:`agent.app.commands.reach`) that an agent pod in
the namespace reads that Lease and that the pause covers something (a Node of that name, a Node of that
pool, a reason the policy or the Nodes have), and refuses otherwise (``--force`` writes it anyway); it
then says whom it reaches and what it covers. ``resume`` with the same selector lifts that pause from
every Lease the agents read (``resume --all`` lifts every one). Exit 0 on success (also when there was
nothing to change, and when only the Event could not be written: a warning), 2 on a bad argument, no
credentials or a pause that covers nothing, 1 when no agent is seen to read the Lease, the API server
refuses or the pause Lease is unreadable (it then says how to repair it).

RBAC for the operator: leases get/create/update, events create and pods list in the agent's namespace
(the Role ``node-health-agent-recovery-pause`` in the manifests, to bind to the people who may pause),
and nodes list (as ``status``).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from agent.app.commands.terminal import printable
from agent.app.exitcodes import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK


def add_parsers(sub: Any, *, parents: Sequence[argparse.ArgumentParser]) -> None:
    for name, text in (
        ("pause", "stop recovery (new actions and drains in progress) on the cluster, a pool, a node or a reason"),
        ("resume", "lift a pause set with pause (the same selector), or every pause with --all"),
    ):
        cmd = sub.add_parser(name, parents=list(parents), help=text, description=text + ".")
        cmd.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
        cmd.add_argument(
            "--namespace",
            default=os.environ.get("POD_NAMESPACE") or "node-health-agent",
            help="the agent's namespace, where the pause Lease lives (default node-health-agent)",
        )
        cmd.add_argument(
            "--cluster-name",
            default="",
            help="only the agents running with this --cluster-name (default: every agent in the namespace)",
        )
        cmd.add_argument(
            "--recovery-policy",
            default=None,
            metavar="FILE",
            help="the agents' recovery policy (its pool labels and reasons; default: built-in)",
        )
        if name == "pause":
            cmd.add_argument(
                "--force",
                action="store_true",
                help="write the pause even when it covers nothing or no agent is seen to read it",
            )
        cmd.add_argument("--reason", default="", help="why (kept with the pause, shown by status and in the Event)")
        cmd.add_argument("--by", default=None, help="who (default: the local user name)")
        which = cmd.add_mutually_exclusive_group()
        which.add_argument(
            "--pool",
            default=None,
            metavar="VALUE",
            help="only nodes of this pool: their pool label (the policy's budget.groups labels) has this value",
        )
        which.add_argument("--node", default=None, metavar="NAME", help="only this node")
        which.add_argument(
            "--condition-reason",
            default=None,
            metavar="GLOB",
            help="only problems whose reason matches (a glob with / matches CONDITION/REASON)",
        )
        if name == "resume":
            which.add_argument("--all", action="store_true", help="lift every pause")


def selected(args: argparse.Namespace) -> tuple[Any, str]:
    """(Scope, value) named by the arguments."""
    from agent.recovery.holds import Scope

    if args.pool is not None:
        return Scope.POOL, args.pool
    if args.node is not None:
        return Scope.NODE, args.node
    if args.condition_reason is not None:
        return Scope.REASON, args.condition_reason
    return Scope.CLUSTER, ""


def pause(args: argparse.Namespace, *, out: TextIO | None = None, now: float | None = None) -> int:
    """``pause`` or ``resume`` (``args.command``)."""
    from agent.adapters.kube import KubeClient, KubeConfigError, KubeError
    from agent.recovery.policyfile import DEFAULT_POLICY, load_policy

    out = out or sys.stdout
    command = args.command
    scope, value = selected(args)
    if scope.value != "cluster" and not value.strip():
        print(f"{command}: --{scope.value} needs a non-empty value", file=sys.stderr)
        return EXIT_CONFIG
    policy = load_policy(Path(args.recovery_policy)) if args.recovery_policy else DEFAULT_POLICY  # bad: exit 2
    try:
        client = KubeClient.load(kubeconfig=args.kubeconfig)
    except KubeConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    at = time.time() if now is None else now
    try:
        if command == "pause":
            return _pause(client, args, scope=scope, value=value, policy=policy, now=at, out=out)
        return _resume(client, args, scope=scope, value=value, now=at, out=out)
    except Unreadable as exc:
        print(f"{command}: {printable(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KubeError as exc:
        print(f"{command}: {printable(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        client.close()


def _pause(
    client: Any, args: argparse.Namespace, *, scope: Any, value: str, policy: Any, now: float, out: TextIO
) -> int:
    """Check that the pause reaches an agent and covers something, then write it (``--force``: whatever)."""
    from agent.adapters.kube import KubeError
    from agent.app.commands.reach import Coverage, coverage, find_agents
    from agent.recovery.holds import Pause, PauseStore, pause_lease_name, pool_labels

    lease = pause_lease_name(args.cluster_name)
    agents = find_agents(client, args.namespace)
    unreached = reach_problem(agents, lease, cluster_name=args.cluster_name)
    cover: Coverage | None = None
    try:
        cover = coverage(
            Pause(scope=scope, value=value), nodes=client.list_nodes(), pools=pool_labels(policy.budget), policy=policy
        )
    except KubeError as exc:
        uncovered = f"cannot tell what it covers: {exc}"
    else:
        uncovered = f"the pause covers nothing: {cover.hint}" if cover.empty else ""
    if (unreached or uncovered) and not args.force:
        for problem in (unreached, uncovered):
            if problem:
                print(f"pause: refused (nothing written): {printable(problem)}", file=sys.stderr)
        print("pause: --force writes it anyway", file=sys.stderr)
        return EXIT_CONFIG if uncovered and not unreached else EXIT_FAILURE
    store = PauseStore(client=client, namespace=args.namespace, lease_name=lease)
    changed, message = change(
        store, command="pause", scope=scope, value=value, by=args.by or _user(), why=args.reason, now=now, every={}
    )
    print(printable(message), file=out)
    readers = agents.readers(lease)
    print(f"  reaches: {reach_summary(agents, lease, readers)}", file=out)
    print(f"  covers: {printable(cover.summary()) if cover is not None else 'cannot tell'}", file=out)
    for problem in (unreached, uncovered):
        if problem:
            print(f"pause: warning (--force): {printable(problem)}", file=sys.stderr)
    if changed:
        _event(client, namespace=args.namespace, lease=lease, command="pause", message=message, now=now)
    return EXIT_OK


def _resume(client: Any, args: argparse.Namespace, *, scope: Any, value: str, now: float, out: TextIO) -> int:
    """Lift the pause from every Lease the agents read (only the named cluster's with ``--cluster-name``)."""
    from agent.app.commands.reach import find_agents
    from agent.recovery.holds import PauseStore, pause_lease_name

    agents = find_agents(client, args.namespace)
    leases = (pause_lease_name(args.cluster_name),) if args.cluster_name else agents.leases()
    if agents.problem and not args.cluster_name:
        print(f"resume: warning: {printable(agents.problem)}: only {leases[0]} is looked at", file=sys.stderr)
    by = args.by or _user()
    results = []
    for lease in leases:
        store = PauseStore(client=client, namespace=args.namespace, lease_name=lease)
        changed, message = change(
            store, command="resume", scope=scope, value=value, by=by, why=args.reason, now=now, every=args.__dict__
        )
        results.append((lease, changed, message))
    lifted = [(lease, message) for lease, changed, message in results if changed]
    for lease, message in lifted:
        print(printable(message), file=out)
        _event(client, namespace=args.namespace, lease=lease, command="resume", message=message, now=now)
    if not lifted:
        print(printable("; ".join(message for _, _, message in results)), file=out)
    return EXIT_OK


def reach_problem(agents: Any, lease: str, *, cluster_name: str) -> str:
    """Why a pause in ``lease`` may reach no agent ("" when some agent surely reads it)."""
    from agent.app.commands.reach import AGENT_SELECTOR, names

    where = f"{agents.namespace}/{lease}"
    if agents.problem:
        return (
            f"cannot tell which agents read {where}: {agents.problem} (pods list in {agents.namespace}: the Role "
            "node-health-agent-recovery-pause grants it)"
        )
    if not agents.pods:
        return (
            f"no agent pod in namespace {agents.namespace} (label {AGENT_SELECTOR}): a pause there reaches no agent; "
            "--namespace names the agents' namespace"
        )
    if agents.readers(lease):
        return ""
    running = names(list(agents.cluster_names())) if agents.cluster_names() else "none"
    problem = (
        f"no agent reads {where}: --cluster-name {cluster_name!r} is not the cluster name of any agent in "
        f"{agents.namespace} (they run with: {running})"
    )
    unknown = agents.unknown()
    if unknown:
        problem += f"; cannot tell for {len(unknown)} pod(s) ({unknown[0].name}: from a ConfigMap, a Secret or envFrom)"
    return problem + "; without --cluster-name the pause reaches every agent in the namespace"


def reach_summary(agents: Any, lease: str, readers: Sequence[Any]) -> str:
    from agent.recovery.holds import DEFAULT_PAUSE_LEASE

    if agents.problem:
        return "cannot tell (the agent pods could not be listed)"
    who = "every agent in the namespace" if lease == DEFAULT_PAUSE_LEASE else "the agents of that cluster name"
    text = f"{len(readers)} of {len(agents.pods)} agent pod(s) ({who})"
    if readers and all(p.recovery is False for p in readers):
        text += "; none of them has recovery on (ENABLE_RECOVERY), so none acts anyway"
    return text


def _event(client: Any, *, namespace: str, lease: str, command: str, message: str, now: float) -> None:
    """The Event of a change already made: its failure is a warning, never the command's failure."""
    from agent.adapters.kube import KubeError

    try:
        record_event(client, namespace=namespace, lease=lease, command=command, message=message, now=now)
    except KubeError as exc:
        print(
            f"{command}: warning: done, but its Event in {namespace} could not be written: {printable(exc)}",
            file=sys.stderr,
        )


class Unreadable(Exception):
    """The pause Lease's annotation cannot be read: nothing is written over it (the message says how to repair)."""


def change(store: Any, **kw: Any) -> tuple[bool, str]:
    """:func:`apply`, with an unreadable Lease as :class:`Unreadable` naming it and its repair; ``resume --all``
    replaces an unreadable record with no pause (the operator lifts every pause, whatever it held)."""
    from agent.recovery.holds import CorruptPauses, corrupt_message

    try:
        return apply(store, **kw)
    except CorruptPauses as exc:
        if kw["command"] != "resume" or not kw["every"].get("all"):
            raise Unreadable(corrupt_message(store.where, str(exc))) from None
    problem = store.reset()  # resume --all lifts every pause, also from a record no one can read
    if not problem:  # readable again meanwhile (another writer repaired it)
        return apply(store, **kw)
    return (
        True,
        f"recovery resumed by {kw['by']} ({store.where}): lifted every pause of an unreadable record ({problem})",
    )


def apply(
    store: Any, *, command: str, scope: Any, value: str, by: str, why: str, now: float, every: dict[str, Any]
) -> tuple[bool, str]:
    """Change the pause Lease; (whether it changed, a one-line account)."""
    from agent.recovery.holds import MAX_WHY, Pause, Pauses, describe, with_pause, without_pause

    if command == "pause":
        new = Pause(scope=scope, value=value, by=by[:253], why=why[:MAX_WHY], since=now)
        before, after = store.change(lambda p: with_pause(p, new))
        return before != after, f"recovery paused ({store.where}): {describe(new)}"
    key = Pause(scope=scope, value=value).key
    if every.get("all"):
        before, after = store.change(lambda p: Pauses(extra=p.extra))
    else:
        before, after = store.change(lambda p: without_pause(p, key))
    lifted = [p for p in before.pauses if p not in after.pauses]
    if not lifted:
        left = ", ".join(p.key for p in before.pauses) or "none"
        return False, f"nothing to resume: no pause {'at all' if every.get('all') else key} (in force: {left})"
    what = "; ".join(describe(p) for p in lifted)
    return True, f"recovery resumed by {by} ({store.where}): lifted {what}" + (f" ({why})" if why else "")


def record_event(client: Any, *, namespace: str, lease: str, command: str, message: str, now: float) -> None:
    """One Event about the pause Lease (``kubectl get events -n NS``)."""
    from agent.core.timefmt import iso

    stamp = iso(now)
    client.create_event(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{lease}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "name": lease,
                "namespace": namespace,
            },
            "reason": "RecoveryPaused" if command == "pause" else "RecoveryResumed",
            "message": message[:1024],
            "type": "Warning" if command == "pause" else "Normal",
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": "node-health-agent"},
            "reportingComponent": "node-health-agent",
            "reportingInstance": "cli",
        },
    )


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container with an arbitrary uid)
        return "unknown"
