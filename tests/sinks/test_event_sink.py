"""The Event sink and its outbox against the test API server (real client), on simulated time."""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.core.bounds import bounded_reason
from agent.core.bus import SnapshotFeed
from agent.core.types import Event, Severity, Status
from agent.sinks.events import EventSink, ReasonBuckets, event_name
from agent.sinks.outbox import OUTBOX_FILE, Outbox, Series

from helpers import kube_client
from helpers.sinks import NODE, Recorder, SimTime, event, node_api, publish, running, snapshot

EVENTS = r"/namespaces/[^/]+/events"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
T0 = SimTime.EPOCH + 1_000.0  # when SimTime starts, on the wall clock
OOM = "Killed process 4242 (python) total-vm:1kB"
DMA = "NEURON_HW_ERR=DMA_ERROR nd-id=0"


@pytest.fixture
def api():
    with node_api() as server:
        yield server


class Setup:
    def __init__(self, server, client, state_dir: Path | None, **kwargs) -> None:
        self.server = server
        self.sim = SimTime()
        self.feed = SnapshotFeed(initial=snapshot())
        self.client = Recorder(client, self.sim)
        self.state_dir = state_dir
        self.sink = EventSink(
            client=self.client,
            feed=self.feed,
            node_name=NODE,
            state_dir=state_dir,
            clock=self.sim.clock,
            monotonic=self.sim.monotonic,
            wait=self.sim.wait,
            rng=random.Random(5).random,
            **kwargs,
        )

    def stored(self, namespace: str = "default") -> dict[str, dict]:
        """Events on the server by reason."""
        found: dict[str, dict] = {}
        for e in self.server.list_objects("events", namespace):
            assert e["reason"] not in found, f"two Event objects for {e['reason']}"
            found[e["reason"]] = e
        return found

    def writes(self, method: str | None = None) -> list:
        return self.server.requests.filter(method=method, path_regex=EVENTS)


@pytest.fixture
def setup(api, tmp_path) -> Iterator[Callable[..., Setup]]:
    """``setup(**sink_kwargs)``: a sink on simulated time with the real client (0.3 s call timeout)."""
    with contextlib.ExitStack() as stack:

        def make(*, state_dir: Path | None = tmp_path / "state", **kwargs) -> Setup:
            client = stack.enter_context(kube_client(api, tmp_path, timeout=0.3))
            return Setup(api, client, state_dir, **kwargs)

        yield make


# ---- the faults this fixes ---------------------------------------------------------------------


@pytest.mark.parametrize("slow_answers", [1, 3])
def test_a_create_whose_answer_is_lost_makes_exactly_one_event(setup, slow_answers):
    """The API stores the Event but answers after the client timed out (was: 6 copies)."""
    s = setup()
    s.server.faults.add(method="POST", path_regex=EVENTS, kind="slow", delay=1.0, count=slow_answers)
    with running(s.sink, s.sim):
        publish(s.feed, events=[event("OOMKilling", OOM, at=T0)])
        s.sim.advance(300)
        publish(s.feed, events=[event("OOMKilling", OOM, at=T0 + 400)])
        s.sim.advance(300)
    (stored,) = s.server.list_objects("events", "default")
    assert stored["count"] == 2
    assert len(s.writes("POST")) == slow_answers + 1
    assert s.writes("POST")[-1].status == 409, "the retried create met the stored Event"
    assert [r.status for r in s.writes("PATCH")] == [200, 200]
    assert s.sink.failures == {"transient": slow_answers} and s.sink.pending() == 0


@pytest.mark.parametrize(
    ("namespace", "fault", "delivered"),
    [
        # One Event the API refuses (a fault for its reason only): the later ones still go out.
        ("default", {"body_regex": "BadEvent", "status": 422, "count": None}, {"OOMKilling", "NeuronHasError"}),
        # --event-namespace kube-system: the API refuses every Event of a Node there (422).
        ("kube-system", None, set()),
    ],
    ids=["one-refused", "kube-system"],
)
def test_a_refused_event_is_dropped_and_does_not_block_the_others(setup, namespace, fault, delivered, caplog):
    s = setup(namespace=namespace)
    if fault:
        s.server.faults.add(method="POST", path_regex=EVENTS, **fault)
    with running(s.sink, s.sim):
        publish(s.feed, events=[event("BadEvent", "refused", at=T0), event("OOMKilling", OOM, at=T0)])
        s.sim.advance(60)
        publish(s.feed, events=[event("BadEvent", "refused", at=T0 + 61), event("NeuronHasError", DMA, at=T0 + 61)])
        s.sim.advance(60)
        assert s.sink.acked() == 2
    assert set(s.stored(namespace)) == delivered
    refused = 4 - len(delivered)
    assert len(s.writes("POST")) == 4, "each refused write is tried once, never retried"
    assert s.sink.dropped == {422: refused} and s.sink.failures == {"permanent": refused}
    assert s.sink.pending() == 0
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "422" in errors[0].getMessage(), "logged once per (status, reason)"


