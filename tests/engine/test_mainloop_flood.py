"""The main loop under a flood: once the steps begun in the last FLOOD_STEP seconds folded FLOOD_RECORDS records or
more, the next step waits until FLOOD_STEP after the last one began and folds what came in meanwhile together (one
publication); after a quiet spell, or without a pause to wait with, it folds at once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.bus import INBOX_ITEMS, RecordBatch
from agent.engine import mainloop
from agent.engine.mainloop import FLOOD_RECORDS, FLOOD_STEP

from helpers import wait_for
from helpers.mainloop import Loop, record


def flood_loop(tmp_path: Path, **options) -> Loop:
    pack = tmp_path / "pack.json"
    rule = {"name": "oom", "type": "temporary", "reason": "OOMKilling", "pattern": "Out of memory.*"}
    pack.write_text(json.dumps({"source": "kernel-monitor", "rules": [rule]}), encoding="utf-8")
    state = tmp_path / "state"
    state.mkdir()
    return Loop(load_rule_set([pack]), state, **options)


@pytest.fixture
def loop(tmp_path: Path) -> Loop:
    return flood_loop(tmp_path)


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


S, R = FLOOD_STEP, FLOOD_RECORDS

# (id, the steps: (seconds from the first when its chunk comes, records in it), what each step asks its pause for)
CASES = [
    ("a-burst-then-soon", [(0, R), (0.1 * S, 10)], [[], [0.9 * S]]),
    ("a-burst-then-after-the-window", [(0, R), (S, 10)], [[], []]),
    ("below-the-bar", [(0, R - 1), (0.1 * S, 10)], [[], []]),
    (
        "a-steady-stream-a-tick-at-a-time",
        [(0, R // 4), (0.02 * S, R // 4), (0.04 * S, R // 4), (0.06 * S, R // 4), (0.08 * S, 10)],
        [[], [], [], [], [0.98 * S]],
    ),
    ("the-window-slides", [(0, R // 2), (0.5 * S, R // 2), (1.2 * S, 10)], [[], [], []]),
    ("a-flood-goes-on", [(0, R), (0.1 * S, R), (1.05 * S, 10)], [[], [0.9 * S], [0.95 * S]]),
]


@pytest.mark.parametrize(("steps", "asked"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_step_in_a_flood_waits_until_the_flood_step_has_passed(loop: Loop, steps, asked) -> None:
    records, pause = Records(), Pause(loop)
    start = loop.mono.now
    for (at, count), expected in zip(steps, asked, strict=True):
        loop.mono.now = max(loop.mono.now, start + at)
        loop.put(records.batch(count))
        pause.asked.clear()
        assert loop.loop.step(timeout=0, pause=pause) == count
        assert pause.asked == pytest.approx(expected)


def test_without_a_pause_a_flood_is_folded_at_once(loop: Loop) -> None:
    records, pause = Records(), Pause(loop)
    loop.put(records.batch(4 * R))
    loop.loop.step(timeout=0)
    loop.put(records.batch(10))
    assert loop.loop.step(timeout=0) == 10
    assert loop.loop.step(timeout=0, pause=pause) == 0 and pause.asked == []  # nothing came: nothing to gather


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


def test_run_gathers_a_flood_on_the_inbox_until_it_is_half_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run`` waits on the inbox (as deployed, 16 chunks): with a flood step of an hour, the wait ends once the
    inbox is half full, so the reader never waits on it; stopping ends a wait too, and what it gathered is
    folded on the way out."""
    monkeypatch.setattr(mainloop, "FLOOD_STEP", 3600.0)
    loop = flood_loop(tmp_path, inbox_size=INBOX_ITEMS)
    records, stop = Records(), threading.Event()
    thread = threading.Thread(target=loop.loop.run, args=(stop,))
    thread.start()
    try:
        loop.put(records.batch(FLOOD_RECORDS))
        wait_for(lambda: loop.loop.records_processed == FLOOD_RECORDS)
        half = INBOX_ITEMS // 2 + 1  # the one the loop takes, then the inbox half full
        for _ in range(half):
            loop.put(records.batch(1))
        wait_for(lambda: loop.loop.records_processed == FLOOD_RECORDS + half)
        loop.put(records.batch(1))  # still a flood (an hour's window): this one waits, until stop
    finally:
        stop.set()
        loop.loop.wake()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert loop.loop.records_processed == FLOOD_RECORDS + half + 1
