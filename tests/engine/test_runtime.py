"""The runtime: supervisor, inbox, snapshot feed and the main loop (the one writer), with fakes at our seams."""

from __future__ import annotations

import threading
import time

import pytest

from agent.app.config import load_rule_set
from agent.checks.model import CheckReport, CheckResult, CheckStatus
from agent.core.bus import Notice, RecordBatch, SeedConditions, SnapshotFeed
from agent.core.paths import builtin_plugins_dir
from agent.core.state import NodeState
from agent.core.statedir import ConditionStore, StateDirHealth
from agent.core.supervisor import Supervisor
from agent.core.types import Condition, ConditionSpec, Event, Finding, RuleType, Severity, Status
from agent.sources.replay import Cursor

from helpers import wait_for
from helpers.mainloop import BOOT, NOW, Clock, Loop, record
from helpers.threads import wakeups_while_asleep


class Comp:
    """A component whose behaviour a test scripts."""

    def __init__(self, name: str, *, ok: bool = True, crash: BaseException | None = None, hang: bool = False):
        self.name = name
        self.ok = ok
        self.crash = crash
        self.hang = hang
        self.started = threading.Event()

    def healthy(self, now: float) -> bool:
        return self.ok

    def run(self, stop: threading.Event) -> None:
        self.started.set()
        if self.crash is not None:
            raise self.crash
        if self.hang:
            threading.Event().wait(30)
            return
        stop.wait()


# ---- supervisor ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("comps", "expected"),
    [
        ([Comp("a"), Comp("b")], {"a": True, "b": True}),
        ([Comp("a"), Comp("b", ok=False)], {"a": True, "b": False}),
        ([Comp("a"), Comp("sink", crash=RuntimeError("boom"))], {"a": True, "sink": False}),
    ],
    ids=["all-healthy", "one-unhealthy", "dead-sink-worker-turns-red"],
)
def test_supervisor_health_covers_every_component(comps, expected):
    sup = Supervisor(components=comps)
    stop = threading.Event()
    sup.start(stop)
    for c in comps:
        wait_for(c.started.is_set)
    if any(c.crash for c in comps):
        wait_for(lambda: sup.crashed())
    assert sup.health() == expected
    stop.set()
    assert sup.join(deadline=sup_deadline(5)) == []


def test_a_signal_that_lands_on_another_thread_still_stops_the_supervisor():
    """The kernel may hand SIGTERM to any thread; Python runs the handler in the main thread only when it
    executes bytecode, so the main thread must not sleep in a plain wait() (an agent once ignored SIGTERM)."""
    import signal

    stop = threading.Event()
    forced = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda *_: stop.set())

    def other_thread() -> None:
        comp.started.wait(10)
        time.sleep(0.3)  # let the main thread settle into its wait (only orders events; no outcome hangs on it)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # delivered to this thread, not the main one
        if not stop.wait(10):  # a fallback so the test cannot hang: it fails instead
            forced.set()
            stop.set()

    comp = Comp("a")
    try:
        sender = threading.Thread(target=other_thread, daemon=True)
        sup = Supervisor(components=[comp])
        sender.start()
        assert sup.run(stop, grace=1.0) == []  # in the main thread, as the agent runs it
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not forced.is_set(), "the supervisor slept through a signal delivered to another thread"


