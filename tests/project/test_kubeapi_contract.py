"""Contract tests: Kubernetes API behaviour the agent relies on, exercised with the real client.

Every test states a behaviour of the real kube-apiserver.  By default they run against the test
server in ``tests/kubeapi``; with ``KUBEAPI_CONTRACT_KUBECONFIG=/path/to/kubeconfig`` the tests
that only use the ``kube_api_client`` fixture run against that cluster instead (they create
uniquely named Nodes, Pods, Events, Leases and PDBs in ``default`` and delete them afterwards),
and the tests needing the fake's internals (``kube_api``) are skipped.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client, config, watch
from kubernetes.client import ApiException

from helpers import finishes
from kubeapi import KubeApiServer, PolicyRule

pytestmark = pytest.mark.slow  # many scenarios against the test API server

pytest_plugins = ["kubeapi.fixtures"]

NS = "default"
KUBELET_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
CONFLICT_MESSAGE = "the object has been modified; please apply your changes to the latest version and try again"
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def status_of(error: ApiException) -> dict[str, Any]:
    return json.loads(error.body)


def condition_map(node: client.V1Node) -> dict[str, client.V1NodeCondition]:
    return {c.type: c for c in node.status.conditions}


# --- fixtures --------------------------------------------------------------------------------------


@pytest.fixture
def core(kube_api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api_client)


@pytest.fixture
def make_node(core: client.CoreV1Api) -> Iterator[Callable[..., client.V1Node]]:
    """Create Nodes through the API (status included, as kubelet registers) and delete them after."""
    created: list[str] = []

    def make(
        labels: dict[str, str] | None = None,
        conditions: tuple[str, ...] = KUBELET_CONDITIONS,
        taints: list[dict[str, str]] | None = None,
    ) -> client.V1Node:
        name = unique("node")
        body = {
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints} if taints else {},
            "status": {
                "conditions": [
                    {
                        "type": t,
                        "status": "True" if t == "Ready" else "False",
                        "reason": f"Kubelet{t}",
                        "message": f"kubelet says {t}",
                        "lastHeartbeatTime": "2026-01-02T03:04:05Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                    for t in conditions
                ]
            },
        }
        node = core.create_node(body)
        created.append(name)
        return node

    yield make
    for name in created:
        with contextlib.suppress(ApiException):
            core.delete_node(name)


@pytest.fixture
def make_pod(core: client.CoreV1Api) -> Iterator[Callable[..., client.V1Pod]]:
    """Create Pods (optionally made Running and Ready, or given another phase, through
    ``pods/status``); afterwards drop their finalizers and force-delete them (grace period 0)."""
    created: list[tuple[str, str, bool]] = []

    def make(
        node_name: str | None = None,
        labels: dict[str, str] | None = None,
        ready: bool = False,
        namespace: str = NS,
        *,
        phase: str | None = None,
        grace: int | None = None,
        finalizers: list[str] | None = None,
    ) -> client.V1Pod:
        name = unique("pod")
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}
        if node_name:
            spec["nodeName"] = node_name
        if grace is not None:
            spec["terminationGracePeriodSeconds"] = grace
        metadata: dict[str, Any] = {"name": name, "labels": labels or {}}
        if finalizers:
            metadata["finalizers"] = finalizers
        pod = core.create_namespaced_pod(namespace, {"metadata": metadata, "spec": spec})
        created.append((namespace, name, bool(finalizers)))
        if ready or phase:
            status: dict[str, Any] = {"phase": phase or "Running"}
            if ready:
                status["conditions"] = [{"type": "Ready", "status": "True"}]
            pod = core.patch_namespaced_pod_status(name, namespace, {"status": status})
        return pod

    yield make
    for namespace, name, held in created:
        if held:
            with contextlib.suppress(ApiException):
                core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


# --- strategic merge patch of node conditions ------------------------------------------------------


def test_smp_of_other_condition_types_keeps_kubelet_conditions_untouched(core, make_node):
    """PATCH nodes/<n>/status with a strategic merge patch of our own condition types: conditions merge
    by ``type``, so every kubelet-owned condition survives byte for byte."""
    node = make_node()
    before = {c.type: c.to_dict() for c in node.status.conditions}

    patched = core.patch_node_status(
        node.metadata.name,
        {
            "status": {
                "conditions": [
                    {
                        "type": "NeuronHealthy",
                        "status": "False",
                        "reason": "NoErrors",
                        "message": "ok",
                        "lastHeartbeatTime": "2026-01-02T03:05:00Z",
                        "lastTransitionTime": "2026-01-02T03:05:00Z",
                    },
                    {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock", "message": "ok"},
                ]
            }
        },
    )

    after = condition_map(patched)
    assert set(after) == set(KUBELET_CONDITIONS) | {"NeuronHealthy", "KernelDeadlock"}
    for kubelet_type in KUBELET_CONDITIONS:
        assert after[kubelet_type].to_dict() == before[kubelet_type]


def test_smp_updates_a_condition_in_place_by_type(core, make_node):
    """A second SMP of the same condition type replaces that item's fields (matched by ``type``), keeps
    the list length and the item's position, and leaves fields the patch does not mention."""
    name = make_node().metadata.name
    core.patch_node_status(
        name,
        {
            "status": {
                "conditions": [{"type": "NeuronHealthy", "status": "False", "reason": "NoErrors", "message": "fine"}]
            }
        },
    )
    first = core.read_node_status(name)
    position = [c.type for c in first.status.conditions].index("NeuronHealthy")

    second = core.patch_node_status(
        name,
        {"status": {"conditions": [{"type": "NeuronHealthy", "status": "True", "reason": "UncorrectableEccError"}]}},
    )

    types = [c.type for c in second.status.conditions]
    assert types.count("NeuronHealthy") == 1
    assert len(types) == len(first.status.conditions)
    assert types.index("NeuronHealthy") == position
    ours = condition_map(second)["NeuronHealthy"]
    assert (ours.status, ours.reason, ours.message) == ("True", "UncorrectableEccError", "fine")


