"""The image, built for real from the Dockerfile as it is, and checked from inside (issue 37 §2).

No container runs on the machines here (docs/benchmarks.md, "The image"), but Debian's ``podman`` builds with
``--isolation=chroot``, and the built image's root can be mounted and entered with ``chroot``:

1. **The base**: a stand-in for the Dockerfile's ``FROM`` image, of the same Debian release, made locally
   with ``mmdebstrap`` (Debian's python3 and pip, the marker that stops pip removed, ``python`` and ``pip``
   linked where the official image has them, and the build host's CA bundle, without which pip inside the
   build cannot reach the registry through a TLS-intercepting proxy), imported under the name the
   Dockerfile asks for. Its own size is not the official image's: what is measured is the size **over**
   it.
2. **The build**: ``podman build --pull=never --isolation=chroot --network=host`` of each target (the
   default image, and the ``journald`` variant).
3. **The sizes**: the layers over the base, unpacked (``podman history``) and compressed (the layers as
   ``podman save --compress`` writes them, as a registry stores them).
4. **The checks**, through the image's mounted root (read-only, as the DaemonSet runs it), as uid 65532
   with the image's own environment and entry point: ``--version``, ``validate-config``, a built-in pack
   found (``simulate`` of a Neuron line), and the relay (as root, reading the host's ``/dev/kmsg``) and the
   agent (as 65532) talking over a socket, the agent answering ``/healthz`` and counting a record the
   relay passed on; only ``/tmp`` and the state dir are writable. The default image has no
   ``journalctl``; the ``journald`` variant has it.

``python bench/run.py image`` prints the figures; tests/deploy/test_image_build.py runs the same steps.
Needs root, ``podman`` and ``mmdebstrap`` (``apt-get install podman mmdebstrap``); :func:`missing` says
what is absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
MIRROR = "http://deb.debian.org/debian"
UID = "65532:65532"
TAG = "localhost/node-health-agent"
# What a build or a check may take here (a 2-core machine, the registries through a proxy).
BUILD_TIMEOUT = 900.0
STEP_TIMEOUT = 120.0
TOOLS = ("podman", "mmdebstrap", "chroot", "unshare", "mount")


class ImageError(RuntimeError):
    """A step of building or checking the image failed; the message names the step and what it printed."""


def missing() -> list[str]:
    """Why the image cannot be built here (empty: it can)."""
    why = [f"{tool} not found (apt-get install podman mmdebstrap)" for tool in TOOLS if shutil.which(tool) is None]
    if os.geteuid() != 0:
        why.append("not root (podman's chroot isolation and image mount need root here)")
    return why


def run(argv: Sequence[str], *, timeout: float = STEP_TIMEOUT, input: str | None = None) -> str:
    """Run one step in a session of its own; past ``timeout`` the whole session is killed (a probe's relay and
    agent too, never left behind to answer the next check's port) and :class:`ImageError` names the step."""
    with subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            raise ImageError(
                f"{' '.join(argv)[:200]} took over {timeout:.0f} s:\n{(stdout + stderr)[-3000:]}"
            ) from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if done.returncode != 0:
        raise ImageError(f"{' '.join(argv)[:200]} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def base_name(dockerfile: Path = DOCKERFILE) -> str:
    """The Dockerfile's first ``FROM`` image, as podman names it (``docker.io/library/python:...``)."""
    (image,) = re.findall(r"^FROM\s+(\S+)\s+AS\s+build\s*$", dockerfile.read_text(), flags=re.MULTILINE)
    image = image.split("@")[0]
    return image if "/" in image else f"docker.io/library/{image}"


def release(image: str) -> str:
    """The Debian release a ``python:...-slim-<release>`` tag names."""
    found = re.search(r"-slim-([a-z]+)$", image)
    if found is None:
        raise ImageError(f"cannot tell the Debian release of the base {image!r} (expected python:<v>-slim-<release>)")
    return found.group(1)


def make_base(image: str, *, workdir: Path, mirror: str = MIRROR) -> None:
    """Make the stand-in base and import it as ``image`` (skipped when podman already has it)."""
    if subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode == 0:
        return
    rootfs = workdir / "base.tar"
    hooks = [
        'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
        'ln -sf /usr/bin/python3 "$1"/usr/local/bin/python',
        'ln -sf /usr/bin/python3 "$1"/usr/local/bin/python3',
        'ln -sf /usr/bin/pip3 "$1"/usr/local/bin/pip',
        'cp /etc/ssl/certs/ca-certificates.crt "$1"/etc/ssl/certs/ca-certificates.crt',
    ]
    run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--include=python3,python3-pip,python3-venv,ca-certificates",
            *[f"--customize-hook={hook}" for hook in hooks],
            "--format=tar",
            release(image),
            str(rootfs),
            mirror,
        ],
        timeout=BUILD_TIMEOUT,
    )
    run(["podman", "import", str(rootfs), image], timeout=BUILD_TIMEOUT)
    rootfs.unlink()


