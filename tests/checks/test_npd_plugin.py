"""node-problem-detector custom-plugin-monitor files: loaded unchanged, validated with file/field/line.

``tmp_path`` plays the node's ``/`` (NPD's working directory): configs live in ``config/`` and
plugins in ``config/plugin/``, as in the AKS GPU DaemonSet.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from agent.checks.executable import UNKNOWN_REASON, ExecutableCheck
from agent.checks.model import CheckResult, CheckStatus
from agent.checks.npd_plugin import (
    CustomPluginMonitor,
    is_custom_plugin_monitor,
    load_custom_plugin_monitor,
    slug,
)
from agent.core.configdoc import Problems, read_pack
from agent.core.errors import ConfigProblem
from agent.core.types import ConditionSpec, Severity

OK, PROBLEM, UNKNOWN = CheckStatus.OK, CheckStatus.PROBLEM, CheckStatus.UNKNOWN


def write(path: Path, text: str, *, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def load(path: Path, *, cwd: Path) -> tuple[CustomPluginMonitor | None, list[ConfigProblem]]:
    doc, problems = read_pack(path)
    assert doc is not None, problems
    col = Problems(file=str(path), doc=doc)
    monitor = load_custom_plugin_monitor(doc=doc, col=col, path=path, cwd=cwd)
    assert (monitor is None) == bool(col.problems), col.problems
    return monitor, col.problems


def executable(monitor: CustomPluginMonitor, index: int = 0) -> ExecutableCheck:
    check = monitor.checks[index].check
    assert isinstance(check, ExecutableCheck)
    return check


# --- the AKS GPU file, unchanged -----------------------------------------------------------------

# The shape of Azure/azurehpc experimental/aks_npd_draino custom-plugin-gpu-count.json.
AKS_GPU_COUNT = {
    "plugin": "custom",
    "pluginConfig": {
        "invoke_interval": "60s",
        "timeout": "20s",
        "max_output_length": 80,
        "concurrency": 3,
        "enable_message_change_based_condition_update": False,
    },
    "source": "custom-plugin-gpu-count",
    "metricsReporting": False,
    "conditions": [{"type": "GpuCount", "reason": "GpuCountGood", "message": "GPU count is correct"}],
    "rules": [
        {"type": "temporary", "reason": "GpuCountBad", "path": "./config/plugin/check_gpu_count.sh", "timeout": "10s"},
        {
            "type": "permanent",
            "condition": "GpuCount",
            "reason": "GpuCountBad",
            "path": "./config/plugin/check_gpu_count.sh",
            "timeout": "10s",
        },
    ],
}

# A stand-in for the script: "nvidia-smi --list-gpus" is a file of lines; every run leaves a mark.
GPU_COUNT_SCRIPT = """#!/bin/sh
echo run >> runs.log
if [ ! -f gpus.txt ]; then echo "nvidia-smi: command not found"; exit 2; fi
found=$(wc -l < gpus.txt)
if [ "$found" -ne 8 ]; then echo "Expected to see 8 but found $found. FaultCode: NHC2009"; exit 1; fi
echo "Expected 8 and found $found"
exit 0
"""


@pytest.fixture
def aks_node(tmp_path: Path) -> Path:
    write(tmp_path / "config" / "custom-plugin-gpu-count.json", json.dumps(AKS_GPU_COUNT, indent=2))
    write(tmp_path / "config" / "plugin" / "check_gpu_count.sh", GPU_COUNT_SCRIPT, mode=0o777)  # defaultMode 0777
    return tmp_path


def test_aks_gpu_count_file_loads_as_one_check(aks_node: Path) -> None:
    config = aks_node / "config" / "custom-plugin-gpu-count.json"
    monitor, problems = load(config, cwd=aks_node)
    assert problems == [] and monitor is not None
    assert monitor.source == "custom-plugin-gpu-count"
    gpu_count = ConditionSpec(
        type="GpuCount", reason="GpuCountGood", message="GPU count is correct", source="custom-plugin-gpu-count"
    )
    assert monitor.conditions == (gpu_count,)
    assert (monitor.metrics_reporting, monitor.enable_message_change_based_condition_update) == (False, False)
    assert (monitor.max_output_length, monitor.concurrency, monitor.skip_initial_status) == (80, 3, False)
    assert monitor.warnings == ()
    (scheduled,) = monitor.checks
    assert scheduled.name == "custom-plugin-gpu-count/gpu-count-bad"
    # the rule's 10s is the plugin's own limit (the runner kills it then); the scheduler's backstop is 1s later
    assert (scheduled.interval, scheduled.check.timeout, scheduled.timeout, scheduled.kind) == (
        60.0,
        10.0,
        11.0,
        "executable",
    )
    assert scheduled.origin == f"{config}: rules[0], rules[1]"
    assert (scheduled.failure_threshold, scheduled.success_threshold) == (1, 1)
    assert (scheduled.group, scheduled.group_limit) == (str(config), 3)
    check = executable(monitor)
    assert check.argv == (str(aks_node / "config" / "plugin" / "check_gpu_count.sh"),)
    assert (check.interval, check.timeout, check.cwd, check.conditions) == (60.0, 10.0, aks_node, (gpu_count,))


def temporary(status: CheckStatus, reason: str, message: str) -> CheckResult:
    return CheckResult(
        status=status, condition=None, reason=reason, message=message, severity=Severity.WARNING, repeat_event=True
    )


def permanent(status: CheckStatus, reason: str, message: str) -> CheckResult:
    return CheckResult(status=status, condition="GpuCount", reason=reason, message=message, severity=Severity.ERROR)


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        pytest.param(
            7,
            [
                temporary(PROBLEM, "GpuCountBad", "Expected to see 8 but found 7. FaultCode: NHC2009"),
                permanent(PROBLEM, "GpuCountBad", "Expected to see 8 but found 7. FaultCode: NHC2009"),
            ],
            id="seven-gpus-event-and-condition",
        ),
        pytest.param(
            8,
            [
                temporary(OK, "", "Expected 8 and found 8"),
                permanent(OK, "GpuCountGood", "GPU count is correct"),
            ],
            id="eight-gpus-healthy-defaults",
        ),
        pytest.param(
            None,
            [
                temporary(UNKNOWN, UNKNOWN_REASON, "check_gpu_count.sh: exit code 2: nvidia-smi: command not found"),
                permanent(UNKNOWN, UNKNOWN_REASON, "check_gpu_count.sh: exit code 2: nvidia-smi: command not found"),
            ],
            id="tool-missing-unknown-for-both",
        ),
    ],
)
def test_one_execution_feeds_the_temporary_and_the_permanent_rule(
    aks_node: Path, gpus: int | None, expected: list[CheckResult]
) -> None:
    if gpus is not None:
        (aks_node / "gpus.txt").write_text("".join(f"GPU {i}: NVIDIA H100 80GB HBM3\n" for i in range(gpus)))
    monitor, _ = load(aks_node / "config" / "custom-plugin-gpu-count.json", cwd=aks_node)
    assert monitor is not None
    assert list(monitor.checks[0].check.run()) == expected
    assert (aks_node / "runs.log").read_text() == "run\n"  # the script ran once, not once per rule


# --- NPD's own example ------------------------------------------------------------------------------

# The shape of kubernetes/node-problem-detector config/custom-plugin-monitor.json.
NPD_EXAMPLE = """{
  "plugin": "custom",
  "pluginConfig": {
    "invoke_interval": "30s",
    "timeout": "5s",
    "max_output_length": 80,
    "concurrency": 3
  },
  "source": "ntp-custom-plugin-monitor",
  "conditions": [
    {
      "type": "NTPProblem",
      "reason": "NTPIsUp",
      "message": "ntp service is up"
    }
  ],
  "rules": [
    {
      "type": "permanent",
      "condition": "NTPProblem",
      "reason": "NTPIsDown",
      "path": "./config/plugin/check_ntp.sh",
      "timeout": "3s"
    }
  ]
}
"""


@pytest.mark.parametrize(
    ("exit_code", "output", "status", "reason", "message"),
    [
        pytest.param(0, "ntp.service is running", OK, "NTPIsUp", "ntp service is up", id="running"),
        pytest.param(1, "ntp.service is not running", PROBLEM, "NTPIsDown", "ntp.service is not running", id="down"),
        pytest.param(
            2,
            "Could not find 'systemctl' - require systemd",
            UNKNOWN,
            UNKNOWN_REASON,
            "check_ntp.sh: exit code 2: Could not find 'systemctl' - require systemd",
            id="unknown",
        ),
    ],
)
def test_npd_example_with_check_ntp(
    tmp_path: Path, exit_code: int, output: str, status: CheckStatus, reason: str, message: str
) -> None:
    config = write(tmp_path / "config" / "custom-plugin-monitor.json", NPD_EXAMPLE)
    write(
        tmp_path / "config" / "plugin" / "check_ntp.sh", f'#!/bin/sh\necho "{output}"\nexit {exit_code}\n', mode=0o755
    )
    monitor, problems = load(config, cwd=tmp_path)
    assert problems == [] and monitor is not None
    (scheduled,) = monitor.checks
    assert (scheduled.name, scheduled.interval, scheduled.check.timeout) == (
        "ntp-custom-plugin-monitor/ntp-is-down",
        30.0,
        3.0,
    )
    (result,) = scheduled.check.run()
    assert (result.status, result.condition, result.reason, result.message) == (status, "NTPProblem", reason, message)


def test_defaults_when_plugin_config_is_omitted(tmp_path: Path) -> None:
    config = write(
        tmp_path / "conntrack.yaml",
        "plugin: custom\nsource: network-custom-plugin-monitor\nconditions: []\n"
        "rules:\n  - type: temporary\n    reason: ConntrackFull\n    path: /bin/true\n",
    )
    monitor, problems = load(config, cwd=tmp_path)
    assert problems == [] and monitor is not None
    assert (monitor.invoke_interval, monitor.timeout, monitor.max_output_length, monitor.concurrency) == (
        30.0,
        5.0,
        80,
        3,
    )
    assert (monitor.enable_message_change_based_condition_update, monitor.skip_initial_status) == (False, False)
    assert monitor.metrics_reporting is True
    (scheduled,) = monitor.checks
    assert (scheduled.interval, scheduled.check.timeout, scheduled.group_limit) == (30.0, 5.0, 3)
    assert scheduled.check.conditions == ()
    (result,) = scheduled.check.run()
    assert result == temporary(OK, "", "true: ok (exit code 0)")


def test_classification() -> None:
    from agent.core.configdoc import Document

    assert is_custom_plugin_monitor(Document(data={"plugin": "custom"}, lines={}))
    assert not is_custom_plugin_monitor(Document(data={"plugin": "kmsg"}, lines={}))
    assert not is_custom_plugin_monitor(Document(data=["plugin"], lines={}))


# --- validation: every problem names file, field and line -------------------------------------------

BASE = """\
plugin: custom
pluginConfig:
  invoke_interval: 30s
  timeout: 5s
