"""node-problem-detector built from its own source, for ``bench/run.py npd``'s side by side (issue 16).

NPD's source is not in this repository: give a checkout (or a bare git repository, whose ``HEAD`` is
used) with ``--npd-src DIR`` or ``NPD_SRC``. NPD vendors its dependencies (``vendor/``), so it builds
offline; it needs the Go release its ``go.mod`` names (``go 1.26.5`` on master in November 2026).
A ``go`` on ``PATH`` that is new enough is used; otherwise Debian's ``golang-<release>-go`` and
``-src`` packages are fetched from unstable (deb.debian.org, which this machine can reach) and
unpacked (``dpkg-deb -x``) into the cache, ``$XDG_CACHE_HOME/node-health-agent-bench`` (default
``~/.cache``), with the NPD binary built there once per source commit.

Nothing here runs in the tests: a benchmark that cannot build NPD says why and prints our side only.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DEBIAN = "http://deb.debian.org/debian/"
PACKAGES = DEBIAN + "dists/sid/main/binary-amd64/Packages.xz"
# NPD's kernel monitor (its default rule pack for /dev/kmsg), from the source built.
KERNEL_MONITOR = "config/kernel-monitor.json"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "node-health-agent-bench"


def source(given: str | None) -> Path | str:
    """NPD's source tree (a bare repository's HEAD is unpacked into the cache), or why there is none."""
    given = given or os.environ.get("NPD_SRC")
    if not given:
        return "no NPD source: give --npd-src DIR or NPD_SRC (a node-problem-detector checkout or git repository)"
    path = Path(given)
    if (path / "go.mod").is_file():
        return path
    try:
        commit = subprocess.run(
            ["git", "--git-dir", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{path}: neither a node-problem-detector checkout (no go.mod) nor a git repository"
    tree = cache_dir() / f"npd-src-{commit[:12]}"
    if not (tree / "go.mod").is_file():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "--git-dir", str(path), "archive", "HEAD"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def go_release(src: Path) -> tuple[int, ...]:
    """The Go release NPD's go.mod asks for, e.g. (1, 26, 5)."""
    match = re.search(r"^go (\d+(?:\.\d+)+)\s*$", (src / "go.mod").read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"{src / 'go.mod'}: no go directive")
    return tuple(int(part) for part in match.group(1).split("."))


def _go_version(go: Path | str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([str(go), "env", "GOVERSION"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None
    match = re.match(r"go(\d+(?:\.\d+)+)", out.strip())
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def toolchain(need: tuple[int, ...]) -> Path | str:
    """A ``go`` binary of at least ``need``: on PATH, in the cache, or Debian's package fetched now."""
    on_path = shutil.which("go")
    if on_path and (_go_version(on_path) or ()) >= need:
        return Path(on_path)
    release = f"{need[0]}.{need[1]}"
    root = cache_dir() / f"golang-{release}"
    go = root / "usr" / "lib" / f"go-{release}" / "bin" / "go"
    if go.is_file() and (_go_version(go) or ()) >= need:
        return go
    try:
        with urllib.request.urlopen(PACKAGES, timeout=120) as resp:
            index = lzma.decompress(resp.read()).decode("utf-8", "replace")
        files = {}
        for name in (f"golang-{release}-go", f"golang-{release}-src"):
            stanza = re.search(rf"^Package: {re.escape(name)}\n(?:.+\n)*?Filename: (\S+)", index, re.MULTILINE)
            if stanza is None:
                return f"Debian unstable has no {name} (NPD needs Go {'.'.join(map(str, need))})"
            files[name] = stanza.group(1)
        root.mkdir(parents=True, exist_ok=True)
        for filename in files.values():
            deb = root / Path(filename).name
            with urllib.request.urlopen(DEBIAN + filename, timeout=300) as resp:
                deb.write_bytes(resp.read())
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            deb.unlink()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot fetch Go {release} from Debian: {exc}"
    version = _go_version(go)
    if version is None or version < need:
        return f"Debian's golang-{release} is {version}, NPD needs {'.'.join(map(str, need))}"
    return go


def build(src: Path, go: Path) -> Path:
    """NPD's binary, built once per source (its go.mod, go.sum and the commit's files decide the key)."""
    key = hashlib.sha256()
    for name in ("go.mod", "go.sum", "version.txt"):
        if (src / name).is_file():
            key.update((src / name).read_bytes())
    key.update(str(src.resolve()).encode())
    binary = cache_dir() / f"npd-{key.hexdigest()[:12]}" / "node-problem-detector"
    if binary.is_file():
        return binary
    goroot = go.parent.parent
    env = {
        **os.environ,
        "GOROOT": str(goroot),
        "PATH": f"{go.parent}:{os.environ.get('PATH', '')}",
        "GOFLAGS": "-mod=vendor",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "GOCACHE": str(cache_dir() / "gocache"),
    }
    print(f"  building node-problem-detector from {src} with {go} (a few minutes, once)", flush=True)
    subprocess.run([str(go), "build", "-o", str(binary), "./cmd/nodeproblemdetector"], cwd=src, env=env, check=True)
    return binary


def prepare(given: str | None) -> tuple[Path, Path] | str:
    """(NPD binary, its source tree), or why NPD cannot run here."""
    src = source(given)
    if isinstance(src, str):
        return src
    go = toolchain(go_release(src))
    if isinstance(go, str):
        return go
    try:
        return build(src, go), src
    except subprocess.CalledProcessError as exc:
        return f"building node-problem-detector failed: {exc}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary: Path, src: Path) -> tuple[subprocess.Popen[bytes], str]:
    """NPD with its kernel monitor on /dev/kmsg, no Kubernetes exporter, /metrics on a free port; waits
    until /metrics answers. Returns (process, /metrics URL)."""
    port, metrics = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            str(binary),
            f"--config.system-log-monitor={src / KERNEL_MONITOR}",
            "--enable-k8s-exporter=false",
            "--address=127.0.0.1",
            f"--port={port}",
            "--prometheus-address=127.0.0.1",
            f"--prometheus-port={metrics}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{metrics}/metrics"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if b"problem_counter" in resp.read():
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"node-problem-detector did not serve {url} (exit status {proc.poll()})")
        time.sleep(0.2)


if __name__ == "__main__":  # python bench/npd_side.py [SRC]: build (or find) NPD and print its path
    ready = prepare(sys.argv[1] if len(sys.argv) > 1 else None)
    print(ready if isinstance(ready, str) else ready[0])
