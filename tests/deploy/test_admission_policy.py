"""The own-Node ValidatingAdmissionPolicy (daemonset/components/admission-policy/policy.yaml), evaluated the way
the API server evaluates it: matchConstraints, then matchConditions, then the variables, then every
validation, each CEL expression run by cel-python against admission requests.

The requests are the agent's real writes, recorded: a Kubernetes-mode agent with
recovery acting against tests/kubeapi (the real client over HTTP), lets it detect, cordon and take the
budget, and turns every write the server received into the AdmissionRequest the API server would
evaluate (operation, resource, subresource, name, namespace, the object after the write). They must all be
admitted for the agent's own Node and refused once replayed as another node's agent; hand-written
requests cover what a healthy agent never sends (another Node, an Event about a pod, another Lease, a
token without a node claim, other users).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from helpers import wait_for
from helpers.agents import NAMESPACE, NODE, Agent, condition, node
from helpers.aws import REGION, AwsTestEnv
from helpers.k8srender import DAEMONSET, EXAMPLES, helm_template
from kubeapi import KubeApiServer

POLICY_FILE = DAEMONSET / "components" / "admission-policy" / "policy.yaml"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:node-health-agent"


def load_policy() -> dict[str, Any]:
    (policy,) = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d["kind"] == "ValidatingAdmissionPolicy"]
    return policy


# ---- evaluating the policy --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Verdict:
    matched: bool  # matchConstraints and matchConditions select the request
    allowed: bool
    messages: tuple[str, ...] = ()


class PolicyEvaluator:
    """The API server's evaluation of one ValidatingAdmissionPolicy, with cel-python for the expressions."""

    def __init__(self, policy: dict[str, Any]) -> None:
        self._env = celpy.Environment()
        self.spec = policy["spec"]
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

    def __call__(self, request: dict[str, Any]) -> Verdict:
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
        variables: dict[str, Any] = {}
        for variable in self.spec.get("variables", []):
            variables[variable["name"]] = self._eval(
                variable["expression"], {**activation, "variables": celpy.json_to_cel(variables)}
            )
        activation["variables"] = celpy.json_to_cel(variables)
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
    return PolicyEvaluator(load_policy())


# ---- admission requests ----------------------------------------------------------------------------------------


def request(
    *,
    operation: str,
    group: str,
    resource: str,
    name: str,
    namespace: str = "",
    sub: str = "",
    obj: dict[str, Any] | None = None,
    user: str = AGENT_USER,
    node_claim: str | None = NODE,
) -> dict[str, Any]:
    """An AdmissionRequest as the API server builds it (admission.k8s.io/v1)."""
    extra = {"authentication.kubernetes.io/pod-name": ["node-health-agent-neuron-x7k2p"]}
    if node_claim is not None:
        extra[NODE_CLAIM] = [node_claim]
    version = {"": "v1", "events.k8s.io": "v1", "coordination.k8s.io": "v1"}[group]
    out: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": version, "kind": resource.capitalize().rstrip("s")},
        "resource": {"group": group, "version": version, "resource": resource},
        "name": name,
        "operation": operation,
        "userInfo": {"username": user, "uid": "1c6f", "groups": ["system:serviceaccounts"], "extra": extra},
        "object": obj,
        "oldObject": None,
        "dryRun": False,
    }
    if sub:
        out["subResource"] = sub
    if namespace:
        out["namespace"] = namespace
    return out


def event(about_kind: str, about_name: str, *, group: str = "") -> dict[str, Any]:
    ref = {"apiVersion": "v1", "kind": about_kind, "name": about_name}
    if group == "events.k8s.io":
        return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "regarding": ref, "reason": "NeuronHasError"}
    return {"apiVersion": "v1", "kind": "Event", "involvedObject": ref, "reason": "NeuronHasError"}


