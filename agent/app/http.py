"""The agent's HTTP endpoints: ``/metrics``, ``/healthz`` (``/livez``, ``/readyz``), ``/conditions``.

``/healthz`` is a real liveness signal (node-problem-detector's always answers ok): it returns
503 with the failing components when the kmsg reader or the main loop has stalled.

The server must not be starved or exhausted by whoever can reach its port, since the same process
may cordon nodes. So it is one thread running an asyncio event loop, not a thread per connection:

* every connection must deliver its whole request head (at most ``MAX_HEAD`` bytes) within
  ``request_timeout`` seconds and take its whole response within another ``request_timeout``;
  otherwise it is dropped;
* at most ``max_connections`` connections are open at once. When full, a new connection evicts the
  oldest one that is not being answered (still sending its request head, or lingering after its
  response); only when every open connection is being answered does the newcomer get a 503;
* one request per connection (``Connection: close``), GET and HEAD only;
* a client hanging up at any point is logged at debug level; a failing callback gives a 500 and
  one log line. Nothing a client does produces a traceback.

Response bodies are computed in the loop thread: the callbacks and the registry's text exposition
(``agent.app.exposition``: about a millisecond for the agent's ~470 samples) are pure-Python work,
which a thread pool would not parallelise (the GIL). A callback that blocks stalls the loop;
``healthy()`` then turns false.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import CollectorRegistry

from agent.app.exposition import TextRenderer

log = logging.getLogger(__name__)

MAX_HEAD = 8192  # bytes of request line + headers
GZIP_MIN = 1024  # smaller bodies are sent uncompressed
STALL = 10.0  # seconds a look at the loop (see healthy()) may go unanswered before it counts as stalled
LOOK_EVERY = 1.0  # seconds an answered look stands for: no new look is posted before (see healthy())
LINGER = 1.0  # seconds to wait for a client to hang up after its response (see _linger)
LINGER_BYTES = 65536  # ... and how much of what it still sends meanwhile to read and discard
ENDPOINTS = ("/metrics", "/healthz", "/livez", "/readyz", "/conditions")
HEALTH_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class AgentHTTPServer:
    """Serves the agent's endpoints from one thread; see the module docstring.

    ``health()`` returns ``(ok, body)``: 200 when ok else 503, with ``body`` as JSON.
    ``conditions()`` returns the JSON-able ``/conditions`` document; ``None`` turns ``/conditions`` off (404).
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, Any]],
        conditions: Callable[[], Any] | None,
        request_timeout: float = 5.0,
        max_connections: int = 1024,
        backlog: int = 1024,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if request_timeout <= 0 or max_connections < 1 or backlog < 1:
            raise ValueError("request_timeout, max_connections and backlog must be positive")
        self._host = host
        self._port = port
        self._registry = registry
        self._renderer = TextRenderer()
        self._health = health
        self._conditions = conditions
        self._timeout = request_timeout
        self._max_connections = max_connections
        self._backlog = backlog
        self._sock: socket.socket | None = None
        self._bound_port = 0
        self._monotonic = monotonic
        self._asked: float | None = None  # when a look at the loop was posted that it has not answered yet
        self._answered_at = -math.inf  # when the loop last answered one
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        # Open connections, oldest first, each mapped to whether it may be evicted to make room for a new
        # one: True while it sends its request head or lingers after its response, False while answered.
        self._conns: dict[asyncio.StreamWriter, bool] = {}
        self._shedding: set[asyncio.StreamWriter] = set()  # connections being told 503

    # ---- lifecycle (any thread) -------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port listened on (the one picked by the kernel when constructed with port 0)."""
        return self._bound_port or self._port

    def start(self) -> None:
        """Bind and listen (raises ``OSError`` if that fails), then serve from a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("AgentHTTPServer.start() called twice")
        self._sock = _listen(self._host, self._port, self._backlog)
        self._bound_port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            self.stop()
            raise self._startup_error

    def stop(self, timeout: float = 2.0) -> None:
        """Close the listener and every open connection; waits at most about ``timeout`` seconds."""
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(stopping.set)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("http: server thread did not stop within %.1fs", timeout)
        if self._sock is not None:
            self._sock.close()

    def healthy(self, now: float) -> bool:
        """True while the serving thread is alive, not stopping, and its event loop answers: asked from
        another thread, a look is posted to the loop, and a look unanswered for ``STALL`` seconds is a
        stalled loop. Asked from the loop itself (``/healthz``), it plainly turns. An idle loop is not
        woken by a heartbeat (each wakeup is idle CPU, issue 16); it is looked at when someone asks, and
        at most once per ``LOOK_EVERY`` seconds: the main loop asks at every publication, hundreds a
        second under a flood of kernel lines, and each look costs a wakeup of this thread and hands the
        interpreter lock to another thread in the middle of the main loop's step.

        ``now`` (the supervisor's clock) is not used: the looks are timed on ``monotonic``.
        """
        thread, stopping, loop = self._thread, self._stopping, self._loop
        if thread is None or not thread.is_alive() or stopping is None or stopping.is_set() or loop is None:
            return False
        if threading.get_ident() == thread.ident:
            return True
        asked, now = self._asked, self._monotonic()
        if asked is not None:
            return now - asked < STALL
        if now - self._answered_at < LOOK_EVERY:
            return True
        self._asked = now
        with contextlib.suppress(RuntimeError):  # the loop has just closed: the next look says so
            loop.call_soon_threadsafe(self._answered)
        return True

    def _answered(self) -> None:
        self._answered_at = self._monotonic()
        self._asked = None

    # ---- event loop thread ------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_loop_exception)
        try:
            loop.run_until_complete(self._serve(loop))
        except BaseException as exc:  # reported to start(), or logged if serving dies later
            if not self._ready.is_set():
                self._startup_error = exc
            else:
                log.error("http: server loop failed: %r", exc)
        finally:
            self._ready.set()
            loop.close()

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stopping = asyncio.Event()
        assert self._sock is not None
        server = await asyncio.start_server(self._connection, sock=self._sock, backlog=self._backlog, limit=MAX_HEAD)
        self._loop = loop
        self._ready.set()
        try:
            await self._stopping.wait()  # stop() sets it from any thread, waking the loop at once
        finally:
            server.close()
            for writer in [*self._conns, *self._shedding]:
                writer.transport.abort()
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        if len(self._conns) >= self._max_connections and not self._evict_one():
            await self._shed(reader, writer, peer)
            return
        self._conns[writer] = True
        try:
            async with asyncio.timeout(self._timeout):
                head = await _read_head(reader)
            if writer not in self._conns:  # evicted to make room just as its request arrived
                return
            self._conns[writer] = False
            await self._send(writer, self._respond(head))
            self._conns[writer] = True
            await self._linger(reader, writer)
        except TimeoutError:
            log.debug("http: %s timed out", peer)
        except (OSError, asyncio.IncompleteReadError) as exc:
            log.debug("http: %s went away: %r", peer, exc)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a bug here must not leave a traceback per client, nor kill the loop
            log.warning("http: error on a connection from %s: %r", peer, exc)
        finally:
            self._conns.pop(writer, None)
            _close(writer)

    def _evict_one(self) -> bool:
        """Make room by dropping the oldest connection that is not being answered, if there is one."""
        idle = next((w for w, evictable in self._conns.items() if evictable), None)
        if idle is None:
            return False
        log.debug("http: connection limit reached, dropping the slowest client %s", _peer(idle))
        del self._conns[idle]
        idle.transport.abort()
        return True

    async def _shed(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        """Answer 503 without reading the request: every open connection is busy being answered."""
        if len(self._shedding) >= self._max_connections:
            writer.transport.abort()
            return
        log.debug("http: connection limit reached, shedding %s", peer)
        self._shedding.add(writer)
        try:
            await self._send(writer, _response(HTTPStatus.SERVICE_UNAVAILABLE, b"too many connections\n", TEXT, False))
            await self._linger(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.CancelledError) as exc:
            log.debug("http: shed %s: %r", peer, exc)
        finally:
            self._shedding.discard(writer)
            _close(writer)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Hand ``data`` to the kernel within ``request_timeout`` (so nothing is left to flush on close)."""
        writer.transport.set_write_buffer_limits(high=0)
        writer.write(data)
        async with asyncio.timeout(self._timeout):
            await writer.drain()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then discard what the client still sends until it hangs up (briefly).

        Closing a socket with unread input makes the kernel send a reset, which can destroy the
        response before the client reads it (an early 405, 431 or 503, or a request sent twice).
        """
        writer.write_eof()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(LINGER, self._timeout)):
                discarded = 0
                while discarded <= LINGER_BYTES and (chunk := await reader.read(MAX_HEAD)):
                    discarded += len(chunk)

    def _respond(self, head: bytes | _BadRequest) -> bytes:
        """The whole response (head and body) for one request head."""
        if isinstance(head, _BadRequest):
            return _response(head.status, f"{head}\n".encode(), TEXT, False)
        try:
            method, path, accept_gzip = _parse(head)
        except _BadRequest as exc:
            return _response(exc.status, f"{exc}\n".encode(), TEXT, False)
        if method not in ("GET", "HEAD"):
            return _response(HTTPStatus.METHOD_NOT_ALLOWED, b"only GET and HEAD\n", TEXT, False, allow=True)
        try:
            status, body, ctype = self._endpoint(path)
        except Exception as exc:  # a failing callback must never take the agent down
            log.error("http: error serving %s: %s: %s", path, type(exc).__name__, exc)
            log.debug("http: error serving %s", path, exc_info=True)
            status, body, ctype = HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", TEXT
        return _response(status, body, ctype, accept_gzip and status == HTTPStatus.OK, head_only=method == "HEAD")

    def _endpoint(self, path: str) -> tuple[HTTPStatus, bytes, str]:
        if path == "/metrics":
            return HTTPStatus.OK, self._renderer.render(self._registry), CONTENT_TYPE_LATEST
        if path in HEALTH_PATHS:
            ok, body = self._health()
            return (HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE), _json(body), JSON
        if path == "/conditions":
            if self._conditions is None:
                return HTTPStatus.NOT_FOUND, b"/conditions is off: run with --serve-conditions true\n", TEXT
            return HTTPStatus.OK, _json(self._conditions(), indent=2), JSON
        endpoints = [e for e in ENDPOINTS if e != "/conditions" or self._conditions is not None]
        return HTTPStatus.NOT_FOUND, f"not found: try {', '.join(endpoints)}\n".encode(), TEXT


# ---- helpers ---------------------------------------------------------------------------------


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """One listening socket for ``host`` (a name or an IPv4/IPv6 literal; "" or "::" = all)."""
    family, _, _, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    dualstack = host == "::" and socket.has_dualstack_ipv6()
    sock = socket.create_server(addr, family=family, backlog=backlog, dualstack_ipv6=dualstack)
    sock.setblocking(False)
    return sock


async def _read_head(reader: asyncio.StreamReader) -> bytes | _BadRequest:
    """Bytes up to the blank line ending the request head (CRLF or bare LF), or why not."""
    buf = b""
    while True:
        chunk = await reader.read(MAX_HEAD)
        if not chunk:
            raise asyncio.IncompleteReadError(buf, None)
        buf += chunk
        for sep in (b"\r\n\r\n", b"\n\n"):
            end = buf.find(sep)
            if 0 <= end <= MAX_HEAD:
                return buf[:end]
        if len(buf) > MAX_HEAD:
            return _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_HEAD} bytes")


def _parse(head: bytes) -> tuple[str, str, bool]:
    """``(method, path, accepts gzip)`` from a request head."""
    request_line, *header_lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "bad request line")
    method, target, _ = parts
    path = urlsplit(target).path or "/"
    accept_gzip = False
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "bad header line")
        if name.strip().lower() == "accept-encoding":
            accept_gzip = accept_gzip or _accepts_gzip(value)
    return method, path, accept_gzip


def _accepts_gzip(value: str) -> bool:
    for item in value.split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() in ("gzip", "x-gzip"):
            q = params.strip().lower()
            return not (q.startswith("q=") and q[2:].strip().rstrip("0").rstrip(".") in ("", "0"))
    return False


def _response(
    status: HTTPStatus, body: bytes, ctype: str, gzip_ok: bool, *, head_only: bool = False, allow: bool = False
) -> bytes:
    headers = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Type: {ctype}", "Connection: close"]
    if gzip_ok and len(body) >= GZIP_MIN:
        body = gzip.compress(body, compresslevel=1, mtime=0)
        headers += ["Content-Encoding: gzip", "Vary: Accept-Encoding"]
    if allow:
        headers.append("Allow: GET, HEAD")
    headers.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def _json(body: Any, *, indent: int | None = None) -> bytes:
    return (json.dumps(body, indent=indent, sort_keys=True) + "\n").encode()


def _close(writer: asyncio.StreamWriter) -> None:
    if writer.transport.get_write_buffer_size():  # unsent data: do not wait to flush it
        writer.transport.abort()
    else:
        writer.close()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's own complaints (e.g. accept() failing on EMFILE): one line, no traceback."""
    exc = context.get("exception")
    log.warning("http: %s%s", context.get("message", "event loop error"), f": {exc!r}" if exc else "")
