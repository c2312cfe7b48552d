"""The device benchmark end to end (bench/device.py), as a spec of the whole per-device path with every real
part: the agent process as deployed, the test API server's DRA node (ResourceSlice, claims, the device-taint
controller), the real gRPC pod-resources server, the ``clear`` command. Only the counts are asserted here;
the times are the benchmark's (bench/run.py device), never a test's."""

from __future__ import annotations

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # two agent processes, a drain and a clear: about 30 s


def test_one_gpus_fault_moves_only_its_pod_and_a_clear_survives_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.device import measure

    got = measure()
    assert got["device.holder_evictions"] >= 1  # the pod on GPU 3 was moved
    assert got["device.other_pod_evictions"] == 0  # the seven other GPUs' pods were never touched
    assert got["device.refire_after_clear"] == 0  # the cleared records did not come back after the restart
