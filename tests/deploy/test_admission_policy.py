"""The own-Node ValidatingAdmissionPolicy (daemonset/components/admission-policy/policy.yaml), evaluated the way
the API server evaluates it: matchConstraints, then matchConditions, then the variables, then every
validation, each CEL expression run by cel-python against admission requests.

The requests are the agent's real writes, recorded: a Kubernetes-mode agent with recovery acting against
tests/kubeapi (the real client over HTTP) detects, cordons, marks its instance and takes the budget; the
agent's own steps for what follows (taint, incident updates, uncordon with the flap record, the budget given
back) run through the real client too. A ladder's reboot rung is recorded the same way: the recovery loop
with its ladder reserves the reboot in the attempt ledger, calls RebootInstances at moto, records it sent,
and finishes it on a new boot id. Every change the server stored becomes the AdmissionRequest the API
server would evaluate (operation, resource, subresource, name, namespace, the object before and after the
write). They must all be admitted for the agent's own Node and refused once replayed as another node's
agent. The table covers what a healthy agent never sends (another Node, labels, others' annotations and
taints, an uncordon of someone else's cordon, an Event rewritten from a pod's, another Lease, evictions on
other nodes, a token without a node claim, other users).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import pkgutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

import agent.checks
import agent.core
import agent.recovery
from agent.adapters.aws import AwsClients, Ec2Reboot
from agent.checks.fleetslots import SLOTS_ANNOTATION
from agent.core.clears import CLEAR_REQUEST_ANNOTATION, CLEARS_ANNOTATION
from agent.core.validation import VALIDATIONS_ANNOTATION
from agent.recovery import attempt as attempts
from agent.recovery.attempt import ATTEMPT_ANNOTATION
from agent.recovery.budget import BUDGET_ANNOTATION, BudgetSettings
from agent.recovery.drain import DrainResult
from agent.recovery.ec2 import Ec2Rebooter
from agent.recovery.fence import REASON_ANNOTATION as FENCE_REASON_ANNOTATION
from agent.recovery.flaps import FLAP_ANNOTATION, after_uncordon, flap_text
from agent.recovery.holds import PAUSE_ANNOTATION, VETO_ANNOTATION
from agent.recovery.ladder import HISTORY_ANNOTATION, Ladder
from agent.recovery.model import (
    DOMAIN,
    INCIDENT_ANNOTATION,
    OPT_OUT_LABEL,
    TAINT_KEY,
    UNVALIDATED_TAINT_KEY,
    Action,
    Incident,
)
from agent.recovery.node import incident_text, read_incident, uncordon
from agent.recovery.policyfile import DEFAULT_POLICY

from helpers import kube_client, recovery, wait_for
from helpers.agents import NAMESPACE, NODE, Agent, condition, node
from helpers.aws import REGION, AwsTestEnv, FaultyFront
from helpers.k8srender import DAEMONSET, EXAMPLES, helm_template
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # renders with kubectl and evaluates every CEL validation

POLICY_FILE = DAEMONSET / "components" / "admission-policy" / "policy.yaml"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:node-health-agent"


def load_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]


def load_policy(name: str = "node-health-agent-own-node") -> dict[str, Any]:
    (policy,) = [d for d in load_docs() if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name]
    return policy


def load_binding(policy: str) -> dict[str, Any]:
    (binding,) = [
        d for d in load_docs() if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == policy
    ]
    return binding


# ---- evaluating the policy --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Verdict:
    matched: bool  # matchConstraints and matchConditions select the request
    allowed: bool
    messages: tuple[str, ...] = ()


class PolicyEvaluator:
    """The API server's evaluation of one ValidatingAdmissionPolicy and its binding, with cel-python for the
    expressions. With a ``paramKind``, the policy is evaluated once per param the binding selects (``params``:
    the objects its selector finds in the request's namespace) and every evaluation must pass; none found
    follows ``parameterNotFoundAction``."""

    def __init__(self, policy: dict[str, Any], binding: dict[str, Any]) -> None:
        self._env = celpy.Environment()
        self.spec = policy["spec"]
        self.binding = binding["spec"]
        self._programs: dict[str, Any] = {}

    def _eval(self, expression: str, activation: dict[str, Any]) -> Any:
        if expression not in self._programs:
            self._programs[expression] = self._env.program(self._env.compile(expression))
        return self._programs[expression].evaluate(activation)

    def _constrained(self, request: dict[str, Any]) -> bool:
        resource = request["resource"]
        name = resource["resource"] + (f"/{request['subResource']}" if request.get("subResource") else "")
        for rule in self.spec["matchConstraints"]["resourceRules"]:
            if (
                resource["group"] in rule["apiGroups"]
                and request["operation"] in rule["operations"]
                and name in rule["resources"]
            ):
                return True
        return False

    def __call__(self, request: dict[str, Any], params: list[dict[str, Any]] | None = None) -> Verdict:
        if not self._constrained(request):
            return Verdict(matched=False, allowed=True)
        activation = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(request.get("object")),
            "oldObject": celpy.json_to_cel(request.get("oldObject")),
        }
        for match in self.spec.get("matchConditions", []):
            if not bool(self._eval(match["expression"], activation)):
                return Verdict(matched=False, allowed=True)
        if "paramKind" not in self.spec:
            return self._validate(activation)
        if not params:
            assert self.binding["paramRef"]["parameterNotFoundAction"] == "Deny"
            assert self.spec["failurePolicy"] == "Fail"
            return Verdict(matched=True, allowed=False, messages=("no params found",))
        verdicts = [self._validate({**activation, "params": celpy.json_to_cel(p)}) for p in params]
        messages = tuple(dict.fromkeys(m for v in verdicts for m in v.messages))
        return Verdict(matched=True, allowed=not messages, messages=messages)

    def _validate(self, activation: dict[str, Any]) -> Verdict:
        # CEL values already: json_to_cel would turn a BoolType into an IntType (bool is an int in Python).
        variables = celpy.celtypes.MapType()
        for variable in self.spec.get("variables", []):
            value = self._eval(variable["expression"], {**activation, "variables": variables})
            variables[celpy.celtypes.StringType(variable["name"])] = value
        activation["variables"] = variables
        failed = []
        for validation in self.spec["validations"]:
            result = self._eval(validation["expression"], activation)
            assert isinstance(result, celpy.celtypes.BoolType), f"{validation['expression']!r} gave {result!r}"
            if not result:
                message = validation.get("message") or str(self._eval(validation["messageExpression"], activation))
                failed.append(message)
        return Verdict(matched=True, allowed=not failed, messages=tuple(failed))


@pytest.fixture(scope="module")
def evaluate() -> PolicyEvaluator:
    return PolicyEvaluator(load_policy(), load_binding("node-health-agent-own-node"))


EVICTIONS = "node-health-agent-own-node-evictions"


@pytest.fixture(scope="module")
def evaluate_eviction() -> PolicyEvaluator:
    return PolicyEvaluator(load_policy(EVICTIONS), load_binding(EVICTIONS))


# ---- admission requests ----------------------------------------------------------------------------------------


KINDS = {"devicetaintrules": "DeviceTaintRule", "resourceslices": "ResourceSlice"}


def request(
    *,
    operation: str,
    group: str,
    resource: str,
    name: str,
    namespace: str = "",
    sub: str = "",
    obj: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    user: str = AGENT_USER,
    node_claim: str | None = NODE,
) -> dict[str, Any]:
    """An AdmissionRequest as the API server builds it (admission.k8s.io/v1)."""
    extra = {"authentication.kubernetes.io/pod-name": ["node-health-agent-neuron-x7k2p"]}
    if node_claim is not None:
        extra[NODE_CLAIM] = [node_claim]
    version = {"": "v1", "events.k8s.io": "v1", "coordination.k8s.io": "v1", "resource.k8s.io": "v1"}[group]
    kind = KINDS.get(resource, resource.capitalize().rstrip("s"))
    out: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "name": name,
        "operation": operation,
        "userInfo": {"username": user, "uid": "1c6f", "groups": ["system:serviceaccounts"], "extra": extra},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    if sub:
        out["subResource"] = sub
    if namespace:
        out["namespace"] = namespace
    return out


def event(about_kind: str, about_name: str, *, group: str = "", count: int = 1) -> dict[str, Any]:
    ref = {"apiVersion": "v1", "kind": about_kind, "name": about_name}
    meta = {"name": "e1", "namespace": "default"}
    if group == "events.k8s.io":
        return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta, "regarding": ref, "reason": "R"}
    return {"apiVersion": "v1", "kind": "Event", "metadata": meta, "involvedObject": ref, "reason": "R", "count": count}


OTHER = "ip-10-0-9-9.us-west-2.compute.internal"
LEASE = "node-health-agent-recovery-budget"


def pod_event(
    *,
    group: str = "",
    pod_namespace: str = "prod",
    reporter: str | None = NODE,
    host: str | None = NODE,
    related: dict[str, Any] | None = None,
    count: int = 1,
) -> dict[str, Any]:
    """An Event about a Pod as the agent writes it (agent/recovery/holdertell.py through the events sink): reported
    by its node, with its own Node as ``related``, in the Pod's namespace. ``None`` leaves a field out."""
    about = {"apiVersion": "v1", "kind": "Pod", "name": "trainer-0", "namespace": pod_namespace, "uid": "9f1c"}
    node_ref = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "3b7e"} if related is None else related
    meta = {"name": "trainer-0.1876c0ffee", "namespace": pod_namespace}
    if group == "events.k8s.io":
        out: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": meta,
            "regarding": about,
            "reason": "DeviceFault",
            "reportingController": "node-health-agent",
        }
    else:
        out = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": meta,
            "involvedObject": about,
            "reason": "DeviceFault",
            "count": count,
            "reportingComponent": "node-health-agent",
        }
        if host is not None:
            out["source"] = {"component": "node-health-agent", "host": host}
    if reporter is not None:
        out["reportingInstance"] = reporter
    if node_ref:
        out["related"] = node_ref
    return out


