"""Component ``clear_ack``: the clears the main loop handled, written on the Node as the acknowledgement.

The records (who, why, when, the outcome and the boundary) go into the Node's annotation
:data:`~agent.core.clears.CLEARS_ANNOTATION` (:class:`~agent.sinks.annotation.AnnotationSink`).
``node-health-agent clear`` waits for it; ``status`` shows it.
"""

from __future__ import annotations

from agent.adapters.kube import KubeClient
from agent.core.bus import Publication, SnapshotFeed
from agent.core.clears import CLEARS_ANNOTATION, records_text
from agent.sinks.annotation import AnnotationSink


class ClearAckSink(AnnotationSink):
    name = "clear_ack"
    annotation = CLEARS_ANNOTATION
    what = "clear records"

    def __init__(self, *, client: KubeClient, node_name: str, feed: SnapshotFeed, resync: float = 10.0) -> None:
        super().__init__(client=client, node_name=node_name, feed=feed, resync=resync, initial=records_text(()))

    def text(self, pub: Publication) -> str:
        return records_text(pub.snapshot.clears)
