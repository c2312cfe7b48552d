"""The validation benchmark end to end (bench/validation.py): a rebooted node whose checks fail stays
cordoned, and one whose checks pass is uncordoned. Only the count is asserted here; the time is the
benchmark's (bench/run.py validation), never a test's."""

from __future__ import annotations

import pytest

from helpers import REPO


def test_no_rebooted_node_is_uncordoned_before_its_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.validation import measure

    got = measure()
    assert got["validation.uncordoned_before_pass"] == 0
    assert "validation.pass_to_uncordon_s" in got  # the passing node was uncordoned (measure waits for it)
