"""The sink-worker base: error classes, backoff, health, waiting; and the tools the sink tests share.

Shared tools (imported by ``test_condition_sink`` and ``test_event_sink``): :class:`SimTime`
(simulated time the sink's injected ``monotonic``/``clock``/``wait`` run on), :class:`Recorder`
(the real client, noting the simulated time of each call), :func:`node_api` (the test API server
with a Node) and :func:`running` (a sink in its own thread).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agent.adapters.kube import MAX_RETRY_AFTER, KubeError, _api_error, parse_retry_after
from agent.core.bus import Publication, SnapshotFeed
from agent.core.supervisor import Supervisor
from agent.core.types import Status
from agent.sinks.conditions import ConditionSink
from agent.sinks.events import EventSink
from agent.sinks.worker import Failure, SinkWorker, classify

from helpers import kube_client, wait_for
from helpers.sinks import (
    NODE,
    SimTime,
    condition,
    event,
    node_api,
    publish,
    running,
    snapshot,
)
from helpers.threads import wakeups_while_asleep

# ---- shared tools ------------------------------------------------------------------------------


# ---- error classes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "reason", "gone_on_404", "expected"),
    [
        (None, "", False, Failure.TRANSIENT),  # no answer, or a timeout
        (408, "Timeout", False, Failure.TRANSIENT),
        (409, "Conflict", False, Failure.TRANSIENT),
        (429, "TooManyRequests", False, Failure.TRANSIENT),
        (500, "InternalError", False, Failure.TRANSIENT),
        (503, "ServiceUnavailable", False, Failure.TRANSIENT),
        (504, "Timeout", False, Failure.TRANSIENT),
        (400, "BadRequest", False, Failure.PERMANENT),
        (401, "Unauthorized", False, Failure.PERMANENT),
        (403, "Forbidden", False, Failure.PERMANENT),
        (404, "NotFound", False, Failure.PERMANENT),  # the Node
        (404, "NotFound", True, Failure.GONE),  # an aggregated Event that expired
        (422, "Invalid", False, Failure.PERMANENT),
        (418, "Unknown", False, Failure.PERMANENT),
    ],
)
def test_classify(status, reason, gone_on_404, expected):
    assert classify(KubeError("x", status=status, reason=reason), gone_on_404=gone_on_404) is expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("5", 5.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("2.5", 2.5),
        ("86400", MAX_RETRY_AFTER),  # clamped
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),  # HTTP-date form: ignored
        ("-3", None),
        ("soon", None),
        (None, None),
    ],
)
def test_retry_after_header(header, expected):
    assert parse_retry_after(header) == expected


@pytest.mark.parametrize(
    ("status", "headers", "body", "retry", "reason", "exists"),
    [
        (
            429,
            {"Retry-After": "7"},
            '{"reason": "TooManyRequests", "details": {"retryAfterSeconds": 7}}',
            7.0,
            "TooManyRequests",
            False,
        ),
        (
            503,
            {},
            '{"reason": "ServiceUnavailable", "details": {"retryAfterSeconds": 3}}',
            3.0,
            "ServiceUnavailable",
            False,
        ),
        (
            409,
            {},
            '{"reason": "AlreadyExists", "message": "events \\"x\\" already exists"}',
            None,
            "AlreadyExists",
            True,
        ),
        (409, {}, '{"reason": "Conflict"}', None, "Conflict", False),
        (500, {}, "not json", None, "Internal Server Error", False),
    ],
)
def test_api_exception_becomes_a_kube_error(status, headers, body, retry, reason, exists):
    exc = ApiException(status=status, reason="Internal Server Error")
    exc.headers, exc.body = headers, body
    error = _api_error("call", exc)
    assert (error.status, error.retry_after, error.reason, error.already_exists) == (status, retry, reason, exists)


def test_the_real_client_reports_retry_after_and_already_exists(tmp_path):
    with node_api() as server, kube_client(server, tmp_path) as client:
        server.faults.add(method="PATCH", path_regex=r"/nodes/.*/status$", status=503, retry_after=5)
        with pytest.raises(KubeError) as raised:
            client.patch_node_status(NODE, {"status": {"conditions": []}})
        assert (raised.value.status, raised.value.retry_after, raised.value.transient) == (503, 5.0, True)
        body = {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Node", "name": NODE}, "reason": "R"}
        client.create_event("default", body)
        with pytest.raises(KubeError) as raised:
            client.create_event("default", body)
        assert raised.value.already_exists


def test_the_client_timeout_is_injectable_and_a_slow_answer_is_no_answer(tmp_path):
    """The ``slow`` fault stores the object but answers after the client gave up."""
    with node_api() as server, kube_client(server, tmp_path, timeout=0.3) as client:
        server.faults.add(method="POST", path_regex="/events$", kind="slow", delay=1.0)
        body = {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Node", "name": NODE}, "reason": "R"}
        with pytest.raises(KubeError) as raised:
            client.create_event("default", body)
        assert raised.value.status is None and raised.value.transient
        assert server.get_object("events", "e1", "default") is not None


# ---- the worker loop ---------------------------------------------------------------------------


class Probe(SinkWorker):
    """A worker whose writes a test scripts: each of ``outcomes`` is raised (a KubeError) or a success (None)."""

    name = "probe"

    def __init__(self, *, outcomes: list[KubeError | None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outcomes = outcomes
        self.attempts: list[float] = []
        self.taken: list[int] = []
        self.finished = False
        self.hang = threading.Event()  # set: a write hangs until ``release`` is set
        self.release = threading.Event()

    def take(self, pub: Publication) -> None:
        self.taken.append(pub.number)

    def work(self, now: float) -> float:
        if not self.outcomes:
            return 3600.0
        if self.in_backoff(now):
            return self.retry_in(now)
        self.attempts.append(now)
        self.beat()
        if self.hang.is_set():
            self.release.wait(15)
        outcome = self.outcomes.pop(0)
        if outcome is None:
            self.succeeded()
        else:
            self.failed(outcome, what="probe write", now=now)
        return 0.0

    def finish(self, now: float) -> None:
        self.finished = True


def probe(outcomes: list[KubeError | None], sim: SimTime, **kwargs: Any) -> Probe:
    return Probe(
        outcomes=outcomes,
        feed=SnapshotFeed(initial=snapshot()),
        clock=sim.clock,
        monotonic=sim.monotonic,
        wait=sim.wait,
        rng=random.Random(7).random,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("retry_after_", "resync", "floor"),
    [(5.0, 10.0, 10.0), (25.0, 10.0, 25.0), (None, 10.0, 10.0), (None, 2.0, 2.0)],
    ids=["retry-after-below-resync", "retry-after-above-resync", "no-retry-after", "short-resync"],
)
def test_transient_failures_back_off_no_faster_than_retry_after_and_resync(retry_after_, resync, floor):
    sim = SimTime()
    unavailable = KubeError("503", status=503, reason="ServiceUnavailable", retry_after=retry_after_)
    worker = probe([unavailable] * 6 + [None], sim, resync=resync, max_backoff=60.0)
    with running(worker, sim):
        sim.advance(600)
    gaps = [b - a for a, b in zip(worker.attempts, worker.attempts[1:], strict=False)]
    assert len(worker.attempts) == 7 and all(gap >= floor for gap in gaps)
    assert max(gaps) <= 60.0 * 1.2 + 1e-9  # capped (with jitter)
    assert worker.failures == {"transient": 6} and worker.writes == 1
    assert worker.last_error is None, "a success clears the last error"


def test_an_outage_costs_a_sink_at_most_one_write_a_minute():
    """Each node has two sinks writing to the API server: the fleet's bound while it is down is 2 requests
    per node-minute, the backoff's ramp (10, 20, 40 s, ...) included."""
    sim = SimTime()
    down = KubeError("no answer from the API server", status=None)
    worker = probe([down] * 100, sim)  # the default resync and backoff
    with running(worker, sim):
        sim.advance(600)
    assert 5 <= len(worker.attempts) <= 10, worker.attempts


