"""Who may write which Node condition.

- Types others own (kubelet's ``Ready`` and pressures, the EKS node monitoring agent's ``*Ready``
  types, our own aggregate ``AcceleratedHardwareReady``) mean healthy when True: declaring one is a
  configuration error in every kind of file and plugin, and the condition sink never writes one.
- A condition type has one owner: two sources declaring it is a configuration error naming both
  (at start and on reload).
- Recovery acts only on problems raised by the owners its rule trusts.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.app.config import build_scheduled_checks, load_agent_config, load_configuration, owned_conditions
from agent.app.settings import rule_dirs
from agent.checks.declared import CheckDecl
from agent.checks.loader import build_checks
from agent.checks.model import CheckContext, CheckResult, CheckStatus
from agent.core.errors import ConfigError
from agent.core.types import RESERVED_CONDITION_TYPES, Condition, ConditionSpec, Provenance, Snapshot, Status
from agent.recovery.model import BUILTIN_CONDITIONS, NodeView
from agent.recovery.policy import decide, untrusted
from agent.recovery.policyfile import DEFAULT_POLICY

from helpers import FakeEntryPoint

RESERVED = sorted(RESERVED_CONDITION_TYPES)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def rule_pack(type_: str) -> str:
    return f"""
    source: my-monitor
    conditions:
      - type: {type_}
        reason: Fine
        message: fine
    rules:
      - type: permanent
        condition: {type_}
        reason: Broken
        pattern: "broken"
    """


def journald_monitor(type_: str) -> str:
    return json.dumps(
        {
            "plugin": "journald",
            "pluginConfig": {"source": "kubelet"},
            "source": "my-journal",
            "conditions": [{"type": type_, "reason": "Fine", "message": "fine"}],
            "rules": [{"type": "permanent", "condition": type_, "reason": "Broken", "pattern": "broken"}],
        }
    )


def filelog_monitor(type_: str) -> str:
    return json.dumps(
        {
            "plugin": "filelog",
            "pluginConfig": {"timestamp": "^.{15}", "message": "kernel: (.*)", "timestampFormat": "Jan _2 15:04:05"},
            "logPath": "/var/log/kern.log",
            "source": "my-file",
            "conditions": [{"type": type_, "reason": "Fine", "message": "fine"}],
            "rules": [{"type": "permanent", "condition": type_, "reason": "Broken", "pattern": "broken"}],
        }
    )


def custom_plugin(type_: str) -> str:
    return json.dumps(
        {
            "plugin": "custom",
            "pluginConfig": {"invoke_interval": "60s", "timeout": "10s"},
            "source": "my-plugin",
            "conditions": [{"type": type_, "reason": "Fine", "message": "fine"}],
            "rules": [{"type": "permanent", "condition": type_, "reason": "Broken", "path": "/bin/true"}],
        }
    )


FILE_KINDS = {
    "rule pack": ("pack.yaml", rule_pack),
    "journald monitor": ("journal.json", journald_monitor),
    "filelog monitor": ("kern.json", filelog_monitor),
    "custom plugin": ("plugin.json", custom_plugin),
}


def declaring(type_: str, *, name: str = "declaring") -> type:
    """A Python check class declaring condition ``type_``."""

    class Declaring:
        interval = 60.0
        timeout = 5.0

        def __init__(self, *, name: str, context: CheckContext, options: dict) -> None:
            self.name = name
            self.conditions = (ConditionSpec(type=type_, reason="Fine", message="fine", source=name),)

        def run(self) -> list[CheckResult]:
            return [CheckResult(status=CheckStatus.OK, condition=type_, reason="Fine", message="fine")]

    Declaring.__name__ = name
    return Declaring


# ---- types others own ----------------------------------------------------------------------------


@pytest.mark.parametrize("type_", RESERVED)
@pytest.mark.parametrize("kind", list(FILE_KINDS))
def test_a_file_declaring_a_type_others_own_is_refused_naming_file_field_and_line(tmp_path, kind, type_):
    name, text = FILE_KINDS[kind]
    path = write(tmp_path / name, text(type_))
    with pytest.raises(ConfigError) as err:
        load_agent_config([path], entry_points=list)
    [problem] = [p for p in err.value.problems if "reserved" in p.message]
    assert (problem.file, problem.field) == (str(path), "conditions[0].type")
    assert problem.line == (3 if kind == "rule pack" else 1)
    assert f"condition type {type_!r} is reserved: it belongs to {RESERVED_CONDITION_TYPES[type_]}" in problem.message


@pytest.mark.parametrize("type_", RESERVED)
def test_a_python_check_declaring_a_type_others_own_is_a_configuration_error(type_):
    decl = CheckDecl(name="mine", entry_point="mine", file="/etc/nha/checks.yaml", path=("checks", 0), line=2)
    eps = [FakeEntryPoint("mine", "pkg:Declaring", declaring(type_))]
    checks, problems = build_checks([decl], context=CheckContext(), entry_points=lambda: eps)
    assert checks == []
    assert [(p.file, p.field, p.line) for p in problems] == [("/etc/nha/checks.yaml", "checks[0].use", 2)]
    assert f"check mine ({decl.origin}) declares a condition it may not own" in problems[0].message
    assert f"condition type {type_!r} is reserved" in problems[0].message


@pytest.mark.parametrize("command", ["validate-config", "check"])
def test_commands_exit_2_on_a_reserved_type(tmp_path, capsys, command):
    path = write(tmp_path / "ready.yaml", rule_pack("Ready"))
    args = [command, str(path)] if command == "validate-config" else [command, "--config", str(path)]
    assert main([*args, "--pack", "kernel"]) == 2
    assert f"{path}:3: conditions[0].type: condition type 'Ready' is reserved" in capsys.readouterr().err


def test_run_exits_2_before_touching_the_cluster(tmp_path, capsys):
    from kubeapi import KubeApiServer

    server = KubeApiServer()
    server.start()
    try:
        path = write(tmp_path / "ready.yaml", rule_pack("Ready"))
        code = main(
            ["run", "--kubeconfig", str(server.write_kubeconfig(tmp_path / "kubeconfig")), "--node-name", "n1"]
            + ["--config", str(path), "--pack", "kernel", "--state-dir", str(tmp_path / "state"), "--listen", "0"]
        )
        assert code == 2
        assert server.requests.count() == 0, "nothing reached the API server"
    finally:
        server.stop()
    assert "condition type 'Ready' is reserved" in capsys.readouterr().err


@pytest.mark.parametrize("type_", ["Ready", "DiskPressure", "StorageReady"])
def test_delete_condition_never_names_a_type_others_own(tmp_path, capsys, type_):
    code = main(["run", "--standalone", "--delete-condition", type_, "--state-dir", str(tmp_path), "--listen", "0"])
    assert code == 2
    assert f"--delete-condition / NHA_DELETE_CONDITIONS: condition type {type_!r} is reserved" in (
        capsys.readouterr().err
    )


# ---- one owner per type ----------------------------------------------------------------------------


def built_in_plus(tmp_path: Path, *files: Path, entry_points: list | None = None) -> list:
    """Load the kernel and Neuron packs plus ``files``; build the checks (and so check ownership)."""
    eps = entry_points or []
    config = load_agent_config(
        [*rule_dirs(plugins_dirs=None, packs=["kernel", "neuron"]), *files], entry_points=lambda: eps
    )
    return build_scheduled_checks(config, context=CheckContext(state_dir=tmp_path), entry_points=lambda: eps)


@pytest.mark.parametrize(
    ("name", "text", "owner"),
    [
        ("plugin.json", custom_plugin("NeuronHealth"), "custom plugin file"),
        ("journal.json", journald_monitor("NeuronHealth"), "system-log-monitor (journald)"),
        ("kern.json", filelog_monitor("NeuronHealth"), "system-log-monitor (filelog)"),
    ],
)
def test_a_second_owner_of_a_condition_is_refused_naming_both(tmp_path, name, text, owner):
    path = write(tmp_path / "extra" / name, text)
    with pytest.raises(ConfigError) as err:
        built_in_plus(tmp_path, path)
    [problem] = err.value.problems
    assert problem.file == str(path) and problem.line == 1
    assert f"condition type 'NeuronHealth' is declared by {owner}" in problem.message
    assert "and by the kernel log rule packs (" in problem.message and "neuron-monitor.yaml:" in problem.message


def test_a_python_check_owning_a_kernel_condition_is_refused(tmp_path):
    eps = [FakeEntryPoint("healer", "pkg:Healer", declaring("NeuronHealth", name="Healer"))]
    with pytest.raises(ConfigError) as err:
        built_in_plus(tmp_path, entry_points=eps)
    [problem] = err.value.problems
    assert "condition type 'NeuronHealth' is declared by check healer (entry point healer = pkg:Healer" in str(problem)
    assert "and by the kernel log rule packs" in problem.message


def test_two_checks_owning_one_type_are_refused(tmp_path):
    eps = [FakeEntryPoint(n, f"pkg:{n}", declaring("MyThing")) for n in ("first", "second")]
    with pytest.raises(ConfigError, match="'MyThing' is declared by check second .* and by check first"):
        built_in_plus(tmp_path, entry_points=eps)


def test_rule_packs_share_a_type_they_are_one_source(tmp_path):
    """Packs merge into one kernel log rule set (a later pack overrides): not a clash."""
    extra = write(tmp_path / "more.yaml", rule_pack("NeuronHealth"))
    checks = built_in_plus(tmp_path, extra)
    config = load_agent_config([*rule_dirs(plugins_dirs=None, packs=["kernel", "neuron"]), extra], entry_points=list)
    owned = {s.type: s.provenance for s in owned_conditions(config, checks)}
    assert owned["NeuronHealth"] is Provenance.KERNEL_LOG


def test_every_owner_kind_gets_its_provenance(tmp_path):
    files = [
        write(tmp_path / "extra" / "journal.json", journald_monitor("JournalThing")),
        write(tmp_path / "extra" / "plugin.json", custom_plugin("PluginThing")),
    ]
    eps = [FakeEntryPoint("third", "pkg:Third", declaring("ThirdPartyThing"))]
    config = load_agent_config([*rule_dirs(plugins_dirs=None, packs=None), *files], entry_points=lambda: eps)
    checks = build_scheduled_checks(config, context=CheckContext(state_dir=tmp_path), entry_points=lambda: eps)
    owned = {s.type: s.provenance for s in owned_conditions(config, checks)}
    assert owned["JournalThing"] is Provenance.LOG_MONITOR
    assert owned["PluginThing"] is Provenance.CUSTOM_PLUGIN
    assert owned["ThirdPartyThing"] is Provenance.CHECK
    # The built-in configuration's owners are the ones the recovery policy trusts by default.
    # (ScheduledMaintenance is the agent's own check, on with a flag: tests/checks/test_maintenance.py.)
    expected = {t: p for t, p in BUILTIN_CONDITIONS.items() if t != "ScheduledMaintenance"}
    assert {t: p for t, p in owned.items() if t in BUILTIN_CONDITIONS} == expected


def test_a_reload_introducing_a_second_owner_is_rejected_and_the_last_good_configuration_kept(tmp_path):
    from agent.app.reload import ConfigWatcher
    from agent.core.bus import Inbox

    extra = tmp_path / "extra"
    write(extra / "mine.json", custom_plugin("MyThing"))
    paths = [*rule_dirs(plugins_dirs=None, packs=["kernel", "neuron"]), extra]
    context = CheckContext(state_dir=tmp_path)
    loaded = load_configuration(paths, context=context, entry_points=list)
    inbox = Inbox()
    watcher = ConfigWatcher(
        paths=paths, current=loaded, context=context, scheduler=None, inbox=inbox, entry_points=list
    )
    write(extra / "mine.json", custom_plugin("NeuronHealth"))
    assert watcher.reload() is False
    assert inbox.get(timeout=0) is None and watcher.failures == 1
    assert "condition type 'NeuronHealth' is declared by custom plugin file" in (watcher.last_error or "")


# ---- recovery trusts owners -----------------------------------------------------------------------

NOW = 1_800_000_000.0
NODE = NodeView(name="n1", unschedulable=False, uid="uid-1")


def problem_owned_by(owner: Provenance | None) -> Snapshot:
    condition = Condition(
        type="NeuronHealth",
        status=Status.TRUE,
        reason="NeuronHasError_DMA_ERROR",
        message="DMA error",
        last_transition=NOW - 600,
        last_update=NOW,
    )
    provenance = {} if owner is None else {"NeuronHealth": owner}
    return Snapshot(conditions=(condition,), generated_at=NOW, provenance=provenance)


@pytest.mark.parametrize(
    ("owner", "acts"),
    [
        (Provenance.KERNEL_LOG, True),
        (Provenance.BUILTIN_CHECK, True),
        (Provenance.CHECK, False),  # a third-party plugin raising NeuronHealth where the pack is not loaded
        (Provenance.CUSTOM_PLUGIN, False),
        (Provenance.LOG_MONITOR, False),  # a journal any local user can write to
        (None, False),  # an owner not known is not trusted
    ],
)
def test_the_default_policy_acts_only_on_problems_its_trusted_owners_raise(owner, acts):
    snapshot = problem_owned_by(owner)
    decision = decide(
        snapshot=snapshot,
        node=NODE,
        incident=None,
        policy=DEFAULT_POLICY,
        now=NOW,
        started_at=NOW - 3600,
        budget=None,
        enabled=False,
    )
    assert bool(decision.actions) is acts and (decision.incident is not None) is acts
    assert bool(untrusted(snapshot, DEFAULT_POLICY)) is not acts
