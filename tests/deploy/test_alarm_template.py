"""daemonset/aws/cloudwatch-alarms.cfn.yaml alarms on exactly what the CloudWatch sink publishes.

The template is read with a YAML loader that knows CloudFormation's short tags (``!Sub``, ``!Ref``,
...), rendered by a small evaluator of the intrinsics it uses (``Fn::ForEach`` of the
AWS::LanguageExtensions transform, ``Ref``, ``Fn::Sub``, ``Fn::If``, ``Fn::Not``, ``Fn::Equals``;
anything else fails the test), checked against the sink's constants, linted with cfn-lint (the
CloudFormation resource schemas), and the rendered alarms are created in moto through
PutMetricAlarm, the call CloudFormation makes (moto's CloudFormation implements neither
AWS::CloudWatch::Alarm nor the transform).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from agent.recovery.policyfile import DEFAULT_POLICY
from agent.sinks.cloudwatch import CLUSTER_DIMENSION, DEFAULT_NAMESPACE, DIMENSIONS, NEURON_ERRORS

from helpers import REPO

pytestmark = pytest.mark.slow  # renders the CloudFormation template for every metric

TEMPLATE = REPO / "daemonset" / "aws" / "cloudwatch-alarms.cfn.yaml"
QUERY = re.compile(
    r"SELECT MAX\((?P<metric>\w+)\) FROM (?P<namespace>\w+) WHERE (?P<dimension>\w+) = '(?P<value>[^']*)'"
)
TOPIC = "arn:aws:sns:us-west-2:123456789012:oncall"
# What the sink publishes with the built-in policy (it publishes what the policy's rules cover), by name:
# the Neuron driver's errors, then every reason a built-in rule names (GPU Xid, driver, ECC, count).
PUBLISHED = tuple(
    dict.fromkeys(
        [
            *NEURON_ERRORS,
            *(r for rule in DEFAULT_POLICY.rules for r in rule.reasons if not any(c in r for c in "*?[")),
        ]
    )
)


# ---- reading and rendering CloudFormation ------------------------------------------------------


class CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short-form tags: ``!Ref x`` -> ``{"Ref": "x"}``, ``!Sub s`` -> ``{"Fn::Sub": s}``."""


def _short_form(loader: CfnLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _short_form)


def load() -> dict[str, Any]:
    return yaml.load(TEMPLATE.read_text(), Loader=CfnLoader)


