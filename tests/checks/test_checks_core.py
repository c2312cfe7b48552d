"""The check core: declarations, loading, the judge's thresholds and the scheduler's safety rules."""

from __future__ import annotations

import logging
import random
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.checks.declared import CheckDecl, merge, read_checks
from agent.checks.judge import CheckJudge
from agent.checks.loader import BrokenCheck, build_checks
from agent.checks.model import (
    CheckConfigError,
    CheckContext,
    CheckReport,
    CheckResult,
    CheckStatus,
    ScheduledCheck,
    Value,
)
from agent.checks.scheduler import CheckScheduler
from agent.core.bus import Inbox
from agent.core.configdoc import Problems, read_pack
from agent.core.configfiles import Kind, classify, read_config_files
from agent.core.types import ConditionSpec, RuleType, Severity, Status

from helpers import FakeEntryPoint, wait_for

OK, PROBLEM, UNKNOWN = CheckStatus.OK, CheckStatus.PROBLEM, CheckStatus.UNKNOWN


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# ---- which kind of file is it ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("k.json", '{"plugin": "kmsg", "rules": []}', Kind.RULE_PACK),
        ("k.yaml", "rules: []\n", Kind.RULE_PACK),
        ("f.json", '{"plugin": "filelog", "logPath": "/var/log/kern.log", "rules": []}', Kind.LOG_FILE),
        ("j.json", '{"plugin": "journald", "pluginConfig": {"source": "dockerd"}, "rules": []}', Kind.JOURNAL),
        ("c.json", '{"plugin": "custom", "pluginConfig": {}, "rules": []}', Kind.CUSTOM_PLUGIN),
        ("checks.yaml", "checks: []\n", Kind.CHECKS),
        (
            "s.json",
            '{"cpu": {"metricsConfigs": {}}, "invokeInterval": "60s"}',
            "is a node-problem-detector system-stats-monitor config, which node-health-agent does not run",
        ),
        ("p.yaml", "plugin: syslog\nrules: []\n", "plugin 'syslog' is not one node-health-agent runs"),
        ("l.yaml", "- a\n- b\n", "expected a mapping"),
    ],
    ids=["kmsg", "no-plugin", "filelog", "journald", "custom", "checks", "system-stats", "unknown-plugin", "list"],
)
def test_every_file_is_sorted_by_kind_or_refused_in_one_line(tmp_path, name, text, expected):
    path = write(tmp_path, name, text)
    doc, problems = read_pack(path)
    assert problems == [] and doc is not None
    kind = classify(path, doc)
    if isinstance(expected, Kind):
        assert kind is expected
    else:
        assert expected in kind.message and kind.file == str(path)


def test_a_system_stats_file_gives_exactly_one_problem(tmp_path):
    write(tmp_path, "system-stats-monitor.json", '{"disk": {"includeAllAttachedBlk": true}, "invokeInterval": "60s"}')
    write(tmp_path, "kernel.yaml", "rules: []\n")
    files, problems = read_config_files([tmp_path])
    assert [f.kind for f in files] == [Kind.RULE_PACK]
    assert len(problems) == 1 and "system-stats-monitor" in problems[0].message


# ---- declarations ----------------------------------------------------------------------------------


def declarations(tmp: Path, *texts: str) -> tuple[list[CheckDecl], list]:
    decls, cols = [], []
    for i, text in enumerate(texts):
        path = write(tmp, f"c{i}.yaml", text)
        doc, _ = read_pack(path)
        col = Problems(file=str(path), doc=doc)
        cols.append(col)
        decls.extend((col, p, g) for p, g in read_checks(col))
    merged = merge(decls)
    return merged, [(Path(p.file).name, p.field, p.line, p.message) for c in cols for p in c.problems]


