"""The ``recovery`` loop (Kubernetes mode: acting with ``--enable-recovery``, else report-only) and its parts.

Each part exists only when the policy can use it: the ASG marker and the EC2 rebooter import AWS, the
drain and the diagnostics bundle only when acting. Which actions a policy can take is the ladder's answer
(:func:`agent.recovery.ladder.rung_actions`)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent.app.settings import Settings
from agent.app.wiring.aws import Aws
from agent.app.wiring.kube import KubeSetup
from agent.app.wiring.state import current_boot_id
from agent.core.bus import Inbox, SnapshotFeed
from agent.core.ring import LineRing
from agent.core.types import ConditionSpec

if TYPE_CHECKING:
    from agent.recovery.bundle import DiagnosticsBundle
    from agent.recovery.holds import HoldGate
    from agent.recovery.loop import RecoveryLoop
    from agent.recovery.model import Action, RecoveryPolicy

log = logging.getLogger(__name__)


def recovery_policy(settings: Settings, policy: RecoveryPolicy | None) -> RecoveryPolicy:
    """``policy`` (None: the built-in one) with ``--recovery-startup-delay`` applied."""
    from agent.recovery.policyfile import DEFAULT_POLICY

    policy = policy or DEFAULT_POLICY
    if settings.recovery_startup_delay is not None:
        policy = dataclasses.replace(policy, startup_delay=settings.recovery_startup_delay)
    return policy


def policy_actions(policy: RecoveryPolicy) -> set[Action]:
    """Every action the policy can take: its rules' own and those of each rung of their ladders."""
    actions = {a for rule in policy.rules for a in rule.actions}
    if not any(rule.ladder for rule in policy.rules):
        return actions  # the ladder module is not loaded for a policy without one (memory)
    from agent.recovery.ladder import rung_actions

    return actions | {a for rule in policy.rules for remedy in rule.ladder for a in rung_actions(rule, remedy)}


def kernel_log_ring(settings: Settings, *, kube: KubeSetup | None) -> LineRing | None:
    """The kernel log as read this boot, for the diagnostics bundle taken before a remedy (acting recovery only)."""
    bundles = settings.diagnostics_keep or settings.diagnostics_s3
    return LineRing() if kube is not None and settings.enable_recovery and bundles else None


def recovery_loop(
    settings: Settings,
    *,
    kube: KubeSetup | None,
    feed: SnapshotFeed,
    inbox: Inbox,
    policy: RecoveryPolicy | None,  # None: neither recovery nor CloudWatch is on
    aws: Aws,
    clock: Callable[[], float],
    conditions: Sequence[ConditionSpec],
    health: Callable[[], dict[str, bool]],  # every component's health now (recovery's gate)
    stale: Callable[[], dict[str, str]] | None,  # condition type -> its check, stale (recovery's gate)
    kernel_log: LineRing | None,
    check_stats: Callable[[], Mapping[str, Any]] | None,
) -> RecoveryLoop | None:
    """Component ``recovery`` in Kubernetes mode, else None."""
    if kube is None or policy is None:
        return None
    from agent.recovery.loop import RecoveryLoop

    acting = _acting_parts(
        settings, kube=kube, feed=feed, policy=policy, aws=aws, clock=clock, conditions=conditions,
        kernel_log=kernel_log, check_stats=check_stats,
    )  # fmt: skip
    made: list[RecoveryLoop] = []  # the loop's stop event ends a holder Event waiting for room in the inbox
    devices = device_parts(
        settings, kube=kube, policy=policy, inbox=inbox, clock=clock,
        stopping=lambda: made[0].stopping if made else threading.Event(),
    )  # fmt: skip
    loop = RecoveryLoop(
        feed=feed,
        inbox=inbox,
        client=kube.client,
        node_name=kube.node_name,
        policy=policy,
        enabled=settings.enable_recovery,
        clock=clock,
        holds=hold_gate(settings=settings, kube=kube, health=health, stale=stale, policy=policy),
        **acting,
        **devices,
    )
    made.append(loop)
    return loop