def test_smp_new_condition_types_are_placed_before_existing_ones(core, make_node):
    """Items a merge list does not know yet go first, live items keep their relative order
    (why node-problem-detector conditions are listed before kubelet's on real nodes)."""
    name = make_node().metadata.name
    patched = core.patch_node_status(
        name, {"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "B", "status": "False"}]}}
    )
    assert [c.type for c in patched.status.conditions] == ["A", "B", *KUBELET_CONDITIONS]


def test_smp_patch_delete_directive_removes_one_condition(core, make_node):
    """``{"$patch": "delete", "type": X}`` removes exactly the condition of type X."""
    name = make_node().metadata.name
    core.patch_node_status(name, {"status": {"conditions": [{"type": "NeuronHealthy", "status": "False"}]}})

    patched = core.patch_node_status(name, {"status": {"conditions": [{"$patch": "delete", "type": "NeuronHealthy"}]}})

    assert [c.type for c in patched.status.conditions] == list(KUBELET_CONDITIONS)


def test_smp_set_element_order_directive_orders_the_list(core, make_node):
    """``$setElementOrder/conditions`` fixes the order of the items it names."""
    name = make_node().metadata.name
    order = [{"type": t} for t in ("Ready", "PIDPressure", "DiskPressure", "MemoryPressure")]
    patched = core.patch_node_status(
        name,
        {
            "status": {
                "$setElementOrder/conditions": order,
                "conditions": [{"type": "Ready", "message": "reordered"}],
            }
        },
    )
    assert [c.type for c in patched.status.conditions] == [o["type"] for o in order]
    assert condition_map(patched)["Ready"].message == "reordered"


def test_smp_replace_directive_on_a_list_replaces_it(core, make_node):
    """A ``{"$patch": "replace"}`` item makes the patch list replace the live list."""
    name = make_node().metadata.name
    patched = core.patch_node_status(
        name, {"status": {"conditions": [{"$patch": "replace"}, {"type": "Ready", "status": "True"}]}}
    )
    assert [c.type for c in patched.status.conditions] == ["Ready"]


def test_smp_taints_have_no_merge_key_so_the_list_is_replaced(core, make_node):
    """``spec.taints`` has no patch strategy in the API: an SMP replaces the whole list."""
    node = make_node(taints=[{"key": "a", "value": "1", "effect": "NoSchedule"}])
    patched = core.patch_node(
        node.metadata.name, {"spec": {"taints": [{"key": "health/neuron", "value": "bad", "effect": "NoSchedule"}]}}
    )
    assert [t.key for t in patched.spec.taints] == ["health/neuron"]


def test_smp_maps_merge_and_null_deletes_a_key(core, make_node):
    """Maps (labels) merge key by key; ``null`` removes a key."""
    node = make_node(labels={"keep": "1", "drop": "2"})
    patched = core.patch_node(node.metadata.name, {"metadata": {"labels": {"drop": None, "new": "3"}}})
    assert patched.metadata.labels == {"keep": "1", "new": "3"}


def test_smp_of_finalizers_is_a_set_union_and_delete_from_primitive_list_removes(core):
    """``metadata.finalizers`` merges as a set; ``$deleteFromPrimitiveList/finalizers`` removes values."""
    leases = client.CoordinationV1Api(core.api_client)
    name = unique("lease")
    leases.create_namespaced_lease(
        NS, {"metadata": {"name": name, "finalizers": ["example.com/a"]}, "spec": {"holderIdentity": "x"}}
    )
    try:
        merged = leases.patch_namespaced_lease(
            name, NS, {"metadata": {"finalizers": ["example.com/b", "example.com/a"]}}
        )
        assert sorted(merged.metadata.finalizers) == ["example.com/a", "example.com/b"]
        removed = leases.patch_namespaced_lease(
            name, NS, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a", "example.com/b"]}}
        )
        assert not removed.metadata.finalizers
    finally:
        with contextlib.suppress(ApiException):
            leases.patch_namespaced_lease(name, NS, {"metadata": {"finalizers": None}})
            leases.delete_namespaced_lease(name, NS)


def test_smp_list_item_without_merge_key_is_a_server_error(core, make_node):
    """A merge-list item lacking its merge key is rejected with 500, reason Unknown (the error is not
    classified by the API server)."""
    name = make_node().metadata.name
    with pytest.raises(ApiException) as raised:
        core.patch_node_status(name, {"status": {"conditions": [{"status": "True"}]}})
    status = status_of(raised.value)
    assert raised.value.status == 500 and status["reason"] == "Unknown"
    assert status["message"] == "map: map[status:True] does not contain declared merge key: type"


# --- main resource vs status subresource ---------------------------------------------------------


def test_status_subresource_ignores_spec_changes(core, make_node):
    """Writes to nodes/<n>/status change status (and metadata), never spec."""
    name = make_node().metadata.name
    patched = core.patch_node_status(
        name,
        {
            "spec": {"unschedulable": True},
            "status": {"conditions": [{"type": "NeuronHealthy", "status": "True"}]},
        },
    )
    assert not patched.spec.unschedulable
    assert "NeuronHealthy" in condition_map(patched)
    assert not core.read_node(name).spec.unschedulable


def test_main_resource_ignores_status_changes_on_patch_and_put(core, make_node):
    """Writes to nodes/<n> change spec and metadata; status changes in the body are ignored."""
    name = make_node().metadata.name
    patched = core.patch_node(
        name, {"spec": {"unschedulable": True}, "status": {"conditions": [{"type": "NeuronHealthy", "status": "True"}]}}
    )
    assert patched.spec.unschedulable is True
    assert "NeuronHealthy" not in condition_map(patched)

    current = core.read_node(name)
    current.status.conditions = []
    current.metadata.labels = {"replaced": "yes"}
    replaced = core.replace_node(name, current)
    assert replaced.metadata.labels == {"replaced": "yes"}
    assert set(condition_map(replaced)) == set(KUBELET_CONDITIONS)


def test_status_subresource_of_built_in_kinds_may_change_labels(core, make_node):
    """For built-in kinds (Node, Pod) the status endpoint resets only spec: metadata changes such as
    labels do persist (unlike CRD status subresources)."""
    name = make_node().metadata.name
    patched = core.patch_node_status(name, {"metadata": {"labels": {"via-status": "yes"}}})
    assert patched.metadata.labels.get("via-status") == "yes"


# --- optimistic concurrency --------------------------------------------------------------------------


def test_put_with_stale_resource_version_is_409_conflict(core, make_node):
    """PUT carrying an outdated ``metadata.resourceVersion`` fails with 409 Conflict."""
    node = make_node()
    core.patch_node(node.metadata.name, {"metadata": {"labels": {"bump": "1"}}})
    node.metadata.labels = {"stale": "write"}
    with pytest.raises(ApiException) as raised:
        core.replace_node(node.metadata.name, node)
    status = status_of(raised.value)
    assert raised.value.status == 409
    assert status["reason"] == "Conflict"
    assert status["message"] == f'Operation cannot be fulfilled on nodes "{node.metadata.name}": {CONFLICT_MESSAGE}'
    assert status["details"] == {"name": node.metadata.name, "kind": "nodes"}
    assert "stale" not in (core.read_node(node.metadata.name).metadata.labels or {})


def test_patch_containing_a_stale_resource_version_is_a_409_precondition(core, make_node):
    """A patch that sets ``metadata.resourceVersion`` only applies to that version."""
    node = make_node()
    stale = node.metadata.resource_version
    core.patch_node(node.metadata.name, {"metadata": {"labels": {"bump": "1"}}})
    with pytest.raises(ApiException) as raised:
        core.patch_node_status(
            node.metadata.name,
            {"metadata": {"resourceVersion": stale}, "status": {"conditions": [{"type": "X", "status": "True"}]}},
        )
    assert raised.value.status == 409
    assert status_of(raised.value)["reason"] == "Conflict"

    current = core.read_node(node.metadata.name).metadata.resource_version
    ok = core.patch_node(node.metadata.name, {"metadata": {"resourceVersion": current, "labels": {"ok": "1"}}})
    assert ok.metadata.labels["ok"] == "1"


def test_resource_version_increases_on_every_write_but_not_on_a_no_op(core, make_node):
    """Every change gets a larger resourceVersion; a write that changes nothing keeps it."""
    node = make_node()
    versions = [int(node.metadata.resource_version)]
    for value in ("1", "2"):
        versions.append(
            int(core.patch_node(node.metadata.name, {"metadata": {"labels": {"v": value}}}).metadata.resource_version)
        )
    versions.append(
        int(
            core.patch_node_status(
                node.metadata.name, {"status": {"conditions": [{"type": "NeuronHealthy", "status": "False"}]}}
            ).metadata.resource_version
        )
    )
    assert versions == sorted(versions) and len(set(versions)) == len(versions)

    again = core.patch_node(node.metadata.name, {"metadata": {"labels": {"v": "2"}}})
    assert int(again.metadata.resource_version) == versions[-1]


# --- other patch types --------------------------------------------------------------------------------


def test_merge_patch_replaces_lists_wholesale(core, make_node):
    """RFC 7386 merge patch: maps merge, ``null`` deletes, lists (even conditions) are replaced."""
    node = make_node(labels={"a": "1", "b": "2"})
    name = node.metadata.name
    labelled = core.patch_node(name, {"metadata": {"labels": {"a": None, "c": "3"}}}, _content_type=MERGE)
    assert labelled.metadata.labels == {"b": "2", "c": "3"}

    replaced = core.patch_node_status(
        name, {"status": {"conditions": [{"type": "NeuronHealthy", "status": "True"}]}}, _content_type=MERGE
    )
    assert [c.type for c in replaced.status.conditions] == ["NeuronHealthy"]


def test_json_patch_operations_apply_in_order(core, make_node):
    """RFC 6902 JSON patch: add, replace, remove, test."""
    node = make_node(labels={"a": "1"})
    patched = core.patch_node(
        node.metadata.name,
        [
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
            {"op": "add", "path": "/metadata/labels/b", "value": "2"},
            {"op": "replace", "path": "/metadata/labels/a", "value": "10"},
            {"op": "add", "path": "/spec/taints", "value": [{"key": "k", "effect": "NoSchedule"}]},
            {"op": "remove", "path": "/metadata/labels/b"},
        ],
    )
    assert patched.metadata.labels == {"a": "10"}
    assert [t.key for t in patched.spec.taints] == ["k"]


def test_json_patch_failing_test_op_is_422_and_changes_nothing(core, make_node):
    """A failing ``test`` operation rejects the whole patch with 422 Invalid."""
    node = make_node(labels={"a": "1"})
    with pytest.raises(ApiException) as raised:
        core.patch_node(
            node.metadata.name,
            [
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "test", "path": "/metadata/labels/a", "value": "other"},
            ],
        )
    assert raised.value.status == 422
    assert status_of(raised.value)["reason"] == "Invalid"
    after = core.read_node(node.metadata.name)
    assert after.metadata.labels == {"a": "1"}
    assert after.metadata.resource_version == node.metadata.resource_version


def test_unsupported_patch_content_type_is_415(core, make_node):
    """PATCH with ``Content-Type: application/json`` is 415 UnsupportedMediaType."""
    node = make_node()
    with pytest.raises(ApiException) as raised:
        core.patch_node(node.metadata.name, {"metadata": {"labels": {"x": "1"}}}, _content_type="application/json")
    assert raised.value.status == 415
    assert status_of(raised.value)["reason"] == "UnsupportedMediaType"


# --- reads, lists, errors ----------------------------------------------------------------------------


def test_list_nodes_by_label_selector_and_metadata_name_field_selector(core, make_node):
    """``labelSelector`` and ``fieldSelector=metadata.name=<n>`` filter lists; unknown field labels are 400."""
    group = unique("g")
    first = make_node(labels={"group": group, "role": "a"})
    second = make_node(labels={"group": group, "role": "b"})
    names = {n.metadata.name for n in core.list_node(label_selector=f"group={group}").items}
    assert names == {first.metadata.name, second.metadata.name}
    assert [n.metadata.name for n in core.list_node(label_selector=f"group={group},role!=a").items] == [
        second.metadata.name
    ]
    assert [n.metadata.name for n in core.list_node(label_selector=f"group={group},role in (a)").items] == [
        first.metadata.name
    ]
    by_name = core.list_node(field_selector=f"metadata.name={first.metadata.name}")
    assert [n.metadata.name for n in by_name.items] == [first.metadata.name]
    assert int(by_name.metadata.resource_version) >= int(second.metadata.resource_version)
    with pytest.raises(ApiException) as raised:
        core.list_node(field_selector="spec.bogus=1")
    assert raised.value.status == 400


