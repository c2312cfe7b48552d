"""The HTTP endpoints against a real server on a loopback port, spoken to over raw sockets.

Covers the endpoints themselves and the server's resistance to clients that are many, slow, rude
or broken. Every wait is bounded; no assertion depends on how fast the machine is.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import resource
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge

from agent.app.http import LOOK_EVERY, RESERVE, AgentHTTPServer, HeldBytes, RenderBudget

from helpers.threads import wakeups_while_asleep

HOST = "127.0.0.1"
WAIT = 15.0  # upper bound for anything that should happen "soon"; a generous one on a shared machine
CONDITIONS = [{"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock"}]
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
BIG = 256 << 20  # a bound on held responses that lets the huge /conditions documents below through
HEALTH_BODY = {"status": "ok", "components": {"kmsg_reader": True, "main_loop": True}}


# --------------------------------------------------------------------------------------------------
# Helpers


class Fake:
    """What the server calls back; tests flip these."""

    def __init__(self) -> None:
        self.ok = True
        self.conditions: Any = CONDITIONS
        self.fail: Exception | None = None

    def health(self) -> tuple[bool, dict]:
        if self.fail is not None:
            raise self.fail
        return self.ok, HEALTH_BODY if self.ok else {"status": "unhealthy", "components": {"main_loop": False}}

    def conditions_document(self) -> Any:
        if self.fail is not None:
            raise self.fail
        return self.conditions


def make_registry(series: int = 1) -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("test_scrapes", "A counter.", registry=registry).inc()
    gauge = Gauge("test_series", "Many series, to make the body worth compressing.", ["n"], registry=registry)
    for n in range(series):
        gauge.labels(n=str(n)).set(n)
    return registry


@contextlib.contextmanager
def serving(
    fake: Fake | None = None, *, host: str = HOST, series: int = 1, registry: CollectorRegistry | None = None, **kw: Any
) -> Iterator[AgentHTTPServer]:
    fake = fake or Fake()
    server = AgentHTTPServer(
        host=host,
        port=0,
        registry=registry or make_registry(series),
        health=fake.health,
        conditions=fake.conditions_document,
        **kw,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Response:
    def __init__(self, raw: bytes) -> None:
        head, sep, self.body = raw.partition(b"\r\n\r\n")
        assert sep, f"no complete response head in {raw[:200]!r}"
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}

    def json(self) -> Any:
        return json.loads(self.body)


def connect(port: int, host: str = HOST, *, timeout: float = WAIT, rcvbuf: int | None = None) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    if rcvbuf is not None:  # before connect, so the window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, port))
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def exchange(port: int, raw: bytes, host: str = HOST) -> Response:
    with connect(port, host) as sock:
        sock.sendall(raw)
        return Response(read_all(sock))


def get(port: int, path: str, *, method: str = "GET", headers: str = "", host: str = HOST) -> Response:
    return exchange(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode(), host)


def read_until_closed(sock: socket.socket) -> bytes:
    """What arrives before the server closes or resets the connection."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def reads_eof(sock: socket.socket) -> bool:
    """True once the server has closed (or reset) this connection; waits at most the socket timeout."""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def select_readable(sock: socket.socket) -> bool:
    """Whether a read would not block now (data, an end or a reset waiting)."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return bool(selector.select(0))


def rst_close(sock: socket.socket) -> None:
    """Close with a TCP reset rather than a FIN: the rudest way to hang up."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def need_fds(n: int) -> None:
    """Raise the soft fd limit toward the hard one; skip if that still leaves fewer than ``n``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n:
        target = hard if hard == resource.RLIM_INFINITY else min(hard, max(n, 4096))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < n:
        pytest.skip(f"needs {n} file descriptors, RLIMIT_NOFILE allows {soft}")


def wait_for(predicate: Callable[[], object], *, timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log records a client must never be able to cause: warnings, errors, tracebacks."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


@pytest.fixture
def fake() -> Fake:
    return Fake()


@pytest.fixture
def server(fake: Fake) -> Iterator[AgentHTTPServer]:
    with serving(fake) as srv:
        yield srv


# --------------------------------------------------------------------------------------------------
# Endpoints


@pytest.mark.parametrize(
    ("request_text", "status", "content_type", "check"),
    [
        ("GET /metrics HTTP/1.1", 200, CONTENT_TYPE_LATEST, lambda r: b"test_scrapes_total 1.0" in r.body),
        ("GET /metrics?name[]=x HTTP/1.0", 200, CONTENT_TYPE_LATEST, lambda r: b"test_scrapes" in r.body),
        ("GET http://node:20257/metrics HTTP/1.1", 200, CONTENT_TYPE_LATEST, lambda r: b"test_scrapes" in r.body),
        ("GET /healthz HTTP/1.1", 200, JSON, lambda r: r.json() == HEALTH_BODY),
        ("GET /livez HTTP/1.1", 200, JSON, lambda r: r.json() == HEALTH_BODY),
        ("GET /readyz HTTP/1.1", 200, JSON, lambda r: r.json() == HEALTH_BODY),
        ("GET /conditions HTTP/1.1", 200, JSON, lambda r: r.json() == CONDITIONS),
        ("GET / HTTP/1.1", 404, TEXT, lambda r: all(p in r.body for p in (b"/metrics", b"/healthz", b"/conditions"))),
        ("GET /metricsx HTTP/1.1", 404, TEXT, lambda r: b"/metrics" in r.body),
        ("POST /metrics HTTP/1.1", 405, TEXT, lambda r: r.headers["allow"] == "GET, HEAD"),
        ("DELETE /conditions HTTP/1.1", 405, TEXT, lambda r: r.headers["allow"] == "GET, HEAD"),
        (
            "HEAD /metrics HTTP/1.1",
            200,
            CONTENT_TYPE_LATEST,
            lambda r: r.body == b"" and int(r.headers["content-length"]) > 0,
        ),
        ("HEAD /healthz HTTP/1.1", 200, JSON, lambda r: r.body == b""),
        ("HEAD /nope HTTP/1.1", 404, TEXT, lambda r: r.body == b""),
        ("hello there", 400, TEXT, lambda r: True),
        ("GET /metrics", 400, TEXT, lambda r: True),
        ("GET /metrics SPDY/3", 400, TEXT, lambda r: True),
        ("GET /metrics HTTP/1.1\r\nno colon here", 400, TEXT, lambda r: True),
    ],
)
def test_endpoints(server: AgentHTTPServer, request_text: str, status: int, content_type: str, check: Callable) -> None:
    response = exchange(server.port, f"{request_text}\r\nHost: x\r\n\r\n".encode())
    assert response.status == status
    assert response.headers["content-type"] == content_type
    assert response.headers["connection"] == "close"
    if not request_text.startswith("HEAD"):
        assert int(response.headers["content-length"]) == len(response.body)
    assert check(response), response.body


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/conditions", 404, b"--serve-conditions true"),
        ("/", 404, b"not found: try /metrics, /healthz, /livez, /readyz\n"),
        ("/metrics", 200, b"test_scrapes_total"),
        ("/healthz", 200, b"ok"),
    ],
)
def test_conditions_can_be_off(fake: Fake, path: str, status: int, says: bytes) -> None:
    """Without a conditions callback (Kubernetes mode's default) /conditions answers 404 and is not offered."""
    server = AgentHTTPServer(host=HOST, port=0, registry=make_registry(), health=fake.health, conditions=None)
    server.start()
    try:
        response = get(server.port, path)
    finally:
        server.stop()
    assert response.status == status
    assert says in response.body, response.body


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/readyz"])
def test_unhealthy_is_503_with_the_body(server: AgentHTTPServer, fake: Fake, path: str) -> None:
    fake.ok = False
    response = get(server.port, path)
    assert response.status == 503
    assert response.headers["content-type"] == JSON
    assert response.json() == {"status": "unhealthy", "components": {"main_loop": False}}


def test_head_has_the_headers_of_get(server: AgentHTTPServer) -> None:
    for path in ("/metrics", "/healthz", "/conditions"):
        got, head = get(server.port, path), get(server.port, path, method="HEAD")
        assert (head.status, head.body) == (got.status, b"")
        assert head.headers == got.headers


def test_bare_lf_request(server: AgentHTTPServer) -> None:
    response = exchange(server.port, b"GET /healthz HTTP/1.0\n\n")
    assert (response.status, response.json()) == (200, HEALTH_BODY)


def test_oversized_request_head_is_431(server: AgentHTTPServer) -> None:
    response = exchange(server.port, b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"a" * 20_000 + b"\r\n\r\n")
    assert response.status == 431


def test_early_answer_survives_the_rest_of_the_request(server: AgentHTTPServer) -> None:
    """The server answers a POST at its head; the body that follows must not turn into a reset."""
    with connect(server.port) as sock:
        sock.sendall(b"POST /conditions HTTP/1.1\r\nContent-Length: 30000\r\n\r\n" + b"x" * 20000)
        time.sleep(0.05)  # the server answers while the first part of the body is still unread
        with contextlib.suppress(OSError):
            sock.sendall(b"x" * 10000)
        response = Response(read_all(sock))
    assert response.status == 405


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("gzip", True),
        ("deflate, gzip;q=0.5", True),
        ("GZIP", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("br", False),
        (None, False),
    ],
)
def test_metrics_gzip(fake: Fake, accept_encoding: str | None, gzipped: bool) -> None:
    with serving(fake, series=200) as server:
        plain = get(server.port, "/metrics")
        headers = f"Accept-Encoding: {accept_encoding}\r\n" if accept_encoding is not None else ""
        response = get(server.port, "/metrics", headers=headers)
    assert response.status == 200
    assert response.headers.get("content-encoding") == ("gzip" if gzipped else None)
    assert (gzip.decompress(response.body) if gzipped else response.body) == plain.body
    if gzipped:
        assert len(response.body) < len(plain.body)


