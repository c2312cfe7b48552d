"""The consumers of the snapshot feed: ``stdout`` (standalone), ``condition_sink`` and ``event_sink``
(Kubernetes), ``cloudwatch`` (with ``--cloudwatch``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from agent.app.settings import Settings
from agent.app.wiring.aws import Aws
from agent.app.wiring.kube import KubeSetup
from agent.app.wiring.sources import Figures
from agent.core.bus import SnapshotFeed
from agent.core.statedir import StateDirHealth
from agent.core.supervisor import Component
from agent.core.types import ConditionSpec

if TYPE_CHECKING:
    from agent.sinks.cloudwatch import CloudWatchSink


@dataclass(frozen=True, kw_only=True)
class Sinks:
    components: tuple[Component, ...]
    acks: tuple[Callable[[], int], ...]  # what the durable consumers acknowledged (the main loop's cursor)
    figures: tuple[Figures, ...] = ()


def stdout_sinks(*, feed: SnapshotFeed, stream: TextIO | None) -> Sinks:
    """Standalone: events as JSON lines on stdout."""
    from agent.sinks.stdout import StdoutSink

    stdout = StdoutSink(feed=feed, stream=stream)
    return Sinks(components=(stdout,), acks=(stdout.acked,))


def kube_sinks(
    settings: Settings, *, kube: KubeSetup, feed: SnapshotFeed, owned: Sequence[str], state_dir: StateDirHealth
) -> Sinks:
    """Kubernetes: the Node's conditions and the Events, with the time to detect (``detection``)."""
    from agent.core.latency import Histogram
    from agent.sinks.clearack import ClearAckSink
    from agent.sinks.conditions import ConditionSink
    from agent.sinks.events import EventSink
    from agent.sinks.validations import ValidationSink

    detection = Histogram()
    conditions = ConditionSink(
        client=kube.client,
        node_name=kube.node_name,
        feed=feed,
        heartbeat=settings.heartbeat,
        delete_types=[t for t in settings.delete_conditions if t not in owned],
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
    state_dir.watch("outbox", lambda: events.last_persist_error)
    clears = ClearAckSink(client=kube.client, node_name=kube.node_name, feed=feed, resync=kube.resync)
    validations = ValidationSink(client=kube.client, node_name=kube.node_name, feed=feed, resync=kube.resync)
    return Sinks(
        components=(conditions, events, clears, validations),
        acks=(events.acked,),
        figures=(lambda: {"events_dropped": events.overflowed, "detection": detection.snapshot()},),
    )


def cloudwatch_sink(
    settings: Settings,
    *,
    kube: KubeSetup | None,
    feed: SnapshotFeed,
    conditions: Sequence[ConditionSpec],
    policy: Any,  # the recovery policy in effect: what it publishes
    aws: Aws,
    clock: Callable[[], float],
) -> CloudWatchSink | None:
    """Component ``cloudwatch`` with ``--cloudwatch``, else None."""
    if not settings.cloudwatch:
        return None
    from agent.adapters.aws import CloudWatchPublisher, InstanceIdLookup
    from agent.recovery.policyfile import published
    from agent.sinks.cloudwatch import DEFAULT_NAMESPACE, CloudWatchSink

    provider_id = ((kube.node or {}).get("spec") or {}).get("providerID") if kube is not None else None
    is_published = published(policy)
    namespaces = {spec.type: spec.cloudwatch_namespace for spec in conditions if spec.cloudwatch_namespace}
    return CloudWatchSink(
        feed=feed,
        publisher=CloudWatchPublisher(clients=aws.clients),
        cluster_name=settings.cluster_name,
        instance_id=InstanceIdLookup(provider_id=lambda: provider_id, imds=aws.imds),
        select=lambda c, owner: (namespaces.get(c.type) or DEFAULT_NAMESPACE) if is_published(c, owner) else None,
        clock=clock,
    )


def cloudwatch_collector(sink: CloudWatchSink | None) -> Any:
    """The CloudWatch sink's own metrics (None without it)."""
    if sink is None:
        return None
    from agent.sinks.cloudwatch import CloudWatchCollector

    return CloudWatchCollector(stats=sink.stats)
