"""One node's recovery loop driven step by step, for the tests of agent.recovery (tests/recovery).

The real :class:`~agent.adapters.kube.KubeClient` against tests/kubeapi, a real
:class:`~agent.recovery.budget.ClusterBudget` in the agent's namespace, an injected clock, a recording
``mark_unhealthy`` (our own seam), and what the loop touched read back from the test API server: the Node,
its incident, the budget's holders, the Events it told. A test module adds its own seams (a drain, a
ladder, a hold gate) through :class:`LoopHarness`'s arguments.

Fixture: ``kube`` (a factory of fresh clients of the module's ``api`` fixture, whose Nodes :func:`prepare`
puts): import ``kube_fixture`` into the test module (and name it in its ``__all__``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.adapters.kube import KubeClient
from agent.core.bus import Inbox, Notice, SnapshotFeed
from agent.core.types import Condition, Event, Provenance, Snapshot, Status
from agent.core.validation import ValidationRecord, ValidationRequest
from agent.recovery.asg import MarkResult
from agent.recovery.budget import BUDGET_ANNOTATION, ClusterBudget, decode_state
from agent.recovery.drain import DrainResult
from agent.recovery.holds import HoldGate
from agent.recovery.ladder import Ladder
from agent.recovery.loop import INTERVAL, RecoveryLoop
from agent.recovery.model import BUILTIN_CONDITIONS, DEFAULT_LEASE, INCIDENT_ANNOTATION, NodeView, RecoveryPolicy

from helpers import kube_clients
from kubeapi.server import KubeApiServer

NS = "node-health-agent"
NODE = "ip-10-0-0-1.us-west-2.compute.internal"
OTHERS = ("ip-10-0-0-2", "ip-10-0-0-3", "ip-10-0-0-4")
T0 = 1_767_225_600.0
INSTANCE = "i-0123456789abcdef0"
NODE_PATH = rf"/nodes/{NODE}$"
DMA = ("NeuronHealth", "NeuronHasError_DMA_ERROR")


class Clock:
    """An injected clock: ``now`` is moved by the test."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Marker:
    """A recording ``mark_unhealthy``: raises the queued errors first, then marks. ``calls`` has every
    call (node name, call number); ``marked`` the successful ones."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[tuple[str, int]] = []
        self.marked: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, node: NodeView) -> MarkResult:
        with self._lock:
            self.calls.append((node.name, len(self.calls) + 1))
            if self.errors:
                raise self.errors.pop(0)
            self.marked.append(node.name)
        return MarkResult(
            outcome="marked",
            instance_id=INSTANCE,
            group="eks-neuron-ng",
            message=f"instance {INSTANCE} marked Unhealthy in Auto Scaling group eks-neuron-ng",
        )


def node_object(
    name: str = NODE, labels: Mapping[str, str] | None = None, *, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A Node of an EC2 instance (its providerID names one), with ``labels`` besides the OS label."""
    metadata: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/os": "linux", **(labels or {})}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {"providerID": f"aws:///us-west-2a/{INSTANCE}"},
    }


def problem(condition: str = DMA[0], reason: str = DMA[1], *, since: float = T0 - 10) -> Condition:
    """``condition`` True for ``reason`` since ``since``."""
    return Condition(
        type=condition, status=Status.TRUE, reason=reason, message="test", last_transition=since, last_update=since
    )


def healthy(condition: str = DMA[0], *, since: float, reason: str = "Healthy") -> Condition:
    """``condition`` False (healthy) since ``since``."""
    return Condition(
        type=condition, status=Status.FALSE, reason=reason, message="ok", last_transition=since, last_update=since
    )


def agent_pod(
    node: str = NODE,
    *,
    cluster_name: str | None = None,
    env: Mapping[str, str] | None = None,
    namespace: str = NS,
    name: str | None = None,
) -> dict[str, Any]:
    """The agent's pod on ``node`` as the DaemonSet makes it (its labels, the agent container running ``run``
    with ENABLE_RECOVERY and, when given, CLUSTER_NAME): what ``pause`` and ``status`` look for."""
    variables = {"ENABLE_RECOVERY": "true", **({"CLUSTER_NAME": cluster_name} if cluster_name is not None else {})}
    variables.update(env or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"node-health-agent-{node}",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "node-health-agent", "app.kubernetes.io/component": "agent"},
            "ownerReferences": [  # a drain leaves it in place, as it does a real agent's pod
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": "node-health-agent",
                    "uid": "00000000-0000-0000-0000-00000000da75",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "kmsg-relay", "image": "node-health-agent", "args": ["kmsg-relay", "--socket", "/run/k.sock"]},
                {
                    "name": "agent",
                    "image": "node-health-agent",
                    "args": ["run", "--kmsg-relay", "/run/k.sock"],
                    "env": [{"name": k, "value": v} for k, v in variables.items()],
                },
            ],
        },
        "status": {"phase": "Running"},
    }


def prepare(api: KubeApiServer, *nodes: Mapping[str, Any]) -> KubeApiServer:
    """The agent's namespace and ``nodes`` on the test API server."""
    api.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for node in nodes:
        api.put_object(dict(node))
    return api


