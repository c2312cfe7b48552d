"""Components under one supervisor: each in its own thread, health for ``/healthz``, one shared
stop deadline."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

log = logging.getLogger(__name__)

SIGNAL_POLL = 1.0  # seconds: how often the main thread wakes while waiting for stop (see Supervisor.run; each
# wakeup is idle CPU: 5 a second were a fifth of an idle agent's, issue 16)


class Component(Protocol):
    """A long-lived part of the agent, started and stopped by the :class:`Supervisor`."""

    name: str

    def run(self, stop: threading.Event) -> None:
        """Work until ``stop`` is set; return promptly (well within the shutdown deadline) after it is."""

    def healthy(self, now: float) -> bool:
        """Whether this component works right now (``now`` = ``time.monotonic()``)."""


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
        """Wait for every thread until ``deadline`` (monotonic); names of those still running."""
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
        # Wake now and then rather than block for good: Python runs a signal handler only in the main
        # thread, when it executes bytecode. The kernel may deliver SIGTERM to any of our threads, and
        # then a main thread asleep in a plain wait() never learns of it (an agent that ignored SIGTERM
        # in 2 of about 20 CI runs).
        while not stop.wait(timeout=SIGNAL_POLL):
            pass
        return self.join(deadline=self._monotonic() + grace)
