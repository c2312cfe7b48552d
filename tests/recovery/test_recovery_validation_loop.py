"""The validation gate in the recovery loop: a rebooted node stays cordoned until its validation set passed
after the reboot; the request goes into the inbox once, after the incident that records it is stored; a
fail climbs (reboot -> replace) or holds; a restart at any point does nothing twice.

The real kubernetes client against tests/kubeapi, an injected clock and boot id; the reboot is a fake
(our own seam: the ladder's reboot callable) that counts its calls. Validation records are published in
the snapshot as the main loop would keep them (the active checks are another part's)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator
from typing import Any

import pytest

from agent.adapters.kube import KubeError
from agent.core.bus import Inbox
from agent.core.devices import DeviceKind, DeviceProblem, DeviceRef
from agent.core.types import Condition, Severity, Status
from agent.core.validation import ValidationRecord, ValidationRequest, Verdict
from agent.recovery import validationgate as vg
from agent.recovery.drain import DrainResult
from agent.recovery.holds import VETO_ANNOTATION
from agent.recovery.ladder import Ladder
from agent.recovery.model import (
    DEFAULT_WINDOW,
    UNVALIDATED_TAINT_KEY,
    Action,
    BudgetSettings,
    NodeView,
    OnFail,
    PolicyRule,
    Remedy,
    Scope,
    StartupValidation,
    ValidationSettings,
)
from agent.recovery.policyfile import DEFAULT_POLICY
from agent.recovery.startupgate import FAILED as STARTUP_FAILED
from agent.recovery.startupgate import PASSED as STARTUP_PASSED
from agent.recovery.startupgate import STARTUP_ID

from helpers import recovery
from helpers.recovery import NODE_PATH, T0, Clock, LoopHarness, kube_fixture, prepare
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]
__all__ = ["kube_fixture"]  # fixture: kube

CHECKS = ("dcgm-diag", "nccl-loopback")
XID79 = ("GpuXid", "GpuXid79")


def policy(on_fail: OnFail = OnFail.CLIMB) -> Any:
    return dataclasses.replace(
        DEFAULT_POLICY,
        startup_delay=0.0,
        budget=BudgetSettings(max_actions=100),
        validation=ValidationSettings(checks=CHECKS, on_fail=on_fail),
    )


class Killed(BaseException):
    """The agent process ends here (nothing in the agent catches a BaseException)."""


class KillingInbox(Inbox):
    """An inbox whose first validation request kills the process as it is put (before it is queued)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = True

    def put(self, item: object, **kwargs: Any) -> bool:
        if self.armed and isinstance(item, ValidationRequest):
            self.armed = False
            raise Killed
        return super().put(item, **kwargs)


class Host:
    """The node's boot id and the fake reboot."""

    def __init__(self) -> None:
        self.boot = "boot-1"
        self.reboots = 0

    def reboot(self, view: NodeView) -> str:
        self.reboots += 1
        return recovery.INSTANCE


def _drained(stop: object, report: object) -> DrainResult:
    return DrainResult(outcome="done")


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    return prepare(kube_api_server)


@pytest.fixture
def world(api, kube) -> Iterator[Any]:
    clock, host = Clock(), Host()

    def make(on_fail: OnFail = OnFail.CLIMB, *, put_node: bool = True) -> LoopHarness:
        client = kube()
        ladder = Ladder(
            client=client, node_name=recovery.NODE, boot_id=lambda: host.boot, reboot=host.reboot, monotonic=clock
        )
        return LoopHarness(
            api, client, policy=policy(on_fail), put_node=put_node, clock=clock, ladder=ladder, drainer=_drained
        )

    yield clock, host, make


def rebooted_and_quiet(h: LoopHarness, host: Host) -> float:
    """Cordon, drain and reboot; the new boot; quiet through the window. Returns when the reboot was seen."""
    h.publish(recovery.problem(*XID79, since=T0 - 10))
    h.step()
    assert host.reboots == 1 and h.cordoned()
    host.boot = "boot-2"
    h.clock.now += 60
    seen = h.clock.now
    h.publish(recovery.healthy(XID79[0], since=seen))
    h.step()  # the reboot is finished: the window starts
    h.clock.now += DEFAULT_WINDOW + 1
    return seen


def results(verdict: Verdict, *, at: float) -> tuple[ValidationRecord, ...]:
    return tuple(
        ValidationRecord(
            check=c,
            devices=(),
            verdict=verdict,
            reason=verdict.value,
            message="",
            at=at,
            valid_until=at + 86_400 if verdict is Verdict.PASS else None,
        )
        for c in CHECKS
    )


