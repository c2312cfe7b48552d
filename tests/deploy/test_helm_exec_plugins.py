"""Shipping an executable check with the Helm chart (value ``execPlugins``), and one release per cluster.

``execPlugins.scripts`` and ``execPlugins.monitors`` become the release's own ConfigMap
node-health-agent-exec-plugins, mounted read-only with mode 0755 into every agent at
/etc/node-health-agent/exec-plugins and passed with ``--config``; the pod template's
``checksum/exec-plugins`` rolls the DaemonSets when a script or a declaration changes. The rendered
files are written to a temporary directory as the kubelet would (mode from ``defaultMode``) and the
agent's own CLI loads and runs them.

One release per cluster: ``nha.onePerCluster`` refuses a release when ClusterRole node-health-agent
belongs to another one. ``lookup`` finds nothing under ``helm template``, so the tests call the check
with a recorded ClusterRole through a template added to a copy of the chart; what stays untested
offline is the ``lookup`` call itself (its arguments) against a real API server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.k8srender import CHART, EXAMPLES, IMAGE_SET, NAMESPACE, RELEASE, Obj, helm, helm_template, one, validate

pytestmark = pytest.mark.slow  # renders with helm

EXEC_DIR = "/etc/node-health-agent/exec-plugins"
SCRIPT = '#!/bin/sh\necho "the widget is stuck"\nexit 1\n'


def _monitor(path: str) -> dict[str, Any]:
    return {
        "plugin": "custom",
        "pluginConfig": {"invoke_interval": "60s", "timeout": "10s"},
        "source": "widget",
        "conditions": [{"type": "WidgetStuck", "reason": "WidgetIsFine", "message": "the widget runs"}],
        "rules": [{"type": "permanent", "condition": "WidgetStuck", "reason": "WidgetIsStuck", "path": path}],
    }


def _values(tmp_path: Path, script: str = SCRIPT, path: str = f"{EXEC_DIR}/check_widget.sh") -> Path:
    doc = {"execPlugins": {"scripts": {"check_widget.sh": script}, "monitors": {"widget.json": _monitor(path)}}}
    file = tmp_path / "exec-values.yaml"
    file.write_text(yaml.safe_dump(doc))
    return file


def _daemonsets(docs: list[Obj]) -> list[Obj]:
    return [d for d in docs if d["kind"] == "DaemonSet"]


def _agent(ds: Obj) -> Obj:
    (agent,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    return agent


def _write_volume(docs: list[Obj], ds: Obj, where: Path) -> Path:
    """The exec-plugins volume of ``ds`` as the kubelet writes it: every key a file, with the volume's mode."""
    (volume,) = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "exec-plugins"]
    data = one(docs, "ConfigMap", volume["configMap"]["name"])["data"]
    where.mkdir()
    for name, text in data.items():
        (where / name).write_text(text)
        os.chmod(where / name, volume["configMap"]["defaultMode"])
    return where


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


# ---- execPlugins --------------------------------------------------------------------------------------------------