def test_small_bodies_are_not_gzipped(server: AgentHTTPServer) -> None:
    response = get(server.port, "/healthz", headers="Accept-Encoding: gzip\r\n")
    assert "content-encoding" not in response.headers
    assert response.json() == HEALTH_BODY


def test_ipv6_literal(fake: Fake) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        ctx = serving(fake, host="::1")
        server = ctx.__enter__()
    except OSError as exc:
        pytest.skip(f"cannot listen on ::1: {exc}")
    try:
        assert get(server.port, "/healthz", host="::1").json() == HEALTH_BODY
    finally:
        ctx.__exit__(None, None, None)


# --------------------------------------------------------------------------------------------------
# Many, slow, rude and broken clients


def test_500_concurrent_scrapes_all_succeed(server: AgentHTTPServer) -> None:
    n = 500
    need_fds(2 * n + 100)
    socks: list[socket.socket] = []
    try:
        for _ in range(n):  # every request is sent before any response is read
            sock = connect(server.port)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(sock)
        responses = [Response(read_all(sock)) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert [r.status for r in responses] == [200] * n
    assert all(b"test_scrapes_total" in r.body for r in responses)


def test_half_sent_requests_neither_starve_nor_pin_threads(fake: Fake) -> None:
    n = 300
    need_fds(2 * n + 100)
    with serving(fake, request_timeout=0.5) as server:
        before = threading.active_count()
        socks: list[socket.socket] = []
        try:
            for _ in range(n):
                sock = connect(server.port)
                sock.sendall(b"GET /metr")  # ...and then nothing
                socks.append(sock)
            during = threading.active_count()
            assert get(server.port, "/metrics").status == 200  # served meanwhile
            # After request_timeout the server hangs up on every one of them.
            assert all(reads_eof(sock) for sock in socks)
        finally:
            for sock in socks:
                sock.close()
        assert during - before < 5, f"{during - before} more threads for {n} connections"
        assert get(server.port, "/healthz").status == 200


def test_full_server_evicts_the_slowest_client(fake: Fake) -> None:
    with serving(fake, max_connections=10, request_timeout=60) as server:
        idle = [connect(server.port) for _ in range(10)]
        try:
            for sock in idle:
                sock.sendall(b"GET /")
            # Let the server accept all ten before the scrape arrives (else the scrape is older).
            wait_for(lambda: len(server._conns) == 10, what="ten accepted connections")
            assert get(server.port, "/metrics").status == 200
            assert reads_eof(idle[0])  # the oldest idle connection made room, long before the 60 s timeout
        finally:
            for sock in idle:
                sock.close()


@pytest.mark.slow  # over 2 s: the full suite runs it, the fast lane does not
def test_full_server_of_busy_connections_sheds_with_503(fake: Fake) -> None:
    fake.conditions = ["x" * (32 << 20)]  # far more than the socket buffers of a client that reads nothing
    with serving(fake, max_connections=2, request_timeout=2.0, max_held=BIG) as server:
        busy = [connect(server.port, rcvbuf=4096) for _ in range(2)]
        try:
            for sock in busy:
                sock.sendall(b"GET /conditions HTTP/1.1\r\n\r\n")
            wait_for(lambda: len(server._conns) == 2 and not any(server._conns.values()), what="two busy answers")
            response = get(server.port, "/healthz")
            assert response.status == 503
            assert response.body == b"too many connections\n"
            # A client that does not read its response is dropped after request_timeout, freeing its slot...
            wait_for(lambda: not server._conns, what="busy connections to be dropped")
            assert get(server.port, "/healthz").status == 200
            # ...without the rest of its response.
            assert all(len(read_until_closed(sock)) < (32 << 20) for sock in busy)
        finally:
            for sock in busy:
                sock.close()


def test_a_shed_client_that_reset_is_quietly_forgotten(fake: Fake, caplog: pytest.LogCaptureFixture) -> None:
    """Over the limit, a newcomer is told 503 at once; one that has already reset its connection makes that
    answer fail, which is the client going away (debug), not the server's trouble, and leaves nothing open."""
    caplog.set_level(logging.DEBUG)
    release = threading.Event()
    fake.conditions_document = lambda: release.wait(WAIT) and ["x" * (32 << 20)]  # type: ignore[method-assign]
    with serving(fake, max_connections=1, request_timeout=WAIT, max_held=BIG) as server:
        busy = connect(server.port, rcvbuf=4096)
        try:
            busy.sendall(b"GET /conditions HTTP/1.1\r\n\r\n")  # answered: the loop waits in the callback
            wait_for(lambda: server._conns and not any(server._conns.values()), what="the busy answer")
            rst_close(connect(server.port))  # queued, then reset before the loop can accept it
            release.set()
            wait_for(lambda: any("shedding" in r.getMessage() for r in caplog.records), what="the shed")
            wait_for(lambda: not server._shedding, what="the shed connection to be forgotten")
        finally:
            busy.close()
        wait_for(lambda: not server._conns, what="the busy connection to be closed")
        assert get(server.port, "/healthz").status == 200
    assert problems(caplog) == []


def rude_clients(port: int) -> None:
    """Every way a client can misbehave, each on its own connection."""
    connect(port).close()  # connects and leaves
    rst_close(connect(port))  # connects and resets
    with connect(port) as sock:  # half a request, then hangs up
        sock.sendall(b"GET /metr")
    half = connect(port)
    half.sendall(b"GET /metr")
    rst_close(half)
    for junk in (b"\x00\xff" * 300 + b"\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"\r\n\r\n"):
        with connect(port) as sock:  # garbage (the second looks like a TLS ClientHello)
            sock.sendall(junk)
            with contextlib.suppress(OSError):
                sock.recv(10)
    for close in (socket.socket.close, rst_close):  # hangs up in the middle of a large response
        sock = connect(port, rcvbuf=4096)
        sock.sendall(b"GET /conditions HTTP/1.1\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        close(sock)
    with connect(port) as sock:  # a request followed by a reset before reading
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    rst = connect(port)
    rst.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    rst_close(rst)


# --------------------------------------------------------------------------------------------------
# What connections hold (issue 33: eight scrapers in a loop held 200 MB, each closed connection its whole
# response until its deadline)


@pytest.mark.parametrize(
    ("limit", "takes", "results", "held"),
    [
        (100, [(60, 0), (40, 0)], [True, True], 100),  # up to the limit exactly
        (100, [(60, 0), (41, 0)], [True, False], 60),  # past it: refused, nothing counted
        (100, [(60, 0), (30, 20)], [True, False], 60),  # leaving 20 of it: 90 > 80
        (100, [(50, 20), (30, 20)], [True, True], 80),  # ... 80 fits
        (100, [(0, 0), (101, 0)], [True, False], 0),  # a constant costs nothing; one response over all of it
    ],
)
def test_held_bytes_count_up_to_the_limit(
    limit: int, takes: list[tuple[int, int]], results: list[bool], held: int
) -> None:
    count = HeldBytes(limit)
    assert [count.take(size, leave=leave) for size, leave in takes] == results
    assert (count.held, count.peak) == (held, held)
    count.give_back(held)
    assert (count.held, count.peak) == (0, held)


@pytest.mark.parametrize(
    ("burst", "rate", "asks", "allowed"),
    [
        (3, 10.0, [0.0, 0.0, 0.0, 0.0], [True, True, True, False]),  # the burst, then none at once
        (3, 4.0, [0.0, 0.0, 0.0, 0.125, 0.25], [True, True, True, False, True]),  # one more each 0.25 s
        (1, 4.0, [0.0, 0.25, 0.5, 0.625, 0.75], [True, True, True, False, True]),
        (2, 4.0, [0.0, 100.0, 100.0, 100.0], [True, True, True, False]),  # a long idle refills the burst only
    ],
)
def test_render_budget_is_a_burst_then_a_rate(burst: int, rate: float, asks: list[float], allowed: list[bool]) -> None:
    budget = RenderBudget(burst=burst, rate=rate, now=0.0)
    assert [budget.take(now) for now in asks] == allowed


def test_render_budget_says_when_the_next_render_may_be() -> None:
    budget = RenderBudget(burst=1, rate=4.0, now=10.0)
    assert budget.next_at(10.0) == 10.0
    assert budget.take(10.0)
    assert budget.next_at(10.0) == pytest.approx(10.25)
    assert budget.next_at(10.2) == pytest.approx(10.25)
    assert not budget.take(10.2)
    assert budget.take(10.25)


def response_bytes_in_the_deadline_heap(server: AgentHTTPServer) -> int:
    return sum(len(entry[2].out.obj) for entry in server._deadlines)


def test_a_closed_connection_holds_nothing(fake: Fake) -> None:
    """Before: behind one open connection's deadline (a client still sending its request, for up to 5 s), each
    closed scrape's connection stayed in the deadline heap with its whole response until its own deadline."""
    with serving(fake, series=3000) as server, connect(server.port) as idle:
        idle.sendall(b"GET /metr")  # its deadline is the earliest in the heap
        wait_for(lambda: len(server._conns) == 1, what="the idle connection accepted")
        size = len(get(server.port, "/metrics").body)
        assert size > 50_000
        for _ in range(30):
            assert get(server.port, "/metrics").status == 200
        wait_for(lambda: len(server._conns) == 1, what="every scrape's connection closed")
        assert response_bytes_in_the_deadline_heap(server) == 0
        assert server.held_bytes == len(b"GET /metr")
        assert len(server._deadlines) <= 1 + 256  # stale entries are dropped past COMPACT_AT


def test_every_scrape_sees_what_was_set_before_its_request(fake: Fake) -> None:
    """Renders are shared and rate-limited, never stale: past the burst a scrape waits for the next render."""
    registry = make_registry()
    counter = Counter("test_fresh", "Set before each scrape.", registry=registry)
    with serving(fake, registry=registry) as server:
        for i in range(1, 121):  # more than RENDER_BURST back to back
            counter.inc()
            assert f"test_fresh_total {float(i)}".encode() in get(server.port, "/metrics").body


def test_a_scraper_that_half_closes_after_its_request_is_answered(server: AgentHTTPServer) -> None:
    with connect(server.port) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        assert Response(read_all(sock)).status == 200


def scrape_all(port: int, times: int, *, rcvbuf: int | None, dawdle: float) -> list[tuple[int, bool]]:
    """``times`` scrapes one after the other: (status, whether the body has its Content-Length)."""
    out = []
    for _ in range(times):
        with connect(port, rcvbuf=rcvbuf) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            if dawdle:
                time.sleep(dawdle)  # a slow reader: its response waits in the server
            response = Response(read_all(sock))
            out.append((response.status, len(response.body) == int(response.headers["content-length"])))
    return out


def test_many_concurrent_scrapers_hold_no_more_than_the_bound(fake: Fake) -> None:
    """24 threads, a third of them slow readers, scrape a 90 kB body; what the server holds stays within
    its bound (its own count), each answer is a whole 200 or a 503, and /healthz answers throughout."""
    bound = RESERVE + (256 << 10)  # about three bodies for scrapes
    results: list[list[tuple[int, bool]]] = []
    with serving(fake, series=3000, max_held=bound) as server:
        threads = [
            threading.Thread(
                target=lambda slow=(n % 3 == 0): results.append(
                    scrape_all(server.port, 15, rcvbuf=4096 if slow else None, dawdle=0.05 if slow else 0.0)
                )
            )
            for n in range(24)
        ]
        for thread in threads:
            thread.start()
        healthz = []
        while any(thread.is_alive() for thread in threads):
            healthz.append(get(server.port, "/healthz").status)
        for thread in threads:
            thread.join(WAIT)
        wait_for(lambda: server.held_bytes == 0, what="every response let go")
        peak, _ = server.peak_held_bytes
        assert peak <= server.held_limits[0]
    answers = [answer for got in results for answer in got]
    assert len(answers) == 24 * 15
    assert set(answers) <= {(200, True), (503, True)}
    assert (200, True) in answers
    assert set(healthz) == {200}


def test_slow_readers_are_bounded_and_healthz_answers(fake: Fake) -> None:
    """Clients that never read their response: what they pin in the server is bounded (what the kernel's
    socket buffers took is not the server's), and /healthz still answers."""
    bound = RESERVE + (512 << 10)
    need_fds(200)
    with serving(fake, series=6000, max_held=bound, request_timeout=WAIT) as server:
        size = len(get(server.port, "/metrics").body)
        socks = []
        try:
            for _ in range(40):
                sock = connect(server.port, rcvbuf=4096)
                sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                socks.append(sock)
                wait_for(lambda: not server._scrapes, what="the scrape answered")  # one render each
            assert get(server.port, "/healthz").status == 200
            assert server.peak_held_bytes[0] <= server.held_limits[0]
            statuses = {int(sock.recv(4096).split(b" ")[1]) for sock in socks}
        finally:
            for sock in socks:
                sock.close()
        assert size > 100_000
        assert statuses <= {200, 503}
        wait_for(lambda: server.held_bytes == 0, what="every response let go")


@pytest.mark.parametrize(
    ("path", "series", "status", "says"),
    [
        ("/metrics", 6000, 503, b"busy: too many responses in flight\n"),  # a body over what scrapes may hold
        ("/metrics", 1, 200, b"test_scrapes_total 1.0"),
        ("/healthz", 6000, 200, b'"status": "ok"'),  # the reserve is kept for it
    ],
)
def test_a_response_past_the_bound_is_a_503(fake: Fake, path: str, series: int, status: int, says: bytes) -> None:
    with serving(fake, series=series, max_held=RESERVE + (64 << 10)) as server:
        response = get(server.port, path)
        assert (response.status, says in response.body) == (status, True)
        assert server.held_bytes == 0


def test_large_request_heads_are_bounded_and_healthz_answers(fake: Fake) -> None:
    """Slow clients that send large request heads and never end them: the heads held stay within their
    bound (the largest is dropped), and a small request still gets through."""
    need_fds(200)
    # No request times out here (an hour): only the bound closes a connection, so none is closed for being
    # slow on a loaded machine, and the count of closed ones is waited for, never read after a fixed wait.
    with serving(fake, max_held=RESERVE + (256 << 10), request_timeout=3600.0) as server:
        socks: list[socket.socket] = []
        try:
            for _ in range(80):
                sock = connect(server.port)
                sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"x" * 7000)  # never ended
                socks.append(sock)
            assert get(server.port, "/healthz").status == 200
            closed: set[socket.socket] = set()

            def count_closed() -> int:
                for sock in socks:
                    if sock not in closed and select_readable(sock) and reads_eof(sock):
                        closed.add(sock)
                return len(closed)

            dropped = 80 - server.held_limits[1] // 7000
            wait_for(lambda: count_closed() >= dropped, what=f"{dropped} of the 80 heads dropped")
            assert server.peak_held_bytes[1] <= server.held_limits[1]
        finally:
            for sock in socks:
                sock.close()


def test_rude_clients_leave_no_traceback(fake: Fake, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fake.conditions = ["x" * (16 << 20)]
    with serving(fake, request_timeout=1.0, max_held=BIG) as server:
        rude_clients(server.port)
        wait_for(lambda: not server._conns, what="every rude connection to be closed")
        wait_for(lambda: server.held_bytes == 0, what="every response let go")
        assert get(server.port, "/metrics").status == 200
        assert get(server.port, "/healthz").json() == HEALTH_BODY
    assert problems(caplog) == []


def count_resumes(server: AgentHTTPServer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry each time the serving loop takes accepting up again after an ACCEPT_RETRY pause."""
    resumed: list[int] = []
    expire = server._expire

    def counting(selector: selectors.BaseSelector) -> None:
        paused = server._accept_again_at is not None
        expire(selector)
        if paused and server._accept_again_at is None:
            resumed.append(len(resumed))

    monkeypatch.setattr(server, "_expire", counting)
    return resumed


def test_out_of_file_descriptors_pauses_accepting_and_serves_the_waiting_client(
    fake: Fake, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accept() failing for want of descriptors (EMFILE) leaves the connection queued in the kernel: the server
    stops accepting for ACCEPT_RETRY rather than spinning on a listener that stays readable, says so once,
    and serves the queued client once descriptors are free again."""
    monkeypatch.setattr("agent.app.http.ACCEPT_RETRY", 0.3)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with serving(fake) as server, connect(server.port) as before:
        before.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert Response(read_all(before)).status == 200
        resumed = count_resumes(server, monkeypatch)
        waiting = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # its descriptor, before there are none
        waiting.settimeout(WAIT)
        try:
            with caplog.at_level(logging.WARNING, logger="agent.app.http"):
                lowest_free = os.dup(0)
                os.close(lowest_free)
                resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new descriptor anywhere
                try:
                    waiting.connect((HOST, server.port))  # queued by the kernel; the server cannot accept it
                    waiting.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                    wait_for(lambda: problems(caplog), what="the server to find it cannot accept")
                    time.sleep(1.0)  # a few pauses' worth: one warning per pause, not a spin
                finally:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            response = Response(read_all(waiting))
        finally:
            waiting.close()
        assert response.status == 200 and b"test_scrapes_total" in response.body
        warnings = problems(caplog)
        assert 1 <= len(warnings) <= len(resumed) + 1, (warnings, resumed)  # each later one came after a pause
        assert all("cannot accept connections" in w for w in warnings)
        assert server.healthy(time.monotonic())


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/conditions"])
def test_failing_callback_is_500_and_one_line(
    server: AgentHTTPServer, fake: Fake, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    caplog.set_level(logging.INFO)
    fake.fail = RuntimeError("lock held by a stuck thread")
    response = get(server.port, path)
    assert (response.status, response.body) == (500, b"internal error\n")
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1
    assert path in errors[0].getMessage() and "lock held by a stuck thread" in errors[0].getMessage()
    assert errors[0].exc_info is None
    fake.fail = None
    assert get(server.port, path).status == 200
    assert get(server.port, "/metrics").status == 200


def test_failing_collector_is_500(fake: Fake, caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def collect(self) -> Any:
            raise ValueError("broken collector")

    registry = make_registry()
    registry.register(Broken())  # type: ignore[arg-type]
    with serving(fake, registry=registry) as server:
        assert get(server.port, "/metrics").status == 500
        assert get(server.port, "/healthz").status == 200
    assert any("broken collector" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


# --------------------------------------------------------------------------------------------------
# Lifecycle


def test_port_0_picks_a_free_port(fake: Fake) -> None:
    with serving(fake) as one, serving(fake) as two:
        assert one.port != 0 and two.port != 0 and one.port != two.port
        assert get(one.port, "/healthz").status == get(two.port, "/healthz").status == 200


def test_busy_port_raises_from_start(server: AgentHTTPServer, fake: Fake) -> None:
    other = AgentHTTPServer(
        host=HOST, port=server.port, registry=make_registry(), health=fake.health, conditions=fake.conditions_document
    )
    with pytest.raises(OSError):
        other.start()
    other.stop()


def test_stop_closes_the_port_and_every_connection(fake: Fake) -> None:
    server = AgentHTTPServer(
        host=HOST, port=0, registry=make_registry(), health=fake.health, conditions=fake.conditions_document
    )
    server.stop()  # before start: nothing to do
    assert not server.healthy(time.monotonic())
    server.start()
    assert server.healthy(time.monotonic())
    port = server.port
    held = [connect(port) for _ in range(20)]
    for sock in held:
        sock.sendall(b"GET /metr")
    try:
        stopper = threading.Thread(target=server.stop, kwargs={"timeout": 2.0})
        stopper.start()
        stopper.join(WAIT)
        assert not stopper.is_alive(), "stop() did not return"
        assert not server.healthy(time.monotonic())
        assert all(reads_eof(sock) for sock in held)
        with pytest.raises(ConnectionRefusedError):
            connect(port).close()
        server.stop()  # twice is harmless
    finally:
        for sock in held:
            sock.close()


def test_healthy_follows_the_event_loop(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.app.http.STALL", 0.3)
    release = threading.Event()
    fake.conditions_document = lambda: release.wait(WAIT) and CONDITIONS  # type: ignore[method-assign]
    with serving(fake) as server:
        wait_for(lambda: server.healthy(time.monotonic()), what="healthy")
        client = threading.Thread(target=get, args=(server.port, "/conditions"), daemon=True)
        client.start()  # blocks the event loop in the callback
        wait_for(lambda: not server.healthy(time.monotonic()), what="a stalled loop to be unhealthy")
        release.set()
        client.join(WAIT)
        wait_for(lambda: server.healthy(time.monotonic()), what="healthy again")
    assert not server.healthy(time.monotonic())


def test_an_answered_look_stands_for_a_second(fake: Fake) -> None:
    """The main loop asks at every publication (hundreds a second in a flood of kernel lines): one look a
    LOOK_EVERY is posted to the loop, the asks between are answered by the last look."""
    clock = [100.0]
    with serving(fake, monotonic=lambda: clock[0]) as server:
        assert server.healthy(0.0)  # posts a look
        wait_for(lambda: server._asked is None, what="the loop to answer the look")
        for step in range(100):
            clock[0] = 100.0 + step * LOOK_EVERY / 100
            assert server.healthy(0.0)
            assert server._asked is None, f"a look posted {step * LOOK_EVERY / 100:.2f} s after the last answer"
        clock[0] = 100.0 + LOOK_EVERY
        assert server.healthy(0.0)  # a new look: the loop may answer it before the next line runs
        wait_for(lambda: server._asked is None, what="the loop to answer the second look")
        assert server._answered_at == clock[0]  # answered now, not the first look's answer (at 100.0)


def test_an_idle_server_sleeps_and_answers_a_look_from_another_thread(fake: Fake) -> None:
    """No heartbeat wakes an idle loop (each wakeup is idle CPU, issue 16); a health look wakes it once."""
    with serving(fake) as server:
        assert server._thread is not None and server._thread.native_id is not None
        assert wakeups_while_asleep(server._thread.native_id, sleeps_in=["epoll", "poll"]) == 0
        assert server.healthy(time.monotonic())  # posts a look
        wait_for(lambda: server._asked is None, what="the loop to answer the look")
        assert server.healthy(time.monotonic())