OTHER = "ip-10-0-9-9.us-west-2.compute.internal"
LEASE = "node-health-agent-recovery-budget"
CASES = [
    # (id, request, allowed, message part)
    ("own node status", request(operation="UPDATE", group="", resource="nodes", sub="status", name=NODE), True, ""),
    ("own node cordon", request(operation="UPDATE", group="", resource="nodes", name=NODE), True, ""),
    (
        "other node status",
        request(operation="UPDATE", group="", resource="nodes", sub="status", name=OTHER),
        False,
        "may write only its own Node",
    ),
    ("other node cordon", request(operation="UPDATE", group="", resource="nodes", name=OTHER), False, "own Node"),
    ("delete a node", request(operation="DELETE", group="", resource="nodes", name=OTHER), False, "own Node"),
    (
        "event about own node",
        request(
            operation="CREATE", group="", resource="events", name="e1", namespace="default", obj=event("Node", NODE)
        ),
        True,
        "",
    ),
    (
        "event about own node (events.k8s.io)",
        request(
            operation="CREATE",
            group="events.k8s.io",
            resource="events",
            name="e1",
            namespace="default",
            obj=event("Node", NODE, group="events.k8s.io"),
        ),
        True,
        "",
    ),
    (
        "event about another node",
        request(
            operation="CREATE", group="", resource="events", name="e2", namespace="default", obj=event("Node", OTHER)
        ),
        False,
        "Events only about its own Node",
    ),
    (
        "event about another node (events.k8s.io)",
        request(
            operation="UPDATE",
            group="events.k8s.io",
            resource="events",
            name="e2",
            namespace="default",
            obj=event("Node", OTHER, group="events.k8s.io"),
        ),
        False,
        "Events only about its own Node",
    ),
    (
        "event about a pod named like the node",
        request(
            operation="CREATE", group="", resource="events", name="e3", namespace="default", obj=event("Pod", NODE)
        ),
        False,
        "Events only",
    ),
    (
        "delete an event",
        request(operation="DELETE", group="", resource="events", name="e1", namespace="default"),
        False,
        "Events only",
    ),
    (
        "budget lease",
        request(operation="UPDATE", group="coordination.k8s.io", resource="leases", name=LEASE, namespace=NAMESPACE),
        True,
        "",
    ),
    (
        "budget lease of a named cluster",
        request(
            operation="CREATE",
            group="coordination.k8s.io",
            resource="leases",
            name=f"{LEASE}-prod",
            namespace=NAMESPACE,
        ),
        True,
        "",
    ),
    (
        "another lease",
        request(
            operation="UPDATE",
            group="coordination.k8s.io",
            resource="leases",
            name="kube-scheduler",
            namespace=NAMESPACE,
        ),
        False,
        "only the recovery budget Lease",
    ),
    (
        "token without a node claim",
        request(operation="UPDATE", group="", resource="nodes", sub="status", name=NODE, node_claim=None),
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
    rules = evaluate.spec["matchConstraints"]["resourceRules"]
    covered = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    # Evictions name a pod, not its node: the policy cannot narrow them (docs/deploy.md says so).
    assert writes - covered == {("", "pods/eviction")}


# ---- the agent's real writes -----------------------------------------------------------------------------------

PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/v1)(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[a-z]+)(?:/(?P<name>[^/]+))?"
    r"(?:/(?P<sub>[a-z]+))?$"
)
OPERATIONS = {"POST": "CREATE", "PUT": "UPDATE", "PATCH": "UPDATE", "DELETE": "DELETE"}


def admission_requests(server: KubeApiServer) -> Iterator[dict[str, Any]]:
    """The AdmissionRequests the API server would have evaluated for the writes tests/kubeapi received."""
    for req in server.requests.snapshot():
        if req.method not in OPERATIONS or req.status is None or req.status >= 400:
            continue
        match = PATH.match(req.path)
        assert match, req.path
        group, ns, resource, name, sub = (
            match["group"] or "",
            match["ns"],
            match["resource"],
            match["name"],
            match["sub"],
        )
        if resource == "pods" and sub == "eviction":
            continue  # not constrained (see above)
        body = req.body if isinstance(req.body, dict) else json.loads(req.body or "{}")
        if req.method == "POST":
            name = body["metadata"]["name"]
        # The object as it is after the write (what the API server hands the policy as `object`).
        obj = body if req.method in ("POST", "PUT") else server.get_object(resource, name, ns)
        yield request(
            operation=OPERATIONS[req.method],
            group=group,
            resource=resource,
            name=name,
            namespace=ns or "",
            sub=sub or "",
            obj=obj,
        )


def test_the_agents_recorded_writes_are_admitted_for_its_own_node_only(
    evaluate: PolicyEvaluator, api: KubeApiServer, aws: AwsTestEnv, tmp_path: Path
) -> None:
    """A real agent detects, cordons, marks its instance Unhealthy and takes the budget: every write it makes
    is admitted; replayed with a token bound to another node, every one about the Node is refused."""
    group = aws.node_group(size=1)
    (instance_id,) = group.instance_ids
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}"))
    agent = Agent(tmp_path, api, enable="true", endpoint=aws.endpoint)
    try:
        wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "False", timeout=30)
        agent.fault()
        wait_for(lambda: api.get_object("nodes", NODE)["spec"].get("unschedulable"), timeout=30)
        wait_for(lambda: any(e["reason"] == "RecoveryCordoned" for e in api.list_objects("events", "default")))
    finally:
        agent.stop()
    writes = list(admission_requests(api))
    kinds = {(r["resource"]["resource"], r.get("subResource", ""), r["operation"]) for r in writes}
    assert {("nodes", "status", "UPDATE"), ("nodes", "", "UPDATE"), ("events", "", "CREATE")} <= kinds
    assert ("leases", "", "CREATE") in kinds or ("leases", "", "UPDATE") in kinds, "the budget Lease was written"
    for req in writes:
        verdict = evaluate(req)
        assert verdict.matched and verdict.allowed, (req["resource"], req["name"], verdict.messages)
        forged = copy.deepcopy(req)
        forged["userInfo"]["extra"][NODE_CLAIM] = [OTHER]
        verdict = evaluate(forged)
        # The budget Lease is shared by every node's agent; everything else is about this Node.
        assert verdict.allowed is (req["resource"]["resource"] == "leases"), (req["resource"], req["name"])


def test_the_chart_and_the_component_ship_the_same_policy() -> None:
    rendered = [d for d in helm_template(EXAMPLES / "eks.yaml") if d["kind"].startswith("ValidatingAdmissionPolicy")]
    shipped = [d for d in yaml.safe_load_all(Path(POLICY_FILE).read_text()) if d]
    assert [(d["kind"], d["spec"]) for d in rendered] == [(d["kind"], d["spec"]) for d in shipped]