def validations(h: LoopHarness) -> list[dict[str, Any]]:
    return list((h.incident() or {}).get("validations", []))


def test_the_node_stays_cordoned_until_the_set_passed_after_the_reboot(world):
    clock, host, make = world
    h = make()
    seen = rebooted_and_quiet(h, host)
    healthy = recovery.healthy(XID79[0], since=seen)
    h.publish(healthy, validations=results(Verdict.PASS, at=seen - 120))  # passes from before the reboot
    for _ in range(3):
        h.step()
        clock.now += 5
    assert h.cordoned(), "the window passed, but nothing proved the node: it stays cordoned"
    (request,) = h.requests
    (attempt,) = validations(h)
    assert request.id == attempt["id"] == f"{attempt['id'].split('#')[0]}#1" and request.checks == CHECKS
    assert attempt["outcome"] == "" and attempt["requestedAt"] == request.requested_at
    assert vg.REQUESTED in h.reasons()
    h.publish(healthy, validations=results(Verdict.PASS, at=clock.now), validation_requests=())
    h.step()
    assert not h.cordoned() and h.incident() is None
    assert vg.PASSED in h.reasons() and "RecoveryUncordoned" in h.reasons()
    assert host.reboots == 1 and len(h.requests) == 1


def test_a_fail_climbs_to_replace_through_the_budget(world):
    clock, host, make = world
    h = make()
    seen = rebooted_and_quiet(h, host)
    healthy = recovery.healthy(XID79[0], since=seen)
    h.step()
    h.publish(healthy, validations=results(Verdict.FAIL, at=clock.now + 1))
    clock.now += 10
    h.step()
    assert h.cordoned() and [(a["outcome"], a["reason"]) for a in validations(h)] == [(vg.PERMANENT, vg.FAILED)]
    assert [e.type for e in h.events(vg.FAILED)] == ["Warning"]
    h.step()
    assert [c for c in h.marker.calls], "the ladder's next rung: mark-unhealthy (replace)"
    assert "mark-unhealthy" in (h.incident() or {})["done"] and h.cordoned()
    h.step()
    assert len(h.marker.calls) == 1 and len(h.requests) == 1 and host.reboots == 1
    assert len(h.events(vg.FAILED)) == 1


def test_a_fail_with_on_fail_hold_keeps_it_out_with_a_report(world):
    clock, host, make = world
    h = make(OnFail.HOLD)
    seen = rebooted_and_quiet(h, host)
    h.step()
    h.publish(recovery.healthy(XID79[0], since=seen), validations=results(Verdict.FAIL, at=clock.now + 1))
    clock.now += 10
    for _ in range(3):
        h.step()
        clock.now += 600
    assert h.cordoned() and not h.marker.calls and len(h.requests) == 1
    assert len(h.events(vg.FAILED)) == 1


def test_the_timeout_is_permanent_and_no_second_request_follows(world):
    clock, host, make = world
    h = make(OnFail.HOLD)
    seen = rebooted_and_quiet(h, host)
    h.step()
    (request,) = h.requests
    h.publish(recovery.healthy(XID79[0], since=seen), validation_requests=(request,))
    clock.now += 1800
    h.step()
    assert [(a["outcome"], a["reason"]) for a in validations(h)] == [(vg.PERMANENT, vg.TIMED_OUT)]
    clock.now += 3600
    h.step()
    assert h.cordoned() and len(h.requests) == 1 and len(h.events(vg.TIMED_OUT)) == 1


# ---- SIGKILL safety -------------------------------------------------------------------------------------


def test_killed_between_the_record_and_the_put_a_restart_asks_once_under_a_new_attempt(world):
    clock, host, make = world
    h = make()
    h.inbox = h._loop_args["inbox"] = KillingInbox()
    h.loop = type(h.loop)(**h._loop_args)
    seen = rebooted_and_quiet(h, host)
    with pytest.raises(Killed):
        h.step()
    (recorded,) = validations(h)
    assert recorded["outcome"] == "" and h.requests == [], "recorded, never put"
    h.restart()
    healthy = recovery.healthy(XID79[0], since=seen)
    h.publish(healthy)
    h.step()
    h.step()
    assert [(a["number"], a["outcome"], a["reason"]) for a in validations(h)] == [
        (1, vg.TRANSIENT, vg.LOST),
        (2, "", ""),
    ]
    (request,) = h.requests
    assert request.id.endswith("#2") and host.reboots == 1 and h.cordon_patches() == 1
    h.publish(healthy, validations=results(Verdict.PASS, at=clock.now + 1))
    clock.now += 5
    h.step()
    assert not h.cordoned() and len(h.requests) == 1


