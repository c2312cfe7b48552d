"""KubeClient's resource.k8s.io calls against the test API server, per cluster release."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.adapters.kube import KubeClient, KubeError

from helpers.dra import NODE, NVIDIA, seed_p5
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # servers per release

Make = Callable[..., tuple[KubeApiServer, KubeClient]]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    opened: list[tuple[KubeApiServer, KubeClient]] = []

    def start(dra: Any = "1.37") -> tuple[KubeApiServer, KubeClient]:
        server = KubeApiServer(dra=dra).start()
        client = KubeClient.load(kubeconfig=server.write_kubeconfig(tmp_path / f"kc{len(opened)}"), timeout=5.0)
        opened.append((server, client))
        return server, client

    yield start
    for server, client in opened:
        client.close()
        server.stop()


def rule(name: str = "r1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"node-health-agent.io/node": NODE}},
        "spec": {
            "deviceSelector": {"driver": NVIDIA, "pool": NODE, "device": "gpu-3"},
            "taint": {"key": "node-health-agent.io/device-fault", "effect": "None"},
        },
    }


@pytest.mark.parametrize(
    ("dra", "rules", "slices"),
    [
        ("off", None, None),
        ("1.33", "v1alpha3", "v1beta2"),
        ("1.35", "v1alpha3", "v1"),
        ("1.36", "v1beta2", "v1"),
        ("1.37", "v1", "v1"),
        ({"resourceslices": ("v1beta1",)}, None, "v1beta1"),
    ],
)
def test_resource_api_version_is_the_best_version_serving_the_resource(make: Make, dra, rules, slices) -> None:
    _, client = make(dra)
    assert client.resource_api_version("devicetaintrules") == rules
    assert client.resource_api_version("resourceslices") == slices


def test_discovery_is_read_once_per_client_and_an_error_is_not_remembered(make: Make) -> None:
    server, client = make("1.36")
    server.faults.add(method="GET", path_regex=r"^/apis/resource.k8s.io$", status=503)
    with pytest.raises(KubeError) as raised:
        client.resource_api_version("devicetaintrules")
    assert raised.value.status == 503 and raised.value.transient
    assert client.resource_api_version("devicetaintrules") == "v1beta2"
    server.reset_requests()
    assert client.resource_api_version("devicetaintrules") == "v1beta2"
    assert len(server.requests) == 0


def test_slices_are_those_of_this_node_by_field_selector(make: Make) -> None:
    server, client = make()
    for index in range(3):
        seed_p5(server, node=f"{NODE}-{index}")
    seed_p5(server)
    slices = client.list_resource_slices("v1", node_name=NODE)
    assert [s["spec"]["nodeName"] for s in slices] == [NODE]
    assert server.requests.snapshot()[-1].query["fieldSelector"] == f"spec.nodeName={NODE}"


def test_rule_calls_create_get_patch_list_delete(make: Make) -> None:
    server, client = make("1.36")
    created = client.create_device_taint_rule("v1beta2", rule())
    assert created["apiVersion"] == "resource.k8s.io/v1beta2"
    with pytest.raises(KubeError) as raised:
        client.create_device_taint_rule("v1beta2", rule())
    assert raised.value.already_exists
    patched = client.patch_device_taint_rule("v1beta2", "r1", {"spec": {"taint": {"effect": "NoSchedule"}}})
    assert patched["spec"]["taint"]["effect"] == "NoSchedule" and patched["metadata"]["generation"] == 2
    assert server.requests.snapshot()[-1].content_type == "application/merge-patch+json"
    assert client.get_device_taint_rule("v1beta2", "r1")["spec"]["taint"]["effect"] == "NoSchedule"
    client.create_device_taint_rule("v1beta2", {**rule("r2"), "metadata": {"name": "r2"}})
    listed = client.list_device_taint_rules("v1beta2", label_selector=f"node-health-agent.io/node={NODE}")
    assert [r["metadata"]["name"] for r in listed] == ["r1"]
    client.delete_device_taint_rule("v1beta2", "r1")
    with pytest.raises(KubeError) as gone:
        client.get_device_taint_rule("v1beta2", "r1")
    assert gone.value.status == 404
    with pytest.raises(KubeError) as again:
        client.delete_device_taint_rule("v1beta2", "r1")
    assert again.value.status == 404