def test_later_declarations_change_only_what_they_give(tmp_path):
    merged, problems = declarations(
        tmp_path,
        """
        checks:
          - name: gpu-count
            use: nvidia.checks:GpuCountCheck
            interval: 60s
            options: {expectedCount: 8, instanceTypes: {}}
        """,
        """
        checks:
          - name: gpu-count
            timeout: 5s
            successThreshold: 2
            options: {expectedCount: 4}
        """,
    )
    assert problems == []
    [decl] = merged
    assert (decl.use, decl.interval, decl.timeout, decl.success_threshold) == ("nvidia.checks:GpuCountCheck", 60, 5, 2)
    assert decl.options == {"expectedCount": 4, "instanceTypes": {}}
    assert decl.origin.endswith("c0.yaml: checks[0]")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("checks: {a: 1}\n", [("checks", 1, "must be a list of check declarations")]),
        ("checks:\n  - name: Bad Name\n    use: a:b\n", [("checks[0].name", 2, "required: a lowercase name")]),
        ("checks:\n  - name: x\n    use: nope\n", [("checks[0].use", 3, "expected '<module>:<factory>'")]),
        ("checks:\n  - name: x\n    use: a:b\n    interval: 0s\n", [("checks[0].interval", 4, "must be more than 0")]),
        ("checks:\n  - name: x\n    use: a:b\n    interval: soon\n", [("checks[0].interval", 4, "invalid duration")]),
        (
            "checks:\n  - name: x\n    use: a:b\n    interval: 1ns\n",
            [("checks[0].interval", 4, "at least 1s, got '1ns'")],
        ),
        (
            "checks:\n  - name: x\n    use: a:b\n    interval: 0.5\n",
            [("checks[0].interval", 4, "at least 1s, got 0.5")],
        ),
        ("checks:\n  - name: x\n    use: a:b\n    interval: .nan\n", [("checks[0].interval", 4, "must be a finite")]),
        (
            "checks:\n  - name: x\n    use: a:b\n    timeout: 10ms\n",
            [("checks[0].timeout", 4, "at least 0.1s, got '10ms'")],
        ),
        ("checks:\n  - name: x\n    use: a:b\n    timeout: .inf\n", [("checks[0].timeout", 4, "must be a finite")]),
        (
            "checks:\n  - name: x\n    use: a:b\n    failureThreshold: 0\n",
            [("checks[0].failureThreshold", 4, "must be an integer from 1 to 1000")],
        ),
        ("checks:\n  - name: x\n    use: a:b\n    colour: red\n", [("checks[0].colour", 4, "unknown key 'colour'")]),
        ("checks:\n  - name: x\n", [("checks[0].name", 2, "no check named 'x' to change")]),
        (
            "checks:\n  - name: x\n    use: a:b\n  - name: x\n    use: a:c\n",
            [("checks[1].name", 4, "duplicate check name 'x'")],
        ),
        ("checks:\n  - name: x\n    use: a:b\n    options: [1]\n", [("checks[0].options", 4, "must be a mapping")]),
    ],
    ids=[
        "not-a-list",
        "bad-name",
        "bad-use",
        "zero-interval",
        "bad-duration",
        "interval-below-floor",
        "interval-number-below-floor",
        "interval-nan",
        "timeout-below-floor",
        "timeout-infinite",
        "zero-threshold",
        "unknown-key",
        "nothing-to-change",
        "duplicate",
        "options-not-mapping",
    ],
)
def test_bad_declarations_name_file_field_and_line(tmp_path, text, expected):
    _, problems = declarations(tmp_path, text)
    assert [(f, line) for _, f, line, _ in problems] == [(f, line) for f, line, _ in expected]
    for (_, _, _, message), (_, _, want) in zip(problems, expected, strict=True):
        assert want in message


# ---- loading -----------------------------------------------------------------------------------------


class Static:
    """A check returning what it was told to."""

    interval = 10.0
    timeout = 2.0

    def __init__(self, *, name, context, options):
        if "bad" in options:
            raise CheckConfigError("bad", "must not be given")
        self.name = name
        self.conditions = (ConditionSpec(type="Thing", reason="ThingOk", message="fine", source=name),)
        self.results = options.get("results", [])

    def run(self):
        return self.results


def test_entry_points_are_loaded_and_broken_ones_run_as_unknown(tmp_path):
    eps = [
        FakeEntryPoint("good", "pkg:Static", Static),
        FakeEntryPoint("missing-module", "gone:X", ModuleNotFoundError("No module named 'gone'")),
        FakeEntryPoint("crashing", "pkg:f", lambda **_: 1 / 0),
        FakeEntryPoint("not-a-check", "pkg:g", lambda **_: object()),
    ]
    decls = [CheckDecl(name=e.name, entry_point=e.name, origin=f"entry point {e.name}") for e in eps]
    checks, problems = build_checks(decls, context=CheckContext(), entry_points=lambda: eps)
    assert problems == []
    assert [(c.name, type(getattr(c.check, "plugin", c.check)).__name__, c.interval, c.kind) for c in checks] == [
        ("good", "Static", 10.0, "entry-point"),
        ("missing-module", "BrokenCheck", 60.0, "entry-point"),
        ("crashing", "BrokenCheck", 60.0, "entry-point"),
        ("not-a-check", "BrokenCheck", 60.0, "entry-point"),
    ]
    [result] = checks[1].check.run()
    assert result.status is UNKNOWN and "No module named 'gone'" in result.message
    assert "ZeroDivisionError" in checks[2].check.run()[0].message
    assert "no run() method" in checks[3].check.run()[0].message


