"""Installing on a real fleet: mixed GPU + Neuron + plain nodes in one install, and any namespace.

- Mixed: every Linux node runs exactly one agent, whatever labels it carries. The DaemonSets' node
  affinities are evaluated (In, NotIn, Exists, DoesNotExist, as the scheduler does) over every
  combination of the label values any of them names, for the kustomize overlay and for the chart
  with each combination of accelerators enabled.
- Any namespace: rendered into kube-system (Helm ``--namespace``; kustomize's documented overlay) with
  everything on, every namespace reference (objects, binding subjects, selectors, alerts, the Pod
  Identity association) follows, and the IAM trust-policy example takes the namespace as a variable.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.k8srender import DAEMONSET, EXAMPLES, NAMESPACE, REPO, Obj, helm_template, kustomize, relpath, validate

pytestmark = pytest.mark.slow  # renders with helm and kubectl

NodeLabels = dict[str, str]
ABSENT = object()


# ---- node affinity, as the scheduler evaluates it --------------------------------------------------------------


def _matches(expr: dict[str, Any], labels: NodeLabels) -> bool:
    op, key, values = expr["operator"], expr["key"], expr.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not expected")


def _terms(ds: Obj) -> list[list[dict[str, Any]]]:
    required = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    return [term["matchExpressions"] for term in required["nodeSelectorTerms"]]


def schedules(ds: Obj, labels: NodeLabels) -> bool:
    """Terms are ORed, the expressions of a term ANDed."""
    return any(all(_matches(e, labels) for e in term) for term in _terms(ds))


def nodes(daemonsets: list[Obj]) -> Iterator[NodeLabels]:
    """Every combination of: each key the affinities name absent, or set to any value they name, or another.

    Values that every expression treats alike (members of exactly the same ``values`` lists, e.g. two
    instance types of one list) are one case: one of them stands for all, which keeps the product small
    without leaving out any outcome an expression can have.
    """
    lists: dict[str, list[frozenset[str]]] = {}
    for ds in daemonsets:
        for term in _terms(ds):
            for e in term:
                lists.setdefault(e["key"], []).append(frozenset(e.get("values", [])))
    lists.setdefault("kubernetes.io/os", []).append(frozenset({"linux", "windows"}))
    values: dict[str, list[Any]] = {}
    for key, sets in lists.items():
        cases: dict[tuple[bool, ...], str] = {}
        for v in sorted(set().union(*sets) | {"something-else"}):
            cases.setdefault(tuple(v in s for s in sets), v)
        values[key] = [ABSENT, *sorted(cases.values())]
    keys = sorted(values)
    for combo in itertools.product(*(values[k] for k in keys)):
        yield {k: v for k, v in zip(keys, combo, strict=True) if v is not ABSENT}


def agents_per_node(daemonsets: list[Obj]) -> dict[int, list[NodeLabels]]:
    out: dict[int, list[NodeLabels]] = {}
    for labels in nodes(daemonsets):
        if labels.get("kubernetes.io/os") != "linux":
            assert not any(schedules(ds, labels) for ds in daemonsets), f"an agent on a non-Linux node {labels}"
            continue
        n = sum(schedules(ds, labels) for ds in daemonsets)
        out.setdefault(n, []).append(labels)
    return out


def _daemonsets(docs: list[Obj]) -> list[Obj]:
    return [d for d in docs if d["kind"] == "DaemonSet"]


def test_mixed_overlay_runs_exactly_one_agent_on_every_linux_node() -> None:
    daemonsets = _daemonsets(kustomize(DAEMONSET / "overlays" / "mixed"))
    assert len(daemonsets) == 3
    counts = agents_per_node(daemonsets)
    assert set(counts) == {1}, {n: nodes[:3] for n, nodes in counts.items() if n != 1}
    assert len(counts[1]) > 100, "the combinations cover the instance types and labels"


@pytest.mark.parametrize(
    "enabled",
    [
        ("neuron", "nvidia", "generic"),
        ("neuron", "generic"),
        ("nvidia", "generic"),
        ("neuron", "nvidia"),
        ("neuron",),
        ("generic",),
    ],
    ids="+".join,
)
def test_chart_runs_at_most_one_agent_per_node_and_one_everywhere_with_generic(enabled: tuple[str, ...]) -> None:
    sets = tuple(f"accelerators.{a}.enabled={str(a in enabled).lower()}" for a in ("neuron", "nvidia", "generic"))
    daemonsets = _daemonsets(helm_template(sets=sets))
    assert sorted(d["metadata"]["name"] for d in daemonsets) == sorted(f"node-health-agent-{a}" for a in enabled)
    counts = agents_per_node(daemonsets)
    assert set(counts) <= ({1} if "generic" in enabled else {0, 1}), {
        n: nodes[:3] for n, nodes in counts.items() if n > 1
    }
    # A node with an accelerator's label gets that accelerator's agent, not the generic one.
    by_name = {d["metadata"]["name"]: d for d in daemonsets}
    trn = {"kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "trn1.32xlarge"}
    gpu = {"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"}
    for accelerator, labels in (("neuron", trn), ("nvidia", gpu)):
        if accelerator in enabled:
            assert [n for n, ds in by_name.items() if schedules(ds, labels)] == [f"node-health-agent-{accelerator}"]


def test_mixed_agents_are_the_single_kind_agents_but_for_their_nodes() -> None:
    """The mixed overlay changes only node affinity: each DaemonSet and ConfigMap is otherwise the one of the
    single-kind overlay (whose privilege split, mounts and RBAC tests/deploy/test_manifests.py checks)."""
    mixed = kustomize(DAEMONSET / "overlays" / "mixed")
    for kind in ("neuron", "nvidia", "generic"):
        single = kustomize(DAEMONSET / "overlays" / kind)
        for obj_kind in ("DaemonSet", "ConfigMap"):
            (a,) = [
                d
                for d in mixed
                if d["kind"] == obj_kind
                and d["metadata"]["name"].startswith(
                    f"node-health-agent-{'rules-' if obj_kind == 'ConfigMap' else ''}{kind}"
                )
            ]
            (b,) = [d for d in single if d["kind"] == obj_kind]
            if obj_kind == "DaemonSet":
                for obj in (a, b):
                    del obj["spec"]["template"]["spec"]["affinity"]
            assert a == b, f"{obj_kind} {kind}"
    assert {d["kind"] for d in mixed} == {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
    }


def test_the_node_evaluator_sees_an_overlap() -> None:
    """Two DaemonSets selecting the same nodes are caught (the tests above are not vacuous)."""
    docs = kustomize(DAEMONSET / "overlays" / "neuron") + kustomize(DAEMONSET / "overlays" / "generic")
    counts = agents_per_node(_daemonsets(docs))
    assert 2 in counts and all(
        n.get("node.kubernetes.io/instance-type", "").startswith(("inf", "trn"))
        or n.get("karpenter.k8s.aws/instance-accelerator-manufacturer") == "aws"
        for n in counts[2]
    )


# ---- real nodes: the labels EKS, Karpenter, EKS Auto Mode and the GPU Operator put on them ----------------------

_LINUX = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": "us-east-2a"}


def _mng(instance_type: str) -> NodeLabels:
    """A node of an EKS managed node group (EKS-optimized AMI, device plugin only: no GFD / NFD labels)."""
    return {
        **_LINUX,
        "node.kubernetes.io/instance-type": instance_type,
        "beta.kubernetes.io/instance-type": instance_type,
        "eks.amazonaws.com/nodegroup": "workers",
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        "eks.amazonaws.com/nodegroup-image": "ami-0abcdef1234567890",
        "k8s.io/cloud-provider-aws": "0123456789abcdef",
    }


def _karpenter(instance_type: str, **extra: str) -> NodeLabels:
    family = instance_type.split(".")[0]
    return {
        **_LINUX,
        "node.kubernetes.io/instance-type": instance_type,
        "karpenter.sh/nodepool": "accelerated",
        "karpenter.sh/capacity-type": "on-demand",
        "karpenter.k8s.aws/instance-family": family,
        "karpenter.k8s.aws/instance-category": family.rstrip("0123456789en-b")[:3],
        **{f"karpenter.k8s.aws/{k.replace('_', '-')}": v for k, v in extra.items()},
    }


def _auto_mode(instance_type: str, **extra: str) -> NodeLabels:
    return {
        **_LINUX,
        "node.kubernetes.io/instance-type": instance_type,
        "eks.amazonaws.com/compute-type": "auto",
        "eks.amazonaws.com/instance-family": instance_type.split(".")[0],
        **{f"eks.amazonaws.com/{k.replace('_', '-')}": v for k, v in extra.items()},
    }


NVIDIA_GPU = {"instance_gpu_manufacturer": "nvidia", "instance_gpu_count": "8"}
NEURON = {"instance_accelerator_manufacturer": "aws", "instance_accelerator_count": "16"}

# node -> the agent it must run in an install of every agent (None: no agent).
REAL_NODES: dict[str, tuple[NodeLabels, str | None]] = {
    "p5 managed node group": (_mng("p5.48xlarge"), "nvidia"),
    "p5en managed node group": (_mng("p5en.48xlarge"), "nvidia"),
    "g5 managed node group": (_mng("g5.12xlarge"), "nvidia"),
    "g6e managed node group": (_mng("g6e.xlarge"), "nvidia"),
    "p5 Karpenter": (_karpenter("p5.48xlarge", instance_gpu_name="h100", **NVIDIA_GPU), "nvidia"),
    "a GPU type newer than the list, Karpenter": (_karpenter("p7.48xlarge", **NVIDIA_GPU), "nvidia"),
    "a GPU type newer than the list, Auto Mode": (_auto_mode("g7.12xlarge", **NVIDIA_GPU), "nvidia"),
    "g4ad (AMD GPU), Karpenter": (_karpenter("g4ad.4xlarge", instance_gpu_manufacturer="amd"), "generic"),
    "trn2 managed node group": (_mng("trn2.48xlarge"), "neuron"),
    "trn2 Karpenter": (_karpenter("trn2.48xlarge", instance_accelerator_name="trainium2", **NEURON), "neuron"),
    "inf2 managed node group": (_mng("inf2.xlarge"), "neuron"),
    "inf2 Karpenter": (_karpenter("inf2.xlarge", instance_accelerator_name="inferentia", **NEURON), "neuron"),
    "a Neuron type newer than the list, Karpenter": (_karpenter("trn3.48xlarge", **NEURON), "neuron"),
    "CPU managed node group": (_mng("m7i.2xlarge"), "generic"),
    "CPU Karpenter": (_karpenter("c7g.4xlarge", instance_cpu_manufacturer="aws"), "generic"),
    "GPU Feature Discovery, on premises": (
        {**_LINUX, "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "nvidia",
    ),
    "Node Feature Discovery, on premises": (
        {**_LINUX, "feature.node.kubernetes.io/pci-10de.present": "true"},
        "nvidia",
    ),
    "a Windows node": ({"kubernetes.io/os": "windows", "node.kubernetes.io/instance-type": "g5.xlarge"}, None),
}

# install -> the agents it runs; a node whose agent is not among them gets none.
INSTALLS = {
    "helm mixed": (lambda: helm_template(EXAMPLES / "mixed.yaml"), {"neuron", "nvidia", "generic"}),
    "helm eks": (lambda: helm_template(EXAMPLES / "eks.yaml"), {"neuron", "nvidia", "generic"}),
    "helm nvidia": (lambda: helm_template(EXAMPLES / "nvidia.yaml"), {"nvidia"}),
    "helm neuron": (lambda: helm_template(EXAMPLES / "neuron.yaml"), {"neuron"}),
    "helm defaults": (lambda: helm_template(), {"neuron", "nvidia"}),
    "kustomize mixed": (lambda: kustomize(DAEMONSET / "overlays" / "mixed"), {"neuron", "nvidia", "generic"}),
    "kustomize eks": (lambda: kustomize(DAEMONSET / "overlays" / "eks"), {"neuron", "nvidia", "generic"}),
    "kustomize nvidia": (lambda: kustomize(DAEMONSET / "overlays" / "nvidia"), {"nvidia"}),
    "kustomize neuron": (lambda: kustomize(DAEMONSET / "overlays" / "neuron"), {"neuron"}),
}


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_real_eks_nodes_each_get_exactly_their_agent(install: str) -> None:
    render, runs = INSTALLS[install]
    daemonsets = _daemonsets(render())
    assert {d["metadata"]["name"].removeprefix("node-health-agent-") for d in daemonsets} == runs
    wrong = {}
    for node, (labels, agent) in REAL_NODES.items():
        got = sorted(
            d["metadata"]["name"].removeprefix("node-health-agent-") for d in daemonsets if schedules(d, labels)
        )
        want = [agent] if agent in runs else []
        if got != want:
            wrong[node] = got
    assert not wrong, wrong


# ---- any namespace -----------------------------------------------------------------------------------------------


def _namespace_references(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every (path, value) that names a namespace: ``namespace`` fields, namespaceSelector names, PromQL matchers."""
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}"
            if key == "namespace" and isinstance(value, str):
                yield here, value
            elif key == "matchNames":
                yield from ((here, v) for v in value)
            elif key == "kubernetes.io/metadata.name" and "namespaceSelector" in path:
                continue  # the scraper's namespace (monitoring), not ours
            else:
                yield from _namespace_references(value, here)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _namespace_references(item, f"{path}[{i}]")
    elif isinstance(node, str):
        for match in re.finditer(r'namespace\s*=~?\s*"([^"]*)"', node):
            yield path, match.group(1)
        for match in re.finditer(r"system:serviceaccount:([^:\s']+):", node):
            yield path, match.group(1)