def test_list_pagination_with_limit_and_continue(core, make_node):
    """``limit`` returns a ``continue`` token and ``remainingItemCount``; following it yields the rest."""
    group = unique("page")
    names = {make_node(labels={"page": group}).metadata.name for _ in range(3)}
    first = core.list_node(label_selector=f"page={group}", limit=2)
    assert len(first.items) == 2 and first.metadata._continue and first.metadata.remaining_item_count == 1
    rest = core.list_node(label_selector=f"page={group}", limit=2, _continue=first.metadata._continue)
    assert not rest.metadata._continue
    assert {n.metadata.name for n in first.items + rest.items} == names


def test_resource_version_0_lists_from_the_cache_and_the_match_rules_are_checked(core, make_node):
    """``resourceVersion=0`` (any version: the watch cache) answers a list with its own resourceVersion;
    ``resourceVersionMatch`` needs a resourceVersion, ``Exact`` refuses "0" (422 Invalid ListOptions), and
    a continue token refuses a resourceVersion other than "0" (400)."""
    group = unique("cache")
    name = make_node(labels={"cache": group}).metadata.name
    latest = core.list_node(label_selector=f"cache={group}")
    cached = core.list_node(label_selector=f"cache={group}", resource_version="0")
    assert int(cached.metadata.resource_version) > 0
    assert [n.metadata.name for n in cached.items] == [name] == [n.metadata.name for n in latest.items]
    not_older = core.list_node(
        label_selector=f"cache={group}",
        resource_version=latest.metadata.resource_version,
        resource_version_match="NotOlderThan",
    )
    assert int(not_older.metadata.resource_version) >= int(latest.metadata.resource_version)
    for query, status in (
        ({"resource_version_match": "NotOlderThan"}, 422),
        ({"resource_version": "0", "resource_version_match": "Exact"}, 422),
        ({"resource_version": "0", "resource_version_match": "Newest"}, 422),
    ):
        with pytest.raises(ApiException) as raised:
            core.list_node(label_selector=f"cache={group}", **query)
        assert raised.value.status == status, query
        assert "resourceVersionMatch" in status_of(raised.value)["message"]


def test_resource_version_0_answers_the_whole_list_whatever_the_limit(core, make_node):
    """The watch cache does not page (kubernetes#70735): ``resourceVersion=0`` with a ``limit`` answers every
    item and no continue token; without ``resourceVersion`` the same list pages."""
    group = unique("whole")
    names = {make_node(labels={"whole": group}).metadata.name for _ in range(3)}
    cached = core.list_node(label_selector=f"whole={group}", limit=1, resource_version="0")
    assert {n.metadata.name for n in cached.items} == names and not cached.metadata._continue
    paged = core.list_node(label_selector=f"whole={group}", limit=1)
    assert len(paged.items) == 1 and paged.metadata._continue


def test_a_continue_token_with_a_resource_version_is_400(core, make_node):
    group = unique("page")
    for _ in range(2):
        make_node(labels={"page": group})
    first = core.list_node(label_selector=f"page={group}", limit=1)
    with pytest.raises(ApiException) as raised:
        core.list_node(
            label_selector=f"page={group}",
            limit=1,
            _continue=first.metadata._continue,
            resource_version=first.metadata.resource_version,
        )
    assert raised.value.status == 400


def test_a_watch_cache_behind_serves_resource_version_0_stale_and_the_rest_fresh(kube_api, core, make_node):
    """The test server's watch cache a few revisions behind (as a real one may be): a ``resourceVersion=0``
    get or list answers the older state at the older resourceVersion; a list without one, or not older than
    the latest, answers the latest; ``Exact`` rebuilds the state at that version, 410 once compacted."""
    group = unique("stale")
    name = make_node(labels={"stale": group}).metadata.name
    before = core.list_node(label_selector=f"stale={group}").metadata.resource_version
    core.patch_node(name, {"metadata": {"labels": {"after": "yes"}}})
    second = make_node(labels={"stale": group}).metadata.name
    kube_api.set_watch_cache_lag(2)
    try:
        cached = core.list_node(label_selector=f"stale={group}", resource_version="0")
        assert cached.metadata.resource_version == before
        assert [(n.metadata.name, "after" in (n.metadata.labels or {})) for n in cached.items] == [(name, False)]
        status, text = raw_request(kube_api, "GET", f"/api/v1/nodes/{name}?resourceVersion=0")
        assert status == 200 and "after" not in json.loads(text)["metadata"]["labels"]
        status, _ = raw_request(kube_api, "GET", f"/api/v1/nodes/{second}?resourceVersion=0")
        assert status == 404  # created after the cache's revision
        assert "after" in core.read_node(name).metadata.labels  # a get without one: the latest
        assert {n.metadata.name for n in core.list_node(label_selector=f"stale={group}").items} == {name, second}
        exact = core.list_node(label_selector=f"stale={group}", resource_version=before, resource_version_match="Exact")
        assert [n.metadata.name for n in exact.items] == [name]
        kube_api.compact()
        with pytest.raises(ApiException) as raised:
            core.list_node(label_selector=f"stale={group}", resource_version=before, resource_version_match="Exact")
        assert raised.value.status == 410
    finally:
        kube_api.set_watch_cache_lag(0)


def test_unknown_fields_are_dropped_with_a_warning_or_rejected_when_strict(core, make_node):
    """Default ``fieldValidation=Warn`` drops unknown fields; ``Strict`` rejects them with 400."""
    name = make_node().metadata.name
    patched = core.patch_node(name, {"metadata": {"labels": {"a": "1"}}, "spec": {"notAField": True}})
    assert patched.metadata.labels["a"] == "1"
    with pytest.raises(ApiException) as raised:
        core.patch_node(name, {"spec": {"notAField": True}}, field_validation="Strict")
    assert raised.value.status == 400
    assert status_of(raised.value)["message"] == 'strict decoding error: unknown field "spec.notAField"'


