"""Sending recovery's Events (from the catalogue, agent.recovery.events) to the main loop, each once where
it says so."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agent.core.bus import Inbox, Notice
from agent.core.types import Event, Severity, Snapshot
from agent.recovery import events
from agent.recovery.events import Told
from agent.recovery.model import Incident, RecoveryPolicy

log = logging.getLogger("agent.recovery.loop")

SOURCE = "recovery"


class Herald:
    """Tells Events through ``inbox``; remembers what it told once (per incident, or per record text)."""

    def __init__(self, *, inbox: Inbox, node_name: str, clock: Callable[[], float]) -> None:
        self._inbox = inbox
        self._node_name = node_name
        self.clock = clock
        self.stop = threading.Event()
        self._said: set[tuple[str, str]] = set()  # (incident id, what) already told in an Event

    def tell(self, incident: Incident | None, told: Told) -> None:
        """Send ``told``; one with a ``once`` key at most once per incident and key."""
        if told.once and incident is not None:
            if (incident.id, told.once) in self._said:
                return
            self._said.add((incident.id, told.once))
        self._send(incident, told)

    def corrupt(self, annotation: str, text: str, what: str) -> None:
        """Tell once per annotation text (a problem may name the time) that a record on the Node is corrupt."""
        if (text, annotation) in self._said:
            return
        self._said.add((text, annotation))
        log.warning("recovery: node %s: annotation %s %s", self._node_name, annotation, what)
        self._send(None, events.corrupt(annotation, self._node_name, what))

    def untrusted(self, snapshot: Snapshot, policy: RecoveryPolicy) -> int:
        """Tell once per episode about a problem a rule would act on but whose owner it does not trust; how
        many were told now."""
        from agent.recovery.policy import untrusted

        told = 0
        for condition, rule in untrusted(snapshot, policy):
            key = (f"{condition.type}/{condition.reason}/{int(condition.last_transition)}", "untrusted")
            if key in self._said:
                continue
            self._said.add(key)
            told += 1
            owner = snapshot.provenance.get(condition.type)
            self._send(None, events.untrusted(condition, rule, owner.value if owner else "source of unknown kind"))
        return told

    def _send(self, incident: Incident | None, told: Told) -> None:
        log.info("recovery: %s: %s", told.reason, told.message)
        event = Event(
            type=told.type,
            reason=told.reason,
            message=told.message,
            timestamp=self.clock(),
            source=SOURCE,
            severity=Severity.WARNING if told.type == events.WARNING else Severity.INFO,
            fields={"incident": incident.id} if incident is not None else {},
        )
        self._inbox.put(Notice(events=[event]), stop=self.stop)
