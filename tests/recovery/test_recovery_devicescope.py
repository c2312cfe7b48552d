"""The device scope's plan stages (agent.recovery.devicescope), as a table: what a ``scope: device`` rule's
proposal becomes (device actions, or the node's), and how a healed incident gives its devices back."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agent.core.devices import DeviceKind, DeviceProblem, DeviceRef
from agent.core.types import Condition, Severity, Snapshot, Status
from agent.recovery import devicescope
from agent.recovery.fields import DEVICE_STEPS
from agent.recovery.model import (
    INCIDENT_ANNOTATION,
    Action,
    Blocked,
    Decision,
    DeviceFence,
    Incident,
    NodeView,
    PolicyRule,
    RecoveryPolicy,
    Remedy,
    Scope,
)
from agent.recovery.node import incident_text, parse_incident
from agent.recovery.policy import Match, Proposal, assess
from agent.recovery.rungs import Opened, rung_actions

FENCE, DRAIN_DEVICE, UNFENCE = Action.FENCE_DEVICE, Action.DRAIN_DEVICE, Action.UNFENCE_DEVICE
CORDON, DRAIN, REBOOT = Action.CORDON, Action.DRAIN, Action.REBOOT
NOW = 1_000_000.0
DAY = 86_400.0
RULE = PolicyRule(
    condition="GpuXid",
    reasons=("GpuXid119",),
    actions=(FENCE, DRAIN_DEVICE, CORDON),
    ladder=(Remedy.REBOOT, Remedy.REPLACE),
    scope=Scope.DEVICE,
    repeat_count=3,
    repeat_period=7 * DAY,
)
RUNG = dataclasses.replace(RULE, actions=rung_actions(RULE, Remedy.REBOOT))  # the climb stage's rule, rung 1
GPU = [f"0000:{bus:02x}:00.0" for bus in (0x3B, 0x5D, 0x86)]


def gpu(n: int) -> DeviceProblem:
    ref = DeviceRef(kind=DeviceKind.GPU, id=GPU[n], printed=GPU[n], pci=GPU[n], index=n)
    return DeviceProblem(device=ref, reason="GpuXid119", severity=Severity.CRITICAL, since=NOW - 60, last_update=NOW)


def key(n: int) -> str:
    return f"gpu:{GPU[n]}"


def proposal(
    *devices: int, reason: str = "GpuXid119", fences: tuple[DeviceFence, ...] = (), done=(), rule=RUNG
) -> Proposal:
    condition = Condition(
        type="GpuXid",
        status=Status.TRUE,
        reason=reason,
        message="",
        last_transition=NOW - 60,
        last_update=NOW,
        devices=tuple(gpu(n) for n in devices),
    )
    incident = Incident(
        id="GpuXid/x/n/1", condition="GpuXid", reason=reason, since=NOW - 60, opened=NOW - 50, cordoned_by_us=True,
        fences=fences, done=done,
    )  # fmt: skip
    return Proposal(
        actions=(CORDON, DRAIN, REBOOT), incident=incident, primary=Match(condition=condition, rule=rule, index=0)
    )


def fenced(n: int, outcome: str = "fenced", *steps: Action) -> DeviceFence:
    return DeviceFence(device=key(n), fence=outcome, rule=f"node-health-agent-n-{n}", steps=(FENCE, *steps))


def earlier(n: int, age: float) -> Opened:
    return Opened(incident="GpuXid/x/n/0", condition="GpuXid", at=NOW - age, devices=(key(n),))


# (what, proposal, history, expected scope, expected actions)
CASES = [
    ("one device: fence and drain it", proposal(0), (), Scope.DEVICE, (FENCE, DRAIN_DEVICE)),
    ("two devices at once: still the devices", proposal(0, 1), (), Scope.DEVICE, (FENCE, DRAIN_DEVICE)),
    ("more devices than maxDevices: the node", proposal(0, 1, 2), (), Scope.NODE, (CORDON, DRAIN, REBOOT)),
    ("a finding without a device stays at the node", proposal(), (), Scope.NODE, (CORDON, DRAIN, REBOOT)),
    (
        "the device failed again within the period: climbs",
        proposal(0),
        (earlier(0, DAY),),
        Scope.NODE,
        (CORDON, DRAIN, REBOOT),
    ),
    (
        "another device failed before: not a repeat",
        proposal(0),
        (earlier(1, DAY),),
        Scope.DEVICE,
        (FENCE, DRAIN_DEVICE),
    ),
    (
        "the same device long ago: not a repeat",
        proposal(0),
        (earlier(0, 8 * DAY),),
        Scope.DEVICE,
        (FENCE, DRAIN_DEVICE),
    ),
    (
        "no DeviceTaintRule served: the node",
        proposal(0, fences=(fenced(0, "no-api"),)),
        (),
        Scope.NODE,
        (CORDON, DRAIN, REBOOT),
    ),
    (
        "a device-plugin node whose plugin isolates the GPU: drain only",
        proposal(0, fences=(fenced(0, "not-dra"),)),
        (),
        Scope.DEVICE,
        (DRAIN_DEVICE,),
    ),
    (
        "a device-plugin node, Xid 109 (the plugin keeps scheduling): the node",
        proposal(0, reason="GpuXid109", fences=(fenced(0, "not-dra"),)),
        (),
        Scope.NODE,
        (CORDON, DRAIN, REBOOT),
    ),
    (
        "fenced by the vendor driver: drain",
        proposal(0, fences=(fenced(0, "vendor"),)),
        (),
        Scope.DEVICE,
        (DRAIN_DEVICE,),
    ),
    (
        "a second device joins a fenced one: fence and drain it",
        proposal(0, 1, fences=(fenced(0, "fenced", DRAIN_DEVICE),)),
        (),
        Scope.DEVICE,
        (FENCE, DRAIN_DEVICE),
    ),
    (
        "an unfenced device listed again: a repeat, the node",
        proposal(0, fences=(fenced(0, "fenced", DRAIN_DEVICE, UNFENCE),)),
        (),
        Scope.NODE,
        (CORDON, DRAIN, REBOOT),
    ),
    ("climbed once: stays at the node", proposal(0, done=(FENCE, CORDON)), (), Scope.NODE, (DRAIN, REBOOT)),
    ("a rule without a ladder climbs to its node actions", proposal(0, 1, 2, rule=RULE), (), Scope.NODE, (CORDON,)),
]


@pytest.mark.parametrize(("what", "p", "opened", "scope", "actions"), CASES, ids=[c[0] for c in CASES])
def test_scope(what, p, opened, scope, actions):
    out = devicescope.scope(p, opened=opened, now=NOW)
    assert isinstance(out, Proposal)
    assert (out.scope, out.actions) == (scope, actions)
    if scope is Scope.DEVICE:
        listed = {d.device.key for d in p.primary.condition.devices}
        assert {f.device for f in out.incident.fences} >= listed
        assert out.note.startswith("devices ")
    else:
        assert out.note.startswith("at the node: ")


def test_a_node_rule_passes_unchanged():
    p = proposal(0, rule=dataclasses.replace(RUNG, scope=Scope.NODE))
    assert devicescope.scope(p, opened=(), now=NOW) is p


def test_a_climbed_node_ladder_keeps_the_incident_at_the_node():
    out = devicescope.scope(proposal(0), opened=(), now=NOW, rung=1)
    assert isinstance(out, Proposal) and out.scope is Scope.NODE and "ladder climbed" in out.note


def test_decisions_pass_unchanged():
    decision = Decision(blocked=Blocked.PERSIST)
    assert devicescope.scope(decision, opened=(), now=NOW) is decision


def test_a_device_the_condition_no_longer_lists_is_unfenced_without_the_budget():
    p = proposal(1, fences=(fenced(0, "fenced", DRAIN_DEVICE), fenced(1, "fenced", DRAIN_DEVICE)))
    out = devicescope.scope(p, opened=(), now=NOW)
    assert isinstance(out, Decision) and out.actions == (UNFENCE,)


def test_every_device_done_is_nothing_left():
    p = proposal(0, fences=(fenced(0, "fenced", DRAIN_DEVICE),))
    out = devicescope.scope(p, opened=(), now=NOW)
    assert isinstance(out, Decision) and out.blocked is Blocked.NOTHING_LEFT and not out.actions


STORED = proposal(0, fences=(fenced(0, "fenced", DRAIN_DEVICE),)).incident
HEALED = dataclasses.replace(STORED, healthy_since=NOW)


@pytest.mark.parametrize(
    ("decision", "stored", "actions"),
    [
        (Decision(incident=None, release_budget=True), STORED, (UNFENCE,)),  # healed and closed
        (Decision(actions=(Action.UNCORDON,), incident=None), STORED, (UNFENCE, Action.UNCORDON)),
        (Decision(incident=HEALED), STORED, (UNFENCE,)),  # healed, the node stays cordoned (climbed)
        (Decision(incident=STORED), STORED, ()),  # not healed
        (Decision(blocked=Blocked.DISABLED, incident=STORED), STORED, ()),  # report only on a real incident
        (Decision(incident=None), dataclasses.replace(STORED, fences=()), ()),  # nothing fenced
        (Decision(incident=None), dataclasses.replace(STORED, fences=(fenced(0, "fenced", UNFENCE),)), ()),
        (Decision(incident=None), dataclasses.replace(STORED, fences=(fenced(0, "vendor", DRAIN_DEVICE),)), ()),
    ],
)
def test_unfence_after_healing(decision, stored, actions):
    assert devicescope.unfence(decision, stored=stored).actions == actions


@pytest.mark.parametrize(
    ("device", "reason", "isolates"),
    [
        (key(0), "GpuXid119", True),
        (key(0), "GpuXid79", True),
        *((key(0), f"GpuXid{code}", False) for code in devicescope.NOT_ISOLATED_XIDS),
        (key(0), "GpuEccUncorrectable", False),  # no Xid: the plugin's health check does not see it
        ("neuron:neuron3", "NeuronHasError_DMA_ERROR", False),  # the Neuron plugin: not known to isolate
        ("rdma:efa_0", "RdmaPortDown", False),
    ],
)
def test_which_device_plugin_isolates_a_device_itself(device, reason, isolates):
    assert devicescope.plugin_isolates(device, reason) is isolates


def test_device_ref_of_a_recorded_key():
    ref = devicescope.device_ref(key(0))
    assert (ref.kind, ref.id, ref.key) == (DeviceKind.GPU, GPU[0], key(0))
    assert devicescope.device_ref("neuron:neuron3").index is None


# ---- the incident's "fences", read back (agent.recovery.fields.read_fences) -----------------------------------


def annotated(incident_json: dict) -> dict:
    return {"metadata": {"annotations": {INCIDENT_ANNOTATION: json.dumps(incident_json)}}}


def test_fences_read_back_as_written():
    incident = dataclasses.replace(STORED, fences=(fenced(0, "fenced", DRAIN_DEVICE), DeviceFence(device=key(1))))
    text = incident_text(incident)
    assert text.index('"done"') < text.index('"fences"')  # the admission policy's cordon regex is unaffected
    assert parse_incident(annotated(json.loads(text))) == (incident, "")


@pytest.mark.parametrize(
    ("fences", "field"),
    [
        ([{"device": ""}], "fences[0].device"),
        ([{"device": "gpu:x", "fence": "tainted"}], "fences[0].fence"),
        ([{"device": "gpu:x", "steps": ["reboot"]}], "fences[0].steps[0]"),
        ([{"device": "gpu:x", "holders": "team/a"}], "fences[0].holders"),
        ([{"device": "gpu:x", "colour": "red"}], "fences[0].colour"),
        ([{"device": "gpu:x"}, {"device": "gpu:x"}], "fences[1].device"),
        ("gpu:x", "fences"),
    ],
)
def test_a_corrupt_fence_is_refused_naming_its_field(fences, field):
    body = json.loads(incident_text(STORED)) | {"fences": fences}
    incident, problem = parse_incident(annotated(body))
    assert incident is None and problem.startswith(f"incident: {field}: "), problem


def test_the_codec_knows_every_device_action():
    assert set(DEVICE_STEPS) == {a.value for a in Action if a.on_device}


def test_a_new_episode_keeps_the_devices_still_fenced():
    p = proposal(0)
    condition = dataclasses.replace(p.primary.condition, last_transition=NOW - 5)  # healed unseen, back again
    stored = dataclasses.replace(
        p.incident, done=(FENCE, DRAIN_DEVICE), fences=(fenced(0, "fenced", DRAIN_DEVICE), fenced(1, "fenced", UNFENCE))
    )
    assessed = assess(
        snapshot=Snapshot(conditions=(condition,), generated_at=NOW, seeded=True),
        node=NodeView(name="n", unschedulable=False),
        incident=stored,
        policy=RecoveryPolicy(rules=(RUNG,), startup_delay=0.0),
        now=NOW,
        started_at=0.0,
        enabled=True,
    )
    assert isinstance(assessed, Proposal) and assessed.incident.id != stored.id
    assert assessed.incident.fences == (fenced(0, "fenced", DRAIN_DEVICE),)  # the unfenced one is history
