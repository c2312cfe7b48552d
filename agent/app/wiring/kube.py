"""Kubernetes mode's start: credentials and a first read of the Node."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.app.exitcodes import EXIT_CONFIG
from agent.app.settings import Settings
from agent.sinks.worker import RESYNC

if TYPE_CHECKING:  # loaded lazily at run time (memory): the Kubernetes client only in Kubernetes mode
    from agent.adapters.kube import KubeClient

log = logging.getLogger(__name__)

API_WAIT_INTERVAL = 5.0


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
        client = KubeClient.load(kubeconfig=settings.kubeconfig, service_account_dir=settings.service_account_dir)
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
