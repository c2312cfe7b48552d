"""Checks end to end: the example third-party package installed and run, check verdicts reaching the
node's conditions through the one main loop, and the CLI's ``check`` / ``plugins`` commands."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from importlib import metadata
from pathlib import Path

import pytest

from agent.app.assembly import build_runtime
from agent.app.cli import main
from agent.app.config import load_rule_set
from agent.app.settings import Settings
from agent.checks.declared import CheckDecl
from agent.checks.loader import build_checks
from agent.checks.model import ENTRY_POINT_GROUP, CheckContext, CheckResult, CheckStatus, ScheduledCheck, Value
from agent.core.paths import builtin_plugins_dir
from agent.core.types import ConditionSpec, Status
from agent.sources.kmsg.stats import KmsgStats

import helpers
from helpers import REPO

pytestmark = pytest.mark.slow  # installs the example package and starts agent processes

ROOT = REPO
EXAMPLE = ROOT / "plugins" / "examples" / "kernel-tainted"


@pytest.fixture(scope="module")
def example_site(tmp_path_factory) -> Path:
    """The example package built and installed (offline) into its own site directory."""
    work = tmp_path_factory.mktemp("example")
    src = work / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = work / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return site


def agent_cli(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "agent", *args], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_installed_example_is_found_by_its_entry_point_and_configured_like_any_check(example_site, tmp_path):
    proc_root = tmp_path / "proc"
    (proc_root / "sys" / "kernel").mkdir(parents=True)
    (proc_root / "sys" / "kernel" / "tainted").write_text("128\n")  # D: the kernel oopsed
    config = tmp_path / "checks.yaml"
    config.write_text(f"checks:\n  - name: kernel-tainted\n    options: {{procRoot: {proc_root}}}\n")
    done = agent_cli(example_site, "check", "--json", "--config", str(config), "--pack", "kernel", "kernel-tainted")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {
            "check": "kernel-tainted",
            "status": "PROBLEM",
            "condition": "KernelTainted",
            "reason": "KernelTaintedByFault",
            "message": "taint mask 128: D (kernel died recently (oops or BUG))",
        }
    ]
    listed = agent_cli(example_site, "plugins", "--pack", "kernel")
    assert "kernel-tainted: kernel-tainted (entry point kernel-tainted = nha_kernel_tainted:KernelTaintedCheck " in (
        listed.stdout
    )
    assert "(nha-kernel-tainted 1.0.0)" in listed.stdout


def test_the_example_packages_own_tests_pass_against_this_agent(example_site):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(example_site), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=EXAMPLE,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("cwd", "args"),
    [
        pytest.param(ROOT, [str(EXAMPLE.relative_to(ROOT))], id="from-the-repository-root"),
        pytest.param(EXAMPLE, [], id="in-the-example-directory"),
    ],
)
def test_the_example_packages_tests_pass_without_installing_it(cwd, args):
    """As a fresh clone runs them (README of the example): the package is not installed anywhere."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout


def test_bad_options_of_a_configured_check_exit_2_naming_file_field_and_line(example_site, tmp_path):
    config = tmp_path / "checks.yaml"
    config.write_text("checks:\n  - name: kernel-tainted\n    options: {problemBits: [Q]}\n")
    done = agent_cli(example_site, "check", "--config", str(config), "--pack", "kernel")
    assert done.returncode == 2
    assert f"{config}:3: checks[0].options.problemBits: must be a list of taint letters" in done.stderr


def test_check_names_that_do_not_exist_exit_2(tmp_path, capsys):
    assert main(["check", "--pack", "kernel", "--state-dir", str(tmp_path), "no-such-check"]) == 2
    assert "no check named 'no-such-check'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("exit_code", "expected"),
    [
        pytest.param(0, [("OK", None, None), ("OK", "NTPProblem", "NTPIsUp")], id="ok-shows-no-problem-reason"),
        pytest.param(1, [("PROBLEM", None, "NTPIsDown"), ("PROBLEM", "NTPProblem", "NTPIsDown")], id="problem"),
    ],
)
def test_check_shows_a_problem_reason_only_on_a_problem_row(tmp_path, capsys, exit_code, expected):
    """node-problem-detector's temporary rule has no healthy reason: an OK run showed the problem's."""
    script = tmp_path / "check_ntp.sh"
    script.write_text(f"#!/bin/sh\necho ntp says {exit_code}\nexit {exit_code}\n")
    script.chmod(0o755)
    plugin = tmp_path / "custom-plugin-monitor.json"
    rule = {"reason": "NTPIsDown", "path": str(script), "timeout": "3s"}
    plugin.write_text(
        json.dumps(
            {
                "plugin": "custom",
                "source": "ntp-custom-plugin-monitor",
                "conditions": [{"type": "NTPProblem", "reason": "NTPIsUp", "message": "ntp service is up"}],
                "rules": [{"type": "temporary", **rule}, {"type": "permanent", "condition": "NTPProblem", **rule}],
            }
        )
    )
    argv = ["check", "--pack", "kernel", "--state-dir", str(tmp_path), "--config", str(plugin)]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["status"], r["condition"], r["reason"]) for r in rows] == expected
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()[1:]
    for line in table:
        assert ("NTPIsDown" in line) == line.split()[1].startswith("PROBLEM"), line


