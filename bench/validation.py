"""``bench/run.py validation``: no rebooted node goes back into service unproven (issue 36, the gate's figures).

The recovery loop (agent.recovery.loop, with its ladder) on one node of the test API server, the real
kubernetes client, a fake reboot (the ladder's reboot callable: a new boot id) and an injected clock. An Xid 79
is cordoned, drained and rebooted; the node stays quiet through its window. Validation records are
published in the snapshot as the main loop keeps them:

* ``validation.uncordoned_before_pass``: Node writes that made it schedulable before every check passed, over
  two nodes: one whose checks fail (``onFail: hold``, stepped through 6 hours) and one before its pass (0 = none);
* ``validation.pass_to_uncordon_s``: the loop running (its own thread, woken by publications), from the
  publication of the passing records to the Node read back schedulable.

The active checks' figures (:mod:`bench.validation_active`): ``validation.active_started_with_holder``,
``validation.pass_invalidated_by_fault`` and ``validation.fleet_max_concurrent_share``.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("dcgm-diag", "nccl-loopback")
XID79 = ("GpuXid", "GpuXid79")


def _uncordons(api: Any, path: str) -> int:
    """Node PATCHes that made it schedulable."""
    return sum(
        1
        for r in api.requests.filter(method="PATCH", path_regex=path)
        if isinstance(r.body, dict) and (r.body.get("spec") or {}).get("unschedulable") is False
    )


def _records(verdict: Any, *, at: float) -> tuple[Any, ...]:
    from agent.core.validation import ValidationRecord, Verdict

    until = at + 86_400 if verdict is Verdict.PASS else None
    return tuple(
        ValidationRecord(check=c, devices=(), verdict=verdict, reason="", message="", at=at, valid_until=until)
        for c in CHECKS
    )


def _rebooted(api: Any, client: Any, on_fail: Any) -> Any:
    """A harness whose node was rebooted for an Xid 79 and stayed quiet through its window."""
    from agent.recovery.drain import DrainResult
    from agent.recovery.ladder import Ladder
    from agent.recovery.model import DEFAULT_WINDOW, BudgetSettings, ValidationSettings
    from agent.recovery.policyfile import DEFAULT_POLICY

    from helpers import recovery

    boot = ["boot-1"]
    clock = recovery.Clock()
    policy = dataclasses.replace(
        DEFAULT_POLICY,
        startup_delay=0.0,
        budget=BudgetSettings(max_actions=100),
        validation=ValidationSettings(checks=CHECKS, on_fail=on_fail),
    )
    ladder = Ladder(
        client=client, node_name=recovery.NODE, boot_id=lambda: boot[0], reboot=lambda view: recovery.INSTANCE
    )
    h = recovery.LoopHarness(
        api, client, policy=policy, clock=clock, ladder=ladder, drainer=lambda stop, report: DrainResult(outcome="done")
    )
    h.publish(recovery.problem(*XID79, since=clock.now - 10))
    h.step()
    boot[0] = "boot-2"
    clock.now += 60
    h.quiet = recovery.healthy(XID79[0], since=clock.now)
    h.publish(h.quiet)
    h.step()
    clock.now += DEFAULT_WINDOW + 1
    h.step()  # the window passed: the request, the node still cordoned
    return h


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"validation benchmark: {what} did not happen in {timeout:g} s")
        time.sleep(0.01)
    return time.monotonic() - start


def _failing(api: Any, client: Any) -> int:
    from agent.core.validation import Verdict
    from agent.recovery.model import OnFail

    from helpers.recovery import NODE_PATH

    h = _rebooted(api, client, OnFail.HOLD)
    h.publish(h.quiet, validations=_records(Verdict.FAIL, at=h.clock.now + 1))
    for _ in range(36):  # six hours, a step every ten minutes
        h.clock.now += 600
        h.step()
    assert h.cordoned(), "a failing node stays cordoned"
    return _uncordons(api, NODE_PATH)


def _passing(api: Any, client: Any) -> tuple[int, float]:
    from agent.core.validation import Verdict
    from agent.recovery.model import OnFail

    from helpers.recovery import NODE_PATH

    h = _rebooted(api, client, OnFail.CLIMB)
    before = _uncordons(api, NODE_PATH)
    stop = threading.Event()
    runner = threading.Thread(target=h.loop.run, args=(stop,), daemon=True)
    runner.start()
    try:
        time.sleep(0.2)  # the loop's first turn (nothing proven yet: it holds)
        before += _uncordons(api, NODE_PATH)
        h.publish(h.quiet, validations=_records(Verdict.PASS, at=h.clock.now + 1))
        elapsed = _wait(lambda: not h.cordoned(), 30.0, "the uncordon after the pass")
    finally:
        stop.set()
        runner.join(timeout=10)
    return before, elapsed


def measure() -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import kube_clients
    from helpers.recovery import prepare
    from kubeapi.server import KubeApiServer

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in ("failing", "passing"):
            api = prepare(KubeApiServer().start())
            home = Path(tmpdir, name)
            home.mkdir()
            try:
                with kube_clients(api, home) as make:
                    if name == "failing":
                        figures["validation.uncordoned_before_pass"] = float(_failing(api, make()))
                    else:
                        before, elapsed = _passing(api, make())
                        figures["validation.uncordoned_before_pass"] += before
                        figures["validation.pass_to_uncordon_s"] = elapsed
            finally:
                api.stop()
        from bench import validation_active

        figures.update(validation_active.measure(Path(tmpdir)))
    return figures
