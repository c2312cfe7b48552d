"""The validation benchmark end to end (bench/validation.py, bench/validation_active.py): a rebooted node whose
checks fail stays cordoned, one whose checks pass is uncordoned; an active check never starts while a pod
holds its device (and starts once it leaves: measure fails otherwise); a fault on a GPU voids its pass and
only its; 100 nodes due at once never hold more than the 10 % share (and all run: measure fails otherwise).
Only counts and the share are asserted here; the time is the benchmark's (bench/run.py validation)."""

from __future__ import annotations

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # 100 simulated nodes against the test API server


def test_the_validation_figures_meet_their_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.validation import measure

    got = measure()
    assert got["validation.uncordoned_before_pass"] == 0
    assert "validation.pass_to_uncordon_s" in got  # the passing node was uncordoned (measure waits for it)
    assert got["validation.active_started_with_holder"] == 0
    assert got["validation.pass_invalidated_by_fault"] == 1
    assert 0 < got["validation.fleet_max_concurrent_share"] <= 0.10
