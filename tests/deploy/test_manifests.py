"""The kustomize manifests under daemonset/: render every overlay and check the deployment contract.

Each overlay is rendered once with ``kubectl kustomize`` (kubectl 1.33 from tests/helpers/k8stools.py).
Built-in kinds are schema-validated with ``kubernetes_validate`` (strict: unknown fields fail) and
Prometheus Operator objects checked structurally, by helpers/k8srender.py. The assertions encode the privilege split:
only the kmsg relay is privileged, only the chown init container also runs as root, and the API
token reaches the unprivileged agent container alone, with exactly the RBAC it needs. The host's
/sys and /dev reach the agent read-only, and only in the overlays whose checks read them; each
overlay's rules.yaml and checks.yaml load, with its packs, into checks that build.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.app.config import (  # noqa: E402
    build_scheduled_checks,
    load_agent_config,
    load_rule_set,  # noqa: E402
)
from agent.app.settings import rule_dirs  # noqa: E402
from agent.checks.loader import BrokenCheck  # noqa: E402
from agent.checks.model import CheckContext  # noqa: E402
from agent.core.configfiles import Kind  # noqa: E402

from helpers import REPO
from helpers.k8srender import validate
from helpers.k8stools import kube_tools

pytestmark = pytest.mark.slow  # renders with kubectl kustomize

DAEMONSET_DIR = REPO / "daemonset"
COMPONENT = DAEMONSET_DIR / "components" / "prometheus-operator"

NAMESPACE = "node-health-agent"
NAME = "node-health-agent"
OPERATOR_ROLE = "node-health-agent-operator"  # for the people who run status, pause and clear

RELAY = "kmsg-relay"
AGENT = "agent"
CHOWN_INIT = "init-state-dir"
STATE_DIR = "/var/lib/node-health-agent"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
RULES_DIR = "/etc/node-health-agent"
CONFIG_FILES = ("rules.yaml", "checks.yaml")  # the ConfigMap's keys, passed with --config in this order
RELAY_DIR = "/run/node-health-agent"
AGENT_UID = 65532
METRICS_PORT = 20257

OS_LINUX = ("kubernetes.io/os", "In", ("linux",))
NEURON_INSTANCE_TYPES = (
    "inf1.xlarge",
    "inf1.2xlarge",
    "inf1.6xlarge",
    "inf1.24xlarge",
    "inf2.xlarge",
    "inf2.8xlarge",
    "inf2.24xlarge",
    "inf2.48xlarge",
    "inf2e.32xlarge",
    "trn1.2xlarge",
    "trn1.32xlarge",
    "trn1n.32xlarge",
    "trn2.48xlarge",
    "trn2u.48xlarge",
)
# EC2 instance types with NVIDIA GPUs: what an EKS managed node group's GPU node carries (no GFD / NFD labels).
NVIDIA_INSTANCE_TYPES = (
    "p3.2xlarge",
    "p3.8xlarge",
    "p3.16xlarge",
    "p3dn.24xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.4xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p6-b200.48xlarge",
    "p6-b300.48xlarge",
    "p6e-gb200.36xlarge",
    "g4dn.xlarge",
    "g4dn.2xlarge",
    "g4dn.4xlarge",
    "g4dn.8xlarge",
    "g4dn.12xlarge",
    "g4dn.16xlarge",
    "g4dn.metal",
    "g5.xlarge",
    "g5.2xlarge",
    "g5.4xlarge",
    "g5.8xlarge",
    "g5.12xlarge",
    "g5.16xlarge",
    "g5.24xlarge",
    "g5.48xlarge",
    "g5g.xlarge",
    "g5g.2xlarge",
    "g5g.4xlarge",
    "g5g.8xlarge",
    "g5g.16xlarge",
    "g5g.metal",
    "g6.xlarge",
    "g6.2xlarge",
    "g6.4xlarge",
    "g6.8xlarge",
    "g6.12xlarge",
    "g6.16xlarge",
    "g6.24xlarge",
    "g6.48xlarge",
    "g6e.xlarge",
    "g6e.2xlarge",
    "g6e.4xlarge",
    "g6e.8xlarge",
    "g6e.12xlarge",
    "g6e.16xlarge",
    "g6e.24xlarge",
    "g6e.48xlarge",
    "g6f.large",
    "g6f.xlarge",
    "g6f.2xlarge",
    "g6f.4xlarge",
    "gr6.4xlarge",
    "gr6.8xlarge",
    "gr6f.4xlarge",
)

# (apiGroup, resource) -> verbs. Exactly this, nothing more (no cordon, evict, list or watch).
EXPECTED_RBAC = {
    ("", "nodes"): {"get"},
    ("", "nodes/status"): {"patch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}

# Metric names the agent exports (docs/deploy.md), and the external ones the alerts may use.
AGENT_METRICS = {
    "problem_counter",
    "problem_gauge",
    "node_health_agent_problems_total",
    "node_health_agent_condition_status",
    "node_health_agent_kmsg_records_read_total",
    "node_health_agent_kmsg_records_lost_total",
    "node_health_agent_kmsg_reader_restarts_total",
    "node_health_agent_rule_matches_total",
    "node_health_agent_last_record_timestamp_seconds",
    "node_health_agent_config_generation",
    "node_health_agent_component_healthy",
    "node_health_agent_check_cannot_run",
}
EXTERNAL_METRICS = {"up", "kube_daemonset_status_number_unavailable"}


Term = tuple[tuple[str, str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class HostView:
    """A host directory the agent's checks read: a hostPath volume mounted read-only, and the env var naming it."""

    volume: str
    path: str  # on the host
    mount_path: str  # in the agent container
    env: str  # the run flag's variable that points the checks at mount_path


