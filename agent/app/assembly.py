"""Builds the runtime from settings, in one place: a list of parts, each wired by its feature's module
under :mod:`agent.app.wiring` and present only when configured.

- Both modes: the kernel log producer (``kmsg_reader``: the kmsg device or a relay socket), the
  ``main_loop`` (the one writer), the HTTP server (``http``), the state directory (cursor,
  conditions, Event outbox).
- Standalone: events go to stdout as JSON lines (``stdout``).
- Kubernetes: ``condition_sink`` and ``event_sink`` write to the API server, ``node_seeder``
  reads the Node's conditions first when it was not read at start, ``recovery`` acts or reports.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from agent.app.config import Loaded, LogMonitor
from agent.app.exitcodes import EXIT_CONFIG, EXIT_OK
from agent.app.settings import Settings
from agent.app.wiring.aws import Aws
from agent.app.wiring.checks import (
    NodeLabels,
    agent_checks,
    check_collector,
    check_context,
    check_scheduler,
    check_stats,
    stale_checks,
)
from agent.app.wiring.config import Watch, config_watcher, watcher_figures
from agent.app.wiring.engine import engine_figures, main_loop
from agent.app.wiring.http import http_server
from agent.app.wiring.kube import KubeSetup, connect_kubernetes
from agent.app.wiring.recovery import kernel_log_ring, recovery_collectors, recovery_loop, recovery_policy
from agent.app.wiring.runtime import Runtime, agent_stats
from agent.app.wiring.sinks import cloudwatch_collector, cloudwatch_sink, kube_sinks, stdout_sinks
from agent.app.wiring.sources import (
    clear_watcher,
    kernel_figures,
    kernel_producer,
    monitor_figures,
    monitor_producers,
    node_seeder,
)
from agent.app.wiring.state import owned_conditions, severity_lookup, start_state
from agent.checks.model import CheckContext, ScheduledCheck
from agent.core.bus import CaughtUp, Inbox, SnapshotFeed
from agent.core.supervisor import Component, Supervisor
from agent.core.types import ConditionSpec
from agent.detectors.rulepack import RuleSet
from agent.sinks.metrics import AgentCollector, build_registry
from agent.sources.producer import Source

if TYPE_CHECKING:
    from agent.app.reload import Fingerprint
    from agent.recovery.model import RecoveryPolicy

log = logging.getLogger(__name__)

# cli.py's names (NodeLabels, agent_checks, check_context, run) and build_runtime's KubeSetup, from here as before
__all__ = [
    "KubeSetup",
    "NodeLabels",
    "Runtime",
    "Watch",
    "agent_checks",
    "build_runtime",
    "check_context",
    "run",
    "serve",
]


def build_runtime(
    *,
    settings: Settings,
    rule_set: RuleSet,
    source: Source | None = None,
    kube: KubeSetup | None = None,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.time,
    checks: Sequence[ScheduledCheck] = (),
    extra_conditions: Sequence[ConditionSpec] = (),
    log_monitors: Sequence[LogMonitor] = (),
    labels: NodeLabels | None = None,
    cancel: threading.Event | None = None,
    policy: RecoveryPolicy | None = None,  # None = the built-in default
    watch: Watch | None = None,  # the configuration to reload from (with --watch-config)
) -> Runtime:
    """Everything but the HTTP server (see :func:`serve`), wired and ready for ``Runtime.run``.

    ``checks`` run under the ``check_scheduler``; ``extra_conditions`` are the conditions the agent owns
    (:func:`agent.app.config.owned_conditions`: every source's, with its provenance); the rule set's
    and the checks' own are added for the types it does not list."""
    conditions = owned_conditions(rule_set, checks, extra_conditions)
    node = kube.node if kube is not None else None
    start = start_state(
        settings, rule_set=rule_set, conditions=conditions, node=node, standalone=kube is None, clock=clock
    )
    inbox, feed = Inbox(), SnapshotFeed(initial=start.state.snapshot())
    supervisor = Supervisor(components=[], on_stop=[feed.close])
    producer = kernel_producer(settings, source=source, inbox=inbox)
    monitors, monitor_pipelines = monitor_producers(settings, log_monitors, inbox=inbox)
    scheduler = check_scheduler(settings, checks, inbox=inbox, clock=clock, cancel=cancel, feed=feed, kube=kube)
    seeder = node_seeder(
        kube=kube, inbox=inbox, types=start.state.owned_types, severity=severity_lookup(rule_set), clock=clock,
        on_node=labels.set_from if labels is not None else None,
    )  # fmt: skip
    sinks = (
        stdout_sinks(feed=feed, stream=stream)
        if kube is None
        else kube_sinks(settings, kube=kube, feed=feed, owned=start.state.owned_types, state_dir=start.state_dir)
    )
    aws = Aws()
    effective = recovery_policy(settings, policy) if kube is not None or settings.cloudwatch else None
    cloudwatch = cloudwatch_sink(
        settings, kube=kube, feed=feed, conditions=start.declared, policy=effective, aws=aws, clock=clock
    )
    kernel_log = kernel_log_ring(settings, kube=kube)
    recovery = recovery_loop(
        settings, kube=kube, feed=feed, inbox=inbox, policy=effective, aws=aws, clock=clock,
        conditions=start.declared, health=supervisor.health, kernel_log=kernel_log, check_stats=check_stats(scheduler),
        stale=stale_checks(scheduler, clock=clock) if scheduler is not None else None,
    )  # fmt: skip
    engine = main_loop(
        settings, start=start, rule_set=rule_set, inbox=inbox, feed=feed, health=supervisor.health,
        acks=sinks.acks, monitors=monitor_pipelines, kernel_log=kernel_log, clock=clock,
    )  # fmt: skip
    watcher = config_watcher(settings, watch, scheduler=scheduler, inbox=inbox)
    clears = clear_watcher(kube=kube, inbox=inbox, interval=settings.clear_poll)
    parts = [producer, *monitors, scheduler, seeder, clears, engine, *sinks.components, cloudwatch, recovery, watcher]
    for component in parts:
        if component is not None:
            supervisor.add(component)
    figures = [
        kernel_figures(producer),
        engine_figures(main_loop=engine, supervisor=supervisor, state_dir=start.state_dir),
        monitor_figures(monitors),
        *sinks.figures,
        watcher_figures(watcher),
    ]
    current = CaughtUp(inbox=inbox, feed=feed, catch_up=producer.catch_up)
    collectors = [
        AgentCollector(snapshot=lambda: current().snapshot, stats=agent_stats(figures)),
        cloudwatch_collector(cloudwatch),
        *recovery_collectors(recovery, policy=effective, clock=clock),
        check_collector(scheduler),
    ]
    return Runtime(
        supervisor=supervisor, feed=feed, main_loop=engine, producer=producer, state_dir=start.state_dir,
        current=current, figures=figures, scheduler=scheduler, inbox=inbox,
        registry=build_registry(*(c for c in collectors if c is not None)),
    )  # fmt: skip


def serve(runtime: Runtime, settings: Settings) -> Component | None:
    """Start listening (errors raise OSError before anything else starts); the ``http`` component."""
    return http_server(
        settings, registry=runtime.registry, health=runtime.health_document, conditions=runtime.conditions_document
    )


def run(
    *,
    settings: Settings,
    loaded: Loaded,
    stop: threading.Event,
    labels: NodeLabels | None = None,
    context: CheckContext | None = None,
    files: Fingerprint | None = None,  # of the configuration files as loaded
    cancel: threading.Event | None = None,
    policy: RecoveryPolicy | None = None,  # loaded and checked before the cluster
) -> int:
    """The ``run`` command after configuration checks: wire, listen, run until ``stop``."""
    config, checks = loaded.config, loaded.checks
    rule_set = config.rule_set
    kube = None
    if not settings.standalone:
        connected = connect_kubernetes(settings, stop=stop)
        if isinstance(connected, int):
            return connected
        kube = connected
        if labels is not None:
            labels.set_from(kube.node)
        if stop.is_set():
            kube.client.close()
            return EXIT_OK
    try:
        runtime = build_runtime(
            settings=settings,
            rule_set=rule_set,
            kube=kube,
            checks=checks,
            extra_conditions=loaded.conditions,
            log_monitors=config.log_monitors,
            labels=labels,
            cancel=cancel,
            policy=policy,
            watch=Watch(loaded=loaded, context=context, files=files) if context is not None else None,
        )
        try:
            http = serve(runtime, settings)
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", settings.listen.host, settings.listen.port, exc)  # type: ignore[union-attr]
            return EXIT_CONFIG
        if http is not None:
            runtime.supervisor.add(http)
        mode = "standalone" if kube is None else f"node {kube.node_name}"
        log.info(
            "%s: %d rules from %d files, %d checks, reading %s",
            mode,
            len(rule_set.rules),
            len(rule_set.files),
            len(checks),
            settings.kmsg_relay or settings.kmsg_path,
        )
        return runtime.run(stop)
    finally:
        if kube is not None:
            kube.client.close()
