"""The main loop under a flood: after a step that folded FLOOD_RECORDS records or more, the next step waits until
FLOOD_STEP has passed since that one began and folds what came in meanwhile together (one publication); after a
quiet step, or without a pause to wait with, it folds at once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.bus import RecordBatch
from agent.engine import mainloop
from agent.engine.mainloop import FLOOD_RECORDS, FLOOD_STEP

from helpers import wait_for
from helpers.mainloop import Loop, record


@pytest.fixture
def loop(tmp_path: Path) -> Loop:
    pack = tmp_path / "pack.json"
    rule = {"name": "oom", "type": "temporary", "reason": "OOMKilling", "pattern": "Out of memory.*"}
    pack.write_text(json.dumps({"source": "kernel-monitor", "rules": [rule]}), encoding="utf-8")
    state = tmp_path / "state"
    state.mkdir()
    return Loop(load_rule_set([pack]), state)


class Pause:
    """Stands for the stop event's wait: the loop's clock moves on by what it was asked, and the reader's chunks
    that come in meanwhile (``arriving``) are put in the inbox."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.asked: list[float] = []
        self.arriving: list[RecordBatch] = []

    def __call__(self, seconds: float) -> bool:
        self.asked.append(round(seconds, 6))
        self.loop.mono.now += seconds
        for batch in self.arriving:
            self.loop.put(batch)
        self.arriving.clear()
        return False


class Records:
    def __init__(self) -> None:
        self.seq = 0

    def batch(self, count: int, *, fault: bool = False) -> RecordBatch:
        messages = [
            "Out of memory: Killed process 1 (x)" if fault and i == count - 1 else "quiet" for i in range(count)
        ]
        batch = [record(self.seq + 1 + i, message) for i, message in enumerate(messages)]
        self.seq += count
        return RecordBatch(records=batch)


# (id, records folded by the step before, seconds from its start to the next chunk, pause given,
#  what the next step asks its pause for)
CASES = [
    ("flood-then-soon", FLOOD_RECORDS, 0.01, True, [FLOOD_STEP - 0.01]),
    ("flood-then-late", FLOOD_RECORDS, FLOOD_STEP + 0.01, True, []),
    ("flood-then-at-the-bound", FLOOD_RECORDS, FLOOD_STEP, True, []),
    ("quiet-then-soon", FLOOD_RECORDS - 1, 0.01, True, []),
    ("flood-without-a-pause", 4 * FLOOD_RECORDS, 0.01, False, []),
]


@pytest.mark.parametrize(("before", "after", "pause_given", "asked"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_step_after_a_flood_waits_out_the_flood_step(loop: Loop, before, after, pause_given, asked) -> None:
    records, pause = Records(), Pause(loop)
    loop.put(records.batch(before))
    assert loop.loop.step(timeout=0, pause=pause) == before and pause.asked == []
    loop.mono.now += after
    loop.put(records.batch(10))
    assert loop.loop.step(timeout=0, pause=pause if pause_given else None) == 10
    assert pause.asked == pytest.approx(asked)


def test_what_comes_in_during_the_wait_is_folded_in_the_same_publication(loop: Loop) -> None:
    records, pause = Records(), Pause(loop)
    loop.put(records.batch(FLOOD_RECORDS, fault=True))
    loop.loop.step(timeout=0, pause=pause)
    published = loop.feed.latest().number
    loop.mono.now += 0.02
    loop.put(records.batch(FLOOD_RECORDS, fault=True))
    pause.arriving += [records.batch(FLOOD_RECORDS, fault=True), records.batch(3, fault=True)]
    assert loop.loop.step(timeout=0, pause=pause) == 2 * FLOOD_RECORDS + 3
    assert pause.asked == pytest.approx([FLOOD_STEP - 0.02])
    latest = loop.feed.latest()
    assert latest.number == published + 1  # one publication for the three chunks
    events, _, _ = loop.feed.events_since(0)
    assert sum(e.reason == "OOMKilling" for e in events) == 4  # none lost, none doubled


def test_the_flood_ends_with_the_first_quiet_step(loop: Loop) -> None:
    records, pause = Records(), Pause(loop)
    for count, asked in [
        (FLOOD_RECORDS, []),
        (5, [FLOOD_STEP]),
        (5, []),
        (FLOOD_RECORDS, []),
        (FLOOD_RECORDS, [FLOOD_STEP]),
    ]:
        loop.put(records.batch(count))
        pause.asked.clear()
        loop.loop.step(timeout=0, pause=pause)
        assert pause.asked == pytest.approx(asked)


def test_no_wait_without_input(loop: Loop) -> None:
    records, pause = Records(), Pause(loop)
    loop.put(records.batch(FLOOD_RECORDS))
    loop.loop.step(timeout=0, pause=pause)
    assert loop.loop.step(timeout=0, pause=pause) == 0 and pause.asked == []  # nothing came: nothing to gather


def test_run_gathers_a_flood_on_the_inbox_until_it_is_half_full(loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run`` waits on the inbox: with a flood step of an hour, the wait ends once the inbox is half full (so
    the reader never waits on it), and what was gathered is folded; stopping ends a wait too."""
    monkeypatch.setattr(mainloop, "FLOOD_STEP", 3600.0)
    records, stop = Records(), threading.Event()
    thread = threading.Thread(target=loop.loop.run, args=(stop,))
    thread.start()
    try:
        loop.put(records.batch(FLOOD_RECORDS))
        wait_for(lambda: loop.loop.records_processed == FLOOD_RECORDS)
        half = loop.inbox_size // 2 + 1  # the first the loop takes, then the inbox half full
        for _ in range(half):
            loop.put(records.batch(1))
        wait_for(lambda: loop.loop.records_processed == FLOOD_RECORDS + half)
        loop.put(records.batch(FLOOD_RECORDS))
        wait_for(lambda: loop.loop.records_processed == 2 * FLOOD_RECORDS + half)
        loop.put(records.batch(1))  # a flood step again: this one waits, until stop
    finally:
        stop.set()
        loop.loop.wake()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert loop.loop.records_processed == 2 * FLOOD_RECORDS + half + 1  # folded on the way out