HOST_SYS = HostView(volume="host-sys", path="/sys", mount_path="/host/sys", env="NHA_SYS_ROOT")
HOST_DEV = HostView(volume="host-dev", path="/dev", mount_path="/host/dev", env="NHA_DEV_ROOT")
# The NVIDIA container runtime gives the agent NVML for every GPU of the node (no privilege, no GPU request).
NVIDIA_RUNTIME_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}


@dataclass(frozen=True)
class Variant:
    """One renderable kustomization and what its DaemonSet must look like."""

    name: str
    packs: str
    aggregate: str
    # requiredDuringScheduling nodeSelectorTerms (ORed), each a set of (key, operator, values).
    terms: tuple[Term, ...]
    overlay: str  # directory under daemonset/overlays
    variant: str = ""  # directory under daemonset/variants with its rules.yaml and checks.yaml (default: overlay)
    prometheus: bool = False  # also enable the prometheus-operator component
    extra_kinds: frozenset[str] = field(default_factory=frozenset)
    host_views: tuple[HostView, ...] = ()  # exactly these host directories reach the agent
    nvidia_runtime: bool = False  # NVIDIA_* env for the NVIDIA container runtime
    checks: frozenset[str] = field(default_factory=frozenset)  # built-in periodic checks it must run (at least)
    accelerator: str = ""  # the DaemonSet's node-health-agent.io/accelerator label (default: overlay)

    @property
    def variant_dir(self) -> str:
        return self.variant or self.overlay

    @property
    def daemonset_name(self) -> str:
        return f"{NAME}-{self.accelerator or self.overlay}"


