"""The device scope end to end through the recovery loop: the real KubeClient against tests/kubeapi, the real
Drainer restricted to the holder pods, the real budget Lease, and fakes of our own seams for the DRA fence
(agent.recovery.fence), the holder lookup and the pod Events (agent.recovery.holderlookup, holdertell)."""

from __future__ import annotations

import dataclasses
import enum
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from agent.adapters.kube import KubeError
from agent.core.devices import DeviceKind, DeviceProblem, DeviceRef
from agent.core.holders import Holder, Holders
from agent.core.types import Condition, Severity, Status
from agent.recovery.budget import BUDGET_ANNOTATION, decode_state
from agent.recovery.drain import Drainer
from agent.recovery.ladder import HISTORY_ANNOTATION
from agent.recovery.model import DEFAULT_LEASE, Action, BudgetSettings, DrainSettings, PolicyRule, Scope
from agent.recovery.policyfile import DEFAULT_POLICY

from helpers.recovery import NODE, NS, T0, LoopHarness, kube_fixture, prepare
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]
__all__ = ["kube_fixture"]  # fixture: kube

GPU0, GPU1 = "0000:3b:00.0", "0000:5d:00.0"
RULE = PolicyRule(
    condition="GpuXid",
    reasons=("GpuXid119",),
    actions=(Action.FENCE_DEVICE, Action.DRAIN_DEVICE, Action.CORDON),
    scope=Scope.DEVICE,
)
POLICY = dataclasses.replace(DEFAULT_POLICY, rules=(RULE,), startup_delay=0.0, budget=BudgetSettings(max_actions=100))


class Outcome(enum.StrEnum):  # agent.recovery.fence.FenceOutcome's values
    FENCED = "fenced"
    VENDOR = "vendor"
    NO_API = "no-api"
    NOT_DRA = "not-dra"


@dataclasses.dataclass(frozen=True)
class Fence:
    outcome: Outcome
    rule: str = ""
    message: str = ""


class FakeFencer:
    """Answers ``outcome``; records every fence and unfence (by device key)."""

    def __init__(self, outcome: Outcome = Outcome.FENCED) -> None:
        self.outcome = outcome
        self.fenced: list[str] = []
        self.unfenced: list[str] = []

    def fence(self, device: DeviceRef, *, reason: str, incident_id: str) -> Fence:
        self.fenced.append(device.key)
        written = self.outcome is Outcome.FENCED
        return Fence(outcome=self.outcome, rule=f"node-health-agent-{NODE}-gpu" if written else "", message="test")

    def unfence(self, device: DeviceRef) -> bool:
        self.unfenced.append(device.key)
        return True


class FakeHolders:
    """Who holds each GPU, as the kubelet's pod-resources API would answer."""

    def __init__(self, pods: dict[str, list[tuple[str, str]]]) -> None:
        self.pods = pods

    def holders(self, device: DeviceRef) -> Holders:
        found = self.pods.get(device.id, [])
        return Holders(tuple(Holder(ns, name, "main", "nvidia.com/gpu", f"GPU-{device.id}") for ns, name in found))


class FakeTeller:
    def __init__(self) -> None:
        self.told: list[tuple[str, tuple[tuple[str, str], ...], str]] = []

    def tell(self, *, device: DeviceRef, holders: Holders, condition: str, reason: str, plan: str) -> int:
        self.told.append((device.key, holders.pods, plan))
        return len(holders.pods)


def pod(name: str, namespace: str = "team") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {}},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "pause"}],
            "terminationGracePeriodSeconds": 30,
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def xid(*gpus: str, reason: str = "GpuXid119") -> Condition:
    problems = tuple(
        DeviceProblem(
            device=DeviceRef(kind=DeviceKind.GPU, id=g, printed=g, pci=g, index=i, present=True),
            reason=reason,
            severity=Severity.CRITICAL,
            since=T0 - 10,
            last_update=T0 - 10,
        )
        for i, g in enumerate(gpus)
    )
    return Condition(
        type="GpuXid", status=Status.TRUE, reason=reason, message="x", last_transition=T0 - 10, last_update=T0 - 10,
        devices=problems,
    )  # fmt: skip


