"""node-problem-detector filelog and journald monitors: loaded with their own rules, refused with
precise problems when incomplete, and run by the agent (a log file tailed end to end)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent.app.config import load_agent_config
from agent.core.errors import ConfigError
from agent.sources.filelog import FileLogConfig
from agent.sources.journald import JournalConfig

from helpers import http_get, start_standalone_agent, wait_for

# The shapes of NPD's shipped kernel-monitor-filelog.json and systemd/docker monitors (our own rules).
FILELOG = {
    "plugin": "filelog",
    "pluginConfig": {"timestamp": "^.{15}", "message": "kernel: \\[.*\\] (.*)", "timestampFormat": "Jan _2 15:04:05"},
    "logPath": "/var/log/kern.log",
    "lookback": "5m",
    "bufferSize": 10,
    "source": "kernel-monitor",
    "conditions": [{"type": "KernelDeadlock", "reason": "KernelHasNoDeadlock", "message": "kernel has no deadlock"}],
    "rules": [
        {"type": "temporary", "reason": "TaskHung", "pattern": "task \\S+:\\w+ blocked for more than \\w+ seconds\\."},
        {
            "type": "permanent",
            "condition": "KernelDeadlock",
            "reason": "DockerHung",
            "pattern": "task docker:\\w+ blocked for more than \\w+ seconds\\.",
        },
    ],
}
JOURNALD = {
    "plugin": "journald",
    "pluginConfig": {"source": "systemd"},
    "logPath": "/var/log/journal",
    "lookback": "5m",
    "bufferSize": 10,
    "source": "systemd-monitor",
    "metricsReporting": True,
    "conditions": [],
    "rules": [
        {"type": "temporary", "reason": "KubeletStart", "pattern": "Started (Kubernetes kubelet|kubelet.service)."}
    ],
}


def write(tmp: Path, name: str, doc: dict) -> Path:
    path = tmp / name
    path.write_text(json.dumps(doc, indent=2))
    return path


def test_npd_log_monitors_load_with_their_own_rules(tmp_path):
    write(tmp_path, "kernel-monitor-filelog.json", FILELOG)
    write(tmp_path, "systemd-monitor.json", JOURNALD)
    write(tmp_path, "kmsg.yaml", {"rules": [{"type": "temporary", "reason": "Other", "pattern": "other"}]})
    config = load_agent_config([tmp_path])
    assert [r.reason for r in config.rule_set.rules] == ["Other"]  # the kernel log keeps its own rules
    by_name = {m.name: m for m in config.log_monitors}
    assert set(by_name) == {"log:kernel-monitor", "log:systemd-monitor"}
    filelog = by_name["log:kernel-monitor"]
    assert filelog.settings.source == FileLogConfig(
        path="/var/log/kern.log",
        timestamp_regex="^.{15}",
        message_regex="kernel: \\[.*\\] (.*)",
        timestamp_format="Jan _2 15:04:05",
        lookback=300.0,
    )
    assert [r.reason for r in filelog.rule_set.rules] == ["TaskHung", "DockerHung"]
    journal = by_name["log:systemd-monitor"].settings.source
    assert journal == JournalConfig(source="systemd", directory="/var/log/journal", lookback=300.0)
    assert {c.type for c in config.rule_conditions} == {"KernelDeadlock"}


@pytest.mark.parametrize(
    ("doc", "field", "message"),
    [
        ({**FILELOG, "logPath": "kern.log"}, "logPath", "required for plugin filelog: the absolute path"),
        (
            {**FILELOG, "pluginConfig": {**FILELOG["pluginConfig"], "message": "kernel: (a"}},
            "pluginConfig.message",
            "missing )",
        ),
        (
            {**FILELOG, "pluginConfig": {"timestamp": "^.{15}", "message": "(.*)"}},
            "pluginConfig.timestampFormat",
            "required for plugin filelog",
        ),
        ({**JOURNALD, "pluginConfig": {}}, "pluginConfig.source", "required for plugin journald"),
    ],
    ids=["relative-log-path", "bad-message-regex", "no-timestamp-format", "journald-without-source"],
)
def test_incomplete_monitors_are_refused_naming_file_field_and_line(tmp_path, doc, field, message):
    path = write(tmp_path, "monitor.json", doc)
    with pytest.raises(ConfigError) as exc:
        load_agent_config([path])
    [problem] = exc.value.problems
    assert (problem.file, problem.field) == (str(path), field)
    assert message in problem.message and problem.line is not None


def _conditions(base: str) -> list[dict] | None:
    status, body = http_get(f"{base}/conditions")
    return json.loads(body)["conditions"] if status == 200 else None


def test_the_agent_tails_a_log_file_with_the_monitors_rules(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    write(plugins, "kernel-monitor-filelog.json", {**FILELOG, "logPath": str(log)})
    proc, base = start_standalone_agent(tmp_path, plugins=plugins)
    try:
        wait_for(lambda: _conditions(base), timeout=30)
        stamp = time.strftime("%b %e %H:%M:%S", time.localtime())
        # Appended until the source (started at the file's end) has seen it: readiness, not a timer.
        line = f"{stamp} node1 kernel: [ 4312.123456] INFO: task docker:20744 blocked for more than 120 seconds.\n"

        def deadlocked():
            with log.open("a") as f:
                f.write(line)
            conds = _conditions(base) or []
            return next((c for c in conds if c["type"] == "KernelDeadlock" and c["status"] == "True"), None)

        cond = wait_for(deadlocked, timeout=30, interval=0.5)
        assert cond["reason"] == "DockerHung"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert '"reason": "DockerHung"' in out