NEURON_TERMS = (
    (OS_LINUX, ("node.kubernetes.io/instance-type", "In", NEURON_INSTANCE_TYPES)),
    (OS_LINUX, ("karpenter.k8s.aws/instance-accelerator-manufacturer", "In", ("aws",))),  # Karpenter
)
RDMA_CHECKS = frozenset({"ib-ports"})
NEURON_CHECKS = frozenset({"neuron-devices", "neuron-allocation", "neuron-ultraserver"}) | RDMA_CHECKS
NVIDIA_CHECKS = frozenset({"gpu-count", "gpu-ecc", "gpu-nvlink", "gpu-pcie-thermal"}) | RDMA_CHECKS
VARIANTS = (
    Variant(name="generic", overlay="generic", packs="kernel", aggregate="false", terms=((OS_LINUX,),)),
    Variant(
        name="neuron",
        overlay="neuron",
        packs="kernel,neuron,rdma",
        aggregate="true",
        terms=NEURON_TERMS,
        host_views=(HOST_SYS, HOST_DEV),
        checks=NEURON_CHECKS,
    ),
    Variant(
        name="nvidia",
        overlay="nvidia",
        packs="kernel,nvidia,rdma",
        aggregate="true",
        terms=(
            (OS_LINUX, ("nvidia.com/gpu.present", "In", ("true",))),
            (OS_LINUX, ("feature.node.kubernetes.io/pci-10de.present", "In", ("true",))),
            (OS_LINUX, ("karpenter.k8s.aws/instance-gpu-manufacturer", "In", ("nvidia",))),
            (OS_LINUX, ("eks.amazonaws.com/instance-gpu-manufacturer", "In", ("nvidia",))),  # EKS Auto Mode
            (OS_LINUX, ("node.kubernetes.io/instance-type", "In", NVIDIA_INSTANCE_TYPES)),
        ),
        host_views=(HOST_SYS,),
        nvidia_runtime=True,
        checks=NVIDIA_CHECKS,
    ),
    Variant(
        name="aks-gpu",
        overlay="aks-gpu",
        accelerator="nvidia",
        packs="kernel,nvidia,rdma",
        aggregate="true",
        terms=((OS_LINUX, ("kubernetes.azure.com/accelerator", "Exists", ())),),
        host_views=(HOST_SYS,),
        nvidia_runtime=True,
        checks=NVIDIA_CHECKS,
    ),
    Variant(
        name="neuron+prometheus-operator",
        overlay="neuron",
        prometheus=True,
        packs="kernel,neuron,rdma",
        aggregate="true",
        terms=NEURON_TERMS,
        extra_kinds=frozenset({"PodMonitor", "PrometheusRule"}),
        host_views=(HOST_SYS, HOST_DEV),
        checks=NEURON_CHECKS,
    ),
)
# The variants whose rules.yaml / checks.yaml carry commented examples (generic: the kernel pack has no checks).
EXAMPLE_VARIANTS = sorted({v.variant_dir for v in VARIANTS if v.checks})


