"""Wiring for ``run --standalone``: kernel log → rules → state → JSON lines on stdout + HTTP.

No cluster is needed; the same Agent core also runs in Kubernetes mode with more sinks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from agent.app import Agent, Sink, Source
from agent.detectors.rulepack import RuleSet
from agent.http import AgentHTTPServer
from agent.settings import Settings
from agent.sinks.log import LogSink
from agent.sources.kmsg import KmsgReader, KmsgStats
from agent.sources.kmsg_format import read_boot_id
from agent.sources.replay import CursorStore

log = logging.getLogger(__name__)


def build_source(settings: Settings) -> Source:
    """The kernel log source: a kmsg-relay socket when configured, else the kmsg device."""
    stats = KmsgStats()
    if settings.kmsg_relay is not None:
        from agent.sources.relay import RelayClient

        return RelayClient(path=settings.kmsg_relay, stats=stats)
    return KmsgReader(path=settings.kmsg_path, stats=stats)


def current_boot_id() -> str:
    try:
        return read_boot_id()
    except (OSError, ValueError) as exc:
        log.warning("cannot read the boot id (%s); restart replay falls back to lookback", exc)
        return "unknown"


def serve(agent: Agent, settings: Settings) -> AgentHTTPServer | None:
    if settings.listen is None:
        return None
    server = AgentHTTPServer(
        host=settings.listen.host,
        port=settings.listen.port,
        registry=agent.registry,
        health=agent.health,
        conditions=agent.conditions_document,
    )
    server.start()
    log.info("serving /metrics, /healthz and /conditions on %s:%d", settings.listen.host, server.port)
    return server


def run_agent(*, agent: Agent, settings: Settings, stop: threading.Event) -> int:
    try:
        server = serve(agent, settings)
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", settings.listen.host, settings.listen.port, exc)  # type: ignore[union-attr]
        return 2
    try:
        agent.run(stop)
    finally:
        if server is not None:
            server.stop()
    log.info("stopped")
    return 0


def run_standalone(
    *, settings: Settings, rule_set: RuleSet, stop: threading.Event, extra_sinks: Sequence[Sink] = ()
) -> int:
    agent = Agent(
        rule_set=rule_set,
        source=build_source(settings),
        sinks=[LogSink(), *extra_sinks],
        cursor_store=CursorStore(state_dir=settings.state_dir),
        boot_id=current_boot_id(),
        lookback=settings.lookback,
        stall_timeout=settings.stall_timeout,
    )
    log.info(
        "standalone: %d rules from %d files, reading %s",
        len(rule_set.rules),
        len(rule_set.files),
        settings.kmsg_relay or settings.kmsg_path,
    )
    return run_agent(agent=agent, settings=settings, stop=stop)
