"""bench/npd_side.py and the /dev/kmsg feeder of ``bench/run.py npd``, without Go or NPD: where NPD's
source and toolchain come from, and what the feeder writes (no network, no /dev/kmsg)."""

from __future__ import annotations

import subprocess

import pytest

from helpers import REPO


@pytest.fixture()
def side(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("NPD_SRC", raising=False)
    from bench import npd_side

    return npd_side


def test_without_a_source_it_says_how_to_give_one(side) -> None:
    assert "--npd-src" in side.source(None) and "NPD_SRC" in side.source(None)


def test_a_directory_that_is_neither_checkout_nor_repository_is_named(side, tmp_path) -> None:
    assert (
        side.source(str(tmp_path))
        == f"{tmp_path}: neither a node-problem-detector checkout (no go.mod) nor a git repository"
    )


def test_a_git_repository_gives_its_head_unpacked_once(side, tmp_path) -> None:
    work = tmp_path / "npd"
    work.mkdir()
    (work / "go.mod").write_text("module k8s.io/node-problem-detector\n\ngo 1.26.5\n")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "add", "go.mod"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "go.mod"], check=True)
    tree = side.source(str(work / ".git"))
    assert (tree / "go.mod").read_text().endswith("go 1.26.5\n")
    assert side.go_release(tree) == (1, 26, 5)
    assert side.source(str(work / ".git")) == tree  # the cache: unpacked once per commit
    assert side.source(str(work)) == work  # a checkout is used in place


def test_the_feeder_writes_each_record_once_without_console_levels_or_dictionaries(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench import run

    writes = run._kmsg_writes(2000)
    assert len(writes) == 2000
    levels = {int(w[1 : w.index(b">")]) & 7 for w in writes}
    assert min(levels) >= 4  # error lines would be printed on the serial console, in the writer
    assert all(w.startswith(b"<") and w.endswith(b"\n") and w.count(b"\n") == 1 for w in writes)
    assert any(run.NPD_OOM.search(w.decode()) for w in writes)  # NPD's finding to wait for is there
