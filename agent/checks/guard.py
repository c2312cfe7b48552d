"""Calling plugin code that may hang or raise anything: importing a plugin, calling its factory.

:func:`call_guarded` runs the call in a daemon thread of its own and waits at most ``timeout``
seconds (less if ``stop`` is set). Whatever the call raises is caught there, ``BaseException``
included: a plugin's ``sys.exit(7)`` (``SystemExit``), a ``KeyboardInterrupt`` or ``GeneratorExit``
it raises itself are the plugin's failure, never the agent's exit. (A real Ctrl-C is delivered to
the main thread, which only waits here, so it still stops the agent.)

A call that does not return in time is abandoned, not stopped: Python cannot kill a thread. The
thread keeps running, and while it is stuck inside an import it holds that module's import lock
(``importlib`` takes one lock per module). Imports of other modules go on normally; an import of
the same module (or of a module inside a package whose ``__init__`` hangs) waits for the stuck one,
so the caller must not import it again without a timeout either (:mod:`agent.checks.loader` remembers
the modules that hung). The thread is a daemon, so it never keeps the agent from exiting.

What cannot be contained in the agent's process: ``os._exit()``, a crash in a C extension, a C call
that hangs holding the GIL, and memory (see plugins/README.md, "What a Python check can harm").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
POLL = 0.1  # seconds between looks at ``stop`` while waiting


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """How a guarded call went: its ``value``; or the ``error`` it raised; or it was abandoned
    (``timed_out``, or ``cancelled`` because ``stop`` was set), still running in its thread."""

    value: T | None = None
    error: BaseException | None = None
    timed_out: bool = False
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and not self.cancelled


def describe(exc: BaseException) -> str:
    """``Type: text`` of an exception raised by plugin code, even when its ``__str__`` raises too."""
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a plugin's exception whose __str__ fails is still only the plugin's
        text = "(its message cannot be shown)"
    text = text[:500]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def call_guarded(
    call: Callable[[], T],
    *,
    timeout: float,
    name: str,
    stop: threading.Event | None = None,
) -> Outcome[T]:
    """Run ``call()`` in a daemon thread named ``name``; its outcome within ``timeout`` seconds."""
    done = threading.Event()
    box: list[Outcome[T]] = []

    def target() -> None:
        try:
            box.append(Outcome(value=call()))
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt...: the plugin's, in this thread
            box.append(Outcome(error=exc))
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not done.is_set():
        if stop is not None and stop.is_set():
            return Outcome(cancelled=True)
        left = deadline - time.monotonic()
        if left <= 0:
            return Outcome(timed_out=True)
        done.wait(min(left, POLL))
    return box[0]
