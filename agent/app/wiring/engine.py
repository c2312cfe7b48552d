"""Component ``main_loop``: the one writer of the node state, and its figures."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.app.settings import Settings
from agent.app.wiring.sources import Figures
from agent.app.wiring.state import StartState
from agent.core.bus import Inbox, SnapshotFeed
from agent.core.deviceresolver import DeviceResolver
from agent.core.ring import LineRing
from agent.core.statedir import StateDirHealth
from agent.core.supervisor import Supervisor
from agent.detectors.pipeline import DetectionPipeline
from agent.detectors.rulepack import RuleSet
from agent.engine.mainloop import MainLoop


def main_loop(
    settings: Settings,
    *,
    start: StartState,
    rule_set: RuleSet,
    inbox: Inbox,
    feed: SnapshotFeed,
    health: Callable[[], Mapping[str, bool]],
    acks: Sequence[Callable[[], int]],
    monitors: Mapping[str, DetectionPipeline],
    kernel_log: LineRing | None,
    clock: Callable[[], float],
) -> MainLoop:
    """The main loop over the state as restored, with the kernel rules and each monitor's own pipeline."""
    return MainLoop(
        inbox=inbox,
        feed=feed,
        state=start.state,
        pipeline=DetectionPipeline(rule_set=rule_set),
        replay=start.replay,
        health=health,
        stall_timeout=settings.stall_timeout,
        cursor_store=start.cursor_store,
        condition_store=start.condition_store,
        clear_store=start.clear_store,
        state_dir=start.state_dir,
        acks=acks,
        monitors=monitors,
        kernel_log=kernel_log,
        devices=DeviceResolver(sys_root=settings.sys_root, dev_root=settings.dev_root),
        clock=clock,
    )


def engine_figures(*, main_loop: MainLoop, supervisor: Supervisor, state_dir: StateDirHealth) -> Figures:
    """The main loop's counters and the rules in effect (a reload replaces the pipeline), the components'
    health, the state directory's."""

    def figures() -> Mapping[str, Any]:
        pipeline = main_loop.pipeline
        return {
            "lines_matched": pipeline.lines_matched,
            "rule_matches": dict(pipeline.rule_matches),
            "rules_loaded": len(pipeline.rule_set.rules),
            "device_matches": pipeline.threshold_counts(),
            **pipeline.catch_all_counts(),
            "records_processed": main_loop.records_processed,
            "decode_errors": main_loop.decode_errors,
            "components": supervisor.health(),
            "state_dir_ok": state_dir.ok,
        }

    return figures
