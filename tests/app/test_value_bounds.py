"""Issue 13, findings 5 and 14: no kernel line can take a sink down, and no storm of distinct values can
grow the agent's series, Events or memory.

- A ``NEURON_HW_ERR`` line with a 300-character type, in the real kmsg format, through a real agent
  process with CloudWatch on against moto: still publishing (a valid metric name), ``/healthz`` 200;
  then a restart with such a condition (as an older version saved it) in the state directory: fine.
  Before, the CloudWatch component died (metric name over 255 characters) and the saved condition
  killed it again after every restart.
- 5,000 and 100,000 distinct types through the main loop (real rules, real kmsg parsing) into the
  Event sink (real client, the test API server) and the metrics collector: bounded ``problem_counter``
  and ``problem_gauge`` series, a bounded number of Events, bounded tables; counted, not timed.
  Before, 5,000 types gave 5,001 ``problem_counter`` series and 1,608 Events.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.config import load_rule_set
from agent.core.bounds import MAX_REASONS, OVERFLOW_REASON, bounded_reason
from agent.core.bus import RecordBatch, SnapshotFeed
from agent.core.paths import builtin_plugins_dir
from agent.core.statedir import CONDITIONS_FILE, MAX_CONDITIONS_FILE, ConditionStore, StateDirHealth
from agent.core.types import Event, Severity, Snapshot
from agent.sinks.events import MAX_BUCKETS, EventSink
from agent.sinks.metrics import AgentCollector, AgentStats, build_registry
from agent.sinks.stdout import StdoutSink
from agent.sources.kmsg.decoder import Mode, decode

from helpers import free_port, http_get, kube_client, wait_for
from helpers.agents import NAMESPACE, NODE, Agent, cloudwatch_metrics, condition, node, recent_usec
from helpers.aws import REGION
from helpers.mainloop import Loop
from helpers.sinks import SimTime, node_api, running
from helpers.threads import wakeups_while_asleep
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # storms of distinct values through every sink

LONG_TYPE = "E" * 300
RULES = load_rule_set([builtin_plugins_dir()])


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    server.start()
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    try:
        yield server
    finally:
        server.stop()


def hw_error(error: str) -> str:
    return (
        f"NEURON_HW_ERR={error} instance-id=i-0592464924bd45322 hostname=ip-172-31-61-252 nd-id=0 nc-id=0 action=NONE"
    )


def valid_metric_name(name: str) -> bool:
    return 1 <= len(name) <= 255 and name.isascii() and name.isprintable() and bool(name.strip())


# ---- finding 5: one long kernel line, CloudWatch on ---------------------------------------------


def test_a_300_character_type_keeps_cloudwatch_publishing_and_a_restart_with_it_saved_is_fine(api, aws, tmp_path):
    instance_id = aws.lone_instance()
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}"))
    port = free_port()
    agent = Agent(tmp_path, api, enable="false", listen=f"127.0.0.1:{port}")
    try:
        wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "False", timeout=30)
        agent.fault(hw_error(LONG_TYPE))  # a kmsg-format record: "3,<seq>,<usec>,-;NEURON_HW_ERR=EEE..."
        found = wait_for(lambda: cloudwatch_metrics(aws), timeout=30)
        wait_for(lambda: "cloudwatch_requests_total 1.0" in http_get(f"http://127.0.0.1:{port}/metrics")[1])
        status, body = http_get(f"http://127.0.0.1:{port}/healthz")
    finally:
        err = agent.stop()
    reason = bounded_reason(f"NeuronHasError_{LONG_TYPE}")
    assert {m["MetricName"] for m in found} == {reason} and valid_metric_name(reason)
    assert status == 200, body
    assert json.loads(body)["components"]["cloudwatch"] is True
    assert condition(api, "NeuronHealth")["reason"] == reason
    assert "Traceback" not in err

    # An older version saved the condition with the full reason: the restart neither crashes nor loses it.
    saved = tmp_path / "state" / "conditions.json"
    doc = json.loads(saved.read_text())
    (neuron,) = [c for c in doc["conditions"] if c["type"] == "NeuronHealth"]
    older = f"NeuronHasError_{'F' * 300}"
    neuron["reason"] = older
    saved.write_text(json.dumps(doc))
    agent.kmsg.write_text(f"6,1,{recent_usec()},-;boot\n")  # the long line is not replayed over it
    port = free_port()
    agent = Agent(tmp_path, api, enable="false", listen=f"127.0.0.1:{port}")
    try:
        names = wait_for(lambda: {m["MetricName"] for m in cloudwatch_metrics(aws)} - {reason}, timeout=30)
        wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["reason"] == bounded_reason(older), timeout=30)
        status, body = http_get(f"http://127.0.0.1:{port}/healthz")
    finally:
        err = agent.stop()
    assert names == {bounded_reason(older)}
    assert status == 200, body
    assert "Traceback" not in err


# ---- finding 14: any number of distinct types ---------------------------------------------------


def kmsg_records(errors: list[str], *, first_seq: int) -> list:
    """The records the kernel would give for these lines (the real kmsg format, parsed as the reader parses it)."""
    usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
    data = "".join(f"3,{first_seq + i},{usec + i},-;{hw_error(e)}\n" for i, e in enumerate(errors)).encode()
    parsed = decode(data, mode=Mode.FILE, boot_time=time.time() - usec / 1e6)
    assert len(parsed.records) == len(errors) and not parsed.errors
    return parsed.records


def series(registry: object, name: str) -> list:
    text = generate_latest(registry).decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def stats() -> AgentStats:
    return AgentStats(
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


@pytest.mark.parametrize("types", [5_000, 100_000], ids=["5k", "100k"])
def test_distinct_types_give_bounded_series_events_and_tables(tmp_path, types):
    lp = Loop(RULES, tmp_path / "loop")
    registry = build_registry(AgentCollector(snapshot=lambda: lp.feed.latest().snapshot, stats=stats))
    declared = len(RULES.reasons)
    with node_api() as server, kube_client(server, tmp_path) as client:
        sim = SimTime(start=lp.clock.now - SimTime.EPOCH)
        sink = EventSink(
            client=client,
            feed=lp.feed,
            node_name=NODE,
            state_dir=tmp_path / "state",
            clock=sim.clock,
            monotonic=sim.monotonic,
            wait=sim.wait,
        )
        with running(sink, sim):
            batch = 2_000
            for start in range(0, types, batch):
                names = [f"T{n:06}" for n in range(start, min(types, start + batch))]
                lp.put(RecordBatch(records=kmsg_records(names, first_seq=start + 1)))
                lp.step()
                sim.run()  # the sink takes the step's events (the feed's backlog is bounded)
            sim.advance(120)
        snapshot = lp.feed.latest().snapshot
        stored = server.list_objects("events", "default")

    assert snapshot.condition("NeuronHealth").reason == f"NeuronHasError_T{types - 1:06}", "the state is true"
    counters = {s.labels["reason"]: s.value for s in series(registry, "problem_counter")}
    assert len(counters) <= declared + MAX_REASONS + 1
    assert counters[OVERFLOW_REASON] == types - MAX_REASONS and sum(counters.values()) == types
    gauges = series(registry, "problem_gauge")
    assert len([g for g in gauges if g.labels["type"] == "NeuronHealth"]) == MAX_REASONS + 1
    assert [g.labels["reason"] for g in gauges if g.value == 1.0 and g.labels["type"] == "NeuronHealth"] == [
        OVERFLOW_REASON
    ], "the current reason is past the bound: counted as Other"
    (overflowed,) = series(registry, "node_health_agent_problems_overflowed_total")
    assert (overflowed.labels, overflowed.value) == ({"owner": "NeuronHealth"}, types - MAX_REASONS)

    # Events: per condition 10 distinct reasons and one summary; the aggregate condition's series are
    # throttled per reason (10). Nothing was lost from the feed.
    reasons = [e["reason"] for e in stored]
    assert reasons.count("TooManyReasons") == 1
    assert len([r for r in reasons if r.startswith("NeuronHasError_")]) == 10
    assert len(stored) <= 10 + 1 + 10 + 1
    assert sink.lost == 0 and sink.bugs == 0
    assert len(sink.outbox) == len(stored)
    assert len(sink._buckets) <= MAX_BUCKETS
    assert len(snapshot.problem_counts) <= declared + MAX_REASONS + 1


# ---- the state directory and stdout: any value ---------------------------------------------------


def test_a_saved_condition_with_an_oversized_reason_restores_the_reason_the_line_gives_now(tmp_path):
    """An older version saved the full reason: restored cut as the rule cuts it, so the same line again is
    the same problem (no flap, no second transition Event)."""
    lp = Loop(RULES, tmp_path)
    lp.put(RecordBatch(records=kmsg_records([LONG_TYPE], first_seq=1)))
    lp.step()
    saved = tmp_path / CONDITIONS_FILE
    doc = json.loads(saved.read_text())
    for cond in doc["conditions"]:
        if cond["type"] == "NeuronHealth":
            cond["reason"] = f"NeuronHasError_{LONG_TYPE}"  # as the older version wrote it
    saved.write_text(json.dumps(doc))

    restarted = Loop(RULES, tmp_path, seeded=False)
    restarted.state.restore(ConditionStore(health=restarted.health).load() or [])
    assert restarted.state.snapshot().condition("NeuronHealth").reason == bounded_reason(f"NeuronHasError_{LONG_TYPE}")
    restarted.put(RecordBatch(records=kmsg_records([LONG_TYPE], first_seq=2)))
    restarted.step()
    assert [e for e in restarted.feed.latest().events if e.condition == "NeuronHealth"] == []


@pytest.mark.parametrize("kind", ["oversized", "fifo"])
def test_a_conditions_file_that_is_not_ours_is_ignored_never_read_without_end(tmp_path, kind, caplog):
    path = tmp_path / CONDITIONS_FILE
    if kind == "fifo":
        os.mkfifo(path)  # an open() for reading would wait for a writer forever
    else:
        path.write_text(json.dumps({"format": 1, "conditions": [], "pad": "x" * MAX_CONDITIONS_FILE}))
    health = StateDirHealth(path=tmp_path)
    assert ConditionStore(health=health).load() is None
    if kind == "fifo":
        assert "not a regular file" in health.problems()["conditions"]
    else:
        assert "not ours" in caplog.text


@pytest.mark.slow  # watches for 5.5 s: past the 5 s look at stop it had
def test_an_idle_stdout_sink_sleeps_until_a_publication_or_the_feed_closes():
    """No poll wakes it while nothing is published (each wakeup is idle CPU, issue 16); the supervisor
    closes the feed at stop, which ends its wait."""
    feed = SnapshotFeed(initial=Snapshot(conditions=(), generated_at=0.0))
    sink = StdoutSink(feed=feed, stream=io.StringIO())
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    assert thread.native_id is not None
    assert wakeups_while_asleep(thread.native_id, sleeps_in=["futex"], window=5.5) == 0
    pub = feed.publish(snapshot=feed.latest().snapshot, events=[], health={})
    wait_for(lambda: sink.acked() == pub.number)
    stop.set()
    feed.close()
    thread.join(timeout=10)
    assert not thread.is_alive()


class Oddity:
    def __str__(self) -> str:
        return "oddity"


def test_stdout_prints_any_value_and_skips_only_what_cannot_be_printed(caplog):
    stream = io.StringIO()
    feed = SnapshotFeed(initial=Snapshot(conditions=(), generated_at=0.0))
    sink = StdoutSink(feed=feed, stream=stream, poll=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    odd = Event(type="Warning", reason="R" * 300, message="m", timestamp=0.0, source="s", severity=Severity.ERROR)
    events = [
        dataclasses.replace(odd, fields={"raw": b"\x00\xff", "obj": Oddity()}),  # printed as str
        dataclasses.replace(odd, fields={1: "a", "b": 2}),  # keys JSON cannot sort: a bug, skipped
        dataclasses.replace(odd, reason="After"),
    ]
    pub = feed.publish(snapshot=feed.latest().snapshot, events=events, health={})
    wait_for(lambda: sink.acked() == pub.number)
    stop.set()
    thread.join(timeout=10)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["reason"], line.get("fields")) for line in lines] == [
        (bounded_reason("R" * 300), {"raw": "b'\\x00\\xff'", "obj": "oddity"}),
        ("After", None),
    ]
    assert sink.bugs == 1 and "TypeError" in (sink.detail() or "")
