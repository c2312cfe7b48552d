"""The producers: the kernel log (``kmsg_reader``), the filelog/journald monitors, the ``node_seeder``, the
``clear_watcher``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent.app.config import LogMonitor
from agent.app.settings import Settings
from agent.app.wiring.kube import KubeSetup
from agent.core.bus import Inbox
from agent.core.supervisor import Component
from agent.core.types import Severity
from agent.detectors.pipeline import DetectionPipeline
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.producer import Source, SourceProducer

if TYPE_CHECKING:
    from agent.sources.nodeseed import NodeSeeder

Figures = Callable[[], Mapping[str, Any]]  # some of AgentStats' fields, read at scrape time


def build_source(settings: Settings) -> Source:
    """The kernel log source: a kmsg-relay socket when configured, else the kmsg device (or file)."""
    stats = KmsgStats()
    if settings.kmsg_relay is not None:
        from agent.sources.relay_client import IDLE_WAIT, RelayClient

        # Idle, it sleeps on the socket until a frame (a heartbeat every couple of seconds) or stop (wake) comes.
        return RelayClient(path=settings.kmsg_relay, stats=stats, poll_interval=IDLE_WAIT)
    from agent.sources.kmsg.reader import KmsgReader

    # Idle, it sleeps on the device until a record or stop comes, waking only to stay within stall_timeout.
    return KmsgReader(path=settings.kmsg_path, stats=stats, idle_wait=settings.stall_timeout / 2)


def kernel_producer(settings: Settings, *, source: Source | None, inbox: Inbox) -> SourceProducer:
    """Component ``kmsg_reader``: ``source`` (tests, benchmarks) or the configured kernel log."""
    return SourceProducer(source=source or build_source(settings), inbox=inbox, stall_timeout=settings.stall_timeout)


def kernel_figures(producer: SourceProducer) -> Figures:
    """The kernel log reader's counters, as AgentStats names them."""

    def figures() -> dict[str, Any]:
        s = producer.source.stats
        return {
            "records_read": s.records_read,
            "records_lost": s.records_lost,
            "reader_restarts": s.reader_restarts,
            "read_errors": s.read_errors,
            "parse_errors": s.parse_errors,
            "last_record_time": s.last_record_time,
            "malformed_lines": s.malformed_lines,
            "kmsg_overruns": getattr(s, "overruns", 0),  # a relay client's stats have none: the relay counts them
        }

    return figures


def monitor_producers(
    settings: Settings, monitors: Sequence[LogMonitor], *, inbox: Inbox
) -> tuple[list[SourceProducer], dict[str, DetectionPipeline]]:
    """One producer per filelog/journald monitor, and each monitor's own pipeline (for the main loop)."""
    producers: list[SourceProducer] = []
    pipelines: dict[str, DetectionPipeline] = {}
    for monitor in monitors:
        from agent.sources.logmonitors import build_source as build_monitor_source

        producers.append(
            SourceProducer(
                source=build_monitor_source(monitor.settings),
                inbox=inbox,
                stall_timeout=settings.stall_timeout,
                name=monitor.name,
                monitor=monitor.name,
            )
        )
        pipelines[monitor.name] = DetectionPipeline(rule_set=monitor.rule_set)
    return producers, pipelines


def monitor_figures(producers: Sequence[SourceProducer]) -> Figures:
    """``monitor_counts``: every monitor's integer counters by (monitor, counter)."""
    return lambda: {
        "monitor_counts": {
            (m.name, name): value
            for m in producers
            for name, value in dataclasses.asdict(m.source.stats).items()
            if isinstance(value, int) and not isinstance(value, bool)
        }
    }


def node_seeder(
    *,
    kube: KubeSetup | None,
    inbox: Inbox,
    types: Sequence[str],
    severity: Callable[[str, str], Severity | None],
    clock: Callable[[], float],
    on_node: Callable[[dict], None] | None,
) -> NodeSeeder | None:
    """Producer ``node_seeder`` when the Node was not read at start (it keeps trying), else None."""
    if kube is None or kube.node is not None:
        return None
    from agent.sources.nodeseed import NodeSeeder

    return NodeSeeder(
        client=kube.client,
        node_name=kube.node_name,
        inbox=inbox,
        types=types,
        severity=severity,
        clock=clock,
        on_node=on_node,
    )


def clear_watcher(*, kube: KubeSetup | None, inbox: Inbox, interval: float) -> Component | None:
    """Producer ``clear_watcher`` in Kubernetes mode: the operator's clear requests on this Node."""
    if kube is None:
        return None
    from agent.sources.clearwatch import ClearWatcher

    return ClearWatcher(client=kube.client, node_name=kube.node_name, inbox=inbox, interval=interval)
