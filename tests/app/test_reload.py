"""Hot reload: a valid change is swapped in whole, an invalid one is rejected and the last good
configuration keeps running; the real agent picks up a changed rule pack from its plugin directory."""

from __future__ import annotations

import functools
import json
import logging
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.app.config import load_configuration
from agent.app.reload import ConfigWatcher, Relevant
from agent.checks.model import CheckContext, CheckResult, CheckStatus
from agent.checks.scheduler import CheckScheduler
from agent.core.bus import Inbox
from agent.core.process import run_process
from agent.core.statedir import atomic_write
from agent.core.types import ConditionSpec
from agent.engine.inputs import Reconfigure

from helpers import http_get, start_standalone_agent, wait_for
from helpers.threads import wakeups_while_asleep

pytestmark = pytest.mark.slow  # starts agent processes

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
    context = CheckContext(state_dir=tmp_path)
    loaded = load_configuration([plugins], context=context, entry_points=entry_points)
    inbox = Inbox()
    scheduler = CheckScheduler(checks=list(loaded.checks), inbox=Inbox(), start_thread=lambda target, name: None)
    watcher = ConfigWatcher(
        paths=[plugins],
        current=loaded,
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
        watcher.wake()  # as the supervisor does
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
        assert _metric(base, "node_health_agent_rules_loaded") == 1.0
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
        pack.write_text(
            textwrap.dedent(PACK).replace("pattern: 'alpha .*'}", "pattern: 'gamma .*'}")
            + "  - {type: temporary, reason: EpsilonSeen, pattern: 'epsilon .*'}\n"
        )
        wait_for(lambda: _metric(base, "node_health_agent_config_generation") == 2.0, timeout=30)
        wait_for(lambda: _metric(base, "node_health_agent_rules_loaded") == 2.0)  # the rules now in effect
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        with (tmp_path / "kmsg").open("a") as f:  # the agent's kernel log (see start_standalone_agent)
            f.write(f"3,1,{usec},-;gamma ray burst\n")
        cond = wait_for(lambda: (c := _condition(base, "Thing")) and c["status"] == "True" and c, timeout=30)
        assert cond["reason"] == "AlphaSeen"
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


# ---- what the watcher reacts to (issue 13 #10) -----------------------------------------------------------


def configmap(directory: Path, files: dict[str, str], *, stamp: str) -> None:
    """Lay out ``directory`` as the kubelet mounts a ConfigMap, or update it as the kubelet does: the
    files in a new ``..<stamp>`` directory, ``..data`` swapped to it by a rename, visible symlinks."""
    directory.mkdir(exist_ok=True)
    stamped = directory / f"..{stamp}"
    stamped.mkdir()
    for name, text in files.items():
        (stamped / name).write_text(text)
    old = (directory / "..data").readlink() if (directory / "..data").is_symlink() else None
    (directory / "..data_tmp").symlink_to(stamped.name)
    (directory / "..data_tmp").rename(directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    if old is not None:
        for child in (directory / old).iterdir():
            child.unlink()
        (directory / old).rmdir()


RELEVANT = [
    # (changed path relative to tmp, is a directory, counts)
    ("etc/agent.yaml", False, True),  # the --config file itself
    ("etc/..data", False, True),  # a ConfigMap update beside it
    ("etc/..data_tmp", False, True),
    ("etc/conditions.json", False, False),  # the agent's state written beside its --config file
    ("etc/agent.log", False, False),
    ("etc/other.yaml", False, False),  # another file beside it: not configuration
    ("etc/sub/agent.yaml", False, False),  # --config's directory is not watched recursively
    ("plugins/pack.yaml", False, True),
    ("plugins/neuron/checks.yml", False, True),
    ("plugins/rules.json", False, True),
    ("plugins/neuron", True, True),  # a directory of packs moved in or out
    ("plugins/README.md", False, False),
    ("plugins/plugin.sh", False, False),
    ("plugins/.pack.yaml.swp", False, False),  # hidden: loading skips it
    ("plugins/.git/config.yaml", False, False),
    ("plugins/..2026_01_01/pack.yaml", False, True),  # a ConfigMap mounted as a plugin directory
    ("plugins/state/conditions.json", False, False),  # under --state-dir
    ("plugins", True, False),  # the directory itself (its own metadata)
    ("elsewhere/pack.yaml", False, False),
]


@pytest.mark.parametrize(("changed", "is_directory", "counts"), RELEVANT, ids=[r[0] for r in RELEVANT])
def test_only_changes_that_can_touch_the_configuration_count(tmp_path, changed, is_directory, counts):
    (tmp_path / "etc").mkdir()
    (tmp_path / "plugins").mkdir()
    relevant = Relevant.of([tmp_path / "plugins", tmp_path / "etc" / "agent.yaml"], ignore=[tmp_path / "plugins/state"])
    assert relevant(str(tmp_path / changed), is_directory=is_directory) is counts
    assert relevant.watches() == [(tmp_path / "etc", False), (tmp_path / "plugins", True)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_changes_is_checked_once_after_it_settles(tmp_path):
    plugins, _, _, _ = setup(tmp_path)
    clock = Clock()
    watcher = ConfigWatcher(
        paths=[plugins],
        current=load_configuration([plugins], context=CheckContext(state_dir=tmp_path), entry_points=entry_points),
        context=CheckContext(state_dir=tmp_path),
        scheduler=None,
        inbox=Inbox(),
        entry_points=entry_points,
        settle=1.0,
        monotonic=clock,
    )
    pack = str(plugins / "pack.yaml")
    checked = []
    for step in range(42):  # a change every 0.5 s for 20.5 s: never settles
        clock.now = step * 0.5
        watcher.seen(pack)
        checked += [clock.now] if watcher.poll() else []
    assert checked == [10.0, 20.5]  # one check per MAX_WAIT (10 s) while it goes on
    watcher.seen(pack)
    clock.now = 21.4
    assert watcher.poll() is False  # 0.9 s after the last change: still settling
    clock.now = 21.5
    assert watcher.poll() is True and watcher.poll() is False  # settled: checked once
    assert (watcher.unchanged, watcher.generation) == (3, 1)  # nothing really changed: no reload


def test_an_idle_watcher_sleeps_on_the_change_signal_not_in_short_polls(tmp_path):
    """Its wakeups are the agent's idle CPU: nothing pending, it sleeps until a change or wake() (stop)."""
    plugins, watcher, _, _ = setup(tmp_path)
    waits: list[float | None] = []

    class CountingStop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            return super().wait(timeout)

    stop = CountingStop()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: watcher.watching and watcher.unchanged == 1)  # the check at start: nothing changed
        idle = len(waits)
        time.sleep(0.5)  # two and a half of the old 0.2 s polls
        assert len(waits) == idle
        assert wakeups_while_asleep(thread.native_id, sleeps_in=["futex"]) == 0  # not even once a second
        (plugins / "pack.yaml").write_text((plugins / "pack.yaml").read_text() + "\n")  # a change wakes it
        wait_for(lambda: watcher.generation == 2)
    finally:
        stop.set()
        watcher.wake()  # as the supervisor does
        thread.join(timeout=5)
    assert not thread.is_alive()


def run_watcher(watcher: ConfigWatcher):
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    wait_for(lambda: watcher.watching and watcher.unchanged == 1)  # the check at start: nothing changed
    return stop, thread


def watch(tmp_path: Path, paths: list[Path]) -> tuple[ConfigWatcher, Inbox]:
    inbox = Inbox()
    watcher = ConfigWatcher(
        paths=paths,
        current=load_configuration(paths, context=CheckContext(state_dir=tmp_path), entry_points=entry_points),
        context=CheckContext(state_dir=tmp_path),
        scheduler=None,
        inbox=inbox,
        entry_points=entry_points,
        settle=0.05,
        ignore=[tmp_path / "plugins" / "state"],
    )
    return watcher, inbox


def test_state_writes_beside_a_config_file_and_a_touch_are_no_reload(tmp_path):
    """Issue 13 #10: the agent's own state written beside its --config file reloaded it endlessly."""
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "agent.yaml"
    config.write_text(textwrap.dedent(PACK))
    watcher, inbox = watch(tmp_path, [config])
    stop, thread = run_watcher(watcher)
    try:
        for n in range(5):  # as the agent writes its state (write a temporary file, rename it)
            atomic_write(etc / "conditions.json", json.dumps({"n": n}).encode())
            (etc / "agent.log").write_text(f"line {n}\n")
        wait_for(lambda: watcher.ignored >= 10)
        config.touch()
        config.write_text(textwrap.dedent(PACK))  # the same content again
        wait_for(lambda: watcher.unchanged == 2)
        assert (watcher.generation, watcher.failures) == (1, 0) and inbox.get(timeout=0) is None
        config.write_text(textwrap.dedent(PACK) + "  - {type: temporary, reason: BetaSeen, pattern: 'beta .*'}\n")
        wait_for(lambda: watcher.generation == 2)
        assert [r.reason for r in inbox.get(timeout=5).rule_set.rules] == ["AlphaSeen", "BetaSeen"]
    finally:
        stop.set()
        watcher.wake()  # as the supervisor does
        thread.join(10)
    assert not thread.is_alive()


def test_a_rejected_change_is_not_tried_again_until_the_content_changes(tmp_path):
    plugins, watcher, _, _ = setup(tmp_path)
    stop, thread = run_watcher(watcher)
    try:
        (plugins / "pack.yaml").write_text("rules: [\n")
        wait_for(lambda: watcher.failures == 1)
        # The write may reach the watcher as more than one event (its later ones find the content unchanged):
        # count from here, not from zero.
        seen = watcher.unchanged
        (plugins / "pack.yaml").touch()
        wait_for(lambda: watcher.unchanged > seen)
        assert (watcher.failures, watcher.generation) == (1, 1)
        (plugins / "pack.yaml").write_text(textwrap.dedent(PACK))
        wait_for(lambda: watcher.generation == 2)
        assert watcher.failures == 1  # the touch in between was never tried again
    finally:
        stop.set()
        watcher.wake()  # as the supervisor does
        thread.join(10)


@pytest.mark.parametrize("mounted", ["config-file", "plugins-dir"])
def test_a_configmap_update_is_reloaded(tmp_path, mounted):
    directory = tmp_path / ("etc" if mounted == "config-file" else "plugins")
    configmap(directory, {"pack.yaml": textwrap.dedent(PACK)}, stamp="2026_01_01_00_00_00.1")
    paths = [directory / "pack.yaml"] if mounted == "config-file" else [directory]
    watcher, inbox = watch(tmp_path, paths)
    stop, thread = run_watcher(watcher)
    try:
        updated = textwrap.dedent(PACK) + "  - {type: temporary, reason: BetaSeen, pattern: 'beta .*'}\n"
        configmap(directory, {"pack.yaml": updated}, stamp="2026_01_01_00_01_00.2")
        wait_for(lambda: watcher.generation == 2)
        assert [r.reason for r in inbox.get(timeout=5).rule_set.rules] == ["AlphaSeen", "BetaSeen"]
        assert watcher.failures == 0
    finally:
        stop.set()
        watcher.wake()  # as the supervisor does
        thread.join(10)


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
        watcher.wake()  # as the supervisor does
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
        watcher.wake()  # as the supervisor does
        thread.join(10)


def test_an_import_that_hangs_during_a_reload_does_not_hold_up_shutdown(tmp_path):
    hanging = Misbehaving("hangs")
    plugins, watcher, scheduler, stop, thread = watched(tmp_path, [hanging])
    try:
        (plugins / "checks.yaml").write_text("checks:\n  - name: one\n    options: {n: 2}\n")
        assert hanging.entered.wait(20)  # the reload is waiting on the hung import
        stop.set()
        watcher.wake()  # as the supervisor does
        thread.join(10)  # on the old code: stuck in the import until the gate opens
        assert not thread.is_alive()
        assert watcher.generation == 1  # nothing half-loaded was swapped in
    finally:
        hanging.gate.set()
        stop.set()
        watcher.wake()  # as the supervisor does
        thread.join(10)


# ---- one loader at start and on reload (issue 14) --------------------------------------------------------


def npd_plugin_file(tool: Path, *, interval: str, missing: Path) -> str:
    """A custom-plugin monitor with two rules: ``tool`` (runs) and ``missing`` (a warning: not there yet)."""
    rule = {"type": "permanent", "condition": "SlowTool", "reason": "SlowToolBroken", "timeout": "30s"}
    return json.dumps(
        {
            "plugin": "custom",
            "pluginConfig": {"invoke_interval": interval, "timeout": "30s"},
            "source": "slow-tool",
            "conditions": [{"type": "SlowTool", "reason": "SlowToolFine", "message": "fine"}],
            "rules": [
                {**rule, "path": str(tool)},
                {"type": "temporary", "reason": "NotYetBroken", "timeout": "30s", "path": str(missing)},
            ],
        }
    )


def test_after_a_reload_a_custom_plugin_tool_is_still_killed_at_shutdown_and_warnings_are_kept(tmp_path, caplog):
    """The reload used to load configuration its own way: custom-plugin checks lost the process runner
    the agent cancels at shutdown (a running tool outlived it), and the warnings were dropped."""
    pid_file = tmp_path / "tool.pid"
    tool = tmp_path / "slow-tool.sh"
    tool.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    tool.chmod(0o755)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "pack.yaml").write_text(textwrap.dedent(PACK))
    plugin_file = plugins / "slow-tool.json"
    plugin_file.write_text(npd_plugin_file(tool, interval="60s", missing=tmp_path / "not-yet.sh"))
    cancel = threading.Event()
    context = CheckContext(state_dir=tmp_path, run_process=functools.partial(run_process, cancel=cancel))
    loaded = load_configuration([plugins], context=context, entry_points=list)
    assert loaded.warnings and "does not exist (yet)" in str(loaded.warnings[0])
    watcher = ConfigWatcher(
        paths=[plugins], current=loaded, context=context, scheduler=None, inbox=Inbox(), entry_points=list
    )
    plugin_file.write_text(npd_plugin_file(tool, interval="90s", missing=tmp_path / "not-yet.sh"))
    with caplog.at_level(logging.WARNING, logger="agent.app.reload"):
        assert watcher.reload() is True
    assert watcher.current.warnings == loaded.warnings
    assert any("does not exist (yet)" in r.getMessage() for r in caplog.records), "the reload says it again"
    [check] = [c for c in watcher.current.checks if c.name == "slow-tool/slow-tool-broken"]
    assert check.interval == 90.0, "the reloaded check, not the one loaded at start"
    outcome: list[object] = []
    runner = threading.Thread(target=lambda: outcome.append(check.check.run()), daemon=True)
    runner.start()
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=10))
    cancel.set()  # the agent stops
    runner.join(timeout=10)
    assert not runner.is_alive(), "the run ended when the agent stopped (before: it waited out the tool)"
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=10)
