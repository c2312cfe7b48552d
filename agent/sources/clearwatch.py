"""The operator's clear requests on this Node: a producer that reads the Node every ``interval``.

``node-health-agent clear`` writes the request annotation; this reads it (and the records the Node
keeps) and puts a :class:`~agent.core.clears.NodeClears` into the inbox. It decides nothing: the main
loop applies a request once, by its id. One GET of its own Node per interval (60 s by default: a
fleet of 2,000 nodes adds about 33 reads a second).
"""

from __future__ import annotations

import logging
import threading

from agent.adapters.kube import KubeClient, KubeError
from agent.core.bus import Inbox
from agent.core.clears import (
    CLEAR_REQUEST_ANNOTATION,
    CLEARS_ANNOTATION,
    BadClear,
    ClearRecord,
    ClearRequest,
    NodeClears,
    parse_records,
)
from agent.core.clears import parse_request as parse_clear_request

log = logging.getLogger(__name__)

CLEAR_POLL = 60.0


def node_clears(node: dict) -> NodeClears:
    """What ``node`` says of clears; an unreadable request or record set is named, never raised."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    request: ClearRequest | None = None
    problem: str | None = None
    records: tuple[ClearRecord, ...] = ()
    raw = annotations.get(CLEAR_REQUEST_ANNOTATION)
    if raw is not None:
        try:
            request = parse_clear_request(raw)
        except BadClear as exc:
            problem = str(exc)
    if (kept := annotations.get(CLEARS_ANNOTATION)) is not None:
        try:
            records = parse_records(kept)
        except BadClear as exc:
            problem = problem or str(exc)
    return NodeClears(request=request, records=records, problem=problem)


class ClearWatcher:
    """Producer component ``clear_watcher``."""

    name = "clear_watcher"

    def __init__(self, *, client: KubeClient, node_name: str, inbox: Inbox, interval: float = CLEAR_POLL) -> None:
        self._client = client
        self._node = node_name
        self._inbox = inbox
        self._interval = interval
        self.last_error: str | None = None
        self._told: str | None = None

    def healthy(self, now: float) -> bool:
        return True  # an absent API server is the cluster's trouble (see last_error)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval):
            try:
                node = self._client.get_node(self._node)
            except KubeError as exc:
                self.last_error = str(exc)
                continue
            self.last_error = None
            found = node_clears(node)
            if found.problem is not None and found.problem != self._told:
                log.error("node %s: ignoring an unreadable clear annotation: %s", self._node, found.problem)
            self._told = found.problem
            if found.request is not None or found.records:
                self._inbox.put(found, stop=stop)