class Hostile:
    """A check built to misbehave: ``conditions`` raises on the read given by ``raise_on`` (1 = the first)."""

    interval = 10.0
    timeout = 2.0

    def __init__(self, *, name, context, options):
        self.name = name
        self.raise_on = options.get("raise_on", 1)
        self.error = options.get("error", RuntimeError("conditions exploded"))
        self.reads = 0

    @property
    def conditions(self):
        self.reads += 1
        if self.reads >= self.raise_on:
            raise self.error
        return (ConditionSpec(type="Thing", reason="ThingOk", message="fine", source=self.name),)

    def run(self):
        return [CheckResult(status=OK, condition="Thing", reason="ThingOk", message="fine")]


def _exits(**_):
    raise SystemExit(7)


def _interrupts(**_):
    raise KeyboardInterrupt


def _hangs_until(gate: threading.Event) -> Callable[..., object]:
    def factory(**_):
        gate.wait(60)
        return Static(name="late", context=None, options={})

    return factory


def _not_a_number(**kw):
    check = Static(**kw)
    check.interval = float("nan")
    check.timeout = "soon"
    return check


def test_a_plugin_that_exits_raises_anything_or_hangs_loading_is_a_broken_check_naming_it():
    gate = threading.Event()
    eps = [
        FakeEntryPoint("exits-on-import", "pkg.a:X", SystemExit(7)),
        FakeEntryPoint("interrupts-on-import", "pkg.b:X", KeyboardInterrupt()),
        FakeEntryPoint("generator-exit", "pkg.c:X", GeneratorExit()),
        FakeEntryPoint("factory-exits", "pkg.d:X", _exits),
        FakeEntryPoint("factory-interrupts", "pkg.e:X", _interrupts),
        FakeEntryPoint("factory-hangs", "pkg.f:X", _hangs_until(gate)),
        FakeEntryPoint("conditions-raise", "pkg.g:X", Hostile),
        FakeEntryPoint(
            "conditions-exit", "pkg.h:X", lambda **kw: Hostile(**{**kw, "options": {"error": SystemExit(3)}})
        ),
        FakeEntryPoint("not-callable", "pkg.i:X", "a string"),
        FakeEntryPoint("good", "pkg.j:X", Static),
    ]
    decls = [CheckDecl(name=e.name, entry_point=e.name, origin=f"entry point {e.name}") for e in eps]
    try:
        checks, problems = build_checks(decls, context=CheckContext(), entry_points=lambda: eps, load_timeout=0.5)
    finally:
        gate.set()
    assert problems == []
    messages = {c.name: c.check.run()[0].message for c in checks if isinstance(c.check, BrokenCheck)}
    assert messages == {
        "exits-on-import": "cannot load check exits-on-import: SystemExit: 7",
        "interrupts-on-import": "cannot load check interrupts-on-import: KeyboardInterrupt",
        "generator-exit": "cannot load check generator-exit: GeneratorExit",
        "factory-exits": "cannot load check factory-exits: SystemExit: 7",
        "factory-interrupts": "cannot load check factory-interrupts: KeyboardInterrupt",
        "factory-hangs": "cannot load check factory-hangs: its factory did not return within 0.5s "
        "(abandoned; it may still hang)",
        "conditions-raise": "cannot load check conditions-raise: reading its 'conditions' raised "
        "RuntimeError: conditions exploded",
        "conditions-exit": "cannot load check conditions-exit: reading its 'conditions' raised SystemExit: 3",
        "not-callable": "cannot load check not-callable: its factory is a str, which cannot be called",
    }
    assert [c.name for c in checks if not isinstance(c.check, BrokenCheck)] == ["good"]


def test_what_a_check_says_about_itself_is_read_once_at_load():
    """A ``conditions`` property that works once and raises afterwards (or an interval that is not a
    number) never reaches the scheduler, the judge or the watcher: they use what was read at load."""
    ep = FakeEntryPoint("flaky", "pkg:Hostile", lambda **kw: Hostile(**{**kw, "options": {"raise_on": 2}}))
    nan = FakeEntryPoint("nan", "pkg:Static", _not_a_number)
    checks, problems = build_checks(
        [CheckDecl(name="flaky", entry_point="flaky"), CheckDecl(name="nan", entry_point="nan")],
        context=CheckContext(),
        entry_points=lambda: [ep, nan],
    )
    assert problems == []
    [flaky, odd] = checks
    assert [c.type for c in flaky.check.conditions] == ["Thing"] and flaky.check.plugin.reads == 1
    assert (odd.interval, odd.timeout) == (60.0, 30.0)  # the defaults: NaN and "soon" are no durations
    s, manual = scheduler_of(checks)
    s.step(0.0)
    manual.finish_all()
    reports = s.step(1.0)[0]
    assert [(r.check, [x.status for x in r.results]) for r in reports] == [("flaky", [OK]), ("nan", [])]
    assert {spec.type for c in checks for spec in c.check.conditions} == {"Thing"}  # as the assembly reads them
    assert flaky.check.plugin.reads == 1