def test_exec_plugins_become_a_chart_configmap_mounted_executable_in_every_agent(tmp_path: Path) -> None:
    docs = helm_template(EXAMPLES / "mixed.yaml", _values(tmp_path))
    config_map = one(docs, "ConfigMap", "node-health-agent-exec-plugins")
    validate(config_map)
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert config_map["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"  # the release owns it
    assert config_map["data"]["check_widget.sh"] == SCRIPT
    assert json.loads(config_map["data"]["widget.json"]) == _monitor(f"{EXEC_DIR}/check_widget.sh")
    daemonsets = _daemonsets(docs)
    assert sorted(d["metadata"]["name"] for d in daemonsets) == [
        "node-health-agent-generic",
        "node-health-agent-neuron",
        "node-health-agent-nvidia",
    ]
    for ds in daemonsets:
        validate(ds)
        pod = ds["spec"]["template"]["spec"]
        volume = {"name": "exec-plugins", "configMap": {"name": "node-health-agent-exec-plugins", "defaultMode": 0o755}}
        assert volume in pod["volumes"]
        holders = {
            c["name"]: [m for m in c.get("volumeMounts", []) if m["name"] == "exec-plugins"]
            for c in [*pod["initContainers"], *pod["containers"]]
        }
        assert holders == {
            "init-state-dir": [],
            "kmsg-relay": [],
            "agent": [{"name": "exec-plugins", "mountPath": EXEC_DIR, "readOnly": True}],
        }
        args = _agent(ds)["args"]
        assert args[-2:] == ["--config", EXEC_DIR], args


def test_without_exec_plugins_nothing_is_rendered() -> None:
    docs = helm_template(EXAMPLES / "mixed.yaml")
    assert [d for d in docs if d["metadata"]["name"] == "node-health-agent-exec-plugins"] == []
    for ds in _daemonsets(docs):
        assert "checksum/exec-plugins" not in ds["spec"]["template"]["metadata"]["annotations"]
        assert EXEC_DIR not in _agent(ds)["args"]
        assert all(v["name"] != "exec-plugins" for v in ds["spec"]["template"]["spec"]["volumes"])


def test_changing_a_script_rolls_every_agent(tmp_path: Path) -> None:
    def checksums(values: Path) -> dict[str, tuple[str, str]]:
        return {
            d["metadata"]["name"]: (
                d["spec"]["template"]["metadata"]["annotations"]["checksum/exec-plugins"],
                d["spec"]["template"]["metadata"]["annotations"]["checksum/config"],
            )
            for d in _daemonsets(helm_template(EXAMPLES / "mixed.yaml", values))
        }

    before = checksums(_values(tmp_path))
    assert before == checksums(_values(tmp_path)), "the same values render the same checksum"
    script = checksums(_values(tmp_path, script=SCRIPT.replace("stuck", "jammed")))
    monitor = checksums(_values(tmp_path, path=f"{EXEC_DIR}/check_widget_v2.sh"))
    for name, (plugins, config) in before.items():
        assert script[name][0] != plugins and monitor[name][0] != plugins, name
        assert script[name][1] == config, "the rules ConfigMap did not change"


def test_the_agent_loads_the_rendered_declaration(tmp_path: Path) -> None:
    """validate-config and plugins read the rendered files as the agent's --config reads the mount."""
    docs = helm_template(EXAMPLES / "neuron.yaml", _values(tmp_path))
    ds = one(docs, "DaemonSet")
    where = _write_volume(docs, ds, tmp_path / "exec-plugins")
    assert os.stat(where / "check_widget.sh").st_mode & 0o777 == 0o755
    valid = _cli("validate-config", "--pack", "kernel", str(where), cwd=tmp_path)
    assert valid.returncode == 0, valid.stderr
    assert f"file: {where / 'widget.json'} (custom-plugin-monitor)" in valid.stdout
    assert "1 custom plugin checks" in valid.stdout
    # The declaration names the script where the pod mounts it: here it is not there (a warning, not an error).
    assert f"'{EXEC_DIR}/check_widget.sh' does not exist (yet)" in valid.stdout
    listed = _cli("plugins", "--pack", "kernel", "--config", str(where), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "widget/widget-is-stuck every 1m" in listed.stdout


def test_the_rendered_script_runs_as_a_check(tmp_path: Path) -> None:
    """A declaration naming the script relative to itself runs it from the rendered volume (mode 0755)."""
    docs = helm_template(EXAMPLES / "neuron.yaml", _values(tmp_path, path="./check_widget.sh"))
    where = _write_volume(docs, one(docs, "DaemonSet"), tmp_path / "exec-plugins")
    ran = _cli("check", "--pack", "kernel", "--config", str(where), "--json", "widget/widget-is-stuck", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [
        {
            "check": "widget/widget-is-stuck",
            "status": "PROBLEM",
            "condition": "WidgetStuck",
            "reason": "WidgetIsStuck",
            "message": "the widget is stuck",
        }
    ]


def test_the_documented_set_file_install_ships_the_kustomize_example(tmp_path: Path) -> None:
    """docs/checks-exec.md's command: the component's two files, as the kustomize ConfigMap carries them."""
    example = CHART.parents[1] / "components" / "exec-plugin-example" / "plugins"
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", IMAGE_SET]
    args += ["--values", str(EXAMPLES / "neuron.yaml")]
    args += ["--set-file", f"execPlugins.scripts.check_clock_sync\\.py={example / 'check_clock_sync.py'}"]
    args += ["--set-file", f"execPlugins.monitors.clock-sync-monitor\\.json={example / 'clock-sync-monitor.json'}"]
    proc = helm(*args)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    data = one(docs, "ConfigMap", "node-health-agent-exec-plugins")["data"]
    assert data == {p.name: p.read_text() for p in example.iterdir()}
    where = _write_volume(docs, one(docs, "DaemonSet"), tmp_path / "exec-plugins")
    valid = _cli("validate-config", "--pack", "kernel", str(where), cwd=tmp_path)
    assert valid.returncode == 0, valid.stderr
    assert f"'{EXEC_DIR}/check_clock_sync.py' does not exist (yet)" in valid.stdout  # its path in the pod


def test_the_documented_values_file_loads(tmp_path: Path) -> None:
    """docs/checks-exec.md's values example renders and its declaration loads."""
    text = (CHART.parents[2] / "docs" / "checks-exec.md").read_text()
    block = text.split("Or in a values file:\n\n```yaml\n", 1)[1].split("```", 1)[0]
    values = tmp_path / "doc-values.yaml"
    values.write_text(block)
    docs = helm_template(EXAMPLES / "nvidia.yaml", values)
    where = _write_volume(docs, one(docs, "DaemonSet"), tmp_path / "exec-plugins")
    listed = _cli("plugins", "--pack", "kernel", "--config", str(where), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "widget/widget-not-ready every 1m" in listed.stdout, listed.stdout


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"scripts": {"check.sh": SCRIPT}}, "execPlugins.scripts (check.sh) without execPlugins.monitors"),
        ({"scripts": {"check.yaml": SCRIPT}, "monitors": {"m.json": {}}}, "invalid propertyName 'check.yaml'"),
        ({"scripts": {"check.sh": "echo no shebang\n"}, "monitors": {"m.json": {}}}, "/execPlugins/scripts/check.sh"),
        ({"monitors": {"monitor.txt": {}}}, "invalid propertyName 'monitor.txt'"),
        ({"monitors": {"../x.json": {}}}, "invalid propertyName '../x.json'"),
        ({"plugins": {}}, "additional properties 'plugins' not allowed"),
    ],
    ids=["script-without-monitor", "script-named-yaml", "no-shebang", "monitor-not-config", "path", "unknown-key"],
)
def test_bad_exec_plugins_are_refused(values: dict[str, Any], says: str, tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump({"execPlugins": values}))
    proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", IMAGE_SET, "--values", str(file))
    assert proc.returncode != 0, f"accepted {values}"
    assert says in proc.stderr, proc.stderr