def check_every_reference(docs: list[Obj], namespace: str) -> None:
    for doc in docs:
        validate(doc)
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        refs = [(p, v) for p, v in _namespace_references(doc) if doc["kind"] != "Namespace"]
        # Events about Nodes go to `default` (the API server accepts them nowhere else): not a reference to ours.
        wrong = [(p, v) for p, v in refs if v != namespace]
        assert not wrong, f"{where} names another namespace: {wrong}"
        cluster_scoped = doc["kind"] in {
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }
        assert ("namespace" in doc["metadata"]) is not cluster_scoped, where
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert bindings
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "node-health-agent", "namespace": namespace}]
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert sa["metadata"]["namespace"] == namespace


EVERYTHING = EXAMPLES / "eks.yaml"


@pytest.mark.parametrize("namespace", ["kube-system", "monitoring-agents"])
def test_chart_follows_the_namespace(namespace: str) -> None:
    docs = helm_template(EVERYTHING, EXAMPLES / "pod-identity.yaml", namespace=namespace)
    kinds = {d["kind"] for d in docs}
    assert {"RoleBinding", "PodMonitor", "PrometheusRule", "NetworkPolicy", "PodIdentityAssociation"} <= kinds
    check_every_reference(docs, namespace)


def _overlay(tmp: Path, text: str) -> Path:
    (tmp / "kustomization.yaml").write_text(text)
    return tmp