def test_missing_node_is_404_with_a_not_found_status(core):
    name = unique("missing")
    with pytest.raises(ApiException) as raised:
        core.read_node(name)
    status = status_of(raised.value)
    assert raised.value.status == 404
    assert {k: status[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "NotFound",
        "code": 404,
    }
    assert status["message"] == f'nodes "{name}" not found'
    assert status["details"] == {"name": name, "kind": "nodes"}


def test_creating_an_existing_node_is_409_already_exists(core, make_node):
    node = make_node()
    with pytest.raises(ApiException) as raised:
        core.create_node({"metadata": {"name": node.metadata.name}})
    assert raised.value.status == 409
    status = status_of(raised.value)
    assert status["reason"] == "AlreadyExists"
    assert status["message"] == f'nodes "{node.metadata.name}" already exists'


def test_invalid_names_and_taints_are_422_with_field_paths(core, make_node):
    with pytest.raises(ApiException) as raised:
        core.create_node({"metadata": {"name": "Not_A_DNS_Name"}})
    status = status_of(raised.value)
    assert raised.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith('Node "Not_A_DNS_Name" is invalid: metadata.name: Invalid value')
    assert status["details"]["causes"][0]["field"] == "metadata.name"

    node = make_node()
    with pytest.raises(ApiException) as raised:
        core.patch_node(node.metadata.name, {"spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}})
    assert raised.value.status == 422
    assert "spec.taints[0].effect: Unsupported value" in status_of(raised.value)["message"]


def test_times_are_normalised_and_naive_datetimes_rejected(core, make_node):
    """``metav1.Time`` drops fractional seconds on the way in; a time without zone is a 400 decode error."""
    name = make_node().metadata.name
    patched = core.patch_node_status(
        name,
        {
            "status": {
                "conditions": [
                    {
                        "type": "NeuronHealthy",
                        "status": "False",
                        "lastHeartbeatTime": "2026-01-02T03:04:05.987654+01:00",
                    }
                ]
            }
        },
    )
    assert condition_map(patched)["NeuronHealthy"].last_heartbeat_time == datetime(2026, 1, 2, 2, 4, 5, tzinfo=UTC)
    raw = core.api_client.call_api(
        *core.api_client.param_serialize("GET", f"/api/v1/nodes/{name}", auth_settings=["BearerToken"])
    )
    raw.read()
    stored = [c for c in json.loads(raw.data)["status"]["conditions"] if c["type"] == "NeuronHealthy"][0]
    assert stored["lastHeartbeatTime"] == "2026-01-02T02:04:05Z"

    with pytest.raises(ApiException) as raised:
        core.create_node(
            client.V1Node(
                metadata=client.V1ObjectMeta(name=unique("n")),
                status=client.V1NodeStatus(
                    conditions=[
                        client.V1NodeCondition(
                            type="X", status="True", last_heartbeat_time=datetime(2026, 1, 2, 3, 4, 5)
                        )
                    ]
                ),
            )
        )
    assert raised.value.status == 400
    assert "parsing time" in status_of(raised.value)["message"]


# --- events ---------------------------------------------------------------------------------------------


def node_ref(name: str) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": name}


def test_core_event_create_list_by_field_selectors_and_patch(core):
    """core/v1 Events: a Node event lives in ``default``; list by involvedObject.name/reason/type; SMP
    bumps count."""
    node = unique("evnode")
    event = core.create_namespaced_event(
        NS,
        {
            "metadata": {"generateName": f"{node}."},
            "involvedObject": node_ref(node),
            "reason": "NeuronError",
            "message": "uncorrectable ECC",
            "type": "Warning",
            "count": 1,
            "source": {"component": "node-health-agent", "host": node},
            "firstTimestamp": "2026-01-02T03:04:05Z",
            "lastTimestamp": "2026-01-02T03:04:05Z",
        },
    )
    name = event.metadata.name
    try:
        assert name.startswith(f"{node}.") and len(name) == len(node) + 6
        listed = core.list_namespaced_event(
            NS, field_selector=f"involvedObject.name={node},reason=NeuronError,type=Warning"
        )
        assert [e.metadata.name for e in listed.items] == [name]
        assert core.list_namespaced_event(NS, field_selector=f"involvedObject.name={node},type=Normal").items == []

        patched = core.patch_namespaced_event(name, NS, {"count": 2, "lastTimestamp": "2026-01-02T03:09:05Z"})
        assert patched.count == 2
        assert patched.last_timestamp == datetime(2026, 1, 2, 3, 9, 5, tzinfo=UTC)
    finally:
        core.delete_namespaced_event(name, NS)


def test_core_event_for_a_cluster_scoped_object_outside_default_is_422(core):
    """An Event without eventTime about a cluster-scoped object (empty involvedObject.namespace) may only
    live in ``default``."""
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_event(
            "kube-system", {"metadata": {"name": unique("ev")}, "involvedObject": node_ref("n1"), "reason": "R"}
        )
    status = status_of(raised.value)
    assert raised.value.status == 422
    assert status["message"].endswith(
        'is invalid: involvedObject.namespace: Invalid value: "": does not match event.namespace'
    )
    assert status["details"]["causes"][0]["field"] == "involvedObject.namespace"


def test_core_event_namespace_must_match_a_namespaced_involved_object(core):
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_event(
            NS,
            {
                "metadata": {"name": unique("ev")},
                "reason": "R",
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "kube-system"},
            },
        )
    assert raised.value.status == 422
    assert (
        'involvedObject.namespace: Invalid value: "kube-system": does not match event.namespace'
        in (status_of(raised.value)["message"])
    )


def test_core_event_requires_a_name_or_generate_name(core):
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_event(NS, {"metadata": {}, "involvedObject": node_ref("n1"), "reason": "R"})
    assert raised.value.status == 422
    assert "metadata.name: Required value: name or generateName is required" in status_of(raised.value)["message"]


def new_style_event(name: str, node: str, event_time: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "eventTime": event_time,
        "reportingController": "example.com/node-health-agent",
        "reportingInstance": f"node-health-agent-{node}",
        "action": "Checked",
        "reason": "NeuronError",
        "type": "Warning",
        "note": "uncorrectable ECC",
        "regarding": node_ref(node),
    }


def test_events_k8s_io_create_returns_microtime_and_is_visible_as_core_event(core):
    """events.k8s.io/v1: ``eventTime`` is a MicroTime (6 fractional digits); the same object is served by
    core/v1 with renamed fields; list by ``regarding.name``."""
    events = client.EventsV1Api(core.api_client)
    node, name = unique("evnode"), unique("ev")
    created = events.create_namespaced_event(NS, new_style_event(name, node, "2026-01-02T03:04:05.123456Z"))
    try:
        assert created.event_time == datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
        as_core = core.read_namespaced_event(name, NS)
        assert (as_core.message, as_core.reporting_component, as_core.involved_object.name) == (
            "uncorrectable ECC",
            "example.com/node-health-agent",
            node,
        )
        listed = events.list_namespaced_event(NS, field_selector=f"regarding.name={node}")
        assert [e.metadata.name for e in listed.items] == [name]
        patched = events.patch_namespaced_event(
            name, NS, {"series": {"count": 2, "lastObservedTime": "2026-01-02T03:05:05.000001Z"}}
        )
        assert patched.series.count == 2
    finally:
        events.delete_namespaced_event(name, NS)


def raw_call(api_client: client.ApiClient, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """Send ``body`` verbatim (the typed API methods re-serialise datetimes) and return status and JSON."""
    response = api_client.call_api(
        *api_client.param_serialize(
            method, path, body=body, header_params={"Content-Type": "application/json"}, auth_settings=["BearerToken"]
        )
    )
    response.read()
    return response.status, json.loads(response.data)


def test_microtime_requires_exactly_six_fractional_digits(core):
    """MicroTime (events.k8s.io ``eventTime``) parses with ``2006-01-02T15:04:05.000000Z07:00``: anything
    but exactly 6 fractional digits is a 400 decode error; any zone is accepted and printed as UTC ``Z``."""
    path = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"
    for value in (
        "2026-01-02T03:04:05Z",
        "2026-01-02T03:04:05.123Z",
        "2026-01-02T03:04:05.1234567Z",
        "2026-01-02T03:04:05+00:00",
        "2026-01-02T03:04:05.123456",
    ):
        status, body = raw_call(core.api_client, "POST", path, new_style_event(unique("ev"), "n1", value))
        assert status == 400, value
        assert body["reason"] == "BadRequest"
        assert body["message"].startswith('Event in version "v1" cannot be handled as a Event: parsing time'), value
    name = unique("ev")
    status, body = raw_call(
        core.api_client, "POST", path, new_style_event(name, "n1", "2026-01-02T03:04:05.123456+02:00")
    )
    assert status == 201
    assert body["eventTime"] == "2026-01-02T01:04:05.123456Z"
    client.EventsV1Api(core.api_client).delete_namespaced_event(name, NS)


def test_typed_create_of_a_whole_second_microtime_is_rejected(core):
    """The Python client turns create bodies into models and datetimes into ``isoformat()``; at microsecond 0
    that has no fraction, so a MicroTime field fails with 400 even when the dict held ``.000000Z``."""
    events = client.EventsV1Api(core.api_client)
    for event_time in (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05.000000Z"):
        with pytest.raises(ApiException) as raised:
            events.create_namespaced_event(NS, new_style_event(unique("ev"), "n1", event_time))
        assert raised.value.status == 400
        assert "parsing time" in status_of(raised.value)["message"]


def test_events_k8s_io_requires_reporting_fields_and_event_time(core):
    """events.k8s.io/v1 create: reportingController, reportingInstance, action, reason and eventTime are
    required (422 naming each field)."""
    path = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"
    status, body = raw_call(
        core.api_client,
        "POST",
        path,
        {
            "metadata": {"name": unique("ev")},
            "eventTime": "2026-01-02T03:04:05.000000Z",
            "regarding": node_ref("n1"),
            "type": "Normal",
        },
    )
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"].startswith("Event.events.k8s.io ")
    assert {"reportingController", "reportingInstance", "action", "reason"} <= {
        c["field"] for c in body["details"]["causes"]
    }

    status, body = raw_call(core.api_client, "POST", path, new_style_event(unique("ev"), "n1", None))
    assert status == 422
    assert "eventTime: Required value" in body["message"]


# --- leases -----------------------------------------------------------------------------------------------


def test_lease_microtime_round_trip_keeps_six_digits(core):
    """Lease acquireTime/renewTime are MicroTime: returned with exactly 6 fractional digits, and a datetime
    with microseconds round-trips through CoordinationV1Api."""
    leases = client.CoordinationV1Api(core.api_client)
    name = unique("lease")
    renew = datetime(2026, 1, 2, 3, 4, 5, 654321, tzinfo=UTC)
    created = leases.create_namespaced_lease(
        NS,
        client.V1Lease(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1LeaseSpec(
                holder_identity="agent-a", lease_duration_seconds=15, acquire_time=renew, renew_time=renew
            ),
        ),
    )
    try:
        assert created.spec.renew_time == renew
        raw = core.api_client.call_api(
            *core.api_client.param_serialize(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}", auth_settings=["BearerToken"]
            )
        )
        raw.read()
        spec = json.loads(raw.data)["spec"]
        assert spec["renewTime"] == "2026-01-02T03:04:05.654321Z"

        whole = leases.patch_namespaced_lease(name, NS, {"spec": {"renewTime": "2026-01-02T03:04:06.000000Z"}})
        assert whole.spec.renew_time == datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC)

        created.spec.renew_time = datetime(2026, 1, 2, 3, 4, 7, 1, tzinfo=UTC)
        with pytest.raises(ApiException) as raised:
            leases.replace_namespaced_lease(name, NS, created)
        assert raised.value.status == 409
        current = leases.read_namespaced_lease(name, NS)
        current.spec.renew_time = datetime(2026, 1, 2, 3, 4, 7, 1, tzinfo=UTC)
        assert leases.replace_namespaced_lease(name, NS, current).spec.renew_time == current.spec.renew_time
    finally:
        leases.delete_namespaced_lease(name, NS)


def test_lease_whole_second_datetime_from_the_python_client_is_rejected(core):
    """The Python client serialises ``datetime`` with ``isoformat()``; at microsecond 0 that has no
    fraction, which a MicroTime field rejects with 400 (format MicroTime yourself)."""
    leases = client.CoordinationV1Api(core.api_client)
    with pytest.raises(ApiException) as raised:
        leases.create_namespaced_lease(
            NS,
            client.V1Lease(
                metadata=client.V1ObjectMeta(name=unique("lease")),
                spec=client.V1LeaseSpec(holder_identity="a", renew_time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
            ),
        )
    assert raised.value.status == 400
    message = status_of(raised.value)["message"]
    assert message.startswith('Lease in version "v1" cannot be handled as a Lease: parsing time')


def test_lease_duration_must_be_positive(core):
    leases = client.CoordinationV1Api(core.api_client)
    with pytest.raises(ApiException) as raised:
        leases.create_namespaced_lease(NS, {"metadata": {"name": unique("lease")}, "spec": {"leaseDurationSeconds": 0}})
    assert raised.value.status == 422
    assert "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0" in status_of(raised.value)["message"]


# --- pods, PDBs and eviction ----------------------------------------------------------------------------


def test_list_pods_on_a_node_across_namespaces(core, make_pod):
    """``fieldSelector=spec.nodeName=<n>`` on /api/v1/pods; also ``status.phase`` and ``metadata.namespace``."""
    node = unique("node")
    on_node = make_pod(node_name=node, ready=True)
    make_pod(node_name=unique("other"))
    pending = make_pod(node_name=node)
    names = {p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items}
    assert names == {on_node.metadata.name, pending.metadata.name}
    running = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node},status.phase=Running")
    assert [p.metadata.name for p in running.items] == [on_node.metadata.name]
    scoped = core.list_namespaced_pod(NS, field_selector=f"spec.nodeName={node},metadata.namespace={NS}")
    assert len(scoped.items) == 2


def test_pod_create_resets_status_to_pending(core, make_pod):
    pod = make_pod()
    assert pod.status.phase == "Pending"


def wait_for_pdb(policy: client.PolicyV1Api, name: str, healthy: int, timeout: float = 20.0) -> Any:
    """Wait until the disruption controller has observed the PDB (immediate on the test server)."""
    deadline = time.monotonic() + timeout
    while True:
        pdb = policy.read_namespaced_pod_disruption_budget(name, NS)
        status = pdb.status
        if status and status.observed_generation == pdb.metadata.generation and status.current_healthy == healthy:
            return pdb
        if time.monotonic() > deadline:
            raise AssertionError(f"PDB {name} not observed: {status}")
        time.sleep(0.2)


def eviction(name: str) -> client.V1Eviction:
    return client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=NS))