def pod_event_write(
    operation: str,
    new: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    *,
    group: str = "",
    namespace: str = "prod",
) -> dict[str, Any]:
    return request(
        operation=operation,
        group=group,
        resource="events",
        name="trainer-0.1876c0ffee",
        namespace=namespace,
        obj=new,
        old=old,
    )


def taint_rule(
    *,
    node_name: str = NODE,
    device: str | None = "gpu-3",
    name: str | None = None,
    driver: str | None = "gpu.nvidia.com",
    pool: str | None = None,
    label: str | None = None,
    effect: str = "NoSchedule",
) -> dict[str, Any]:
    """A DeviceTaintRule as the device fence writes it (agent/recovery/fence.py): named and labelled for its node,
    selecting one device of the node's own pool. ``None`` leaves a field out; the defaults follow ``node_name``."""
    selector = {"driver": driver, "pool": node_name if pool is None else pool, "device": device}
    labels = {"node-health-agent.io/node": node_name if label is None else label, "node-health-agent.io/device": "x"}
    if label == "":
        labels.pop("node-health-agent.io/node")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name or f"node-health-agent-{node_name}-gpu-3", "labels": labels},
        "spec": {
            "deviceSelector": {k: v for k, v in selector.items() if v is not None},
            "taint": {"key": "node-health-agent.io/unhealthy", "value": "GpuXid79", "effect": effect},
        },
    }


def rule_write(
    operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None = None, *, node_claim: str | None = NODE
) -> dict[str, Any]:
    name = (new or old or {})["metadata"]["name"]
    return request(
        operation=operation,
        group="resource.k8s.io",
        resource="devicetaintrules",
        name=name,
        obj=new,
        old=old,
        node_claim=node_claim,
    )


RULE = taint_rule()
LONG_NODE = "ip-10-0-0-1." + "a" * 60 + ".compute.internal"  # a label value holds 63 characters
OTHERS_RULE = taint_rule(node_name=OTHER)
OUR_TAINT = {
    "key": TAINT_KEY,
    "value": "NeuronHasError_DMA",
    "effect": "NoSchedule",
    "timeAdded": "2026-01-01T00:00:00Z",
}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
UNVALIDATED = {"key": UNVALIDATED_TAINT_KEY, "effect": "NoSchedule"}
VETO = "node-health-agent.io/veto"


def incident(*, cordoned_by_us: bool, done: tuple[Action, ...], **more: Any) -> str:
    """The incident annotation as the agent writes it (agent/recovery/node.py incident_text)."""
    record = Incident(
        **more,
        id=f"NeuronHealth/NeuronHasError_DMA/{NODE}/1767225600",
        condition="NeuronHealth",
        reason="NeuronHasError_DMA",
        since=1767225600.0,
        opened=1767225601.0,
        done=done,
        cordoned_by_us=cordoned_by_us,
    )
    return incident_text(record)


OURS = incident(cordoned_by_us=True, done=(Action.CORDON,))
# As node.py writes it after a reboot rung: a claim and evidence sort around cordonedByUs and done.
OURS_REBOOTED = incident(
    cordoned_by_us=True,
    done=(Action.TAINT, Action.CORDON, Action.DRAIN, Action.REBOOT),
    claim="a1b2c3",
    claimed_at=1767225602.0,
    evidence=("/var/lib/node-health-agent/bundles/1767225602-GpuXid79.json.gz",),
)
OURS_LATER = incident(cordoned_by_us=True, done=(Action.TAINT, Action.CORDON, Action.DRAIN))
NOT_OURS = incident(cordoned_by_us=False, done=(Action.CORDON,))
PLANNED = incident(cordoned_by_us=True, done=())  # opened, not yet cordoned


