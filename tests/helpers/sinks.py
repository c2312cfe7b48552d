"""What the sink tests share: simulated time, a recording client, the test API server with a Node, a
sink in a thread, and values to publish.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from agent.adapters.kube import KubeClient
from agent.core.bus import Publication, SnapshotFeed
from agent.core.types import Condition, Event, Severity, Snapshot, Status
from agent.sinks.metrics import AgentStats
from agent.sinks.worker import SinkWorker

from kubeapi.server import KubeApiServer

NODE = "ip-10-0-0-1.ec2.internal"


KUBELET_CONDITIONS = [
    {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
]


class SimTime:
    """Simulated time for one sink thread.

    ``monotonic`` and ``clock`` read it; ``wait`` (the sink's injected wait) uses up simulated
    seconds, but never past ``horizon``: there the sink *parks* (it returns after a short real
    pause, as a wait cut short by a new publication does) until the test moves the horizon.
    """

    EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z

    def __init__(self, *, start: float = 1_000.0) -> None:
        self._cond = threading.Condition()
        self.now = start
        self.horizon = start
        self.parks = 0
        self.stop = threading.Event()

    def monotonic(self) -> float:
        return self.now

    def clock(self) -> float:
        return self.EPOCH + self.now

    def wait(self, seconds: float) -> bool:
        with self._cond:
            target = self.now + max(0.0, seconds)
            if target <= self.horizon:
                self.now = target
            else:
                self.now = self.horizon
                self.parks += 1
                self._cond.notify_all()
                self._cond.wait(timeout=0.01)
        return self.stop.is_set()

    def run(self, *, until: float | None = None, timeout: float = 15.0) -> None:
        """Let the sink use simulated time up to ``until`` and do all it has to do by then
        (including whatever was published before this call); bounded by ``timeout`` real seconds."""
        with self._cond:
            if until is not None:
                self.horizon = max(self.horizon, until)
            target = self.parks + 2  # the second park follows a look at the feed made after this call
            assert self._cond.wait_for(lambda: self.parks >= target and self.now >= self.horizon, timeout)

    def advance(self, seconds: float) -> None:
        self.run(until=self.horizon + seconds)


class Recorder:
    """The real :class:`KubeClient`, noting (simulated time, method) of each call in ``calls``."""

    def __init__(self, client: KubeClient, sim: SimTime) -> None:
        self._client = client
        self._sim = sim
        self.calls: list[tuple[float, str]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((self._sim.now, name))
            return method(*args, **kwargs)

        return call

    def times(self, name: str) -> list[float]:
        return [t for t, n in self.calls if n == name]


@contextlib.contextmanager
def node_api() -> Iterator[KubeApiServer]:
    """The test API server holding Node ``NODE`` with kubelet's Ready condition."""
    server = KubeApiServer()
    server.start()
    server.put_object(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "status": {"conditions": KUBELET_CONDITIONS}}
    )
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running(sink: SinkWorker, sim: SimTime) -> Iterator[threading.Thread]:
    """``sink.run(sim.stop)`` in a thread; stopped (and its final flush done) on exit."""
    thread = threading.Thread(target=sink.run, args=(sim.stop,), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        sim.stop.set()
        thread.join(timeout=15)
        assert not thread.is_alive(), "the sink did not stop"


def condition(type_: str = "NeuronHealth", status: Status = Status.FALSE, reason: str = "NeuronIsHealthy") -> Condition:
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=f"{type_} {reason}",
        last_transition=SimTime.EPOCH,
        last_update=SimTime.EPOCH,
        severity=Severity.CRITICAL if status is Status.TRUE else Severity.INFO,
    )


def snapshot(*conditions: Condition, seeded: bool = True, node_uid: str | None = "uid-1") -> Snapshot:
    return Snapshot(conditions=tuple(conditions), generated_at=SimTime.EPOCH, seeded=seeded, node_uid=node_uid)


def event(reason: str = "OOMKilling", message: str = "Killed process 4242 (python)", *, at: float) -> Event:
    return Event(type="Warning", reason=reason, message=message, timestamp=at, source="kmsg", severity=Severity.WARNING)


def publish(feed: SnapshotFeed, snap: Snapshot | None = None, events: list[Event] | tuple = ()) -> Publication:
    return feed.publish(snapshot=snap or feed.latest().snapshot, events=list(events), health={})


# The agent's own figures before it has read anything: what a collector test needs beside a snapshot.
IDLE_STATS = AgentStats(
    records_read=0,
    records_lost=0,
    reader_restarts=0,
    read_errors=0,
    parse_errors=0,
    last_record_time=None,
    lines_matched=0,
    rule_matches={},
    config_generation=1,
    rules_loaded=0,
    components={},
)
