"""A main loop with a fresh inbox, feed and state, driven step by step on injected clocks."""

from __future__ import annotations

import threading
from pathlib import Path

from agent.core.bus import Inbox, SnapshotFeed
from agent.core.state import NodeState
from agent.core.statedir import ConditionStore, StateDirHealth
from agent.core.types import LogRecord
from agent.detectors.pipeline import DetectionPipeline
from agent.engine.mainloop import MainLoop
from agent.sources.replay import Cursor, CursorStore, ReplayPolicy

BOOT = "boot-a"


NOW = 1_700_000_000.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(seq: int, message: str, *, ts: float = NOW - 1) -> LogRecord:
    return LogRecord(message=message, timestamp=ts, seq=seq)


class Loop:
    """A main loop with a fresh inbox, feed and state, driven step by step."""

    def __init__(
        self, rules, tmp: Path, *, cursor: Cursor | None = None, acks=(), seeded=True, inbox_size=64, devices=None
    ):
        self.clock = Clock()
        self.mono = Clock(0.0)
        self.inbox_size = inbox_size
        self.inbox = Inbox(maxsize=self.inbox_size)
        self.state = NodeState(
            conditions=rules.conditions,
            clock=self.clock,
            reasons=rules.reasons,
            aggregate=True,
            seeded=seeded,
        )
        self.feed = SnapshotFeed(initial=self.state.snapshot())
        self.health = StateDirHealth(path=tmp)
        self.cursors = CursorStore(state_dir=tmp)
        self.loop = MainLoop(
            inbox=self.inbox,
            feed=self.feed,
            state=self.state,
            pipeline=DetectionPipeline(rule_set=rules),
            replay=ReplayPolicy(cursor=cursor, boot_id=BOOT, lookback=300.0),
            health=lambda: {"main_loop": True},
            stall_timeout=60.0,
            cursor_store=self.cursors,
            condition_store=ConditionStore(health=self.health),
            state_dir=self.health,
            acks=acks,
            devices=devices,
            clock=self.clock,
            monotonic=self.mono,
        )
        self.stop = threading.Event()

    def put(self, item) -> None:
        assert self.inbox.put(item, stop=self.stop)

    def step(self) -> None:
        self.loop.step(timeout=0)
        self.mono.now += 2.0  # past the cursor save interval
