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
}
# Granted on purpose to nobody: delete_pod is used only with drain.onDeadline: delete (documented).
NOT_GRANTED = {"delete_pod"}


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
    assert recovery_methods() <= set(RECOVERY_CALLS) | NOT_GRANTED


PAUSE_ROLE = "node-health-agent-recovery-pause"  # for operators (pause/resume), bound to no agent


def test_recovery_rbac_is_exactly_what_recovery_calls(rendered):
    rendered = [d for d in rendered if d["metadata"]["name"] != PAUSE_ROLE]
    base = {("", "nodes", "get"), ("", "nodes/status", "patch")}
    base |= {(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")}
    cluster = granted(rendered, "ClusterRole")
    namespaced = granted(rendered, "Role")
    assert cluster | namespaced == base | set(RECOVERY_CALLS.values())
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