@pytest.fixture(name="kube")
def kube_fixture(api: KubeApiServer, tmp_path: Path) -> Iterator[Callable[[], KubeClient]]:
    """Fresh real clients of the module's ``api`` (each its own connection pool)."""
    with kube_clients(api, tmp_path, timeout=5.0) as make:
        yield make


class LoopHarness:
    """One node's recovery loop on ``NODE`` and what it touches. ``put_node``: put a fresh Node first
    (``node``, default :func:`node_object` with ``labels``); False for an agent restarted on a Node that
    keeps what the last one wrote (or see :meth:`restart`)."""

    def __init__(
        self,
        api: KubeApiServer,
        client: KubeClient,
        *,
        policy: RecoveryPolicy,
        enabled: bool = True,
        labels: dict[str, str] | None = None,
        node: Mapping[str, Any] | None = None,
        put_node: bool = True,
        marker: Callable[[NodeView], MarkResult] | None = None,
        clock: Clock | None = None,
        interval: float = INTERVAL,
        drainer: Callable[[threading.Event, Callable[[str, str], None]], DrainResult] | None = None,
        ladder: Ladder | None = None,
        holds: HoldGate | None = None,
        devices: Mapping[str, Any] | None = None,  # the device scope's seams: fencer, holders, holder_teller, ...
    ) -> None:
        self.api, self.client = api, client
        self.clock = clock or Clock()
        self.marker = marker if marker is not None else Marker()
        if put_node:
            api.put_object(dict(node) if node is not None else node_object(NODE, labels))
        self.feed = SnapshotFeed(initial=Snapshot(conditions=(), generated_at=self.clock(), seeded=False))
        self.inbox = Inbox()
        self.told: list[Event] = []
        self.requests: list[ValidationRequest] = []  # what the validation gate put into the inbox
        self.budget = (
            ClusterBudget(
                client=client,
                namespace=NS,
                lease_name=DEFAULT_LEASE,
                node_name=NODE,
                settings=policy.budget,
                clock=self.clock,
                sleep=lambda s: None,
                problem_types=BUILTIN_CONDITIONS,
            )
            if enabled
            else None
        )
        self._loop_args: dict[str, Any] = dict(
            feed=self.feed,
            inbox=self.inbox,
            client=client,
            node_name=NODE,
            policy=policy,
            enabled=enabled,
            budget=self.budget,
            mark_unhealthy=self.marker,
            drainer=drainer,
            ladder=ladder,
            clock=self.clock,
            interval=interval,
            holds=holds,
            **(devices or {}),
        )
        self.loop = RecoveryLoop(**self._loop_args)

    def restart(self) -> None:
        """A new agent process: a fresh loop; the Node keeps what the last one wrote."""
        self.loop = RecoveryLoop(**self._loop_args)

    def publish(
        self,
        *conditions: Condition,
        provenance: Mapping[str, Provenance] = BUILTIN_CONDITIONS,
        health: Mapping[str, bool] | None = None,
        validations: tuple[ValidationRecord, ...] = (),
        validation_requests: tuple[ValidationRequest, ...] = (),
    ) -> None:
        """Publish ``conditions``, owned as in the built-in configuration unless ``provenance`` says (and the
        validation records and open requests the main loop would keep)."""
        snapshot = Snapshot(
            conditions=tuple(conditions),
            generated_at=self.clock(),
            seeded=True,
            provenance=provenance,
            validations=validations,
            validation_requests=validation_requests,
        )
        self.feed.publish(snapshot=snapshot, events=[], health=dict(health or {}))

    def step(self) -> Any:
        try:
            return self.loop.step()
        finally:
            self.drain()

    def drain(self) -> list[Event]:
        """The Events told so far (taken from the inbox; validation requests go to :attr:`requests`)."""
        while (item := self.inbox.get_nowait()) is not None:
            if isinstance(item, ValidationRequest):
                self.requests.append(item)
                continue
            assert isinstance(item, Notice)
            self.told.extend(item.events)
        return self.told

    def events(self, reason: str | None = None) -> list[Event]:
        self.drain()
        return [e for e in self.told if reason is None or e.reason == reason]

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events()]

    def node(self) -> dict[str, Any]:
        found = self.api.get_object("nodes", NODE)
        assert found is not None
        return found

    def incident(self) -> dict[str, Any] | None:
        text = (self.node()["metadata"].get("annotations") or {}).get(INCIDENT_ANNOTATION)
        return None if text is None else json.loads(text)

    def cordoned(self) -> bool:
        return bool(self.node()["spec"].get("unschedulable"))

    def patches(self) -> int:
        return self.api.requests.count(method="PATCH", path_regex=NODE_PATH)

    def cordon_patches(self) -> int:
        """PATCHes that made the Node unschedulable."""
        return sum(
            1
            for r in self.api.requests.filter(method="PATCH", path_regex=NODE_PATH)
            if isinstance(r.body, dict) and (r.body.get("spec") or {}).get("unschedulable") is True
        )

    def holders(self) -> list[str]:
        lease = self.api.get_object("leases", DEFAULT_LEASE, NS)
        if lease is None:
            return []
        return sorted(decode_state(lease["metadata"]["annotations"][BUDGET_ANNOTATION]).holders)

    def budget_written(self) -> bool:
        return self.api.get_object("leases", DEFAULT_LEASE, NS) is not None
