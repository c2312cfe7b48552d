"""Builds the runtime from settings, in one place. The mode only chooses which components exist.

- Both modes: the kernel log producer (``kmsg_reader``: the kmsg device or a relay socket), the
  ``main_loop`` (the one writer), the HTTP server (``http``), the state directory (cursor,
  conditions, Event outbox).
- Standalone: events go to stdout as JSON lines (``stdout``).
- Kubernetes: ``condition_sink`` and ``event_sink`` write to the API server, and ``node_seeder``
  reads the Node's conditions first when the state directory did not keep ours.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from agent.app.config import Loaded, LogMonitor, provenance_of
from agent.app.exitcodes import EXIT_CONFIG, EXIT_OK
from agent.app.settings import Settings
from agent.checks.model import CheckContext, ScheduledCheck
from agent.core.bus import CaughtUp, Inbox, Publication, SnapshotFeed
from agent.core.latency import Histogram
from agent.core.memory import release_free_memory
from agent.core.ring import LineRing
from agent.core.state import NodeState
from agent.core.statedir import ConditionStore, StateDirHealth
from agent.core.supervisor import Component, Supervisor
from agent.core.types import Condition, ConditionSpec, Provenance, Severity, Status
from agent.detectors.pipeline import DetectionPipeline
from agent.detectors.rulepack import RuleSet
from agent.engine.mainloop import MainLoop
from agent.sinks.metrics import AgentCollector, AgentStats, build_registry
from agent.sinks.stdout import snapshot_json
from agent.sinks.worker import RESYNC
from agent.sources.kmsg.boot import read_boot_id
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.producer import Source, SourceProducer
from agent.sources.replay import Cursor, CursorStore, ReplayPolicy

if TYPE_CHECKING:  # loaded lazily at run time (memory): the Kubernetes client only in Kubernetes mode
    from agent.adapters.aws import AwsClients, InstanceMetadata
    from agent.adapters.kube import KubeClient
    from agent.app.http import AgentHTTPServer
    from agent.app.reload import ConfigWatcher, Fingerprint
    from agent.checks.scheduler import CheckScheduler
    from agent.recovery.bundle import DiagnosticsBundle
    from agent.recovery.model import RecoveryPolicy
    from agent.sinks.events import EventSink

log = logging.getLogger(__name__)

API_WAIT_INTERVAL = 5.0


def build_source(settings: Settings) -> Source:
    """The kernel log source: a kmsg-relay socket when configured, else the kmsg device (or file)."""
    stats = KmsgStats()
    if settings.kmsg_relay is not None:
        from agent.sources.relay_client import RelayClient

        return RelayClient(path=settings.kmsg_relay, stats=stats)
    from agent.sources.kmsg.reader import KmsgReader

    # Idle, it sleeps on the device until a record or stop comes, waking only to stay within stall_timeout.
    return KmsgReader(path=settings.kmsg_path, stats=stats, idle_wait=settings.stall_timeout / 2)


def current_boot_id(path: Path | None = None) -> str:
    """This boot's id: ``path`` (--boot-id-file) when given, else /proc's."""
    try:
        if path is None:
            return read_boot_id()
        text = path.read_text(encoding="ascii", errors="replace").strip()
        if not text:
            raise ValueError(f"the boot id file {path} is empty")
        return text
    except (OSError, ValueError) as exc:
        log.warning("cannot read the boot id (%s); restart replay falls back to lookback", exc)
        return "unknown"


def severity_lookup(rule_set: RuleSet) -> Callable[[str, str], Severity | None]:
    """Severity of a (condition, reason) read back from a Node: that of the rule producing it, else None.

    A templated reason (``NeuronHasError_{type}``) produces every reason of its shape.
    """
    exact: dict[tuple[str, str], Severity] = {}
    shapes: list[tuple[str, re.Pattern[str], Severity]] = []
    for rule in rule_set.rules:
        if not rule.condition:
            continue
        if "{" in rule.reason:
            parts = re.split(r"\{[^}]*\}", rule.reason)
            shapes.append((rule.condition, re.compile(".+".join(map(re.escape, parts))), rule.severity))
        else:
            key = (rule.condition, rule.reason)
            if key not in exact or rule.severity.rank > exact[key].rank:
                exact[key] = rule.severity

    def lookup(type_: str, reason: str) -> Severity | None:
        if (type_, reason) in exact:
            return exact[(type_, reason)]
        found = [sev for cond, shape, sev in shapes if cond == type_ and shape.fullmatch(reason)]
        return max(found, key=lambda s: s.rank) if found else None

    return lookup


class HttpComponent:
    """Component ``http``: the already listening server, stopped at shutdown."""

    name = "http"

    def __init__(self, server: AgentHTTPServer) -> None:
        self.server = server

    def healthy(self, now: float) -> bool:
        return self.server.healthy(now)

    def run(self, stop: threading.Event) -> None:
        stop.wait()
        self.server.stop()


@dataclass(kw_only=True)
class Runtime:
    """The assembled agent: run it with :meth:`run`; the documents back the HTTP endpoints."""

    supervisor: Supervisor
    feed: SnapshotFeed
    main_loop: MainLoop
    producer: SourceProducer
    state_dir: StateDirHealth
    details: dict[str, Callable[[], str | None]]
    # What /metrics and /conditions show: the latest publication, once it holds what had come in (CaughtUp)
    current: Callable[[], Publication]
    registry: Any = None
    config_generation: int = 1
    scheduler: CheckScheduler | None = None  # when checks are configured
    inbox: Inbox | None = None
    watcher: ConfigWatcher | None = None  # when the configuration is watched
    monitors: Sequence[SourceProducer] = ()  # the filelog/journald monitors' producers
    events_dropped: Callable[[], int] = lambda: 0  # the Event sink's series dropped with a full outbox
    detection: Histogram | None = None  # time to detect, filled by the condition sink (Kubernetes mode)

    def health_document(self) -> tuple[bool, dict]:
        components = self.supervisor.health()
        ok = all(components.values())
        details = {name: text for name, get in self.details.items() if (text := get())}
        details.update(self.supervisor.crashed())
        body: dict[str, object] = {
            "status": "ok" if ok else "unhealthy",
            "components": components,
            "stateDir": {
                "path": str(self.state_dir.path),
                "ok": self.state_dir.ok,
                "problems": self.state_dir.problems(),
            },
        }
        if details:
            body["details"] = details
        return ok, body

    def conditions_document(self) -> dict:
        doc = snapshot_json(self.current().snapshot)
        doc["health"] = self.supervisor.health()
        return doc

    def stats(self) -> AgentStats:
        s = self.producer.source.stats
        pipeline = self.main_loop.pipeline
        return AgentStats(
            records_read=s.records_read,
            records_lost=s.records_lost,
            reader_restarts=s.reader_restarts,
            read_errors=s.read_errors,
            parse_errors=s.parse_errors,
            last_record_time=s.last_record_time,
            lines_matched=pipeline.lines_matched,
            rule_matches=dict(pipeline.rule_matches),
            config_generation=self.watcher.generation if self.watcher is not None else self.config_generation,
            rules_loaded=len(pipeline.rule_set.rules),  # in effect: a reload replaces the pipeline
            components=self.supervisor.health(),
            state_dir_ok=self.state_dir.ok,
            records_processed=self.main_loop.records_processed,
            malformed_lines=s.malformed_lines,
            config_reload_failures=self.watcher.failures if self.watcher is not None else 0,
            device_matches=pipeline.threshold_counts(),
            kmsg_overruns=getattr(s, "overruns", 0),  # a relay client's stats have none: the relay counts them
            decode_errors=self.main_loop.decode_errors,
            events_dropped=self.events_dropped(),
            detection=self.detection.snapshot() if self.detection is not None else None,
            monitor_counts={
                (m.name, name): value
                for m in self.monitors
                for name, value in dataclasses.asdict(m.source.stats).items()
                if isinstance(value, int) and not isinstance(value, bool)
            },
        )

    def run(self, stop: threading.Event) -> int:
        # Everything built so far (rules, clients, modules) lives as long as the process: keep it out
        # of the garbage collector's full passes, which otherwise rescan it during a record storm.
        gc.collect()
        gc.freeze()
        release_free_memory()
        late = self.supervisor.run(stop)
        self.feed.close()
        log.info("stopped%s", f" (still running at the deadline: {', '.join(late)})" if late else "")
        return EXIT_OK


def _load_cursor(store: CursorStore, health: StateDirHealth) -> Cursor | None:
    if store.path.exists() and not store.path.is_file():
        health.report("cursor", f"{store.path} is not a regular file; every restart replays by --lookback")
        return None
    return store.load()


def _owned_by(spec: ConditionSpec, provenance: Provenance) -> ConditionSpec:
    return spec if spec.provenance is not None else dataclasses.replace(spec, provenance=provenance)


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
) -> Runtime:
    """Everything but the HTTP server (see :func:`serve`), wired and ready for ``Runtime.run``.

    ``checks`` run under the ``check_scheduler``; ``extra_conditions`` are the conditions the agent owns
    (:func:`agent.app.config.owned_conditions`: every source's, with its provenance); the rule set's
    and the checks' own are added for the types it does not list."""
    state_dir = StateDirHealth(path=settings.state_dir)
    state_dir.check()
    cursor_store = CursorStore(state_dir=settings.state_dir)
    condition_store = ConditionStore(health=state_dir)
    conditions: dict[str, ConditionSpec] = {spec.type: spec for spec in extra_conditions}
    for spec in rule_set.conditions:
        conditions.setdefault(spec.type, _owned_by(spec, Provenance.KERNEL_LOG))
    for check in checks:
        for spec in getattr(check.check, "conditions", ()) or ():
            conditions.setdefault(spec.type, _owned_by(spec, provenance_of(check)))
    declared = tuple(conditions.values())
    state = NodeState(
        conditions=tuple(conditions.values()),
        clock=clock,
        reasons=rule_set.reasons,
        problem_pairs=[(r.condition, r.reason) for r in rule_set.rules if r.condition and "{" not in r.reason],
        aggregate=settings.aggregate_condition,
        seeded=kube is None,
    )
    cursor, boot_id = _load_cursor(cursor_store, state_dir), current_boot_id(settings.boot_id_file)
    # A new boot (the cursor is of another): the kernel log that raised our kernel-log problems is gone, and
    # this boot's log rebuilds those still there. Keeping them would hold a rebooted node broken forever.
    last_boot = {t for t, spec in conditions.items() if spec.provenance is Provenance.KERNEL_LOG}
    new_boot = cursor is not None and boot_id != "unknown" and cursor.boot_id != boot_id

    def this_boot(found: Sequence[Condition]) -> list[Condition]:
        return [c for c in found if not (new_boot and c.type in last_boot and c.status is Status.TRUE)]

    kept = condition_store.load()
    if kept is not None:
        state.restore(this_boot(kept))
    if kube is not None and kube.node is not None:
        from agent.sources.nodeseed import node_conditions, node_uid

        state.seed(
            this_boot(
                node_conditions(kube.node, types=state.owned_types, severity=severity_lookup(rule_set), now=clock())
            ),
            node_uid=node_uid(kube.node),
        )
    inbox = Inbox()
    feed = SnapshotFeed(initial=state.snapshot())
    producer = SourceProducer(
        source=source or build_source(settings), inbox=inbox, stall_timeout=settings.stall_timeout
    )
    components: list[Component] = [producer]
    monitor_producers: list[SourceProducer] = []
    monitor_pipelines: dict[str, DetectionPipeline] = {}
    details: dict[str, Callable[[], str | None]] = {"kmsg_reader": producer.detail}
    for monitor in log_monitors:
        from agent.sources.logmonitors import build_source as build_monitor_source

        monitor_producer = SourceProducer(
            source=build_monitor_source(monitor.settings),
            inbox=inbox,
            stall_timeout=settings.stall_timeout,
            name=monitor.name,
            monitor=monitor.name,
        )
        components.append(monitor_producer)
        monitor_producers.append(monitor_producer)
        monitor_pipelines[monitor.name] = DetectionPipeline(rule_set=monitor.rule_set)
        details[monitor.name] = monitor_producer.detail
    scheduler = None
    if checks:
        from agent.checks.scheduler import CheckScheduler

        scheduler = CheckScheduler(
            checks=checks,
            inbox=inbox,
            concurrency=settings.check_concurrency,
            stall_timeout=settings.stall_timeout,
            clock=clock,
            cancel=cancel,
        )
        components.append(scheduler)
        details["check_scheduler"] = scheduler.detail
    consumers: list[Component] = []
    acks: list[Callable[[], int]] = []
    events: EventSink | None = None
    detection: Histogram | None = None
    if kube is None:
        from agent.sinks.stdout import StdoutSink

        stdout = StdoutSink(feed=feed, stream=stream)
        consumers.append(stdout)
        acks.append(stdout.acked)
        details["stdout"] = stdout.detail
    else:
        from agent.sinks.conditions import ConditionSink
        from agent.sinks.events import EventSink

        detection = Histogram()
        condition_sink = ConditionSink(
            client=kube.client,
            node_name=kube.node_name,
            feed=feed,
            heartbeat=settings.heartbeat,
            delete_types=[t for t in settings.delete_conditions if t not in state.owned_types],
            aggregate=settings.aggregate_condition,
            detection=detection,
            resync=kube.resync,
        )
        events = EventSink(
            client=kube.client,
            node_name=kube.node_name,
            feed=feed,
            namespace=settings.event_namespace,
            state_dir=settings.state_dir,
            resync=kube.resync,
        )
        consumers.extend([condition_sink, events])
        acks.append(events.acked)
        event_sink = events
        state_dir.watch("outbox", lambda: event_sink.last_persist_error)
        details["condition_sink"] = condition_sink.detail
        details["event_sink"] = events.detail
        if kube.node is None:
            from agent.sources.nodeseed import NodeSeeder

            seeder = NodeSeeder(
                client=kube.client,
                node_name=kube.node_name,
                inbox=inbox,
                types=state.owned_types,
                severity=severity_lookup(rule_set),
                clock=clock,
                on_node=labels.set_from if labels is not None else None,
            )
            components.append(seeder)
            details["node_seeder"] = lambda: seeder.last_error
    collectors: list[Any] = []
    supervisor_ref: list[Supervisor] = []
    # The kernel log as read this boot, for the diagnostics bundle taken before a remedy (acting recovery only).
    bundles = settings.diagnostics_keep or settings.diagnostics_s3
    kernel_log = LineRing() if kube is not None and settings.enable_recovery and bundles else None
    if kube is not None or settings.cloudwatch:
        extra, extra_details, extra_collectors = recovery_components(
            settings=settings,
            kube=kube,
            feed=feed,
            inbox=inbox,
            policy=policy,
            clock=clock,
            conditions=declared,
            health=lambda: supervisor_ref[0].health(),
            stale=stale_checks(scheduler, clock=clock) if scheduler is not None else None,
            kernel_log=kernel_log,
            check_stats=(lambda: scheduler.stats) if scheduler is not None else None,
        )
        consumers.extend(extra)
        details.update(extra_details)
        collectors.extend(extra_collectors)
    main_loop = MainLoop(
        inbox=inbox,
        feed=feed,
        state=state,
        pipeline=DetectionPipeline(rule_set=rule_set),
        replay=ReplayPolicy(
            cursor=cursor,
            boot_id=boot_id,
            lookback=settings.lookback,
        ),
        health=lambda: supervisor_ref[0].health(),
        stall_timeout=settings.stall_timeout,
        cursor_store=cursor_store,
        condition_store=condition_store,
        state_dir=state_dir,
        acks=acks,
        monitors=monitor_pipelines,
        kernel_log=kernel_log,
        clock=clock,
    )
    supervisor = Supervisor(components=[*components, main_loop, *consumers], on_stop=[feed.close])
    supervisor_ref.append(supervisor)
    current = CaughtUp(inbox=inbox, feed=feed, catch_up=producer.catch_up)
    runtime = Runtime(
        supervisor=supervisor,
        feed=feed,
        main_loop=main_loop,
        producer=producer,
        state_dir=state_dir,
        details=details,
        scheduler=scheduler,
        inbox=inbox,
        monitors=monitor_producers,
        detection=detection,
        current=current,
    )
    if events is not None:
        sink = events
        runtime.events_dropped = lambda: sink.overflowed
    collectors.insert(0, AgentCollector(snapshot=lambda: current().snapshot, stats=runtime.stats))
    if scheduler is not None:
        from agent.checks.metrics import CheckCollector

        collectors.append(CheckCollector(stats=lambda: scheduler.stats))
    runtime.registry = build_registry(*collectors)
    return runtime


def aws_clients(clients: AwsClients | None) -> AwsClients:
    """The AWS clients, built whenever a part that calls AWS is configured (``needs_aws``)."""
    if clients is None:
        raise RuntimeError("an AWS part is configured but no AWS clients were built (a bug in recovery_components)")
    return clients


def recovery_components(
    *,
    settings: Settings,
    kube: KubeSetup | None,
    feed: SnapshotFeed,
    inbox: Inbox,
    policy: Any,
    clock: Callable[[], float],
    conditions: Sequence[ConditionSpec] = (),
    health: Callable[[], dict[str, bool]] | None = None,  # every component's health now (recovery's gate)
    stale: Callable[[], dict[str, str]] | None = None,  # condition type -> its check, stale (recovery's gate)
    kernel_log: LineRing | None = None,
    check_stats: Callable[[], Mapping[str, Any]] | None = None,
) -> tuple[list[Component], dict[str, Callable[[], str | None]], list[Any]]:
    """The ``recovery`` loop (Kubernetes mode: acting or report-only) and the ``cloudwatch`` sink (when on).

    AWS (boto3) is loaded only when it is used: CloudWatch on, or recovery acting with a policy that
    marks instances unhealthy."""
    from agent.recovery.model import Action
    from agent.recovery.policyfile import DEFAULT_POLICY, published

    policy = policy or DEFAULT_POLICY
    if settings.recovery_startup_delay is not None:
        policy = dataclasses.replace(policy, startup_delay=settings.recovery_startup_delay)
    components: list[Component] = []
    details: dict[str, Callable[[], str | None]] = {}
    collectors: list[Any] = []
    from agent.recovery.model import Remedy

    ladders = {r for rule in policy.rules for r in rule.ladder}
    actions = {a for rule in policy.rules for a in rule.actions}
    actions |= {Action.CORDON, Action.DRAIN, Action.REBOOT} if Remedy.REBOOT in ladders else set()
    actions |= {Action.CORDON, Action.MARK_UNHEALTHY} if Remedy.REPLACE in ladders else set()
    needs_aws = settings.cloudwatch or (
        settings.enable_recovery
        and (bool({Action.MARK_UNHEALTHY, Action.REBOOT} & actions) or bool(settings.diagnostics_s3))
    )
    clients: AwsClients | None = None
    imds: InstanceMetadata | None = None
    if needs_aws:
        from agent.adapters.aws import AwsClients, InstanceMetadata

        imds = InstanceMetadata()  # AWS comes from the standard environment only
        clients = AwsClients(imds=imds)
    provider_id = ((kube.node or {}).get("spec") or {}).get("providerID") if kube is not None else None
    if settings.cloudwatch:
        from agent.adapters.aws import CloudWatchPublisher, InstanceIdLookup
        from agent.sinks.cloudwatch import DEFAULT_NAMESPACE, CloudWatchCollector, CloudWatchSink

        is_published = published(policy)
        namespaces = {spec.type: spec.cloudwatch_namespace for spec in conditions if spec.cloudwatch_namespace}
        sink = CloudWatchSink(
            feed=feed,
            publisher=CloudWatchPublisher(clients=aws_clients(clients)),
            cluster_name=settings.cluster_name,
            instance_id=InstanceIdLookup(provider_id=lambda: provider_id, imds=imds),
            select=lambda c, owner: (namespaces.get(c.type) or DEFAULT_NAMESPACE) if is_published(c, owner) else None,
            clock=clock,
        )
        components.append(sink)
        details["cloudwatch"] = sink.detail
        collectors.append(CloudWatchCollector(stats=sink.stats))
    if kube is not None:
        from agent.recovery.loop import RecoveryLoop
        from agent.recovery.metrics import RecoveryCollector

        budget = marker = drainer = bundle = ladder = rebooter = None
        if settings.enable_recovery:
            from agent.recovery.budget import ClusterBudget, budget_lease_name

            budget = ClusterBudget(
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

                marker = AsgMarker(
                    autoscaling=AutoScaling(clients=aws_clients(clients)),
                    imds=imds,
                    respect_grace_period=policy.respect_grace_period,
                )
            if Action.DRAIN in actions:
                drainer = drain_runner(kube=kube, policy=policy, clock=clock)
            if settings.diagnostics_keep or settings.diagnostics_s3:
                bundle = diagnostics_bundle(
                    settings=settings,
                    node_name=kube.node_name,
                    feed=feed,
                    policy=policy,
                    kernel_log=kernel_log,
                    check_stats=check_stats,
                    clients=clients,
                    clock=clock,
                )
            if Action.REBOOT in actions:
                from agent.adapters.aws import Ec2Reboot  # its EC2 client is built by the first reboot only
                from agent.recovery.ec2 import Ec2Rebooter

                rebooter = Ec2Rebooter(ec2=Ec2Reboot(clients=aws_clients(clients)), imds=imds)
        if ladders:
            from agent.recovery.ladder import Ladder

            boot_file = settings.boot_id_file
            ladder = Ladder(
                client=kube.client,
                node_name=kube.node_name,
                boot_id=lambda: current_boot_id(boot_file),
                reboot=rebooter,
            )
        loop = RecoveryLoop(
            feed=feed,
            inbox=inbox,
            client=kube.client,
            node_name=kube.node_name,
            policy=policy,
            enabled=settings.enable_recovery,
            budget=budget,
            mark_unhealthy=marker,
            drainer=drainer,
            bundle=bundle.before_remedy if bundle is not None else None,
            ladder=ladder,
            clock=clock,
            holds=hold_gate(settings=settings, kube=kube, health=health, stale=stale, policy=policy),
        )
        components.append(loop)
        details["recovery"] = lambda: loop.last_error
        collectors.append(RecoveryCollector(stats=lambda: loop.stats, policy=policy))
        from agent.recovery.holds import HoldCollector

        collectors.append(HoldCollector(stats=lambda: loop.holds.stats, clock=clock))
    return components, details, collectors


def hold_gate(
    *,
    settings: Settings,
    kube: KubeSetup,
    health: Callable[[], dict[str, bool]] | None,
    stale: Callable[[], dict[str, str]] | None = None,
    policy: RecoveryPolicy,  # its budget groups name the pool labels `pause --pool` matches
) -> Any:
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


def stale_checks(scheduler: Any, *, clock: Callable[[], float]) -> Callable[[], dict[str, str]]:
    """``() -> {condition type: check name}`` for the checks that have not completed a run (OK or
    PROBLEM) within three intervals (with jitter) plus their timeout: what they said may be stale."""
    from agent.checks.scheduler import declared_conditions

    started = clock()

    def stale() -> dict[str, str]:
        now = clock()
        out: dict[str, str] = {}
        for spec in scheduler.checks:
            stats = scheduler.stats.get(spec.name)
            last = stats.last_success if stats is not None and stats.last_success is not None else started
            if now - last > 3 * spec.interval * (1 + spec.jitter) + spec.timeout:
                out.update(dict.fromkeys(declared_conditions(spec.check), spec.name))
        return out

    return stale


def diagnostics_bundle(
    *,
    settings: Settings,
    node_name: str,
    feed: SnapshotFeed,
    policy: Any,
    kernel_log: LineRing | None,
    check_stats: Callable[[], Mapping[str, Any]] | None,
    clients: AwsClients | None,
    clock: Callable[[], float],
) -> DiagnosticsBundle:
    """The evidence taken before a reboot or replace: state directory, and S3 with ``--diagnostics-s3``."""
    from agent.recovery.bundle import DiagnosticsBundle, parse_s3_url
    from agent.recovery.policyfile import policy_summary

    put = None
    if settings.diagnostics_s3:
        from agent.adapters.aws import S3Uploader

        put = S3Uploader(clients=aws_clients(clients), bucket=parse_s3_url(settings.diagnostics_s3)[0]).put

    def checks() -> dict[str, Any]:
        stats = check_stats() if check_stats is not None else {}
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

    def configuration() -> dict[str, Any]:
        shown = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
        return {
            **{k: v if isinstance(v, bool | int | float) or v is None else str(v) for k, v in shown.items()},
            "recoveryPolicy": policy_summary(policy),
        }

    return DiagnosticsBundle(
        state_dir=settings.state_dir,
        node_name=node_name,
        kernel_log=kernel_log.lines if kernel_log is not None else list,
        checks=checks,
        snapshot=lambda: feed.latest().snapshot,
        configuration=configuration,
        s3_url=settings.diagnostics_s3,
        s3_put=put,
        keep=settings.diagnostics_keep,
        clock=clock,
    )


def drain_runner(*, kube: KubeSetup, policy: Any, clock: Callable[[], float]) -> Callable[..., Any]:
    """``(stop, report) -> DrainResult``: a drain of this node (the recovery loop turns reports into Events)."""
    from agent.recovery.drain import Drainer

    def run(stop: threading.Event, report: Callable[[str, str], None]) -> Any:
        return Drainer(
            client=kube.client, node_name=kube.node_name, settings=policy.drain, clock=clock, report=report
        ).run(stop)

    return run


MAX_HTTP_CONNECTIONS = 1024
RESERVED_FDS = 128  # kernel log, relay socket, API connections, state files


def http_connection_limit() -> int:
    """Connections the HTTP server may hold: raise the soft fd limit to the hard one, keep room for the rest.

    The server may hold about two sockets per connection slot (answered plus refused ones).
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return MAX_HTTP_CONNECTIONS
    return max(16, min(MAX_HTTP_CONNECTIONS, (soft - RESERVED_FDS) // 2))


def serve(runtime: Runtime, settings: Settings) -> Component | None:
    """Start listening (errors raise OSError before anything else starts); the ``http`` component."""
    if settings.listen is None:
        return None
    from agent.app.http import AgentHTTPServer

    server = AgentHTTPServer(
        host=settings.listen.host,
        port=settings.listen.port,
        registry=runtime.registry,
        health=runtime.health_document,
        conditions=runtime.conditions_document if settings.serve_conditions else None,
        max_connections=http_connection_limit(),
    )
    server.start()
    served = "/metrics, /healthz and /conditions" if settings.serve_conditions else "/metrics and /healthz"
    log.info("serving %s on %s:%d", served, settings.listen.host, server.port)
    return HttpComponent(server)


# ---- Kubernetes startup ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KubeSetup:
    client: KubeClient
    node_name: str
    node: dict | None  # the Node as read at startup; None when the API server did not answer in time
    resync: float = RESYNC  # the Node and Event sinks' shortest wait after a failed write


def connect_kubernetes(settings: Settings, *, stop: threading.Event) -> KubeSetup | int:
    """Credentials and a first read of the Node, bounded by ``--api-wait-timeout``; an exit code on failure.

    Rejected credentials (401/403) and missing credentials exit 2. An API server that does not
    answer in time is not fatal: detection starts and the ``node_seeder`` keeps trying.
    """
    from agent.adapters.kube import KubeClient, KubeConfigError, KubeError, resolve_node_name

    node_name = resolve_node_name(flag=settings.node_name)
    try:
        client = KubeClient.load(kubeconfig=settings.kubeconfig)
    except KubeConfigError as exc:
        log.error("%s (or run with --standalone: no cluster)", exc)
        return EXIT_CONFIG
    log.info("node %s, API server %s (%s)", node_name, client.info.host, client.info.source)
    deadline = time.monotonic() + settings.api_wait_timeout
    node = None
    while not stop.is_set():
        try:
            node = client.get_node(node_name)
            break
        except KubeError as exc:
            if exc.unauthorized:
                log.error("%s", exc)
                client.close()
                return EXIT_CONFIG
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning(
                    "API server not ready after %.0fs (%s); detecting anyway, conditions follow",
                    settings.api_wait_timeout,
                    exc,
                )
                break
            log.info("waiting for the API server / node %s (%s); %.0fs left", node_name, exc, remaining)
            stop.wait(min(API_WAIT_INTERVAL, remaining))
    return KubeSetup(client=client, node_name=node_name, node=node)


class NodeLabels:
    """The Node's labels once read (Kubernetes mode), for checks that compare them with the hardware."""

    def __init__(self) -> None:
        self.labels: dict[str, str] | None = None

    def get(self) -> dict[str, str] | None:
        return self.labels

    def set_from(self, node: dict | None) -> None:
        if node is not None:
            self.labels = dict((node.get("metadata") or {}).get("labels") or {})


INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


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
        )
        try:
            http = serve(runtime, settings)
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", settings.listen.host, settings.listen.port, exc)  # type: ignore[union-attr]
            return EXIT_CONFIG
        if http is not None:
            runtime.supervisor.add(http)
        if settings.watch_config and context is not None:
            from agent.app.reload import ConfigWatcher

            watcher = ConfigWatcher(
                paths=list(settings.rule_paths),
                current=loaded,
                context=context,
                scheduler=runtime.scheduler,
                inbox=runtime.inbox,  # type: ignore[arg-type]
                files=files,
                ignore=[settings.state_dir],  # never react to the agent's own writes
            )
            runtime.watcher = watcher
            runtime.details["config_watcher"] = lambda: watcher.last_error
            runtime.supervisor.add(watcher)
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