def device_parts(
    settings: Settings,
    *,
    kube: KubeSetup,
    policy: RecoveryPolicy,
    inbox: Inbox,
    clock: Callable[[], float],
    stopping: Callable[[], threading.Event],
) -> dict[str, Any]:
    """The device scope's parts (agent.recovery.deviceactions): the DRA fence, who holds a device, telling
    them (with ``--device-holders``), and a drain of only their pods. None each unless acting with a
    ``scope: device`` rule."""
    from agent.recovery.model import Scope

    parts: dict[str, Any] = dict.fromkeys(("fencer", "holders", "holder_teller", "device_drainer"))
    if not settings.enable_recovery or not any(rule.scope is Scope.DEVICE for rule in policy.rules):
        return parts
    parts["device_drainer"] = device_drain_runner(kube=kube, policy=policy, clock=clock)
    from agent.app.wiring.devices import holder_parts
    from agent.core.bus import Notice
    from agent.recovery.fence import DeviceFencer

    fencer = DeviceFencer(client=kube.client, node_name=kube.node_name)
    parts["fencer"] = fencer

    def dra(device: Any) -> frozenset[tuple[str, str, str]]:
        """The DRA triple of ``device`` from this node's ResourceSlices (none on a device-plugin node)."""
        found = fencer.dra_device(device)
        return frozenset() if found is None else frozenset({(found.driver, found.pool, found.device)})

    def put(event: Any) -> None:
        inbox.put(Notice(events=[event]), stop=stopping())

    lookup, teller = holder_parts(settings, put, dra=dra, node_name=kube.node_name, clock=clock)
    parts["holders"], parts["holder_teller"] = lookup, teller
    return parts


def device_drain_runner(*, kube: KubeSetup, policy: Any, clock: Callable[[], float]) -> Callable[..., Any]:
    """``(stop, report, pod keys) -> DrainResult``: a drain of only those pods; the node is not cordoned."""
    from agent.recovery.drain import Drainer

    def run(stop: threading.Event, report: Callable[[str, str], None], only: frozenset[str]) -> Any:
        return Drainer(
            client=kube.client, node_name=kube.node_name, settings=policy.drain, clock=clock, report=report, only=only
        ).run(stop)

    return run


