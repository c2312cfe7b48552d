"""Hot reload: a valid change is swapped in whole, an invalid one is rejected and the last good
configuration keeps running; the real agent picks up a changed rule pack from its plugin directory."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.agentconfig import build_scheduled_checks, load_agent_config
from agent.checks.model import CheckContext, CheckResult, CheckStatus
from agent.checks.scheduler import CheckScheduler
from agent.reload import ConfigWatcher
from agent.runtime import Inbox, Reconfigure
from agent.types import ConditionSpec

from helpers import http_get, start_standalone_agent, wait_for

PACK = """
conditions:
  - {type: Thing, reason: ThingOk, message: fine}
rules:
  - {type: permanent, condition: Thing, reason: AlphaSeen, pattern: 'alpha .*'}
"""


class Counter:
    interval = 60.0
    timeout = 5.0

    def __init__(self, *, name, context, options):
        self.name = name
        self.type = f"Counted{name.capitalize()}"  # one condition type per check: a type has one owner
        self.conditions = (ConditionSpec(type=self.type, reason="CountedOk", message="ok", source=name),)
        self.options = options

    def run(self):
        return [CheckResult(status=CheckStatus.OK, condition=self.type, reason="CountedOk", message="ok")]


class EP:
    def __init__(self, name):
        self.name, self.value, self.dist = name, "tests:Counter", None

    def load(self):
        return Counter


def entry_points():
    return [EP("one"), EP("two")]


def setup(tmp_path: Path, *, installed: Callable[[], list] = entry_points):
    """A plugin directory, and a watcher on it; ``installed`` lists the entry points at each reload."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "pack.yaml").write_text(textwrap.dedent(PACK))
    (plugins / "checks.yaml").write_text("checks:\n  - name: one\n    options: {n: 1}\n")
    config = load_agent_config([plugins], entry_points=entry_points)
    context = CheckContext(state_dir=tmp_path)
    checks = build_scheduled_checks(config, context=context, entry_points=entry_points)
    inbox = Inbox()
    scheduler = CheckScheduler(checks=checks, inbox=Inbox(), start_thread=lambda target, name: None)
    watcher = ConfigWatcher(
        paths=[plugins],
        config=config,
        checks=checks,
        context=context,
        scheduler=scheduler,
        inbox=inbox,
        entry_points=installed,
        settle=0.05,
    )
    return plugins, watcher, scheduler, inbox


def test_a_valid_change_is_swapped_in_and_unchanged_checks_keep_their_object(tmp_path):
    plugins, watcher, scheduler, inbox = setup(tmp_path)
    before = {c.name: c.check for c in scheduler.checks}
    (plugins / "checks.yaml").write_text("checks:\n  - name: one\n    options: {n: 2}\n")
    (plugins / "pack.yaml").write_text(
        textwrap.dedent(PACK) + "  - {type: temporary, reason: BetaSeen, pattern: 'beta .*'}\n"
    )
    assert watcher.reload() is True
    after = {c.name: c.check for c in scheduler.checks}
    assert after["one"] is not before["one"] and after["one"].plugin.options == {"n": 2}
    assert after["two"] is before["two"]  # its declaration did not change: its memory survives
    item = inbox.get(timeout=0)
    assert isinstance(item, Reconfigure) and item.generation == 2
    assert [r.reason for r in item.rule_set.rules] == ["AlphaSeen", "BetaSeen"]
    assert {c.type for c in item.conditions} == {"Thing", "CountedOne", "CountedTwo"}
    assert (watcher.generation, watcher.failures, watcher.last_error) == (2, 0, None)


def test_an_invalid_change_is_rejected_and_the_last_good_configuration_keeps_running(tmp_path):
    plugins, watcher, scheduler, inbox = setup(tmp_path)
    before = scheduler.checks
    pack = plugins / "pack.yaml"
    pack.write_text(textwrap.dedent(PACK) + "  - {type: temporary, reason: Bad, pattern: 'a(b'}\n")
    assert watcher.reload() is False
    assert scheduler.checks == before and inbox.get(timeout=0) is None
    assert (watcher.generation, watcher.failures) == (1, 1)
    assert f"{pack}:6: rules[1].pattern" in watcher.last_error
    assert watcher.healthy(0.0)  # /healthz stays green: the configuration is wrong, not the agent


def test_the_file_watcher_triggers_a_reload(tmp_path):
    plugins, watcher, _, inbox = setup(tmp_path)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: watcher.watching)
        (plugins / "checks.yaml").write_text("checks:\n  - name: one\n    enabled: false\n")
        wait_for(lambda: watcher.generation == 2, timeout=20)
        assert isinstance(inbox.get(timeout=5), Reconfigure)
        assert watcher.failures == 0
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


# ---- the real agent -------------------------------------------------------------------------------------


def _metric(base: str, name: str) -> float | None:
    _, body = http_get(f"{base}/metrics")
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _condition(base: str, type_: str) -> dict | None:
    _, body = http_get(f"{base}/conditions")
    if not body:
        return None
    return next((c for c in json.loads(body)["conditions"] if c["type"] == type_), None)


