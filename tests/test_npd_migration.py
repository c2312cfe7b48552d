"""Moving from node-problem-detector (docs/migrating-from-npd.md): NPD's configuration files given as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main

# --- Windows paths: every config kind refuses them the same way -----------------------------------------

WINDOWS_MESSAGE = "is a Windows path: node-health-agent runs on Linux nodes only"


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        pytest.param(
            {
                "plugin": "filelog",
                "pluginConfig": {"timestamp": '^time="(\\S*)"', "message": 'msg="?([^\\n]*)"?', "timestampFormat": "x"},
                "logPath": "C:\\etc\\kubernetes\\logs\\containerd.log",
                "source": "containerd",
                "rules": [],
            },
            "logPath",
            id="filelog-logPath",
        ),
        pytest.param(
            {
                "plugin": "journald",
                "pluginConfig": {"source": "kubelet"},
                "logPath": "C:\\var\\log\\journal",
                "source": "kubelet",
                "rules": [],
            },
            "logPath",
            id="journald-logPath",
        ),
        pytest.param(
            {
                "plugin": "custom",
                "source": "windows-defender-custom-plugin-monitor",
                "rules": [
                    {
                        "type": "temporary",
                        "reason": "WindowsDefenderThreatsDetected",
                        "path": "C:\\etc\\kubernetes\\node-problem-detector\\plugin\\windows_defender_problem.ps1",
                    }
                ],
            },
            "rules[0].path",
            id="custom-plugin-path",
        ),
    ],
)
def test_windows_paths_are_refused_alike_in_every_config_kind(tmp_path, capsys, doc, field):
    config = tmp_path / "windows.json"
    config.write_text(json.dumps(doc, indent=2))
    assert main(["validate-config", "--pack", "kernel", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{field}: " in err and WINDOWS_MESSAGE in err, err


# --- relative plugin paths resolve as NPD resolves them ---------------------------------------------------

NTP_MONITOR = {  # NPD's config/custom-plugin-monitor.json, as shipped
    "plugin": "custom",
    "pluginConfig": {"invoke_interval": "30s", "timeout": "5s", "max_output_length": 80, "concurrency": 3},
    "source": "ntp-custom-plugin-monitor",
    "metricsReporting": True,
    "conditions": [{"type": "NTPProblem", "reason": "NTPIsUp", "message": "ntp service is up"}],
    "rules": [
        {"type": "temporary", "reason": "NTPIsDown", "path": "./config/plugin/check_ntp.sh", "timeout": "3s"},
        {
            "type": "permanent",
            "condition": "NTPProblem",
            "reason": "NTPIsDown",
            "path": "./config/plugin/check_ntp.sh",
            "timeout": "3s",
        },
    ],
}


def npd_checkout(root: Path) -> Path:
    """NPD's layout: config/*.json beside config/plugin/*.sh; plugins name themselves ./config/plugin/..."""
    plugin = root / "config" / "plugin" / "check_ntp.sh"
    plugin.parent.mkdir(parents=True)
    plugin.write_text('#!/bin/sh\n[ -x ./config/plugin/check_ntp.sh ] || exit 2\necho "runs where NPD would"\n')
    plugin.chmod(0o755)
    config = root / "config" / "custom-plugin-monitor.json"
    config.write_text(json.dumps(NTP_MONITOR))
    return config


def test_relative_plugin_paths_resolve_against_the_working_directory_as_in_npd(tmp_path, capsys, monkeypatch):
    """NPD execs ``./config/plugin/check_ntp.sh`` relative to its working directory (``/`` in its image, the
    checkout when run from one); a plugin runs in that directory too."""
    npd_checkout(tmp_path / "npd")
    monkeypatch.chdir(tmp_path / "npd")
    argv = ["check", "--json", "--pack", "kernel", "--state-dir", str(tmp_path / "s")]
    assert main([*argv, "--config", "config/custom-plugin-monitor.json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["status"], r["condition"]) for r in rows] == [("OK", None), ("OK", "NTPProblem")], rows
    assert rows[0]["message"] == "runs where NPD would"