def own_timing(interval: object, timeout: object) -> type:
    """A Static check class that asks for its own interval and timeout."""
    return type("OwnTiming", (Static,), {"interval": interval, "timeout": timeout})


@pytest.mark.parametrize(
    ("interval", "timeout", "given", "expected", "warned"),
    [
        (1e-9, 1e-9, {}, (1.0, 0.1), ["interval 1e-09s, less than 1s", "timeout 1e-09s, less than 0.1s"]),
        (0.5, 0.05, {}, (1.0, 0.1), ["interval 0.5s, less than 1s", "timeout 0.05s, less than 0.1s"]),
        (float("nan"), float("inf"), {}, (60.0, 30.0), []),  # not a usable number: the defaults
        (1.0, 0.1, {}, (1.0, 0.1), []),  # at the floor
        (1e-9, 1e-9, {"interval": 30.0, "timeout": 5.0}, (30.0, 5.0), []),  # a declaration overrides the class
    ],
    ids=["nanoseconds", "below-floor", "not-finite", "at-floor", "declared"],
)
def test_a_check_class_cannot_ask_for_less_than_the_floor(caplog, interval, timeout, given, expected, warned):
    """Issue 13 #12: a plugin's ``interval = 1e-9`` ran 85,000 times in 15 s; it is raised to the floor."""
    ep = FakeEntryPoint("fast", "pkg:OwnTiming", own_timing(interval, timeout))
    decl = CheckDecl(name="fast", entry_point="fast", origin="entry point fast", **given)
    with caplog.at_level(logging.WARNING, logger="agent.checks.loader"):
        [check], problems = build_checks([decl], context=CheckContext(), entry_points=lambda: [ep])
    assert problems == [] and (check.interval, check.timeout) == expected
    assert [r.getMessage() for r in caplog.records] == [
        f"check fast asks for {w}: it runs with {w.split()[-1]}" for w in warned
    ]


def test_bad_options_are_configuration_errors_with_file_field_and_line(tmp_path):
    decl = CheckDecl(
        name="x", entry_point="x", options={"bad": 1}, file="/etc/c.yaml", path=("checks", 2), line=7, origin="o"
    )
    _, problems = build_checks(
        [decl], context=CheckContext(), entry_points=lambda: [FakeEntryPoint("x", "pkg:Static", Static)]
    )
    assert [(p.file, p.field, p.line, p.message) for p in problems] == [
        ("/etc/c.yaml", "checks[2].options.bad", 7, "must not be given")
    ]


def test_a_disabled_check_is_not_built():
    decl = CheckDecl(name="x", entry_point="x", enabled=False)
    checks, _ = build_checks([decl], context=CheckContext(), entry_points=lambda: [])
    assert checks == []


def test_a_missing_entry_point_is_a_broken_check_not_a_crash():
    checks, problems = build_checks([CheckDecl(name="x", entry_point="x")], context=CheckContext(), entry_points=list)
    assert problems == [] and isinstance(checks[0].check, BrokenCheck)
    assert "no entry point named 'x'" in checks[0].check.run()[0].message


# ---- the judge ----------------------------------------------------------------------------------------


def result(status: CheckStatus, *, condition: str | None = "GpuEcc", reason: str = "", **kw) -> CheckResult:
    reason = reason or {OK: "GpuEccGood", PROBLEM: "GpuRowRemapPending", UNKNOWN: "CheckFailed"}[status]
    return CheckResult(status=status, condition=condition, reason=reason, message=f"{status} message", **kw)


def report(*results: CheckResult, failure: int = 1, success: int = 3, at: float = 100.0) -> CheckReport:
    return CheckReport(
        check="gpu-ecc",
        results=results,
        finished_at=at,
        duration=0.1,
        failure_threshold=failure,
        success_threshold=success,
    )


@pytest.mark.parametrize(
    ("runs", "failure", "success", "expected"),
    [
        ("P", 1, 3, ["True"]),
        ("PP", 2, 3, [None, "True"]),
        ("PUP", 2, 3, [None, None, "True"]),  # UNKNOWN neither counts nor breaks a streak
        ("POP", 2, 3, [None, None, None]),  # an OK breaks it
        ("POOO", 1, 3, ["True", None, None, "False"]),
        ("POUOO", 1, 3, ["True", None, None, None, "False"]),
        ("POPOOO", 1, 3, ["True", None, "True", None, None, "False"]),
        ("UUUU", 1, 1, [None, None, None, None]),  # UNKNOWN never changes a condition
        ("O", 1, 1, ["False"]),
    ],
)
def test_thresholds_turn_verdict_streaks_into_condition_findings(runs, failure, success, expected):
    judge = CheckJudge()
    got = []
    for run in runs:
        status = {"P": PROBLEM, "O": OK, "U": UNKNOWN}[run]
        findings = judge.judge(report(result(status), failure=failure, success=success))
        got.append(findings[0].status.value if findings else None)
    assert got == expected