def test_a_system_stats_config_is_refused_in_one_line(tmp_path, capsys):
    stats = tmp_path / "system-stats-monitor.json"
    stats.write_text('{"cpu": {"metricsConfigs": {}}, "invokeInterval": "60s"}')
    assert main(["validate-config", "--pack", "kernel", str(stats)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "configuration error (1 problem):"
    assert "system-stats-monitor config, which node-health-agent does not run" in err[1]


# ---- verdicts reach the node's conditions through the main loop -----------------------------------------


class Idle:
    """A kernel log source with nothing to say (our own seam)."""

    def __init__(self) -> None:
        self.stats = KmsgStats()

    def chunks(self, *, stop: threading.Event):
        while not stop.wait(0.02):
            self.stats.last_activity = time.monotonic()
        return
        yield

    @staticmethod
    def decode(chunk):
        return chunk


class Scripted:
    """A check that says, run by run, what the test tells it; then repeats the last verdict."""

    interval = 0.01
    timeout = 5.0

    def __init__(self, verdicts: list[CheckStatus]) -> None:
        self.name = "scripted"
        self.conditions = (ConditionSpec(type="GpuEcc", reason="GpuEccGood", message="ok", source="scripted"),)
        self._verdicts = verdicts
        self.runs = 0

    def run(self):
        status = self._verdicts[min(self.runs, len(self._verdicts) - 1)]
        self.runs += 1
        reason = {CheckStatus.OK: "GpuEccGood", CheckStatus.PROBLEM: "GpuRowRemapPending"}.get(status, "CheckFailed")
        return [CheckResult(status=status, condition="GpuEcc", reason=reason, message=f"run {self.runs}")]


def settings(tmp_path: Path) -> Settings:
    return Settings(
        standalone=True,
        config_files=(),
        plugins_dirs=(builtin_plugins_dir() / "kernel",),
        kmsg_path=tmp_path / "unused",
        kmsg_relay=None,
        listen=None,
        state_dir=tmp_path / "state",
        lookback=300.0,
        stall_timeout=60.0,
    )


def wait_for(feed, predicate, *, timeout: float = 30.0):
    """The first publication that satisfies ``predicate`` (readiness, not a wall-clock assertion)."""
    deadline = time.monotonic() + timeout
    number = 0
    while time.monotonic() < deadline:
        pub = feed.wait_newer(number, timeout=0.5)
        if pub is None:
            continue
        number = pub.number
        if predicate(pub.snapshot):
            return pub.snapshot
    raise AssertionError("condition never reached")


def test_check_verdicts_set_and_heal_a_condition_through_the_main_loop(tmp_path):
    s = settings(tmp_path)
    check = Scripted([CheckStatus.PROBLEM, CheckStatus.UNKNOWN, CheckStatus.OK, CheckStatus.OK, CheckStatus.OK])
    out = io.StringIO()
    runtime = build_runtime(
        settings=s,
        rule_set=load_rule_set(list(s.rule_paths)),
        source=Idle(),
        stream=out,
        checks=[ScheduledCheck(check=check, interval=0.01, timeout=5, kind="python", origin="test", jitter=0)],
    )
    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,))
    thread.start()
    try:
        sick = wait_for(runtime.feed, lambda snap: snap.condition("GpuEcc").status is Status.TRUE)
        assert sick.condition("GpuEcc").reason == "GpuRowRemapPending"
        healed = wait_for(runtime.feed, lambda snap: snap.condition("GpuEcc").status is Status.FALSE)
        assert healed.condition("GpuEcc").reason == "GpuEccGood"
        assert check.runs >= 5  # False only after three OKs in a row
        metrics = runtime.registry.get_sample_value(
            "node_health_agent_check_runs_total", {"check": "scripted", "outcome": "UNKNOWN"}
        )
        assert metrics == 1.0
    finally:
        stop.set()
        thread.join(10)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["condition"], e["status"]) for e in lines if e.get("condition") == "GpuEcc"] == [
        ("GpuEcc", "True"),
        ("GpuEcc", "False"),
    ]