def build(target: str | None, *, context: Path = ROOT) -> str:
    """Build one target of the Dockerfile (None: the default image); returns its tag."""
    tag = f"{TAG}:{target or 'default'}"
    argv = ["podman", "build", "--pull=never", "--isolation=chroot", "--network=host", "-t", tag]
    if target:
        argv += ["--target", target]
    run([*argv, "-f", str(context / "Dockerfile"), str(context)], timeout=BUILD_TIMEOUT)
    return tag


def layer_ids(image: str) -> list[str]:
    """The image's layers (its rootfs diff IDs), base first."""
    inspected = json.loads(run(["podman", "image", "inspect", image]))[0]
    return list(inspected["RootFS"]["Layers"])


def unpacked_over_base(image: str, base: str) -> int:
    """Bytes the image's own layers add, unpacked (``podman history``: each layer's size)."""
    history = json.loads(run(["podman", "history", "--format", "json", image]))
    base_count = len(json.loads(run(["podman", "history", "--format", "json", base])))
    own = history[: len(history) - base_count]  # newest first; the base's entries are the oldest
    return sum(int(entry.get("size", 0)) for entry in own)


def compressed_over_base(image: str, base: str, *, workdir: Path) -> int:
    """Bytes the image's own layers take compressed, as ``podman save --compress`` (and a registry) stores them."""
    out = workdir / "oci"
    shutil.rmtree(out, ignore_errors=True)
    run(["podman", "save", "--compress", "--format", "docker-dir", "-o", str(out), image], timeout=BUILD_TIMEOUT)
    manifest = json.loads((out / "manifest.json").read_text())
    sizes = [int(layer["size"]) for layer in manifest["layers"]]
    shutil.rmtree(out, ignore_errors=True)
    base_layers = len(layer_ids(base))
    return sum(sizes[base_layers:])


@dataclass(frozen=True, kw_only=True)
class Config:
    """What the image says of how it runs."""

    env: tuple[str, ...]
    entrypoint: tuple[str, ...]
    user: str


def config(image: str) -> Config:
    got = json.loads(run(["podman", "image", "inspect", image]))[0]["Config"]
    return Config(
        env=tuple(got.get("Env") or ()), entrypoint=tuple(got.get("Entrypoint") or ()), user=got.get("User", "")
    )


@contextlib.contextmanager
def mounted(image: str) -> Iterator[Path]:
    root = Path(run(["podman", "image", "mount", image]).strip())
    try:
        yield root
    finally:
        subprocess.run(["podman", "image", "unmount", image], capture_output=True)