def the_node(
    name: str = NODE,
    *,
    unschedulable: bool = False,
    taints: tuple[dict[str, Any], ...] = (GPU_TAINT,),
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node as the API server stores it: labels, another owner's taint, an operator's veto, the kubelet's Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "1042",
            "labels": {"kubernetes.io/os": "linux", OPT_OUT_LABEL: "disabled"} if labels is None else labels,
            "annotations": {VETO: "", "node.alpha.kubernetes.io/ttl": "0"} | (annotations or {}),
        },
        "spec": {"providerID": "aws:///us-west-2a/i-0abc", "unschedulable": unschedulable, "taints": list(taints)},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready"},
                {"type": "NeuronHealth", "status": "False", "reason": "NeuronHasNoError", "message": ""},
            ]
        },
    }


def changed(node_: dict[str, Any], *, spec: dict[str, Any] | None = None, **meta: dict[str, str | None]) -> dict:
    """``node_`` after a strategic merge patch of ``spec`` and of ``labels`` / ``annotations`` (None removes)."""
    out = copy.deepcopy(node_)
    out["spec"].update(spec or {})
    for field, values in meta.items():
        target = out["metadata"].setdefault(field, {})
        for k, v in values.items():
            if v is None:
                target.pop(k, None)
            else:
                target[k] = v
    return out


def with_condition(node_: dict[str, Any], type_: str, status: str) -> dict[str, Any]:
    out = copy.deepcopy(node_)
    for c in out["status"]["conditions"]:
        if c["type"] == type_:
            c["status"] = status
    return out


def node_write(old: dict[str, Any], new: dict[str, Any], *, sub: str = "", name: str = NODE) -> dict[str, Any]:
    return request(operation="UPDATE", group="", resource="nodes", sub=sub, name=name, obj=new, old=old)


def event_write(
    operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None = None, *, group: str = ""
) -> dict[str, Any]:
    return request(
        operation=operation, group=group, resource="events", name="e1", namespace="default", obj=new, old=old
    )


def lease(*, holder: str = NODE, budget: str = '{"holders":{},"version":1}', extra: dict | None = None) -> dict:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": LEASE,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "node-health-agent"},
            "annotations": {"node-health-agent.io/budget": budget} | (extra or {}),
        },
        "spec": {"holderIdentity": holder, "renewTime": "2026-01-01T00:00:00.000000Z"},
    }


SLOT_LEASE = "node-health-agent-active-0123456789ab"


def slot_lease(*, holder: str = NODE) -> dict:
    out = lease(holder=holder)
    out["metadata"] = out["metadata"] | {"name": SLOT_LEASE, "annotations": {SLOTS_ANNOTATION: '{"holders":{}}'}}
    return out


def lease_write(operation: str, new: dict | None, old: dict | None = None, *, name: str = LEASE) -> dict[str, Any]:
    return request(
        operation=operation,
        group="coordination.k8s.io",
        resource="leases",
        name=name,
        namespace=NAMESPACE,
        obj=new,
        old=old,
    )


