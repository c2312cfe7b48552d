"""Wiring for ``run`` in a cluster: the standalone agent plus Node conditions and Events.

Startup: resolve the node name, load credentials (in-cluster or kubeconfig), wait for the API
server (bounded, logged) and read the Node's existing conditions for our types into the state
before anything is written. If the API stays away past ``--api-wait-timeout`` detection starts
anyway; the conditions sink then reads the Node before its first write. Bad credentials (401/403)
at startup are a configuration error: exit 2 with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agent.app import Agent
from agent.detectors.rulepack import RuleSet
from agent.kube import KubeClient, KubeConfigError, KubeError, resolve_node_name
from agent.settings import Settings
from agent.sinks.conditions import ConditionSink, node_conditions
from agent.sinks.events import EventSink
from agent.sinks.log import LogSink
from agent.sources.replay import CursorStore
from agent.standalone import build_source, current_boot_id, run_agent
from agent.types import Severity

log = logging.getLogger(__name__)

API_WAIT_INTERVAL = 5.0


def severity_lookup(rule_set: RuleSet) -> Callable[[str, str], Severity]:
    """Severity of a (condition, reason) read back from a Node, from the rule that produces it."""

    def lookup(type_: str, reason: str) -> Severity:
        exact = [r.severity for r in rule_set.rules if r.condition == type_ and r.reason == reason]
        any_ = [r.severity for r in rule_set.rules if r.condition == type_]
        found = exact or any_
        return max(found, key=lambda s: s.rank) if found else Severity.CRITICAL

    return lookup


def wait_for_node(
    client: KubeClient, node: str, *, timeout: float, stop: threading.Event, interval: float = API_WAIT_INTERVAL
) -> dict | None:
    """GET the Node until it answers or ``timeout`` passes. Raises KubeError for rejected credentials."""
    deadline = time.monotonic() + timeout
    while not stop.is_set():
        try:
            return client.get_node(node)
        except KubeError as exc:
            if exc.unauthorized:
                raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("API server not ready after %.0fs (%s); detecting anyway, conditions follow", timeout, exc)
                return None
            log.info("waiting for the API server / node %s (%s); %.0fs left", node, exc, remaining)
            stop.wait(min(interval, remaining))
    return None


def run_kubernetes(*, settings: Settings, rule_set: RuleSet, stop: threading.Event) -> int:
    node_name = resolve_node_name(flag=settings.node_name)
    try:
        client = KubeClient.load(kubeconfig=settings.kubeconfig)
    except KubeConfigError as exc:
        log.error("%s", exc)
        return 2
    log.info("node %s, API server %s (%s)", node_name, client.info.host, client.info.source)
    try:
        node = wait_for_node(client, node_name, timeout=settings.api_wait_timeout, stop=stop)
    except KubeError as exc:
        log.error("%s", exc)
        client.close()
        return 2
    if stop.is_set():
        client.close()
        return 0

    agent = Agent(
        rule_set=rule_set,
        source=build_source(settings),
        sinks=[],
        cursor_store=CursorStore(state_dir=settings.state_dir),
        boot_id=current_boot_id(),
        lookback=settings.lookback,
        stall_timeout=settings.stall_timeout,
        aggregate=settings.aggregate_condition,
    )
    severity = severity_lookup(rule_set)
    owned = agent.state.owned_types
    uid: dict[str, str | None] = {"uid": (node or {}).get("metadata", {}).get("uid")}

    def seed_later(raw: list[dict]) -> threading.Event:
        return agent.seed(
            node_conditions({"status": {"conditions": raw}}, types=owned, severity=severity, now=time.time())
        )

    if node is not None:
        agent.state.seed(node_conditions(node, types=owned, severity=severity, now=time.time()))
    conditions = ConditionSink(
        client=client,
        node_name=node_name,
        heartbeat=settings.heartbeat,
        delete_types=[t for t in settings.delete_conditions if t not in owned],
        seed=None if node is not None else seed_later,
    )
    events = EventSink(
        client=client, node_name=node_name, node_uid=lambda: uid["uid"], namespace=settings.event_namespace
    )
    agent.sinks.extend([LogSink(), conditions, events])
    conditions.start()
    events.start()
    try:
        return run_agent(agent=agent, settings=settings, stop=stop)
    finally:
        client.close()
