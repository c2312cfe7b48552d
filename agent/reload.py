"""Hot reload: plugin and configuration directories are watched; a valid change is swapped in whole.

Component ``config_watcher``. ``watchdog`` reports file changes (a mounted ConfigMap changes by
swapping a ``..data`` symlink, which shows as events in the directory); after they settle for
``settle`` seconds the whole configuration is loaded and validated again, exactly as at start:

- valid: the scheduler gets the new set of checks at once (unchanged declarations keep their
  running check object and its memory: baselines, flap history), and the main loop gets the new
  kernel log rules and conditions (a :class:`~agent.runtime.Reconfigure` item);
- invalid: the error is logged with every problem, counted, shown in ``/healthz`` details, and the
  last good configuration keeps running (``/healthz`` stays green: the agent is fine).

A change made between loading the configuration at start and the file watcher's start is not
missed: the files' fingerprint (path, size, mtime) taken before the first load is compared once
the watcher runs.

Log monitor (filelog/journald) changes take effect at the next restart; the log says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.agentconfig import AgentConfig, build_scheduled_checks, load_agent_config, owned_conditions
from agent.checks.declared import CheckDecl
from agent.checks.model import CheckContext, ScheduledCheck
from agent.errors import ConfigError
from agent.runtime import Inbox, Reconfigure

log = logging.getLogger(__name__)

SETTLE = 1.0  # seconds without a new change before reloading (editors write in several steps)

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(paths: Sequence[Path]) -> Fingerprint:
    """(path, size, mtime) of every file under ``paths``: cheap, and enough to tell that one changed."""
    found = []
    for root in paths:
        candidates = [root] if not root.is_dir() else sorted(p for p in root.rglob("*") if not p.is_dir())
        for path in candidates:
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(found)


class ConfigWatcher:
    name = "config_watcher"

    def __init__(
        self,
        *,
        paths: Sequence[Path],
        config: AgentConfig,
        checks: Sequence[ScheduledCheck],
        context: CheckContext,
        scheduler: Any,  # agent.checks.scheduler.CheckScheduler or None
        inbox: Inbox,
        settle: float = SETTLE,
        monotonic: Callable[[], float] = time.monotonic,
        entry_points: Callable[[], Sequence[Any]] | None = None,
        loaded: Fingerprint | None = None,
    ) -> None:
        """``loaded``: the fingerprint taken before ``config`` was loaded (None: take it now)."""
        self._paths = list(paths)
        self._loaded = loaded if loaded is not None else fingerprint(self._paths)
        self._monitor_files = [m.file.path for m in config.log_monitors]  # not the parsed files: memory
        self._checks = {c.name: c for c in checks}
        self._decls = {d.name: d for d in config.check_decls}
        self._context = context
        self._scheduler = scheduler
        self._inbox = inbox
        self._settle = settle
        self._monotonic = monotonic
        self._entry_points = entry_points
        self._changed_at: float | None = None
        self._lock = threading.Lock()
        self.generation = 1
        self.failures = 0
        self.last_error: str | None = None
        self.watching: list[str] = []

    def healthy(self, now: float) -> bool:
        return True  # a rejected change is the configuration's trouble, not the agent's

    def changed(self) -> None:
        """Called by the file watcher (any thread): something under the watched paths changed."""
        with self._lock:
            self._changed_at = self._monotonic()

    def run(self, stop: threading.Event) -> None:
        observer = self._start_observer()
        if fingerprint(self._paths) != self._loaded:
            self.changed()  # changed between the first load and the watch
        try:
            while not stop.wait(0.2):
                with self._lock:
                    due = self._changed_at is not None and self._monotonic() - self._changed_at >= self._settle
                    if due:
                        self._changed_at = None
                if due:
                    self.reload(stop=stop)
        finally:
            if observer is not None:
                observer.stop()
                observer.join(timeout=2)

    def _start_observer(self) -> Any:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type in ("opened", "closed_no_write"):
                    return
                watcher.changed()

        observer = Observer()
        handler = Handler()
        dirs = sorted({str(p if p.is_dir() else p.parent) for p in self._paths})
        for d in dirs:
            try:
                observer.schedule(handler, d, recursive=True)
                self.watching.append(d)
            except OSError as exc:
                log.warning("cannot watch %s for changes (%s); changes there need a restart", d, exc)
        try:
            observer.start()
        except OSError as exc:  # e.g. inotify instances exhausted
            log.warning("cannot watch the configuration for changes (%s); changes need a restart", exc)
            return None
        return observer

    def reload(self, *, stop: threading.Event | None = None) -> bool:
        """Load and validate everything again; swap it in if valid. True when swapped."""
        try:
            config = load_agent_config(self._paths, entry_points=self._entry_points)
            fresh = self._rebuild(config, stop=stop)
            conditions = owned_conditions(config, fresh)  # one owner per type across every source
        except ConfigError as exc:
            self.failures += 1
            self.last_error = f"configuration change rejected, still running generation {self.generation}: " + (
                "; ".join(str(p) for p in exc.problems)
            )
            log.error("%s", self.last_error)
            return False
        except Exception as exc:  # never let a reload take the agent down
            self.failures += 1
            self.last_error = f"configuration reload failed: {type(exc).__name__}: {exc}"
            log.exception("configuration reload failed")
            return False
        if stop is not None and stop.is_set():
            return False  # stopping: plugin loads were abandoned, nothing is swapped in
        if [m.file.path for m in config.log_monitors] != self._monitor_files:
            log.warning("log monitor (filelog/journald) changes take effect at the next restart")
        removed = [name for name in self._checks if name not in {c.name for c in fresh}]
        self.generation += 1
        if self._scheduler is not None:
            self._scheduler.replace(fresh)
        item = Reconfigure(
            rule_set=config.rule_set, conditions=conditions, removed_checks=removed, generation=self.generation
        )
        self._inbox.put(item, stop=stop or threading.Event())
        self._monitor_files = [m.file.path for m in config.log_monitors]
        self._checks = {c.name: c for c in fresh}
        self._decls = {d.name: d for d in config.check_decls}
        self.last_error = None
        log.info(
            "configuration %d loaded: %d kernel log rules, %d checks%s",
            self.generation,
            len(config.rule_set.rules),
            len(fresh),
            f" ({len(removed)} removed)" if removed else "",
        )
        return True

    def _rebuild(self, config: AgentConfig, *, stop: threading.Event | None = None) -> list[ScheduledCheck]:
        """The new checks; a declaration that did not change keeps its running check object. Plugins load
        as at start: a hung import or factory, or one calling ``sys.exit``, becomes a BrokenCheck after its
        timeout (the watcher goes on), and ``stop`` abandons the wait (shutdown is not held up)."""
        kept: dict[str, ScheduledCheck] = {}
        changed: list[CheckDecl] = []
        for decl in config.check_decls:
            old = self._checks.get(decl.name)
            if old is not None and self._decls.get(decl.name) == decl:
                kept[decl.name] = old
            else:
                changed.append(decl)
        fresh_config = AgentConfig(
            rule_set=config.rule_set,
            log_monitors=config.log_monitors,
            check_decls=tuple(changed),
            custom_plugins=config.custom_plugins,
            files=config.files,
        )
        built = {
            c.name: c
            for c in build_scheduled_checks(
                fresh_config, context=self._context, entry_points=self._entry_points, stop=stop
            )
        }
        order = [d.name for d in config.check_decls if d.enabled] + [
            c.name for p in config.custom_plugins for c in p.checks
        ]
        return [kept.get(name) or built[name] for name in order if name in kept or name in built]