def pod_or_none(core: client.CoreV1Api, name: str, namespace: str = NS) -> client.V1Pod | None:
    try:
        return core.read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def assert_terminating(pod: client.V1Pod | None, grace: int) -> None:
    """Marked for graceful deletion: deletionGracePeriodSeconds and deletionTimestamp = now + grace
    (now ~ the pod's creation a moment ago; the server prints whole seconds)."""
    assert pod is not None, "the pod is gone, expected it terminating"
    assert pod.metadata.deletion_grace_period_seconds == grace
    assert pod.metadata.deletion_timestamp is not None
    ahead = (pod.metadata.deletion_timestamp - pod.metadata.creation_timestamp).total_seconds()
    assert grace - 1 <= ahead <= grace + 10


@pytest.mark.parametrize(
    ("bound", "grace", "expected"),
    [
        pytest.param(True, None, 30, id="bound-spec-default-grace"),
        pytest.param(True, 7, 7, id="bound-delete-options-grace"),
        pytest.param(True, 0, None, id="bound-grace-0-is-gone"),
        pytest.param(False, None, None, id="unscheduled-is-gone"),
    ],
)
def test_eviction_deletes_the_pod_gracefully(core, make_pod, bound, grace, expected):
    """An allowed eviction is a graceful DELETE (real apiserver: a bound pod stays with a
    deletionTimestamp until its kubelet confirms), after a status write adding the
    DisruptionTarget condition."""
    pod = make_pod(node_name=unique("node") if bound else None, ready=bound)
    name = pod.metadata.name
    body = eviction(name)
    if grace is not None:
        body.delete_options = client.V1DeleteOptions(grace_period_seconds=grace)
    _, code, _ = core.create_namespaced_pod_eviction_with_http_info(name, NS, body)
    assert code == 201
    after = pod_or_none(core, name)
    if expected is None:
        assert after is None
        return
    assert_terminating(after, expected)
    targets = [(c.status, c.reason, c.message) for c in after.status.conditions if c.type == "DisruptionTarget"]
    assert targets == [("True", "EvictionByEvictionAPI", "Eviction API: evicting")]


def test_eviction_of_a_missing_pod_is_404(core):
    name = unique("pod")
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod_eviction(name, NS, eviction(name))
    assert raised.value.status == 404


def test_eviction_blocked_by_min_available_is_429_then_allowed(core, make_pod):
    """minAvailable (int): evicting below it is 429 TooManyRequests with a DisruptionBudget cause."""
    policy = client.PolicyV1Api(core.api_client)
    app = unique("app")
    pods = [make_pod(labels={"app": app}, ready=True, node_name="n") for _ in range(2)]
    pdb_name = unique("pdb")
    policy.create_namespaced_pod_disruption_budget(
        NS, {"metadata": {"name": pdb_name}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}}
    )
    try:
        pdb = wait_for_pdb(policy, pdb_name, healthy=2)
        assert (pdb.status.desired_healthy, pdb.status.disruptions_allowed) == (1, 1)
        core.create_namespaced_pod_eviction(pods[0].metadata.name, NS, eviction(pods[0].metadata.name))
        wait_for_pdb(policy, pdb_name, healthy=1)
        with pytest.raises(ApiException) as raised:
            core.create_namespaced_pod_eviction(pods[1].metadata.name, NS, eviction(pods[1].metadata.name))
        status = status_of(raised.value)
        assert raised.value.status == 429
        assert status["reason"] == "TooManyRequests"
        assert status["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
        assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
        assert core.read_namespaced_pod(pods[1].metadata.name, NS).metadata.name == pods[1].metadata.name
    finally:
        policy.delete_namespaced_pod_disruption_budget(pdb_name, NS)


def test_eviction_with_max_unavailable_percentage(kube_api, core, make_pod):
    """maxUnavailable "34%" of 3 pods rounds up to 2 disruptions.  (Against a real cluster a percentage
    needs pods owned by a scalable controller, hence test-server only.)"""
    policy = client.PolicyV1Api(core.api_client)
    app = unique("app")
    pods = [make_pod(labels={"app": app}, ready=True, node_name="n") for _ in range(3)]
    pdb_name = unique("pdb")
    policy.create_namespaced_pod_disruption_budget(
        NS,
        {"metadata": {"name": pdb_name}, "spec": {"maxUnavailable": "34%", "selector": {"matchLabels": {"app": app}}}},
    )
    assert wait_for_pdb(policy, pdb_name, healthy=3).status.disruptions_allowed == 2
    for pod in pods[:2]:
        core.create_namespaced_pod_eviction(pod.metadata.name, NS, eviction(pod.metadata.name))
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod_eviction(pods[2].metadata.name, NS, eviction(pods[2].metadata.name))
    assert raised.value.status == 429
    listed = policy.list_namespaced_pod_disruption_budget(NS)
    assert pdb_name in [p.metadata.name for p in listed.items]


def test_pending_pods_are_evicted_regardless_of_the_budget(kube_api, core, make_pod):
    policy = client.PolicyV1Api(core.api_client)
    app = unique("app")
    pod = make_pod(labels={"app": app})
    policy.create_namespaced_pod_disruption_budget(
        NS,
        {
            "metadata": {"name": unique("pdb")},
            "spec": {"minAvailable": "100%", "selector": {"matchLabels": {"app": app}}},
        },
    )
    core.create_namespaced_pod_eviction(pod.metadata.name, NS, eviction(pod.metadata.name))
    assert kube_api.get_object("pods", pod.metadata.name, NS) is None


# --- graceful pod deletion ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bound", "phase", "spec_grace", "requested", "expected"),
    [
        pytest.param(True, "Running", None, None, 30, id="bound-default-30"),
        pytest.param(True, "Running", 5, None, 5, id="bound-spec-grace"),
        pytest.param(True, "Running", 5, 12, 12, id="requested-overrides-spec"),
        pytest.param(True, "Running", None, -3, 1, id="negative-means-1"),
        pytest.param(True, None, None, None, 30, id="bound-pending-is-graceful-too"),
        pytest.param(True, "Running", None, 0, None, id="grace-0-removes-at-once"),
        pytest.param(True, "Running", 0, None, None, id="spec-grace-0-removes-at-once"),
        pytest.param(False, None, None, 10, None, id="unscheduled-removed-at-once"),
        pytest.param(True, "Succeeded", None, 10, None, id="succeeded-removed-at-once"),
        pytest.param(True, "Failed", None, None, None, id="failed-removed-at-once"),
    ],
)
def test_pod_delete_is_graceful_for_bound_running_pods(core, make_pod, bound, phase, spec_grace, requested, expected):
    """pod strategy CheckGracefulDelete: DeleteOptions.gracePeriodSeconds, else the pod's
    terminationGracePeriodSeconds; 0 for an unscheduled or terminal pod; negative means 1.  A bound
    pod with a period > 0 stays (200 with the pod) until its kubelet confirms."""
    pod = make_pod(node_name=unique("node") if bound else None, phase=phase, grace=spec_grace)
    name = pod.metadata.name
    kwargs = {} if requested is None else {"grace_period_seconds": requested}
    answered = core.delete_namespaced_pod(name, NS, **kwargs)
    assert answered.metadata.name == name
    after = pod_or_none(core, name)
    if expected is None:
        assert after is None
        return
    assert_terminating(after, expected)
    assert answered.metadata.deletion_grace_period_seconds == expected
    assert answered.metadata.deletion_timestamp == after.metadata.deletion_timestamp


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        pytest.param(None, 30, id="no-period-changes-nothing"),
        pytest.param(60, 30, id="longer-changes-nothing"),
        pytest.param(30, 30, id="equal-changes-nothing"),
        pytest.param(10, 10, id="shorter-moves-the-deadline-back"),
        pytest.param(0, None, id="zero-removes-it"),
    ],
)
def test_deleting_a_terminating_pod_may_only_shorten_its_grace_period(core, make_pod, second, expected):
    pod = make_pod(node_name=unique("node"), ready=True)
    name = pod.metadata.name
    first = core.delete_namespaced_pod(name, NS)
    assert first.metadata.deletion_grace_period_seconds == 30
    again = core.delete_namespaced_pod(name, NS, **({} if second is None else {"grace_period_seconds": second}))
    after = pod_or_none(core, name)
    if expected is None:
        assert after is None
        return
    assert after.metadata.deletion_grace_period_seconds == expected
    assert after.metadata.deletion_timestamp == first.metadata.deletion_timestamp - timedelta(seconds=30 - expected)
    assert again.metadata.deletion_grace_period_seconds == expected
    if expected == 30:
        assert after.metadata.resource_version == first.metadata.resource_version  # nothing written