# ---- one release per cluster --------------------------------------------------------------------------------------


def _cluster_role(release: str | None, namespace: str | None) -> dict[str, Any]:
    """ClusterRole node-health-agent as the API server returns it (what ``lookup`` hands the template)."""
    annotations = {}
    if release is not None:
        annotations["meta.helm.sh/release-name"] = release
    if namespace is not None:
        annotations["meta.helm.sh/release-namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "node-health-agent", "annotations": annotations},
    }


def _render_with_existing(tmp_path: Path, existing: dict[str, Any], release: str, namespace: str) -> str | None:
    """Render a copy of the chart whose extra template runs the one-release check on ``existing``; stderr or None."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart, symlinks=False)
    found = json.dumps(json.dumps(existing))  # a Go template string literal holding the JSON
    check = '{{- include "nha.onePerCluster" (dict "root" . "existing" (fromJson FOUND)) }}\n'
    (chart / "templates" / "zz-existing.yaml").write_text(check.replace("FOUND", found))
    proc = helm("template", release, str(chart), "--namespace", namespace, "--set", IMAGE_SET)
    return None if proc.returncode == 0 else proc.stderr


@pytest.mark.parametrize(
    ("owner", "owner_namespace", "release", "namespace", "refused"),
    [
        ("node-health-agent", "node-health-agent", "node-health-agent", "node-health-agent", False),  # an upgrade
        (None, None, "second", "other", False),  # not Helm's (kustomize): Helm's own ownership check decides
        ("node-health-agent", "node-health-agent", "second", "node-health-agent", True),
        ("node-health-agent", "node-health-agent", "node-health-agent", "other", True),  # same name, other ns
        ("node-health-agent", "node-health-agent", "second", "other", True),
    ],
)
def test_a_second_release_refuses_naming_the_first(
    owner: str | None, owner_namespace: str | None, release: str, namespace: str, refused: bool, tmp_path: Path
) -> None:
    stderr = _render_with_existing(tmp_path, _cluster_role(owner, owner_namespace), release, namespace)
    if not refused:
        assert stderr is None, stderr
        return
    assert stderr is not None, "a second release was accepted"
    assert f'already installed in this cluster by Helm release "{owner}" in namespace "{owner_namespace}"' in stderr, (
        stderr
    )
    assert "install the chart once per cluster" in stderr
    assert f"helm uninstall {owner} --namespace {owner_namespace}" in stderr


def test_the_cluster_role_template_runs_the_check_on_what_lookup_finds() -> None:
    """Wiring: rbac.yaml hands the check the cluster's ClusterRole node-health-agent (lookup: empty offline)."""
    text = (CHART / "templates" / "rbac.yaml").read_text()
    assert (
        '{{- include "nha.onePerCluster" (dict "root" . "existing" '
        '(lookup "rbac.authorization.k8s.io/v1" "ClusterRole" "" "node-health-agent")) }}'
    ) in text
    docs = helm_template()  # offline: lookup finds nothing, the release renders
    assert one(docs, "ClusterRole", "node-health-agent")
