"""Component ``validations``: the active checks' validation records, written on the Node.

The newest record per check and device (bounded: :data:`~agent.core.validation.MAX_RECORDS`) as compact
JSON in the annotation :data:`~agent.core.validation.VALIDATIONS_ANNOTATION`
(:class:`~agent.sinks.annotation.AnnotationSink`). ``node-health-agent status`` reads it.
"""

from __future__ import annotations

from agent.adapters.kube import KubeClient
from agent.core.bus import Publication, SnapshotFeed
from agent.core.validation import VALIDATIONS_ANNOTATION, records_text
from agent.sinks.annotation import AnnotationSink


class ValidationSink(AnnotationSink):
    name = "validations"
    annotation = VALIDATIONS_ANNOTATION
    what = "validation records"

    def __init__(self, *, client: KubeClient, node_name: str, feed: SnapshotFeed, resync: float = 10.0) -> None:
        super().__init__(client=client, node_name=node_name, feed=feed, resync=resync, initial=records_text(()))

    def text(self, pub: Publication) -> str:
        return records_text(pub.snapshot.validations)