def test_watch_sees_graceful_deletion_then_the_final_delete(core, make_pod):
    """The graceful DELETE is a MODIFIED event; the final DELETE with period 0 (what the kubelet sends)
    writes period 0 (MODIFIED) and then removes the pod (DELETED)."""
    pod = make_pod(node_name=unique("node"), ready=True)
    name = pod.metadata.name
    core.delete_namespaced_pod(name, NS)
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    events = first_events(
        core.list_namespaced_pod,
        3,
        NS,
        resource_version=pod.metadata.resource_version,
        field_selector=f"metadata.name={name}",
    )
    seen = [(e["type"], e["object"].metadata.deletion_grace_period_seconds) for e in events]
    assert seen == [("MODIFIED", 30), ("MODIFIED", 0), ("DELETED", 0)]


def test_dry_run_delete_of_a_bound_pod_answers_the_terminating_pod_and_changes_nothing(core, make_pod):
    pod = make_pod(node_name=unique("node"), ready=True)
    answered = core.delete_namespaced_pod(pod.metadata.name, NS, dry_run="All")
    assert answered.metadata.deletion_grace_period_seconds == 30
    after = core.read_namespaced_pod(pod.metadata.name, NS)
    assert after.metadata.deletion_timestamp is None
    assert after.metadata.resource_version == pod.metadata.resource_version


def test_delete_with_a_mismatched_uid_precondition_is_409(core, make_pod):
    """rest.BeforeDelete checks the preconditions first; the Conflict names the kind (``Pod``)."""
    pod = make_pod(node_name=unique("node"))
    name, wrong = pod.metadata.name, str(uuid.uuid4())
    body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=wrong))
    with pytest.raises(ApiException) as raised:
        core.delete_namespaced_pod(name, NS, body=body)
    assert raised.value.status == 409
    assert status_of(raised.value)["reason"] == "Conflict"
    assert status_of(raised.value)["message"] == (
        f'Operation cannot be fulfilled on Pod "{name}": the UID in the precondition ({wrong}) does not match '
        f"the UID in record ({pod.metadata.uid}). The object might have been deleted and then recreated"
    )
    assert core.read_namespaced_pod(name, NS).metadata.deletion_timestamp is None


@pytest.mark.parametrize(
    ("evict_grace", "expected"),
    [
        pytest.param(None, 30, id="no-period"),
        pytest.param(60, 30, id="longer-is-not-an-extension"),
        pytest.param(5, 5, id="shorter-shortens"),
    ],
)
def test_evicting_a_terminating_pod_skips_the_budget_and_never_extends_its_grace(core, make_pod, evict_grace, expected):
    """eviction.go canIgnorePDB: a pod with a deletionTimestamp is deleted without consulting its
    PodDisruptionBudget (201 even with no disruption allowed); the DELETE can only shorten the period.
    Terminating pods do not count as healthy."""
    policy = client.PolicyV1Api(core.api_client)
    app = unique("app")
    pod = make_pod(node_name=unique("node"), labels={"app": app}, ready=True)
    name = pod.metadata.name
    pdb_name = unique("pdb")
    policy.create_namespaced_pod_disruption_budget(
        NS, {"metadata": {"name": pdb_name}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}}
    )
    try:
        assert wait_for_pdb(policy, pdb_name, healthy=1).status.disruptions_allowed == 0
        with pytest.raises(ApiException) as raised:
            core.create_namespaced_pod_eviction(name, NS, eviction(name))
        assert raised.value.status == 429
        first = core.delete_namespaced_pod(name, NS)  # a DELETE does not consult budgets
        wait_for_pdb(policy, pdb_name, healthy=0)
        body = eviction(name)
        if evict_grace is not None:
            body.delete_options = client.V1DeleteOptions(grace_period_seconds=evict_grace)
        _, code, _ = core.create_namespaced_pod_eviction_with_http_info(name, NS, body)
        assert code == 201
        after = core.read_namespaced_pod(name, NS)
        assert after.metadata.deletion_grace_period_seconds == expected
        shift = timedelta(seconds=30 - expected)
        assert after.metadata.deletion_timestamp == first.metadata.deletion_timestamp - shift
    finally:
        policy.delete_namespaced_pod_disruption_budget(pdb_name, NS)


@pytest.mark.parametrize(
    "finalizer_first", [True, False], ids=["finalizer-then-final-delete", "final-delete-then-finalizer"]
)
def test_a_terminating_pod_with_a_finalizer_needs_both_the_final_delete_and_the_finalizer_gone(
    core, make_pod, finalizer_first
):
    """Removing the last finalizer deletes an object only when no graceful deletion is pending
    (deletionGracePeriodSeconds 0 or unset); the final DELETE (period 0) of an object with
    finalizers leaves it with period 0."""
    pod = make_pod(node_name=unique("node"), ready=True, finalizers=["example.com/hold"])
    name = pod.metadata.name
    core.delete_namespaced_pod(name, NS)

    def drop_finalizer() -> None:
        core.patch_namespaced_pod(name, NS, {"metadata": {"finalizers": None}})

    def final_delete() -> None:
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)

    first, second = (drop_finalizer, final_delete) if finalizer_first else (final_delete, drop_finalizer)
    first()
    between = pod_or_none(core, name)
    assert between is not None
    if finalizer_first:
        assert (between.metadata.finalizers, between.metadata.deletion_grace_period_seconds) == (None, 30)
    else:
        assert (between.metadata.finalizers, between.metadata.deletion_grace_period_seconds) == (
            ["example.com/hold"],
            0,
        )
    second()
    assert pod_or_none(core, name) is None


# --- the simulated kubelet (test-server only) -------------------------------------------------------------


class FakeClock:
    """An injectable server clock that only moves when told."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@contextlib.contextmanager
def clocked_server(clock: FakeClock) -> Iterator[tuple[KubeApiServer, client.CoreV1Api]]:
    server = KubeApiServer(clock=clock).start()
    api_client = server.api_client()
    try:
        yield server, client.CoreV1Api(api_client)
    finally:
        api_client.close()
        server.stop()


def bound_pod(core: client.CoreV1Api, node: str = "n1", namespace: str = NS, grace: int | None = None) -> str:
    name = unique("pod")
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": spec})
    return name


def in_order(*pods: tuple[str, str]) -> list[str]:
    """Pod names in the kubelet's (namespace, name) order."""
    return [name for _, name in sorted(pods)]


def test_kubelet_confirm_removes_terminating_pods_by_node_and_namespace(kube_api, core, make_pod):
    core.create_namespace({"metadata": {"name": "other"}})
    a1 = make_pod(node_name="n1").metadata.name
    a2 = make_pod(node_name="n1", namespace="other").metadata.name
    b = make_pod(node_name="n2").metadata.name
    untouched = make_pod(node_name="n1").metadata.name
    for name, namespace in ((a1, NS), (a2, "other"), (b, NS)):
        core.delete_namespaced_pod(name, namespace)
    assert kube_api.kubelet.terminating() == in_order((NS, a1), (NS, b), ("other", a2))
    assert kube_api.kubelet.terminating(node="n1") == in_order((NS, a1), ("other", a2))

    assert kube_api.kubelet.confirm(node="n1", namespace="other") == [a2]
    assert pod_or_none(core, a2, "other") is None
    assert kube_api.kubelet.confirm(node="n1") == [a1]
    assert pod_or_none(core, a1) is None and pod_or_none(core, b) is not None
    assert kube_api.kubelet.confirm() == [b]
    assert kube_api.kubelet.confirm() == []
    assert core.read_namespaced_pod(untouched, NS).metadata.deletion_timestamp is None


def test_kubelet_confirm_leaves_a_pod_with_finalizers_until_they_are_removed(kube_api, core, make_pod):
    name = make_pod(node_name="n1", finalizers=["example.com/hold"]).metadata.name
    core.delete_namespaced_pod(name, NS)
    assert kube_api.kubelet.confirm() == [name]
    held = core.read_namespaced_pod(name, NS)
    assert (held.metadata.deletion_grace_period_seconds, held.metadata.finalizers) == (0, ["example.com/hold"])
    assert kube_api.kubelet.terminating() == []
    core.patch_namespaced_pod(name, NS, {"metadata": {"finalizers": None}})
    assert pod_or_none(core, name) is None