# --------------------------------------------------------------------------- rendering


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every variant rendered once per test run (the kustomize processes run in parallel)."""
    kubectl = kube_tools().kubectl
    targets: dict[str, Path] = {}
    for v in VARIANTS:
        target = DAEMONSET_DIR / "overlays" / v.overlay
        if v.prometheus:
            # A throwaway kustomization outside the repository, the way a user would layer the
            # component onto an overlay. kustomize's load restrictions only forbid loading *files*
            # from outside the kustomization root; other kustomizations and components may live
            # anywhere, but must be given as relative paths (an absolute root is refused).
            root = tmp_path_factory.mktemp(v.name.replace("+", "-"))
            (root / "kustomization.yaml").write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "kustomize.config.k8s.io/v1beta1",
                        "kind": "Kustomization",
                        "resources": [os.path.relpath(target, root)],
                        "components": [os.path.relpath(COMPONENT, root)],
                    }
                )
            )
            target = root
        targets[v.name] = target
    procs = {
        name: subprocess.Popen(
            [kubectl, "kustomize", str(target)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, target in targets.items()
    }
    out: dict[str, list[dict[str, Any]]] = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"kubectl kustomize {targets[name]} failed:\n{stderr}"
        out[name] = [doc for doc in yaml.safe_load_all(stdout) if doc]
    return out


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind} {name}, got {len(found)}"
    return found[0]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected exactly one {kind}, got {len(found)}"
    return found[0]


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(docs, "DaemonSet")["spec"]["template"]["spec"]


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """All containers (init and regular) by name."""
    every = [*pod.get("initContainers", []), *pod["containers"]]
    by_name = {c["name"]: c for c in every}
    assert len(by_name) == len(every), "duplicate container names"
    return by_name


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod.get("volumes", [])}


def _sc(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def _runs_as_root(pod: dict[str, Any], container: dict[str, Any]) -> bool:
    """True unless the container is guaranteed a non-root uid (the image default is not trusted)."""
    pod_sc = pod.get("securityContext") or {}
    uid = _sc(container).get("runAsUser", pod_sc.get("runAsUser"))
    non_root = _sc(container).get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    return uid == 0 or not (non_root is True or (uid is not None and uid != 0))


def _seccomp(pod: dict[str, Any], container: dict[str, Any]) -> str | None:
    profile = _sc(container).get("seccompProfile") or (pod.get("securityContext") or {}).get("seccompProfile") or {}
    return profile.get("type")


byvariant = pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])


# --------------------------------------------------------------------------- schema and inventory


@byvariant
def test_renders_valid_objects(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    """Built-in kinds against the Kubernetes schemas; the Prometheus Operator objects structurally (k8srender)."""
    for obj in rendered[variant.name]:
        validate(obj)


@byvariant
def test_inventory(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    docs = rendered[variant.name]
    kinds = sorted(d["kind"] for d in docs)
    expected = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"}
    # Two ClusterRoles: the agent's, and the operators' (status, pause, clear), which binds to no one.
    assert kinds == sorted([*(expected | variant.extra_kinds), "ClusterRole"])
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole") == [NAME, OPERATOR_ROLE]
    for d in docs:
        if d["kind"] in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            assert "namespace" not in d["metadata"]
        else:
            assert d["metadata"]["namespace"] == NAMESPACE, d["kind"]
    ns = _one(docs, "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    # Each kind of node has its own DaemonSet name and selector, so variants never replace each other.
    ds = _one(docs, "DaemonSet")
    assert ds["metadata"]["name"] == variant.daemonset_name
    accelerator = variant.accelerator or variant.overlay
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": NAME,
        "node-health-agent.io/accelerator": accelerator,
    }
    # The relay is privileged, so the namespace must admit privileged pods under Pod Security Admission.
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


# --------------------------------------------------------------------------- RBAC


@byvariant
def test_rbac_is_exactly_what_the_agent_uses(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    docs = rendered[variant.name]
    role = _named(docs, "ClusterRole", NAME)
    assert "aggregationRule" not in role
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"no resourceNames/nonResourceURLs: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == EXPECTED_RBAC

    sa = _one(docs, "ServiceAccount")
    assert sa["metadata"]["name"] == NAME
    assert sa.get("automountServiceAccountToken") is False
    binding = _one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    assert _pod(docs)["serviceAccountName"] == NAME


@byvariant
def test_the_operator_role_grants_what_status_pause_and_clear_need_and_binds_to_no_one(
    rendered: dict[str, list[dict[str, Any]]], variant: Variant
) -> None:
    docs = rendered[variant.name]
    role = _named(docs, "ClusterRole", OPERATOR_ROLE)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]
    bound = [d for d in docs if d["kind"] in {"ClusterRoleBinding", "RoleBinding"}]
    assert all(d["roleRef"]["name"] != OPERATOR_ROLE for d in bound)


# --------------------------------------------------------------------------- privilege split


@byvariant
def test_only_the_relay_is_privileged(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    pod = _pod(rendered[variant.name])
    containers = _containers(pod)
    assert set(containers) == {RELAY, AGENT, CHOWN_INIT}
    privileged = {n for n, c in containers.items() if _sc(c).get("privileged")}
    assert privileged == {RELAY}
    root = {n for n, c in containers.items() if _runs_as_root(pod, c)}
    assert root <= {RELAY, CHOWN_INIT}
    for name, c in containers.items():
        assert not any(p.get("hostPort") for p in c.get("ports", [])), name
        caps = _sc(c).get("capabilities") or {}
        if name != RELAY:
            assert _sc(c).get("allowPrivilegeEscalation") is False, name
            assert caps.get("drop") == ["ALL"], name
            assert _seccomp(pod, c) == "RuntimeDefault", name


@byvariant
def test_relay_container(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    pod = _pod(rendered[variant.name])
    relay = _containers(pod)[RELAY]
    assert relay["args"][0] == "kmsg-relay"
    assert relay["args"][relay["args"].index("--socket") + 1] == f"{RELAY_DIR}/kmsg.sock"
    # Only the agent's uid may connect to the socket (mode 0600, SO_PEERCRED): it must be the agent's runAsUser.
    agent_uid = _sc(_containers(pod)[AGENT])["runAsUser"]
    assert relay["args"][relay["args"].index("--client-uid") + 1] == str(agent_uid) == str(AGENT_UID)
    assert "--client-gid" not in relay["args"]
    assert "command" not in relay  # the image entrypoint, nothing else
    assert not relay.get("ports")
    assert not relay.get("env") and not relay.get("envFrom")
    assert _sc(relay)["readOnlyRootFilesystem"] is True
    mounts = _mounts(relay)
    assert set(mounts) == {"kmsg", "relay"}, "no token, config or state in the privileged container"
    assert mounts["kmsg"]["mountPath"] == "/dev/kmsg" and mounts["kmsg"]["readOnly"] is True
    assert mounts["relay"]["mountPath"] == RELAY_DIR
    assert relay["resources"]["limits"]["memory"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert probe not in relay  # nothing listens in the relay


@byvariant
def test_chown_init_container_only_chowns(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    pod = _pod(rendered[variant.name])
    init = _containers(pod)[CHOWN_INIT]
    assert [c["name"] for c in pod["initContainers"]] == [CHOWN_INIT]
    sc = _sc(init)
    assert sc["runAsUser"] == 0 and sc.get("privileged") is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert init["command"] == [
        "python3",
        "-c",
        f'import os; os.chown("{STATE_DIR}", {AGENT_UID}, {AGENT_UID})',
    ]
    assert not init.get("args") and not init.get("ports") and not init.get("env")
    assert {n: m["mountPath"] for n, m in _mounts(init).items()} == {"state": STATE_DIR}


@byvariant
def test_agent_container_is_unprivileged(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    pod = _pod(rendered[variant.name])
    agent = _containers(pod)[AGENT]
    sc = _sc(agent)
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == AGENT_UID and sc["runAsGroup"] == AGENT_UID
    assert _seccomp(pod, agent) == "RuntimeDefault"
    assert agent["args"] == [
        "run",
        "--kmsg-relay",
        f"{RELAY_DIR}/kmsg.sock",
        *(arg for name in CONFIG_FILES for arg in ("--config", f"{RULES_DIR}/{name}")),
    ]
    assert "command" not in agent
    requests, limits = agent["resources"]["requests"], agent["resources"]["limits"]
    assert requests["cpu"] and requests["memory"] and limits["memory"]


@byvariant
def test_pod_level_isolation(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    ds = _one(rendered[variant.name], "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), key
    assert pod["automountServiceAccountToken"] is False
    assert pod["priorityClassName"] == "system-node-critical"
    assert 0 < pod["terminationGracePeriodSeconds"] <= 30
    # Tolerate every taint: a key-less, effect-less Exists toleration.
    assert {"operator": "Exists"} in pod["tolerations"]
    strategy = ds["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxUnavailable"]
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()


@byvariant
def test_token_projected_into_agent_only(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    pod = _pod(rendered[variant.name])
    volumes = _volumes(pod)
    token_volumes = {
        name
        for name, v in volumes.items()
        if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources", []))
    }
    assert token_volumes == {"kube-api-access"}
    assert not any("secret" in v for v in volumes.values()), "no Secret volumes"
    sources = volumes["kube-api-access"]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"] == {"path": "token", "expirationSeconds": 3607}
    assert sources[1]["configMap"] == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert sources[2]["downwardAPI"]["items"] == [
        {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
    ]
    holders = {n for n, c in _containers(pod).items() if "kube-api-access" in _mounts(c)}
    assert holders == {AGENT}
    mount = _mounts(_containers(pod)[AGENT])["kube-api-access"]
    assert mount == {"name": "kube-api-access", "mountPath": TOKEN_PATH, "readOnly": True}


@byvariant
def test_host_paths(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    pod = _pod(rendered[variant.name])
    volumes = _volumes(pod)
    host = {n: v["hostPath"] for n, v in volumes.items() if "hostPath" in v}
    assert host == {
        "kmsg": {"path": "/dev/kmsg", "type": "CharDevice"},
        "state": {"path": STATE_DIR, "type": "DirectoryOrCreate"},
        **{view.volume: {"path": view.path, "type": "Directory"} for view in variant.host_views},
    }
    containers = _containers(pod)
    assert {n for n, c in containers.items() if "kmsg" in _mounts(c)} == {RELAY}
    assert {n for n, c in containers.items() if "state" in _mounts(c)} == {AGENT, CHOWN_INIT}
    assert _mounts(containers[AGENT])["state"]["mountPath"] == STATE_DIR
    assert "emptyDir" in volumes["relay"]
    assert {n for n, c in containers.items() if "relay" in _mounts(c)} == {RELAY, AGENT}
    # The host's /sys and /dev reach the agent alone, read-only, whole (no subPath), with the default
    # propagation (None: no host mounts made later show up, nothing propagates back).
    for view in variant.host_views:
        assert {n for n, c in containers.items() if view.volume in _mounts(c)} == {AGENT}, view.volume
        mount = _mounts(containers[AGENT])[view.volume]
        assert mount == {"name": view.volume, "mountPath": view.mount_path, "readOnly": True}, view.volume


@byvariant
def test_agent_mounts(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    """Exactly these mounts; everything from the host or the API is read-only except the state directory."""
    mounts = _mounts(_containers(_pod(rendered[variant.name]))[AGENT])
    expected = {
        "relay": RELAY_DIR,
        "rules": RULES_DIR,
        "state": STATE_DIR,
        "tmp": "/tmp",
        "kube-api-access": TOKEN_PATH,
        **{view.volume: view.mount_path for view in variant.host_views},
    }
    assert {n: m["mountPath"] for n, m in mounts.items()} == expected
    read_only = {n for n, m in mounts.items() if m.get("readOnly")}
    assert read_only == {"rules", "kube-api-access", *(view.volume for view in variant.host_views)}
    # Nothing lands on /dev: the kernel log reaches the agent through the relay only.
    assert not any(m["mountPath"] == "/dev" or m["mountPath"].startswith("/dev/") for m in mounts.values())


@byvariant
def test_agent_probes_and_port(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    agent = _containers(_pod(rendered[variant.name]))[AGENT]
    assert agent["ports"] == [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert probe in agent, probe
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe not in agent:
            continue
        spec = agent[probe]
        assert spec["httpGet"]["path"] == "/healthz", probe
        assert spec["httpGet"]["port"] in ("metrics", METRICS_PORT), probe
        assert 1 <= spec["timeoutSeconds"] < spec["periodSeconds"], probe
        assert spec["failureThreshold"] >= 2, probe


@byvariant
def test_agent_environment(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    env = _env(_containers(_pod(rendered[variant.name]))[AGENT])
    assert env["ENABLE_RECOVERY"]["value"] == "false"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NHA_PACKS"]["value"] == variant.packs
    assert env["NHA_AGGREGATE_CONDITION"]["value"] == variant.aggregate
    assert env["NHA_STATE_DIR"]["value"] == STATE_DIR
    assert env["NHA_LISTEN"]["value"].endswith(f":{METRICS_PORT}")
    assert "NHA_CONFIG" not in env, "--config is passed as an argument"
    for name, e in env.items():
        assert set(e.get("valueFrom", {})) <= {"fieldRef"}, f"{name}: no secrets or config maps in env"
    # The checks look at the host's /sys and /dev where the overlay mounts them, else the defaults.
    roots = {view.env: view.mount_path for view in variant.host_views}
    assert {k: env[k]["value"] for k in (HOST_SYS.env, HOST_DEV.env) if k in env} == roots
    nvidia = {k: e["value"] for k, e in env.items() if k.startswith("NVIDIA_")}
    assert nvidia == (NVIDIA_RUNTIME_ENV if variant.nvidia_runtime else {})


@byvariant
def test_no_runtime_class(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    """The NVIDIA overlays rely on the node's default runtime; runtimeClassName stays a commented option."""
    assert "runtimeClassName" not in _pod(rendered[variant.name])