def test_permanent_failures_are_dropped_counted_by_status_and_logged_once(caplog):
    sim = SimTime()
    invalid = KubeError("422 no", status=422, reason="Invalid")
    forbidden = KubeError("403 no", status=403, reason="Forbidden")
    worker = probe([invalid, invalid, forbidden, invalid, None], sim)
    with running(worker, sim):
        sim.advance(1)
    assert len(worker.attempts) == 5 and worker.attempts[0] == worker.attempts[-1], "no backoff after a refusal"
    assert worker.dropped == {422: 3, 403: 1}
    assert worker.failures == {"permanent": 4}
    refusals = [r for r in caplog.records if r.levelname == "ERROR" and "refused" in r.getMessage()]
    assert [r.getMessage().split(": ")[-1] for r in refusals] == ["422 no", "403 no"]


def test_health_is_the_loop_beating_not_the_api_answering():
    sim = SimTime()
    worker = probe([KubeError("down", status=None)] * 100, sim, stall=60.0)
    with running(worker, sim):
        sim.advance(300)
        assert worker.healthy(sim.now), "a failing API is not a worker problem"
        assert worker.last_error == "down"
        assert not worker.healthy(sim.now + worker.retry_in(sim.now) + 61), "a loop that stopped beating"
    assert worker.finished
    assert not worker.healthy(sim.now), "an exited worker is unhealthy"