def test_on_a_machine_without_accelerators_no_check_says_problem(tmp_path, capsys):
    """The real /sys, /dev and PATH of the test machine (no GPU, Neuron device or RDMA here)."""
    assert main(["check", "--json", "--state-dir", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"gpu-count", "gpu-ecc", "gpu-nvlink", "neuron-devices", "ib-ports"} <= {r["check"] for r in rows}
    assert [r for r in rows if r["status"] == "PROBLEM"] == []
    for row in rows:
        assert set(row) == {"check", "status", "condition", "reason", "message"}
        assert row["message"], row


def test_validate_config_refuses_bad_check_options_as_run_does(tmp_path, capsys):
    checks = tmp_path / "checks.yaml"
    checks.write_text("checks:\n  - name: ib-ports\n    options: {expectedPorts: eight}\n")
    assert main(["validate-config", "--pack", "kernel,rdma", str(checks)]) == 2
    err = capsys.readouterr().err
    assert f"{checks}:3: checks[0].options.expectedPorts:" in err


# ---- plugins that misbehave -------------------------------------------------------------------------------


class Garbage:
    """A check whose results are malformed in a way that used to stop the scheduler or the main loop."""

    interval = 0.01
    timeout = 5.0

    def __init__(self, name: str, **fields: object) -> None:
        self.name = name
        self.conditions = (ConditionSpec(type="Junk", reason="JunkOk", message="ok", source=name),)
        self.fields = fields
        self.runs = 0

    def run(self):
        self.runs += 1
        good = {"status": CheckStatus.PROBLEM, "condition": "Junk", "reason": "JunkBad", "message": "m"}
        return [CheckResult(**{**good, **self.fields})]


def test_malformed_results_are_unknown_and_the_agent_stays_healthy(tmp_path):
    s = settings(tmp_path)
    none_message = Garbage("none-message", message=None)  # killed the scheduler (len(None))
    loud = Garbage("loud", severity="loud")  # killed the main loop (the judge ranks severities)
    nan = Garbage("nan", values=(Value(name="x", value=float("nan")),))
    scripted = Scripted([CheckStatus.PROBLEM])
    runtime = build_runtime(
        settings=s,
        rule_set=load_rule_set(list(s.rule_paths)),
        source=Idle(),
        stream=io.StringIO(),
        checks=[
            ScheduledCheck(check=c, interval=0.01, timeout=5, kind="python", origin="test", jitter=0)
            for c in (none_message, loud, nan, scripted)
        ],
    )
    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,))
    thread.start()
    try:
        wait_for(runtime.feed, lambda snap: snap.condition("GpuEcc").status is Status.TRUE)
        helpers.wait_for(lambda: min(c.runs for c in (none_message, loud, nan)) >= 3 and scripted.runs >= 3)
        ok, doc = runtime.health_document()
        assert ok and all(doc["components"].values()), doc
        for name in ("none-message", "loud", "nan"):
            invalid = runtime.registry.get_sample_value(
                "node_health_agent_check_errors_total", {"check": name, "error": "invalid"}
            )
            assert invalid >= 1, name
        snap = runtime.feed.latest().snapshot
        assert snap.condition("Junk").status is Status.FALSE  # UNKNOWN changed nothing
    finally:
        stop.set()
        thread.join(10)


