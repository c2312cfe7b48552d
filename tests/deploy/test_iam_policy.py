"""iam/node-health-agent-policy.json allows exactly the AWS calls the agent makes, scoped as tightly as IAM allows.

Three sources must agree: the code of agent/adapters/aws.py (every boto3 call goes through ``AwsClients.call``
with literal service and operation names), its table ``agent.adapters.aws.CALLS``, and the policy. Then the
real calls run against moto as an IAM user holding only the policy, and calls outside it are denied.
"""

from __future__ import annotations

import ast
import json
import os
import re
from fnmatch import fnmatchcase

import boto3
import botocore.session
import pytest
from botocore import xform_name
from botocore.exceptions import ClientError

from agent.adapters.aws import (
    ACTIONS,
    CALLS,
    AutoScaling,
    AwsClients,
    AwsError,
    CloudWatchPublisher,
    Ec2Reboot,
    MetricDatum,
    S3Uploader,
)
from agent.sinks.cloudwatch import DEFAULT_NAMESPACE

from helpers import REPO
from helpers.aws import ACCOUNT, REGION

pytestmark = pytest.mark.slow  # drives moto's server through every call

ROOT = REPO
AWS_PY = ROOT / "agent" / "adapters" / "aws.py"
POLICY_FILE = ROOT / "iam" / "node-health-agent-policy.json"
README = ROOT / "iam" / "README.md"
PLACEHOLDERS = (
    "${AWS_REGION}",
    "${AWS_ACCOUNT_ID}",
    "${ASG_NAME}",
    "${CLUSTER_NAME}",
    "${DIAGNOSTICS_BUCKET}",
    "${DIAGNOSTICS_PREFIX}",
)
CLUSTER = "walkthrough"
BUCKET, PREFIX = "diagnostics-bucket", "node-health/bundles"
# IAM's service prefix for each boto3 service name we call (CloudWatch's API endpoint is "monitoring").
IAM_PREFIX = {"autoscaling": "autoscaling", "cloudwatch": "cloudwatch", "ec2": "ec2", "s3": "s3"}
# Services the agent could plausibly be tempted to call directly (their operations must never appear as methods).
NEIGHBOURS = ("autoscaling", "cloudwatch", "ec2", "sts", "iam", "logs", "eks", "s3")


def policy() -> dict:
    return json.loads(POLICY_FILE.read_text())


def statements() -> list[dict]:
    return policy()["Statement"]


