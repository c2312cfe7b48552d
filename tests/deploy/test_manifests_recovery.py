"""The optional kustomize components: recovery (acting, with its RBAC) and CloudWatch.

Rendered the way a user layers them onto an overlay (a throwaway kustomization outside the repository).
The recovery RBAC must be exactly what the recovery code calls (agent/adapters/kube.py methods the recovery
package uses), and the base stays report-only without it.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest
import yaml

from agent.app.settings import parse_enable_recovery

from helpers import REPO
from helpers.k8stools import kube_tools

DAEMONSET = REPO / "daemonset"
NAMESPACE = "node-health-agent"

# KubeClient method -> the (apiGroup, resource, verb) it needs. Every method the recovery package calls.
RECOVERY_CALLS = {
    "get_node": ("", "nodes", "get"),
    "list_nodes": ("", "nodes", "list"),
    "patch_node": ("", "nodes", "patch"),
    "list_pods_on_node": ("", "pods", "list"),
    "evict_pod": ("", "pods/eviction", "create"),
    "get_lease": ("coordination.k8s.io", "leases", "get"),
    "create_lease": ("coordination.k8s.io", "leases", "create"),
    "replace_lease": ("coordination.k8s.io", "leases", "update"),
    # The device fence (agent/recovery/fence.py, docs/deploy.md "Device isolation"); resource_api_version
    # reads discovery, which every authenticated user may.
    "list_resource_slices": ("resource.k8s.io", "resourceslices", "list"),
    "get_device_taint_rule": ("resource.k8s.io", "devicetaintrules", "get"),
    "list_device_taint_rules": ("resource.k8s.io", "devicetaintrules", "list"),
    "create_device_taint_rule": ("resource.k8s.io", "devicetaintrules", "create"),
    "patch_device_taint_rule": ("resource.k8s.io", "devicetaintrules", "patch"),
    "delete_device_taint_rule": ("resource.k8s.io", "devicetaintrules", "delete"),
}
# Granted on purpose to nobody: delete_pod is used only with drain.onDeadline: delete (documented).
NOT_GRANTED = {"delete_pod"}
NO_RBAC = {"resource_api_version"}  # discovery (/apis/resource.k8s.io): system:discovery grants it to everyone
# Granted with no call behind it yet (issue 35's deploy brief): the rest of the read verbs, for a watch-based
# read-back of a rule's status and of the node's ResourceSlices, and update (replace) next to patch. Each is
# within what the admission policy narrows to the agent's own node's devices.
GRANTED_AHEAD = {
    ("resource.k8s.io", "devicetaintrules", "watch"),
    ("resource.k8s.io", "devicetaintrules", "update"),
    ("resource.k8s.io", "resourceslices", "get"),
    ("resource.k8s.io", "resourceslices", "watch"),
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("recovery")
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DAEMONSET / "overlays" / "neuron", root)],
                "components": [
                    os.path.relpath(DAEMONSET / "components" / "recovery", root),
                    os.path.relpath(DAEMONSET / "components" / "cloudwatch", root),
                ],
            }
        )
    )
    proc = subprocess.run([kube_tools().kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def granted(docs: list[dict[str, Any]], *kinds: str) -> set[tuple[str, str, str]]:
    out = set()
    for doc in docs:
        if doc["kind"] in kinds:
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        out.update((group, resource, verb) for verb in rule["verbs"])
    return out


def recovery_methods() -> set[str]:
    """KubeClient methods called anywhere in agent/recovery (``client.<name>(`` / ``_client.<name>(``)."""
    text = "\n".join(p.read_text() for p in (REPO / "agent" / "recovery").glob("*.py"))
    return set(re.findall(r"client\.(\w+)\(", text)) - {"close"}


def test_the_table_names_every_call_the_recovery_code_makes():
    assert recovery_methods() <= set(RECOVERY_CALLS) | NOT_GRANTED | NO_RBAC


PAUSE_ROLE = "node-health-agent-recovery-pause"  # for operators (pause/resume), bound to no agent


def test_recovery_rbac_is_exactly_what_recovery_calls(rendered):
    rendered = [d for d in rendered if d["metadata"]["name"] != PAUSE_ROLE]
    base = {("", "nodes", "get"), ("", "nodes/status", "patch")}
    base |= {(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")}
    cluster = granted(rendered, "ClusterRole")
    namespaced = granted(rendered, "Role")
    assert cluster | namespaced == base | set(RECOVERY_CALLS.values()) | GRANTED_AHEAD
    assert {c for c in RECOVERY_CALLS.values() if c[0] == "coordination.k8s.io"} == namespaced, (
        "Leases only in the agent's namespace"
    )
    (role,) = [d for d in rendered if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == NAMESPACE
    for binding in [d for d in rendered if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "node-health-agent", "namespace": NAMESPACE}]


def test_the_pause_role_is_for_operators_and_no_agent_holds_it(rendered):
    (role,) = [d for d in rendered if d["metadata"]["name"] == PAUSE_ROLE]
    assert (role["kind"], role["metadata"]["namespace"]) == ("Role", NAMESPACE)
    assert granted([role], "Role") == {
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
        ("", "events", "create"),
        ("", "pods", "list"),  # pause and status see which pause Lease the agent pods read
    }
    assert not [d for d in rendered if d["kind"].endswith("Binding") and d["roleRef"]["name"] == PAUSE_ROLE]


def test_the_components_turn_recovery_and_cloudwatch_on(rendered):
    (ds,) = [d for d in rendered if d["kind"] == "DaemonSet"]
    (agent,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    env = {e["name"]: e for e in agent["env"]}
    assert parse_enable_recovery(env["ENABLE_RECOVERY"]["value"]) is True
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["RECOVERY_STARTUP_DELAY"]["value"] == "60s"
    assert env["NHA_AGGREGATE_CONDITION"]["value"] == "true"
    assert env["NHA_CLOUDWATCH"]["value"] == "true"
    assert env["NHA_DIAGNOSTICS_KEEP"]["value"] == "5", "bundles before a remedy, in the state directory"
    assert env["CLUSTER_NAME"]["value"] == "", "the user sets it; the agent exits 2 naming CLUSTER_NAME until then"
    assert (DAEMONSET / "aws" / "cloudwatch-alarms.cfn.yaml").is_file()


def test_pod_events_may_land_in_any_namespace(rendered):
    """The Events about the pods holding a faulty device go to each pod's namespace: the base ClusterRole grants
    events create/patch (core and events.k8s.io) and a ClusterRoleBinding binds it, so every namespace is
    covered (the admission policy narrows them to pods' Events reported by the agent's own node)."""
    (role,) = [d for d in rendered if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "node-health-agent"]
    assert {(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")} <= granted(
        [role], "ClusterRole"
    )
    (binding,) = [
        d for d in rendered if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "node-health-agent"
    ]
    assert binding["roleRef"]["kind"] == "ClusterRole"


def test_device_taint_rules_are_granted_cluster_wide_only_with_recovery(rendered):
    """The fence's grants come with the recovery component (a cluster-scoped ClusterRole: DeviceTaintRules
    are cluster-scoped), never with the base."""
    (role,) = [
        d for d in rendered if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "node-health-agent-recovery"
    ]
    assert {r for r in granted([role], "ClusterRole") if r[0] == "resource.k8s.io"} == {
        c for c in RECOVERY_CALLS.values() if c[0] == "resource.k8s.io"
    } | GRANTED_AHEAD
    kubectl = kube_tools().kubectl
    proc = subprocess.run(
        [kubectl, "kustomize", str(DAEMONSET / "overlays" / "neuron")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    base = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert not [r for r in granted(base, "ClusterRole", "Role") if r[0] == "resource.k8s.io"]
