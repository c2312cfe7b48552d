"""The operational kustomize components: journald (host journal mounts) and exec-plugin-example (ship an
executable check from a ConfigMap). Each is layered onto an overlay, as docs/deploy.md says to, rendered
with ``kubectl kustomize`` (kubectl 1.33 from tests/helpers/k8stools.py, as tests/deploy/test_manifests.py) and checked.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.app.config import load_agent_config
from agent.core.paths import builtin_plugins_dir

from helpers import REPO
from helpers.k8stools import kube_tools

pytestmark = pytest.mark.slow  # renders with kubectl kustomize

COMPONENTS = REPO / "daemonset" / "components"
OVERLAY = REPO / "daemonset" / "overlays" / "nvidia"
K8S_VERSIONS = ("1.29.0", "1.35.0")
IMAGE = "ghcr.io/node-health-agent/node-health-agent"
PLUGIN_DIR = "/etc/node-health-agent/exec-plugins"


def render(tmp_path: Path, *components: str, images: list[dict[str, str]] | None = None) -> list[dict[str, Any]]:
    kubectl = kube_tools().kubectl
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAY, tmp_path)],
        "components": [os.path.relpath(COMPONENTS / c, tmp_path) for c in components],
    }
    if images is not None:
        kustomization["images"] = images
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    done = subprocess.run([str(kubectl), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    validate = pytest.importorskip("kubernetes_validate")
    for doc in docs:
        for version in K8S_VERSIONS:
            validate.validate(doc, version, strict=True)
    return docs


def daemonsets(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [d for d in docs if d["kind"] == "DaemonSet"]
    assert found
    return found


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod["containers"] if c["name"] == name]
    return found


def test_journald_component_mounts_the_host_journal_read_only_into_the_agent_alone(tmp_path):
    expected = {
        "/var/log/journal": "/var/log/journal",
        "/run/log/journal": "/run/log/journal",
        "/etc/machine-id": "/etc/machine-id",
    }
    for ds in daemonsets(render(tmp_path, "journald")):
        pod = ds["spec"]["template"]["spec"]
        host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
        agent = container(pod, "agent")
        mounts = {m["mountPath"]: m for m in agent["volumeMounts"] if m["mountPath"] in expected}
        assert set(mounts) == set(expected)
        for path, mount in mounts.items():
            assert mount["readOnly"] is True
            assert host[mount["name"]]["path"] == expected[path]
        assert host[mounts["/etc/machine-id"]["name"]]["type"] == "File"
        journal_volumes = {m["name"] for m in mounts.values()}
        for other in [*pod["containers"], *pod.get("initContainers", [])]:
            if other["name"] != "agent":
                assert not journal_volumes & {m["name"] for m in other.get("volumeMounts", [])}, other["name"]
        assert set(pod["securityContext"]["supplementalGroups"]) == {190, 4}
        security = agent["securityContext"]
        assert security["privileged"] is False and security["readOnlyRootFilesystem"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}


def images(docs: list[dict[str, Any]]) -> set[str]:
    pods = [ds["spec"]["template"]["spec"] for ds in daemonsets(docs)]
    return {c["image"] for pod in pods for c in [*pod["containers"], *pod.get("initContainers", [])]}


def test_journald_component_selects_the_image_variant_that_has_journalctl(tmp_path):
    plain, with_journal = tmp_path / "plain", tmp_path / "journald"
    plain.mkdir(), with_journal.mkdir()
    assert images(render(plain)) == {"ghcr.io/node-health-agent/node-health-agent:0.1.0"}
    assert images(render(with_journal, "journald")) == {"ghcr.io/node-health-agent/node-health-agent:0.1.0-journald"}


def test_an_overlay_image_of_its_own_wins_over_the_journald_component(tmp_path):
    docs = render(
        tmp_path, "journald", images=[{"name": IMAGE, "newName": "registry.example/nha", "newTag": "7-journald"}]
    )
    assert images(docs) == {"registry.example/nha:7-journald"}


def test_exec_plugin_component_mounts_its_configmap_executable_and_adds_it_to_the_config(tmp_path):
    docs = render(tmp_path, "exec-plugin-example")
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap" and "exec-plugins" in d["metadata"]["name"]]
    assert set(configmap["data"]) == {"check_clock_sync.py", "clock-sync-monitor.json"}
    for ds in daemonsets(docs):
        pod = ds["spec"]["template"]["spec"]
        assert configmap["metadata"]["namespace"] == ds["metadata"]["namespace"]
        (volume,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == configmap["metadata"]["name"]]
        assert volume["configMap"]["defaultMode"] == 0o755
        agent = container(pod, "agent")
        (mount,) = [m for m in agent["volumeMounts"] if m["name"] == volume["name"]]
        assert (mount["mountPath"], mount["readOnly"]) == (PLUGIN_DIR, True)
        assert {"name": "NHA_CONFIG", "value": PLUGIN_DIR} in agent["env"]
        assert "--config" in agent["args"], "the overlay's own --config files stay"


def test_the_example_exec_plugin_loads_and_speaks_the_protocol(tmp_path):
    component = COMPONENTS / "exec-plugin-example" / "plugins"
    config = load_agent_config([builtin_plugins_dir() / "kernel", component])
    (monitor,) = config.custom_plugins
    (check,) = monitor.checks
    assert check.name == "clock-sync/clock-not-synchronized"
    assert check.check.argv == (f"{PLUGIN_DIR}/check_clock_sync.py",)
    assert [c.type for c in monitor.conditions] == ["ClockUnsynchronized"]
    script = component / "check_clock_sync.py"
    assert os.access(script, os.X_OK)
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # synchronised or not: either is an answer
    assert "the kernel clock is" in done.stdout
