"""Validation records and requests (agent.core.validation) and how NodeState voids a pass on a new fault."""

from __future__ import annotations

import pytest

from agent.core.devices import DeviceKind, DeviceRef
from agent.core.state import NodeState
from agent.core.types import ConditionSpec, Finding, RuleType, Severity, Status
from agent.core.validation import (
    MAX_RECORDS,
    BadValidation,
    ValidationBook,
    ValidationRecord,
    ValidationRequest,
    Verdict,
    parse_records,
    records_text,
)

GPU0, GPU1 = "gpu:0000:3b:00.0", "gpu:0000:86:00.0"


def rec(check="diag", devices=(GPU0,), verdict=Verdict.PASS, at=1000.0, valid_for=3600.0, **kw) -> ValidationRecord:
    return ValidationRecord(
        check=check,
        devices=devices,
        verdict=verdict,
        reason=kw.pop("reason", "Passed"),
        message="",
        at=at,
        valid_until=at + valid_for if verdict is Verdict.PASS else None,
        **kw,
    )


@pytest.mark.parametrize(
    ("record", "now", "valid"),
    [
        (rec(), 1000.0, True),
        (rec(), 4599.0, True),
        (rec(), 4600.0, False),  # expired at validUntil
        (rec(verdict=Verdict.FAIL), 1001.0, False),
        (rec(verdict=Verdict.UNKNOWN), 1001.0, False),  # never a pass
        (rec(invalidated_by="GpuXid/GpuXid79 on " + GPU0), 1001.0, False),
    ],
    ids=["fresh", "just-before-expiry", "expired", "fail", "unknown", "voided"],
)
def test_a_pass_is_valid_until_it_expires_or_is_voided(record, now, valid):
    assert record.valid(now) is valid


def test_the_newest_record_per_check_and_device_is_kept():
    book = ValidationBook()
    book.record([rec(at=1000.0), rec(devices=(GPU1,), at=1000.0)])
    book.record([rec(verdict=Verdict.FAIL, at=2000.0, reason="MemoryTestFailed")])
    book.record([rec(at=1500.0)])  # older than what is kept: ignored
    assert {(r.devices, r.verdict) for r in book.records} == {((GPU0,), Verdict.FAIL), ((GPU1,), Verdict.PASS)}


@pytest.mark.parametrize(
    ("device", "voided"),
    # a node-wide pass (devices ()) covers every device: any device's fault voids it too
    [(GPU0, {(GPU0,), ()}), (GPU1, {(GPU1,), ()}), (None, {(GPU0,), (GPU1,), ()})],
    ids=["its-device", "another-device", "node-scoped"],
)
def test_a_fault_voids_the_passes_on_its_device_and_a_node_fault_voids_all(device, voided):
    book = ValidationBook()
    book.record([rec(), rec(devices=(GPU1,)), rec(check="nccl", devices=())])
    book.void(device=device, cause="GpuXid/GpuXid79")
    assert {r.devices for r in book.records if r.invalidated_by} == voided
    if device is not None:
        assert {r.invalidated_by for r in book.records if r.invalidated_by} == {f"GpuXid/GpuXid79 on {device}"}
        assert [r.valid(1001.0) for r in book.records if r.devices and r.devices != (device,)] == [True]


SPECS = (ConditionSpec(type="GpuXid", reason="GpuXidGood", message="ok", source="nvidia"),)


def fault(device: str | None, reason: str = "GpuXid79") -> Finding:
    ref = None if device is None else DeviceRef(kind=DeviceKind.GPU, id=device.split(":", 1)[1], printed=device)
    return Finding(
        rule="nvidia/xid",
        type=RuleType.PERMANENT,
        condition="GpuXid",
        reason=reason,
        severity=Severity.CRITICAL,
        message="Xid 79",
        timestamp=1100.0,
        source="test",
        status=Status.TRUE,
        device=ref,
    )


