"""The DRA device fence: the real KubeClient against the test API server, per cluster release.

The test server's ``device_taints`` stands in for kube-controller-manager's device-taint eviction
controller; the fencer's injected ``wait`` runs it (``reconcile``) and moves the injected clock, so
the read-back is exercised without sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.adapters.kube import KubeClient, KubeError
from agent.core.devices import DeviceKind, DeviceRef
from agent.recovery.fence import (
    DEVICE_LABEL,
    NODE_LABEL,
    TAINT_KEY,
    DeviceFencer,
    DraDevice,
    FenceOutcome,
    rule_name,
)

from helpers.dra import (
    H100_PCI,
    H100_UUIDS,
    NEURON,
    NODE,
    NVIDIA,
    allocated_claim,
    claim_pod,
    neuron_device,
    resource_slice,
    seed_p5,
)
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # many scenarios against the test API server

GPU3 = DeviceRef(kind=DeviceKind.GPU, id=H100_PCI[3], printed=H100_PCI[3], pci=H100_PCI[3], present=True)
GPU3_RESOLVED = DeviceRef(
    kind=DeviceKind.GPU, id=H100_PCI[3], printed="3", pci=H100_PCI[3], index=3, uuid=H100_UUIDS[3], present=True
)
NEURON5 = DeviceRef(kind=DeviceKind.NEURON, id="neuron5", printed="nd5", index=5, present=True)
XID = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}


class FakeTime:
    """The injected clock and wait: each wait moves the clock and lets the controller run (or not)."""

    def __init__(self, server: KubeApiServer, *, controller: bool = True) -> None:
        self.server, self.controller, self.now, self.waits = server, controller, 1000.0, 0

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.waits += 1
        self.now += seconds
        if self.controller:
            self.server.device_taints.reconcile()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., tuple[KubeApiServer, KubeClient]]]:
    servers: list[KubeApiServer] = []
    clients: list[KubeClient] = []

    def start(dra: Any = "1.37") -> tuple[KubeApiServer, KubeClient]:
        server = KubeApiServer(dra=dra).start()
        servers.append(server)
        path = server.write_kubeconfig(tmp_path / f"kubeconfig-{len(servers)}")
        client = KubeClient.load(kubeconfig=path, timeout=5.0)
        clients.append(client)
        return server, client

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


def fencer(client: KubeClient, time: FakeTime, **kwargs: Any) -> DeviceFencer:
    return DeviceFencer(client=client, node_name=NODE, clock=time.clock, wait=time.wait, **kwargs)


def rule_of(server: KubeApiServer, device: DeviceRef = GPU3) -> dict[str, Any] | None:
    return server.get_object("devicetaintrules", rule_name(NODE, device))


def seed_holder(server: KubeApiServer) -> None:
    """A training pod holding GPU 3 and a pod on GPU 4 (a claim each)."""
    server.put_object(allocated_claim("train-gpu", NVIDIA, ["gpu-3"], namespace="ml"))
    server.put_object(claim_pod("train", "train-gpu", namespace="ml"))
    server.put_object(allocated_claim("other-gpu", NVIDIA, ["gpu-4"]))
    server.put_object(claim_pod("other", "other-gpu"))


@pytest.mark.parametrize(
    ("release", "rule_version"),
    [("1.33", "v1alpha3"), ("1.35", "v1alpha3"), ("1.36", "v1beta2"), ("1.37", "v1")],
)
def test_a_dra_gpu_is_fenced_dry_run_first_in_every_api_version(make, release, rule_version) -> None:
    server, client = make(release)
    seed_p5(server)
    seed_holder(server)
    time = FakeTime(server)
    fence = fencer(client, time).fence(GPU3, reason="Xid79", incident_id="inc-1")

    assert fence.outcome is FenceOutcome.FENCED
    assert fence.dra == DraDevice(driver=NVIDIA, pool=NODE, device="gpu-3")
    assert fence.would_evict == 1
    assert fence.rule == rule_name(NODE, GPU3)
    rule = rule_of(server)
    assert rule is not None and rule["apiVersion"] == f"resource.k8s.io/{rule_version}"
    assert rule["spec"]["deviceSelector"] == {"driver": NVIDIA, "pool": NODE, "device": "gpu-3"}
    assert rule["spec"]["taint"]["key"] == TAINT_KEY and rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert rule["metadata"]["labels"] == {NODE_LABEL: NODE, DEVICE_LABEL: "gpu-0000-5d-00.0"}
    writes = [r for r in server.requests.snapshot() if r.method in ("POST", "PATCH")]
    assert [(r.method, r.body["spec"]["taint"]["effect"]) for r in writes] == [
        ("POST", "None"),
        ("PATCH", "NoSchedule"),
    ]
    assert writes[0].path == f"/apis/resource.k8s.io/{rule_version}/devicetaintrules"
    assert writes[1].content_type == "application/merge-patch+json"


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        pytest.param(GPU3, "gpu-3", id="gpu-by-pci"),
        pytest.param(GPU3_RESOLVED, "gpu-3", id="gpu-by-uuid"),
        pytest.param(
            DeviceRef(kind=DeviceKind.GPU, id="0000:99:00.0", printed="x", pci="0000:99:00.0", index=3),
            None,
            id="gpu-pci-unknown-not-matched-by-index",
        ),
        pytest.param(
            DeviceRef(kind=DeviceKind.GPU, id="0000:99:00.0", printed="x", pci="0000:99:00.0"), None, id="gpu-absent"
        ),
        pytest.param(NEURON5, None, id="neuron-on-a-gpu-node"),
    ],
)
def test_dra_device_maps_a_device_ref_by_its_attributes(make, device, expected) -> None:
    server, client = make()
    seed_p5(server)
    found = fencer(client, FakeTime(server)).dra_device(device)
    assert (found.device if found else None) == expected


def test_a_neuron_device_is_found_by_device_id_in_a_v1beta1_slice(make) -> None:
    server, client = make({"resourceslices": ("v1beta1",), "devicetaintrules": ("v1alpha3",)})
    server.put_object(resource_slice(NEURON, [neuron_device(i) for i in range(16)]))
    fence = fencer(client, FakeTime(server)).fence(NEURON5, reason="NeuronHwError", incident_id="inc-2")
    assert fence.outcome is FenceOutcome.FENCED
    assert fence.dra == DraDevice(driver=NEURON, pool=NODE, device="neurondevice5")
    assert fence.would_evict == 0


def test_only_the_newest_generation_of_a_pool_counts(make) -> None:
    server, client = make()
    server.put_object(resource_slice(NEURON, [neuron_device(5)], generation=1))
    server.put_object(resource_slice(NEURON, [neuron_device(6)], generation=2))
    assert fencer(client, FakeTime(server)).dra_device(NEURON5) is None


@pytest.mark.parametrize(
    ("setup", "device", "outcome"),
    [
        pytest.param(lambda s: seed_p5(s), GPU3, FenceOutcome.NO_API, id="api-off"),
        pytest.param(lambda s: None, GPU3, FenceOutcome.NOT_DRA, id="no-slices"),
        pytest.param(lambda s: seed_p5(s), NEURON5, FenceOutcome.NOT_DRA, id="device-not-in-slices"),
        pytest.param(lambda s: seed_p5(s, taints={3: [XID]}), GPU3, FenceOutcome.VENDOR, id="vendor-xid-taint"),
        pytest.param(
            lambda s: s.put_object(
                resource_slice(
                    NEURON, [neuron_device(5, taints=[{"key": "neuron.aws.com/unhealthy", "effect": "NoExecute"}])]
                )
            ),
            NEURON5,
            FenceOutcome.VENDOR,
            id="vendor-neuron-taint",
        ),
    ],
)
def test_no_rule_is_written_where_none_is_possible_or_needed(make, setup, device, outcome) -> None:
    server, client = make("off" if outcome is FenceOutcome.NO_API else "1.37")
    setup(server)
    fence = fencer(client, FakeTime(server)).fence(device, reason="r", incident_id="i")
    assert fence.outcome is outcome and fence.rule == ""
    assert server.requests.count(method="POST") == 0 and server.requests.count(method="PATCH") == 0
    assert (fence.dra is not None) == (outcome is FenceOutcome.VENDOR)


def test_an_informational_vendor_taint_does_not_stop_the_fence(make) -> None:
    server, client = make()
    seed_p5(server, taints={3: [{"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}]})
    assert fencer(client, FakeTime(server)).fence(GPU3, reason="r", incident_id="i").outcome is FenceOutcome.FENCED


def test_no_api_is_logged_once(make, caplog) -> None:
    server, client = make("off")
    fence = fencer(client, FakeTime(server))
    for _ in range(3):
        assert fence.fence(GPU3, reason="r", incident_id="i").outcome is FenceOutcome.NO_API
    assert sum("serves no DeviceTaintRule" in r.getMessage() for r in caplog.records) == 1
    assert fence.unfence(GPU3) is False


def test_a_status_that_never_comes_times_out_and_the_fence_goes_on(make) -> None:
    server, client = make()
    seed_p5(server)
    time = FakeTime(server, controller=False)
    fence = fencer(client, time, read_back_timeout=3.0).fence(GPU3, reason="Xid79", incident_id="i")
    assert fence.outcome is FenceOutcome.FENCED and fence.would_evict is None
    assert "no status within 3 s" in fence.message
    assert time.now == 1003.0 and time.waits == 6  # bounded: 0.5 s steps up to the timeout
    assert rule_of(server)["spec"]["taint"]["effect"] == "NoSchedule"  # type: ignore[index]


def test_the_real_controller_loop_answers_a_real_wait(make) -> None:
    server, client = make()
    seed_p5(server)
    seed_holder(server)
    server.device_taints.auto(True)
    fence = DeviceFencer(client=client, node_name=NODE, read_back_timeout=30.0).fence(
        GPU3, reason="Xid79", incident_id="i"
    )
    assert fence.would_evict == 1


def test_a_rule_already_there_is_adopted_and_fencing_is_idempotent(make) -> None:
    server, client = make()
    seed_p5(server)
    seed_holder(server)
    time = FakeTime(server)
    first = fencer(client, time).fence(GPU3, reason="Xid79", incident_id="i")
    uid = rule_of(server)["metadata"]["uid"]  # type: ignore[index]
    server.reset_requests()
    again = fencer(client, time).fence(GPU3, reason="Xid79", incident_id="i")  # e.g. after a restart
    assert (again.outcome, again.rule) == (first.outcome, first.rule)
    assert rule_of(server)["metadata"]["uid"] == uid  # type: ignore[index]
    assert server.requests.count(method="POST") == 0 and server.requests.count(method="PATCH") == 0


def test_a_dry_run_left_by_an_earlier_attempt_is_read_back_and_finished(make) -> None:
    server, client = make()
    seed_p5(server)
    seed_holder(server)
    time = FakeTime(server, controller=False)
    server.faults.add(method="PATCH", path_regex=r"/devicetaintrules/", status=500)
    with pytest.raises(KubeError):
        fencer(client, time).fence(GPU3, reason="Xid79", incident_id="i")
    assert rule_of(server)["spec"]["taint"]["effect"] == "None"  # type: ignore[index]
    server.device_taints.reconcile()
    fence = fencer(client, time).fence(GPU3, reason="Xid79", incident_id="i")
    assert fence.would_evict == 1 and rule_of(server)["spec"]["taint"]["effect"] == "NoSchedule"  # type: ignore[index]


def test_no_execute_only_when_built_with_it(make) -> None:
    server, client = make()
    seed_p5(server)
    fencer(client, FakeTime(server), effect="NoExecute").fence(GPU3, reason="r", incident_id="i")
    assert rule_of(server)["spec"]["taint"]["effect"] == "NoExecute"  # type: ignore[index]
    with pytest.raises(ValueError):
        fencer(client, FakeTime(server), effect="None")


@pytest.mark.parametrize(
    ("fault", "status"),
    [
        pytest.param({"method": "GET", "path_regex": r"^/apis/resource.k8s.io$"}, 503, id="discovery"),
        pytest.param({"method": "GET", "path_regex": r"/resourceslices$"}, 500, id="list-slices"),
        pytest.param(
            {"method": "POST", "path_regex": r"/devicetaintrules$", "status": 403}, 403, id="create-forbidden"
        ),
        pytest.param({"method": "GET", "path_regex": r"/devicetaintrules/", "status": 429}, 429, id="get-throttled"),
    ],
)
def test_api_errors_propagate_as_kube_errors(make, fault, status) -> None:
    server, client = make()
    seed_p5(server)
    server.faults.add(**{"status": status, **fault})
    with pytest.raises(KubeError) as raised:
        fencer(client, FakeTime(server)).fence(GPU3, reason="r", incident_id="i")
    assert raised.value.status == status


def test_unfence_deletes_our_rule_and_a_missing_one_is_fine(make) -> None:
    server, client = make()
    seed_p5(server)
    fence = fencer(client, FakeTime(server))
    fence.fence(GPU3, reason="r", incident_id="i")
    assert fence.unfence(GPU3) is True
    assert rule_of(server) is None
    assert fence.unfence(GPU3) is False
    server.faults.add(method="DELETE", path_regex=r"/devicetaintrules/", status=500)
    with pytest.raises(KubeError):
        fence.unfence(GPU3)


def test_rule_names_are_dns_subdomains_with_a_hash_when_too_long() -> None:
    long_node = "ip-10-0-0-1." + "x" * 250
    name = rule_name(long_node, GPU3)
    assert len(name) <= 253 and name.startswith("node-health-agent-ip-10-0-0-1.")
    assert name != rule_name(long_node + "y", GPU3)
    assert rule_name("n1", GPU3) == "node-health-agent-n1-gpu-0000-5d-00.0"
