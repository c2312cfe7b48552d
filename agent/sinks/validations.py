"""Component ``validations``: the active checks' validation records, written on the Node.

The newest record per check and device (bounded: :data:`~agent.core.validation.MAX_RECORDS`) as compact
JSON in the annotation :data:`~agent.core.validation.VALIDATIONS_ANNOTATION`, through the status
subresource the agent already writes (the admission policy lets the agent change only its own
annotations). One PATCH when the records change; changes that come while a write is on its way or in
backoff are coalesced into the next one. ``node-health-agent status`` reads it.
"""

from __future__ import annotations

from agent.adapters.kube import KubeClient, KubeError
from agent.core.bus import Publication, SnapshotFeed
from agent.core.validation import VALIDATIONS_ANNOTATION, records_text
from agent.sinks.worker import SinkWorker


class ValidationSink(SinkWorker):
    name = "validations"

    def __init__(self, *, client: KubeClient, node_name: str, feed: SnapshotFeed, resync: float = 10.0) -> None:
        super().__init__(feed=feed, resync=resync)
        self._client = client
        self._node = node_name
        self._wanted = records_text(())
        self._written = self._wanted  # nothing to say until a check has run

    def take(self, pub: Publication) -> None:
        self._wanted = records_text(pub.snapshot.validations)

    def work(self, now: float) -> float:
        if self._wanted == self._written or self.in_backoff(now):
            return self.retry_in(now) or 60.0
        wanted = self._wanted
        body = {"metadata": {"annotations": {VALIDATIONS_ANNOTATION: wanted}}}
        try:
            self._client.patch_node_status(self._node, body)
        except KubeError as exc:
            self.failed(exc, what="writing the validation records", now=now)
            return self.retry_in(now) or 60.0
        self._written = wanted
        self.succeeded()
        return 60.0

    def finish(self, now: float) -> None:
        self.work(now)