class Sleeper(Comp):
    """A component that sleeps on its own event, not on stop: only wake() ends its run."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.woken = threading.Event()

    def run(self, stop):
        self.started.set()
        self.woken.wait()

    def wake(self) -> None:
        self.woken.set()


def test_components_that_sleep_on_their_own_signal_are_woken_at_stop():
    sup = Supervisor(components=[Sleeper("a"), Comp("b")])
    stop = threading.Event()
    sup.start(stop)
    stop.set()
    assert sup.join(deadline=sup_deadline(10)) == []


def test_the_main_thread_sleeps_until_stop_without_waking_in_between():
    """Each wakeup of an idle agent is idle CPU (issue 16): waiting for stop, the main thread does not
    poll. A sleeping thread is switched out once and in once: its context switches do not grow."""
    stop = threading.Event()
    main = threading.get_native_id()
    woke: list[int] = []

    def watch() -> None:
        # asleep in select() on its wakeup socket (a futex wait would be a poll, or a wait for the GIL)
        woke.append(wakeups_while_asleep(main, sleeps_in=["poll", "select"]))
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    assert Supervisor(components=[Comp("a")]).run(stop, grace=1.0) == []
    assert woke == [0]


def sup_deadline(seconds: float) -> float:
    import time

    return time.monotonic() + seconds


def test_crash_is_reported_with_its_error_and_others_keep_running():
    ok, bad = Comp("reader"), Comp("event_sink", crash=ValueError("bad body"))
    sup = Supervisor(components=[ok, bad])
    stop = threading.Event()
    sup.start(stop)
    wait_for(lambda: sup.crashed())
    assert sup.crashed() == {"event_sink": "ValueError: bad body"}
    assert sup.health()["reader"] is True
    stop.set()
    sup.join(deadline=sup_deadline(5))


@pytest.mark.slow  # over 2 s: the full suite runs it, the fast lane does not
def test_one_shared_deadline_names_components_that_overrun_it():
    clock = Clock(0.0)
    hang = Comp("wedged", hang=True)
    sup = Supervisor(components=[Comp("fine"), hang], monotonic=clock)
    stop = threading.Event()
    sup.start(stop)
    wait_for(hang.started.is_set)
    stop.set()
    assert sup.join(deadline=2.0) == ["wedged"]  # the well-behaved one stops; the wedged one is named


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="unique"):
        Supervisor(components=[Comp("x"), Comp("x")])


# ---- feed ---------------------------------------------------------------------------------------


def ev(reason: str) -> Event:
    return Event(type="Warning", reason=reason, message=reason, timestamp=NOW, source="t", severity=Severity.ERROR)


def test_feed_events_since_index_and_losses_when_a_consumer_falls_behind():
    state = NodeState(conditions=(), clock=Clock())
    feed = SnapshotFeed(initial=state.snapshot(), max_events=3)
    feed.publish(snapshot=state.snapshot(), events=[ev("a"), ev("b")], health={})
    events, index, lost = feed.events_since(0)
    assert ([e.reason for e in events], index, lost) == (["a", "b"], 2, 0)
    feed.publish(snapshot=state.snapshot(), events=[ev("c"), ev("d")], health={})
    events, index, lost = feed.events_since(0)
    assert ([e.reason for e in events], index, lost) == (["b", "c", "d"], 4, 1)
    assert feed.events_since(4) == ([], 4, 0)


@pytest.mark.parametrize(
    ("index", "reasons", "end", "lost"),
    [
        (0, ["c", "d", "e"], 5, 2),  # fallen behind: the backlog kept, the rest lost
        (2, ["c", "d", "e"], 5, 0),
        (3, ["d", "e"], 5, 0),
        (4, ["e"], 5, 0),  # a consumer that keeps up takes the newest
        (5, [], 5, 0),
        (7, [], 5, 0),  # past the end (never given out): nothing, nothing lost
    ],
)
def test_feed_events_since_takes_the_events_after_the_index_in_order(
    index: int, reasons: list[str], end: int, lost: int
) -> None:
    state = NodeState(conditions=(), clock=Clock())
    feed = SnapshotFeed(initial=state.snapshot(), max_events=3)
    for batch in (["a", "b"], ["c"], ["d", "e"]):
        feed.publish(snapshot=state.snapshot(), events=[ev(r) for r in batch], health={})
    events, after, missed = feed.events_since(index)
    assert ([e.reason for e in events], after, missed) == (reasons, end, lost)


def test_wait_newer_returns_latest_or_none_after_close():
    state = NodeState(conditions=(), clock=Clock())
    feed = SnapshotFeed(initial=state.snapshot())
    assert feed.wait_newer(0, timeout=0) is None
    pub = feed.publish(snapshot=state.snapshot(), events=[], health={"x": False})
    assert feed.wait_newer(0, timeout=0) is pub
    assert pub.agent_healthy is False
    feed.close()
    assert feed.wait_newer(pub.number, timeout=10) is None  # returns at once after close


# ---- main loop ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rules():
    return load_rule_set([builtin_plugins_dir()])


DMA = "test NEURON_HW_ERR=DMA_ERROR test"


def test_records_become_conditions_events_and_a_publication(rules, tmp_path):
    lp = Loop(rules, tmp_path)
    lp.put(RecordBatch(records=[record(1, "hello"), record(2, DMA)]))
    lp.step()
    pub = lp.feed.latest()
    cond = pub.snapshot.condition("NeuronHealth")
    assert (cond.status, cond.reason) == (Status.TRUE, "NeuronHasError_DMA_ERROR")
    assert [e.reason for e in pub.events][:1] == ["NeuronHasError_DMA_ERROR"]
    assert lp.cursors.load() == Cursor(boot_id=BOOT, last_seq=2)


def test_each_publication_counts_the_inputs_folded_into_it_and_before(rules, tmp_path):
    """What lets a scrape wait for the inputs that had come in (``CaughtUp``): a publication's ``inputs`` is
    every input taken so far, a step takes at most STEP_ITEMS, and the rest come with the next step."""
    from agent.engine.mainloop import STEP_ITEMS

    lp = Loop(rules, tmp_path)
    assert lp.feed.latest().inputs == 0
    for i in range(STEP_ITEMS + 2):
        lp.put(RecordBatch(records=[record(i + 1, "hello")]))
    lp.step()
    assert (lp.feed.latest().inputs, lp.inbox.received) == (STEP_ITEMS, STEP_ITEMS + 2)
    lp.step()
    assert lp.feed.latest().inputs == STEP_ITEMS + 2
    lp.put(Notice(events=[]))
    lp.step()
    assert lp.feed.latest().inputs == lp.inbox.received == STEP_ITEMS + 3


def test_live_messages_are_not_prefix_stripped(rules, tmp_path):
    """A live kmsg message that starts like a saved-log prefix is matched as printed."""
    lp = Loop(rules, tmp_path)
    lp.put(RecordBatch(records=[record(1, "kernel: Out of memory: Killed process 123 (python)")]))
    lp.step()
    assert lp.loop.pipeline.lines_matched == 1
    # The same text with the prefix the kernel never prints is still found by simulate (saved logs).
    from agent.detectors.pipeline import saved_log_line

    assert saved_log_line("kernel: [12.3] x") != "kernel: [12.3] x"


def test_cursor_waits_for_durable_consumers(rules, tmp_path):
    acked = {"n": 0}
    lp = Loop(rules, tmp_path, acks=[lambda: acked["n"]])
    lp.put(RecordBatch(records=[record(7, DMA)]))
    lp.step()
    kept = ConditionStore(health=lp.health)
    # The event sink has not stored the transition Event yet: neither the cursor nor the new
    # condition is kept, so a SIGKILL now replays record 7 in full and the Event comes again.
    assert lp.cursors.load() is None
    assert kept.load() is None
    acked["n"] = lp.feed.latest().number
    lp.step()
    assert lp.cursors.load() == Cursor(boot_id=BOOT, last_seq=7)
    neuron = next(c for c in kept.load() if c.type == "NeuronHealth")
    assert neuron.status is Status.TRUE


def test_a_storm_of_changes_writes_the_state_dir_once_a_second_and_the_last_one_lands(rules, tmp_path, monkeypatch):
    """Each write is an fsync that holds the loop: changes within CURSOR_INTERVAL are written together,
    and the newest is written once the interval is over, with no further input (the loop ticks for it)."""
    from agent.engine import mainloop

    written: list[int] = []
    real_save = ConditionStore.save
    monkeypatch.setattr(
        ConditionStore, "save", lambda self, conditions: written.append(1) or real_save(self, conditions)
    )
    lp = Loop(rules, tmp_path)
    lp.put(RecordBatch(records=[record(1, DMA)]))
    lp.loop.step(timeout=0)  # the first change: written at once
    assert len(written) == 1
    for seq, error in enumerate(("SRAM_ECC_UNCORRECTED", "HBM_UNCORRECTABLE_ERROR"), start=2):
        lp.mono.now += mainloop.CURSOR_INTERVAL / 4
        lp.put(RecordBatch(records=[record(seq, f"test NEURON_HW_ERR={error} test")]))
        lp.loop.step(timeout=0)
    assert len(written) == 1 and lp.cursors.load() == Cursor(boot_id=BOOT, last_seq=1)
    assert lp.loop.idle_timeout() == mainloop.CURSOR_TICK  # asleep, it would still look
    lp.mono.now += mainloop.CURSOR_INTERVAL
    lp.loop.step(timeout=0)  # the tick: nothing in the inbox
    assert len(written) == 2 and lp.cursors.load() == Cursor(boot_id=BOOT, last_seq=3)
    kept = ConditionStore(health=StateDirHealth(path=tmp_path)).load()
    assert next(c for c in kept if c.type == "NeuronHealth") == lp.feed.latest().snapshot.condition("NeuronHealth")
    assert lp.loop.idle_timeout() is None  # all written: wait for input


def test_replayed_records_only_rebuild_permanent_state(rules, tmp_path):
    lp = Loop(rules, tmp_path, cursor=Cursor(boot_id=BOOT, last_seq=10))
    lp.put(RecordBatch(records=[record(9, DMA), record(10, "Out of memory: Killed process 1 (x)")]))
    lp.step()
    pub = lp.feed.latest()
    assert pub.snapshot.condition("NeuronHealth").status is Status.TRUE  # permanent: rebuilt
    assert pub.snapshot.problem_counts.get("OOMKilling", 0) == 0  # temporary: not repeated


def test_conditions_are_kept_in_the_state_dir_and_restored(rules, tmp_path):
    lp = Loop(rules, tmp_path)
    lp.put(RecordBatch(records=[record(1, DMA)]))
    lp.step()
    before = lp.feed.latest().snapshot
    kept = ConditionStore(health=StateDirHealth(path=tmp_path)).load()
    fresh = NodeState(
        conditions=rules.conditions, clock=Clock(NOW + 500), reasons=rules.reasons, aggregate=True, seeded=False
    )
    assert fresh.restore(kept) == []  # no transition, no Event: the aggregate comes back as it was
    after = fresh.snapshot()
    for type_ in ("NeuronHealth", "AcceleratedHardwareReady"):
        b, a = before.condition(type_), after.condition(type_)
        assert (a.status, a.reason, a.last_transition, a.severity) == (
            b.status,
            b.reason,
            b.last_transition,
            b.severity,
        )
    assert after.seeded


def test_node_seed_does_not_override_restored_conditions(rules, tmp_path):
    state = NodeState(conditions=rules.conditions, clock=Clock(), reasons=rules.reasons, seeded=False)
    mine = Condition(
        type="NeuronHealth",
        status=Status.TRUE,
        reason="NeuronHasError_DMA_ERROR",
        message="m",
        last_transition=NOW - 100,
        last_update=NOW - 100,
        severity=Severity.CRITICAL,
    )
    stale = Condition(
        type="NeuronHealth",
        status=Status.FALSE,
        reason="NeuronHasNoError",
        message="old",
        last_transition=NOW - 900,
        last_update=NOW - 900,
    )
    state.restore([mine])
    state.seed([stale], node_uid="uid-1")
    snap = state.snapshot()
    assert snap.condition("NeuronHealth").reason == "NeuronHasError_DMA_ERROR"
    assert snap.node_uid == "uid-1"


def test_unseeded_state_is_published_as_such_until_the_seed_arrives(rules, tmp_path):
    lp = Loop(rules, tmp_path, seeded=False)
    lp.put(RecordBatch(records=[record(1, "hello")]))
    lp.step()
    assert lp.feed.latest().snapshot.seeded is False
    lp.put(SeedConditions(conditions=[], node_uid="u"))
    lp.step()
    snap = lp.feed.latest().snapshot
    assert (snap.seeded, snap.node_uid) == (True, "u")


def test_check_reports_enter_the_same_loop(rules, tmp_path):
    lp = Loop(rules, tmp_path)
    result = CheckResult(
        status=CheckStatus.PROBLEM, condition="NeuronHealth", reason="NeuronHasError_X", message="device gone"
    )
    lp.put(CheckReport(check="x", results=(result,), finished_at=NOW, duration=0.1))
    lp.step()
    assert lp.feed.latest().snapshot.condition("NeuronHealth").reason == "NeuronHasError_X"


def test_notices_are_published_as_events_and_change_no_condition(rules, tmp_path):
    lp = Loop(rules, tmp_path)
    lp.step()
    before = lp.feed.latest().snapshot
    event = Event(
        type="Warning",
        reason="RecoveryBlocked",
        message="the cluster budget is spent",
        timestamp=NOW,
        source="recovery",
        severity=Severity.WARNING,
    )
    lp.put(Notice(events=[event]))
    lp.step()
    pub = lp.feed.latest()
    assert pub.events == (event,)
    assert pub.snapshot.conditions == before.conditions and pub.snapshot.generation == before.generation


def test_unwritable_state_dir_is_reported_not_fatal(rules, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    lp = Loop(rules, blocker)
    lp.put(RecordBatch(records=[record(1, DMA)]))
    lp.step()
    problems = lp.health.problems()
    assert set(problems) == {"conditions", "cursor"}
    assert lp.feed.latest().snapshot.condition("NeuronHealth").status is Status.TRUE  # detection goes on


def test_unknown_inbox_items_do_not_kill_the_writer(rules, tmp_path, caplog):
    lp = Loop(rules, tmp_path)
    lp.inbox._queue.put(object())  # a producer bug
    lp.step()
    assert "unknown inbox item" in caplog.text
    assert lp.loop.healthy(lp.mono.now)


# ---- an idle main loop sleeps until it has something to do (issue 16) ---------------------------

XID = ConditionSpec(type="GpuXid", reason="GpuXidGood", message="ok", clear_after=600.0, source="nvidia")


def idle_loop(rules, tmp_path, *, acks=()) -> tuple[Loop, NodeState]:
    lp = Loop(rules, tmp_path, acks=acks)
    state = NodeState(conditions=[XID], clock=lp.clock)
    lp.loop.state = state
    return lp, state


@pytest.mark.parametrize(
    ("xid_at", "awaiting_ack", "expected"),
    [
        (None, False, None),  # nothing due: wait for input, however long (not a tick)
        (NOW - 100, False, 500.0),  # a clearAfter of 600 s, set 100 s ago: heals in 500 s
        (NOW - 700, False, 0.0),  # overdue: at once
        (None, True, 1.0),  # a publication awaits its acknowledgement: the cursor follows it each second
        (NOW - 100, True, 1.0),
    ],
    ids=["idle", "clear-after", "overdue", "awaiting-ack", "both"],
)
def test_an_idle_main_loop_sleeps_until_its_next_expiry_or_for_input(rules, tmp_path, xid_at, awaiting_ack, expected):
    lp, state = idle_loop(rules, tmp_path, acks=[lambda: 0])
    if xid_at is not None:
        lp.clock.now = xid_at
        state.apply(
            Finding(
                rule="t",
                type=RuleType.PERMANENT,
                condition="GpuXid",
                reason="GpuXid79",
                severity=Severity.ERROR,
                message="m",
                timestamp=xid_at,
                source="t",
            )
        )
        lp.clock.now = NOW
    if awaiting_ack:
        lp.put(RecordBatch(records=[record(1, "hello")]))
        lp.step()
    assert lp.loop.idle_timeout() == expected


def test_a_main_loop_asleep_for_input_is_healthy_and_stop_wakes_it(rules, tmp_path):
    lp, _ = idle_loop(rules, tmp_path)
    thread = threading.Thread(target=lp.loop.run, args=(lp.stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: lp.loop.healthy(10**9))  # asleep with nothing due: never stalled
        lp.put(RecordBatch(records=[record(1, DMA)]))  # input wakes it at once
        wait_for(lambda: lp.loop.records_processed == 1)
    finally:
        lp.stop.set()
        lp.loop.wake()  # as the supervisor does
        thread.join(10)
    assert not thread.is_alive()
    assert lp.loop.records_processed == 1