def changed_lease_labels() -> dict[str, Any]:
    out = lease()
    out["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "someone-else"}
    return out


BASE = the_node()
CORDONED_BY_US = the_node(unschedulable=True, taints=(GPU_TAINT, OUR_TAINT), annotations={INCIDENT_ANNOTATION: OURS})
CORDONED_BY_OPERATOR = the_node(unschedulable=True)
OUR_ANNOTATIONS = {INCIDENT_ANNOTATION: OURS, HISTORY_ANNOTATION: '{"rungs":[]}', FLAP_ANNOTATION: '{"count":1}'}
CASES = [
    # (id, request, allowed, message part)
    # -- the Node: which one, and how
    ("own node status", node_write(BASE, with_condition(BASE, "NeuronHealth", "True"), sub="status"), True, ""),
    (
        "own node cordon (ours)",
        node_write(
            BASE,
            changed(
                BASE,
                spec={"unschedulable": True, "taints": [GPU_TAINT, OUR_TAINT]},
                annotations={INCIDENT_ANNOTATION: OURS},
            ),
        ),
        True,
        "",
    ),
    (
        "incident recorded before the cordon (a plan)",
        node_write(BASE, changed(BASE, annotations={INCIDENT_ANNOTATION: PLANNED})),
        True,
        "",
    ),
    (
        "own node already cordoned by an operator: taint and record it as not ours",
        node_write(
            CORDONED_BY_OPERATOR,
            changed(
                CORDONED_BY_OPERATOR,
                spec={"taints": [GPU_TAINT, OUR_TAINT]},
                annotations={INCIDENT_ANNOTATION: NOT_OURS},
            ),
        ),
        True,
        "",
    ),
    (
        "our cordon, the incident updated (drain done)",
        node_write(CORDONED_BY_US, changed(CORDONED_BY_US, annotations={INCIDENT_ANNOTATION: OURS_LATER})),
        True,
        "",
    ),
    (
        "uncordon of our cordon, with the flap record",
        node_write(
            CORDONED_BY_US,
            changed(
                CORDONED_BY_US,
                spec={"unschedulable": False, "taints": [GPU_TAINT]},
                annotations={INCIDENT_ANNOTATION: None, FLAP_ANNOTATION: '{"count":1,"lastUncordon":1767229200.0}'},
            ),
        ),
        True,
        "",
    ),
    (
        "the history annotation",
        node_write(BASE, changed(BASE, annotations={HISTORY_ANNOTATION: '{"opened":[],"rungs":[]}'})),
        True,
        "",
    ),
    (
        "the attempt ledger, with the history",
        node_write(
            BASE,
            changed(
                BASE,
                annotations={
                    HISTORY_ANNOTATION: '{"rungs":[]}',
                    ATTEMPT_ANNOTATION: '{"at":1767225600.0,"state":"reserved"}',
                },
            ),
        ),
        True,
        "",
    ),
    (
        "the attempt ledger removed",
        node_write(
            the_node(annotations={ATTEMPT_ANNOTATION: "{}"}), changed(BASE, annotations={ATTEMPT_ANNOTATION: None})
        ),
        True,
        "",
    ),
    (
        "uncordon of our cordon after a reboot (claim, evidence, reboot done)",
        node_write(
            the_node(
                unschedulable=True, taints=(GPU_TAINT, OUR_TAINT), annotations={INCIDENT_ANNOTATION: OURS_REBOOTED}
            ),
            the_node(),
        ),
        True,
        "",
    ),
    (
        "other node status",
        node_write(the_node(OTHER), with_condition(the_node(OTHER), "NeuronHealth", "True"), sub="status", name=OTHER),
        False,
        "may write only its own Node",
    ),
    (
        "other node cordon",
        node_write(the_node(OTHER), changed(the_node(OTHER), spec={"unschedulable": True}), name=OTHER),
        False,
        "own Node",
    ),
    ("delete a node", request(operation="DELETE", group="", resource="nodes", name=OTHER), False, "own Node"),
    ("delete its own node", request(operation="DELETE", group="", resource="nodes", name=NODE), False, "only update"),
    (
        "create its own node",
        request(operation="CREATE", group="", resource="nodes", name=NODE, obj=BASE),
        False,
        "only update",
    ),
    # -- labels: the agent sets none
    (
        "add a node-restriction label",
        node_write(BASE, changed(BASE, labels={"node-restriction.kubernetes.io/gpu-pool": "prod"})),
        False,
        "changes no label",
    ),
    (
        "add a control-plane label",
        node_write(BASE, changed(BASE, labels={"node-role.kubernetes.io/control-plane": ""})),
        False,
        "changes no label",
    ),
    (
        "drop the opt-out label",
        node_write(BASE, changed(BASE, labels={OPT_OUT_LABEL: None})),
        False,
        "changes no label",
    ),
    (
        "drop the opt-out label through nodes/status",
        node_write(BASE, changed(BASE, labels={OPT_OUT_LABEL: None}), sub="status"),
        False,
        "changes no label",
    ),
    # -- annotations: only its own three
    ("drop the operator's veto", node_write(BASE, changed(BASE, annotations={VETO: None})), False, "annotations"),
    ("set a veto", node_write(BASE, changed(BASE, annotations={VETO: "agent says"})), False, "annotations"),
    (
        "set another owner's annotation",
        node_write(BASE, changed(BASE, annotations={"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"})),
        False,
        "annotations",
    ),
    # -- taints: only its own NoSchedule one
    (
        "remove another owner's taint",
        node_write(BASE, changed(BASE, spec={"taints": []})),
        False,
        "only its own taint",
    ),
    (
        "change another owner's taint",
        node_write(BASE, changed(BASE, spec={"taints": [GPU_TAINT | {"effect": "PreferNoSchedule"}]})),
        False,
        "only its own taint",
    ),
    (
        "its own key as NoExecute (evicts everything)",
        node_write(BASE, changed(BASE, spec={"taints": [GPU_TAINT, OUR_TAINT | {"effect": "NoExecute"}]})),
        False,
        "only its own taint",
    ),
    # -- the startup validation's taint (policy startupValidation): NoSchedule, added and removed by the agent
    (
        "remove the startup taint after the first pass",
        node_write(the_node(taints=(GPU_TAINT, UNVALIDATED)), changed(BASE, spec={"taints": [GPU_TAINT]})),
        True,
        "",
    ),
    ("add the startup taint", node_write(BASE, changed(BASE, spec={"taints": [GPU_TAINT, UNVALIDATED]})), True, ""),
    (
        "the startup taint's key as NoExecute (evicts everything)",
        node_write(BASE, changed(BASE, spec={"taints": [GPU_TAINT, UNVALIDATED | {"effect": "NoExecute"}]})),
        False,
        "only its own taint",
    ),
    # -- cordons: uncordon only its own
    (
        "uncordon an operator's cordon",
        node_write(CORDONED_BY_OPERATOR, changed(CORDONED_BY_OPERATOR, spec={"unschedulable": False})),
        False,
        "uncordon only a Node",
    ),
    (
        "uncordon a cordon recorded as not ours",
        node_write(
            the_node(unschedulable=True, annotations={INCIDENT_ANNOTATION: NOT_OURS}),
            changed(the_node(annotations={INCIDENT_ANNOTATION: NOT_OURS}), annotations={INCIDENT_ANNOTATION: None}),
        ),
        False,
        "uncordon only a Node",
    ),
    (
        "uncordon when only a plan says ours",
        node_write(
            the_node(unschedulable=True, annotations={INCIDENT_ANNOTATION: PLANNED}),
            the_node(annotations={INCIDENT_ANNOTATION: PLANNED}),
        ),
        False,
        "uncordon only a Node",
    ),
    (
        "claim an operator's cordon as ours",
        node_write(CORDONED_BY_OPERATOR, changed(CORDONED_BY_OPERATOR, annotations={INCIDENT_ANNOTATION: OURS})),
        False,
        "only in the write that cordons",
    ),
    (
        "claim and uncordon at once",
        node_write(
            CORDONED_BY_OPERATOR,
            changed(CORDONED_BY_OPERATOR, spec={"unschedulable": False}, annotations={INCIDENT_ANNOTATION: OURS}),
        ),
        False,
        "uncordon only a Node",
    ),
    # -- the kubelet's conditions
    (
        "set Ready to False",
        node_write(BASE, with_condition(BASE, "Ready", "False"), sub="status"),
        False,
        "kubelet's conditions",
    ),
    # -- Events
    ("event about own node", event_write("CREATE", event("Node", NODE)), True, ""),
    (
        "event about own node (events.k8s.io)",
        event_write("CREATE", event("Node", NODE, group="events.k8s.io"), group="events.k8s.io"),
        True,
        "",
    ),
    (
        "patch of an event about own node",
        event_write("UPDATE", event("Node", NODE, count=2), event("Node", NODE)),
        True,
        "",
    ),
    ("event about another node", event_write("CREATE", event("Node", OTHER)), False, "Events only about its own Node"),
    (
        "event about another node (events.k8s.io)",
        event_write(
            "UPDATE",
            event("Node", OTHER, group="events.k8s.io"),
            event("Node", OTHER, group="events.k8s.io"),
            group="events.k8s.io",
        ),
        False,
        "Events only about its own Node",
    ),
    (
        "event about a pod named like the node, not reported by it",
        event_write("CREATE", event("Pod", NODE)),
        False,
        "Events about a Pod only as their reportingInstance",
    ),
    (
        "a pod's event in prod rewritten into one about its own node",
        request(
            operation="UPDATE",
            group="",
            resource="events",
            name="e1",
            namespace="prod",
            obj=event("Node", NODE),
            old=event("Pod", "payments-7d9f"),
        ),
        False,
        "Events about a Pod only as their reportingInstance",
    ),
    (
        "another node's event rewritten into one about its own node",
        event_write("UPDATE", event("Node", NODE), event("Node", OTHER)),
        False,
        "Events only about its own Node",
    ),
    (
        "another node's event rewritten (events.k8s.io)",
        event_write(
            "UPDATE",
            event("Node", NODE, group="events.k8s.io"),
            event("Node", OTHER, group="events.k8s.io"),
            group="events.k8s.io",
        ),
        False,
        "Events only about its own Node",
    ),
    ("delete an event", event_write("DELETE", None, event("Node", NODE)), False, "Events only"),
    # -- the budget Lease
    ("budget lease created", lease_write("CREATE", lease()), True, ""),
    (
        "budget lease updated",
        lease_write("UPDATE", lease(budget='{"holders":{"x":{}},"version":1}'), lease(holder=OTHER)),
        True,
        "",
    ),
    (
        "budget lease of a named cluster",
        lease_write(
            "CREATE", lease() | {"metadata": lease()["metadata"] | {"name": f"{LEASE}-prod"}}, name=f"{LEASE}-prod"
        ),
        True,
        "",
    ),
    (
        "another lease",
        lease_write("UPDATE", lease(), lease(), name="kube-scheduler"),
        False,
        "only the recovery budget",
    ),
    (
        "the pause lease",
        lease_write("UPDATE", lease(), lease(), name="node-health-agent-recovery-pause"),
        False,
        "budget Lease",
    ),
    (
        "budget lease written as another node",
        lease_write("UPDATE", lease(holder=OTHER), lease()),
        False,
        "holderIdentity",
    ),
    ("budget lease deleted", lease_write("DELETE", None, lease()), False, "holderIdentity"),
    (
        "another annotation on the budget lease",
        lease_write("UPDATE", lease(extra={"node-health-agent.io/pauses": "{}"}), lease()),
        False,
        "annotations",
    ),
    (
        "the budget lease's labels",
        lease_write("UPDATE", changed_lease_labels(), lease()),
        False,
        "changes no label",
    ),
    # -- the active checks' fleet slot Leases (agent/checks/fleetslots.py) and the validations on the Node
    ("slot lease created", lease_write("CREATE", slot_lease(), name=SLOT_LEASE), True, ""),
    ("slot lease updated", lease_write("UPDATE", slot_lease(), slot_lease(holder=OTHER), name=SLOT_LEASE), True, ""),
    (
        "slot lease written as another node",
        lease_write("UPDATE", slot_lease(holder=OTHER), slot_lease(), name=SLOT_LEASE),
        False,
        "holderIdentity",
    ),
    ("validations on the node", node_write(BASE, changed(BASE, annotations={VALIDATIONS_ANNOTATION: "[]"})), True, ""),
    # -- Events about a Pod (the holders of a faulty device): reported by its node, related to its Node
    ("pod event from its own node", pod_event_write("CREATE", pod_event()), True, ""),
    (
        "pod event from its own node (events.k8s.io)",
        pod_event_write("CREATE", pod_event(group="events.k8s.io"), group="events.k8s.io"),
        True,
        "",
    ),
    ("patch of its pod event", pod_event_write("UPDATE", pod_event(count=2), pod_event()), True, ""),
    (
        "pod event from another node",
        pod_event_write("CREATE", pod_event(reporter=OTHER, host=OTHER)),
        False,
        "Events about a Pod only as their reportingInstance",
    ),
    (
        "pod event from another node (events.k8s.io)",
        pod_event_write("CREATE", pod_event(group="events.k8s.io", reporter=OTHER), group="events.k8s.io"),
        False,
        "Events about a Pod only as their reportingInstance",
    ),
    (
        "pod event with another node as source.host",
        pod_event_write("CREATE", pod_event(host=OTHER)),
        False,
        "(and source.host)",
    ),
    (
        "pod event without reportingInstance",
        pod_event_write("CREATE", pod_event(reporter=None)),
        False,
        "reportingInstance",
    ),
    ("pod event without related", pod_event_write("CREATE", pod_event(related={})), False, "as related"),
    (
        "pod event without related (events.k8s.io)",
        pod_event_write("CREATE", pod_event(group="events.k8s.io", related={}), group="events.k8s.io"),
        False,
        "as related",
    ),
    (
        "pod event related to another node",
        pod_event_write("CREATE", pod_event(related={"apiVersion": "v1", "kind": "Node", "name": OTHER})),
        False,
        "as related",
    ),
    (
        "pod event related to a pod named like the node",
        pod_event_write("CREATE", pod_event(related={"apiVersion": "v1", "kind": "Pod", "name": NODE})),
        False,
        "as related",
    ),
    (
        "pod event in another namespace than the pod's",
        pod_event_write("CREATE", pod_event(pod_namespace="prod"), namespace="default"),
        False,
        "namespace of that Pod",
    ),
    (
        "another node's pod event taken over",
        pod_event_write("UPDATE", pod_event(count=2), pod_event(reporter=OTHER, host=OTHER)),
        False,
        "reportingInstance",
    ),
    (
        "its pod event rewritten into one about another node",
        pod_event_write("UPDATE", event("Node", OTHER) | {"metadata": pod_event()["metadata"]}, pod_event()),
        False,
        "Events only about its own Node or a Pod",
    ),
    (
        "event about a Service",
        pod_event_write("CREATE", pod_event() | {"involvedObject": {"kind": "Service", "name": "api"}}),
        False,
        "Events only about its own Node or a Pod",
    ),
    ("delete of its pod event", pod_event_write("DELETE", None, pod_event()), False, "Events only"),
    # -- DeviceTaintRules (the device fence): its own name, label, pool, a driver it manages, one device
    ("fence a GPU", rule_write("CREATE", RULE), True, ""),
    (
        "fence a Neuron device",
        rule_write("CREATE", taint_rule(driver="neuron.aws.com", device="neurondevice2")),
        True,
        "",
    ),
    ("the dry run first (effect None)", rule_write("CREATE", taint_rule(effect="None")), True, ""),
    ("None then NoSchedule", rule_write("UPDATE", RULE, taint_rule(effect="None")), True, ""),
    ("lift its fence", rule_write("DELETE", None, RULE), True, ""),
    (
        "wrong prefix: another node's name",
        rule_write("CREATE", taint_rule(name=f"node-health-agent-{OTHER}-gpu-3")),
        False,
        "DeviceTaintRules named",
    ),
    (
        "wrong prefix: not the agent's",
        rule_write("CREATE", taint_rule(name="gpu-maintenance")),
        False,
        "DeviceTaintRules named",
    ),
    (
        "prefix without the dash after the node",
        rule_write("CREATE", taint_rule(name=f"node-health-agent-{NODE}gpu-3")),
        False,
        "DeviceTaintRules named",
    ),
    ("wrong pool", rule_write("CREATE", taint_rule(pool=OTHER)), False, "its own pool"),
    ("no pool (every pool's device of that name)", rule_write("CREATE", taint_rule(pool="")), False, "own pool"),
    ("foreign driver", rule_write("CREATE", taint_rule(driver="gpu.intel.com")), False, "drivers it manages"),
    ("no driver (every driver's)", rule_write("CREATE", taint_rule(driver=None)), False, "drivers it manages"),
    ("no device (the whole pool)", rule_write("CREATE", taint_rule(device=None)), False, "names one device"),
    ("missing label", rule_write("CREATE", taint_rule(label="")), False, "labelled node-health-agent.io/node"),
    ("label of another node", rule_write("CREATE", taint_rule(label=OTHER)), False, "labelled"),
    ("delete of another node's rule", rule_write("DELETE", None, OTHERS_RULE), False, "DeviceTaintRules named"),
    (
        "delete of a rule named like its own, on another pool",
        rule_write("DELETE", None, taint_rule(pool=OTHER)),
        False,
        "own pool",
    ),
    (
        "update of another node's rule",
        rule_write("UPDATE", OTHERS_RULE | {"spec": RULE["spec"]}, OTHERS_RULE),
        False,
        "DeviceTaintRules named",
    ),
    (
        "a rule named like its own moved onto its pool",
        rule_write("UPDATE", RULE, taint_rule(pool=OTHER)),
        False,
        "own pool",
    ),
    ("its rule moved to another pool", rule_write("UPDATE", taint_rule(pool=OTHER), RULE), False, "own pool"),
    ("its rule without a node claim", rule_write("CREATE", RULE, node_claim=None), False, "no node claim"),
    (
        "a node name over 63 characters (no label value can hold it: the fence hashes it)",
        rule_write("CREATE", taint_rule(node_name=LONG_NODE, label="hashed-" + "a" * 50), node_claim=LONG_NODE),
        True,
        "",
    ),
    (
        "a long node name still needs its own pool",
        rule_write("CREATE", taint_rule(node_name=LONG_NODE, pool=OTHER, label="x"), node_claim=LONG_NODE),
        False,
        "own pool",
    ),
    # -- tokens and users
    (
        "token without a node claim",
        request(
            operation="UPDATE", group="", resource="nodes", sub="status", name=NODE, obj=BASE, old=BASE, node_claim=None
        ),
        False,
        "no node claim",
    ),
    (
        "the agent installed in kube-system",
        request(
            operation="UPDATE",
            group="",
            resource="nodes",
            sub="status",
            name=OTHER,
            obj=the_node(OTHER),
            old=the_node(OTHER),
            user="system:serviceaccount:kube-system:node-health-agent",
        ),
        False,
        "own Node",
    ),
]
NOT_MATCHED = [
    (
        "the kubelet",
        request(operation="UPDATE", group="", resource="nodes", sub="status", name=OTHER, user=f"system:node:{OTHER}"),
    ),
    (
        "another service account",
        request(
            operation="UPDATE",
            group="",
            resource="nodes",
            name=OTHER,
            user="system:serviceaccount:kube-system:node-health-agent-x",
        ),
    ),
    ("a pod write", request(operation="CREATE", group="", resource="pods", name="p", namespace="default")),
    (
        "the NVIDIA DRA driver's own rule",
        rule_write("CREATE", taint_rule(name="gpu-xid"))
        | {"userInfo": {"username": "system:serviceaccount:nvidia-dra-driver-gpu:nvidia-dra-driver-gpu"}},
    ),
    (
        "the agent's resourceslices read is no write",
        request(operation="CREATE", group="resource.k8s.io", resource="resourceslices", name="s"),
    ),
]


def pod(name: str, node_name: str, namespace: str = "prod") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "i"}]},
    }


