"""An IMDSv2 endpoint that trickles: a real loopback HTTP server (raw sockets) sending one part of its
answer a byte at a time, each byte well within any per-read timeout, so only a deadline ends it."""

from __future__ import annotations

import socket
import threading
import time


class TricklingImds:
    """``PUT /latest/api/token`` and ``GET`` as IMDSv2 answers them, except that the part named by
    ``trickles`` (``token``: the PUT's answer; ``head``: the GET's status line and headers; ``body``:
    the GET's body) is sent one byte every ``every`` seconds until the client goes away. The first
    ``after`` GETs trickle (None = all), later ones answer ``body`` at once. ``trickled`` is set once
    a byte went out that way."""

    def __init__(self, *, trickles: str, every: float, after: int | None = None, body: str = "[]") -> None:
        assert trickles in ("token", "head", "body")
        self.trickles = trickles
        self.every = every
        self.after = after
        self.body = body
        self.trickled = threading.Event()
        self._gets = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # accept wakes up to see the stop
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> TricklingImds:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(10)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            is_token = head.startswith(b"PUT ")
            payload = b"token-1" if is_token else self.body.encode()
            padded = payload + b" " * 1000  # what a trickle sends: longer than any deadline lets through
            if is_token:
                if self.trickles == "token":
                    return self._trickle(conn, _head(len(padded)) + padded)
                return conn.sendall(_head(len(payload)) + payload)
            self._gets += 1
            if self.trickles == "token" or (self.after is not None and self._gets > self.after):
                return conn.sendall(_head(len(payload)) + payload)
            if self.trickles == "head":
                return self._trickle(conn, _head(len(padded)) + padded)
            conn.sendall(_head(len(padded)))
            return self._trickle(conn, padded)

    def _trickle(self, conn: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self._stop.is_set():
                return
            try:
                conn.sendall(data[i : i + 1])
            except OSError:
                return  # the client went away (its deadline)
            self.trickled.set()
            time.sleep(self.every)


def _head(length: int) -> bytes:
    text = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    return text.encode()
