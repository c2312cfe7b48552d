"""Moving from node-problem-detector (docs/migrating-from-npd.md): NPD's configuration files given as they are."""

from __future__ import annotations

import json

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
