"""Reading our conditions back from the Node at startup: a producer like any other.

Kubernetes mode must not write conditions before it knows what the Node already says (a restart
must neither reset a problem to healthy nor move ``lastTransitionTime``). When the state
directory kept our conditions, they are fresher and this only learns the Node's uid. The seeder
GETs the Node (retrying with the one Backoff while the API server is away) and puts a
:class:`~agent.core.bus.SeedConditions` into the inbox; the main loop adopts it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from agent.adapters.kube import KubeClient, KubeError
from agent.core.backoff import Backoff
from agent.core.bus import Inbox, SeedConditions
from agent.core.types import Condition, Severity, Status
from agent.core.validation import VALIDATIONS_ANNOTATION, BadValidation, ValidationRecord, parse_records

log = logging.getLogger(__name__)

# Severity of a True condition read back from a Node whose reason no loaded rule produces: error,
# not critical, so a reason we no longer know never flips AcceleratedHardwareReady (a replace signal).
UNKNOWN_REASON_SEVERITY = Severity.ERROR


def parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):
        return None


def node_conditions(
    node: dict, *, types: Sequence[str], severity: Callable[[str, str], Severity | None], now: float
) -> list[Condition]:
    """Our condition types as found on a Node object. ``severity`` maps (type, reason) to the rule's
    severity, or None for a reason no loaded rule produces (then :data:`UNKNOWN_REASON_SEVERITY`)."""
    found = []
    for raw in (node.get("status") or {}).get("conditions") or []:
        if not isinstance(raw, dict) or raw.get("type") not in types:
            continue
        try:
            status = Status(str(raw.get("status")))
        except ValueError:
            continue
        reason = str(raw.get("reason") or "")
        level = Severity.INFO
        if status is Status.TRUE:
            level = severity(raw["type"], reason) or UNKNOWN_REASON_SEVERITY
        found.append(
            Condition(
                type=raw["type"],
                status=status,
                reason=reason,
                message=str(raw.get("message") or ""),
                last_transition=parse_time(raw.get("lastTransitionTime")) or now,
                last_update=parse_time(raw.get("lastHeartbeatTime")) or now,
                severity=level,
            )
        )
    return found


def node_validations(node: dict) -> tuple[ValidationRecord, ...]:
    """The validation records the agent wrote on the Node before it restarted (none when unreadable: logged)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(VALIDATIONS_ANNOTATION)
    if not isinstance(text, str):
        return ()
    try:
        return parse_records(text)
    except BadValidation as exc:
        log.warning("the Node's validation records cannot be read (%s); starting without them", exc)
        return ()


def node_uid(node: dict) -> str | None:
    return (node.get("metadata") or {}).get("uid") or None


class NodeSeeder:
    """Producer component ``node_seeder``: reads the Node once, then idles until shutdown."""

    name = "node_seeder"

    def __init__(
        self,
        *,
        client: KubeClient,
        node_name: str,
        inbox: Inbox,
        types: Sequence[str],
        severity: Callable[[str, str], Severity | None],
        clock: Callable[[], float] = time.time,
        backoff: Backoff | None = None,
        on_node: Callable[[dict], None] | None = None,
    ) -> None:
        """``on_node`` receives the Node once read (the checks' view of its labels)."""
        self._on_node = on_node
        self._client = client
        self._node = node_name
        self._inbox = inbox
        self._types = tuple(types)
        self._severity = severity
        self._clock = clock
        self._backoff = backoff or Backoff(initial=0.5, maximum=30.0, jitter=0.2)
        self.done = threading.Event()
        self.last_error: str | None = None

    def healthy(self, now: float) -> bool:
        return True  # an absent API server is the cluster's trouble, not the agent's (see last_error)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                node = self._client.get_node(self._node)
            except KubeError as exc:
                self.last_error = str(exc)
                delay = self._backoff.next_delay(retry_after=exc.retry_after)
                log.warning("cannot read node %s yet (retrying in %.1fs): %s", self._node, delay, exc)
                stop.wait(delay)
                continue
            self.last_error = None
            if self._on_node is not None:
                self._on_node(node)
            seed = SeedConditions(
                conditions=node_conditions(node, types=self._types, severity=self._severity, now=self._clock()),
                node_uid=node_uid(node),
                validations=node_validations(node),
            )
            if self._inbox.put(seed, stop=stop):
                self.done.set()
                log.info("read node %s: %d of our conditions adopted", self._node, len(seed.conditions))
            break
        stop.wait()
