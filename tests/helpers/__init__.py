"""What the tests share: paths, bounded waiting, free ports, HTTP gets, real /dev/kmsg access.

Submodules hold the larger shared tools: ``aws`` (moto), ``agents`` (real agent processes),
``sinks``, ``mainloop``, ``relay``, ``kprintf``, ``testdata``, ``k8stools``/``k8srender``, ``npd``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]  # the repository root
FIXTURES = REPO / "tests" / "fixtures"
KMSG = "/dev/kmsg"


def wait_for(predicate: Callable[[], T], timeout: float = 15.0, interval: float = 0.05) -> T:
    """Poll until ``predicate()`` is truthy and return it; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not reached within {timeout}s")


def finishes(call: Callable[[], T], *, what: str, limit: float = 120.0) -> T:
    """``call()``'s result (or its exception), run in a thread; fail the test, saying ``what`` hung, when it
    is not done after ``limit`` seconds. For "does not hang" tests: the limit is generous (a loaded machine
    is slow, never wrong); nothing is asserted about how long it took."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the test's thread
            outcome.append((False, exc))

    worker = threading.Thread(target=run, name=f"finishes: {what}", daemon=True)
    worker.start()
    worker.join(limit)
    if not outcome:
        raise AssertionError(f"{what} hung: not done after {limit:g}s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def process_gone(pid: int) -> bool:
    """Dead: no /proc entry, or a zombie nobody has reaped yet (a container's PID 1 may never reap).

    A SIGKILL sent to a process group is delivered asynchronously: a grandchild may still be
    running for a moment after the killer returns, so tests wait on this (``wait_for``), never
    assert it once."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@contextlib.contextmanager
def kube_clients(server: Any, tmp_path: Path, *, timeout: float = 5.0) -> Iterator[Callable[[], Any]]:
    """``make()``: a new real KubeClient for the test API server ``server`` (via a kubeconfig, as the agent
    loads it; each simulated agent gets its own), all closed at the end."""
    from agent.adapters.kube import KubeClient

    config = server.write_kubeconfig(tmp_path / "kubeconfig")
    with contextlib.ExitStack() as stack:

        def make() -> Any:
            made = KubeClient.load(kubeconfig=config, timeout=timeout)
            stack.callback(made.close)
            return made

        yield make


@contextlib.contextmanager
def kube_client(server: Any, tmp_path: Path, *, timeout: float = 5.0) -> Iterator[Any]:
    """One real KubeClient for the test API server ``server``, closed at the end."""
    with kube_clients(server, tmp_path, timeout=timeout) as make:
        yield make()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kmsg_problem() -> str | None:
    """Why the real /dev/kmsg cannot be used for a read+write test here, or None if it can."""
    for flags, what in ((os.O_RDONLY | os.O_NONBLOCK, "read"), (os.O_WRONLY, "write")):
        try:
            os.close(os.open(KMSG, flags))
        except OSError as exc:
            return f"{KMSG} cannot be opened for {what} here ({exc.strerror}); needs root on a real kernel"
    return None


class ScriptedRead:
    """A ``read`` for KmsgReader that plays a script of results and exceptions, then end of input."""

    def __init__(self, script: list[bytes | OSError]) -> None:
        self._script = list(script)

    def __call__(self, fd: int, size: int) -> bytes:
        item = self._script.pop(0) if self._script else b""
        if isinstance(item, OSError):
            raise item
        return item


def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET; (0, "") while nothing listens there yet (an agent still starting)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError:
        return 0, ""


def memory_limit(limit: int) -> Callable[[], None]:
    """A ``preexec_fn`` that caps the child's address space: a test of hostile input never eats the machine."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def start_standalone_agent(
    tmp: Path, *, plugins: Path, max_memory: int | None = None
) -> tuple[subprocess.Popen[str], str]:
    """A real standalone agent on an empty kmsg file with ``plugins`` as its only plugin directory:
    the process and its base URL (stop it with ``terminate()`` and ``communicate()``).
    ``max_memory``: its address space limit in bytes (see :func:`memory_limit`)."""
    kmsg = tmp / "kmsg"
    kmsg.touch()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "run", "--standalone", "--plugins-dir", str(plugins)]
        + ["--kmsg-path", str(kmsg), "--state-dir", str(tmp / "state"), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=memory_limit(max_memory) if max_memory is not None else None,
    )
    return proc, f"http://127.0.0.1:{port}"


@dataclasses.dataclass(frozen=True)
class FakeEntryPoint:
    """Our check loader's seam: what importlib.metadata.entry_points() yields (name, value, load, dist)."""

    name: str
    value: str
    target: Callable[..., object] | BaseException
    dist: object = None

    def load(self) -> object:
        if isinstance(self.target, BaseException):
            raise self.target
        return self.target
