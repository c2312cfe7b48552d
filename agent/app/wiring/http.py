"""The ``http`` component: ``/metrics``, ``/healthz`` and ``/conditions`` (with ``--listen``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.app.settings import Settings
from agent.core.supervisor import Component

if TYPE_CHECKING:
    from agent.app.http import AgentHTTPServer

log = logging.getLogger(__name__)

MAX_HTTP_CONNECTIONS = 1024
RESERVED_FDS = 128  # kernel log, relay socket, API connections, state files


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


def http_server(
    settings: Settings,
    *,
    registry: Any,
    health: Callable[[], tuple[bool, dict]],
    conditions: Callable[[], dict],
) -> Component | None:
    """Start listening (errors raise OSError before anything else starts); the ``http`` component, or None."""
    if settings.listen is None:
        return None
    from agent.app.http import AgentHTTPServer

    server = AgentHTTPServer(
        host=settings.listen.host,
        port=settings.listen.port,
        registry=registry,
        health=health,
        conditions=conditions if settings.serve_conditions else None,
        max_connections=http_connection_limit(),
    )
    server.start()
    served = "/metrics, /healthz and /conditions" if settings.serve_conditions else "/metrics and /healthz"
    log.info("serving %s on %s:%d", served, settings.listen.host, server.port)
    return HttpComponent(server)