def test_a_new_fault_through_the_state_voids_the_pass_at_once_and_shows_in_the_snapshot():
    state = NodeState(conditions=SPECS, clock=lambda: 1100.0)
    state.validation.record([rec(), rec(devices=(GPU1,))])
    state.apply(fault(GPU0))
    by_device = {r.devices: r for r in state.snapshot().validations}
    assert not by_device[(GPU0,)].valid(1100.0) and by_device[(GPU0,)].invalidated_by == f"GpuXid/GpuXid79 on {GPU0}"
    assert by_device[(GPU1,)].valid(1100.0)  # another device's fault: still valid
    state.apply(fault(GPU1))  # a new device problem on a condition already True: a new fault too
    assert not any(r.valid(1100.0) for r in state.snapshot().validations)


def test_a_repeated_fault_on_a_device_already_held_voids_no_newer_pass():
    state = NodeState(conditions=SPECS, clock=lambda: 1100.0)
    state.apply(fault(GPU0))
    state.validation.record([rec(at=1050.0)])
    state.apply(fault(GPU0))  # the same device, the condition already True for it: not a new fault
    assert [r.valid(1100.0) for r in state.snapshot().validations] == [True]


def test_a_request_is_open_until_every_check_has_a_newer_record_for_its_devices_or_it_is_withdrawn():
    book = ValidationBook()
    book.request(ValidationRequest(id="inc-1/1", checks=("diag", "nccl"), devices=(GPU0,), requested_at=1000.0))
    book.request(ValidationRequest(id="startup", checks=("diag",), requested_at=1000.0))
    book.record([rec(at=999.0)])  # older than the requests: answers neither
    assert {q.id for q in book.requests} == {"inc-1/1", "startup"}
    book.record([rec(at=1001.0, verdict=Verdict.FAIL)])  # a fail answers too
    assert {q.id for q in book.requests} == {"inc-1/1"}  # nccl has no record yet
    book.record([rec(check="nccl", devices=(GPU1,), at=1002.0)])  # another device's: not an answer
    assert {q.id for q in book.requests} == {"inc-1/1"}
    book.request(ValidationRequest(id="inc-2/1", checks=("other",), requested_at=1000.0))
    assert book.withdraw("inc-2/1") and not book.withdraw("inc-2/1")
    book.record([rec(check="nccl", devices=(), at=1003.0)])  # a node record covers every device
    assert book.requests == ()


def test_the_annotation_is_bounded_compact_and_read_back_strictly():
    records = [rec(check=f"c{i}", at=1000.0 + i) for i in range(MAX_RECORDS + 5)]
    text = records_text(records)
    assert " " not in text
    back = parse_records(text)
    assert len(back) == MAX_RECORDS and back[-1] == records[-1] and back[0] == records[5]  # the newest kept
    for bad, field in [
        ("{", "validations"),
        ('[{"check":"d","verdict":"maybe","at":1}]', "validations[0].verdict"),
        ('[{"check":"d","verdict":"pass","at":"soon"}]', "validations[0].at"),
        ('[{"verdict":"pass","at":1}]', "validations[0].check"),
    ]:
        with pytest.raises(BadValidation, match=field.replace("[", r"\[")):
            parse_records(bad)


@pytest.mark.parametrize(
    ("faults", "still_valid"),
    [([], {(GPU0,), (GPU1,)}), ([GPU0], {(GPU1,)}), ([None], set())],
    ids=["healthy", "a device problem", "a node-scoped problem"],
)
def test_records_restored_at_start_are_voided_where_a_condition_is_true_now(faults, still_valid):
    state = NodeState(conditions=SPECS, clock=lambda: 1100.0)
    for device in faults:
        state.apply(fault(device))
    state.restore_validations([rec(), rec(devices=(GPU1,))])
    assert {r.devices for r in state.snapshot().validations if r.valid(1100.0)} == still_valid


def test_a_restored_record_never_replaces_a_newer_one_of_this_run():
    state = NodeState(conditions=SPECS, clock=lambda: 1100.0)
    state.validation.record([rec(at=1050.0, verdict=Verdict.FAIL)])
    state.restore_validations([rec(at=900.0)])
    assert [r.verdict for r in state.snapshot().validations] == [Verdict.FAIL]