def _alnum(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", text)


def _for_each(node: Any, name: str, value: str) -> Any:
    """Fn::ForEach's substitution of one loop value: ``${name}``, ``&{name}`` (alphanumerics only), ``Ref name``."""
    if isinstance(node, str):
        return node.replace("${" + name + "}", value).replace("&{" + name + "}", _alnum(value))
    if isinstance(node, list):
        return [_for_each(item, name, value) for item in node]
    if isinstance(node, dict):
        if node == {"Ref": name}:
            return value
        return {_for_each(k, name, value): _for_each(v, name, value) for k, v in node.items()}
    return node


NO_VALUE = object()


class Renderer:
    def __init__(self, template: dict[str, Any], parameters: dict[str, str]) -> None:
        self.params: dict[str, Any] = {}
        self.params.update({k: v for k, v in parameters.items() if k.startswith("AWS::")})  # pseudo parameters
        for name, spec in template["Parameters"].items():
            raw = parameters.get(name, spec.get("Default"))
            assert raw is not None, f"parameter {name} has no default: pass it"
            self.params[name] = raw.split(",") if spec["Type"] == "CommaDelimitedList" else raw
        self.conditions = {name: self.value(expr) for name, expr in template.get("Conditions", {}).items()}

    def resources(self, template: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, body in template["Resources"].items():
            if key.startswith("Fn::ForEach::"):
                name, collection, output = body
                for item in self.value(collection):
                    out.update(self.value(_for_each(output, name, item)))
            else:
                out[key] = self.value(body)
        return out

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.value(item) for item in node) if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((fn, arg),) = node.items()
            if fn == "Ref":
                return NO_VALUE if arg == "AWS::NoValue" else self.params[arg]
            if fn == "Fn::Sub":
                return re.sub(r"\$\{([\w:]+)\}", lambda m: str(self.params[m.group(1)]), arg)
            if fn == "Fn::If":
                name, then, otherwise = arg
                return self.value(then if self.conditions[name] else otherwise)
            if fn == "Fn::Not":
                return not self.value(arg[0])
            if fn == "Fn::Equals":
                return self.value(arg[0]) == self.value(arg[1])
            assert not fn.startswith("Fn::"), f"the test's renderer does not know {fn}: teach it"
        return {k: v for k, v in ((k, self.value(v)) for k, v in node.items()) if v is not NO_VALUE}


PSEUDO = {"AWS::Region": "us-west-2", "AWS::Partition": "aws", "AWS::AccountId": "123456789012"}


def resources(**parameters: str) -> dict[str, dict[str, Any]]:
    template = load()
    return Renderer(template, {**PSEUDO, **parameters}).resources(template)


def alarms(**parameters: str) -> dict[str, dict[str, Any]]:
    rendered = {k: r for k, r in resources(**parameters).items() if r["Type"] != "AWS::CloudWatch::Dashboard"}
    assert all(r["Type"] == "AWS::CloudWatch::Alarm" for r in rendered.values())
    return {logical_id: r["Properties"] for logical_id, r in rendered.items()}


def dashboard(**parameters: str) -> dict[str, Any]:
    (props,) = [r["Properties"] for r in resources(**parameters).values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    return props


# ---- agreement with the sink -------------------------------------------------------------------


def test_defaults_are_the_sinks_namespace_and_the_neuron_errors():
    parameters = load()["Parameters"]
    assert parameters["Namespace"]["Default"] == DEFAULT_NAMESPACE
    assert tuple(parameters["MetricNames"]["Default"].split(",")) == PUBLISHED


def test_every_published_family_has_alarms():
    """Each condition type the built-in policy publishes (Neuron and GPU alike) has at least one alarm."""
    names = set(load()["Parameters"]["MetricNames"]["Default"].split(","))
    families = {rule.condition: rule.reasons for rule in DEFAULT_POLICY.rules if rule.reasons}
    assert {"NeuronHealth", "GpuXid", "GpuDriverError", "GpuEcc", "GpuCount"} <= set(families)
    for condition, reasons in families.items():
        named = [r for r in reasons if not any(c in r for c in "*?[")] or [e for e in NEURON_ERRORS]
        assert set(named) <= names, condition
    assert {"GpuXid79", "GpuFallenOffBus", "GpuRowRemapFailure", "GpuLost"} <= names


DEPLOY = re.compile(
    r"aws cloudformation deploy --template-file daemonset/aws/cloudwatch-alarms\.cfn\.yaml(?:[^\n]*\\\n)*[^\n]*"
)


def test_every_documented_deploy_command_has_the_capability_the_template_needs():
    """The transform needs CAPABILITY_AUTO_EXPAND; there are no IAM resources (so no CAPABILITY_IAM)."""
    template = load()
    assert template["Transform"] == "AWS::LanguageExtensions"
    assert not [r for r in template["Resources"].values() if "Type" in r and r["Type"].startswith("AWS::IAM::")]
    commands = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), TEMPLATE]:
        text = doc.read_text().replace("\n#  ", "\n   ").replace("\n#", "\n")
        commands += [(doc.name, m.group(0)) for m in DEPLOY.finditer(text)]
    assert commands
    missing = [(name, c) for name, c in commands if "--capabilities CAPABILITY_AUTO_EXPAND" not in c]
    assert not missing, missing


def test_one_alarm_per_metric_whose_query_matches_what_the_sink_publishes():
    rendered = alarms(ClusterName="trn-prod")
    assert sorted(rendered) == sorted(f"Alarm{_alnum(name)}" for name in PUBLISHED)
    for props in rendered.values():
        (query,) = props["Metrics"]
        assert query["ReturnData"] is True and query["Period"] == 60
        match = QUERY.fullmatch(query["Expression"])
        assert match, query["Expression"]
        assert match["metric"] in PUBLISHED and props["AlarmName"].endswith(match["metric"])
        assert match["namespace"] == DEFAULT_NAMESPACE
        # Filtered on the one dimension every datum has; InstanceId (per node, and only where known) is aggregated.
        assert (match["dimension"], match["value"]) == (CLUSTER_DIMENSION, "trn-prod")
        assert match["dimension"] in DIMENSIONS


