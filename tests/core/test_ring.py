"""The bounded line ring (agent.core.ring) and the main loop keeping the kernel log in it: what the
diagnostics bundle reads back as "the kernel log of this boot as the agent read it"."""

from __future__ import annotations

import threading

import pytest

from agent.core.bus import Inbox, RecordBatch, SnapshotFeed
from agent.core.ring import LineRing
from agent.core.state import NodeState
from agent.core.types import LogRecord
from agent.detectors.pipeline import DetectionPipeline
from agent.detectors.rulepack import compile_rule_packs
from agent.engine.mainloop import MainLoop
from agent.sources.replay import ReplayPolicy

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


STAMP = "2026-01-01T00:00:00Z "  # 21 bytes in front of each message


@pytest.mark.parametrize(
    ("bounds", "messages", "kept", "dropped"),
    [
        ({"max_lines": 3}, ["a", "b", "c", "d", "e"], ["c", "d", "e"], 2),
        ({"max_lines": 2}, [["a", "b", "c"], ["d"]], ["c", "d"], 2),  # two batches: older records never kept
        ({"max_bytes": 48}, ["aa", "bb", "cc", "dd"], ["cc", "dd"], 2),  # 24 bytes a line with its newline
        ({"max_bytes": 50}, ["é", "a", "b"], ["a", "b"], 1),  # "é" is 2 bytes: 25 + 23 + 23 > 50
        ({"max_bytes": 4}, ["a long line"], ["a long line"], 0),  # the newest line stays, whatever its size
        ({"max_line": 4}, ["abcdefgh"], ["abcd..."], 0),
        ({}, [], [], 0),
    ],
)
def test_bounds(bounds, messages, kept, dropped):
    ring = LineRing(**bounds)
    for batch in messages if messages and isinstance(messages[0], list) else [messages]:
        ring.extend([LogRecord(message=m, timestamp=NOW) for m in batch])
    assert (ring.lines(), ring.dropped) == ([STAMP + m for m in kept], dropped)


def test_no_room_is_refused():
    with pytest.raises(ValueError):
        LineRing(max_lines=0)


def test_the_main_loop_keeps_the_kernel_log_but_not_log_monitors():
    rules = compile_rule_packs([])
    state = NodeState(conditions=(), clock=lambda: NOW)
    ring = LineRing()
    inbox = Inbox()
    loop = MainLoop(
        inbox=inbox,
        feed=SnapshotFeed(initial=state.snapshot()),
        state=state,
        pipeline=DetectionPipeline(rule_set=rules),
        replay=ReplayPolicy(cursor=None, boot_id="boot-a", lookback=300.0),
        health=lambda: {},
        stall_timeout=60.0,
        monitors={"syslog": DetectionPipeline(rule_set=rules)},
        kernel_log=ring,
        clock=lambda: NOW,
    )
    stop = threading.Event()
    inbox.put(RecordBatch(records=[LogRecord(message="Linux version 6.1", timestamp=NOW, seq=1)]), stop=stop)
    inbox.put(RecordBatch(records=[LogRecord(message="sshd: hello", timestamp=NOW)], monitor="syslog"), stop=stop)
    loop.step(timeout=0)
    assert ring.lines() == ["2026-01-01T00:00:00Z Linux version 6.1"]
