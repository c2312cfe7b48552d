"""Component ``config_watcher`` (with ``--watch-config``): a valid change of the configuration files is
reloaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.app.config import Loaded
from agent.app.settings import Settings
from agent.app.wiring.sources import Figures
from agent.checks.model import CheckContext
from agent.core.bus import Inbox

if TYPE_CHECKING:
    from agent.app.reload import ConfigWatcher, Fingerprint
    from agent.checks.scheduler import CheckScheduler


@dataclass(frozen=True, kw_only=True)
class Watch:
    """What a reload starts from: the configuration as loaded, the checks' context, the files' fingerprint."""

    loaded: Loaded
    context: CheckContext
    files: Fingerprint | None = None  # of the configuration files as loaded


def config_watcher(
    settings: Settings, watch: Watch | None, *, scheduler: CheckScheduler | None, inbox: Inbox
) -> ConfigWatcher | None:
    """The watcher with ``--watch-config`` (and a configuration to start from), else None."""
    if not settings.watch_config or watch is None:
        return None
    from agent.app.reload import ConfigWatcher

    return ConfigWatcher(
        paths=list(settings.rule_paths),
        current=watch.loaded,
        context=watch.context,
        scheduler=scheduler,
        inbox=inbox,
        files=watch.files,
        ignore=[settings.state_dir],  # never react to the agent's own writes
    )


def watcher_figures(watcher: ConfigWatcher | None) -> Figures:
    """The configuration generation in effect and the changes rejected (the start's without a watcher)."""
    if watcher is None:
        return lambda: {"config_generation": 1}
    return lambda: {"config_generation": watcher.generation, "config_reload_failures": watcher.failures}
