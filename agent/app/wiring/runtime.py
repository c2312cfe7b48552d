"""The assembled agent: its supervisor, the documents behind ``/healthz`` and ``/conditions``, its metrics."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.app.exitcodes import EXIT_OK
from agent.app.wiring.sources import Figures
from agent.core.bus import Inbox, Publication, SnapshotFeed
from agent.core.memory import release_free_memory
from agent.core.statedir import StateDirHealth
from agent.core.supervisor import Component, Supervisor
from agent.engine.mainloop import MainLoop
from agent.sinks.metrics import AgentStats
from agent.sinks.stdout import snapshot_json
from agent.sources.producer import SourceProducer

if TYPE_CHECKING:
    from agent.checks.scheduler import CheckScheduler

log = logging.getLogger(__name__)


def component_detail(component: Component) -> str | None:
    """What a component says about itself on ``/healthz``: its ``detail()``, else its ``last_error``."""
    detail = getattr(component, "detail", None)
    if callable(detail):
        return detail()
    return getattr(component, "last_error", None)


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """The assembled agent: run it with :meth:`run`; the documents back the HTTP endpoints."""

    supervisor: Supervisor
    feed: SnapshotFeed
    main_loop: MainLoop
    producer: SourceProducer
    state_dir: StateDirHealth
    # What /metrics and /conditions show: the latest publication, once it holds what had come in (CaughtUp)
    current: Callable[[], Publication]
    figures: Sequence[Figures]  # AgentStats' fields, each from the part that has it
    registry: Any
    scheduler: CheckScheduler | None = None  # when checks are configured
    inbox: Inbox | None = None

    def health_document(self) -> tuple[bool, dict]:
        components = self.supervisor.health()
        ok = all(components.values())
        details = {c.name: text for c in self.supervisor.components if (text := component_detail(c))}
        details.update(self.supervisor.crashed())
        body: dict[str, object] = {
            "status": "ok" if ok else "unhealthy",
            "components": components,
            "stateDir": {
                "path": str(self.state_dir.path),
                "ok": self.state_dir.ok,
                "problems": self.state_dir.problems(),
            },
        }
        if details:
            body["details"] = details
        return ok, body

    def conditions_document(self) -> dict:
        doc = snapshot_json(self.current().snapshot)
        doc["health"] = self.supervisor.health()
        return doc

    def stats(self) -> AgentStats:
        return agent_stats(self.figures)()

    def run(self, stop: threading.Event) -> int:
        # Everything built so far (rules, clients, modules) lives as long as the process: keep it out
        # of the garbage collector's full passes, which otherwise rescan it during a record storm.
        gc.collect()
        gc.freeze()
        release_free_memory()
        late = self.supervisor.run(stop)
        self.feed.close()
        log.info("stopped%s", f" (still running at the deadline: {', '.join(late)})" if late else "")
        return EXIT_OK


def agent_stats(parts: Sequence[Figures]) -> Callable[[], AgentStats]:
    """``AgentStats`` at scrape time, each field from the part that has it (a later part's wins)."""

    def stats() -> AgentStats:
        merged: dict[str, Any] = {}
        for figures in parts:
            merged.update(figures())
        return AgentStats(**merged)

    return stats