def test_kube_system_overlay_binds_every_subject() -> None:
    docs = kustomize(DAEMONSET / "overlays" / "kube-system")
    assert not [d for d in docs if d["kind"] == "Namespace"], "kube-system exists: not ours to create"
    check_every_reference(docs, "kube-system")


def test_everything_moved_to_kube_system_the_documented_way(tmp_path: Path) -> None:
    """The eks overlay (recovery, alerts, dashboards, network and admission policies) into kube-system the way
    overlays/kube-system does it: every component's objects and subjects follow."""
    documented = yaml.safe_load((DAEMONSET / "overlays" / "kube-system" / "kustomization.yaml").read_text())
    documented["resources"] = [relpath(DAEMONSET / "overlays" / "eks", tmp_path)]
    docs = kustomize(_overlay(tmp_path, yaml.safe_dump(documented)))
    assert {"Role", "RoleBinding", "PodMonitor", "PrometheusRule", "NetworkPolicy"} <= {d["kind"] for d in docs}
    check_every_reference(docs, "kube-system")


def test_a_namespace_of_your_own_keeps_the_pod_security_label(tmp_path: Path) -> None:
    """The other route the kube-system overlay documents: rename the Namespace object too."""
    documented = yaml.safe_load((DAEMONSET / "overlays" / "kube-system" / "kustomization.yaml").read_text())
    documented["resources"] = [relpath(DAEMONSET / "overlays" / "mixed", tmp_path)]
    documented["transformers"] = [documented["transformers"][0].replace("kube-system", "health")]
    documented["patches"] = [
        {
            "target": {"kind": "Namespace", "name": NAMESPACE},
            "patch": '[{"op": "replace", "path": "/metadata/name", "value": "health"}]',
        }
    ]
    docs = kustomize(_overlay(tmp_path, yaml.safe_dump(documented)))
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == "health"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    check_every_reference(docs, "health")


def test_plain_namespace_field_is_not_enough(tmp_path: Path) -> None:
    """Why the overlay uses the NamespaceTransformer: `namespace:` alone leaves the bindings behind (403s)."""
    text = yaml.safe_dump(
        {
            "resources": [relpath(DAEMONSET / "overlays" / "mixed", tmp_path)],
            "namespace": "kube-system",
        }
    )
    docs = kustomize(_overlay(tmp_path, text))
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"][0]["namespace"] == NAMESPACE


def test_iam_trust_policy_example_takes_the_namespace() -> None:
    """iam/README.md's IRSA trust policy and Pod Identity association use ${NAMESPACE}, set once."""
    text = (REPO / "iam" / "README.md").read_text()
    assert "system:serviceaccount:${NAMESPACE}:node-health-agent" in text
    assert not re.search(r"system:serviceaccount:(?!\$\{NAMESPACE\})", text), "a namespace written out"
    assert re.search(r"^export NAMESPACE=node-health-agent", text, re.M)
    assert '--namespace "$NAMESPACE"' in text and '-n "$NAMESPACE"' in text