def test_worst_result_per_condition_wins_and_problems_are_told_together():
    judge = CheckJudge()
    findings = judge.judge(
        report(
            result(OK),
            result(PROBLEM, reason="GpuRowRemapPending", severity=Severity.ERROR),
            result(PROBLEM, reason="GpuEccUncorrectable", severity=Severity.CRITICAL),
            result(UNKNOWN),
        )
    )
    [f] = findings
    assert (f.reason, f.severity, f.type, f.status) == (
        "GpuEccUncorrectable",
        Severity.CRITICAL,
        RuleType.PERMANENT,
        Status.TRUE,
    )
    assert f.message == "PROBLEM message"  # both had the same text: told once


def test_warnings_are_events_when_they_start_unless_they_repeat():
    judge = CheckJudge()
    warn = result(PROBLEM, condition=None, reason="GpuPcieLinkDegraded", severity=Severity.WARNING)
    repeat = result(PROBLEM, condition=None, reason="PluginBad", repeat_event=True)
    seen = [
        [(f.reason, f.type.value) for f in judge.judge(report(*rs))]
        for rs in ([warn, repeat], [warn, repeat], [], [warn])
    ]
    assert seen == [
        [("GpuPcieLinkDegraded", "temporary"), ("PluginBad", "temporary")],
        [("PluginBad", "temporary")],
        [],
        [("GpuPcieLinkDegraded", "temporary")],
    ]


# ---- the scheduler -------------------------------------------------------------------------------------


class Gate:
    """A check whose runs block until released, counting calls (for overlap and timeout tests)."""

    def __init__(self, name: str, *, results=None, raises: Exception | None = None, returns=None):
        self.name = name
        self.interval = 10.0
        self.timeout = 5.0
        self.conditions = (ConditionSpec(type="Thing", reason="ThingOk", message="fine", source=name),)
        self.calls = 0
        self.release = threading.Event()
        self.release.set()
        self._results = results if results is not None else [result(OK, condition="Thing", reason="ThingOk")]
        self._raises = raises
        self._returns = returns

    def run(self):
        self.calls += 1
        self.release.wait(10)
        if self._raises:
            raise self._raises
        return self._returns if self._returns is not None else self._results


class Manual:
    """The scheduler's thread seam: start runs when told, so every step is deterministic."""

    def __init__(self):
        self.pending: list[Callable[[], None]] = []

    def __call__(self, target, name):
        self.pending.append(target)

    def finish_all(self):
        while self.pending:
            self.pending.pop(0)()


def scheduler(*checks, concurrency=4, **kw) -> tuple[CheckScheduler, Manual]:
    manual = Manual()
    specs = [
        ScheduledCheck(check=c, interval=c.interval, timeout=c.timeout, kind="python", origin="test", jitter=0, **kw)
        for c in checks
    ]
    s = CheckScheduler(
        checks=specs,
        inbox=Inbox(),
        concurrency=concurrency,
        clock=lambda: 1000.0,
        monotonic=lambda: 0.0,
        start_thread=manual,
    )
    return s, manual


def scheduler_of(specs) -> tuple[CheckScheduler, Manual]:
    manual = Manual()
    s = CheckScheduler(checks=specs, inbox=Inbox(), clock=lambda: 1000.0, monotonic=lambda: 0.0, start_thread=manual)
    return s, manual


def test_every_check_runs_at_start_then_on_its_interval_never_overlapping():
    a = Gate("a")
    s, manual = scheduler(a)
    reports, wake = s.step(0.0)
    assert (reports, len(manual.pending), wake) == ([], 1, 5.0)  # running: wake at its timeout
    assert s.step(1.0)[0] == [] and len(manual.pending) == 1  # never a second copy while it runs
    manual.finish_all()
    reports, wake = s.step(2.0)
    assert [r.check for r in reports] == ["a"] and wake == 12.0
    assert s.step(11.9)[0] == [] and not manual.pending
    s.step(12.0)
    assert len(manual.pending) == 1


def test_concurrency_and_group_limits_hold():
    checks = [Gate(n) for n in "abcd"]
    s, manual = scheduler(*checks, concurrency=3)
    s.step(0.0)
    assert len(manual.pending) == 3
    s2, manual2 = scheduler(*[Gate(n) for n in "abcd"], concurrency=4, group="f.json", group_limit=2)
    s2.step(0.0)
    assert len(manual2.pending) == 2


