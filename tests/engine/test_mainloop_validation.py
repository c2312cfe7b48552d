"""Validation through the main loop: an active check's pass, a kernel fault on its GPU voiding it at once
(`validation.pass_invalidated_by_fault`), requests opened and closed from the inbox, and `/conditions`."""

from __future__ import annotations

from pathlib import Path

from agent.app.config import load_rule_set
from agent.checks.active import records_of
from agent.checks.model import ActiveSpec, CheckReport, CheckResult, CheckStatus
from agent.core.bus import RecordBatch, SeedConditions
from agent.core.validation import (
    VALIDATIONS_ANNOTATION,
    ValidationRequest,
    ValidationWithdrawn,
    Verdict,
    records_text,
)
from agent.sinks.stdout import snapshot_json
from agent.sources.nodeseed import node_validations

from helpers.mainloop import Loop, record

PACK = """
source: nvidia-monitor
conditions:
  - {type: GpuXid, reason: GpuXidGood, message: GPU XID is ok}
rules:
  - name: nvidia/xid
    type: permanent
    condition: GpuXid
    reason: 'GpuXid{xid}'
    severity: critical
    pattern: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-fA-F:.]+)\\): (?P<xid>\\d+),.*'
    device: {kind: gpu, field: pci}
"""
GPU0, GPU1 = "gpu:0000:3b:00.0", "gpu:0000:5d:00.0"


def loop_of(tmp_path: Path) -> Loop:
    pack = tmp_path / "pack.yaml"
    pack.write_text(PACK, encoding="utf-8")
    state = tmp_path / "state"
    state.mkdir()
    return Loop(load_rule_set([pack]), state)


def diag_report(at: float, *devices: str, status: CheckStatus = CheckStatus.OK) -> CheckReport:
    return CheckReport(
        check="dcgm-diag",
        results=tuple(
            CheckResult(status=status, condition=None, reason="DiagPassed", message="level 2", devices=(d,))
            for d in devices
        ),
        finished_at=at,
        duration=120.0,
        active=ActiveSpec(devices="gpu", valid_for=86400.0),
    )


def validations(loop: Loop) -> dict[tuple[str, ...], tuple[Verdict, bool]]:
    now = loop.clock.now
    return {r.devices: (r.verdict, r.valid(now)) for r in loop.feed.latest().snapshot.validations}


def test_a_pass_then_a_kernel_fault_on_that_gpu_voids_it_at_once_and_the_other_gpu_keeps_its_pass(tmp_path):
    loop = loop_of(tmp_path)
    t0 = loop.clock.now
    loop.put(diag_report(t0, GPU0, GPU1))
    loop.step()
    assert validations(loop) == {(GPU0,): (Verdict.PASS, True), (GPU1,): (Verdict.PASS, True)}
    loop.put(RecordBatch(records=[record(1, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", ts=t0)]))
    loop.step()
    assert validations(loop) == {(GPU0,): (Verdict.PASS, False), (GPU1,): (Verdict.PASS, True)}
    doc = snapshot_json(loop.feed.latest().snapshot)
    voided = next(v for v in doc["validations"] if v["devices"] == [GPU0])
    assert (voided["valid"], voided["invalidatedBy"]) == (False, f"GpuXid/GpuXid79 on {GPU0}")


def test_requests_come_through_the_inbox_and_close_when_answered_or_withdrawn(tmp_path):
    loop = loop_of(tmp_path)
    t0 = loop.clock.now
    loop.put(ValidationRequest(id="inc-1/1", checks=("dcgm-diag",), devices=(GPU0,), requested_at=t0))
    loop.put(ValidationRequest(id="inc-2/1", checks=("nccl-loopback",), requested_at=t0))
    loop.step()
    assert [q.id for q in loop.feed.latest().snapshot.validation_requests] == ["inc-1/1", "inc-2/1"]
    assert [q["id"] for q in snapshot_json(loop.feed.latest().snapshot)["validationRequests"]] == ["inc-1/1", "inc-2/1"]
    loop.put(diag_report(t0 + 200, GPU0, status=CheckStatus.PROBLEM))  # a fail answers the request too
    loop.put(ValidationWithdrawn(id="inc-2/1"))
    loop.step()
    assert loop.feed.latest().snapshot.validation_requests == ()
    assert validations(loop) == {(GPU0,): (Verdict.FAIL, False)}


def test_a_passive_checks_report_leaves_no_validation_record(tmp_path):
    loop = loop_of(tmp_path)
    loop.put(CheckReport(check="gpu-count", results=(), finished_at=loop.clock.now, duration=1.0))
    loop.step()
    assert loop.feed.latest().snapshot.validations == ()


def test_a_skip_is_no_verdict_and_no_record(tmp_path):
    loop = loop_of(tmp_path)
    t0 = loop.clock.now
    loop.put(ValidationRequest(id="r", checks=("dcgm-diag",), requested_at=t0))
    skip = CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason="DeviceBusy", message="held by ml/train-0")
    loop.put(
        CheckReport(
            check="dcgm-diag", results=(skip,), finished_at=t0 + 1, duration=0.0, active=ActiveSpec(devices="gpu"),
            skipped=True,
        )
    )  # fmt: skip
    loop.step()
    snapshot = loop.feed.latest().snapshot
    assert snapshot.validations == () and [q.id for q in snapshot.validation_requests] == ["r"]  # still open


def test_the_nodes_records_are_restored_at_start_from_its_annotation(tmp_path):
    loop = loop_of(tmp_path)
    text = records_text(records_of(diag_report(loop.clock.now - 3600, GPU0)))
    node = {"metadata": {"name": "n", "annotations": {VALIDATIONS_ANNOTATION: text}}}
    loop.put(SeedConditions(conditions=(), node_uid="u", validations=node_validations(node)))
    loop.step()
    assert validations(loop) == {(GPU0,): (Verdict.PASS, True)}
    assert node_validations({"metadata": {"annotations": {VALIDATIONS_ANNOTATION: "{oops"}}}) == ()  # logged
