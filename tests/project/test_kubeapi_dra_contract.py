"""Contract tests for ``resource.k8s.io`` on the test API server, with the real ``kubernetes`` client.

Each test states a behaviour of a real kube-apiserver (and, for DeviceTaintRule status, of
kube-controller-manager's device-taint eviction controller) that the DRA fence relies on: which
versions discovery lists per release, the DeviceTaintRule strategy (status only via ``/status``,
generation and ``timeAdded`` on effect changes, the effect enum), the ResourceSlice field
selector, the v1beta1 shapes, and the ``EvictionInProgress`` dry run of ``effect: None``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from helpers.dra import NODE, NVIDIA, allocated_claim, claim_pod, gpu_device, resource_slice, seed_p5
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # scenarios against the test API server

pytest_plugins = ["kubeapi.fixtures"]

MERGE = "application/merge-patch+json"
SELECTOR = {"driver": NVIDIA, "pool": NODE, "device": "gpu-3"}
RULE_PATH = "/apis/resource.k8s.io/v1/devicetaintrules/r1"


@pytest.fixture
def servers() -> Iterator[dict[str, KubeApiServer]]:
    started: dict[str, KubeApiServer] = {}
    yield started
    for server in started.values():
        server.stop()


def start(servers: dict[str, KubeApiServer], dra: Any) -> KubeApiServer:
    server = KubeApiServer(dra=dra).start()
    servers[str(dra)] = server
    return server


def get(server: KubeApiServer, path: str) -> tuple[int, Any]:
    with server.api_client() as api_client:
        request = api_client.param_serialize("GET", path, auth_settings=["BearerToken"])
        response = api_client.call_api(*request)
        response.read()
        data = response.data.decode()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, data


def rule(name: str = "r1", effect: str = "None", key: str = "example.com/fault") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"deviceSelector": SELECTOR, "taint": {"key": key, "value": "79", "effect": effect}},
    }


def rules_api(api_client: client.ApiClient) -> client.ResourceV1Api:
    return client.ResourceV1Api(api_client)


def raw_patch(api_client: client.ApiClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = api_client.param_serialize(
        "PATCH", path, body=body, header_params={"Content-Type": MERGE}, auth_settings=["BearerToken"]
    )
    response = api_client.call_api(*request)
    response.read()
    assert response.status == 200, response.data
    return json.loads(response.data)


# --- discovery -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "versions", "rules_in"),
    [
        ("1.33", ["v1beta2", "v1beta1", "v1alpha3"], "v1alpha3"),
        ("1.35", ["v1", "v1beta2", "v1beta1", "v1alpha3"], "v1alpha3"),
        ("1.36", ["v1", "v1beta2", "v1beta1"], "v1beta2"),
        ("1.37", ["v1", "v1beta2", "v1beta1"], "v1"),
    ],
)
def test_discovery_lists_the_versions_of_the_release_best_first(servers, release, versions, rules_in) -> None:
    server = start(servers, release)
    status, group = get(server, "/apis/resource.k8s.io")
    assert status == 200 and [v["version"] for v in group["versions"]] == versions
    assert group["preferredVersion"]["version"] == versions[0]
    groups = get(server, "/apis")[1]["groups"]
    assert [v["version"] for g in groups if g["name"] == "resource.k8s.io" for v in g["versions"]] == versions
    for version in versions:
        names = {r["name"] for r in get(server, f"/apis/resource.k8s.io/{version}")[1]["resources"]}
        assert ("devicetaintrules" in names) == (version == rules_in)
        assert ("devicetaintrules/status" in names) == (version == rules_in)
    for version in {"v1", "v1beta1", "v1beta2", "v1alpha3"} - set(versions):
        assert get(server, f"/apis/resource.k8s.io/{version}")[0] == 404
        assert get(server, f"/apis/resource.k8s.io/{version}/devicetaintrules")[0] == 404


def test_with_the_api_off_the_group_is_absent(servers) -> None:
    server = start(servers, "off")
    assert "resource.k8s.io" not in {g["name"] for g in get(server, "/apis")[1]["groups"]}
    assert get(server, "/apis/resource.k8s.io")[0] == 404
    assert get(server, "/apis/resource.k8s.io/v1/devicetaintrules")[0] == 404


def test_discovery_of_a_resource_list_says_scope_and_subresources(kube_api) -> None:
    resources = {r["name"]: r for r in get(kube_api, "/apis/resource.k8s.io/v1")[1]["resources"]}
    assert resources["devicetaintrules"]["namespaced"] is False
    assert resources["resourceslices"]["namespaced"] is False
    assert resources["resourceclaims"]["namespaced"] is True
    assert {"devicetaintrules/status", "resourceclaims/status"} <= set(resources)
    assert "resourceslices/status" not in resources


# --- DeviceTaintRule -------------------------------------------------------------------------------


def test_a_created_rule_has_generation_1_a_time_added_and_no_status(kube_api) -> None:
    with kube_api.api_client() as api_client:
        body = rule()
        body["status"] = {
            "conditions": [
                {
                    "type": "X",
                    "status": "True",
                    "reason": "R",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
        created = rules_api(api_client).create_device_taint_rule(body)
    assert created.metadata.generation == 1
    assert created.spec.taint.time_added is not None
    assert created.status is None or not created.status.conditions


@pytest.mark.parametrize(
    ("taint", "message"),
    [
        (
            {"key": "example.com/fault", "effect": "PreferNoSchedule"},
            'spec.taint.effect: Unsupported value: "PreferNoSchedule": '
            'supported values: "NoExecute", "NoSchedule", "None"',
        ),
        ({"key": "example.com/fault"}, "spec.taint.effect: Required value"),
        ({"key": "bad key!", "effect": "None"}, "spec.taint.key: Invalid value"),
    ],
)
def test_the_taint_is_validated(kube_api, taint, message) -> None:
    body = {"metadata": {"name": "r1"}, "spec": {"deviceSelector": SELECTOR, "taint": taint}}
    with kube_api.api_client() as api_client:  # raw: the client itself refuses a taint without effect
        request = api_client.param_serialize(
            "POST",
            "/apis/resource.k8s.io/v1/devicetaintrules",
            body=body,
            auth_settings=["BearerToken"],
            header_params={"Content-Type": "application/json"},
        )
        response = api_client.call_api(*request)
        response.read()
    assert response.status == 422
    assert message in json.loads(response.data)["message"]


def test_changing_the_effect_bumps_generation_and_time_added_and_keeps_status(servers) -> None:
    now = [datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)]
    server = KubeApiServer(clock=lambda: now[0]).start()
    servers["clocked"] = server
    with server.api_client() as api_client:
        rules_api(api_client).create_device_taint_rule(rule())
        server.device_taints.reconcile()
        before = server.get_object("devicetaintrules", "r1")
        now[0] += timedelta(seconds=5)
        relabelled = raw_patch(api_client, RULE_PATH, {"metadata": {"labels": {"a": "b"}}})
        after = raw_patch(api_client, RULE_PATH, {"spec": {"taint": {"effect": "NoSchedule"}}})
    assert before["spec"]["taint"]["timeAdded"] == "2026-12-01T12:00:00Z"
    assert relabelled["metadata"]["generation"] == 1  # metadata is not the spec
    assert after["metadata"]["generation"] == 2
    assert after["spec"]["taint"]["timeAdded"] == "2026-12-01T12:00:05Z"
    assert after["status"] == before["status"]  # the main resource does not write status


def test_status_is_written_only_through_the_status_subresource(kube_api) -> None:
    condition = {
        "type": "EvictionInProgress",
        "status": "False",
        "reason": "NoEffect",
        "message": "m",
        "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    with kube_api.api_client() as api_client:
        rules_api(api_client).create_device_taint_rule(rule())
        written = raw_patch(
            api_client,
            f"{RULE_PATH}/status",
            {"status": {"conditions": [condition]}, "spec": {"taint": {"effect": "NoExecute"}}},
        )
    assert written["status"]["conditions"] == [condition]
    assert written["spec"]["taint"]["effect"] == "None"  # /status keeps the spec
    assert written["metadata"]["generation"] == 1


def test_rules_are_listed_by_label_and_deleted(kube_api) -> None:
    with kube_api.api_client() as api_client:
        api = rules_api(api_client)
        mine = rule("mine")
        mine["metadata"]["labels"] = {"node-health-agent.io/node": NODE}
        api.create_device_taint_rule(mine)
        api.create_device_taint_rule(rule("theirs"))
        listed = api.list_device_taint_rule(label_selector=f"node-health-agent.io/node={NODE}")
        assert [r.metadata.name for r in listed.items] == ["mine"]
        api.delete_device_taint_rule("mine")
        with pytest.raises(ApiException) as raised:
            api.read_device_taint_rule("mine")
    assert raised.value.status == 404


def test_a_v1alpha3_rule_is_served_by_the_alpha_client(servers) -> None:
    server = start(servers, "1.33")
    with server.api_client() as api_client:
        created = client.ResourceV1alpha3Api(api_client).create_device_taint_rule(rule())
    assert created.api_version == "resource.k8s.io/v1alpha3" and created.spec.taint.effect == "None"


# --- ResourceSlice -------------------------------------------------------------------------------


def test_slices_are_listed_by_node_name(kube_api) -> None:
    seed_p5(kube_api)
    seed_p5(kube_api, node="n2")
    with kube_api.api_client() as api_client:
        api = client.ResourceV1Api(api_client)
        mine = api.list_resource_slice(field_selector=f"spec.nodeName={NODE}")
        by_driver = api.list_resource_slice(field_selector=f"spec.driver={NVIDIA}")
        with pytest.raises(ApiException) as raised:
            api.list_resource_slice(field_selector="spec.pool.name=n1")
    assert [s.spec.node_name for s in mine.items] == [NODE]
    assert len(by_driver.items) == 2
    assert raised.value.status == 400 and "field label not supported: spec.pool.name" in raised.value.body


def test_a_v1beta1_slice_keeps_device_fields_under_basic(servers) -> None:
    server = start(servers, "1.33")
    server.put_object(resource_slice(NVIDIA, [gpu_device(0, uuid="GPU-0", pci="0000:18:00.0")]))
    listed = get(server, "/apis/resource.k8s.io/v1beta1/resourceslices")[1]["items"]
    assert listed[0]["spec"]["devices"][0]["basic"]["attributes"]["uuid"] == {"string": "GPU-0"}
    newer = get(server, "/apis/resource.k8s.io/v1beta2/resourceslices")[1]["items"]
    assert newer[0]["spec"]["devices"][0]["attributes"]["uuid"] == {"string": "GPU-0"}


def test_a_slice_needs_exactly_one_node_choice(kube_api) -> None:
    body = resource_slice(NVIDIA, [])
    body["spec"]["allNodes"] = True
    with kube_api.api_client() as api_client, pytest.raises(ApiException) as raised:
        client.ResourceV1Api(api_client).create_resource_slice(body)
    assert raised.value.status == 422


# --- the eviction controller's status ------------------------------------------------------------


def seed_cluster(server: KubeApiServer) -> None:
    seed_p5(server)
    server.put_object(allocated_claim("a", NVIDIA, ["gpu-3"], namespace="ml"))
    server.put_object(claim_pod("a1", "a", namespace="ml"))
    server.put_object(claim_pod("a2", "a", namespace="ml"))  # two pods share the claim
    server.put_object(allocated_claim("b", NVIDIA, ["gpu-3"], namespace="web"))
    generated = claim_pod("b1", "unused", namespace="web")
    generated["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": "t"}]
    generated["status"]["resourceClaimStatuses"] = [{"name": "dev", "resourceClaimName": "b"}]
    server.put_object(generated)  # a claim made from a template: its name is in the pod's status
    tolerant = allocated_claim("c", NVIDIA, ["gpu-3"], tolerations=[{"key": "example.com/fault", "operator": "Exists"}])
    server.put_object(tolerant)
    server.put_object(claim_pod("c1", "c"))  # tolerates the taint: not evicted
    server.put_object(allocated_claim("d", NVIDIA, ["gpu-4"]))
    server.put_object(claim_pod("d1", "d"))  # another GPU


def condition_of(server: KubeApiServer, name: str = "r1") -> dict[str, Any]:
    conditions = server.get_object("devicetaintrules", name)["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["EvictionInProgress"]
    return conditions[0]


def test_effect_none_reports_what_no_execute_would_evict_once_per_generation(kube_api) -> None:
    seed_cluster(kube_api)
    with kube_api.api_client() as api_client:
        rules_api(api_client).create_device_taint_rule(rule())
    assert kube_api.device_taints.reconcile() == ["r1"]
    condition = condition_of(kube_api)
    assert (condition["status"], condition["reason"], condition["observedGeneration"]) == ("False", "NoEffect", 1)
    assert condition["message"].startswith(
        "1 published device selected. 3 allocated devices selected. "
        "3 pods would be evicted in 2 different namespaces if the effect was NoExecute."
    )
    kube_api.put_object(claim_pod("a3", "a", namespace="ml"))
    assert kube_api.device_taints.reconcile() == []  # set once per spec change, not updated


def test_after_the_effect_changes_the_condition_follows(kube_api) -> None:
    seed_cluster(kube_api)
    with kube_api.api_client() as api_client:
        rules_api(api_client).create_device_taint_rule(rule())
        kube_api.device_taints.reconcile()
        raw_patch(api_client, RULE_PATH, {"spec": {"taint": {"effect": "NoSchedule"}}})
    kube_api.device_taints.reconcile()
    condition = condition_of(kube_api)
    assert (condition["reason"], condition["observedGeneration"]) == ("OtherEffect", 2)
    assert condition["message"] == "Eviction only happens for the NoExecute effect."


def test_no_execute_reports_pods_pending_eviction(kube_api) -> None:
    seed_cluster(kube_api)
    with kube_api.api_client() as api_client:
        rules_api(api_client).create_device_taint_rule(rule(effect="NoExecute"))
    kube_api.device_taints.reconcile()
    condition = condition_of(kube_api)
    assert (condition["status"], condition["reason"]) == ("True", "PodsPendingEviction")
    assert condition["message"] == "3 pods need to be evicted in 2 different namespaces."


def test_singular_counts_and_a_selector_matching_nothing(kube_api) -> None:
    kube_api.put_object(resource_slice(NVIDIA, [gpu_device(3, uuid="GPU-3", pci="0000:5d:00.0")]))
    kube_api.put_object(allocated_claim("a", NVIDIA, ["gpu-3"]))
    kube_api.put_object(claim_pod("a1", "a"))
    with kube_api.api_client() as api_client:
        rules_api(api_client).create_device_taint_rule(rule())
        other = rule("r2")
        other["spec"]["deviceSelector"] = {"driver": NVIDIA, "pool": NODE, "device": "gpu-9"}
        rules_api(api_client).create_device_taint_rule(other)
    kube_api.device_taints.reconcile()
    assert condition_of(kube_api)["message"].startswith(
        "1 published device selected. 1 allocated device selected. 1 pod would be evicted in 1 namespace if"
    )
    assert condition_of(kube_api, "r2")["message"].startswith(
        "0 published devices selected. 0 allocated devices selected. 0 pods would be evicted in 0 different"
    )


def test_the_controller_can_run_in_the_background(kube_api) -> None:
    seed_cluster(kube_api)
    kube_api.device_taints.auto(True)
    with kube_api.api_client() as api_client:
        rules_api(api_client).create_device_taint_rule(rule())
    deadline = time.monotonic() + 30  # generous: a loaded machine is slow, never wrong
    while not (kube_api.get_object("devicetaintrules", "r1").get("status") or {}).get("conditions"):
        assert time.monotonic() < deadline, "the background controller wrote no status"
        time.sleep(0.02)
    assert condition_of(kube_api)["reason"] == "NoEffect"