PODS = [pod("trainer-0", NODE), pod("trainer-1", OTHER), pod("pending", "") | {"spec": {"containers": []}}]


def eviction(name: str, *, namespace: str = "prod", node_claim: str | None = NODE) -> dict[str, Any]:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    return request(
        operation="CREATE",
        group="",
        resource="pods",
        sub="eviction",
        name=name,
        namespace=namespace,
        obj=body,
        node_claim=node_claim,
    )


EVICTION_CASES = [
    # (id, request, the pods of its namespace (the params), allowed, message part)
    ("a pod on its own node", eviction("trainer-0"), PODS, True, ""),
    ("a pod on another node", eviction("trainer-1"), PODS, False, "evict only pods on its own Node"),
    ("a pod bound to no node", eviction("pending"), PODS, False, "evict only pods on its own Node"),
    ("a namespace without pods", eviction("ghost", namespace="empty"), [], False, "no params"),
    ("token without a node claim", eviction("trainer-0", node_claim=None), PODS, False, "no node claim"),
]


@pytest.mark.parametrize(("request_", "allowed", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_policy_decides(evaluate: PolicyEvaluator, request_: dict[str, Any], allowed: bool, says: str) -> None:
    verdict = evaluate(request_)
    assert verdict.matched
    assert verdict.allowed is allowed, verdict.messages
    if not allowed:
        assert any(says in m for m in verdict.messages), verdict.messages


@pytest.mark.parametrize("request_", [c[1] for c in NOT_MATCHED], ids=[c[0] for c in NOT_MATCHED])
def test_policy_leaves_everyone_else_alone(evaluate: PolicyEvaluator, request_: dict[str, Any]) -> None:
    assert evaluate(request_) == Verdict(matched=False, allowed=True)


@pytest.mark.parametrize(
    ("request_", "pods", "allowed", "says"), [c[1:] for c in EVICTION_CASES], ids=[c[0] for c in EVICTION_CASES]
)
def test_evictions_only_on_its_own_node(
    evaluate_eviction: PolicyEvaluator, request_: dict[str, Any], pods: list[dict[str, Any]], allowed: bool, says: str
) -> None:
    verdict = evaluate_eviction(request_, params=pods)
    assert verdict.matched
    assert verdict.allowed is allowed, verdict.messages
    if not allowed:
        assert any(says in m for m in verdict.messages), verdict.messages


def test_the_eviction_policy_takes_the_pods_of_the_evictions_namespace() -> None:
    """The params are the Pods of the request's namespace (namespace unset), every one of them, none = refused."""
    policy, binding = load_policy(EVICTIONS)["spec"], load_binding(EVICTIONS)["spec"]
    assert policy["paramKind"] == {"apiVersion": "v1", "kind": "Pod"}
    assert binding["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Deny"}
    assert binding["validationActions"] == ["Deny"] and policy["failurePolicy"] == "Fail"


def test_every_write_the_rbac_grants_is_constrained(evaluate: PolicyEvaluator) -> None:
    """Each (group, resource) the agent's Roles let it write is covered by matchConstraints."""
    docs = helm_template(EXAMPLES / "eks.yaml")
    writes = {
        (group, resource)
        for doc in docs
        if doc["kind"] in ("ClusterRole", "Role")
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if set(rule["verbs"]) - {"get", "list", "watch"}
    }
    rules = [
        rule
        for policy in (evaluate.spec, load_policy(EVICTIONS)["spec"])
        for rule in policy["matchConstraints"]["resourceRules"]
    ]
    covered = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "pods/eviction") in writes  # recovery's drain: narrowed by the second policy
    assert writes - covered == set()


# ---- the agent's real writes -----------------------------------------------------------------------------------

RESOURCES = {
    "nodes": ("", "v1"),
    "events": ("", "v1"),
    "leases": ("coordination.k8s.io", "v1"),
    "devicetaintrules": ("resource.k8s.io", "v1"),
}
OPERATIONS = {"ADDED": "CREATE", "MODIFIED": "UPDATE", "DELETED": "DELETE"}


def admission_requests(server: KubeApiServer, since: int) -> Iterator[dict[str, Any]]:
    """The AdmissionRequests the API server would have evaluated for every change stored after ``since``: the
    object before (``oldObject``) and after (``object``) each write, as the API serves them. A Node write that
    changed only ``status`` went through nodes/status (the agent's condition sink), any other through nodes."""
    for resource, (group, version) in RESOURCES.items():
        rt = server.api.resource(group, version, resource)
        assert rt is not None
        changes, watcher = server.store.watch(rt.storage_key, None, since)
        server.store.unwatch(watcher)
        for change in changes:
            new = None if change.type == "DELETED" else server.api.external(rt, change.obj)
            old = None if change.prev is None else server.api.external(rt, change.prev)
            sub = ""
            if resource == "nodes" and old is not None and new is not None:
                unchanged = {k: v for k, v in without_version(new).items() if k != "status"} == {
                    k: v for k, v in without_version(old).items() if k != "status"
                }
                sub = "status" if unchanged else ""
            yield request(
                operation=OPERATIONS[change.type],
                group=group,
                resource=resource,
                name=change.name,
                namespace=change.namespace if rt.namespaced else "",
                sub=sub,
                obj=new,
                old=old,
            )


def without_version(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """``obj`` without metadata.resourceVersion (it changes with every write; the diff above is about content)."""
    if obj is None:
        return None
    out = copy.deepcopy(obj)
    out["metadata"].pop("resourceVersion", None)
    return out


def test_the_agents_recorded_writes_are_admitted_for_its_own_node_only(
    evaluate: PolicyEvaluator, api: KubeApiServer, aws: AwsTestEnv, tmp_path: Path
) -> None:
    """A real agent detects, cordons, marks its instance Unhealthy and takes the budget; then the agent's own
    steps give the Node back (uncordon with the flap record, through the real client). Every write is
    admitted; replayed with a token bound to another node, every one about the Node is refused."""
    group = aws.node_group(size=1)
    (instance_id,) = group.instance_ids
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}"))
    since = api.store.revision
    agent = Agent(tmp_path, api, enable="true", endpoint=aws.endpoint)
    try:
        wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "False", timeout=30)
        agent.fault()
        wait_for(lambda: api.get_object("nodes", NODE)["spec"].get("unschedulable"), timeout=30)
        wait_for(lambda: any(e["reason"] == "RecoveryCordoned" for e in api.list_objects("events", "default")))
    finally:
        agent.stop()
    stored = read_incident(api.get_object("nodes", NODE))
    assert stored is not None and stored.cordoned_by_us
    with kube_client(api, tmp_path) as client:
        flap = flap_text(after_uncordon(None, stored, stored.opened + 600))
        uncordon(client, node_name=NODE, incident=stored, annotations={FLAP_ANNOTATION: flap})
    assert not api.get_object("nodes", NODE)["spec"]["unschedulable"]
    writes = list(admission_requests(api, since))
    kinds = {(r["resource"]["resource"], r.get("subResource", ""), r["operation"]) for r in writes}
    assert {("nodes", "status", "UPDATE"), ("nodes", "", "UPDATE"), ("events", "", "CREATE")} <= kinds
    assert ("leases", "", "CREATE") in kinds or ("leases", "", "UPDATE") in kinds, "the budget Lease was written"
    written = {k for r in writes if r["object"] for k in (r["object"]["metadata"].get("annotations") or {})}
    assert {INCIDENT_ANNOTATION, HISTORY_ANNOTATION, FLAP_ANNOTATION} <= written
    uncordons = [
        r
        for r in writes
        if r["oldObject"]
        and r["oldObject"]["spec"].get("unschedulable")
        and r["object"]
        and not r["object"]["spec"].get("unschedulable")
    ]
    assert len(uncordons) == 1
    for req in writes:
        verdict = evaluate(req)
        assert verdict.matched and verdict.allowed, (req["resource"], req["name"], verdict.messages)
        forged = copy.deepcopy(req)
        forged["userInfo"]["extra"][NODE_CLAIM] = [OTHER]
        verdict = evaluate(forged)
        # The budget Lease is shared by every node's agent, but names its last writer; the rest is about this Node.
        assert not verdict.allowed, (req["resource"], req["name"])
        if req["resource"]["resource"] == "leases":
            assert verdict.messages == (
                f"the agent on {OTHER} may write the budget Lease only as its holderIdentity",
            ), verdict.messages