@pytest.mark.parametrize(
    ("status", "retry_after", "floor"),
    [(429, 3, 10.0), (429, 20, 20.0), (503, None, 10.0)],
    ids=["429-retry-after-below-resync", "429-retry-after-20", "503"],
)
def test_throttled_creates_wait_per_retry_after_and_backoff(setup, status, retry_after, floor):
    s = setup()
    s.server.faults.add(method="POST", path_regex=EVENTS, status=status, retry_after=retry_after, count=3)
    with running(s.sink, s.sim):
        publish(s.feed, events=[event("OOMKilling", OOM, at=T0), event("NeuronHasError", DMA, at=T0)])
        s.sim.advance(600)
    times = s.client.times("create_event")
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(times) == 5  # 3 refused (the first series, in order), then both
    assert all(gap >= floor for gap in gaps[:3]), gaps
    assert set(s.stored()) == {"OOMKilling", "NeuronHasError"}
    assert s.sink.failures == {"transient": 3}


def test_an_expired_event_is_created_anew(setup, api):
    s = setup(min_interval=30.0)
    with running(s.sink, s.sim):
        publish(s.feed, events=[event("OOMKilling", OOM, at=T0)])
        s.sim.run()
        name = s.stored()["OOMKilling"]["metadata"]["name"]
        assert api.delete_object("events", name, "default")  # the API server's Event TTL
        publish(s.feed, events=[event("OOMKilling", OOM, at=T0 + 10)])
        s.sim.advance(60)
    stored = s.stored()["OOMKilling"]
    assert (stored["metadata"]["name"], stored["count"]) == (name, 2)
    assert [r.method for r in s.writes()] == ["POST", "PATCH", "POST"]
    assert s.sink.failures == {"gone": 1}


# ---- the outbox: durable, acknowledged, bounded ------------------------------------------------


def test_events_undelivered_at_a_kill_are_sent_after_the_restart(setup, api, tmp_path):
    """What is on disk when ``acked()`` reports a publication is enough to deliver its events."""
    before = setup(state_dir=tmp_path / "before")
    api.set_outage("refuse")
    with running(before.sink, before.sim):
        publish(before.feed, events=[event("OOMKilling", OOM, at=T0)] * 3)
        pub = publish(before.feed, events=[event("NeuronHasError", DMA, at=T0)])
        before.sim.advance(1)
        assert before.sink.acked() == pub.number
        killed = tmp_path / "killed"  # the state dir as SIGKILL would leave it: nothing more is written
        shutil.copytree(tmp_path / "before", killed)
    api.set_outage(None)
    assert api.list_objects("events", "default") == []

    after = setup(state_dir=killed)
    with running(after.sink, after.sim):
        after.sim.run()
    stored = after.stored()
    assert {reason: e["count"] for reason, e in stored.items()} == {"OOMKilling": 3, "NeuronHasError": 1}
    assert stored["OOMKilling"]["firstTimestamp"] == "2026-01-01T00:16:40Z"


def test_the_outbox_is_saved_at_most_every_persist_interval_and_only_then_acknowledged(setup, tmp_path):
    s = setup(persist_interval=0.5)
    s.server.set_outage("refuse")  # nothing is delivered: the outbox is the only copy
    saved = tmp_path / "state" / OUTBOX_FILE
    with running(s.sink, s.sim):
        first = publish(s.feed, events=[event("OOMKilling", OOM, at=T0)])
        s.sim.run()
        assert s.sink.acked() == first.number, "the first save after a quiet period is at once"
        assert [x["reason"] for x in json.loads(saved.read_text())["series"]] == ["OOMKilling"]
        second = publish(s.feed, events=[event("NeuronHasError", DMA, at=T0)])
        s.sim.advance(0.4)
        assert s.sink.acked() == first.number, "not durable yet, so not acknowledged"
        s.sim.advance(0.1)
        assert s.sink.acked() == second.number
        assert len(json.loads(saved.read_text())["series"]) == 2
        third = publish(s.feed)  # no events: nothing to keep
        s.sim.run()
        assert s.sink.acked() == third.number


