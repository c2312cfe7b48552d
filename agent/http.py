"""The agent's HTTP endpoints: ``/metrics``, ``/healthz``, ``/conditions``.

``/healthz`` is a real liveness signal (node-problem-detector's always answers ok): it returns
503 with the failing components when the kmsg reader or the main loop has stalled.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)


class AgentHTTPServer:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], Mapping[str, bool]],
        conditions: Callable[[], Any],
    ) -> None:
        self._registry = registry
        self._health = health
        self._conditions = conditions
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                server._handle(self)

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("http: " + fmt, *args)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._send(req, 200, generate_latest(self._registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez", "/readyz"):
                components = dict(self._health())
                ok = all(components.values())
                body = json.dumps({"status": "ok" if ok else "unhealthy", "components": components})
                self._send(req, 200 if ok else 503, body.encode(), "application/json")
            elif path == "/conditions":
                body = json.dumps(self._conditions(), indent=2, sort_keys=True)
                self._send(req, 200, body.encode(), "application/json")
            else:
                self._send(req, 404, b"not found: try /metrics, /healthz or /conditions\n", "text/plain")
        except Exception:  # a failing endpoint must never take the agent down
            log.exception("error serving %s", path)
            self._send(req, 500, b"internal error\n", "text/plain")

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
        req.send_response(status)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
