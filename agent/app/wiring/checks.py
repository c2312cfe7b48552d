"""The checks: their context, the agent's own checks, the ``check_scheduler`` and its metrics."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent.app.settings import Settings
from agent.checks.model import CheckContext, ScheduledCheck
from agent.core.bus import Inbox, SnapshotFeed

if TYPE_CHECKING:
    from agent.checks.scheduler import CheckScheduler

INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


class NodeLabels:
    """The Node's labels once read (Kubernetes mode), for checks that compare them with the hardware."""

    def __init__(self) -> None:
        self.labels: dict[str, str] | None = None

    def get(self) -> dict[str, str] | None:
        return self.labels

    def set_from(self, node: dict | None) -> None:
        if node is not None:
            self.labels = dict((node.get("metadata") or {}).get("labels") or {})


def agent_checks(settings: Settings) -> tuple[ScheduledCheck, ...]:
    """The checks the agent runs of its own accord (flags, not configuration files): EC2 scheduled events
    with ``--scheduled-maintenance`` (IMDSv2, the same client as the instance id; no AWS API, no IAM)."""
    if not settings.scheduled_maintenance:
        return ()
    from agent.adapters.aws import InstanceMetadata
    from agent.checks.maintenance import ScheduledMaintenanceCheck

    check = ScheduledMaintenanceCheck(fetch=InstanceMetadata().get)
    return (
        ScheduledCheck(
            check=check,
            interval=check.interval,
            timeout=check.timeout,
            kind="python",
            origin="the agent (--scheduled-maintenance)",
            failure_threshold=1,
            success_threshold=1,
        ),
    )


def check_context(
    settings: Settings, *, labels: NodeLabels, run_process: Callable[..., Any] | None = None
) -> CheckContext:
    """What checks may use: the host roots, the state directory, the Node's labels and instance type."""

    def instance_type() -> str | None:
        if settings.instance_type:
            return settings.instance_type
        known = labels.get() or {}
        return next((known[k] for k in INSTANCE_TYPE_LABELS if known.get(k)), None)

    return CheckContext(
        sys_root=settings.sys_root,
        dev_root=settings.dev_root,
        state_dir=settings.state_dir,
        node_labels=labels.get,
        instance_type=instance_type,
        run_process=run_process,
    )


def check_scheduler(
    settings: Settings,
    checks: Sequence[ScheduledCheck],
    *,
    inbox: Inbox,
    clock: Callable[[], float],
    cancel: threading.Event | None,
    feed: SnapshotFeed | None = None,
    kube: Any | None = None,
) -> CheckScheduler | None:
    """Producer ``check_scheduler`` when checks are configured, else None. With ``feed`` it reads the open
    validation requests; active checks get their gates (:mod:`agent.app.wiring.active`)."""
    if not checks:
        return None
    from agent.app.wiring.active import active_gates, open_requests
    from agent.checks.scheduler import CheckScheduler

    # built whether or not an active check is configured now: a reload may add one (nothing is read until then)
    gates = active_gates(settings, kube=kube)
    requests = open_requests(feed) if feed is not None else None
    return CheckScheduler(
        checks=checks,
        inbox=inbox,
        concurrency=settings.check_concurrency,
        stall_timeout=settings.stall_timeout,
        clock=clock,
        cancel=cancel,
        gates=gates,
        requests=requests,
    )


def check_collector(scheduler: CheckScheduler | None) -> Any:
    """The checks' Prometheus metrics (None without checks)."""
    if scheduler is None:
        return None
    from agent.checks.metrics import CheckCollector

    return CheckCollector(stats=lambda: scheduler.stats)


def check_stats(scheduler: CheckScheduler | None) -> Callable[[], Mapping[str, Any]] | None:
    """The checks' latest runs by name (the diagnostics bundle's copy), None without checks."""
    return (lambda: scheduler.stats) if scheduler is not None else None


def stale_checks(scheduler: Any, *, clock: Callable[[], float]) -> Callable[[], dict[str, str]]:
    """``() -> {condition type: check name}`` for the checks that have not completed a run (OK or
    PROBLEM) within three intervals (with jitter) plus their timeout: what they said may be stale. Active
    checks are left out: they run on request, or are skipped for hours while jobs hold the devices."""
    from agent.checks.scheduler import declared_conditions

    started = clock()

    def stale() -> dict[str, str]:
        now = clock()
        out: dict[str, str] = {}
        for spec in scheduler.checks:
            if spec.active is not None:
                continue
            stats = scheduler.stats.get(spec.name)
            last = stats.last_success if stats is not None and stats.last_success is not None else started
            if now - last > 3 * spec.interval * (1 + spec.jitter) + spec.timeout:
                out.update(dict.fromkeys(declared_conditions(spec.check), spec.name))
        return out

    return stale