def test_the_device_paths_recorded_writes_are_admitted_for_its_own_node_only(
    evaluate: PolicyEvaluator, api: KubeApiServer, aws: AwsTestEnv, tmp_path: Path
) -> None:
    """A real agent on a DRA node (eight GPUs of gpu.nvidia.com, one pod per GPU, the pod-resources test server):
    an Xid 119 on one GPU tells its pod (a Pod Event), fences the GPU (a DeviceTaintRule: None, then NoSchedule)
    and records it on the Node. Every write is admitted; replayed as another node's agent, every one is refused."""
    from helpers import dra
    from helpers.podresources_server import Container, Pod, PodResourcesServer

    api.device_taints.auto(True)
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/i-0123456789abcdef0"))
    dra.seed_p5(api, node=NODE)
    for i in range(8):
        api.put_object(dra.allocated_claim(f"gpu-{i}", dra.NVIDIA, [f"gpu-{i}"], namespace="ml", pool=NODE))
        api.put_object(dra.claim_pod(f"train-{i}", f"gpu-{i}", namespace="ml", node=NODE))
    pods = [Pod("ml", f"train-{i}", [Container("c", claims=[(dra.NVIDIA, NODE, f"gpu-{i}")])]) for i in range(8)]
    since = api.store.revision
    socket = str(tmp_path / "kubelet.sock")
    with PodResourcesServer(socket, pods):
        env = {"DEVICE_HOLDERS": "true", "POD_RESOURCES_SOCKET": socket}
        agent = Agent(tmp_path, api, enable="true", endpoint=aws.endpoint, packs="kernel,nvidia", env=env)
        try:
            wait_for(lambda: (c := condition(api, "GpuXid")) and c["status"] == "False", timeout=30)
            bus = dra.H100_PCI[3].rsplit(".", 1)[0]
            agent.fault(f"NVRM: Xid (PCI:{bus}): 119, pid=1, name=python3, Timeout after 6s of waiting for RPC")
            wait_for(lambda: any(e["reason"] == "DeviceFenced" for e in api.list_objects("events", "default")), 60)
            wait_for(lambda: any(e["reason"] == "DeviceFault" for e in api.list_objects("events", "ml")), 30)
        finally:
            agent.stop()
    writes = list(admission_requests(api, since))
    kinds = {(r["resource"]["resource"], r.get("namespace", ""), r["operation"]) for r in writes}
    assert {("devicetaintrules", "", "CREATE"), ("devicetaintrules", "", "UPDATE"), ("events", "ml", "CREATE")} <= kinds
    for req in writes:
        verdict = evaluate(req)
        assert verdict.matched and verdict.allowed, (req["resource"], req["name"], verdict.messages)
        forged = copy.deepcopy(req)
        forged["userInfo"]["extra"][NODE_CLAIM] = [OTHER]
        assert not evaluate(forged).allowed, (req["resource"], req["name"])


