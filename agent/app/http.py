"""The agent's HTTP endpoints: ``/metrics``, ``/healthz`` (``/livez``, ``/readyz``), ``/conditions``.

``/healthz`` is a real liveness signal (node-problem-detector's always answers ok): it returns
503 with the failing components when the kmsg reader or the main loop has stalled.

The server must not be starved or exhausted by whoever can reach its port, since the same process
may cordon nodes. So it is one thread running a selector loop over non-blocking sockets, not a
thread per connection:

* every connection must deliver its whole request head (at most ``MAX_HEAD`` bytes) within
  ``request_timeout`` seconds and take its whole response within another ``request_timeout``;
  otherwise it is dropped;
* at most ``max_connections`` connections are open at once. When full, a new connection evicts the
  oldest one that is not being answered (still sending its request head, or lingering after its
  response); only when every open connection is being answered does the newcomer get a 503;
* what all connections hold together is counted and bounded (:class:`HeldBytes`): request heads at most
  ``max_held // 2`` (past it, the connection holding the largest head is dropped), responses at most
  ``max_held`` (past it, a 503 that costs nothing: a constant). A response is let go the moment the kernel
  has taken its last byte, and a closed connection keeps nothing: before, a closed connection stayed in
  the deadline heap with its whole response until its deadline, and eight scrapers in a loop held
  200 MB (issue 33);
* ``/metrics`` is rendered once for every scrape waiting (one body, shared by all of them: 500 concurrent
  scrapers hold one body, not 500), at most ``RENDER_RATE`` times a second beyond a burst of
  ``RENDER_BURST`` (:class:`RenderBudget`); a scrape past that waits for the next render. A scrape is never
  answered with a body rendered before its request came in: the render's catch-up with the kernel log
  (:class:`agent.core.bus.CaughtUp`) still covers every line logged before the request;
* one request per connection (``Connection: close``), GET and HEAD only;
* a client hanging up at any point is logged at debug level; a failing callback gives a 500 and
  one log line. Nothing a client does produces a traceback.

Response bodies are computed in the loop thread: the callbacks and the registry's text exposition
(``agent.app.exposition``) are pure-Python work, which a thread pool would not parallelise (the GIL).
A callback that blocks stalls the loop; ``healthy()`` then turns false.

Why a selector loop and not asyncio: a scrape's work is a few system calls and a render, and asyncio's
streams, tasks and transports around them were most of the CPU a scrape took (about 0.6 of 0.9 ms),
all of it holding the interpreter lock the kernel log reader and the main loop wait for: the finding of
a kernel line reached ``/metrics`` later than node-problem-detector's (issue 16).
"""

from __future__ import annotations

