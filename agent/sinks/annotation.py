"""One annotation on the agent's own Node, kept equal to what the latest publication says.

The text goes through the status subresource the agent already writes (built-in kinds let ``/status``
change metadata; the admission policy lets the agent change only its own annotations). One PATCH when
the text changes; changes that come while a write is on its way or in backoff are coalesced into the
next one. :mod:`agent.sinks.clearack` and :mod:`agent.sinks.validations` are two of them."""

from __future__ import annotations

from agent.adapters.kube import KubeClient, KubeError
from agent.core.bus import Publication, SnapshotFeed
from agent.sinks.worker import SinkWorker


class AnnotationSink(SinkWorker):
    """Writes ``annotation`` = :meth:`text` of the latest publication, when it changed."""

    annotation = ""  # the Node annotation written
    what = ""  # for messages: "writing the <what>"

    def __init__(
        self, *, client: KubeClient, node_name: str, feed: SnapshotFeed, resync: float = 10.0, initial: str
    ) -> None:
        super().__init__(feed=feed, resync=resync)
        self._client = client
        self._node = node_name
        self._wanted = initial
        self._written = initial  # nothing to say until the publication says something else

    def text(self, pub: Publication) -> str:
        raise NotImplementedError

    def take(self, pub: Publication) -> None:
        self._wanted = self.text(pub)

    def work(self, now: float) -> float:
        if self._wanted == self._written or self.in_backoff(now):
            return self.retry_in(now) or 60.0
        wanted = self._wanted
        body = {"metadata": {"annotations": {self.annotation: wanted}}}
        try:
            self._client.patch_node_status(self._node, body)
        except KubeError as exc:
            self.failed(exc, what=f"writing the {self.what}", now=now)
            return self.retry_in(now) or 60.0
        self._written = wanted
        self.succeeded()
        return 60.0

    def finish(self, now: float) -> None:
        self.work(now)
