"""Components under one supervisor: each in its own thread, health for ``/healthz``, one shared
stop deadline."""

from __future__ import annotations

import contextlib
import logging
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


class Component(Protocol):
    """A long-lived part of the agent, started and stopped by the :class:`Supervisor`."""

    name: str

    def run(self, stop: threading.Event) -> None:
        """Work until ``stop`` is set; return promptly (well within the shutdown deadline) after it is."""

    def healthy(self, now: float) -> bool:
        """Whether this component works right now (``now`` = ``time.monotonic()``)."""


@runtime_checkable
class Wakeable(Protocol):
    """A component that sleeps on its own signal (a condition, a file descriptor) rather than on ``stop``:
    the supervisor calls :meth:`wake` once ``stop`` is set, so it returns at once instead of polling."""

    def wake(self) -> None:
        """Make ``run`` look at ``stop`` now (any thread; may be called more than once)."""


class Supervisor:
    """Runs components in threads; health of all of them; one shared stop deadline."""

    def __init__(
        self,
        *,
        components: Sequence[Component],
        monotonic: Callable[[], float] = time.monotonic,
        on_stop: Sequence[Callable[[], None]] = (),
    ) -> None:
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"component names must be unique: {names}")
        self._components = list(components)
        self._monotonic = monotonic
        self._on_stop = list(on_stop)
        self._threads: dict[str, threading.Thread] = {}
        self._crashed: dict[str, str] = {}

    @property
    def components(self) -> tuple[Component, ...]:
        return tuple(self._components)

    def add(self, component: Component) -> None:
        """One more component (before :meth:`start`)."""
        if self._threads:
            raise RuntimeError("components are added before the supervisor starts")
        if any(c.name == component.name for c in self._components):
            raise ValueError(f"a component named {component.name!r} exists already")
        self._components.append(component)

    def health(self) -> dict[str, bool]:
        now = self._monotonic()
        out = {}
        for comp in self._components:
            thread = self._threads.get(comp.name)
            alive = thread is not None and thread.is_alive()
            try:
                ok = comp.healthy(now)
            except Exception:  # a health check that raises is itself a failure
                log.exception("health check of %s failed", comp.name)
                ok = False
            out[comp.name] = alive and ok and comp.name not in self._crashed
        return out

    def crashed(self) -> dict[str, str]:
        """Components whose ``run`` raised, with the error."""
        return dict(self._crashed)

    def start(self, stop: threading.Event) -> None:
        for comp in self._components:
            thread = threading.Thread(target=self._run_one, args=(comp, stop), name=comp.name, daemon=True)
            self._threads[comp.name] = thread
            thread.start()

    def _run_one(self, comp: Component, stop: threading.Event) -> None:
        try:
            comp.run(stop)
        except Exception as exc:  # a dead component turns /healthz red; the others go on
            self._crashed[comp.name] = f"{type(exc).__name__}: {exc}"
            log.exception("component %s died", comp.name)
        else:
            if not stop.is_set():
                log.error("component %s returned before shutdown", comp.name)
                self._crashed.setdefault(comp.name, "returned before shutdown")

    def join(self, *, deadline: float) -> list[str]:
        """Wake the components that sleep on their own signal, then wait for every thread until
        ``deadline`` (monotonic); names of those still running."""
        for comp in self._components:
            if isinstance(comp, Wakeable):
                try:
                    comp.wake()
                except Exception:
                    log.exception("waking %s failed", comp.name)
        for hook in self._on_stop:
            try:
                hook()
            except Exception:
                log.exception("shutdown hook failed")
        late = []
        for name, thread in self._threads.items():
            thread.join(timeout=max(0.0, deadline - self._monotonic()))
            if thread.is_alive():
                late.append(name)
        if late:
            log.warning("components still running at the shutdown deadline: %s", ", ".join(late))
        return late

    def run(self, stop: threading.Event, *, grace: float = 4.5) -> list[str]:
        """Start everything, wait for ``stop``, then stop all within ``grace`` seconds."""
        self.start(stop)
        wait_for_stop(stop)
        return self.join(deadline=self._monotonic() + grace)


def wait_for_stop(stop: threading.Event) -> None:
    """Block until ``stop`` is set, without waking in between, and without sleeping through a signal.

    Python runs a signal handler only in the main thread, when it executes bytecode. The kernel may
    deliver SIGTERM to any of our threads, and then a main thread asleep in a plain ``stop.wait()``
    never learns of it (an agent once ignored SIGTERM in 2 of about 20 CI runs). Polling (a wait with a
    timeout) was the cure, but every poll is an idle wakeup (issue 16). So the main thread sleeps in
    ``select`` on a socket that two things write to: Python's signal wakeup fd (the C-level handler
    writes to it in whichever thread the signal landed, after which the main thread runs the Python
    handler), and a helper thread asleep on ``stop`` (whoever sets ``stop``, signal or not). Outside
    the main thread (tests, embedding) no signal handler runs here: a plain wait is enough."""
    if threading.current_thread() is not threading.main_thread():
        stop.wait()
        return
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)
        theirs.setblocking(False)  # the signal handler must never block on a full socket
        try:
            previous = signal.set_wakeup_fd(theirs.fileno(), warn_on_full_buffer=False)
        except ValueError:  # e.g. not the main interpreter: fall back to looking now and then
            while not stop.wait(timeout=1.0):
                pass
            return

        def tell() -> None:
            stop.wait()
            with contextlib.suppress(OSError):  # closed already: the main thread is gone from its wait
                theirs.send(b"\0")

        threading.Thread(target=tell, name="supervisor-stop", daemon=True).start()
        try:
            while not stop.is_set():  # a Python call per turn: the handler of a signal just seen runs first
                select.select([ours], [], [])
                with contextlib.suppress(BlockingIOError):
                    ours.recv(4096)
        finally:
            signal.set_wakeup_fd(previous)
