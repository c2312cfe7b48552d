"""``node-health-agent pause`` and ``resume`` (also ``kubectl node-health pause|resume``): the off switch.

A pause is written to the pause Lease (:mod:`agent.recovery.holds`) with who, why and when; every
agent reads it before it acts and while it drains, so it takes effect at their next step (seconds),
without a rollout. One Event in the agent's namespace (about the Lease) records each change.

``pause`` with no selector pauses the whole cluster; ``--pool``, ``--node`` or ``--condition-reason``
narrow it. ``resume`` with the same selector lifts that pause (``resume --all`` lifts every one).
Exit 0 on success (also when there was nothing to change), 2 on a bad argument or no credentials,
1 when the API server refuses or the pause Lease is unreadable (it then says how to repair it).

RBAC for the operator: leases get/create/update and events create in the agent's namespace (the
Role ``node-health-agent-recovery-pause`` in the manifests, to bind to the people who may pause).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any, TextIO

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
            default=os.environ.get("CLUSTER_NAME", ""),
            help="the agents' --cluster-name (names the pause Lease)",
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
    from agent.recovery.holds import CorruptPauses, PauseStore, pause_lease_name

    out = out or sys.stdout
    command = args.command
    scope, value = selected(args)
    if scope.value != "cluster" and not value.strip():
        print(f"{command}: --{scope.value} needs a non-empty value", file=sys.stderr)
        return EXIT_CONFIG
    try:
        client = KubeClient.load(kubeconfig=args.kubeconfig)
    except KubeConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    lease = pause_lease_name(args.cluster_name)
    store = PauseStore(client=client, namespace=args.namespace, lease_name=lease)
    by = args.by or _user()
    at = time.time() if now is None else now
    try:
        changed, message = apply(
            store, command=command, scope=scope, value=value, by=by, why=args.reason, now=at, every=args.__dict__
        )
        if changed:
            record_event(client, namespace=args.namespace, lease=lease, command=command, message=message, now=at)
    except CorruptPauses as exc:
        from agent.recovery.holds import corrupt_message

        print(f"{command}: {corrupt_message(store.where, str(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except KubeError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        client.close()
    print(message, file=out)
    return EXIT_OK


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