def as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def calls_in_code() -> set[tuple[str, str]]:
    """(service, operation) of every ``<x>.call("service", "Operation", ...)`` in agent/adapters/aws.py."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(AWS_PY.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "call":
            args = node.args[:2]
            assert len(args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args), (
                f"agent/adapters/aws.py:{node.lineno}: AWS calls name their service and operation literally"
            )
            found.add((args[0].value, args[1].value))
    return found


# ---- the code, the table, the policy -------------------------------------------------------------


def test_the_table_lists_exactly_the_calls_in_the_code():
    assert calls_in_code() == set(CALLS)


def test_the_table_names_real_operations_and_their_iam_actions():
    session = botocore.session.get_session()
    for (service, operation), action in CALLS.items():
        assert operation in session.get_service_model(service).operation_names, (service, operation)
        assert action == f"{IAM_PREFIX[service]}:{operation}"
    assert frozenset(CALLS.values()) == ACTIONS


def test_no_boto3_method_is_called_around_the_table():
    """Only ``AwsClients.call`` turns an operation name into a client method (one getattr)."""
    session = botocore.session.get_session()
    methods = {xform_name(op) for s in NEIGHBOURS for op in session.get_service_model(s).operation_names}
    tree = ast.parse(AWS_PY.read_text())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert used & methods == set()
    getattrs = [
        (fn.name, n.lineno)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
    ]
    assert [name for name, _ in getattrs] == ["call"]


def test_the_policy_allows_exactly_the_actions_the_code_calls():
    allowed = set()
    for st in statements():
        assert st["Effect"] == "Allow" and "NotAction" not in st and "NotResource" not in st, st
        actions = as_list(st["Action"])
        assert all("*" not in a for a in actions), f"no wildcard actions: {actions}"
        allowed |= set(actions)
    assert allowed == ACTIONS


def statement_for(action: str) -> dict:
    (st,) = [s for s in statements() if action in as_list(s["Action"])]
    return st


def test_set_instance_health_is_scoped_to_the_node_group():
    st = statement_for("autoscaling:SetInstanceHealth")
    (resource,) = as_list(st["Resource"])
    assert re.fullmatch(
        r"arn:aws:autoscaling:\$\{AWS_REGION\}:\$\{AWS_ACCOUNT_ID\}:autoScalingGroup:\*:autoScalingGroupName/\$\{ASG_NAME\}",
        resource,
    )


def test_reboot_is_scoped_to_instances_tagged_as_the_clusters_own():
    st = statement_for("ec2:RebootInstances")
    assert as_list(st["Action"]) == ["ec2:RebootInstances"]
    assert as_list(st["Resource"]) == ["arn:aws:ec2:${AWS_REGION}:${AWS_ACCOUNT_ID}:instance/*"]
    assert st["Condition"] == {"StringEquals": {"ec2:ResourceTag/kubernetes.io/cluster/${CLUSTER_NAME}": "owned"}}


def test_describe_is_the_only_unscoped_action():
    """DescribeAutoScalingInstances supports no resource-level permissions: IAM needs Resource "*"."""
    assert as_list(statement_for("autoscaling:DescribeAutoScalingInstances")["Resource"]) == ["*"]
    assert "Condition" not in statement_for("autoscaling:DescribeAutoScalingInstances")


def test_metrics_only_in_our_namespace():
    st = statement_for("cloudwatch:PutMetricData")
    assert as_list(st["Resource"]) == ["*"]  # PutMetricData has no resource type: the namespace condition scopes it
    assert st["Condition"] == {"StringEquals": {"cloudwatch:namespace": DEFAULT_NAMESPACE}}


def test_bundles_only_under_the_configured_prefix():
    st = statement_for("s3:PutObject")
    assert as_list(st["Resource"]) == ["arn:aws:s3:::${DIAGNOSTICS_BUCKET}/${DIAGNOSTICS_PREFIX}/*"]
    assert "Condition" not in st


def test_the_readme_substitutes_every_placeholder_and_names_the_service_account():
    text = README.read_text()
    raw = POLICY_FILE.read_text()
    assert set(re.findall(r"\$\{[A-Z_]+\}", raw)) == set(PLACEHOLDERS)
    for placeholder in PLACEHOLDERS:
        assert placeholder.strip("${}") in text
    # The namespace is a variable (tests/deploy/test_install_fleet.py checks it follows the install), by default ours.
    assert "system:serviceaccount:${NAMESPACE}:node-health-agent" in text
    assert "export NAMESPACE=node-health-agent" in text
    assert "pods.eks.amazonaws.com" in text
    assert "aws eks create-pod-identity-association" in text


# ---- enforced by moto ----------------------------------------------------------------------------


def rendered(group_name: str, *, for_moto: bool) -> str:
    """The policy with its placeholders filled in, as README's envsubst command does.

    ``for_moto``: moto evaluates a policy's Action and Effect but authorizes Auto Scaling calls against
    Resource "*" only and names CloudWatch's actions ``monitoring:*``; so its copy widens the resource
    and adds that alias; it does not evaluate EC2's resource-tag condition (dropped). Resource and
    Condition are checked above, statically.
    """
    text = POLICY_FILE.read_text()
    for placeholder, value in zip(PLACEHOLDERS, (REGION, ACCOUNT, group_name, CLUSTER, BUCKET, PREFIX), strict=True):
        text = text.replace(placeholder, value)
    if not for_moto:
        return text
    doc = json.loads(text)
    for st in doc["Statement"]:
        if st["Action"] == "s3:PutObject":
            continue  # moto checks S3 object ARNs: the prefix is enforced as written
        st["Resource"] = "*"
        if any(a.startswith("ec2:") for a in as_list(st["Action"])):
            st.pop("Condition", None)
        actions = as_list(st["Action"])
        st["Action"] = actions + [
            a.replace("cloudwatch:", "monitoring:") for a in actions if a.startswith("cloudwatch:")
        ]
    return json.dumps(doc)


def iam_user(aws, name: str, document: str | None) -> dict[str, str]:
    """A moto IAM user holding only ``document`` (None = no policy); its access key as environment variables."""
    iam = aws.client("iam")
    iam.create_user(UserName=name)
    if document is not None:
        iam.put_user_policy(UserName=name, PolicyName="node-health-agent", PolicyDocument=document)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def test_the_agent_works_with_only_the_policy_and_nothing_else_is_allowed(aws, monkeypatch):
    group = aws.node_group("eks-trn1-ng")
    other = aws.node_group("eks-cpu-ng")
    instance = group.instance_ids[0]
    sid = statement_for("autoscaling:SetInstanceHealth")["Sid"]
    (resource,) = [
        s["Resource"] for s in json.loads(rendered(group.name, for_moto=False))["Statement"] if s["Sid"] == sid
    ]
    assert fnmatchcase(group.arn, resource) and not fnmatchcase(other.arn, resource)  # IAM's * = any characters
    credentials = iam_user(aws, "node-health-agent", rendered(group.name, for_moto=True))
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    restricted = boto3.session.Session(region_name=REGION, **{k.lower(): v for k, v in credentials.items()})
    autoscaling, ec2, cloudwatch, s3 = (
        restricted.client(s, endpoint_url=aws.endpoint) for s in ("autoscaling", "ec2", "cloudwatch", "s3")
    )
    aws.client("s3").create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})

    with aws.moto.iam_enforced():
        asg = AutoScaling(clients=AwsClients())
        assert asg.find_group(instance).group == group.name
        asg.set_unhealthy(instance, respect_grace_period=True)
        publisher = CloudWatchPublisher(clients=AwsClients(), sleep=lambda _: None)
        assert publisher.put_metrics(DEFAULT_NAMESPACE, [MetricDatum(name="NeuronHasError_DMA_ERROR", value=1.0)]) == 1
        S3Uploader(clients=AwsClients(), bucket=BUCKET).put(f"{PREFIX}/ip-10-0-0-1/bundle.json.gz", b"\x1f\x8b")
        Ec2Reboot(clients=AwsClients()).reboot(instance)

        outside = {
            "autoscaling:DescribeAutoScalingGroups": autoscaling.describe_auto_scaling_groups,
            "autoscaling:TerminateInstanceInAutoScalingGroup": lambda: (
                autoscaling.terminate_instance_in_auto_scaling_group(
                    InstanceId=instance, ShouldDecrementDesiredCapacity=False
                )
            ),
            "ec2:DescribeInstances": ec2.describe_instances,
            "ec2:StopInstances": lambda: ec2.stop_instances(InstanceIds=[instance]),
            "ec2:TerminateInstances": lambda: ec2.terminate_instances(InstanceIds=[instance]),
            "ec2:StartInstances": lambda: ec2.start_instances(InstanceIds=[instance]),
            "cloudwatch:ListMetrics": cloudwatch.list_metrics,
            "s3:PutObject outside the prefix": lambda: s3.put_object(Bucket=BUCKET, Key="elsewhere/x", Body=b"x"),
            "s3:GetObject": lambda: s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/ip-10-0-0-1/bundle.json.gz"),
        }
        for action, call in outside.items():
            with pytest.raises(ClientError) as refused:
                call()
            assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403, action
    stored = aws.client("s3").get_object(Bucket=BUCKET, Key=f"{PREFIX}/ip-10-0-0-1/bundle.json.gz")
    assert stored["Body"].read() == b"\x1f\x8b"


def test_a_missing_permission_is_a_permanent_error_naming_the_policy(aws, monkeypatch):
    for name, value in iam_user(aws, "no-permissions", None).items():
        monkeypatch.setenv(name, value)
    with aws.moto.iam_enforced():
        publisher = CloudWatchPublisher(clients=AwsClients(), sleep=lambda _: None)
        with pytest.raises(AwsError) as failed:
            publisher.put_metrics(DEFAULT_NAMESPACE, [MetricDatum(name="NeuronHasError_DMA_ERROR", value=1.0)])
    assert failed.value.transient is False and failed.value.status == 403
    assert "may not call cloudwatch:PutMetricData" in str(failed.value)
    assert "iam/node-health-agent-policy.json" in str(failed.value)


def test_enforcement_is_off_again_after_the_block(aws):
    assert "AWS_ACCESS_KEY_ID" in os.environ
    aws.client("autoscaling").describe_auto_scaling_groups()  # the fixture's fake credentials work again
