"""The clear codec (hostile values from the Node's annotations), the boundary on replay, the state's clear."""

from __future__ import annotations

import json

import pytest

from agent.core.clears import APPLIED, REFUSED, BadClear, ClearRecord, parse_records, parse_request, records_text
from agent.core.devices import DeviceKind, DeviceRef
from agent.core.state import NodeState
from agent.core.types import ConditionSpec, Finding, LogRecord, RuleType, Severity, Status
from agent.sources.replay import held_back

GOOD = {"id": "abc123", "condition": "NeuronHealth", "device": None, "reason": "swapped", "by": "al", "at": 1.0}


def request(**changes: object) -> str:
    return json.dumps({**GOOD, **changes})


@pytest.mark.parametrize(
    "text, field",
    [
        ("not json", "not JSON"),
        ("[]", "JSON object"),
        ("x" * 70_000, "at most"),
        ("[" * 60_000, "not JSON"),
        (request(id="UPPER"), "id:"),
        (request(id=""), "id:"),
        (request(condition="Neuron Health"), "condition:"),
        (request(condition=7), "condition:"),
        (request(device=["neuron0"]), "device:"),
        (request(device="neuron\x1b[2J"), "device:"),
        (request(reason=""), "reason:"),
        (request(reason="x" * 513), "reason:"),
        (request(reason="line\nbreak"), "reason:"),
        (request(by=None), "by:"),
        (request(at=True), "at:"),
        (request(at=float("nan")), "at:"),
        (request(at=1e300), "at:"),
        (request(at=10**400), "at:"),
        (request(force="yes"), "force:"),
        (request(extra=1), "unknown field"),
    ],
)
def test_a_hostile_request_is_refused_naming_its_field(text, field):
    with pytest.raises(BadClear, match="clear-request") as caught:
        parse_request(text)
    assert field in str(caught.value)


@pytest.mark.parametrize(
    "device, expected",
    [("nd3", "neuron3"), ("neuron03", "neuron3"), ("0000:3B:00", "0000:3b:00.0"), ("gpu:3b:00.0", "gpu:0000:3b:00.0")],
)
def test_a_device_is_named_as_findings_name_it(device, expected):
    assert parse_request(request(device=device)).device == expected


def record(**changes: object) -> dict:
    return {**GOOD, "outcome": APPLIED, "detail": "", "appliedAt": 2.0, "bootId": "boot-1", "seq": 5, **changes}


@pytest.mark.parametrize(
    "item, field",
    [
        (record(outcome="maybe"), "outcome:"),
        (record(seq=-1), "seq:"),
        (record(seq=2**70), "seq:"),
        (record(seq=1.5), "seq:"),
        (record(bootId="../../etc"), "bootId:"),
        (record(appliedAt="soon"), "appliedAt:"),
        (record(detail=["x"]), "detail:"),
    ],
)
def test_a_hostile_record_is_refused_naming_its_place(item, field):
    with pytest.raises(BadClear, match=r"clears\[0\]") as caught:
        parse_records(json.dumps({"clears": [item]}))
    assert field in str(caught.value)


def test_records_round_trip():
    (kept,) = parse_records(json.dumps({"clears": [record()]}))
    assert parse_records(records_text([kept])) == (kept,)


def rec(seq: int | None, boot: str = "boot-1", outcome: str = APPLIED) -> ClearRecord:
    (r,) = parse_records(json.dumps({"clears": [record(seq=seq, bootId=boot, outcome=outcome)]}))
    return r


def lines(*seqs: int) -> list[LogRecord]:
    return [LogRecord(timestamp=1.0, message="m", seq=s) for s in seqs]


@pytest.mark.parametrize(
    "clears, boot, expected",
    [
        ((), "boot-1", [((1, 2, 3), 0)]),
        ((rec(2),), "boot-1", [((1, 2), 1), ((3,), 0)]),
        ((rec(0),), "boot-1", [((1, 2, 3), 0)]),
        ((rec(9),), "boot-2", [((1, 2, 3), 0)]),  # a new boot voids the boundary
        ((rec(9, outcome=REFUSED),), "boot-1", [((1, 2, 3), 0)]),  # a refused clear holds nothing back
        ((rec(None),), "boot-1", [((1, 2, 3), 0)]),
        ((rec(1), rec(2)), "boot-1", [((1,), 2), ((2,), 1), ((3,), 0)]),
    ],
)
def test_records_up_to_a_boundary_of_this_boot_are_held_back(clears, boot, expected):
    runs = held_back(lines(1, 2, 3), clears, boot_id=boot)
    assert [(tuple(r.seq for r in run), len(held)) for run, held in runs] == expected


SPEC = ConditionSpec(type="NeuronHealth", reason="NeuronHealthy", message="ok")


def finding(device: str | None) -> Finding:
    ref = DeviceRef(kind=DeviceKind.NEURON, id=device, printed=device) if device else None
    return Finding(
        rule="r", type=RuleType.PERMANENT, condition="NeuronHealth", reason="Bad", severity=Severity.CRITICAL,
        message="bad", timestamp=1.0, source="s", device=ref,
    )  # fmt: skip


@pytest.mark.parametrize(
    "devices, clear, force, applied, status",
    [
        (("neuron0",), None, False, True, Status.FALSE),
        (("neuron0", "neuron1"), "neuron0", False, True, Status.TRUE),
        (("neuron0",), "neuron0", False, True, Status.FALSE),
        (("neuron0",), "neuron5", False, False, Status.TRUE),
        (("neuron0",), "neuron5", True, True, Status.TRUE),
        ((None, "neuron0"), "neuron0", False, True, Status.TRUE),  # a problem that named no device remains
    ],
)
def test_the_state_clears_a_condition_or_one_device(devices, clear, force, applied, status):
    state = NodeState(conditions=[SPEC], clock=lambda: 10.0)
    for device in devices:
        state.apply(finding(device))
    done, _, _ = state.clear("NeuronHealth", device=clear, force=force, note="n")
    cond = state.snapshot().condition("NeuronHealth")
    assert (done, cond.status) == (applied, status)
    if clear and status is Status.TRUE and applied and not force:
        assert clear not in [d.device.id for d in cond.devices]


def test_a_condition_the_agent_does_not_own_is_refused():
    state = NodeState(conditions=[SPEC], clock=lambda: 10.0)
    assert state.clear("Ready", device=None, force=False, note="n")[0] is False