def test_an_unwritable_state_dir_keeps_the_sink_working_in_memory(setup, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    s = setup(state_dir=blocker / "state")
    with running(s.sink, s.sim):
        pub = publish(s.feed, events=[event("OOMKilling", OOM, at=T0)])
        s.sim.advance(1)
        assert s.sink.acked() == pub.number, "the cursor must not freeze"
        assert s.sink.last_persist_error and "not-a-dir" in s.sink.last_persist_error
    assert s.stored()["OOMKilling"]["count"] == 1


def test_the_outbox_is_bounded_and_forgets_delivered_series_first(tmp_path):
    outbox = Outbox(path=tmp_path / OUTBOX_FILE, max_series=3)

    def series(name: str, *, delivered: bool) -> Series:
        written = 1 if delivered else 0
        return Series(name=name, type="Warning", reason=name, message="m", first=T0, last=T0, written_count=written)

    for name, delivered in [("a", False), ("b", True), ("c", False), ("d", False), ("e", False)]:
        outbox.add(series(name, delivered=delivered))
    assert [s.name for s in outbox] == ["c", "d", "e"]  # b (delivered) went first, then a (the oldest)
    assert outbox.dropped == 1
    outbox.save()
    again = Outbox(path=tmp_path / OUTBOX_FILE)
    assert again.load() == 3 and [s.to_json() for s in again] == [s.to_json() for s in outbox]
    assert [p.name for p in tmp_path.iterdir()] == [OUTBOX_FILE], "no temporary file left behind"


@pytest.mark.parametrize("content", ["", "{", '{"format": 99, "series": []}', '{"format": 1, "series": [{"x": 1}]}'])
def test_a_corrupt_outbox_is_ignored(tmp_path, content, caplog):
    (tmp_path / OUTBOX_FILE).write_text(content)
    outbox = Outbox(path=tmp_path / OUTBOX_FILE)
    assert outbox.load() == 0 and len(outbox) == 0
    assert "ignoring the Event outbox" in caplog.text


# ---- storm control and Event shape ---------------------------------------------------------------


def test_a_storm_costs_a_handful_of_writes_and_loses_no_count(setup):
    s = setup(min_interval=30.0, burst=10)
    with running(s.sink, s.sim):
        for i in range(10):
            storm = [event("OOMKilling", OOM, at=T0 + i)] * 5_000
            distinct = [event("NeuronHasError", f"{DMA} {i}.{n}", at=T0 + i) for n in range(2)]
            publish(s.feed, events=storm + distinct)
            s.sim.advance(10)
        s.sim.advance(60)
    stored = s.server.list_objects("events", "default")
    oom = [e for e in stored if e["reason"] == "OOMKilling"]
    assert len(oom) == 1 and oom[0]["count"] == 50_000
    assert len([e for e in stored if e["reason"] == "NeuronHasError"]) == 10, "burst of 10 per reason"
    assert s.sink.throttled == 10
    assert len(s.writes()) <= 11 + 160 // 30 + 1  # 11 creates; the OOM series patched at most every 30 s


def test_events_are_about_the_node(setup):
    s = setup()
    with running(s.sink, s.sim):
        publish(s.feed, snapshot(node_uid="node-uid-7"), [event("OOMKilling", OOM, at=T0)])
        s.sim.run()
    stored = s.stored()["OOMKilling"]
    assert stored["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-7"}
    assert (stored["type"], stored["message"], stored["count"]) == ("Warning", OOM, 1)
    assert stored["source"] == {"component": "node-health-agent", "host": NODE}


@pytest.mark.parametrize(
    "node",
    [NODE, "Upper.Case-Node", "n" * 253, "a." * 126 + "b", "x" * 235 + "-yz"],
    ids=["fqdn", "upper-case", "longest", "many-labels", "cut-at-a-dash"],
)
def test_event_names_are_deterministic_dns_subdomains(node):
    def name(first: float, message: str = OOM) -> str:
        return event_name(node, type_="Warning", reason="OOMKilling", message=message, first=first)

    assert name(T0) == name(T0)
    assert len({name(T0), name(T0 + 0.001), name(T0, "other")}) == 3
    assert len(name(T0)) <= 253 and DNS_SUBDOMAIN.match(name(T0))


# ---- any value, any number of distinct values ----------------------------------------------------


def transition(reason: str, *, at: float, condition: str = "NeuronHealth") -> Event:
    return Event(
        type="Warning",
        reason=reason,
        message=f"Node condition {condition} is now: True, reason: {reason}",
        timestamp=at,
        source="neuron-monitor",
        severity=Severity.CRITICAL,
        condition=condition,
        status=Status.TRUE,
        rule="neuron/hw-error",
    )


def test_distinct_reasons_of_a_condition_are_bounded_and_the_rest_counted_in_one_summary(setup):
    """Before: 5,000 distinct NEURON_HW_ERR types gave 1,608 Events with distinct reasons."""
    s = setup(max_reasons=10, aggregate_window=600.0)
    with running(s.sink, s.sim):
        storm = [transition(f"NeuronHasError_T{i:04}", at=T0 + i / 100) for i in range(5_000)]
        publish(s.feed, events=[*storm, transition("GpuXid79", at=T0, condition="GpuXid")])
        s.sim.advance(60)
        assert s.sink.detail() is None
        # a window later, a condition has room for new reasons again
        publish(s.feed, events=[transition("NeuronHasError_LATER", at=T0 + 700)])
        s.sim.advance(60)
    stored = s.server.list_objects("events", "default")
    by_reason = {e["reason"]: e for e in stored}
    assert len(stored) == 10 + 1 + 1 + 1
    assert sorted(r for r in by_reason if r.startswith("NeuronHasError_T")) == [
        f"NeuronHasError_T{i:04}" for i in range(10)
    ]
    summary = by_reason["TooManyReasons"]
    assert summary["count"] == 4_990 and summary["type"] == "Warning"
    assert summary["message"].startswith("NeuronHealth: more Events with reasons other than the 10 shown within 10m")
    assert "GpuXid79" in by_reason and "NeuronHasError_LATER" in by_reason, "other conditions, later windows"
    assert s.sink.summarized == 4_990 and len(s.sink.outbox) == 13


def test_reasons_and_messages_are_cut_to_the_api_limits(setup):
    s = setup()
    reason = "NeuronHasError_" + "E" * 300
    with running(s.sink, s.sim):
        publish(s.feed, events=[event(reason, "\u20ac" * 5_000, at=T0)])
        s.sim.run()
    (stored,) = s.server.list_objects("events", "default")
    assert stored["reason"] == bounded_reason(reason) and len(stored["reason"]) == 128
    assert len(stored["message"].encode()) <= 1024 and stored["message"].endswith("...")


class BrokenFor:
    """The real client, but creating an Event with ``reason`` raises what no client should (a bug)."""

    def __init__(self, client: object, reason: str) -> None:
        self._client = client
        self._reason = reason

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)

    def create_event(self, namespace: str, body: dict) -> dict:
        if body["reason"] == self._reason:
            raise TypeError("Object of type Oddity is not JSON serializable")
        return self._client.create_event(namespace, body)