import contextlib
import enum
import gzip
import heapq
import itertools
import json
import logging
import math
import selectors
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
LINGER = 1.0  # seconds to wait for a client to hang up after its response (see _Conn)
LINGER_BYTES = 65536  # ... and how much of what it still sends meanwhile to read and discard
ACCEPT_BATCH = 128  # connections accepted per wakeup at most (then the open ones get their turn)
ACCEPT_RETRY = 1.0  # seconds to stop accepting after accept() failed for want of resources (EMFILE, ...)
MAX_HELD = 4 << 20  # bytes of responses all connections may hold together (request heads: half of it more)
RESERVE = 256 << 10  # of MAX_HELD, kept for /healthz and /conditions: a scrape is refused before they are
RENDER_BURST = 50  # /metrics renders that may follow each other at once...
RENDER_RATE = 200.0  # ... and per second beyond that (a back-to-back scraper waits at most 5 ms more)
COMPACT_AT = 256  # stale deadline heap entries that may wait for their time; past it (and past half) it is rebuilt
ENDPOINTS = ("/metrics", "/healthz", "/livez", "/readyz", "/conditions")
HEALTH_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
_NOTHING = memoryview(b"")
_LISTENER = "listener"  # selector keys' data besides connections
_WAKE = "wake"


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class HeldBytes:
    """The bytes all connections hold together: what each took is given back exactly once. Not thread-safe
    (the loop thread's)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once since started

    def take(self, size: int, *, leave: int = 0) -> bool:
        """Count ``size`` bytes more if that leaves at least ``leave`` of the limit; False (nothing counted)
        otherwise."""
        if self.held + size > self.limit - leave:
            return False
        self.held += size
        self.peak = max(self.peak, self.held)
        return True

    def give_back(self, size: int) -> None:
        self.held -= size
        assert self.held >= 0, "gave back more than was taken"


class RenderBudget:
    """A token bucket for ``/metrics`` renders: ``burst`` at once, ``rate`` a second after that."""

    def __init__(self, *, burst: int, rate: float, now: float) -> None:
        if burst < 1 or rate <= 0:
            raise ValueError("burst and rate must be positive")
        self._burst = float(burst)
        self._rate = rate
        self._tokens = float(burst)
        self._at = now

    def take(self, now: float) -> bool:
        """Whether a render may happen at ``now`` (and if so, it is counted)."""
        self._refill(now)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def next_at(self, now: float) -> float:
        """When the next render may happen (``now`` if it may now)."""
        self._refill(now)
        return now if self._tokens >= 1 else now + (1 - self._tokens) / self._rate

    def _refill(self, now: float) -> None:
        self._tokens = min(self._burst, self._tokens + max(0.0, now - self._at) * self._rate)
        self._at = max(self._at, now)


class _Buffer:
    """A response some connections send: counted in :class:`HeldBytes` while one of them holds it."""

    __slots__ = ("data", "size", "users")

    def __init__(self, data: bytes, *, counted: bool = True) -> None:
        self.data = data
        self.size = len(data) if counted else 0  # a constant is held by the module, not by connections
        self.users = 0


class _Phase(enum.Enum):
    HEAD = "reading the request head"
    SCRAPE = "waiting for the metrics render"
    ANSWER = "taking the response"
    LINGER = "lingering"  # half-closed after the response: what the client still sends is read and discarded


class _Conn:
    """One open connection and where it stands. Lingering matters: closing a socket with unread input
    makes the kernel send a reset, which can destroy the response before the client reads it (an early
    405, 431 or 503, or a request sent twice)."""

    __slots__ = ("sock", "peer", "shed", "phase", "head", "out", "buffer", "deadline", "discarded", "closed", "want")

    def __init__(self, sock: socket.socket, peer: str, *, shed: bool) -> None:
        self.sock = sock
        self.peer = peer
        self.shed = shed  # told 503 without its request being read
        self.phase = _Phase.HEAD
        self.head = b""  # the request head received so far
        self.out = _NOTHING  # the response not yet handed to the kernel
        self.buffer: _Buffer | None = None  # the response it holds (until the kernel has taken all of it)
        self.want: tuple[bool, bool] = (False, False)  # a waiting scrape's (gzip, head only)
        self.deadline = math.inf
        self.discarded = 0
        self.closed = False


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
        max_held: int = MAX_HELD,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic`` times the looks at the loop (see :meth:`healthy`); connections' deadlines and the
        render budget are always on ``time.monotonic``. ``max_held``: see the module docstring."""
        if request_timeout <= 0 or max_connections < 1 or backlog < 1 or max_held <= RESERVE:
            raise ValueError("request_timeout, max_connections and backlog must be positive, max_held over RESERVE")
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
        self._stopping = threading.Event()
        self._waker: socket.socket | None = None  # written to wake the loop (stop, a look)
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        # Open connections, oldest first, each mapped to whether it may be evicted to make room for a new
        # one: True while it sends its request head or lingers after its response, False while answered.
        self._conns: dict[_Conn, bool] = {}
        self._shedding: set[_Conn] = set()  # connections being told 503
        self._deadlines: list[tuple[float, int, _Conn]] = []  # a heap; entries of closed or moved deadlines are skipped
        self._order = itertools.count()
        self._accept_again_at: float | None = None  # accepting paused (accept() failed for want of resources)
        self._stale = 0  # entries in the deadline heap for closed connections or moved deadlines
        self._held = HeldBytes(max_held)  # responses held (see _Buffer)
        self._heads = HeldBytes(max_held // 2)  # request heads held
        self._scrapes: dict[_Conn, None] = {}  # /metrics requests waiting for the next render, oldest first
        self._renders = RenderBudget(burst=RENDER_BURST, rate=RENDER_RATE, now=time.monotonic())
        self._last_render = 0  # the last render's size, to refuse a scrape before rendering past the bound
        self.rendered = 0  # renders so far

    @property
    def held_bytes(self) -> int:
        """Bytes of request heads and responses all connections hold now (the loop's own count)."""
        return self._held.held + self._heads.held

    @property
    def peak_held_bytes(self) -> tuple[int, int]:
        """The most bytes of responses, and of request heads, held at once so far."""
        return self._held.peak, self._heads.peak

    @property
    def held_limits(self) -> tuple[int, int]:
        """The bounds of those two."""
        return self._held.limit, self._heads.limit

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
        thread = self._thread
        if thread is not None:  # started: stop for good (before start, there is nothing to stop)
            self._stopping.set()
            self._wake()
            thread.join(timeout)
            if thread.is_alive():
                log.warning("http: server thread did not stop within %.1fs", timeout)
        if self._sock is not None:
            self._sock.close()

    def healthy(self, now: float) -> bool:
        """True while the serving thread is alive, not stopping, and its loop answers: asked from another
        thread, a look is posted to the loop, and a look unanswered for ``STALL`` seconds is a stalled loop.
        Asked from the loop itself (``/healthz``), it plainly turns. An idle loop is not woken by a
        heartbeat (each wakeup is idle CPU, issue 16); it is looked at when someone asks, and at most once
        per ``LOOK_EVERY`` seconds: the main loop asks at every publication, hundreds a second under a
        flood of kernel lines, and each look costs a wakeup of this thread and hands the interpreter lock
        to another thread in the middle of the main loop's step.

        ``now`` (the supervisor's clock) is not used: the looks are timed on ``monotonic``.
        """
        thread = self._thread
        if thread is None or not thread.is_alive() or self._stopping.is_set() or self._waker is None:
            return False
        if threading.get_ident() == thread.ident:
            return True
        asked, now = self._asked, self._monotonic()
        if asked is not None:
            return now - asked < STALL
        if now - self._answered_at < LOOK_EVERY:
            return True
        self._asked = now  # before the wakeup: the loop answers what it finds asked once awake
        self._wake()
        return True

    def _wake(self) -> None:
        waker = self._waker
        if waker is not None:
            with contextlib.suppress(OSError):  # full (a wakeup is pending anyway) or closed (the loop ended)
                waker.send(b"\0")

    # ---- the loop thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            selector = selectors.DefaultSelector()
            wake_r, self._waker = socket.socketpair()
        except BaseException as exc:  # reported to start()
            self._startup_error = exc
            self._ready.set()
            return
        try:
            for sock in (wake_r, self._waker):
                sock.setblocking(False)
            assert self._sock is not None
            selector.register(self._sock, selectors.EVENT_READ, _LISTENER)
            selector.register(wake_r, selectors.EVENT_READ, _WAKE)
            self._ready.set()
            self._serve(selector, wake_r)
        except BaseException as exc:  # reported to start(), or logged if serving dies later
            if not self._ready.is_set():
                self._startup_error = exc
            else:
                log.error("http: server loop failed: %r", exc)
        finally:
            self._ready.set()
            for conn in [*self._conns, *self._shedding]:
                self._close(selector, conn)
            self._deadlines.clear()
            selector.close()
            waker, self._waker = self._waker, None
            for sock in (wake_r, waker):
                if sock is not None:
                    sock.close()

    def _serve(self, selector: selectors.BaseSelector, wake_r: socket.socket) -> None:
        while not self._stopping.is_set():
            for key, mask in selector.select(self._next_wait()):
                if key.data is _LISTENER:
                    self._accept(selector)
                elif key.data is _WAKE:
                    with contextlib.suppress(BlockingIOError):
                        while wake_r.recv(4096):
                            pass
                elif not key.data.closed:  # not closed by an earlier event of this round (evicted)
                    self._ready_conn(selector, key.data, mask)
            if self._scrapes:
                self._render_for_scrapes(selector)
            if self._asked is not None:  # the loop turns: answer a look
                self._answered_at, self._asked = self._monotonic(), None
            self._expire(selector)

    def _next_wait(self) -> float | None:
        """Seconds until the next deadline, the end of an accept pause or the next render that scrapes wait
        for; None: none (an idle loop sleeps)."""
        heap = self._deadlines
        while heap and not _live(heap[0]):
            heapq.heappop(heap)
            self._stale -= 1
        now = time.monotonic()
        render = self._renders.next_at(now) if self._scrapes else None
        due = [d for d in (heap[0][0] if heap else None, self._accept_again_at, render) if d is not None]
        return max(0.0, min(due) - now) if due else None

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        if self._accept_again_at is not None and now >= self._accept_again_at:
            self._accept_again_at = None
            assert self._sock is not None
            selector.register(self._sock, selectors.EVENT_READ, _LISTENER)
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            conn = entry[2]
            if not _live(entry):
                self._stale -= 1
                continue
            if conn.phase is not _Phase.LINGER:
                log.debug("http: %s timed out %s", conn.peer, conn.phase.value)
            conn.deadline = math.inf  # its entry is gone from the heap
            self._close(selector, conn)

    def _accept(self, selector: selectors.BaseSelector) -> None:
        assert self._sock is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up while queued
                continue
            except OSError as exc:  # out of file descriptors or memory: pause rather than spin on it
                log.warning("http: cannot accept connections (%s); trying again in %g s", exc, ACCEPT_RETRY)
                selector.unregister(self._sock)
                self._accept_again_at = time.monotonic() + ACCEPT_RETRY
                return
            try:
                sock.setblocking(False)
                self._admit(selector, sock, _peer(addr))
            except Exception as exc:  # the selector refused it (out of memory): that client, not the loop
                log.warning("http: cannot take a connection from %s: %r", _peer(addr), exc)
                sock.close()

    def _admit(self, selector: selectors.BaseSelector, sock: socket.socket, peer: str) -> None:
        shed = len(self._conns) >= self._max_connections and not self._evict_one(selector)
        if shed and len(self._shedding) >= self._max_connections:
            sock.close()
            return
        conn = _Conn(sock, peer, shed=shed)
        selector.register(sock, selectors.EVENT_READ, conn)
        if shed:  # every open connection is being answered: 503 without reading the request
            log.debug("http: connection limit reached, shedding %s", peer)
            self._shedding.add(conn)
            self._guarded(selector, conn, lambda: self._answer(selector, conn, _TOO_MANY))
            return
        self._conns[conn] = True
        self._set_deadline(conn, time.monotonic() + self._timeout)
        self._ready_conn(selector, conn, selectors.EVENT_READ)  # the request head has often arrived already

    def _evict_one(self, selector: selectors.BaseSelector) -> bool:
        """Make room by dropping the oldest connection that is not being answered, if there is one."""
        idle = next((conn for conn, evictable in self._conns.items() if evictable), None)
        if idle is None:
            return False
        log.debug("http: connection limit reached, dropping the slowest client %s", idle.peer)
        self._close(selector, idle)
        return True

    def _ready_conn(self, selector: selectors.BaseSelector, conn: _Conn, mask: int) -> None:
        """What a connection's readiness means in its phase."""
        if conn.phase is _Phase.ANSWER:
            if mask & selectors.EVENT_WRITE:
                self._guarded(selector, conn, lambda: self._send(selector, conn))
        elif conn.phase is _Phase.SCRAPE:
            pass  # not registered while it waits: a client that half-closed after its request still gets it
        elif conn.phase is _Phase.HEAD:
            self._guarded(selector, conn, lambda: self._read_head(selector, conn))
        else:
            self._guarded(selector, conn, lambda: self._discard(selector, conn))

    def _guarded(self, selector: selectors.BaseSelector, conn: _Conn, step: Callable[[], None]) -> None:
        """``step`` on ``conn``: a client going away closes it (debug), and nothing a client does escapes as an
        exception or a traceback."""
        try:
            step()
        except OSError as exc:
            log.debug("http: %s went away %s: %r", conn.peer, conn.phase.value, exc)
            self._close(selector, conn)
        except Exception as exc:  # a bug here must not leave a traceback per client, nor kill the loop
            log.warning("http: error on a connection from %s: %r", conn.peer, exc)
            self._close(selector, conn)

    def _read_head(self, selector: selectors.BaseSelector, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(MAX_HEAD + 1 - len(conn.head))
        except (BlockingIOError, InterruptedError):
            return
        if not chunk:
            log.debug("http: %s went away %s", conn.peer, conn.phase.value)
            self._close(selector, conn)
            return
        if not self._heads.take(len(chunk)):
            self._drop_largest_head(selector, conn, len(chunk))
            if conn.closed:
                return
        conn.head += chunk
        head = _head(conn.head)
        if head is None:
            return
        self._heads.give_back(len(conn.head))
        conn.head = b""
        self._conns[conn] = False
        scrape = _scrape(head)
        if scrape is None:
            self._answer(selector, conn, _Buffer(self._respond(head)))
            return
        conn.phase, conn.want = _Phase.SCRAPE, scrape  # answered at the end of this round (one render for all)
        selector.unregister(conn.sock)
        self._scrapes[conn] = None
        self._set_deadline(conn, time.monotonic() + self._timeout)

    def _drop_largest_head(self, selector: selectors.BaseSelector, conn: _Conn, size: int) -> None:
        """Request heads hold their bound: drop the connection holding the largest head (a slow client's; a
        scraper's request is a few hundred bytes) until ``size`` more bytes fit for ``conn`` (which may be
        the one dropped)."""
        while not self._heads.take(size):
            largest = max((c for c in self._conns if c.phase is _Phase.HEAD), key=lambda c: len(c.head))
            if len(largest.head) < len(conn.head) + size:
                largest = conn
            log.debug("http: request heads at their bound, dropping %s", largest.peer)
            self._close(selector, largest)
            if largest is conn:
                return

    def _render_for_scrapes(self, selector: selectors.BaseSelector) -> None:
        """Answer every waiting scrape from one render, if the render budget allows one now; each of them was
        received before the render began (this round or an earlier one)."""
        if not self._renders.take(time.monotonic()):
            return  # the next render's time is in _next_wait
        waiting, self._scrapes = list(self._scrapes), {}
        if not self._held.take(self._last_render, leave=RESERVE):
            log.debug("http: responses at their bound, refusing %d scrapes", len(waiting))
            for conn in waiting:
                self._scraped(selector, conn, _HELD_FULL)
            return
        self._held.give_back(self._last_render)
        self.rendered += 1
        status, body, ctype = self._endpoint_or_500("/metrics")
        self._last_render = len(body)
        plain = _Buffer(_response(status, body, ctype, False))
        zipped: _Buffer | None = None
        for conn in waiting:
            gzip_ok, head_only = conn.want
            if head_only:
                self._scraped(selector, conn, _Buffer(_response(status, body, ctype, gzip_ok, head_only=True)))
            elif gzip_ok and status == HTTPStatus.OK:
                if zipped is None:
                    zipped = _Buffer(_response(status, body, ctype, True))
                self._scraped(selector, conn, zipped)
            else:
                self._scraped(selector, conn, plain)

    def _scraped(self, selector: selectors.BaseSelector, conn: _Conn, buffer: _Buffer) -> None:
        if conn.closed:
            return

        def answer() -> None:
            selector.register(conn.sock, selectors.EVENT_READ, conn)
            self._answer(selector, conn, buffer, leave=RESERVE)

        self._guarded(selector, conn, answer)

    def _answer(self, selector: selectors.BaseSelector, conn: _Conn, buffer: _Buffer, *, leave: int = 0) -> None:
        """Hand ``buffer`` to the kernel within ``request_timeout`` (so nothing is left to flush on close); a
        response that would take what connections hold past its bound (less ``leave``) is a 503 instead. A
        shared buffer is counted once, with its first user."""
        if buffer.users == 0 and not self._held.take(buffer.size, leave=leave):
            log.debug("http: responses at their bound, refusing %s", conn.peer)
            buffer = _HELD_FULL
        buffer.users += 1
        conn.buffer, conn.phase, conn.out = buffer, _Phase.ANSWER, memoryview(buffer.data)
        self._set_deadline(conn, time.monotonic() + self._timeout)
        self._send(selector, conn)

    def _let_go(self, conn: _Conn) -> None:
        """``conn`` no longer holds its response (sent, or the connection closed)."""
        buffer, conn.buffer, conn.out = conn.buffer, None, _NOTHING
        if buffer is not None:
            buffer.users -= 1
            if buffer.users == 0:
                self._held.give_back(buffer.size)

    def _send(self, selector: selectors.BaseSelector, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        conn.out = conn.out[sent:]
        if conn.out:
            selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        self._let_go(conn)
        conn.sock.shutdown(socket.SHUT_WR)
        conn.phase = _Phase.LINGER
        if not conn.shed:
            self._conns[conn] = True
        if selector.get_key(conn.sock).events != selectors.EVENT_READ:  # it waited to write: read again
            selector.modify(conn.sock, selectors.EVENT_READ, conn)
        self._set_deadline(conn, time.monotonic() + min(LINGER, self._timeout))

    def _discard(self, selector: selectors.BaseSelector, conn: _Conn) -> None:
        """Lingering: read what the client still sends until it hangs up (or sent too much)."""
        try:
            chunk = conn.sock.recv(MAX_HEAD)
        except (BlockingIOError, InterruptedError):
            return
        conn.discarded += len(chunk)
        if not chunk or conn.discarded > LINGER_BYTES:
            self._close(selector, conn)

    def _set_deadline(self, conn: _Conn, deadline: float) -> None:
        if conn.deadline != math.inf:
            self._stale_entry()  # its earlier deadline's entry
        conn.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, next(self._order), conn))

    def _stale_entry(self) -> None:
        """One more heap entry stands for nothing; past ``COMPACT_AT`` and half the heap, the heap is rebuilt
        without them (a closed connection's entry would keep it until its deadline)."""
        self._stale += 1
        if self._stale > COMPACT_AT and 2 * self._stale > len(self._deadlines):
            self._deadlines = [entry for entry in self._deadlines if _live(entry)]
            heapq.heapify(self._deadlines)
            self._stale = 0

    def _close(self, selector: selectors.BaseSelector, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._let_go(conn)
        self._heads.give_back(len(conn.head))
        conn.head = b""
        self._conns.pop(conn, None)
        self._shedding.discard(conn)
        self._scrapes.pop(conn, None)
        if conn.deadline != math.inf:
            self._stale_entry()
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn.sock)
        conn.sock.close()

    # ---- responses ----------------------------------------------------------------------------

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
        status, body, ctype = self._endpoint_or_500(path)
        return _response(status, body, ctype, accept_gzip and status == HTTPStatus.OK, head_only=method == "HEAD")

    def _endpoint_or_500(self, path: str) -> tuple[HTTPStatus, bytes, str]:
        try:
            return self._endpoint(path)
        except Exception as exc:  # a failing callback must never take the agent down
            log.error("http: error serving %s: %s: %s", path, type(exc).__name__, exc)
            log.debug("http: error serving %s", path, exc_info=True)
            return HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", TEXT

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


def _head(buf: bytes) -> bytes | _BadRequest | None:
    """The request head (bytes up to the blank line ending it, CRLF or bare LF), why there is none, or
    None while it may still come."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        end = buf.find(sep)
        if 0 <= end <= MAX_HEAD:
            return buf[:end]
    if len(buf) > MAX_HEAD:
        return _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_HEAD} bytes")
    return None


def _live(entry: tuple[float, int, _Conn]) -> bool:
    """Whether a deadline heap entry still stands: its connection open, its deadline not moved since."""
    return not entry[2].closed and entry[2].deadline == entry[0]


def _scrape(head: bytes | _BadRequest) -> tuple[bool, bool] | None:
    """``(accepts gzip, head only)`` when ``head`` asks for ``/metrics`` with GET or HEAD; else None."""
    if isinstance(head, _BadRequest):
        return None
    try:
        method, path, accept_gzip = _parse(head)
    except _BadRequest:
        return None
    return (accept_gzip, method == "HEAD") if path == "/metrics" and method in ("GET", "HEAD") else None


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)


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


_TOO_MANY = _Buffer(_response(HTTPStatus.SERVICE_UNAVAILABLE, b"too many connections\n", TEXT, False), counted=False)
_HELD_FULL = _Buffer(
    _response(HTTPStatus.SERVICE_UNAVAILABLE, b"busy: too many responses in flight\n", TEXT, False), counted=False
)