# Runs in a private mount namespace (unshare): the image's root made read-only, with /tmp (the
# DaemonSet's emptyDirs, and here the state dir) the only writable place, the host's /dev/kmsg and
# /dev/null bound in. Then each step enters the root with chroot, with the image's environment and entry
# point: the agent as the image's user, the relay as root (the DaemonSet's privileged container).
PROBE = r"""
set -u
root=$1 tmp=$2 port=$3 entry=$4; shift 4
relay= agent=
# The relay and the agent are the chroot processes themselves ($! of a plain command, which execs), so
# they can be stopped; whatever way this script ends, they end with it.
trap 'kill $agent $relay 2>/dev/null; wait 2>/dev/null' EXIT
mount --bind "$root" "$root" && mount -o remount,bind,ro "$root"
mount --bind "$tmp" "$root/tmp"
mount -t proc proc "$root/proc"
mount -t tmpfs -o size=1m,mode=755 dev "$root/dev"
touch "$root/dev/kmsg" "$root/dev/null" && chmod 666 "$root/dev/null"
mount --bind /dev/kmsg "$root/dev/kmsg" && mount --bind /dev/null "$root/dev/null"
fail() { echo "FAILED: $*"; exit 1; }
# The image's environment (and HOME=/tmp), one variable per line in $tmp/env, as the arguments of env -i.
set -- ; while IFS= read -r v; do set -- "$@" "$v"; done < "$tmp/env"
u() { chroot --userspec=65532:65532 "$root" env -i "$@"; }
VERSION=$(u "$@" $entry --version) || fail "--version"
echo "VERSION=$VERSION"
u "$@" $entry validate-config > "$tmp/validate.out" 2>&1 || { cat "$tmp/validate.out"; fail validate-config; }
echo 'NEURON_HW_ERR=DMA_ERROR nd-id=0 nc-id=1' > "$tmp/line"
u "$@" $entry simulate --pack neuron /tmp/line > "$tmp/simulate.out" 2>&1
grep -q '"reason": "NeuronHasError_DMA_ERROR"' "$tmp/simulate.out" \
    || { cat "$tmp/simulate.out"; fail "the built-in neuron pack"; }
if chroot "$root" sh -c 'touch /opt/node-health-agent/x || touch /x' 2>/dev/null; then fail "the root is writable"; fi
if u "$@" sh -c 'command -v journalctl' > /dev/null; then echo JOURNALCTL=yes; else echo JOURNALCTL=no; fi
mkdir -p "$tmp/run" "$tmp/state" && chown 65532:65532 "$tmp/run" "$tmp/state"
chroot "$root" env -i "$@" $entry kmsg-relay --socket /tmp/run/kmsg.sock --kmsg-path /dev/kmsg \
    --client-uid 65532 > "$tmp/relay.out" 2>&1 &
relay=$!
chroot --userspec=65532:65532 "$root" env -i "$@" $entry run --standalone --kmsg-relay /tmp/run/kmsg.sock \
    --state-dir /tmp/state --listen "127.0.0.1:$port" > "$tmp/agent.out" 2>&1 &
agent=$!
ok=no
for _ in $(seq 1 120); do
    # This agent answers, not another process on the port: it must still be running when it does.
    kill -0 $agent 2>/dev/null && kill -0 $relay 2>/dev/null || break
    if PORT=$port python3 - <<'PY' 2>/dev/null
import os, sys, urllib.request as u
url = f"http://127.0.0.1:{os.environ['PORT']}"
u.urlopen(f"{url}/healthz", timeout=2)
text = u.urlopen(f"{url}/metrics", timeout=5).read().decode()
read = [float(l.split()[-1]) for l in text.splitlines() if l.startswith("node_health_agent_kmsg_records_read_total ")]
sys.exit(0 if read and read[0] > 0 else 1)
PY
    then kill -0 $agent 2>/dev/null && ok=yes; break; fi
    sleep 1
done
kill $agent $relay 2>/dev/null; wait $agent $relay 2>/dev/null; agent= relay=
[ $ok = yes ] || { echo relay:; cat "$tmp/relay.out"; echo agent:; cat "$tmp/agent.out"; fail "relay and agent"; }
if grep -q "Read-only file system" "$tmp/agent.out" "$tmp/relay.out"; then
    cat "$tmp/agent.out" "$tmp/relay.out"; fail "a write outside /tmp and the state dir"
fi
echo RESULT=ok
"""


@dataclass(frozen=True, kw_only=True)
class Checked:
    """What the checks found inside one image."""

    version: str
    has_journalctl: bool


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check(image: str, *, workdir: Path) -> Checked:
    """The checks of the module docstring, in the image's read-only root; raises :class:`ImageError`."""
    cfg = config(image)
    if cfg.user != UID:
        raise ImageError(f"{image} runs as {cfg.user!r}, not the non-root {UID} the DaemonSet expects")
    tmp = Path(tempfile.mkdtemp(prefix="image-tmp-", dir=workdir))
    os.chmod(tmp, 0o1777)
    (tmp / "env").write_text("".join(f"{e}\n" for e in (*cfg.env, "HOME=/tmp")))
    script = workdir / "probe.sh"
    script.write_text(PROBE)
    with mounted(image) as root:
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            str(script),
            str(root),
            str(tmp),
            str(_free_port()),
        ]
        out = run([*argv, " ".join(cfg.entrypoint)], timeout=STEP_TIMEOUT * 2)
    found = dict(line.split("=", 1) for line in out.splitlines() if re.match(r"^[A-Z]+=", line))
    if found.get("RESULT") != "ok":
        raise ImageError(f"the checks inside {image} failed:\n{out[-3000:]}")
    return Checked(version=found.get("VERSION", ""), has_journalctl=found.get("JOURNALCTL") == "yes")


@dataclass(frozen=True, kw_only=True)
class Built:
    """One target built and measured."""

    target: str
    tag: str
    unpacked_over_base: int
    compressed_over_base: int
    build_s: float
    checked: Checked


def build_and_check(targets: Sequence[str | None] = (None, "journald"), *, workdir: Path | None = None) -> list[Built]:
    """Make the base, build each target, measure and check it."""
    why = missing()
    if why:
        raise ImageError("cannot build the image here: " + "; ".join(why))
    with tempfile.TemporaryDirectory(prefix="nha-image-", dir=workdir) as scratch:
        work = Path(scratch)
        base = base_name()
        make_base(base, workdir=work)
        out: list[Built] = []
        for target in targets:
            start = time.monotonic()
            tag = build(target)
            took = time.monotonic() - start
            out.append(
                Built(
                    target=target or "default",
                    tag=tag,
                    unpacked_over_base=unpacked_over_base(tag, base),
                    compressed_over_base=compressed_over_base(tag, base, workdir=work),
                    build_s=took,
                    checked=check(tag, workdir=work),
                )
            )
        return out