source: test-plugin
conditions:
  - type: Thing
    reason: ThingGood
    message: thing is fine
rules:
  - type: permanent
    condition: Thing
    reason: ThingBad
    path: /bin/true
"""


def edit(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


INVALID = [
    pytest.param("- a\n- b\n", "", 1, "expected a mapping (custom-plugin-monitor schema", id="not-a-mapping"),
    pytest.param(
        edit("source:", "sauce:"),
        "sauce",
        5,
        "unknown key 'sauce' in a custom-plugin-monitor file (known: ",
        id="top-key",
    ),
    pytest.param(
        edit("  timeout: 5s", "  timeOut: 5s"),
        "pluginConfig.timeOut",
        4,
        "unknown key 'timeOut' in a custom-plugin-monitor pluginConfig (known: concurrency, ",
        id="plugin-config-key",
    ),
    pytest.param(
        BASE + "    pattern: Xid\n",
        "rules[0].pattern",
        15,
        "unknown key 'pattern' in a custom-plugin-monitor rule (known: args, condition, invoke_interval, path, "
        "reason, timeout, type); 'pattern' belongs to a system-log-monitor file",
        id="log-monitor-key-in-rule",
    ),
    pytest.param(
        edit("    message: thing", "    mesage: thing"),
        "conditions[0].mesage",
        9,
        "unknown key 'mesage' in a custom-plugin-monitor condition",
        id="condition-key",
    ),
    pytest.param(edit("plugin: custom", "plugin: kmsg"), "plugin", 1, "must be 'custom'", id="plugin-not-custom"),
    pytest.param(edit("source: test-plugin", "source: ''"), "source", 5, "must be a non-empty string", id="source"),
    pytest.param(
        edit("source: test-plugin", "source: test-plugin\nmetricsReporting: 'no'"),
        "metricsReporting",
        6,
        "must be true or false, got 'no'",
        id="metrics-reporting",
    ),
    pytest.param(
        edit("  invoke_interval: 30s", "  invoke_interval: 0s"),
        "pluginConfig.invoke_interval",
        3,
        "must be greater than 0, got '0s'",
        id="interval-zero",
    ),
    pytest.param(
        edit("  invoke_interval: 30s", "  invoke_interval: 30"),
        "pluginConfig.invoke_interval",
        3,
        "must be a duration string like '30s' or '1m30s', got 30",
        id="interval-number",
    ),
    pytest.param(
        edit("  invoke_interval: 30s", "  invoke_interval: 30 seconds"),
        "pluginConfig.invoke_interval",
        3,
        "invalid duration '30 seconds'",
        id="interval-not-go-syntax",
    ),
    pytest.param(
        edit("  invoke_interval: 30s", "  invoke_interval: 1ns"),
        "pluginConfig.invoke_interval",
        3,
        "must be at least 1s, got '1ns'",
        id="interval-below-floor",
    ),
    pytest.param(
        BASE + "    invoke_interval: 500ms\n",
        "rules[0].invoke_interval",
        15,
        "must be at least 1s, got '500ms'",
        id="rule-interval-below-floor",
    ),
    pytest.param(
        edit("  timeout: 5s", "  timeout: 1ms"),
        "pluginConfig.timeout",
        4,
        "must be at least 0.1s, got '1ms'",
        id="timeout-below-floor",
    ),
    pytest.param(
        BASE + "    invoke_interval: -1s\n",
        "rules[0].invoke_interval",
        15,
        "invalid duration '-1s'",
        id="rule-interval-negative",
    ),
    pytest.param(
        edit("  timeout: 5s", "  timeout: 5s\n  max_output_length: 0"),
        "pluginConfig.max_output_length",
        5,
        "must be a whole number of at least 1, got 0",
        id="max-output-length",
    ),
    pytest.param(
        edit("  timeout: 5s", "  timeout: 5s\n  max_output_length: 100000000"),
        "pluginConfig.max_output_length",
        5,
        "must be at most 4096, got 100000000",
        id="max-output-length-above-what-is-kept",
    ),
    pytest.param(
        edit("  timeout: 5s", "  timeout: 5s\n  concurrency: '3'"),
        "pluginConfig.concurrency",
        5,
        "must be a whole number of at least 1, got '3'",
        id="concurrency",
    ),
    pytest.param(
        edit("  timeout: 5s", "  timeout: 5s\n  enable_message_change_based_condition_update: 1"),
        "pluginConfig.enable_message_change_based_condition_update",
        5,
        "must be true or false, got 1",
        id="message-change-flag",
    ),
    pytest.param(
        BASE + "    timeout: 10s\n",
        "rules[0].timeout",
        15,
        "'10s' is longer than the global pluginConfig.timeout '5s'; node-problem-detector rejects this too",
        id="rule-timeout-above-global",
    ),
    pytest.param(
        edit("  timeout: 5s\n", "") + "    timeout: 6s\n",
        "rules[0].timeout",
        14,
        "'6s' is longer than the global pluginConfig.timeout '5s (default)'",
        id="rule-timeout-above-default-global",
    ),
    pytest.param(
        edit("    condition: Thing", "    condition: Other"),
        "rules[0].condition",
        12,
        "condition 'Other' is not declared in 'conditions' (declared: Thing)",
        id="condition-not-declared",
    ),
    pytest.param(
        edit("    condition: Thing\n", ""),
        "rules[0].condition",
        11,
        "required for a permanent rule",
        id="permanent-without-condition",
    ),
    pytest.param(
        edit("  - type: permanent", "  - type: sometimes"),
        "rules[0].type",
        11,
        "must be 'temporary' or 'permanent', got 'sometimes'",
        id="rule-type",
    ),
    pytest.param(
        edit("    path: /bin/true\n", ""), "rules[0].path", 11, "required: the plugin to run", id="path-missing"
    ),
    pytest.param(
        edit("    reason: ThingBad\n", ""), "rules[0].reason", 11, "required: the CamelCase reason", id="reason"
    ),
    pytest.param(
        BASE + "    args: [1, 2]\n", "rules[0].args", 15, "must be a list of strings, got [1, 2]", id="args-not-strings"
    ),
    pytest.param(
        BASE + "  - type: permanent\n    condition: Thing\n    reason: ThingWorse\n    path: /bin/false\n",
        "rules[1].condition",
        16,
        "condition 'Thing' is already set by rules[0].condition, line 12; one permanent rule per condition",
        id="two-permanent-rules-one-condition",
    ),
    pytest.param(
        edit("rules:", "  - type: Thing\n    reason: Again\nrules:"),
        "conditions[1].type",
        10,
        "duplicate condition type 'Thing' (also conditions[0].type, line 7)",
        id="duplicate-condition",
    ),
    pytest.param(BASE.split("rules:")[0], "rules", 1, "required: a list of rules", id="rules-missing"),
    pytest.param(
        BASE.split("rules:")[0] + "rules:\n  - ./check.sh\n",
        "rules[0]",
        11,
        "must be a mapping with type, reason and path",
        id="rule-not-a-mapping",
    ),
]


@pytest.mark.parametrize(("text", "field", "line", "message"), INVALID)
def test_invalid_files(tmp_path: Path, text: str, field: str, line: int, message: str) -> None:
    config = write(tmp_path / "plugin.yaml", text)
    monitor, problems = load(config, cwd=tmp_path)
    assert monitor is None
    assert [(p.file, p.field, p.line) for p in problems] == [(str(config), field, line)], problems
    assert message in problems[0].message, problems[0].message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = edit("  invoke_interval: 30s", "  invoke_interval: never").replace("    path: /bin/true\n", "")
    monitor, problems = load(write(tmp_path / "plugin.yaml", text), cwd=tmp_path)
    assert monitor is None
    assert [(p.field, p.line) for p in problems] == [("pluginConfig.invoke_interval", 3), ("rules[0].path", 11)]


def test_base_is_valid(tmp_path: Path) -> None:
    monitor, problems = load(write(tmp_path / "plugin.yaml", BASE), cwd=tmp_path)
    assert problems == [] and monitor is not None and monitor.warnings == ()


# --- warnings: loading goes on, validate-config shows them -------------------------------------------

WARNINGS = [
    pytest.param(
        None,
        "rules[0].path",
        14,
        "'./plugin/check.sh' -> {root}/plugin/check.sh does not exist (yet): every run reports UNKNOWN 'no such file'",
        id="missing-plugin",
    ),
    pytest.param(
        ("#!/bin/sh\nexit 0\n", 0o644),
        "rules[0].path",
        14,
        "'./plugin/check.sh' -> {root}/plugin/check.sh is not executable",
        id="not-executable",
    ),
    pytest.param(
        ("exit 0\n", 0o755),
        "rules[0].path",
        14,
        "'./plugin/check.sh' -> {root}/plugin/check.sh has no '#!' line",
        id="no-shebang",
    ),
]


@pytest.mark.parametrize(("plugin", "field", "line", "message"), WARNINGS)
def test_plugin_warnings(tmp_path: Path, plugin, field: str, line: int, message: str) -> None:
    if plugin is not None:
        write(tmp_path / "plugin" / "check.sh", plugin[0], mode=plugin[1])
    config = write(tmp_path / "plugin.yaml", edit("path: /bin/true", "path: ./plugin/check.sh"))
    monitor, problems = load(config, cwd=tmp_path)
    assert problems == [] and monitor is not None  # it loads: the run reports UNKNOWN until it is fixed
    (warning,) = monitor.warnings
    assert (warning.file, warning.field, warning.line) == (str(config), field, line)
    assert message.format(root=tmp_path) in warning.message, warning.message


def test_a_fifo_as_plugin_is_a_warning_not_a_hang(tmp_path: Path) -> None:
    """Opening a FIFO to read its '#!' line blocked validate-config, run and every reload for ever."""
    fifo = tmp_path / "plugin" / "check.sh"
    fifo.parent.mkdir()
    os.mkfifo(fifo, 0o755)
    # A writer, so that a reader opening the FIFO is not blocked (the test cannot hang either way).
    writer = threading.Thread(target=lambda: os.close(os.open(fifo, os.O_WRONLY)), daemon=True)
    writer.start()
    try:
        config = write(tmp_path / "plugin.yaml", edit("path: /bin/true", "path: ./plugin/check.sh"))
        monitor, problems = load(config, cwd=tmp_path)
        assert problems == [] and monitor is not None
        assert [w.message for w in monitor.warnings] == [
            f"'./plugin/check.sh' -> {fifo} is not a regular file, not a program"
        ]
    finally:
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer's open return: kept open until
        writer.join(10)  # it has (closed at once, the writer could miss it and wait out the join)
        os.close(reader)


def test_condition_on_a_temporary_rule_is_ignored_with_a_warning(tmp_path: Path) -> None:
    config = write(tmp_path / "plugin.yaml", edit("  - type: permanent", "  - type: temporary"))
    monitor, problems = load(config, cwd=tmp_path)
    assert problems == [] and monitor is not None
    assert [(w.field, w.line) for w in monitor.warnings] == [("rules[0].condition", 12)]
    assert "ignored" in monitor.warnings[0].message
    assert executable(monitor).verdicts[0].condition is None
    assert executable(monitor).conditions == ()


def test_no_rules_is_a_warning(tmp_path: Path) -> None:
    config = write(tmp_path / "plugin.yaml", BASE.split("rules:")[0] + "rules: []\n")
    monitor, problems = load(config, cwd=tmp_path)
    assert problems == [] and monitor is not None and monitor.checks == ()
    assert [(w.field, w.line, w.message) for w in monitor.warnings] == [
        ("rules", 10, "no rules: this file runs nothing")
    ]


# --- relative plugin paths ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_cwd", "beside_config", "expected"),
    [
        pytest.param(True, False, "root/config/plugin/check.sh", id="cwd-relative-as-npd"),
        pytest.param(True, True, "root/config/plugin/check.sh", id="cwd-wins"),
        pytest.param(False, True, "etc/nha/config/plugin/check.sh", id="fallback-beside-the-config-file"),
        pytest.param(False, False, "root/config/plugin/check.sh", id="neither-keeps-npd-path"),
    ],
)
def test_relative_path_resolution(tmp_path: Path, in_cwd: bool, beside_config: bool, expected: str) -> None:
    root, config_dir = tmp_path / "root", tmp_path / "etc" / "nha"
    root.mkdir()
    for present, base in ((in_cwd, root), (beside_config, config_dir)):
        if present:
            write(base / "config" / "plugin" / "check.sh", "#!/bin/sh\nexit 0\n", mode=0o755)
    config = write(config_dir / "plugin.yaml", edit("path: /bin/true", "path: ./config/plugin/check.sh"))
    monitor, problems = load(config, cwd=root)
    assert problems == [] and monitor is not None
    assert executable(monitor).argv == (str(tmp_path / expected),)
    assert executable(monitor).cwd == root  # plugins run in NPD's working directory either way
    assert len(monitor.warnings) == (0 if in_cwd or beside_config else 1)


def test_absolute_path_is_kept(tmp_path: Path) -> None:
    monitor, _ = load(write(tmp_path / "plugin.yaml", BASE), cwd=tmp_path)
    assert monitor is not None and executable(monitor).argv == ("/bin/true",)


# --- which rules share an execution, and check names ----------------------------------------------------


def rule(reason: str, path: str = "/bin/true", **extra) -> dict:
    return {"type": "temporary", "reason": reason, "path": path, **extra}


@pytest.mark.parametrize(
    ("rules", "names", "origins"),
    [
        pytest.param(
            [rule("ABad"), rule("BBad")],
            ["p/a-bad"],
            ["rules[0], rules[1]"],
            id="same-command-shared",
        ),
        pytest.param(
            [rule("ABad", args=["-x"]), rule("BBad")],
            ["p/a-bad", "p/b-bad"],
            ["rules[0]", "rules[1]"],
            id="different-args",
        ),
        pytest.param(
            [rule("ABad", timeout="2s"), rule("BBad", timeout="3s")],
            ["p/a-bad", "p/b-bad"],
            ["rules[0]", "rules[1]"],
            id="different-timeouts",
        ),
        pytest.param(
            [rule("ABad", invoke_interval="10s"), rule("BBad")],
            ["p/a-bad", "p/b-bad"],
            ["rules[0]", "rules[1]"],
            id="different-intervals",
        ),
        pytest.param(
            [rule("ABad", timeout="5s"), rule("BBad")],
            ["p/a-bad"],
            ["rules[0], rules[1]"],
            id="explicit-global-timeout-is-the-same",
        ),
        pytest.param(
            [rule("GpuBad", "/bin/true"), rule("GpuBad", "/bin/false"), rule("GpuBad", "/usr/bin/false")],
            ["p/gpu-bad", "p/false", "p/gpu-bad-2"],
            ["rules[0]", "rules[1]", "rules[2]"],
            id="names-made-unique",
        ),
    ],
)
def test_shared_executions_and_names(tmp_path: Path, rules: list[dict], names: list[str], origins: list[str]) -> None:
    doc = {"plugin": "custom", "source": "P", "conditions": [], "rules": rules}
    config = write(tmp_path / "p.json", json.dumps(doc))
    monitor, problems = load(config, cwd=tmp_path)
    assert problems == [] and monitor is not None
    assert [c.name for c in monitor.checks] == names
    assert [c.origin for c in monitor.checks] == [f"{config}: {o}" for o in origins]


def test_permanent_rule_names_the_check(tmp_path: Path) -> None:
    doc = {
        "plugin": "custom",
        "source": "custom-plugin-gpu-xid",
        "conditions": [{"type": "GpuXid", "reason": "GpuXidGood", "message": "GPU XID is ok"}],
        "rules": [rule("XidSeen"), {**rule("GpuXidBad"), "type": "permanent", "condition": "GpuXid"}],
    }
    monitor, _ = load(write(tmp_path / "x.json", json.dumps(doc)), cwd=tmp_path)
    assert monitor is not None and [c.name for c in monitor.checks] == ["custom-plugin-gpu-xid/gpu-xid-bad"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GpuCountBad", "gpu-count-bad"),
        ("NTPIsDown", "ntp-is-down"),
        ("IPTablesVersionsMismatch", "ip-tables-versions-mismatch"),
        ("check_gpu_count", "check-gpu-count"),
        ("custom-plugin-gpu-count", "custom-plugin-gpu-count"),
        ("Kubelet Unhealthy!", "kubelet-unhealthy"),
    ],
)
def test_slug(text: str, expected: str) -> None:
    assert slug(text) == expected
