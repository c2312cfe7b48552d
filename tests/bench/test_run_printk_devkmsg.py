"""bench/run.py's ``_writers_unlimited``: kernel.printk_devkmsg is "on" only while a feed runs, and goes back
even after a run was killed mid-feed (files stand in for the /proc setting here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.run import _writers_unlimited


def paths(tmp_path: Path, *, value: str, left: str | None = None) -> tuple[Path, Path]:
    setting, saved = tmp_path / "printk_devkmsg", tmp_path / "cache" / "printk_devkmsg.saved"
    setting.write_text(f"{value}\n")
    if left is not None:
        saved.parent.mkdir()
        saved.write_text(f"{left}\n")
    return setting, saved


@pytest.mark.parametrize("value", ["ratelimit", "off", "on"])
def test_on_during_the_block_and_as_it_was_after(tmp_path: Path, value: str) -> None:
    setting, saved = paths(tmp_path, value=value)
    with _writers_unlimited(setting=setting, saved=saved):
        assert setting.read_text() == "on\n"
        assert saved.read_text() == f"{value}\n"  # what a killed run leaves for the next one
    assert setting.read_text() == f"{value}\n"
    assert not saved.exists()


def test_put_back_when_the_block_fails(tmp_path: Path) -> None:
    setting, saved = paths(tmp_path, value="ratelimit")
    with pytest.raises(KeyboardInterrupt), _writers_unlimited(setting=setting, saved=saved):
        raise KeyboardInterrupt
    assert setting.read_text() == "ratelimit\n"
    assert not saved.exists()


# (what an interrupted run left saved, the setting after the next run's block, what the next run says)
LEFT = [
    ("ratelimit", "ratelimit", "put back to 'ratelimit'"),
    ("off", "off", "put back to 'off'"),
    ("rm -rf /", "on", "ignoring"),  # not a value the kernel takes: the setting as found is kept
    ("", "on", "ignoring"),
]


@pytest.mark.parametrize(("left", "after", "said"), LEFT)
def test_a_value_left_by_a_killed_run_is_put_back_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], left: str, after: str, said: str
) -> None:
    setting, saved = paths(tmp_path, value="on", left=left)  # killed mid-feed: "on" left in the kernel
    with _writers_unlimited(setting=setting, saved=saved):
        assert setting.read_text() == "on\n"
    assert setting.read_text() == f"{after}\n"
    assert not saved.exists()
    assert said in capsys.readouterr().out
