"""Rendering the deployable product for tests: ``helm template`` of the chart and ``kubectl kustomize`` of
the overlays (binaries from tests/helpers/k8stools.py), and schema validation of whatever they render.

Built-in kinds are validated with ``kubernetes_validate`` (strict: unknown fields fail) against every
Kubernetes version in ``K8S_VERSIONS`` the kind exists in; the custom resources we ship (Prometheus
Operator, ACK) have no schema offline and are checked structurally.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from helpers.k8stools import kube_tools

REPO = Path(__file__).resolve().parents[2]
DAEMONSET = REPO / "daemonset"
CHART = DAEMONSET / "helm" / "node-health-agent"
EXAMPLES = CHART / "examples"
NAMESPACE = "node-health-agent"
RELEASE = "node-health-agent"
# The oldest Kubernetes minor the docs claim, one in the middle, and a recent one.
K8S_VERSIONS = ("1.29.0", "1.32.0", "1.35.0")
# Kinds that exist only from a later version (ValidatingAdmissionPolicy is v1 from 1.30).
SINCE = {"ValidatingAdmissionPolicy": "1.30.0", "ValidatingAdmissionPolicyBinding": "1.30.0"}

Obj = dict[str, Any]


def _docs(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize(target: Path) -> list[Obj]:
    proc = subprocess.run(
        [str(kube_tools().kubectl), "kustomize", str(target)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"kubectl kustomize {target} failed:\n{proc.stderr}"
    return _docs(proc.stdout)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kube_tools().helm), *args], capture_output=True, text=True, timeout=120)


# The chart has no default image (none is published yet): the tests name the one the kustomize tree names.
IMAGE = "ghcr.io/node-health-agent/node-health-agent"
IMAGE_SET = f"image.repository={IMAGE}"


def helm_template(
    *values: Path,
    namespace: str = NAMESPACE,
    sets: tuple[str, ...] = (),
    api_versions: tuple[str, ...] = (),
    string_sets: bool = False,
) -> list[Obj]:
    """``string_sets``: pass ``sets`` with --set-string (every value a string, as a values file can say)."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, "--set", IMAGE_SET]
    for path in values:
        args += ["--values", str(path)]
    for item in sets:
        args += ["--set-string" if string_sets else "--set", item]
    for api in api_versions:
        args += ["--api-versions", api]
    proc = helm(*args)
    assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
    return _docs(proc.stdout)


def relpath(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


def one(docs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected exactly one {kind} {name or ''}, got {len(found)}"
    return found[0]


# ---- schema validation ---------------------------------------------------------------------------------------


def _check_custom_resource(obj: Obj) -> None:
    """Structural check of the custom resources we ship (no CRD schema offline)."""
    spec = obj["spec"]
    assert obj["metadata"].get("namespace"), f"{obj['kind']} needs a namespace"
    if obj["kind"] == "PodMonitor":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(spec) <= {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel", "podTargetLabels"}
        assert isinstance(spec["selector"]["matchLabels"], dict)
        for ep in spec["podMetricsEndpoints"]:
            assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings"}
            for r in ep.get("relabelings", []):
                assert set(r) <= {"sourceLabels", "targetLabel", "action", "regex", "replacement", "separator"}
    elif obj["kind"] == "PrometheusRule":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(spec) == {"groups"}
        for group in spec["groups"]:
            assert set(group) <= {"name", "interval", "rules"} and group["rules"]
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, rule
                assert isinstance(rule["alert"], str) and isinstance(rule["expr"], str)
                assert rule["labels"]["severity"] in {"warning", "critical"}
                assert rule["annotations"]["summary"]
                for key in ("for", "keep_firing_for"):  # keep_firing_for: Prometheus 2.42, the Operator 0.66
                    if key in rule:
                        assert re.fullmatch(r"\d+[smh]", rule[key])
    elif obj["kind"] == "PodIdentityAssociation":
        assert obj["apiVersion"] == "eks.services.k8s.aws/v1alpha1"
        assert set(spec) == {"clusterName", "namespace", "serviceAccount", "roleARN"}
        assert spec["namespace"] == obj["metadata"]["namespace"]
        assert re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:role/.+", spec["roleARN"]), spec["roleARN"]
    else:
        raise AssertionError(f"unexpected custom resource {obj['apiVersion']} {obj['kind']}")


_validated: set[str] = set()


def validate(obj: Obj) -> None:
    """Fail unless ``obj`` is valid for every Kubernetes version of ``K8S_VERSIONS`` its kind exists in."""
    import kubernetes_validate

    if "." in obj["apiVersion"].split("/")[0] and not obj["apiVersion"].split("/")[0].endswith(".k8s.io"):
        _check_custom_resource(obj)
        return
    key = json.dumps(obj, sort_keys=True)
    if key in _validated:
        return
    for version in K8S_VERSIONS:
        if tuple(map(int, version.split("."))) < tuple(map(int, SINCE.get(obj["kind"], "0.0.0").split("."))):
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(
                f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: {exc}"
            ) from None
    _validated.add(key)
