"""Client load for ``bench/run.py scrapes``: scrapers in a loop, and the attacks on the metrics port.

Each function runs threads of raw-socket clients against ``port`` until ``until`` (a ``time.monotonic``
instant) and returns what they saw; the caller samples the agent's RSS meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n"


def _status(raw: bytes) -> str:
    parts = raw.split(b" ", 2)
    return parts[1].decode("latin-1", "replace") if len(parts) > 1 and raw.startswith(b"HTTP/") else "none"


def _exchange(port: int, request: bytes, *, read: bool = True, rcvbuf: int | None = None) -> str:
    """One request; the response's status ("none" when the server closed first, "error" on a socket error)."""
    try:
        with socket.socket() as sock:
            sock.settimeout(10)
            if rcvbuf is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.connect(("127.0.0.1", port))
            sock.sendall(request)
            if not read:
                return "unread"
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return _status(b"".join(chunks))
    except OSError:
        return "error"


def _threads(count: int, body: Callable[[], None]) -> list[threading.Thread]:
    threads = [threading.Thread(target=body, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def scrapers(port: int, *, count: int, until: float) -> Counter[str]:
    """``count`` scrapers, each scraping /metrics back to back until ``until``: statuses seen."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def loop() -> None:
        while time.monotonic() < until:
            status = _exchange(port, REQUEST)
            with lock:
                seen[status] += 1

    for thread in _threads(count, loop):
        thread.join()
    return seen


def attack(port: int, *, until: float) -> Counter[str]:
    """Until ``until``, at once: bursts of 500 concurrent scrapes (every request sent before any response is
    read), clients that never read their response (a 4 KiB receive buffer, held open 5 s), clients that hang
    up mid-response (a reset after the first bytes), and slowloris heads (a byte a second). Statuses seen."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def count(status: str) -> None:
        with lock:
            seen[status] += 1

    def bursts() -> None:
        while time.monotonic() < until:
            socks = []
            for _ in range(500):
                with contextlib.suppress(OSError):
                    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                    sock.sendall(REQUEST)
                    socks.append(sock)
            for sock in socks:
                with sock:
                    try:
                        chunks = []
                        while chunk := sock.recv(65536):
                            chunks.append(chunk)
                        count(_status(b"".join(chunks)))
                    except OSError:
                        count("error")

    def never_read() -> None:
        while time.monotonic() < until:
            socks = []
            for _ in range(50):
                with contextlib.suppress(OSError):
                    sock = socket.socket()
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    sock.connect(("127.0.0.1", port))
                    sock.sendall(REQUEST)
                    socks.append(sock)
            time.sleep(5)
            for sock in socks:
                sock.close()

    def hang_up() -> None:
        while time.monotonic() < until:
            with contextlib.suppress(OSError):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port))
                sock.sendall(REQUEST)
                sock.recv(100)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()

    def slowloris() -> None:
        socks = []
        with contextlib.suppress(OSError):
            for _ in range(100):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        while time.monotonic() < until:
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(b"X")
            time.sleep(1)
        for sock in socks:
            sock.close()

    threads = [*_threads(1, bursts), *_threads(1, never_read), *_threads(2, hang_up), *_threads(1, slowloris)]
    for thread in threads:
        thread.join()
    return seen


def healthz(port: int, *, until: float, every: float = 0.5) -> Counter[str]:
    """/healthz, every ``every`` seconds until ``until``, as the kubelet's probe: statuses seen."""
    seen: Counter[str] = Counter()
    while time.monotonic() < until:
        seen[_exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n")] += 1
        time.sleep(every)
    return seen