def fake_distribution(site: Path, *, module: str, source: str) -> None:
    """A plugin package as pip leaves it: the module and its ``.dist-info`` with the entry point."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[node_health_agent.checks]\n{module} = {module}:Check\n")


def test_a_plugin_calling_sys_exit_at_import_is_reported_and_the_agent_runs(tmp_path, monkeypatch):
    site = tmp_path / "site"
    fake_distribution(site, module="exits_at_import", source="import sys\nsys.exit(7)\n")
    config = tmp_path / "empty.yaml"
    config.write_text("checks: []\n")
    named = "check exits_at_import (entry point exits_at_import = exits_at_import:Check (exits_at_import 1.0))"

    validated = agent_cli(site, "validate-config", "--pack", "kernel", str(config))
    assert validated.returncode == 0, validated.stderr  # it was 7, with no log line
    assert f"{named} cannot be loaded: SystemExit: 7" in validated.stderr

    checked = agent_cli(site, "check", "--json", "--pack", "kernel", "exits_at_import")
    assert checked.returncode == 0, checked.stderr
    [row] = json.loads(checked.stdout)
    assert (row["status"], row["reason"]) == ("UNKNOWN", "CheckLoadFailed")
    assert row["message"] == "cannot load check exits_at_import: SystemExit: 7"

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "pack.yaml").write_text("rules: []\n")
    proc, base = helpers.start_standalone_agent(tmp_path, plugins=plugins)
    try:
        helpers.wait_for(lambda: helpers.http_get(f"{base}/healthz")[0] == 200, timeout=60)  # old code: exit 7
        helpers.wait_for(
            lambda: (
                'node_health_agent_check_status{check="exits_at_import",status="UNKNOWN"} 1.0'
                in helpers.http_get(f"{base}/metrics")[1]
            ),
            timeout=30,
        )
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert f"{named} cannot be loaded: SystemExit: 7" in err


def test_an_import_that_hangs_is_abandoned_and_other_plugins_still_load(tmp_path, monkeypatch):
    """The import lock: a thread stuck importing ``hangs_at_import`` holds that module's lock. A second
    check from the same module is not tried again (it would wait on the lock); other modules import."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "nha_gate.py").write_text("import threading\nOPEN = threading.Event()\n")
    check_class = """
        from agent.checks.model import CheckResult, CheckStatus

        class Check:
            interval, timeout, conditions = 60.0, 5.0, ()

            def __init__(self, *, name, context, options):
                self.name = name

            def run(self):
                return [CheckResult(status=CheckStatus.OK, condition=None, reason="Fine", message="fine")]
        """
    (site / "hangs_at_import.py").write_text("import nha_gate\nnha_gate.OPEN.wait(60)\n" + textwrap.dedent(check_class))
    (site / "imports_fine.py").write_text(textwrap.dedent(check_class))
    monkeypatch.syspath_prepend(str(site))
    import nha_gate

    def ep(name: str, value: str) -> metadata.EntryPoint:
        return metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)

    eps = [
        ep("first", "hangs_at_import:Check"),
        ep("second", "hangs_at_import:Check"),
        ep("fine", "imports_fine:Check"),
    ]
    decls = [CheckDecl(name=e.name, entry_point=e.name, origin=f"entry point {e.name}") for e in eps]
    try:
        checks, problems = build_checks(decls, context=CheckContext(), entry_points=lambda: eps, load_timeout=2.0)
        assert problems == []
        messages = {c.name: c.check.run()[0].message for c in checks}
        assert messages == {
            "first": "cannot load check first: importing hangs_at_import did not finish within 2s "
            "(abandoned; it may still hang)",
            "second": "cannot load check second: the import of hangs_at_import hung (loading check first); "
            "not tried again",
            "fine": "fine",
        }
        assert any(t.name == "load:first" and t.daemon for t in threading.enumerate())  # abandoned, not waited for
    finally:
        nha_gate.OPEN.set()
        for name in ("nha_gate", "hangs_at_import", "imports_fine"):
            sys.modules.pop(name, None)


def test_a_missing_plugin_executable_is_logged_once_and_shown_in_healthz_until_it_appears(tmp_path, caplog):
    from agent.checks.executable import ExecutableCheck, Verdict

    s = settings(tmp_path)
    plugin = tmp_path / "check_gpu.sh"
    check = ExecutableCheck(
        name="gpu-plugin",
        argv=[str(plugin)],
        interval=0.01,
        timeout=5.0,
        verdicts=[Verdict(condition=None, problem_reason="GpuBad", ok_reason="GpuGood")],
    )
    runtime = build_runtime(
        settings=s,
        rule_set=load_rule_set(list(s.rule_paths)),
        source=Idle(),
        stream=io.StringIO(),
        checks=[ScheduledCheck(check=check, interval=0.01, timeout=5, kind="executable", origin="test", jitter=0)],
    )

    def runs(outcome: str) -> float:
        return runtime.registry.get_sample_value(
            "node_health_agent_check_runs_total", {"check": "gpu-plugin", "outcome": outcome}
        )

    def cannot_run() -> float:
        return runtime.registry.get_sample_value("node_health_agent_check_cannot_run", {"check": "gpu-plugin"})

    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,))
    caplog.set_level("INFO", logger="agent.checks.scheduler")
    thread.start()
    try:
        helpers.wait_for(lambda: runs("UNKNOWN") >= 5)
        ok, doc = runtime.health_document()
        assert ok  # the agent is fine; it says which plugin cannot run
        assert doc["details"]["check_scheduler"] == "1 check cannot run: gpu-plugin: check_gpu.sh: no such file"
        assert cannot_run() == 1.0
        said = [r.getMessage() for r in caplog.records if "cannot run" in r.getMessage()]
        assert said == [
            "check gpu-plugin cannot run: check_gpu.sh: no such file (logged once; /healthz details show it until "
            "it runs)"
        ]
        plugin.write_text("#!/bin/sh\necho fine\n")
        plugin.chmod(0o755)
        helpers.wait_for(lambda: runs("OK") >= 1)
        assert "check_scheduler" not in runtime.health_document()[1].get("details", {})
        assert cannot_run() == 0.0
        assert "check gpu-plugin runs again" in [r.getMessage() for r in caplog.records]
    finally:
        stop.set()
        thread.join(10)