REBOOT_POLICY = dataclasses.replace(DEFAULT_POLICY, startup_delay=0.0, budget=BudgetSettings(max_actions=100))


def _drained(stop: threading.Event, report: Callable[[str, str], None]) -> DrainResult:
    return DrainResult(outcome="done")  # the drain's own writes (evictions) are covered by the eviction policy


def ledger_states(writes: list[dict[str, Any]]) -> list[str]:
    """The attempt ledger's state after each Node write that changed it."""
    states = []
    for req in writes:
        notes = [(r["metadata"].get("annotations") or {}) if r else {} for r in (req["oldObject"], req["object"])]
        before, after = (n.get(ATTEMPT_ANNOTATION) for n in notes)
        if req["resource"]["resource"] == "nodes" and after is not None and after != before:
            states.append(json.loads(after)["state"])
    return states


def test_a_reboot_rungs_recorded_writes_are_admitted_for_its_own_node_only(
    evaluate: PolicyEvaluator, api: KubeApiServer, aws: AwsTestEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ladder's reboot path, recorded: the recovery loop with its ladder cordons, reserves the reboot in the
    attempt ledger, calls RebootInstances at moto (real boto3), records it sent, and on a new boot id finishes
    it. Every write is admitted for its own Node, and refused replayed as another node's agent."""
    instance = aws.lone_instance()
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance}"))
    since = api.store.revision
    clock, boot = recovery.Clock(), ["boot-1"]
    with FaultyFront(upstream=aws.endpoint, faults=[]) as front, kube_client(api, tmp_path) as client:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)  # to count what reaches moto
        reboot = Ec2Rebooter(ec2=Ec2Reboot(clients=AwsClients()))
        ladder = Ladder(client=client, node_name=NODE, boot_id=lambda: boot[0], reboot=reboot, monotonic=clock)
        h = recovery.LoopHarness(
            api, client, policy=REBOOT_POLICY, put_node=False, clock=clock, ladder=ladder, drainer=_drained
        )
        h.publish(recovery.problem("GpuXid", "GpuXid79", since=recovery.T0 - 10))
        h.step()
        assert front.actions.count("RebootInstances") == 1
        boot[0] = "boot-2"  # the host went down and came back
        for _ in range(3):
            clock.now += 60
            h.step()
        assert front.actions.count("RebootInstances") == 1
    assert "reboot" in (h.incident() or {}).get("done", []) and h.cordoned()
    writes = list(admission_requests(api, since))
    assert ledger_states(writes) == [attempts.RESERVED, attempts.SENT, attempts.FINISHED]
    written = {k for r in writes if r["object"] for k in (r["object"]["metadata"].get("annotations") or {})}
    assert {INCIDENT_ANNOTATION, HISTORY_ANNOTATION, ATTEMPT_ANNOTATION} <= written
    assert any(r["resource"]["resource"] == "leases" for r in writes), "the budget Lease was written"
    for req in writes:
        verdict = evaluate(req)
        assert verdict.matched and verdict.allowed, (req["resource"], req["name"], verdict.messages)
        forged = copy.deepcopy(req)
        forged["userInfo"]["extra"][NODE_CLAIM] = [OTHER]
        assert not evaluate(forged).allowed, (req["resource"], req["name"])


