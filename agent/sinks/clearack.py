"""Component ``clear_ack``: the clears the main loop handled, written on the Node as the acknowledgement.

The records (who, why, when, the outcome and the boundary) go into the Node's annotation
:data:`~agent.core.clears.CLEARS_ANNOTATION` through the status subresource the agent already writes
(built-in kinds let ``/status`` change metadata; the admission policy lets the agent change only its
own annotations). ``node-health-agent clear`` waits for it; ``status`` shows it.
"""

from __future__ import annotations

from agent.adapters.kube import KubeClient, KubeError
from agent.core.bus import Publication, SnapshotFeed
from agent.core.clears import CLEARS_ANNOTATION, ClearRecord, records_text
from agent.sinks.worker import SinkWorker


class ClearAckSink(SinkWorker):
    name = "clear_ack"

    def __init__(self, *, client: KubeClient, node_name: str, feed: SnapshotFeed, resync: float = 10.0) -> None:
        super().__init__(feed=feed, resync=resync)
        self._client = client
        self._node = node_name
        self._wanted: tuple[ClearRecord, ...] = ()
        self._written: tuple[ClearRecord, ...] = ()

    def take(self, pub: Publication) -> None:
        self._wanted = pub.snapshot.clears

    def work(self, now: float) -> float:
        if self._wanted == self._written or self.in_backoff(now):
            return self.retry_in(now) or 60.0
        wanted = self._wanted
        body = {"metadata": {"annotations": {CLEARS_ANNOTATION: records_text(wanted)}}}
        try:
            self._client.patch_node_status(self._node, body)
        except KubeError as exc:
            self.failed(exc, what="writing the clear records", now=now)
            return self.retry_in(now) or 60.0
        self._written = wanted
        self.succeeded()
        return 60.0

    def finish(self, now: float) -> None:
        self.work(now)
