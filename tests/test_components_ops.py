"""The operational kustomize components: journald (host journal mounts) and exec-plugin-example (ship an
executable check from a ConfigMap). Each is layered onto an overlay, as docs/deploy.md says to, rendered
with ``kubectl kustomize`` (skipped when kubectl is not on PATH, as tests/test_manifests.py) and checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = REPO / "daemonset" / "components"
OVERLAY = REPO / "daemonset" / "overlays" / "nvidia"
KUBECTL = shutil.which("kubectl")
K8S_VERSIONS = ("1.29.0", "1.35.0")


def render(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl (with built-in kustomize) is not on PATH: cannot render the components")
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(OVERLAY, tmp_path)],
                "components": [os.path.relpath(COMPONENTS / c, tmp_path) for c in components],
            }
        )
    )
    done = subprocess.run([KUBECTL, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
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
