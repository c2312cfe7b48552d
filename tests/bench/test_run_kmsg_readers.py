"""bench/run.py's ``_kmsg_readers``: the other processes reading /dev/kmsg beside a run, from /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.run import _kmsg_readers

from helpers import kmsg_problem

# pid -> (name, what its descriptors point at); None: no fd directory to look into (gone, or not ours to see)
PROCESSES: dict[int, tuple[str, list[str] | None]] = {
    1: ("systemd-journal", ["/dev/null", "/dev/kmsg"]),
    2: ("bash", ["/dev/pts/0", "/dev/null"]),
    7: ("this bench", ["/dev/kmsg"]),  # excluded: the run itself
    9: ("vanished", None),
    10: ("python3", ["/dev/kmsg", "/dev/kmsg"]),  # listed once
}


def fake_proc(root: Path) -> Path:
    for pid, (name, targets) in PROCESSES.items():
        entry = root / str(pid)
        entry.mkdir()
        (entry / "comm").write_text(f"{name}\n")
        if targets is not None:
            (entry / "fd").mkdir()
            for fd, target in enumerate(targets):
                os.symlink(target, entry / "fd" / str(fd))
    (root / "self").mkdir()  # not a process number
    return root


def test_other_readers_are_named_in_process_order(tmp_path: Path) -> None:
    assert _kmsg_readers(fake_proc(tmp_path), exclude=7) == ["1 (systemd-journal)", "10 (python3)"]


def test_this_process_is_excluded_only_when_named(tmp_path: Path) -> None:
    assert _kmsg_readers(fake_proc(tmp_path)) == ["1 (systemd-journal)", "7 (this bench)", "10 (python3)"]


@pytest.mark.skipif(kmsg_problem() is not None, reason=kmsg_problem() or "")
def test_a_process_holding_the_real_dev_kmsg_is_found_in_the_real_proc() -> None:
    mine = f"{os.getpid()} ("
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert any(reader.startswith(mine) for reader in _kmsg_readers())
        assert not any(reader.startswith(mine) for reader in _kmsg_readers(exclude=os.getpid()))
    finally:
        os.close(fd)