def test_killed_after_the_put_a_restart_finds_the_request_open_and_puts_nothing(world):
    clock, host, make = world
    h = make()
    seen = rebooted_and_quiet(h, host)
    h.step()
    (request,) = h.requests
    h.restart()  # the main loop kept the open request (its state) and publishes it
    healthy = recovery.healthy(XID79[0], since=seen)
    h.publish(healthy, validation_requests=(request,))
    for _ in range(3):
        clock.now += 5
        h.step()
    assert len(h.requests) == 1 and [a["outcome"] for a in validations(h)] == [""]
    h.publish(healthy, validations=results(Verdict.PASS, at=clock.now + 1))
    clock.now += 5
    h.step()
    assert not h.cordoned() and len(h.requests) == 1 and host.reboots == 1


def test_the_record_s_write_failing_puts_nothing(world, api):
    clock, host, make = world
    h = make()
    rebooted_and_quiet(h, host)
    api.faults.add(method="PATCH", path_regex=NODE_PATH, body_regex="validations", status=503)
    with pytest.raises(KubeError):
        h.step()
    assert h.requests == [] and validations(h) == []
    h.step()
    assert len(h.requests) == 1 and len(validations(h)) == 1


# ---- without a set; a device fence ---------------------------------------------------------------------


def test_without_a_set_the_node_returns_on_silence_and_one_event_says_so(api, kube):
    clock, host = Clock(), Host()
    client = kube()
    ladder = Ladder(
        client=client, node_name=recovery.NODE, boot_id=lambda: host.boot, reboot=host.reboot, monotonic=clock
    )
    quiet = dataclasses.replace(policy(), validation=None)
    h = LoopHarness(api, client, policy=quiet, clock=clock, ladder=ladder, drainer=_drained)
    rebooted_and_quiet(h, host)
    h.step()
    assert not h.cordoned() and h.requests == []
    assert len(h.events(vg.ON_SILENCE)) == 1


GPU0 = "0000:3b:00.0"
DEVICE_RULE = PolicyRule(
    condition="GpuXid",
    reasons=("GpuXid119",),
    actions=(Action.FENCE_DEVICE, Action.CORDON),
    scope=Scope.DEVICE,
    ladder=(Remedy.REBOOT, Remedy.REPLACE),
    validation=ValidationSettings(checks=("dcgm-diag",), on_fail=OnFail.HOLD),
)


class Outcome(enum.StrEnum):  # agent.recovery.fence.FenceOutcome's value the loop reads
    FENCED = "fenced"


@dataclasses.dataclass(frozen=True)
class Fence:
    outcome: Outcome
    rule: str = ""
    message: str = ""


class FakeFencer:
    """Fences (a DeviceTaintRule written, as far as the loop can tell) and records every unfence."""

    def __init__(self) -> None:
        self.fenced: list[str] = []
        self.unfenced: list[str] = []

    def fence(self, device: DeviceRef, *, reason: str, incident_id: str) -> Fence:
        self.fenced.append(device.key)
        return Fence(outcome=Outcome.FENCED, rule=f"node-health-agent-{recovery.NODE}-gpu", message="test")

    def unfence(self, device: DeviceRef) -> bool:
        self.unfenced.append(device.key)
        return True


def xid119(status: Status = Status.TRUE) -> Condition:
    problem = DeviceProblem(
        device=DeviceRef(kind=DeviceKind.GPU, id=GPU0, printed=GPU0, pci=GPU0, index=0, present=True),
        reason="GpuXid119", severity=Severity.CRITICAL, since=T0 - 10, last_update=T0 - 10,
    )  # fmt: skip
    if status is Status.FALSE:
        return Condition(type="GpuXid", status=status, reason="Healthy", message="", last_transition=T0 + 60,
                         last_update=T0 + 60)  # fmt: skip
    return Condition(type="GpuXid", status=status, reason="GpuXid119", message="x", last_transition=T0 - 10,
                     last_update=T0 - 10, devices=(problem,))  # fmt: skip