def test_an_event_that_raises_anything_but_an_api_error_is_dropped_and_the_others_go_out(setup, caplog):
    s = setup()
    s.sink._client = BrokenFor(s.sink._client, "Poison")
    with running(s.sink, s.sim):
        publish(s.feed, events=[event("Poison", "p", at=T0), event("OOMKilling", OOM, at=T0)])
        s.sim.advance(30)
        assert s.sink.healthy(s.sim.now)
        publish(s.feed, events=[event("Later", "l", at=T0 + 30)])
        s.sim.advance(30)
    assert set(s.stored()) == {"OOMKilling", "Later"}
    assert s.sink.bugs == 1 and s.sink.pending() == 0
    assert "TypeError: Object of type Oddity is not JSON serializable" in (s.sink.detail() or "")
    assert len([r for r in caplog.records if r.exc_info]) == 1


def test_reason_buckets_forget_the_refilled_ones_past_their_bound():
    buckets = ReasonBuckets(burst=2, refill=10.0, max_buckets=100)
    for i in range(10_000):
        buckets.take(f"R{i}", now=float(i))  # one token each: refilled 10 s later
    assert len(buckets) <= 100
    assert buckets.take("R9999", now=9_999.0) and not buckets.take("R9999", now=9_999.0), "recent ones are kept"