def test_a_wedged_write_turns_unhealthy_after_the_stall_bound():
    sim = SimTime()
    worker = probe([None], sim, stall=30.0)
    worker.hang.set()
    with running(worker, sim):
        wait_for(lambda: worker.attempts)
        assert worker.healthy(sim.now + 29)
        assert not worker.healthy(sim.now + 31)
        worker.release.set()


def test_an_unexpected_error_is_counted_reported_and_backed_off_never_the_end_of_the_sink(caplog):
    """A bug (here: a write that divides by zero twice) costs a loop turn, not the component: the loop
    backs off like after a failure, says so in /healthz details, logs the traceback once, and goes on."""
    sim = SimTime()
    worker = probe([None], sim, resync=10.0)
    real_work = worker.work
    crashes = [ZeroDivisionError("division by zero")] * 2

    def work(now: float) -> float:
        if crashes:
            worker.attempts.append(now)
            raise crashes.pop()
        return real_work(now)

    worker.work = work  # type: ignore[method-assign]
    with running(worker, sim):
        sim.advance(120)
        assert worker.healthy(sim.now), "the loop still beats"
        assert worker.writes == 1, "the write after the bug went out"
    gaps = [b - a for a, b in zip(worker.attempts, worker.attempts[1:], strict=False)]
    assert len(worker.attempts) == 3 and all(gap >= 10.0 for gap in gaps), "backed off, no busy loop"
    assert worker.bugs == 2
    assert (
        worker.detail() == "2 unexpected error(s), a bug (latest: the sink loop: ZeroDivisionError: division by zero)"
    )
    tracebacks = [r for r in caplog.records if r.levelname == "ERROR" and r.exc_info]
    assert len(tracebacks) == 1, "the traceback is logged once per exception type and place"


def test_default_wait_ends_early_on_a_new_publication_and_on_stop():
    """Real time, but no threshold: the waits are an hour long and the test's waits are bounded."""
    feed = SnapshotFeed(initial=snapshot())
    worker = Probe(outcomes=[], feed=feed)  # real clocks, the default wait
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(lambda: worker.taken == [0])  # the feed's initial publication
    publish(feed)
    wait_for(lambda: worker.taken == [0, 1])
    publish(feed)
    wait_for(lambda: worker.taken == [0, 1, 2])
    feed.close()  # a closed feed no longer blocks: the wait must not spin, and stop still ends it
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and worker.finished


@pytest.mark.slow  # watches for 5.5 s: past the 5 s look at stop it had
def test_an_idle_sink_worker_sleeps_until_a_publication_or_the_feed_closes():
    """No look at stop every few seconds (each is an idle wakeup, issue 16): the supervisor closes the feed."""
    feed = SnapshotFeed(initial=snapshot())
    worker = Probe(outcomes=[], feed=feed)  # real clocks, the default wait, an hour's pause
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(lambda: worker.taken == [0])
    assert thread.native_id is not None
    assert wakeups_while_asleep(thread.native_id, sleeps_in=["futex"], window=5.5) == 0  # past the old 5 s look
    stop.set()
    feed.close()
    thread.join(timeout=10)
    assert not thread.is_alive() and worker.finished


def test_both_sinks_run_as_components_under_the_supervisor(tmp_path):
    """Real time and the default wait, end to end: write, report healthy, stop within the deadline."""
    with node_api() as server, kube_client(server, tmp_path) as client:
        feed = SnapshotFeed(initial=snapshot(seeded=False))
        conditions = ConditionSink(client=client, feed=feed, node_name=NODE)
        events = EventSink(client=client, feed=feed, node_name=NODE, state_dir=tmp_path / "state")
        supervisor = Supervisor(components=[conditions, events], on_stop=[feed.close])
        stop = threading.Event()
        supervisor.start(stop)
        pub = publish(
            feed, snapshot(condition(status=Status.TRUE, reason="NeuronHasError_DMA_ERROR")), [event(at=SimTime.EPOCH)]
        )
        wait_for(lambda: conditions.in_sync and events.pending() == 0 and events.acked() == pub.number)
        assert supervisor.health() == {"condition_sink": True, "event_sink": True}
        types = {c["type"]: c["status"] for c in server.get_object("nodes", NODE)["status"]["conditions"]}
        assert types == {"Ready": "True", "NeuronHealth": "True"}
        (stored,) = server.list_objects("events", "default")
        assert stored["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1"}
        stop.set()
        assert supervisor.join(deadline=time.monotonic() + 5) == []
