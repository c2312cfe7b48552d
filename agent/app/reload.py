"""Hot reload: the configuration files are watched; a valid change is swapped in whole.

Component ``config_watcher``. ``watchdog`` (inotify) reports changes in the plugin directories
(recursively) and in the directories of the ``--config`` files (not recursively), and only changes
that can touch the configuration count (:class:`Relevant`): a ``--config`` file itself, a
``*.json``/``*.yaml``/``*.yml`` file or a directory under a plugin directory (hidden ones skipped,
as loading skips them), and a mounted ConfigMap's ``..data`` swap. Anything else there (the agent's
own state directory and log file, an unrelated ``touch``) is ignored, and so is everything under
``ignore`` (the state directory) wherever it is. A burst of changes waits until it has settled for
``settle`` seconds (at most ``MAX_WAIT``); then the content of every configuration file is compared
with what was last loaded (:func:`fingerprint`): the same content (a ``touch``, a rewrite with the
same text) is no reload. Otherwise the whole configuration is loaded and validated again, exactly as
at start:

- valid: the scheduler gets the new set of checks at once (unchanged declarations keep their
  running check object and its memory: baselines, flap history), and the main loop gets the new
  kernel log rules and conditions (a :class:`~agent.engine.inputs.Reconfigure` item);
- invalid: the error is logged with every problem, counted, shown in ``/healthz`` details, and the
  last good configuration keeps running (``/healthz`` stays green: the agent is fine). The same
  broken content is not tried again.

A change made between loading the configuration at start and the file watcher's start is not
missed: the fingerprint taken before the first load is compared once the watcher runs.

Log monitor (filelog/journald) changes take effect at the next restart; the log says so.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.app.config import Loaded, load_configuration
from agent.checks.model import CheckContext
from agent.core.bus import Inbox
from agent.core.configdoc import PACK_SUFFIXES, discover
from agent.core.docreader import Refused, read_config_bytes
from agent.core.errors import ConfigError
from agent.engine.inputs import Reconfigure

if TYPE_CHECKING:
    from agent.checks.scheduler import CheckScheduler

log = logging.getLogger(__name__)

SETTLE = 1.0  # seconds without a new change before reloading (editors write in several steps)
MAX_WAIT = 10.0  # seconds a stream of changes may delay a reload
POLL = 0.2  # seconds between looks while a burst of changes settles

Fingerprint = tuple[tuple[str, str], ...]


def fingerprint(paths: Sequence[Path]) -> Fingerprint:
    """(path, digest of its content, or why it cannot be read) of every configuration file under
    ``paths``, found and read as loading does (within the same bounds): equal means the same content."""
    found, problems = discover(list(paths))
    out = [(p.file, f"problem: {p.message}") for p in problems]
    for path in found:
        try:
            digest = hashlib.sha256(read_config_bytes(path)).hexdigest()
        except Refused as exc:
            digest = f"refused: {exc.message}"
        except OSError as exc:
            digest = f"error: {exc.strerror or exc}"
        out.append((str(path), digest))
    return tuple(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class Relevant:
    """Which changed paths can touch the configuration (see the module docstring)."""

    files: frozenset[Path]  # the --config files as given
    file_dirs: frozenset[Path]  # their directories (watched, not recursively)
    plugin_dirs: tuple[Path, ...]  # watched recursively
    ignore: tuple[Path, ...] = ()

    @classmethod
    def of(cls, paths: Sequence[Path], *, ignore: Sequence[Path] = ()) -> Relevant:
        files = [p.absolute() for p in paths if not p.is_dir()]
        return cls(
            files=frozenset(files),
            file_dirs=frozenset(f.parent for f in files),
            plugin_dirs=tuple(p.absolute() for p in paths if p.is_dir()),
            ignore=tuple(p.absolute() for p in ignore),
        )

    def watches(self) -> list[tuple[Path, bool]]:
        """(directory, recursive) to watch."""
        plugin = {d: True for d in self.plugin_dirs}
        return sorted({**{d: False for d in self.file_dirs}, **plugin}.items())

    def __call__(self, raw: str, *, is_directory: bool = False) -> bool:
        path = Path(raw).absolute()
        if any(path.is_relative_to(d) for d in self.ignore):
            return False
        if path in self.files:
            return True
        if path.parent in self.file_dirs and path.name.startswith(".."):
            return True  # a ConfigMap update: ..data now points at a new ..<timestamp> directory
        for root in self.plugin_dirs:
            if path == root or not path.is_relative_to(root):
                continue
            parts = path.relative_to(root).parts
            if any(part.startswith("..") for part in parts):
                return True  # a ConfigMap mounted in (or below) a plugin directory
            if any(part.startswith(".") for part in parts):
                return False  # hidden, as loading skips them: editor swap files
            return is_directory or path.suffix in PACK_SUFFIXES
        return False


class ConfigWatcher:
    name = "config_watcher"

    def __init__(
        self,
        *,
        paths: Sequence[Path],
        current: Loaded,
        context: CheckContext,
        scheduler: CheckScheduler | None,
        inbox: Inbox,
        settle: float = SETTLE,
        monotonic: Callable[[], float] = time.monotonic,
        entry_points: Callable[[], Sequence[Any]] | None = None,
        files: Fingerprint | None = None,
        ignore: Sequence[Path] = (),
    ) -> None:
        """``current``: the configuration running now (from :func:`~agent.app.config.load_configuration`);
        ``files``: the fingerprint taken before it was loaded (None: take it now); ``ignore``: directories
        whose changes never count (the agent's state directory)."""
        self._paths = list(paths)
        self._relevant = Relevant.of(self._paths, ignore=ignore)
        self._loaded = files if files is not None else fingerprint(self._paths)
        self._current = current
        self._context = context
        self._scheduler = scheduler
        self._inbox = inbox
        self._settle = settle
        self._monotonic = monotonic
        self._entry_points = entry_points
        self._first_change: float | None = None  # the burst being waited out: its first change
        self._last_change: float | None = None  # and its latest
        self._lock = threading.Lock()
        self._pending = threading.Event()  # set by a change, cleared when its burst was checked
        self.generation = 1
        self.failures = 0
        self.ignored = 0  # changes that cannot touch the configuration
        self.unchanged = 0  # bursts after which every configuration file had the content last loaded
        self.last_error: str | None = None
        self.watching: list[str] = []

    def healthy(self, now: float) -> bool:
        return True  # a rejected change is the configuration's trouble, not the agent's

    def wake(self) -> None:
        """Stop was set: end the wait for a change now (the supervisor calls this; any thread)."""
        self._pending.set()

    def changed(self) -> None:
        """Called by the file watcher (any thread): a configuration file may have changed."""
        with self._lock:
            now = self._monotonic()
            self._last_change = now
            if self._first_change is None:
                self._first_change = now
            self._pending.set()

    def seen(self, path: str, *, dest: str | None = None, is_directory: bool = False) -> None:
        """Called by the file watcher (any thread) for every change under the watched directories."""
        if any(self._relevant(p, is_directory=is_directory) for p in (path, dest) if p):
            self.changed()
        else:
            with self._lock:
                self.ignored += 1

    def poll(self, *, stop: threading.Event | None = None) -> bool:
        """Called every POLL seconds while changes are pending: once a burst of changes has settled for
        ``settle`` seconds (or has gone on for MAX_WAIT), :meth:`check` the files. True when it did."""
        with self._lock:
            first, last, now = self._first_change, self._last_change, self._monotonic()
            if first is None or last is None or (now - last < self._settle and now - first < MAX_WAIT):
                return False
            self._first_change = self._last_change = None
            self._pending.clear()
        self.check(stop=stop)
        return True

    def run(self, stop: threading.Event) -> None:
        observer = self._start_observer()
        self.changed()  # compare once: a change between the first load and the watch is not missed
        try:
            # Idle, the thread sleeps on the change signal, which wake() (stop) also gives (an idle agent's
            # wakeups are its idle CPU, issue 16); a burst of changes is waited out in POLL steps, as before.
            while not stop.is_set():
                self._pending.wait()
                if stop.wait(POLL):
                    break
                self.poll(stop=stop)
        finally:
            if observer is not None:
                observer.stop()
                observer.join(timeout=2)

    def check(self, *, stop: threading.Event | None = None) -> bool:
        """Reload when a configuration file's content differs from what was last loaded. True when swapped."""
        current = fingerprint(self._paths)
        if current == self._loaded:
            self.unchanged += 1
            return False
        self._loaded = current  # also when rejected: the same broken content is not tried again
        return self.reload(stop=stop)

    def _start_observer(self) -> Any:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type in ("opened", "closed_no_write"):
                    return
                dest = getattr(event, "dest_path", None)
                watcher.seen(
                    os.fsdecode(event.src_path),
                    dest=os.fsdecode(dest) if dest else None,
                    is_directory=event.is_directory,
                )

        observer = Observer()
        handler = Handler()
        for directory, recursive in self._relevant.watches():
            try:
                observer.schedule(handler, str(directory), recursive=recursive)
                self.watching.append(str(directory))
            except OSError as exc:
                log.warning("cannot watch %s for changes (%s); changes there need a restart", directory, exc)
        try:
            observer.start()
        except OSError as exc:  # e.g. inotify instances exhausted
            log.warning("cannot watch the configuration for changes (%s); changes need a restart", exc)
            return None
        return observer

    def reload(self, *, stop: threading.Event | None = None) -> bool:
        """Load and validate everything again, as at start; swap it in if valid. True when swapped.

        Plugins load as at start: a hung import or factory, or one calling ``sys.exit``, becomes a
        BrokenCheck after its timeout (the watcher goes on), and ``stop`` abandons the wait."""
        old = self._current
        try:
            new = load_configuration(
                self._paths, context=self._context, entry_points=self._entry_points, previous=old, stop=stop
            )
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
        if [m.file.path for m in new.config.log_monitors] != [m.file.path for m in old.config.log_monitors]:
            log.warning("log monitor (filelog/journald) changes take effect at the next restart")
        removed = [c.name for c in old.checks if c.name not in {n.name for n in new.checks}]
        self.generation += 1
        if self._scheduler is not None:
            self._scheduler.replace(list(new.checks))
        item = Reconfigure(
            rule_set=new.config.rule_set, conditions=new.conditions, removed_checks=removed, generation=self.generation
        )
        self._inbox.put(item, stop=stop or threading.Event())
        self._current = new
        self.last_error = None
        for warning in new.warnings:
            log.warning("%s", warning)
        log.info(
            "configuration %d loaded: %d kernel log rules, %d checks%s",
            self.generation,
            len(new.config.rule_set.rules),
            len(new.checks),
            f" ({len(removed)} removed)" if removed else "",
        )
        return True

    @property
    def current(self) -> Loaded:
        """The configuration running now."""
        return self._current