@pytest.mark.parametrize(
    ("check", "error"),
    [
        (Gate("x", raises=RuntimeError("nvml exploded")), "check x: raised RuntimeError: nvml exploded"),
        (Gate("x", returns="fine"), "check x: run() returned str, not a list of CheckResult"),
        (Gate("x", returns=[1, 2]), "check x: run() returned a list with int items, not CheckResult"),
        (Gate("x", raises=SystemExit(7)), "check x: raised SystemExit: 7"),
        (Gate("x", raises=KeyboardInterrupt()), "check x: raised KeyboardInterrupt"),
        (Gate("x", raises=GeneratorExit()), "check x: raised GeneratorExit"),
    ],
    ids=["raises", "returns-str", "returns-ints", "sys-exit", "keyboard-interrupt", "generator-exit"],
)
def test_a_check_that_raises_or_returns_garbage_is_unknown(check, error):
    s, manual = scheduler(check)
    s.step(0.0)
    manual.finish_all()
    [rep] = s.step(1.0)[0]
    assert [(r.status, r.condition, r.message) for r in rep.results] == [(UNKNOWN, "Thing", error)]
    stats = s.stats["x"]
    assert stats.last_status is UNKNOWN and sum(stats.errors.values()) == 1


def bad(**fields) -> CheckResult:
    """A CheckResult with wrong field types (a plugin can build one: dataclasses do not check types)."""
    good = {"status": PROBLEM, "condition": "Thing", "reason": "Bad", "message": "what was seen"}
    return CheckResult(**{**good, **fields})


@pytest.mark.parametrize(
    ("results", "error"),
    [
        ([bad(message=None)], "result[0].message must be a str, not None"),
        ([bad(status="PROBLEM")], "result[0].status must be a CheckStatus, not 'PROBLEM'"),
        ([bad(status=None)], "result[0].status must be a CheckStatus, not None"),
        ([bad(reason=7)], "result[0].reason must be a non-empty str, not 7"),
        ([bad(reason="")], "result[0].reason must be a non-empty str, not ''"),
        ([bad(condition=b"Thing")], "result[0].condition must be a non-empty str, not a bytes"),
        ([bad(severity="critical")], "result[0].severity must be a Severity, not 'critical'"),
        ([bad(repeat_event="yes")], "result[0].repeat_event must be a bool, not 'yes'"),
        ([bad(values="12")], "result[0].values must be a tuple of at most 1024 Value"),
        ([bad(values=(3,))], "result[0].values[0] must be a Value, not 3"),
        ([bad(values=(Value(name="x", value=float("nan")),))], "result[0].values[0].value must be a finite number"),
        ([bad(values=(Value(name="x", value=float("inf")),))], "result[0].values[0].value must be a finite number"),
        ([bad(values=(Value(name="x", value="3"),))], "result[0].values[0].value must be a finite number, not '3'"),
        ([bad(values=(Value(name="Bad-Name", value=1),))], "result[0].values[0].name must match [a-z_][a-z0-9_]*"),
        (
            [bad(values=(Value(name="x", value=1, labels={"gpu": 0}),))],
            "result[0].values[0].labels['gpu'] must be a str, not 0",
        ),
        (
            [bad(values=(Value(name="x", value=1, labels={"check": "y"}),))],
            "label name 'check' is not a Prometheus label name (or is 'check')",
        ),
        ([result(OK, condition="Thing", reason="ThingOk"), bad(message=None)], "result[1].message must be a str"),
        ([result(OK, condition="Thing", reason="ThingOk")] * 257, "run() returned 257 results (at most 256)"),
    ],
    ids=lambda v: None if isinstance(v, list) else v[:40],
)
def test_a_malformed_result_is_unknown_naming_the_field_and_the_other_checks_go_on(results, error):
    s, manual = scheduler(Gate("x", returns=results), Gate("other"))
    s.step(0.0)
    manual.finish_all()
    reports = {r.check: r for r in s.step(1.0)[0]}  # on the old code: TypeError here, the scheduler thread dies
    [r] = reports["x"].results
    assert (r.status, r.condition, r.reason) == (UNKNOWN, "Thing", "CheckFailed")
    assert r.message.startswith("check x: run() returned ") and error in r.message
    assert s.stats["x"].errors["invalid"] == 1 and s.stats["x"].values == ()
    assert reports["other"].results[0].status is OK


def test_results_are_copied_into_plain_values():
    class Shouty(str):
        def __str__(self):
            return "SHOUT"

    labels = {"gpu": "0"}
    c = Gate(
        "x", returns=[bad(status=OK, reason=Shouty("Fine"), values=(Value(name="v", value=True + 1, labels=labels),))]
    )
    s, manual = scheduler(c)
    s.step(0.0)
    manual.finish_all()
    [rep] = s.step(1.0)[0]
    [r] = rep.results
    assert type(r.reason) is str and r.reason == "Fine"
    labels["gpu"] = "changed later by the plugin"
    assert r.values[0].labels == {"gpu": "0"} and type(r.values[0].value) is float


