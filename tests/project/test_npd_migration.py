"""Moving from node-problem-detector (docs/migrating-from-npd.md): NPD's configuration files given as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent.app.cli import main

from helpers import REPO
from helpers.npd import NPD_KERNEL_MONITOR

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


# --- NPD's kernel-monitor.json / readonly-monitor.json replace the built-in rules of the same reasons ----------

# (type, condition, reason, pattern) of NPD's readonly-monitor.json; its kernel-monitor.json: NPD_KERNEL_MONITOR
NPD_READONLY_RULE = ("permanent", "ReadonlyFilesystem", "FilesystemIsReadOnly", "Remounting filesystem read-only")


def npd_monitor(source: str, rules: list[tuple], conditions: list[tuple[str, str, str]]) -> dict:
    return {
        "plugin": "kmsg",
        "logPath": "/dev/kmsg",
        "lookback": "5m",
        "bufferSize": 10,
        "source": source,
        "metricsReporting": True,
        "conditions": [{"type": t, "reason": r, "message": m} for t, r, m in conditions],
        "rules": [{"type": t, **({"condition": c} if c else {}), "reason": r, "pattern": p} for t, c, r, p in rules],
    }


@pytest.fixture
def npd_kernel_configs(tmp_path) -> list[Path]:
    kernel = tmp_path / "kernel-monitor.json"
    conditions = [
        ("KernelDeadlock", "KernelHasNoDeadlock", "kernel has no deadlock"),
        ("XfsShutdown", "XfsHasNotShutDown", "XFS has not shutdown"),
        ("CperHardwareErrorFatal", "CperHardwareHasNoFatalError", "UEFI CPER has no fatal error"),
    ]
    kernel.write_text(json.dumps(npd_monitor("kernel-monitor", NPD_KERNEL_MONITOR, conditions), indent=2))
    readonly = tmp_path / "readonly-monitor.json"
    ro_condition = [("ReadonlyFilesystem", "FilesystemIsNotReadOnly", "Filesystem is not read-only")]
    readonly.write_text(json.dumps(npd_monitor("readonly-monitor", [NPD_READONLY_RULE], ro_condition), indent=2))
    return [kernel, readonly]


LINES = [
    ("Killed process 4242 (python3) total-vm:1024kB, anon-rss:512kB, file-rss:0kB", "OOMKilling"),
    ("INFO: task docker:1234 blocked for more than 120 seconds.", "DockerHung"),
    ("XFS (nvme1n1): Corruption of in-memory data detected.  Shutting down filesystem", "XfsHasShutdown"),
    ("EXT4-fs (nvme0n1p1): Remounting filesystem read-only", "FilesystemIsReadOnly"),
    ("BUG: unable to handle kernel NULL pointer dereference at 0000000000000008", "KernelOops"),
]


def test_npd_kernel_configs_take_the_place_of_the_built_in_rules_instead_of_doubling(npd_kernel_configs, capsys):
    config_args = [a for path in npd_kernel_configs for a in ("--config", str(path))]
    logfile = npd_kernel_configs[0].parent / "lines.log"
    logfile.write_text("".join(f"{line}\n" for line, _ in LINES))
    assert main(["simulate", "--pack", "kernel", *config_args, str(logfile)]) == 0
    findings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_line: dict[int, list[dict]] = {}
    for f in findings:
        by_line.setdefault(f["line"], []).append(f)
    for number, (line, reason) in enumerate(LINES, start=1):
        got = [(f["rule"], f["reason"]) for f in by_line.get(number, [])]
        reasons = [r for _, r in got]
        assert len(reasons) == len(set(reasons)), f"{line!r} raised a reason twice: {got}"
        (rule,) = [rule for rule, r in got if r == reason]
        assert rule.split(":")[0] in ("kernel-monitor", "readonly-monitor"), f"NPD's own rule answers: {got}"


def test_built_in_rules_of_other_reasons_stay_and_validate_config_names_the_replaced_ones(npd_kernel_configs, capsys):
    assert main(["validate-config", "--pack", "kernel", *map(str, npd_kernel_configs)]) == 0
    out = capsys.readouterr().out
    assert f"note: {npd_kernel_configs[0]} replaces " in out and "kernel/oom-killing" in out
    assert f"note: {npd_kernel_configs[1]} replaces 1 earlier rule(s)" in out and "kernel/readonly-filesystem" in out
    from agent.app.config import load_rule_set
    from agent.core.paths import builtin_plugins_dir

    rule_set = load_rule_set([builtin_plugins_dir() / "kernel", *npd_kernel_configs])
    names = {r.name for r in rule_set.rules}
    assert "kernel/hard-lockup" in names or any(r.reason == "HardLockup" for r in rule_set.rules), "not NPD's: kept"
    assert "kernel/oom-killing" not in names


def test_a_named_rule_of_a_built_in_reason_is_added_beside_it(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "rules:\n  - {name: site/oom, type: temporary, reason: OOMKilling, pattern: 'site oom: killed \\d+'}\n"
    )
    from agent.app.config import load_rule_set
    from agent.core.paths import builtin_plugins_dir

    names = {r.name for r in load_rule_set([builtin_plugins_dir() / "kernel", mine]).rules}
    assert {"site/oom", "kernel/oom-killing"} <= names


# --- NPD's helper binaries: refused with what to use instead ------------------------------------------------


@pytest.mark.parametrize(
    ("program", "args", "says"),
    [
        ("/home/kubernetes/bin/health-checker", ["--component=kubelet"], "the Node's Ready condition"),
        ("/home/kubernetes/bin/health-checker", ["--component=cri", "--enable-repair=true"], "container runtime"),
        ("/home/kubernetes/bin/health-checker", ["--component=kube-proxy"], "/livez"),
        ("/home/kubernetes/bin/log-counter", ["--journald-source=kernel", "--count=3"], "threshold {count:"),
    ],
)
def test_npd_helper_binaries_are_refused_saying_what_to_use_instead(tmp_path, capsys, program, args, says):
    doc = {
        "plugin": "custom",
        "source": "health-checker",
        "conditions": [{"type": "KubeletUnhealthy", "reason": "KubeletIsHealthy", "message": "ok"}],
        "rules": [
            {"type": "permanent", "condition": "KubeletUnhealthy", "reason": "Bad", "path": program, "args": args}
        ],
    }
    config = tmp_path / "helper.json"
    config.write_text(json.dumps(doc, indent=2))
    assert main(["validate-config", "--pack", "kernel", str(config)]) == 2
    err = capsys.readouterr().err
    assert "rules[0].path: node-problem-detector's" in err and "is not shipped with node-health-agent" in err
    assert says in err and "docs/migrating-from-npd.md#" in err


# --- docs/migrating-from-npd.md ----------------------------------------------------------------------------

MIGRATING = REPO / "docs" / "migrating-from-npd.md"
# The JSON files of NPD's config/ directory (kubernetes/node-problem-detector, v1.37.0-alpha.1).
NPD_CONFIGS = {
    "abrt-adaptor.json",
    "custom-plugin-monitor.json",
    "disk-log-message-filelog.json",
    "docker-monitor-counter.json",
    "docker-monitor-filelog.json",
    "docker-monitor.json",
    "exporter/stackdriver-exporter.json",
    "guestosconfig/known-modules.json",
    "health-checker-containerd.json",
    "health-checker-docker.json",
    "health-checker-kubelet.json",
    "iptables-mode-monitor.json",
    "kernel-monitor-counter.json",
    "kernel-monitor-filelog.json",
    "kernel-monitor.json",
    "net-cgroup-system-stats-monitor.json",
    "network-problem-monitor.json",
    "readonly-monitor.json",
    "system-stats-monitor.json",
    "systemd-monitor-counter.json",
    "systemd-monitor.json",
    "windows-containerd-monitor-filelog.json",
    "windows-defender-monitor.json",
    "windows-health-checker-containerd.json",
    "windows-health-checker-docker.json",
    "windows-health-checker-kubelet.json",
    "windows-health-checker-kubeproxy.json",
    "windows-system-stats-monitor.json",
}


def test_the_migration_table_names_each_of_npds_28_configs_once():
    assert len(NPD_CONFIGS) == 28
    rows = [line for line in MIGRATING.read_text().splitlines() if line.startswith("| `")]
    named = [row.split("`")[1] for row in rows if row.split("`")[1].endswith(".json")]
    assert sorted(named) == sorted(NPD_CONFIGS)


def test_every_translation_on_the_migration_page_loads(tmp_path):
    import re

    from agent.app.config import load_agent_config
    from agent.core.paths import builtin_plugins_dir

    blocks = re.findall(r"```yaml\n(.*?)```", MIGRATING.read_text(), flags=re.S)
    assert len(blocks) == 3
    for i, block in enumerate(blocks):
        path = tmp_path / f"translation-{i}.yaml"
        path.write_text(block)
        config = load_agent_config([builtin_plugins_dir() / "kernel", path])
        rules = [*config.rule_set.rules, *(r for m in config.log_monitors for r in m.rule_set.rules)]
        counting = [r for r in rules if r.name.startswith("npd/")]
        assert counting and all(r.threshold is not None for r in counting), block


# --- the AWS Neuron problem detector (what trn2 fleets run today) ---------------------------------------------
# A reconstruction of its shape, written here from the documented facts (kmsg plugin, one NeuronHealth
# condition, permanent rules whose patterns need a space on both sides of the NEURON_HW_ERR token), not a copy.

NEURON_ERROR_TYPES = ("SRAM_UNCORRECTABLE_ERROR", "NC_UNCORRECTABLE_ERROR", "HBM_UNCORRECTABLE_ERROR", "DMA_ERROR")


def neuron_npd_monitor() -> dict:
    return npd_monitor(
        "kernel-monitor",
        [("permanent", "NeuronHealth", f"NeuronHasError_{t}", f".* NEURON_HW_ERR={t} .*") for t in NEURON_ERROR_TYPES],
        [("NeuronHealth", "NeuronHasNoError", "Neuron has no error")],
    )


def neuron_line(error: str, device: int) -> str:
    return (
        f"neuron: NEURON_HW_ERR={error} instance-id=i-0123456789abcdef0 hostname=ip-10-1-2-3 "
        f"nd-id={device} nc-id={device + 1} serial-num=5e1a action=TERMINATE_INSTANCE"
    )


def test_the_neuron_detectors_rules_beside_the_neuron_pack_raise_each_problem_once(tmp_path, capsys):
    monitor = tmp_path / "kernel-monitor.json"
    monitor.write_text(json.dumps(neuron_npd_monitor(), indent=2))
    logfile = tmp_path / "lines.log"
    logfile.write_text("".join(f"{neuron_line(t, i)}\n" for i, t in enumerate(NEURON_ERROR_TYPES)))
    assert main(["simulate", "--pack", "kernel,neuron", "--config", str(monitor), str(logfile)]) == 0
    findings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = sorted((f["line"], f["reason"], f["rule"]) for f in findings)
    assert got == [(i, f"NeuronHasError_{t}", "neuron/hw-error") for i, t in enumerate(NEURON_ERROR_TYPES, start=1)]
    # The built-in rule keeps what the detector's patterns have no room for: the device and core.
    assert [(f["fields"]["nd_id"], f["fields"]["nc_id"]) for f in findings] == [(i, i + 1) for i in range(4)]
    assert main(["validate-config", "--pack", "kernel,neuron", str(monitor)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "is not loaded" in line]
    assert len(notes) == len(NEURON_ERROR_TYPES) and all("neuron/hw-error" in n for n in notes), notes


def test_without_the_neuron_pack_the_detectors_rules_are_loaded_as_they_are(tmp_path, capsys):
    monitor = tmp_path / "kernel-monitor.json"
    monitor.write_text(json.dumps(neuron_npd_monitor(), indent=2))
    logfile = tmp_path / "lines.log"
    logfile.write_text(neuron_line("DMA_ERROR", 0) + "\n")
    assert main(["simulate", "--pack", "kernel", "--config", str(monitor), str(logfile)]) == 0
    (finding,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert finding["reason"] == "NeuronHasError_DMA_ERROR" and finding["rule"].startswith("kernel-monitor")


def test_the_detectors_configmap_as_it_is_is_refused_saying_to_extract_its_data_key(tmp_path, capsys):
    configmap = tmp_path / "npd-config.yaml"
    configmap.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "node-problem-detector-config", "namespace": "neuron-healthcheck-system"},
                "data": {"kernel-monitor.json": json.dumps(neuron_npd_monitor(), indent=2)},
            }
        )
    )
    assert main(["validate-config", str(configmap)]) == 2
    err = capsys.readouterr().err
    line = 1 + configmap.read_text().splitlines().index("kind: ConfigMap")
    assert f"{configmap}:{line}: kind: is a Kubernetes ConfigMap" in err, err
    assert "kernel-monitor.json" in err and "jsonpath='{.data.kernel-monitor\\.json}'" in err
    assert "unknown key" not in err