def test_kubelet_auto_confirm_follows_the_server_clock():
    """Each pod goes ``delay`` seconds after it was marked, or when its grace period ends if sooner;
    pods marked before auto_confirm was turned on count from their marking."""
    clock = FakeClock()
    with clocked_server(clock) as (server, core):
        early, slow, quick = bound_pod(core), bound_pod(core), bound_pod(core, grace=2)
        core.delete_namespaced_pod(early, NS)  # marked at t0
        server.kubelet.auto_confirm(5)
        clock.advance(1)
        core.delete_namespaced_pod(slow, NS)  # t0+1
        core.delete_namespaced_pod(quick, NS)  # t0+1, grace period 2
        expected, t0 = {early, slow, quick}, clock.now - timedelta(seconds=1)
        for step, gone in ((0, ""), (2, quick), (1.5, ""), (0.5, early), (0.9, ""), (0.1, slow)):
            clock.advance(step)
            server.kubelet.sync()
            expected.discard(gone)
            assert set(server.kubelet.terminating()) == expected, f"at t0+{(clock.now - t0).total_seconds()}"
        assert core.list_namespaced_pod(NS).items == []


def test_kubelet_auto_confirm_is_off_by_default_and_none_turns_it_off():
    clock = FakeClock()
    with clocked_server(clock) as (server, core):
        first, second = bound_pod(core), bound_pod(core)
        core.delete_namespaced_pod(first, NS)
        assert not server.kubelet.running
        clock.advance(3600)
        server.kubelet.sync()
        assert server.kubelet.terminating() == [first]
        server.kubelet.confirm(name=first)
        server.kubelet.auto_confirm(60)
        assert server.kubelet.running
        core.delete_namespaced_pod(second, NS)
        server.kubelet.auto_confirm(None)
        server.kubelet.sync()
        assert not server.kubelet.running
        clock.advance(3600)
        assert server.kubelet.terminating() == [second]


def test_kubelet_auto_confirm_waits_out_an_outage():
    """The kubelet cannot reach an unavailable API server: pods due during an outage go after it."""
    clock = FakeClock()
    with clocked_server(clock) as (server, core):
        name = bound_pod(core)
        core.delete_namespaced_pod(name, NS)
        with server.outage("drop"):
            server.kubelet.auto_confirm(1)
            clock.advance(2)
            server.kubelet.sync()
            assert server.kubelet.terminating() == [name]
        server.kubelet.sync()
        assert server.kubelet.terminating() == []
        assert server.get_object("pods", name) is None


def test_kubelet_auto_confirm_with_the_real_clock_removes_the_pod(kube_api, core):
    kube_api.kubelet.auto_confirm(0)
    name = bound_pod(core)
    start = core.read_namespaced_pod(name, NS).metadata.resource_version
    core.delete_namespaced_pod(name, NS)
    events = first_events(
        core.list_namespaced_pod, 3, NS, resource_version=start, field_selector=f"metadata.name={name}"
    )
    assert [e["type"] for e in events] == ["MODIFIED", "MODIFIED", "DELETED"]


def test_server_stop_stops_the_kubelet_and_start_resumes_it():
    server = KubeApiServer().start()
    try:
        server.kubelet.auto_confirm(1)
        assert server.kubelet.running
        server.stop()
        assert not server.kubelet.running
        server.start()
        assert server.kubelet.running and server.kubelet.auto_confirm_delay == 1
    finally:
        server.stop()
    assert not server.kubelet.running


# --- watch ------------------------------------------------------------------------------------------------


def test_watch_from_a_resource_version_streams_added_modified_deleted(core):
    """A watch from a list's resourceVersion replays the later changes in order."""
    start = core.list_node().metadata.resource_version
    name = unique("node")
    core.create_node({"metadata": {"name": name, "labels": {"w": "1"}}})
    core.patch_node(name, {"metadata": {"labels": {"w": "2"}}})
    core.delete_node(name)

    seen = []
    stream = watch.Watch()
    for event in stream.stream(
        core.list_node, resource_version=start, timeout_seconds=5, field_selector=f"metadata.name={name}"
    ):
        seen.append((event["type"], event["object"].metadata.labels["w"]))
        if event["type"] == "DELETED":
            stream.stop()
    assert seen == [("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")]


def test_watch_label_selector_turns_leaving_the_selection_into_deleted(core, make_node):
    start = core.list_node().metadata.resource_version
    node = make_node(labels={"watched": "yes"})
    core.patch_node(node.metadata.name, {"metadata": {"labels": {"watched": "no"}}})
    seen = []
    stream = watch.Watch()
    for event in stream.stream(core.list_node, resource_version=start, timeout_seconds=5, label_selector="watched=yes"):
        if event["object"].metadata.name == node.metadata.name:
            seen.append(event["type"])
        if event["type"] == "DELETED":
            stream.stop()
    assert seen == ["ADDED", "DELETED"]


def test_watch_without_resource_version_starts_with_the_current_state(kube_api, core, make_node):
    node = make_node()
    stream = watch.Watch()
    first = next(
        iter(stream.stream(core.list_node, field_selector=f"metadata.name={node.metadata.name}", timeout_seconds=5))
    )
    stream.stop()
    assert (first["type"], first["object"].metadata.name) == ("ADDED", node.metadata.name)


def test_watch_from_a_compacted_resource_version_is_410_gone(kube_api, core, make_node):
    """A too-old resourceVersion yields an ERROR event carrying a 410 Expired Status; the client's
    Watch retries once and then raises ApiException(410)."""
    old = core.list_node().metadata.resource_version
    make_node()
    kube_api.compact()
    stream = watch.Watch()
    with pytest.raises(ApiException) as raised:
        for _ in stream.stream(core.list_node, resource_version=old):
            pass
    assert raised.value.status == 410

    line = raw_request(kube_api, "GET", f"/api/v1/nodes?watch=true&resourceVersion={old}")[1].splitlines()[0]
    error = json.loads(line)
    assert error["type"] == "ERROR"
    assert {k: error["object"][k] for k in ("kind", "status", "reason", "code")} == {
        "kind": "Status",
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
    }
    assert error["object"]["message"].startswith(f"too old resource version: {old} (")


def test_watch_ends_after_timeout_seconds(kube_api, core):
    started = time.monotonic()
    events = finishes(
        lambda: list(
            watch.Watch().stream(
                core.list_namespaced_pod, NS, timeout_seconds=1, resource_version=str(kube_api.resource_version)
            )
        ),
        what="a watch with timeoutSeconds=1",
    )
    assert events == []
    assert time.monotonic() - started >= 0.9, "ended before its timeoutSeconds"  # a lower bound: load only adds


def test_watch_of_events_and_pods(kube_api, core, make_pod):
    start = str(kube_api.resource_version)
    pod = make_pod()
    core.create_namespaced_event(
        NS, {"metadata": {"name": unique("ev")}, "involvedObject": node_ref("n"), "reason": "R"}
    )
    pods = first_events(core.list_pod_for_all_namespaces, 1, resource_version=start)
    events = first_events(core.list_namespaced_event, 1, NS, resource_version=start)
    assert [e["object"].metadata.name for e in pods] == [pod.metadata.name]
    assert [e["type"] for e in events] == ["ADDED"]


def first_events(list_func: Callable[..., Any], count: int, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """The first ``count`` watch events (the stream is stopped as soon as they arrived)."""
    stream = watch.Watch()
    seen = []
    for event in stream.stream(list_func, *args, timeout_seconds=5, **kwargs):
        seen.append(event)
        if len(seen) == count:
            stream.stop()
    return seen


# --- faults, outages, authentication (test-server only) --------------------------------------------------


def raw_request(
    server: KubeApiServer, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=5)
    all_headers = {"Authorization": f"Bearer {server.token}", **(headers or {})}
    payload = json.dumps(body) if body is not None else None
    if payload is not None:
        all_headers.setdefault("Content-Type", "application/json")
    connection.request(method, path, body=payload, headers=all_headers)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    return response.status, text


def seed_node(server: KubeApiServer, name: str = "n1") -> dict[str, Any]:
    return server.put_object(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "status": {"conditions": [{"type": t, "status": "False"} for t in KUBELET_CONDITIONS]},
        }
    )


def test_fault_429_with_retry_after_changes_nothing(kube_api, core):
    before = seed_node(kube_api)
    rule = kube_api.faults.add(method="PATCH", path_regex=r"/nodes/n1/status$", status=429, retry_after=7, count=1)
    with pytest.raises(ApiException) as raised:
        core.patch_node_status("n1", {"status": {"conditions": [{"type": "X", "status": "True"}]}})
    assert raised.value.status == 429
    assert raised.value.headers["Retry-After"] == "7"
    assert status_of(raised.value)["details"]["retryAfterSeconds"] == 7
    assert rule.hits == 1 and len(kube_api.faults) == 0
    assert kube_api.get_object("nodes", "n1") == before
    core.patch_node_status("n1", {"status": {"conditions": [{"type": "X", "status": "True"}]}})
    assert kube_api.requests.count(method="PATCH", path_regex="/status$") == 2
    assert [r.status for r in kube_api.requests.filter(method="PATCH")] == [429, 200]


@pytest.mark.parametrize("status", [500, 503, 504])
def test_fault_server_errors_change_nothing(kube_api, core, status):
    before = seed_node(kube_api)
    kube_api.faults.add(method="PATCH", status=status)
    with pytest.raises(ApiException) as raised:
        core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
    assert raised.value.status == status
    assert kube_api.get_object("nodes", "n1") == before