def _acting_parts(
    settings: Settings,
    *,
    kube: KubeSetup,
    feed: SnapshotFeed,
    policy: RecoveryPolicy,
    aws: Aws,
    clock: Callable[[], float],
    conditions: Sequence[ConditionSpec],
    kernel_log: LineRing | None,
    check_stats: Callable[[], Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """The loop's budget, marker, drainer, bundle and ladder: None each unless acting and the policy uses it."""
    from agent.recovery.model import Action

    parts: dict[str, Any] = dict.fromkeys(("budget", "mark_unhealthy", "drainer", "bundle", "ladder"))
    actions = policy_actions(policy)
    rebooter = None
    if settings.enable_recovery:
        from agent.recovery.budget import ClusterBudget, budget_lease_name

        parts["budget"] = ClusterBudget(
            client=kube.client,
            namespace=settings.pod_namespace,
            lease_name=budget_lease_name(settings.cluster_name),
            node_name=kube.node_name,
            settings=policy.budget,
            clock=clock,
            problem_types=[spec.type for spec in conditions],  # a zone or pool failing together holds
        )
        if Action.MARK_UNHEALTHY in actions:
            from agent.adapters.aws import AutoScaling
            from agent.recovery.asg import AsgMarker

            parts["mark_unhealthy"] = AsgMarker(
                autoscaling=AutoScaling(clients=aws.clients),
                imds=aws.imds,
                respect_grace_period=policy.respect_grace_period,
            )
        if Action.DRAIN in actions:
            parts["drainer"] = drain_runner(kube=kube, policy=policy, clock=clock)
        if settings.diagnostics_keep or settings.diagnostics_s3:
            bundle = diagnostics_bundle(
                settings=settings, node_name=kube.node_name, feed=feed, policy=policy, kernel_log=kernel_log,
                check_stats=check_stats, aws=aws, clock=clock,
            )  # fmt: skip
            parts["bundle"] = bundle.before_remedy
        if Action.REBOOT in actions:
            from agent.adapters.aws import Ec2Reboot  # its EC2 client is built by the first reboot only
            from agent.recovery.ec2 import Ec2Rebooter

            rebooter = Ec2Rebooter(ec2=Ec2Reboot(clients=aws.clients), imds=aws.imds)
    if any(rule.ladder for rule in policy.rules):
        from agent.recovery.ladder import Ladder

        boot_file = settings.boot_id_file
        parts["ladder"] = Ladder(
            client=kube.client,
            node_name=kube.node_name,
            boot_id=lambda: current_boot_id(boot_file),
            reboot=rebooter,
        )
    return parts


def recovery_collectors(
    loop: RecoveryLoop | None, *, policy: RecoveryPolicy | None, clock: Callable[[], float]
) -> list[Any]:
    """The recovery loop's metrics and its holds' (none without the loop)."""
    if loop is None or policy is None:
        return []
    from agent.recovery.holds import HoldCollector
    from agent.recovery.metrics import RecoveryCollector

    return [
        RecoveryCollector(stats=lambda: loop.stats, policy=policy),
        HoldCollector(stats=lambda: loop.holds.stats, clock=clock),
    ]


def hold_gate(
    *,
    settings: Settings,
    kube: KubeSetup,
    health: Callable[[], dict[str, bool]] | None,
    stale: Callable[[], dict[str, str]] | None = None,
    policy: RecoveryPolicy,  # its budget groups name the pool labels `pause --pool` matches
) -> HoldGate:
    """Pauses (the pause Lease, read every 5 s when recovery acts), vetoes and the agent's health."""
    from agent.recovery.holds import HoldGate, PauseLeases, pool_labels

    # The namespace's pause Lease (plain `pause`) and, with a cluster name, that cluster's own.
    store = (
        PauseLeases(client=kube.client, namespace=settings.pod_namespace, cluster_name=settings.cluster_name)
        if settings.enable_recovery
        else None
    )
    return HoldGate(
        store=store,
        client=kube.client,
        node_name=kube.node_name,
        health=health,
        stale=stale,
        pools=pool_labels(policy.budget),
        node=kube.node,
    )


def diagnostics_bundle(
    *,
    settings: Settings,
    node_name: str,
    feed: SnapshotFeed,
    policy: Any,
    kernel_log: LineRing | None,
    check_stats: Callable[[], Mapping[str, Any]] | None,
    aws: Aws,
    clock: Callable[[], float],
) -> DiagnosticsBundle:
    """The evidence taken before a reboot or replace: state directory, and S3 with ``--diagnostics-s3``."""
    from agent.recovery.bundle import DiagnosticsBundle, parse_s3_url

    put = None
    if settings.diagnostics_s3:
        from agent.adapters.aws import S3Uploader

        put = S3Uploader(clients=aws.clients, bucket=parse_s3_url(settings.diagnostics_s3)[0]).put
    return DiagnosticsBundle(
        state_dir=settings.state_dir,
        node_name=node_name,
        kernel_log=kernel_log.lines if kernel_log is not None else list,
        checks=lambda: _checks_shown(check_stats() if check_stats is not None else {}),
        snapshot=lambda: feed.latest().snapshot,
        configuration=lambda: _configuration_shown(settings, policy),
        s3_url=settings.diagnostics_s3,
        s3_put=put,
        keep=settings.diagnostics_keep,
        clock=clock,
    )


def _checks_shown(stats: Mapping[str, Any]) -> dict[str, Any]:
    return {
        name: {
            "status": s.last_status.value if s.last_status else None,
            "message": s.last_message,
            "seconds": s.last_duration,
            "lastSuccess": s.last_success,
            "values": [{"name": v.name, "value": v.value, "labels": dict(v.labels)} for v in s.values][:256],
            "cannotRun": s.cannot_run,
            "kind": s.kind,
            "origin": s.origin,
        }
        for name, s in stats.items()
    }


def _configuration_shown(settings: Settings, policy: Any) -> dict[str, Any]:
    from agent.recovery.policyfile import policy_summary

    shown = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    return {
        **{k: v if isinstance(v, bool | int | float) or v is None else str(v) for k, v in shown.items()},
        "recoveryPolicy": policy_summary(policy),
    }


def drain_runner(*, kube: KubeSetup, policy: Any, clock: Callable[[], float]) -> Callable[..., Any]:
    """``(stop, report) -> DrainResult``: a drain of this node (the recovery loop turns reports into Events)."""
    from agent.recovery.drain import Drainer

    def run(stop: threading.Event, report: Callable[[str, str], None]) -> Any:
        return Drainer(
            client=kube.client, node_name=kube.node_name, settings=policy.drain, clock=clock, report=report
        ).run(stop)

    return run
