"""helpers/promtool.py: promtool for the alert tests fails under CI=true when it cannot be had, and skips
elsewhere, saying why (a CI run that skipped the alert tests would prove nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import promtool as helper


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_unavailable_promtool_fails_in_ci_and_skips_elsewhere(
    monkeypatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setattr(helper, "_promtool", lambda: "cannot get promtool: apt-get ... are needed")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="cannot get promtool"):
        helper.promtool()


def test_no_apt_is_a_reason_not_a_crash(monkeypatch) -> None:
    monkeypatch.setattr(helper.shutil, "which", lambda name: None)
    with pytest.raises(helper.Unavailable, match="apt-get, apt-cache and dpkg-deb are needed"):
        helper._fetch()


def test_a_promtool_too_old_for_keep_firing_for_is_not_used(monkeypatch, tmp_path: Path) -> None:
    old = tmp_path / "promtool"
    old.write_text("#!/bin/sh\necho 'promtool, version 2.41.0 (branch: x)'\n")
    old.chmod(0o755)
    assert helper.version_of(old) == (2, 41) < helper.MIN_VERSION


def test_promtool_is_recent_enough() -> None:
    assert helper.version_of(helper.promtool()) >= helper.MIN_VERSION