def test_a_hung_check_is_unknown_at_its_timeout_frees_its_slot_and_is_not_started_twice():
    hung = Gate("hung")
    hung.release.clear()
    other = Gate("other")
    s, manual = scheduler(hung, other, concurrency=1)
    s.step(0.0)
    assert len(manual.pending) == 1  # hung first (same due time, order kept)
    runner = threading.Thread(target=manual.pending.pop(0))
    runner.start()  # really running, really stuck
    reports, _ = s.step(5.0)
    assert [(r.check, r.results[0].message) for r in reports] == [("hung", "check hung: timed out after 5s")]
    assert len(manual.pending) == 1  # the slot went to "other"
    manual.finish_all()
    reports, _ = s.step(15.0)  # hung is due again but still stuck: reported, not restarted
    assert {r.check for r in reports} == {"other", "hung"}
    assert "still running" in next(r for r in reports if r.check == "hung").results[0].message
    assert hung.calls == 1
    hung.release.set()
    runner.join(5)
    assert s.step(16.0)[0] == []  # the late result is dropped
    assert s.stats["hung"].errors["timeout"] == 1


def test_values_and_outcomes_feed_the_stats():
    c = Gate("v", results=[result(OK, condition="Thing", reason="ThingOk", values=(Value(name="x", value=3),))])
    s, manual = scheduler(c)
    s.step(0.0)
    manual.finish_all()
    s.step(1.0)
    st = s.stats["v"]
    assert (st.last_status, st.runs["OK"], st.values[0].value, st.last_success) == (OK, 1, 3, 1000.0)


def test_replace_keeps_the_schedule_of_checks_that_stay():
    a, b = Gate("a"), Gate("b")
    s, manual = scheduler(a)
    s.step(0.0)
    manual.finish_all()
    s.step(1.0)  # a next due at 11
    s.replace(
        [
            ScheduledCheck(check=a, interval=10, timeout=5, kind="python", origin="t", jitter=0),
            ScheduledCheck(check=b, interval=10, timeout=5, kind="python", origin="t", jitter=0),
        ]
    )
    s.step(2.0)
    assert len(manual.pending) == 1  # only the new one starts now
    assert [c.name for c in s.checks] == ["a", "b"]


def test_a_result_for_an_undeclared_condition_is_unknown_naming_it():
    c = Gate("u", results=[result(PROBLEM, condition="NotMine", reason="Bad")])
    s, manual = scheduler(c)
    s.step(0.0)
    manual.finish_all()
    [rep] = s.step(1.0)[0]
    [r] = rep.results
    assert (r.status, r.condition, r.reason) == (UNKNOWN, None, "CheckResultInvalid")
    assert "reported condition 'NotMine', which it does not declare (declared: Thing)" in r.message


def test_workers_are_reused_and_a_hung_run_gets_a_worker_of_its_own():
    from agent.checks.scheduler import Workers

    workers = Workers(idle_timeout=30)
    before = {t for t in threading.enumerate() if t.name == "check-worker"}
    release = threading.Event()
    done: list[str] = []
    started = threading.Event()

    def hang():
        started.set()
        release.wait(10)
        done.append("hung")

    workers(hang, "hang")
    started.wait(5)
    for i in range(5):  # one after the other: each reuses the same idle worker
        finished = threading.Event()
        workers(lambda i=i, f=finished: (done.append(i), f.set()), "quick")
        assert finished.wait(5)
    assert done == [0, 1, 2, 3, 4]
    assert len({t for t in threading.enumerate() if t.name == "check-worker"} - before) == 2
    release.set()


def test_a_huge_message_is_cut_before_it_reaches_a_condition():
    c = Gate("big", results=[result(PROBLEM, condition="Thing", reason="Bad")])
    c._results = [CheckResult(status=PROBLEM, condition="Thing", reason="Bad", message="x" * 10_000_000)]
    s, manual = scheduler(c)
    s.step(0.0)
    manual.finish_all()
    [rep] = s.step(1.0)[0]
    assert len(rep.results[0].message) == 1024 and rep.results[0].message.endswith("…")


def test_stopping_the_scheduler_cancels_running_tools_and_waits_for_them():
    cancel = threading.Event()
    ended = threading.Event()

    class Tool:
        name, interval, timeout = "tool", 60.0, 60.0
        conditions = ()

        def run(self):
            cancel.wait(30)  # what run_process does: poll the cancel event, kill the group
            ended.set()
            return []

    spec = ScheduledCheck(check=Tool(), interval=60, timeout=60, kind="executable", origin="t", jitter=0)
    s = CheckScheduler(checks=[spec], inbox=Inbox(), cancel=cancel)
    stop = threading.Event()
    thread = threading.Thread(target=s.run, args=(stop,))
    thread.start()
    wait_for(lambda: s._slots["tool"].running_since is not None)
    stop.set()
    s.wake()  # as the supervisor does
    thread.join(10)
    assert cancel.is_set() and ended.is_set()


