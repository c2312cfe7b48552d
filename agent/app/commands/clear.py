"""``node-health-agent clear`` (also ``kubectl node-health clear``): an operator's verified clear.

It writes a request (:mod:`agent.core.clears`) in the Node's annotation ``node-health-agent.io/clear-request``
and waits up to ``--wait`` for the agent on that node to acknowledge it in ``node-health-agent.io/clears``:
the condition (or one device's problems) goes back to healthy, and the kernel records up to that moment
(the boundary: boot id and sequence number) never raise it again, also after a restart.

Refused before anything is written (exit 2): a node that does not exist, a condition this agent does not
own on the Node (kubelet's, the aggregate, or one not there), a condition or a device not failing (unless
``--force``). Exit 1 when the agent refused it, or did not acknowledge it in time (no agent on the node, or a
stopped one): the request stays pending, the agent applies it when it reads the Node, and ``status`` shows it.

RBAC for the operator: nodes get and patch (a ClusterRole: Nodes are cluster-scoped; the manifests do not
ship one yet, see docs/conditions.md), pods list in the agent's namespace (to say whether an agent runs
on the node).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from agent.app.commands.terminal import printable
from agent.app.exitcodes import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK
from agent.core.clears import (
    APPLIED,
    CLEAR_REQUEST_ANNOTATION,
    CLEARS_ANNOTATION,
    BadClear,
    ClearRecord,
    ClearRequest,
    normalize_device,
    parse_records,
    request_from_json,
)
from agent.core.types import RESERVED_CONDITION_TYPES

AGGREGATE = "AcceleratedHardwareReady"  # derived from the others: clear those instead
_DEVICES = re.compile(r"\[devices: (.*)\]\s*$")


def add_parser(sub: Any, *, parents: Sequence[argparse.ArgumentParser]) -> None:
    text = "clear a condition (or one device's problems) on a node, so the kernel records before now never raise it"
    cmd = sub.add_parser("clear", parents=list(parents), help=text, description=text + ".")
    cmd.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
    cmd.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE") or "node-health-agent",
        help="the agent's namespace (to find the agent on the node; default node-health-agent)",
    )
    cmd.add_argument("--node", required=True, metavar="NAME", help="the node")
    cmd.add_argument("--condition", default=None, metavar="TYPE", help="the condition (default: the one True)")
    cmd.add_argument("--device", default=None, metavar="D", help="only this device's problems (neuron3, a PCI address)")
    cmd.add_argument("--reason", default="", help="why (kept with the clear; required)")
    cmd.add_argument("--by", default=None, help="who (default: the local user name)")
    cmd.add_argument("--force", action="store_true", help="clear though the agent does not see it failing")
    cmd.add_argument("--wait", type=float, default=150.0, metavar="SECONDS", help="wait this long for the agent")


def clear(
    args: argparse.Namespace,
    *,
    out: TextIO | None = None,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    from agent.adapters.kube import KubeClient, KubeConfigError, KubeError

    out = out or sys.stdout
    try:
        client = KubeClient.load(kubeconfig=args.kubeconfig)
    except KubeConfigError as exc:
        print(f"clear: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        node = client.get_node(args.node)
    except KubeError as exc:
        print(f"clear: node {printable(args.node)}: {printable(exc)}", file=sys.stderr)
        client.close()
        return EXIT_CONFIG if exc.status == 404 else EXIT_FAILURE
    try:
        request = _request(args, node, at=now())
        client.patch_node(args.node, {"metadata": {"annotations": {CLEAR_REQUEST_ANNOTATION: _text(request)}}})
        print(f"clear {request.id} requested on {args.node}: {printable(request.describe())}", file=out)
        return _await(client, args, request, out=out, now=now, sleep=sleep)
    except BadClear as exc:
        print(f"clear: {printable(exc)}", file=sys.stderr)
        return EXIT_CONFIG
    except KubeError as exc:
        print(f"clear: {printable(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        client.close()


def _text(request: ClearRequest) -> str:
    return json.dumps(request.to_json(), sort_keys=True, separators=(",", ":"))


def _request(args: argparse.Namespace, node: dict, *, at: float) -> ClearRequest:
    """The request, checked against what the Node says (raises BadClear naming what is wrong)."""
    conditions = {c.get("type"): c for c in (node.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}
    ours = {t: c for t, c in conditions.items() if isinstance(t, str) and t not in RESERVED_CONDITION_TYPES}
    ours.pop(AGGREGATE, None)
    condition = args.condition
    if condition is None:
        failing = sorted(t for t, c in ours.items() if c.get("status") == "True")
        if len(failing) != 1:
            raise BadClear(f"name the condition with --condition (True on the node: {', '.join(failing) or 'none'})")
        condition = failing[0]
    if condition not in ours:
        owned = ", ".join(sorted(ours))
        raise BadClear(f"condition {condition!r} is not one the agent owns on {args.node} (has: {owned})")
    if not args.reason.strip():
        raise BadClear("say why with --reason (it is kept with the clear)")
    found = ours[condition]
    device = normalize_device(args.device) if args.device is not None else None
    if not args.force and found.get("status") != "True":
        raise BadClear(f"{condition} is not failing on {args.node} (--force clears it anyway)")
    if not args.force and device is not None and not _names(str(found.get("message") or ""), device):
        raise BadClear(f"device {device} is not failing in {condition} on {args.node} (--force clears it anyway)")
    data = {
        "id": uuid.uuid4().hex[:16],
        "condition": condition,
        "device": device,
        "reason": args.reason.strip(),
        "by": args.by or _user(),
        "at": at,
        "force": bool(args.force),
    }
    return request_from_json(data)


def _names(message: str, device: str) -> bool:
    """Whether a condition's message (``... [devices: gpu 0000:3b:00.0 (index 0, GPU-...); neuron neuron3]``)
    names ``device``."""
    match = _DEVICES.search(message)
    if match is None:
        return False
    short = device.partition(":")[2] if device.split(":", 1)[0] in ("gpu", "neuron", "rdma") else device
    words = match.group(1).replace(",", " ").replace("(", " ").replace(")", " ").replace(";", " ").split()
    return short in words


def _await(
    client: Any,
    args: argparse.Namespace,
    request: ClearRequest,
    *,
    out: TextIO,
    now: Callable[[], float],
    sleep: Callable[[float], None],
) -> int:
    from agent.app.commands.reach import find_agents

    agents = find_agents(client, args.namespace)
    if not agents.problem and agents.on(args.node) is None:
        print(
            f"clear {request.id} is pending: no agent pod runs on {args.node} in {args.namespace}; it applies the "
            "clear when one starts (status shows it)",
            file=out,
        )
        return EXIT_FAILURE
    deadline = now() + args.wait
    while True:
        record = _acknowledged(client.get_node(args.node), request.id)
        if record is not None:
            return _report(record, out=out)
        if now() >= deadline:
            print(
                f"clear {request.id} is pending: the agent on {args.node} did not acknowledge it within "
                f"{args.wait:g}s; it applies it when it next reads the Node (status shows it)",
                file=out,
            )
            return EXIT_FAILURE
        sleep(min(2.0, max(0.1, deadline - now())))


def _acknowledged(node: dict, request_id: str) -> ClearRecord | None:
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(CLEARS_ANNOTATION)
    if raw is None:
        return None
    try:
        records = parse_records(raw)
    except BadClear:
        return None
    return next((r for r in records if r.request.id == request_id), None)


def _report(record: ClearRecord, *, out: TextIO) -> int:
    seq = "no record yet" if record.seq is None else f"seq {record.seq}"
    if record.outcome == APPLIED:
        print(f"applied: {printable(record.detail)} (boundary: boot {record.boot_id}, {seq})", file=out)
        return EXIT_OK
    print(f"refused by the agent: {printable(record.detail)}", file=out)
    return EXIT_FAILURE


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