def healed() -> Condition:
    return Condition(
        type="GpuXid", status=Status.FALSE, reason="Healthy", message="", last_transition=T0, last_update=T0
    )


class Devices:
    """The seams and the drain of only some pods (the real Drainer, its kubelet confirming as time passes)."""

    def __init__(self, api: KubeApiServer, client: Any, outcome: Outcome = Outcome.FENCED) -> None:
        self.fencer = FakeFencer(outcome)
        self.holders = FakeHolders({GPU0: [("team", "train-0")], GPU1: [("team", "other-0")]})
        self.teller = FakeTeller()
        self.now = 0.0
        self.fail_next = False
        self.api, self.client = api, client

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.api.kubelet.confirm(node=NODE)

    def drain(self, stop: threading.Event, report: Callable[[str, str], None], only: frozenset[str]) -> Any:
        if self.fail_next:  # the agent dies between the fence and the drain
            self.fail_next = False
            raise KubeError("connection reset", status=None)
        drainer = Drainer(
            client=self.client, node_name=NODE, settings=DrainSettings(), clock=lambda: self.now, sleep=self.sleep,
            report=report, only=only, rng=lambda: 0.5,
        )  # fmt: skip
        return drainer.run(stop)

    def parts(self) -> dict[str, Any]:
        return {
            "fencer": self.fencer,
            "holders": self.holders,
            "holder_teller": self.teller,
            "device_drainer": self.drain,
        }


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    return prepare(kube_api_server)


@pytest.fixture
def setup(api, kube) -> Callable[..., tuple[LoopHarness, Devices]]:
    def make(*, outcome: Outcome = Outcome.FENCED, enabled: bool = True) -> tuple[LoopHarness, Devices]:
        client = kube()
        devices = Devices(api, client, outcome)
        harness = LoopHarness(api, client, policy=POLICY, enabled=enabled, devices=devices.parts())
        for name in ("train-0", "other-0", "no-gpu-0"):
            api.put_object(pod(name))
        return harness, devices

    return make


def on_node(api: KubeApiServer) -> list[str]:
    return sorted(p["metadata"]["name"] for p in api.list_objects("pods") if p["spec"].get("nodeName") == NODE)


def device_steps(api: KubeApiServer) -> list[float]:
    lease = api.get_object("leases", DEFAULT_LEASE, NS)
    assert lease is not None
    state = decode_state(lease["metadata"]["annotations"][BUDGET_ANNOTATION])
    assert not state.holders  # a device step takes no node's place
    return list(state.device_actions)


def test_one_gpu_fenced_and_only_its_pods_drained_then_unfenced_when_healed(api, setup):
    h, d = setup()
    h.publish(xid(GPU0))
    h.step()

    assert d.fencer.fenced == [f"gpu:{GPU0}"]
    assert d.teller.told and d.teller.told[0][:2] == (f"gpu:{GPU0}", (("team", "train-0"),))
    assert "fences the device" in d.teller.told[0][2]
    assert on_node(api) == ["no-gpu-0", "other-0"]  # only the holder moved; the others untouched
    assert not h.cordoned()
    fences = h.incident()["fences"]
    assert fences == [
        {
            "device": f"gpu:{GPU0}",
            "fence": "fenced",
            "rule": f"node-health-agent-{NODE}-gpu",
            "holders": ["team/train-0"],
            "evicted": ["team/train-0"],
            "steps": ["fence-device", "drain-device"],
        }
    ]
    assert {"DeviceFenced", "DeviceDrained"} <= set(h.reasons())
    assert len(device_steps(api)) == 1

    h.step()  # nothing left: nothing repeats
    assert d.fencer.fenced == [f"gpu:{GPU0}"] and len(device_steps(api)) == 1

    h.clock.now += 60
    h.publish(healed())
    h.step()
    assert d.fencer.unfenced == [f"gpu:{GPU0}"]
    assert h.incident() is None
    assert "DeviceUnfenced" in h.reasons()


