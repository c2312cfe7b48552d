"""HTTP/1.1 front end: parses requests, applies outages, faults and authentication, writes JSON
responses and chunked watch streams."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from .api import Request, Response, WatchStream
from .authz import authenticate
from .errors import for_status_code, internal
from .requestlog import RequestRecord

if TYPE_CHECKING:
    from .server import KubeApiServer


class HttpServer(ThreadingHTTPServer):
    """A threading HTTP server that knows the :class:`KubeApiServer` it serves."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self, address: tuple[str, int], owner: KubeApiServer, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.owner = owner
        self.ssl_context = ssl_context
        super().__init__(address, RequestHandler)

    def get_request(self) -> tuple[Any, Any]:
        """With TLS, each connection is wrapped as accepted; its handshake runs in its own thread."""
        connection, address = super().get_request()
        if self.ssl_context is not None:
            connection = self.ssl_context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
        return connection, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Connections cut by clients, faults or outages are expected; report anything else."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms delayed-ACK stalls
    server: HttpServer

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()
        self.server.owner._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        """Silence the default stderr access log."""

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    # --- plumbing --------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _drop(self) -> None:
        """Close the connection without answering."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _write(self, response: Response) -> None:
        if isinstance(response.body, str):
            payload, content_type = response.body.encode(), "text/plain; charset=utf-8"
        else:
            payload, content_type = json.dumps(response.body).encode(), "application/json"
        self.send_response(response.status)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache, private")
        for key, value in response.headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _stream(self, stream: WatchStream) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        try:
            for event in stream.events:
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            if self.server.owner.outage_mode is not None:
                self._drop()  # cut, not a graceful end of the stream
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            close = getattr(stream.events, "close", None)
            if close is not None:
                close()
            stream.cancel()

    def _serve(self) -> None:
        owner = self.server.owner
        if owner.outage_mode is not None:
            owner.outage_requests.append(
                RequestRecord(self.command, urlsplit(self.path).path, {}, None, None, fault="outage")
            )
            self._drop()
            return
        split = urlsplit(self.path)
        path = split.path
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        body = self._read_body()
        content_type = self.headers.get("Content-Type")
        try:
            parsed_body = json.loads(body) if body else None
        except ValueError:
            parsed_body = body.decode(errors="replace")

        def record(status: int | None, fault: str | None = None, objects: int = 0) -> None:
            owner.requests.append(
                RequestRecord(self.command, path, query, content_type, status, parsed_body, fault, objects=objects)
            )

        fault = owner.faults.take(self.command, path, body.decode(errors="replace"))
        if fault is not None and fault.kind not in ("slow", "applied"):
            if fault.kind == "drop":
                record(None, "drop")
                self._drop()
                return
            if fault.kind == "timeout":
                record(None, "timeout")
                owner._stopping.wait(fault.delay)
                self._drop()
                return
            error = for_status_code(fault.status, fault.retry_after, fault.message)
            record(error.code, "status")
            self._write(Response(error.code, error.status(), dict(error.headers)))
            return

        denied = authenticate(owner.token, self.headers.get("Authorization"), anonymous=owner.anonymous_auth, path=path)
        if denied is not None:
            record(denied.code)
            self._write(Response(denied.code, denied.status(), {}))
            return

        request = Request(self.command, path, query, dict(self.headers.items()), body)
        try:
            result = owner.api.handle(request)
        except Exception as exc:  # a bug in the test server: answer 500 so the test fails loudly
            error = internal(f"test API server bug: {type(exc).__name__}: {exc}")
            result = Response(error.code, error.status(), {})
        if isinstance(result, WatchStream):
            record(200)
            self._stream(result)
            return
        if fault is not None and fault.kind == "applied":  # done, but answered with an error all the same
            error = for_status_code(fault.status, fault.retry_after, fault.message)
            record(error.code, "applied")
            self._write(Response(error.code, error.status(), dict(error.headers)))
            return
        if fault is not None:  # slow: done, but the answer comes late (after the client gave up)
            record(result.status, "slow")
            owner._stopping.wait(fault.delay)
        else:
            record(result.status, objects=_objects(result))
        self._write(result)


def _objects(response: Response) -> int:
    """API objects in a successful answer: a list's items, else 1 for an object (a Status counts none)."""
    body = response.body
    if not 200 <= response.status < 300 or not isinstance(body, dict) or body.get("kind") == "Status":
        return 0
    items = body.get("items")
    return len(items) if isinstance(items, list) else 1