def test_fault_applied_carries_the_write_out_and_answers_the_error(kube_api, core):
    seed_node(kube_api)
    kube_api.faults.add(method="PATCH", status=500, kind="applied")
    with pytest.raises(ApiException) as raised:
        core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
    assert raised.value.status == 500
    assert kube_api.get_object("nodes", "n1")["metadata"]["labels"]["x"] == "1"
    assert kube_api.requests[-1].fault == "applied" and kube_api.requests[-1].status == 500


def test_fault_drop_closes_the_connection_without_answer(kube_api, core):
    before = seed_node(kube_api)
    kube_api.faults.add(method="PATCH", kind="drop")
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
    assert kube_api.get_object("nodes", "n1") == before
    assert kube_api.requests[-1].fault == "drop" and kube_api.requests[-1].status is None


def test_fault_timeout_hangs_past_the_client_timeout(kube_api, core):
    before = seed_node(kube_api)
    kube_api.faults.add(method="PATCH", kind="timeout", delay=3600.0)  # held until the server stops

    def patch() -> None:
        core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}}, _request_timeout=0.3)

    with pytest.raises(urllib3.exceptions.HTTPError) as raised:
        finishes(patch, what="a PATCH with a 0.3 s client timeout")
    # The client's own read timeout fired: the server never answered nor closed the connection.
    assert isinstance(raised.value, urllib3.exceptions.ReadTimeoutError) or isinstance(
        getattr(raised.value, "reason", None), urllib3.exceptions.ReadTimeoutError
    ), repr(raised.value)
    assert kube_api.get_object("nodes", "n1") == before


def test_outage_refuses_connections_then_recovers_with_state_intact(kube_api, core):
    before = seed_node(kube_api)
    with kube_api.outage("refuse"):
        with pytest.raises(urllib3.exceptions.MaxRetryError):
            client.CoreV1Api(kube_api.api_client()).read_node("n1", _request_timeout=1)
        assert not kube_api.available
    assert kube_api.get_object("nodes", "n1") == before
    assert core.read_node("n1").metadata.resource_version == before["metadata"]["resourceVersion"]


def test_outage_drop_mode_cuts_open_watches(kube_api, core):
    seed_node(kube_api)
    stream = watch.Watch()
    events = stream.stream(core.list_node, resource_version=str(kube_api.resource_version))
    kube_api.set_outage("drop")
    with contextlib.suppress(urllib3.exceptions.HTTPError, ApiException):
        assert list(events) == []
    with pytest.raises(http.client.RemoteDisconnected):
        raw_request(kube_api, "GET", "/api/v1/nodes")
    kube_api.set_outage(None)
    assert raw_request(kube_api, "GET", "/api/v1/nodes/n1")[0] == 200


def test_wrong_or_missing_token_is_401(kube_api):
    api = client.CoreV1Api(kube_api.api_client(token="wrong"))
    with pytest.raises(ApiException) as raised:
        api.list_node()
    assert raised.value.status == 401
    assert status_of(raised.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    status, _ = raw_request(kube_api, "GET", "/api/v1/nodes", headers={"Authorization": ""})
    assert status == 401


def test_rbac_restriction_is_403_with_the_real_message(kube_api, core):
    seed_node(kube_api)
    kube_api.restrict(
        [PolicyRule(("get",), ("",), ("nodes",)), PolicyRule(("patch",), ("",), ("nodes/status",))],
        user="system:serviceaccount:kube-system:agent",
    )
    core.patch_node_status("n1", {"status": {"conditions": [{"type": "X", "status": "True"}]}})
    with pytest.raises(ApiException) as raised:
        core.patch_node("n1", {"spec": {"unschedulable": True}})
    assert raised.value.status == 403
    assert status_of(raised.value)["message"] == (
        'nodes "n1" is forbidden: User "system:serviceaccount:kube-system:agent" cannot patch resource "nodes" '
        'in API group "" at the cluster scope'
    )


def test_kubeconfig_loads_with_the_real_config_loader(kube_api, tmp_path: Path):
    seed_node(kube_api)
    path = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        assert [n.metadata.name for n in client.CoreV1Api(api_client).list_node().items] == ["n1"]
        assert client.VersionApi(api_client).get_code().git_version.startswith("v1.")


def test_health_and_discovery_endpoints(kube_api):
    assert raw_request(kube_api, "GET", "/healthz") == (200, "ok")
    assert raw_request(kube_api, "GET", "/readyz") == (200, "ok")
    groups = json.loads(raw_request(kube_api, "GET", "/apis")[1])
    assert {g["name"] for g in groups["groups"]} >= {"coordination.k8s.io", "events.k8s.io", "policy"}
    core_resources = json.loads(raw_request(kube_api, "GET", "/api/v1")[1])
    assert {"nodes", "nodes/status", "pods/eviction", "events"} <= {r["name"] for r in core_resources["resources"]}


def test_dry_run_validates_without_persisting(kube_api, core):
    before = seed_node(kube_api)
    core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}}, dry_run="All")
    assert kube_api.get_object("nodes", "n1") == before


def test_put_object_seeds_state_and_emits_watch_events(kube_api, core):
    start = str(kube_api.resource_version)
    seed_node(kube_api, "seeded")
    events = first_events(core.list_node, 1, resource_version=start)
    assert [e["type"] for e in events] == ["ADDED"]
    assert kube_api.get_object("nodes", "seeded")["metadata"]["uid"]


def test_server_stop_releases_the_port():
    server = KubeApiServer().start()
    port = server.port
    server.stop()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


# --- the strategic-merge-patch engine on its own (documented semantics) ----------------------------------

POD = "io.k8s.api.core.v1.Pod"
NODE = "io.k8s.api.core.v1.Node"


def smp(original: dict[str, Any], patch: dict[str, Any], definition: str) -> dict[str, Any]:
    from kubeapi.schema import load_schema
    from kubeapi.smp import apply_strategic_merge_patch

    return apply_strategic_merge_patch(original, patch, load_schema().definition(definition))


def test_engine_merges_containers_by_name_and_replaces_atomic_lists():
    pod = {
        "spec": {
            "containers": [{"name": "a", "image": "a:1", "args": ["x", "y"]}, {"name": "b", "image": "b:1"}],
            "tolerations": [{"key": "t1", "operator": "Exists"}],
        }
    }
    patched = smp(
        pod,
        {
            "spec": {
                "containers": [{"name": "a", "image": "a:2", "args": ["z"]}],
                "tolerations": [{"key": "t2", "operator": "Exists"}],
            }
        },
        POD,
    )
    assert patched["spec"]["containers"] == [
        {"name": "a", "image": "a:2", "args": ["z"]},
        {"name": "b", "image": "b:1"},
    ]
    assert patched["spec"]["tolerations"] == [{"key": "t2", "operator": "Exists"}]


def test_engine_retain_keys_clears_unlisted_fields():
    pod = {"spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}}
    patched = smp(pod, {"spec": {"volumes": [{"name": "v", "$retainKeys": ["emptyDir", "name"], "emptyDir": {}}]}}, POD)
    assert patched["spec"]["volumes"] == [{"name": "v", "emptyDir": {}}]


def test_engine_map_directives_and_primitive_list_directives():
    node = {"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y", "z"]}}
    assert smp(node, {"metadata": {"labels": {"$patch": "replace", "c": "3"}}}, NODE)["metadata"]["labels"] == {
        "c": "3"
    }
    assert smp(node, {"metadata": {"labels": {"$patch": "delete"}}}, NODE)["metadata"]["labels"] == {}
    ordered = smp(node, {"metadata": {"$setElementOrder/finalizers": ["z", "x", "y"]}}, NODE)
    assert ordered["metadata"]["finalizers"] == ["z", "x", "y"]
    trimmed = smp(node, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["y"]}}, NODE)
    assert trimmed["metadata"]["finalizers"] == ["x", "z"]


def test_engine_rejects_unknown_directives():
    from kubeapi.smp import SmpError

    with pytest.raises(SmpError) as raised:
        smp({"metadata": {"labels": {"a": "1"}}}, {"metadata": {"labels": {"$patch": "shuffle"}}}, NODE)
    assert raised.value.category == "internal"
    assert raised.value.message.startswith("unknown patch type: shuffle in map:")


condition_types = st.lists(
    st.from_regex(r"[A-Z][a-z]{2,8}", fullmatch=True).filter(lambda t: t not in KUBELET_CONDITIONS),
    min_size=1,
    max_size=5,
    unique=True,
)


@settings(max_examples=60, deadline=None)
@given(
    first=condition_types,
    second=condition_types,
    statuses=st.lists(st.sampled_from(["True", "False"]), min_size=5, max_size=5),
)
def test_engine_condition_patches_never_touch_kubelet_conditions(first, second, statuses):
    kubelet = [{"type": t, "status": "False", "reason": f"K{t}"} for t in KUBELET_CONDITIONS]
    node = {"status": {"conditions": kubelet}}
    for batch in (first, second):
        patch = {"status": {"conditions": [{"type": t, "status": s} for t, s in zip(batch, statuses, strict=False)]}}
        node = smp(node, patch, NODE)
    conditions = node["status"]["conditions"]
    types = [c["type"] for c in conditions]
    assert len(types) == len(set(types)) == len(KUBELET_CONDITIONS) + len(set(first) | set(second))
    assert [c for c in conditions if c["type"] in KUBELET_CONDITIONS] == kubelet
    latest = {t: s for batch in (first, second) for t, s in zip(batch, statuses, strict=False)}
    assert {c["type"]: c["status"] for c in conditions if c["type"] in latest} == latest