def test_the_running_agent_takes_a_changed_rule_pack_and_rejects_a_broken_one(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    pack = plugins / "pack.yaml"
    pack.write_text(textwrap.dedent(PACK))
    proc, base = start_standalone_agent(tmp_path, plugins=plugins)
    try:
        wait_for(lambda: _metric(base, "node_health_agent_config_generation") == 1.0, timeout=30)
        pack.write_text(
            textwrap.dedent(PACK).replace("pattern: 'alpha .*'}", "pattern: 'gamma .*'}")
            + "  - {type: permanent, condition: New, reason: NewSeen, pattern: 'delta .*'}\n"
            + "conditions_extra: 1\n"
        )  # invalid: an unknown key
        wait_for(
            lambda: "config_watcher" in json.loads(http_get(f"{base}/healthz")[1] or "{}").get("details", {}),
            timeout=30,
        )
        status, body = http_get(f"{base}/healthz")
        assert status == 200 and "conditions_extra" in json.loads(body)["details"]["config_watcher"]
        assert _metric(base, "node_health_agent_config_reload_failures_total") == 1.0
        pack.write_text(textwrap.dedent(PACK).replace("pattern: 'alpha .*'}", "pattern: 'gamma .*'}"))
        wait_for(lambda: _metric(base, "node_health_agent_config_generation") == 2.0, timeout=30)
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        with (tmp_path / "kmsg").open("a") as f:  # the agent's kernel log (see start_standalone_agent)
            f.write(f"3,1,{usec},-;gamma ray burst\n")
        cond = wait_for(lambda: (c := _condition(base, "Thing")) and c["status"] == "True" and c, timeout=30)
        assert cond["reason"] == "AlphaSeen"
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


# ---- plugins that misbehave while loading during a reload ------------------------------------------------


class Misbehaving:
    """An entry point whose import (``load``) exits the interpreter or hangs until ``gate`` opens."""

    def __init__(self, name: str, *, exits: bool = False) -> None:
        self.name, self.value, self.dist = name, f"nha_{name.replace('-', '_')}:Check", None
        self.exits = exits
        self.entered = threading.Event()
        self.gate = threading.Event()

    def load(self):
        self.entered.set()
        if self.exits:
            raise SystemExit(7)  # what `import plugin` raises when the plugin calls sys.exit(7) at import
        self.gate.wait(60)
        return Counter


def watched(
    tmp_path: Path, extra: list
) -> tuple[Path, ConfigWatcher, CheckScheduler, threading.Event, threading.Thread]:
    """A watcher running in its own thread; the ``extra`` entry points are installed after the agent started."""
    plugins, watcher, scheduler, _ = setup(tmp_path, installed=lambda: [*entry_points(), *extra])
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), name="config_watcher")
    thread.start()
    wait_for(lambda: watcher.watching)
    return plugins, watcher, scheduler, stop, thread


def test_a_plugin_calling_sys_exit_during_a_reload_is_a_broken_check_and_the_watcher_goes_on(tmp_path):
    exiting = Misbehaving("exits", exits=True)
    plugins, watcher, scheduler, stop, thread = watched(tmp_path, [exiting])
    try:
        (plugins / "checks.yaml").write_text("checks:\n  - name: one\n    options: {n: 2}\n")
        wait_for(lambda: watcher.generation == 2, timeout=20)  # on the old code: the watcher thread is gone
        broken = {c.name: c.check for c in scheduler.checks}["exits"]
        assert broken.run()[0].message == "cannot load check exits: SystemExit: 7"
        assert thread.is_alive() and watcher.failures == 0
        (plugins / "checks.yaml").write_text("checks:\n  - name: one\n    options: {n: 3}\n")
        wait_for(lambda: watcher.generation == 3, timeout=20)  # it still reloads
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


class Fickle:
    """A check whose ``conditions`` property answers once, then raises (it used to kill the watcher,
    which read it again after loading, and the scheduler, which read it on every run)."""

    interval, timeout = 60.0, 5.0

    def __init__(self, *, name, context, options):
        self.name, self.reads = name, 0

    @property
    def conditions(self):
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("asked twice")
        return (ConditionSpec(type="Fickle", reason="FickleOk", message="ok", source=self.name),)

    def run(self):
        return [CheckResult(status=CheckStatus.OK, condition="Fickle", reason="FickleOk", message="ok")]


def test_a_check_whose_conditions_raise_after_loading_does_not_stop_the_watcher(tmp_path):
    fickle = EP("fickle")
    fickle.load = lambda: Fickle
    plugins, watcher, scheduler, stop, thread = watched(tmp_path, [fickle])
    try:
        (plugins / "checks.yaml").write_text("checks:\n  - name: one\n    options: {n: 2}\n")
        wait_for(lambda: watcher.generation == 2, timeout=20)  # on the old code: the watcher thread died here
        assert [c.type for c in {c.name: c.check for c in scheduler.checks}["fickle"].conditions] == ["Fickle"]
        assert thread.is_alive() and watcher.last_error is None
    finally:
        stop.set()
        thread.join(10)


def test_an_import_that_hangs_during_a_reload_does_not_hold_up_shutdown(tmp_path):
    hanging = Misbehaving("hangs")
    plugins, watcher, scheduler, stop, thread = watched(tmp_path, [hanging])
    try:
        (plugins / "checks.yaml").write_text("checks:\n  - name: one\n    options: {n: 2}\n")
        assert hanging.entered.wait(20)  # the reload is waiting on the hung import
        stop.set()
        thread.join(10)  # on the old code: stuck in the import until the gate opens
        assert not thread.is_alive()
        assert watcher.generation == 1  # nothing half-loaded was swapped in
    finally:
        hanging.gate.set()
        stop.set()
        thread.join(10)