def test_a_fence_recorded_before_the_agent_died_is_never_repeated(api, setup):
    h, d = setup()
    d.fail_next = True
    h.publish(xid(GPU0))
    with pytest.raises(KubeError):
        h.step()
    assert h.incident()["fences"][0]["steps"] == ["fence-device"]

    h.restart()
    h.step()
    assert d.fencer.fenced == [f"gpu:{GPU0}"]  # not fenced a second time
    assert h.incident()["fences"][0]["steps"] == ["fence-device", "drain-device"]
    assert on_node(api) == ["no-gpu-0", "other-0"]


def test_no_device_taint_rule_api_climbs_to_the_node(api, setup):
    h, d = setup(outcome=Outcome.NO_API)
    h.publish(xid(GPU0))
    h.step()
    assert "DeviceFenceNotPossible" in h.reasons()
    assert on_node(api) == ["no-gpu-0", "other-0", "train-0"] and not h.cordoned()

    h.step()
    assert h.cordoned()  # the rule's node action
    assert "DeviceScopeClimbed" in h.reasons()
    assert d.fencer.fenced == [f"gpu:{GPU0}"]


def test_more_devices_than_max_devices_act_on_the_node(api, setup):
    h, d = setup()
    h.publish(xid(GPU0, GPU1, "0000:86:00.0"))
    h.step()
    assert d.fencer.fenced == [] and h.cordoned()


def test_report_only_plans_the_device_actions_and_writes_nothing(api, setup):
    h, d = setup(enabled=False)
    h.publish(xid(GPU0))
    h.step()
    assert d.fencer.fenced == [] and d.teller.told == []
    assert h.incident() is None and on_node(api) == ["no-gpu-0", "other-0", "train-0"]
    told = [e.message for e in h.events("RecoveryDryRun")]
    assert any("would fence-device" in m for m in told) and any("would drain-device" in m for m in told)
    assert h.loop.stats.would["fence-device"] == 1

    h.step()  # said once per incident, and not planned again
    assert h.loop.stats.would["fence-device"] == 1
    assert json.dumps(h.node()).count("fences") == 0


def test_the_same_gpu_failing_again_climbs_to_the_node(api, setup):
    h, d = setup()
    h.publish(xid(GPU0))
    h.step()
    history = json.loads(h.node()["metadata"]["annotations"][HISTORY_ANNOTATION])
    assert history["opened"][-1]["devices"] == [f"gpu:{GPU0}"]  # kept beyond the incident
    h.clock.now += 60
    h.publish(healed())
    h.step()
    assert h.incident() is None and not h.cordoned()

    h.clock.now += 3600  # an hour later, within the day a rule without repeat counts
    again = dataclasses.replace(xid(GPU0), last_transition=h.clock.now - 5, last_update=h.clock.now - 5)
    h.publish(again)
    h.step()
    assert h.cordoned() and d.fencer.fenced == [f"gpu:{GPU0}"]
    assert any("failed again" in e.message for e in h.events("DeviceScopeClimbed"))


def test_device_steps_wait_for_the_budgets_device_rate(api, kube):
    policy = dataclasses.replace(POLICY, budget=BudgetSettings(max_actions=100, max_device_actions=1))
    client = kube()
    d = Devices(api, client)
    h = LoopHarness(api, client, policy=policy, devices=d.parts())
    for name in ("train-0", "other-0"):
        api.put_object(pod(name))
    h.publish(xid(GPU0))
    h.step()
    h.publish(xid(GPU0, GPU1))
    h.step()
    assert d.fencer.fenced == [f"gpu:{GPU0}"]  # the second GPU waits
    blocked = h.events("RecoveryBlocked")
    assert blocked and "1 of 1 device steps in the last 10m used" in blocked[0].message
    assert on_node(api) == ["other-0"]