@byvariant
def test_config_map_is_hashed_and_mounted(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    docs = rendered[variant.name]
    cm = _one(docs, "ConfigMap")
    accelerator = variant.accelerator or variant.overlay
    assert re.fullmatch(rf"node-health-agent-rules-{accelerator}-[a-z0-9]{{10}}", cm["metadata"]["name"]), cm[
        "metadata"
    ]["name"]
    assert set(cm["data"]) == set(CONFIG_FILES)
    pod = _pod(docs)
    assert _volumes(pod)["rules"]["configMap"]["name"] == cm["metadata"]["name"]
    mount = _mounts(_containers(pod)[AGENT])["rules"]
    assert mount["mountPath"] == RULES_DIR and mount["readOnly"] is True


@byvariant
def test_node_affinity(rendered: dict[str, list[dict[str, Any]]], variant: Variant) -> None:
    affinity = _pod(rendered[variant.name])["affinity"]
    assert set(affinity) == {"nodeAffinity"}
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms = []
    for term in required["nodeSelectorTerms"]:
        assert set(term) == {"matchExpressions"}
        terms.append(
            tuple(sorted((e["key"], e["operator"], tuple(e.get("values", ()))) for e in term["matchExpressions"]))
        )
    assert terms == [tuple(sorted(t)) for t in variant.terms]


# --------------------------------------------------------------------------- rule packs


def _config_file(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@byvariant
def test_rules_config_loads_with_selected_packs(
    rendered: dict[str, list[dict[str, Any]]], variant: Variant, tmp_path: Path
) -> None:
    """The ConfigMap's rules.yaml loads after the built-in packs named by NHA_PACKS (names must exist)."""
    docs = rendered[variant.name]
    rules = _config_file(tmp_path, _one(docs, "ConfigMap")["data"]["rules.yaml"])
    rule_set = load_rule_set([*rule_dirs(plugins_dirs=None, packs=[variant.packs]), rules])
    assert rule_set.rules


def _commented_examples(text: str, keys: str = "conditions|rules|lists") -> Iterator[str]:
    """Commented-out YAML blocks: a `# key:` line for one of ``keys``, then its more-indented `#   ...` lines."""
    block: list[str] = []
    for line in text.splitlines():
        body = line[2:] if line.startswith("# ") else None
        if body is not None and re.match(rf"({keys}):\s*$", body):
            if block:
                yield "\n".join(block)
            block = [body]
        elif block and body is not None and body.startswith(" "):
            block.append(body)
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


@pytest.mark.parametrize("overlay", sorted({v.variant_dir for v in VARIANTS}))
def test_commented_rule_examples_are_valid(overlay: str, tmp_path: Path) -> None:
    """The examples in each variant's rules.yaml work when uncommented (they must not rot)."""
    text = (DAEMONSET_DIR / "variants" / overlay / "rules.yaml").read_text()
    packs = next(v.packs for v in VARIANTS if v.variant_dir == overlay)
    examples = list(_commented_examples(text))
    assert examples, f"{overlay}/rules.yaml has no commented example"
    builtin_lists: dict[str, list[Any]] = {}
    for directory in rule_dirs(plugins_dirs=None, packs=[packs]):
        for pack in sorted(directory.glob("*.yaml")):
            builtin_lists.update(yaml.safe_load(pack.read_text()).get("lists") or {})
    for example in examples:
        data = {"conditions": [], "rules": [], **yaml.safe_load(example)}
        rules = _config_file(tmp_path, yaml.safe_dump(data))
        load_rule_set([*rule_dirs(plugins_dirs=None, packs=[packs]), rules])
        # An example list override replaces the built-in list: it must not silently drop entries.
        for name, values in (data.get("lists") or {}).items():
            assert name in builtin_lists, f"{overlay}/rules.yaml overrides unknown list {name}"
            missing = set(builtin_lists[name]) - set(values)
            assert not missing, f"{overlay}/rules.yaml example drops built-in {name} entries {sorted(missing)}"


# --------------------------------------------------------------------------- periodic checks


def _no_entry_points() -> tuple[()]:
    """The image installs no third-party checks: leave out whatever the test environment has installed."""
    return ()


def _builtin_checks(packs: str) -> dict[str, Any]:
    """The check declarations the packs ship (plugins/<pack>/checks.yaml), merged, by name."""
    config = load_agent_config(rule_dirs(plugins_dirs=None, packs=[packs]), entry_points=_no_entry_points)
    return {d.name: d for d in config.check_decls}


def _load_and_build(packs: str, files: list[Path], state_dir: Path) -> tuple[Any, list[Any]]:
    """What `run` does with NHA_PACKS=packs and these --config files: load, then build every check.

    A configuration problem raises ConfigError. A check whose module cannot be imported does not (it
    becomes a BrokenCheck that reports UNKNOWN at run time), so that is asserted here.
    """
    config = load_agent_config([*rule_dirs(plugins_dirs=None, packs=[packs]), *files], entry_points=_no_entry_points)
    checks = build_scheduled_checks(config, context=CheckContext(state_dir=state_dir), entry_points=_no_entry_points)
    broken = {c.name: c.check.error for c in checks if isinstance(c.check, BrokenCheck)}
    assert not broken, f"checks that cannot load: {broken}"
    return config, checks


@byvariant
def test_checks_config_builds_with_selected_packs(
    rendered: dict[str, list[dict[str, Any]]], variant: Variant, tmp_path: Path
) -> None:
    """The ConfigMap's files, after the packs named by NHA_PACKS, load and build every check without a config error."""
    data = _one(rendered[variant.name], "ConfigMap")["data"]
    files = [_config_file(tmp_path, data[name], name) for name in CONFIG_FILES]
    config, checks = _load_and_build(variant.packs, files, tmp_path)
    kinds = {f.path.name: f.kind for f in config.files if f.path in files}
    assert kinds == {"rules.yaml": Kind.RULE_PACK, "checks.yaml": Kind.CHECKS}
    assert config.rule_set.rules
    names = {c.name for c in checks}
    assert variant.checks <= names, f"missing built-in checks: {sorted(variant.checks - names)}"
    assert names <= set(_builtin_checks(variant.packs)), "checks.yaml only tunes the packs' checks"


@pytest.mark.parametrize("overlay", EXAMPLE_VARIANTS)
def test_commented_check_examples_are_valid(overlay: str, tmp_path: Path) -> None:
    """The examples in each variant's checks.yaml work when uncommented: they retune or disable a built-in check."""
    text = (DAEMONSET_DIR / "variants" / overlay / "checks.yaml").read_text()
    packs = next(v.packs for v in VARIANTS if v.variant_dir == overlay)
    examples = list(_commented_examples(text, keys="checks"))
    assert examples, f"{overlay}/checks.yaml has no commented example"
    builtin = _builtin_checks(packs)
    shown: set[str] = set()
    for i, example in enumerate(examples):
        data = yaml.safe_load(example)
        assert set(data) == {"checks"} and data["checks"], example
        path = _config_file(tmp_path, yaml.safe_dump(data), f"checks-{i}.yaml")
        config, checks = _load_and_build(packs, [path], tmp_path)
        decls = {d.name: d for d in config.check_decls}
        running = {c.name for c in checks}
        for given in data["checks"]:
            name = given["name"]
            assert name in builtin, f"{overlay}/checks.yaml example changes {name!r}, not a check of packs {packs}"
            assert not {"use", "entryPoint"} & set(given), f"{overlay}/checks.yaml example redefines {name!r}"
            if given.get("enabled") is False:
                assert name not in running
                shown.add("disable")
            else:
                assert name in running
                options = given.get("options") or {}
                assert all(decls[name].options[k] == v for k, v in options.items())
                assert decls[name].use == builtin[name].use, "a retune keeps the built-in factory"
                shown.add("retune")
    assert shown == {"retune", "disable"}, f"{overlay}/checks.yaml shows only {sorted(shown)}"


# --------------------------------------------------------------------------- Prometheus Operator component


def test_prometheus_component(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["neuron+prometheus-operator"]
    ds = _one(docs, "DaemonSet")
    monitor = _one(docs, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    # No namespaceSelector: the PodMonitor's own namespace, whichever that is.
    assert "namespaceSelector" not in monitor["spec"]
    agent = _containers(ds["spec"]["template"]["spec"])[AGENT]
    assert [ep["port"] for ep in monitor["spec"]["podMetricsEndpoints"]] == [agent["ports"][0]["name"]]

    rules = [r for g in _one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    exprs = "\n".join(r["expr"] for r in rules)
    # Every metric name is one the agent exports: tests/deploy/test_monitoring.py scrapes running agents for that.
    assert "max by (namespace, node, type, reason) (problem_gauge) == 1" in exprs
    assert "node_health_agent_component_healthy == 0" in exprs
    assert "increase(node_health_agent_kmsg_records_lost_total[" in exprs
    assert "kube_daemonset_status_number_unavailable" in exprs
    assert re.search(r'reason=~"NeuronHasError_\.\*\|GpuXid\.\*"', exprs)
    # One rule per alert and severity (NodeHealthRecoveryActionFailed: critical and warning, by result).
    assert len({(r["alert"], r["labels"]["severity"]) for r in rules}) == len(rules), "alert names are unique"


def test_overlays_do_not_enable_the_component_by_default(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Applying an overlay must not need the Prometheus Operator CRDs."""
    for v in VARIANTS:
        if not v.prometheus:
            assert not {d["kind"] for d in rendered[v.name]} & {"PodMonitor", "PrometheusRule"}, v.name