# What the agent's recovery modules name an annotation for, and where (a new constant must be placed here).
ON_THE_NODE = {
    INCIDENT_ANNOTATION,
    HISTORY_ANNOTATION,
    FLAP_ANNOTATION,
    ATTEMPT_ANNOTATION,
    CLEARS_ANNOTATION,
    VALIDATIONS_ANNOTATION,
}
ON_A_LEASE = {BUDGET_ANNOTATION, SLOTS_ANNOTATION}
NOT_WRITTEN_ON_THE_NODE = {
    CLEAR_REQUEST_ANNOTATION: "the operator's, on the Node (node-health-agent clear): the agent only reads it",
    VETO_ANNOTATION: "the operator's, on the Node: the agent only reads it",
    BUDGET_ANNOTATION: "on the budget Lease (the policy's Lease rules)",
    SLOTS_ANNOTATION: "on the active checks' fleet slot Leases (agent/checks/fleetslots.py; the Lease rules)",
    PAUSE_ANNOTATION: "on the pause Lease, which only the CLI writes",
    FENCE_REASON_ANNOTATION: "on the agent's DeviceTaintRules (agent/recovery/fence.py), never on the Node",
}


def agents_annotation_constants() -> dict[str, str]:
    """Every ``*_ANNOTATION`` of the agent's own domain in agent.recovery's, agent.core's and agent.checks'
    modules: {value: where defined}."""
    found: dict[str, str] = {}
    for info in [
        *pkgutil.iter_modules(agent.recovery.__path__, prefix="agent.recovery."),
        *pkgutil.iter_modules(agent.checks.__path__, prefix="agent.checks."),
        *pkgutil.iter_modules(agent.core.__path__, prefix="agent.core."),
    ]:
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.endswith("_ANNOTATION") and isinstance(value, str) and value.startswith(f"{DOMAIN}/"):
                found.setdefault(value, f"{info.name}.{name}")
    return found


def test_the_policy_owns_exactly_the_annotations_the_agent_writes_on_its_node() -> None:
    """The list in the policy (and its message, and the docs) is the agent's own constants: a new annotation
    the agent writes on its Node cannot be silently refused by the policy."""
    constants = agents_annotation_constants()
    assert set(constants) == ON_THE_NODE | set(NOT_WRITTEN_ON_THE_NODE), "classify each new annotation here"
    (variable,) = [v for v in load_policy()["spec"]["variables"] if v["name"] == "ownedAnnotations"]
    env = celpy.Environment()
    program = env.program(env.compile(variable["expression"]))
    for on_node, expected in ((True, ON_THE_NODE), (False, ON_A_LEASE)):
        listed = program.evaluate({"variables": celpy.celtypes.MapType({"isNode": celpy.celtypes.BoolType(on_node)})})
        assert sorted(str(k) for k in listed) == sorted(expected)
    (rule,) = [v for v in load_policy()["spec"]["validations"] if "annotations it owns" in v.get("message", "")]
    section = (DAEMONSET.parent / "docs" / "deploy.md").read_text().split("## 10.")[1].split("\n## ")[0]
    (row,) = [line for line in section.splitlines() if line.startswith("| annotations |")]
    for key in ON_THE_NODE:
        short = key.removeprefix(DOMAIN)
        assert short in rule["message"], key
        assert f"`{short}`" in row or f"`{key}`" in row, key


def test_the_policy_s_own_taints_are_the_agent_s() -> None:
    """The taint keys the policy lets the agent add and remove: its cordon's and the startup validation's."""
    (variable,) = [v for v in load_policy()["spec"]["variables"] if v["name"] == "ownTaints"]
    env = celpy.Environment()
    listed = env.program(env.compile(variable["expression"])).evaluate({})
    assert sorted(str(k) for k in listed) == sorted((TAINT_KEY, UNVALIDATED_TAINT_KEY))


def test_the_chart_and_the_component_ship_the_same_policy() -> None:
    rendered = [d for d in helm_template(EXAMPLES / "eks.yaml") if d["kind"].startswith("ValidatingAdmissionPolicy")]
    shipped = [d for d in yaml.safe_load_all(Path(POLICY_FILE).read_text()) if d]

    def key(doc: dict[str, Any]) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]

    assert len(shipped) == 4
    assert [(d["kind"], d["spec"]) for d in sorted(rendered, key=key)] == [
        (d["kind"], d["spec"]) for d in sorted(shipped, key=key)
    ]