class Spread(random.Random):
    """Jitter as scripted: each interval drawn gets the next offset."""

    def __init__(self, *offsets: float) -> None:
        super().__init__(0)
        self.offsets = list(offsets)

    def uniform(self, a: float, b: float) -> float:
        return self.offsets.pop(0)


@pytest.mark.parametrize(
    ("offsets", "at", "started"),
    [
        ((0.0, 5.0), 60.0, ["a", "b"]),  # b (due at 65, allowed from 54) goes along with a
        ((0.0, 5.0), 59.0, []),  # nothing due yet: nobody starts early on their own
        ((-5.0, 5.0), 55.0, ["a", "b"]),
        ((0.0, 5.0, 3.0), 60.0, ["a", "b"]),  # c's window (every 600 s) is far: it keeps its own time
    ],
    ids=["within-jitter", "none-due", "early-due", "other-interval"],
)
def test_a_due_check_takes_along_the_checks_inside_their_jitter_window(offsets, at, started):
    names = ["a", "b", "c"][: len(offsets)]
    checks = [Gate(n) for n in names]
    specs = [
        ScheduledCheck(check=c, interval=600.0 if c.name == "c" else 60.0, timeout=5, kind="python", origin="t")
        for c in checks
    ]
    manual = Manual()
    s = CheckScheduler(checks=specs, inbox=Inbox(), monotonic=lambda: 0.0, start_thread=manual, rng=Spread(*offsets))
    s.step(0.0)
    manual.finish_all()
    s.step(0.0)  # every check ran once at start; next due at 60 + offset (600 + offset for c)
    s.step(at)
    assert sorted(name for name, slot in s._slots.items() if slot.running_since == at) == started


class Clock:
    """A monotonic clock the scheduler's injected wait advances: a sleep takes no real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([60.0], [60.0, 60.0, 60.0]),  # not a second at most: every wakeup is idle CPU (issue 16)
        ([60.0, 300.0], [60.0, 60.0, 60.0]),  # the nearest due check sets the sleep
        ([], [None]),  # no checks: sleep until replace() or stop wakes it
    ],
    ids=["one-check", "two-checks", "no-checks"],
)
def test_an_idle_scheduler_sleeps_until_its_next_check_is_due(intervals, expected):
    clock, stop, waits = Clock(), threading.Event(), []

    def wait(condition, timeout):
        waits.append(timeout)
        if timeout is None or len(waits) == len(expected):
            stop.set()
        else:
            clock.now += timeout

    def inline(target, name):
        target()

    checks = [Gate(f"c{i}") for i in range(len(intervals))]
    specs = [
        ScheduledCheck(check=c, interval=every, timeout=5, kind="python", origin="t", jitter=0)
        for c, every in zip(checks, intervals, strict=True)
    ]
    s = CheckScheduler(checks=specs, inbox=Inbox(), monotonic=clock, start_thread=inline, wait=wait)
    s.run(stop)
    assert waits == expected
    assert [c.calls for c in checks] == [len(expected) if every == 60 else 1 for every in intervals]


def test_a_sleeping_scheduler_is_healthy_until_it_is_late_and_wakes_on_stop():
    clock, stop, asleep = Clock(), threading.Event(), threading.Event()

    def wait(condition, timeout):
        asleep.set()
        condition.wait(timeout)  # a real sleep of an hour: only wake() ends it here

    spec = ScheduledCheck(check=Gate("c"), interval=3600, timeout=5, kind="python", origin="t", jitter=0)
    s = CheckScheduler(
        checks=[spec], inbox=Inbox(), monotonic=clock, start_thread=lambda t, n: t(), wait=wait, stall_timeout=60
    )
    thread = threading.Thread(target=s.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert asleep.wait(10)
        wait_for(lambda: s.healthy(3600 + 59))  # due at 3600: not stalled before it is 60 s late
        assert not s.healthy(3600 + 60)
    finally:
        stop.set()
        s.wake()
        thread.join(10)
    assert not thread.is_alive()


@pytest.mark.parametrize(
    ("use", "message"),
    [
        ("nvidia.nope:GpuCountCheck", "no built-in check module 'nvidia.nope' (plugins/nvidia/nope.py)"),
        ("nvidia.checks:NoSuchCheck", "built-in module 'nvidia.checks' has no factory 'NoSuchCheck'"),
    ],
    ids=["module", "factory"],
)
def test_a_built_in_that_does_not_exist_is_a_configuration_error(use, message):
    decl = CheckDecl(name="x", use=use, file="/etc/c.yaml", path=("checks", 0), line=2, origin="o")
    checks, problems = build_checks([decl], context=CheckContext(), entry_points=list)
    assert checks == []
    assert [(p.file, p.field, p.line, p.message) for p in problems] == [("/etc/c.yaml", "checks[0].use", 2, message)]