def test_the_fence_stays_until_the_device_passed(api, kube):
    fencer = FakeFencer()
    rules = dataclasses.replace(policy(), rules=(DEVICE_RULE,), validation=None)
    h = LoopHarness(api, kube(), policy=rules, devices={"fencer": fencer})
    h.publish(xid119())
    h.step()
    assert fencer.fenced == [f"gpu:{GPU0}"] and not h.cordoned()
    h.clock.now += 60
    h.publish(xid119(Status.FALSE))
    h.step()
    h.step()
    assert fencer.unfenced == [], "healed, but not proven: the DeviceTaintRule stays"
    (request,) = h.requests
    assert request.devices == (f"gpu:{GPU0}",) and request.checks == ("dcgm-diag",)
    other = ValidationRecord(check="dcgm-diag", devices=("gpu:0000:5d:00.0",), verdict=Verdict.PASS, reason="",
                             message="", at=h.clock.now + 1, valid_until=h.clock.now + 86_400)  # fmt: skip
    h.publish(xid119(Status.FALSE), validations=(other,))
    h.clock.now += 5
    h.step()
    assert fencer.unfenced == [], "another GPU's pass proves nothing about this one"
    mine = dataclasses.replace(other, devices=(f"gpu:{GPU0}",))
    h.publish(xid119(Status.FALSE), validations=(other, mine))
    h.clock.now += 5
    h.step()
    assert fencer.unfenced == [f"gpu:{GPU0}"] and h.incident() is None
    assert len(h.requests) == 1 and vg.PASSED in h.reasons()


# ---- the startup gate ----------------------------------------------------------------------------------

UNVALIDATED = {"key": UNVALIDATED_TAINT_KEY, "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def test_a_new_node_keeps_its_startup_taint_until_the_first_pass(api, kube):
    node = recovery.node_object(recovery.NODE)
    node["spec"]["taints"] = [GPU_TAINT, UNVALIDATED]  # as Karpenter's startupTaints put it
    gated = dataclasses.replace(policy(), startup_validation=StartupValidation(checks=CHECKS))
    h = LoopHarness(api, kube(), policy=gated, node=node)
    h.publish()
    h.step()
    h.clock.now += 5
    h.step()
    (request,) = h.requests
    assert request.id == STARTUP_ID and request.checks == CHECKS
    assert UNVALIDATED in h.node()["spec"]["taints"]
    h.publish(validations=results(Verdict.UNKNOWN, at=h.clock.now + 1))  # a device busy: never a pass
    h.clock.now += 5
    h.step()
    assert UNVALIDATED in h.node()["spec"]["taints"] and len(h.requests) == 1
    h.publish(validations=results(Verdict.PASS, at=h.clock.now + 1))
    h.clock.now += 5
    h.step()
    assert h.node()["spec"]["taints"] == [GPU_TAINT], "only the startup taint removed"
    assert [e.reason for e in h.events(STARTUP_PASSED)] == [STARTUP_PASSED]
    patches = h.patches()
    h.clock.now += 5
    h.step()
    assert h.patches() == patches and len(h.requests) == 1, "done: nothing more"


def test_a_failing_new_node_keeps_its_taint_with_one_report(api, kube):
    node = recovery.node_object(recovery.NODE)
    node["spec"]["taints"] = [UNVALIDATED]
    gated = dataclasses.replace(policy(), startup_validation=StartupValidation(checks=CHECKS))
    h = LoopHarness(api, kube(), policy=gated, node=node)
    h.publish(validations=results(Verdict.FAIL, at=T0 - 5))
    for _ in range(3):
        h.step()
        h.clock.now += 5
    assert h.node()["spec"]["taints"] == [UNVALIDATED] and len(h.events(STARTUP_FAILED)) == 1


def test_a_veto_holds_the_request_like_any_disruptive_step(world):
    clock, host, make = world
    h = make()
    h.publish(recovery.problem(*XID79, since=T0 - 10))
    h.step()
    host.boot = "boot-2"
    clock.now += 60
    h.publish(recovery.healthy(XID79[0], since=clock.now))
    h.step()
    h.client.patch_node(recovery.NODE, {"metadata": {"annotations": {VETO_ANNOTATION: "operator: hands off"}}})
    clock.now += DEFAULT_WINDOW + 1
    h.step()
    h.step()
    assert h.requests == [] and validations(h) == [] and h.cordoned(), "held: nothing recorded, nothing put"
    h.client.patch_node(recovery.NODE, {"metadata": {"annotations": {VETO_ANNOTATION: None}}})
    h.step()
    assert len(h.requests) == 1 and len(validations(h)) == 1