def test_fires_on_a_published_one_and_returns_to_ok_on_zero_or_silence():
    for props in alarms(ClusterName="trn-prod").values():
        assert (props["ComparisonOperator"], props["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
        assert (props["EvaluationPeriods"], props["DatapointsToAlarm"]) == (1, 1)
        assert props["TreatMissingData"] == "notBreaching"


@pytest.mark.parametrize(("topic", "actions"), [("", None), (TOPIC, [TOPIC])])
def test_the_topic_is_optional(topic, actions):
    for props in alarms(ClusterName="trn-prod", AlarmTopicArn=topic).values():
        assert props.get("AlarmActions") == actions and props.get("OKActions") == actions


def test_other_metric_names_get_alarms_too():
    rendered = alarms(ClusterName="gpu", MetricNames="XidCriticalError,GPUFallenOffBus")
    assert sorted(rendered) == ["AlarmGPUFallenOffBus", "AlarmXidCriticalError"]


def test_cfn_lint_finds_nothing():
    from cfnlint.api import lint

    assert [str(m) for m in lint(TEMPLATE.read_text(), regions=["us-east-1", "us-west-2"])] == []


def test_the_rendered_alarms_are_accepted_by_put_metric_alarm(aws):
    cloudwatch = aws.client("cloudwatch")
    rendered = alarms(ClusterName="trn-prod", AlarmTopicArn=TOPIC)
    for props in rendered.values():
        cloudwatch.put_metric_alarm(**props)  # botocore validates the shapes; moto stores them
    stored = {a["AlarmName"]: a for a in cloudwatch.describe_alarms()["MetricAlarms"]}
    assert sorted(stored) == sorted(f"node-health-agent-trn-prod-{name}" for name in PUBLISHED)
    for alarm in stored.values():
        assert QUERY.fullmatch(alarm["Metrics"][0]["Expression"])["metric"] in PUBLISHED
        assert alarm["AlarmActions"] == [TOPIC] and alarm["TreatMissingData"] == "notBreaching"


# ---- the dashboard -----------------------------------------------------------------------------


SEARCH = re.compile(r"SEARCH\('\{(?P<schema>[^}]*)\} (?P<dimension>\w+)=\"(?P<value>[^\"]*)\"', 'Maximum', \d+\)")


def test_the_dashboard_searches_exactly_what_the_sink_publishes():
    props = dashboard(ClusterName="trn-prod")
    assert props["DashboardName"] == "node-health-agent-trn-prod"
    body = json.loads(props["DashboardBody"])
    expressions = [
        item["expression"]
        for widget in body["widgets"]
        for line in widget["properties"].get("metrics", [])
        for item in line
        if "expression" in item
    ]
    searches = [SEARCH.fullmatch(e) for e in expressions if "SEARCH" in e]
    assert len(searches) >= 3 and all(searches), expressions
    schemas = {tuple(m["schema"].split(",")) for m in searches}
    # The namespace with every dimension set the sink publishes: ClusterName always, InstanceId where known.
    assert schemas == {(DEFAULT_NAMESPACE, *DIMENSIONS), (DEFAULT_NAMESPACE, CLUSTER_DIMENSION)}
    assert {(m["dimension"], m["value"]) for m in searches} == {(CLUSTER_DIMENSION, "trn-prod")}
    assert all(w["properties"].get("region", "us-west-2") == "us-west-2" for w in body["widgets"])


def test_the_dashboard_is_accepted_by_put_dashboard(aws):
    cloudwatch = aws.client("cloudwatch")
    props = dashboard(ClusterName="trn-prod")
    cloudwatch.put_dashboard(**props)
    stored = cloudwatch.get_dashboard(DashboardName="node-health-agent-trn-prod")
    assert json.loads(stored["DashboardBody"]) == json.loads(props["DashboardBody"])
