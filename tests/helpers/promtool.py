"""Real ``promtool`` for the alert tests, taken from the distribution's ``prometheus`` package into ``.cache/``.

Debian and Ubuntu ship Prometheus (Debian 12: 2.42, Ubuntu 24.04: 2.45) with ``promtool``. Without a system
install: ``apt-get download prometheus`` fetches the package (apt checks its signature), ``dpkg-deb -x``
unpacks it, and ``usr/bin/promtool`` is copied to ``<repo>/.cache/promtool/<version>/`` (git-ignored),
reused by later runs. When apt has no candidate (empty package lists), ``apt-get update`` runs first if
this process is root (as in CI). A ``promtool`` on PATH is used instead when it is MIN_VERSION or later.

When promtool cannot be had, the tests fail under ``CI=true`` (a CI run that skipped them would prove
nothing) and skip elsewhere, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest

from helpers.k8stools import _in_ci

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "promtool"
MIN_VERSION = (2, 42)  # keep_firing_for (the rules use it) came with Prometheus 2.42


class Unavailable(Exception):
    """Why promtool could not be had."""


def version_of(promtool: Path) -> tuple[int, int]:
    out = subprocess.run([str(promtool), "--version"], capture_output=True, text=True, timeout=60)
    match = re.search(r"version (\d+)\.(\d+)", out.stdout + out.stderr)
    if out.returncode != 0 or match is None:
        raise Unavailable(f"{promtool} --version failed (exit {out.returncode}): {out.stderr.strip()}")
    return int(match.group(1)), int(match.group(2))


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd)


def _candidate(apt_cache: str) -> str:
    proc = subprocess.run([apt_cache, "policy", "prometheus"], capture_output=True, text=True, timeout=60)
    match = re.search(r"Candidate:\s*(\S+)", proc.stdout)
    return "" if match is None or match.group(1) == "(none)" else match.group(1)


def _fetch() -> Path:
    """``apt-get download`` the package and unpack its promtool under CACHE/<version>/ (atomically)."""
    apt_get, apt_cache, dpkg_deb = (shutil.which(t) for t in ("apt-get", "apt-cache", "dpkg-deb"))
    if apt_get is None or apt_cache is None or dpkg_deb is None:
        raise Unavailable("apt-get, apt-cache and dpkg-deb are needed (a Debian or Ubuntu machine)")
    version = _candidate(apt_cache)
    if not version and os.geteuid() == 0:
        update = _run([apt_get, "update", "-qq"], REPO)
        if update.returncode != 0:
            raise Unavailable(f"apt-get update failed (exit {update.returncode}): {update.stderr.strip()}")
        version = _candidate(apt_cache)
    if not version:
        raise Unavailable("apt has no candidate for package prometheus (run apt-get update as root)")
    dest = CACHE / re.sub(r"[^\w.+-]", "_", version)
    if (dest / "promtool").is_file():
        return dest / "promtool"
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # apt's _apt user writes the download here
        proc = _run([apt_get, "download", "-qq", f"prometheus={version}"], work)
        debs = list(work.glob("prometheus_*.deb"))
        if proc.returncode != 0 or len(debs) != 1:
            raise Unavailable(f"apt-get download prometheus={version} failed (exit {proc.returncode}): {proc.stderr}")
        unpacked = _run([dpkg_deb, "-x", str(debs[0]), str(work / "root")], work)
        if unpacked.returncode != 0 or not (work / "root/usr/bin/promtool").is_file():
            raise Unavailable(f"dpkg-deb -x {debs[0].name} gave no usr/bin/promtool: {unpacked.stderr.strip()}")
        out = work / "out"
        out.mkdir()
        shutil.copy2(work / "root/usr/bin/promtool", out / "promtool")
        try:
            out.rename(dest)
        except OSError:
            if not (dest / "promtool").is_file():  # another test session won the race: use its copy
                raise
    return dest / "promtool"


@cache
def _promtool() -> Path | str:
    """promtool, or why not (computed once per test session)."""
    try:
        found = shutil.which("promtool")
        path = Path(found) if found and version_of(Path(found)) >= MIN_VERSION else _fetch()
        version = version_of(path)
        if version < MIN_VERSION:
            want = ".".join(map(str, MIN_VERSION))
            raise Unavailable(f"{path} is Prometheus {version[0]}.{version[1]}; the rules need {want} or later")
    except (Unavailable, OSError, subprocess.SubprocessError) as exc:
        return f"cannot get promtool (Debian/Ubuntu package prometheus): {exc}"
    return path


def promtool() -> Path:
    """promtool; fails under CI=true when it cannot be had, skips elsewhere."""
    path = _promtool()
    if isinstance(path, str):
        if _in_ci():
            pytest.fail(path, pytrace=False)
        pytest.skip(path)
    return path
