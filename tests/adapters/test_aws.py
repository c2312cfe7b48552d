"""agent.adapters.aws: instance identity (providerID, IMDSv2), region, Auto Scaling and CloudWatch calls.

The AWS APIs are moto's server reached through real boto3 with only the standard AWS environment
(``awsfixtures.aws``); the instance metadata service is a strict IMDSv2 fake; throttling, server
errors and dead endpoints come from small HTTP servers at the endpoint (``awsfixtures``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from agent.adapters.aws import (
    MAX_DATUMS,
    MAX_PAYLOAD,
    AutoScaling,
    AwsClients,
    AwsError,
    CloudWatchPublisher,
    InstanceIdentity,
    InstanceIdLookup,
    InstanceMetadata,
    MetricDatum,
    batches,
    imds_endpoint,
    instance_id_from_provider_id,
    resolve_region,
)

from helpers import REPO
from helpers.aws import (  # noqa: F401 (the fixtures aws and moto_server)
    ACCESS_DENIED,
    INVALID,
    SERVER_ERROR,
    THROTTLING,
    UNAVAILABLE,
    Fault,
    FaultyFront,
    StrictImds,
    aws_fixture,
    blackhole,
    closed_endpoint,
    moto_server_fixture,
)

pytestmark = pytest.mark.slow  # many scenarios against moto's server

ROOT = REPO
IDENTITY = {
    "instance-id": "i-0123456789abcdef0",
    "placement/region": "eu-west-1",
    "placement/availability-zone": "eu-west-1b",
}


class Sleeps:
    """An injected ``sleep`` that records instead of sleeping."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def publisher(clients: AwsClients | None = None, **kwargs) -> tuple[CloudWatchPublisher, Sleeps]:
    sleeps = Sleeps()
    return CloudWatchPublisher(clients=clients or AwsClients(), sleep=sleeps, rng=lambda: 1.0, **kwargs), sleeps


def datum(name: str = "NeuronHasError_DMA_ERROR", value: float = 1.0, **kwargs) -> MetricDatum:
    dims = (("ClusterName", "trn-prod"), ("InstanceId", "i-0123456789abcdef0"))
    return MetricDatum(name=name, value=value, dimensions=kwargs.pop("dimensions", dims), **kwargs)


# ---- import cost -----------------------------------------------------------------------------


def test_importing_the_aws_modules_does_not_load_boto3():
    code = (
        "import sys, agent.adapters.aws, agent.sinks.cloudwatch; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 's3transfer')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- instance identity -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider_id", "expected"),
    [
        ("aws:///us-west-2a/i-0123456789abcdef0", "i-0123456789abcdef0"),
        ("aws:///eu-central-1c/i-0abc1234", "i-0abc1234"),  # the old 8-digit form
        ("aws:////i-0123456789abcdef0", "i-0123456789abcdef0"),  # no zone
        ("  aws:///us-west-2a/i-0123456789abcdef0\n", "i-0123456789abcdef0"),
        ("aws:///us-west-2a/fargate-ip-10-0-1-2.ec2.internal", None),  # Fargate
        ("aws:///us-west-2a/i-0123456789ABCDEF0", None),  # ids are lower-case hex
        ("aws:///us-west-2a/i-0123456789abcdef", None),  # 16 digits: neither form
        ("aws:///us-west-2a/i-0123456789abcdef0/extra", None),
        ("azure:///subscriptions/x/resourceGroups/y/providers/Microsoft.Compute/virtualMachines/z", None),
        ("gce://project/us-central1-a/instance-1", None),
        ("kind://docker/kind/kind-control-plane", None),
        ("i-0123456789abcdef0", None),
        ("", None),
        ("aws://", None),
        ("\x00garbage\xff", None),
    ],
)
def test_instance_id_from_provider_id(provider_id, expected):
    assert instance_id_from_provider_id(provider_id) == expected


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "http://169.254.169.254"),
        ({"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:1338/"}, "http://127.0.0.1:1338"),
        ({"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"}, "http://[fd00:ec2::254]"),
        (
            {"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6", "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://x:1"},
            "http://x:1",
        ),
    ],
)
def test_imds_endpoint_comes_from_the_standard_environment(environ, expected):
    assert imds_endpoint(environ) == expected


@pytest.fixture
def imds():
    with StrictImds(metadata=IDENTITY) as server:
        yield server


def test_the_fake_imds_refuses_requests_without_a_token(imds):
    """The fake is IMDSv2-only, as instances should be: a plain GET (IMDSv1) is refused."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{imds.endpoint}/latest/meta-data/instance-id", timeout=5)
    assert refused.value.code == 401


def test_identity_over_imdsv2_with_one_token(imds):
    metadata = InstanceMetadata(environ={"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint})
    assert metadata.identity() == InstanceIdentity(
        instance_id="i-0123456789abcdef0", region="eu-west-1", availability_zone="eu-west-1b"
    )
    assert (imds.puts, imds.gets) == (1, 3)  # the token is reused


def test_a_token_is_fetched_again_when_it_expires(imds):
    now = [0.0]
    metadata = InstanceMetadata(endpoint=imds.endpoint, token_ttl=600, monotonic=lambda: now[0])
    metadata.instance_id()
    now[0] = 600.0  # past the TTL (less a minute): a new token before the next request
    metadata.instance_id()
    assert imds.puts == 2


def test_a_refused_token_is_replaced_once(imds):
    metadata = InstanceMetadata(endpoint=imds.endpoint)
    metadata.region()
    imds.revoke()  # e.g. the instance's metadata options changed
    assert metadata.region() == "eu-west-1"
    assert imds.puts == 2


@pytest.mark.parametrize(
    ("token_status", "code", "transient", "says"),
    [
        (403, "Imds403", False, "modify-instance-metadata-options"),
        (503, "Imds503", True, "HTTP 503"),
    ],
)
def test_token_request_failures(token_status, code, transient, says):
    with StrictImds(metadata=IDENTITY, token_status=token_status) as server, pytest.raises(AwsError) as failed:
        InstanceMetadata(endpoint=server.endpoint).instance_id()
    assert (failed.value.code, failed.value.transient) == (code, transient)
    assert says in str(failed.value) and server.endpoint in str(failed.value)


def test_a_missing_path_is_a_clear_permanent_error(imds):
    with pytest.raises(AwsError, match="does not exist") as failed:
        InstanceMetadata(endpoint=imds.endpoint).get("meta-data/spot/instance-action")
    assert (failed.value.status, failed.value.transient) == (404, False)


def test_no_imds_answers_quickly_with_a_transient_error_and_what_to_do():
    """A refused connection is answered at once, not after the timeout: with a timeout far longer than a
    loaded machine's delays, the error is ImdsUnavailable, never ImdsTimeout (no wall-clock figure)."""
    endpoint = closed_endpoint()
    with pytest.raises(AwsError) as failed:
        InstanceMetadata(endpoint=endpoint, timeout=60.0).instance_id()
    assert (failed.value.code, failed.value.transient) == ("ImdsUnavailable", True)
    assert endpoint in str(failed.value) and "AWS_REGION" in str(failed.value)


def test_an_imds_that_never_answers_times_out_with_the_hop_limit_hint():
    """From a pod without hostNetwork, hop limit 1 makes the token PUT vanish: the classic IMDSv2 trap."""
    with blackhole() as endpoint, pytest.raises(AwsError) as failed:  # gives up on the small timeout injected
        InstanceMetadata(endpoint=endpoint, timeout=0.5).instance_id()
    assert (failed.value.code, failed.value.transient) == ("ImdsTimeout", True)
    assert "within 0.5s" in str(failed.value) and "hop-limit 2" in str(failed.value)


def test_imds_disabled_by_the_standard_variable():
    metadata = InstanceMetadata(environ={"AWS_EC2_METADATA_DISABLED": "true"})
    with pytest.raises(AwsError, match="AWS_EC2_METADATA_DISABLED") as failed:
        metadata.region()
    assert failed.value.code == "ImdsDisabled"


def test_moto_serves_imds_paths_our_client_can_use(aws):
    """moto's server answers the IMDSv2 token and metadata paths (fixed values; it does not require the token)."""
    metadata = InstanceMetadata(endpoint=aws.endpoint, environ={})
    assert metadata.instance_id() == "i-fake"
    assert metadata.region() == "us-east-1"


def test_instance_id_lookup_prefers_the_provider_id_then_imds_and_keeps_the_answer(imds):
    provider = ["aws:///us-west-2a/i-0fedcba9876543210"]
    lookup = InstanceIdLookup(provider_id=lambda: provider[0], imds=InstanceMetadata(endpoint=imds.endpoint))
    assert lookup() == "i-0fedcba9876543210" and imds.gets == 0
    provider[0] = ""
    assert lookup() == "i-0fedcba9876543210"  # kept
    fresh = InstanceIdLookup(provider_id=lambda: None, imds=InstanceMetadata(endpoint=imds.endpoint))
    assert fresh() == "i-0123456789abcdef0"


class CountingMetadata(InstanceMetadata):
    """The real client against a refused endpoint, counting the lookups asked of it."""

    asked = 0

    def instance_id(self) -> str:
        self.asked += 1
        return super().instance_id()


def test_instance_id_lookup_retries_imds_at_most_every_retry_seconds():
    now = [0.0]
    imds = CountingMetadata(endpoint=closed_endpoint(), timeout=0.5)
    lookup = InstanceIdLookup(provider_id=lambda: None, imds=imds, retry=300.0, monotonic=lambda: now[0])
    assert lookup() is None
    assert imds.asked == 1
    now[0] = 299.0
    assert lookup() is None
    assert imds.asked == 1  # no second request yet
    now[0] = 300.0
    assert lookup() is None
    assert imds.asked == 2


# ---- region ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"AWS_REGION": "us-east-2", "AWS_DEFAULT_REGION": "us-west-1"}, "us-east-2"),
        ({"AWS_DEFAULT_REGION": "us-west-1"}, "us-west-1"),
        ({"AWS_REGION": " "}, "eu-west-1"),  # blank = unset: ask IMDS
        ({}, "eu-west-1"),
    ],
)
def test_region_from_the_environment_else_imds(environ, expected):
    assert resolve_region(environ=environ, imds=lambda: "eu-west-1") == expected


def test_no_region_anywhere_says_what_to_set():
    def imds() -> str:
        raise AwsError("the instance metadata service cannot be reached", code="ImdsUnavailable", transient=True)

    with pytest.raises(AwsError, match="set AWS_REGION") as failed:
        resolve_region(environ={}, imds=imds)
    assert (failed.value.code, failed.value.transient) == ("NoRegion", True)


def test_clients_take_the_region_from_imds_when_the_environment_has_none(aws, imds, monkeypatch):
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
    clients = AwsClients()
    assert clients.region == "eu-west-1"
    assert clients.client("cloudwatch").meta.region_name == "eu-west-1"


def test_clients_have_timeouts_and_no_botocore_retries(aws):
    config = AwsClients(connect_timeout=3.0, read_timeout=7.0).client("autoscaling").meta.config
    assert (config.connect_timeout, config.read_timeout) == (3.0, 7.0)
    assert config.retries["total_max_attempts"] == 1


def test_a_call_outside_the_table_is_refused_before_any_request(aws):
    with pytest.raises(ValueError, match="not in agent.adapters.aws.CALLS"):
        AwsClients().call("ec2", "TerminateInstances", InstanceIds=["i-0123456789abcdef0"])


# ---- Auto Scaling --------------------------------------------------------------------------------


def test_find_group_and_mark_unhealthy(aws):
    group = aws.node_group("eks-trn1-ng", size=2)
    target, other = group.instance_ids
    asg = AutoScaling(clients=AwsClients())

    found = asg.find_group(target)
    assert found is not None
    assert (found.group, found.health_status, found.lifecycle_state) == ("eks-trn1-ng", "HEALTHY", "InService")

    asg.set_unhealthy(target, respect_grace_period=False)

    health = {
        i["InstanceId"]: i["HealthStatus"]
        for i in aws.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[target, other])[
            "AutoScalingInstances"
        ]
    }
    assert health == {target: "Unhealthy", other: "Healthy"}
    assert asg.find_group(target).health_status == "UNHEALTHY"


@pytest.mark.parametrize("respect", [True, False])
def test_set_unhealthy_passes_the_grace_period_choice(aws, respect):
    group = aws.node_group()
    AutoScaling(clients=AwsClients()).set_unhealthy(group.instance_ids[0], respect_grace_period=respect)
    (instance,) = aws.client("autoscaling").describe_auto_scaling_instances(InstanceIds=list(group.instance_ids))[
        "AutoScalingInstances"
    ]
    assert instance["HealthStatus"] == "Unhealthy"


def test_an_instance_in_no_group_is_none_not_an_error(aws):
    aws.node_group()  # another group exists
    lone = aws.lone_instance()
    asg = AutoScaling(clients=AwsClients())
    assert asg.find_group(lone) is None
    assert asg.find_group("i-0000000000000000f") is None  # unknown to EC2 altogether


@pytest.mark.parametrize("bad", ["", "i-xyz", "node-1", "i-0123456789abcdef0; rm -rf /"])
def test_a_malformed_instance_id_is_refused_without_a_call(bad):
    asg = AutoScaling(clients=AwsClients(region="us-west-2"))  # no client is built: no AWS environment needed
    for call in (lambda: asg.find_group(bad), lambda: asg.set_unhealthy(bad, respect_grace_period=True)):
        with pytest.raises(AwsError, match="not an EC2 instance id") as failed:
            call()
        assert failed.value.transient is False


def test_auto_scaling_throttling_is_a_transient_error_not_retried_inside(aws, monkeypatch):
    group = aws.node_group()
    with FaultyFront(upstream=aws.endpoint, faults=[THROTTLING]) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)
        asg = AutoScaling(clients=AwsClients())
        with pytest.raises(AwsError) as failed:
            asg.find_group(group.instance_ids[0])
        assert front.requests == 1  # botocore's own retries are off: the recovery loop decides
        assert asg.find_group(group.instance_ids[0]).group == group.name
    assert (failed.value.code, failed.value.transient) == ("Throttling", True)
    assert "autoscaling:DescribeAutoScalingInstances failed: Throttling" in str(failed.value)


# ---- CloudWatch ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"value": math.nan}, "rejects the value nan"),
        ({"value": math.inf}, "rejects the value inf"),
        ({"name": ""}, "1 to 255 characters"),
        ({"name": "x" * 256}, "1 to 255 characters"),
        ({"dimensions": tuple((f"d{i}", "v") for i in range(31))}, "31 dimensions; CloudWatch allows 30"),
    ],
)
def test_invalid_datums_are_refused_when_made(kwargs, message):
    with pytest.raises(ValueError, match=message):
        datum(**kwargs)


def test_put_metrics_lands_in_cloudwatch_with_its_dimensions(aws):
    pub, _ = publisher()
    now = time.time()
    assert pub.put_metrics("NeuronHealthCheck", [datum(timestamp=now)]) == 1

    cloudwatch = aws.client("cloudwatch")
    (metric,) = cloudwatch.list_metrics(Namespace="NeuronHealthCheck")["Metrics"]
    assert metric["MetricName"] == "NeuronHasError_DMA_ERROR"
    assert {d["Name"]: d["Value"] for d in metric["Dimensions"]} == {
        "ClusterName": "trn-prod",
        "InstanceId": "i-0123456789abcdef0",
    }
    data = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {k: metric[k] for k in ("Namespace", "MetricName", "Dimensions")},
                    "Period": 60,
                    "Stat": "Maximum",
                },
            }
        ],
        StartTime=now - 300,
        EndTime=now + 300,
    )
    assert data["MetricDataResults"][0]["Values"] == [1.0]


def count_requests(clients: AwsClients) -> list[int]:
    """Body sizes of the PutMetricData requests the agent's client sends (a documented botocore event)."""
    sizes: list[int] = []
    clients.client("cloudwatch").meta.events.register(
        "before-send.cloudwatch.PutMetricData", lambda request, **_: sizes.append(len(request.body or b""))
    )
    return sizes


def test_2500_datums_take_three_requests(aws):
    clients = AwsClients()
    sizes = count_requests(clients)
    pub, _ = publisher(clients)
    datums = [datum(name=f"Metric{i:04d}") for i in range(2500)]

    assert pub.put_metrics("NeuronHealthCheck", datums) == 3

    assert len(sizes) == 3
    paginator = aws.client("cloudwatch").get_paginator("list_metrics")
    names = {m["MetricName"] for page in paginator.paginate(Namespace="NeuronHealthCheck") for m in page["Metrics"]}
    assert len(names) == 2500


def test_large_datums_are_split_by_payload_size(aws):
    big = tuple((f"Dimension{i:02d}", "v" * 1000) for i in range(30))  # ~35 kB per datum
    datums = [datum(name=f"Metric{i}", dimensions=big) for i in range(100)]
    parts = list(batches(datums))
    assert len(parts) > 1 and all(len(p) < MAX_DATUMS for p in parts)
    assert [d for p in parts for d in p] == datums  # all, in order
    for part in parts:
        assert sum(d.encoded_size() for d in part) <= MAX_PAYLOAD
        assert len(json.dumps([d.to_api() for d in part])) <= MAX_PAYLOAD  # the JSON wire format is smaller

    clients = AwsClients()
    sizes = count_requests(clients)
    pub, _ = publisher(clients)
    assert pub.put_metrics("NeuronHealthCheck", datums) == len(parts) == len(sizes)
    assert all(size <= MAX_PAYLOAD for size in sizes)


@pytest.mark.parametrize(
    ("count", "expected"),
    [(0, []), (1, [1]), (999, [999]), (1000, [1000]), (1001, [1000, 1]), (2500, [1000, 1000, 500])],
)
def test_batch_sizes(count, expected):
    assert [len(b) for b in batches([datum(name=f"M{i}") for i in range(count)])] == expected


@pytest.mark.parametrize(
    ("faults", "requests", "sleeps"),
    [
        ([THROTTLING], 2, [0.5]),
        ([THROTTLING, THROTTLING], 3, [0.5, 1.0]),  # full jitter: rng() * min(max, base * 2**n), rng = 1 here
        ([SERVER_ERROR], 2, [0.5]),
        ([UNAVAILABLE], 2, [0.5]),
    ],
)
def test_throttling_and_server_errors_are_retried_with_jitter(aws, monkeypatch, faults, requests, sleeps):
    with FaultyFront(upstream=aws.endpoint, faults=faults) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)
        pub, slept = publisher()
        assert pub.put_metrics("NeuronHealthCheck", [datum()]) == 1
    assert (front.requests, slept.delays) == (requests, sleeps)
    assert aws.client("cloudwatch").list_metrics(Namespace="NeuronHealthCheck")["Metrics"]


def test_retries_are_bounded(aws, monkeypatch):
    with FaultyFront(upstream=aws.endpoint, faults=[THROTTLING] * 5) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)
        pub, slept = publisher(attempts=3)
        with pytest.raises(AwsError) as failed:
            pub.put_metrics("NeuronHealthCheck", [datum()])
    assert (front.requests, len(slept.delays)) == (3, 2)
    assert (failed.value.code, failed.value.transient) == ("Throttling", True)
    assert "cloudwatch:PutMetricData failed: Throttling" in str(failed.value)


def test_a_refused_request_is_never_retried(aws, monkeypatch):
    with FaultyFront(upstream=aws.endpoint, faults=[INVALID]) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)
        pub, slept = publisher()
        with pytest.raises(AwsError) as failed:
            pub.put_metrics("NeuronHealthCheck", [datum()])
    assert (front.requests, slept.delays) == (1, [])
    assert (failed.value.code, failed.value.transient) == ("InvalidParameterValue", False)
    assert "not retried" in str(failed.value)


@pytest.mark.parametrize(
    ("fault", "transient", "says"),
    [
        (THROTTLING, True, "Throttling: Rate exceeded (retried with backoff)"),
        (SERVER_ERROR, True, "InternalServiceFault"),
        (UNAVAILABLE, True, "ServiceUnavailable"),
        (INVALID, False, "refused as invalid; it is not retried as is"),
        (ACCESS_DENIED, False, "may not call cloudwatch:PutMetricData: attach iam/node-health-agent-policy.json"),
        (Fault(status=403, code="InvalidClientTokenId"), False, "refused the agent's credentials"),
        (Fault(status=400, code="ExpiredTokenException"), True, "retried with backoff"),
    ],
)
def test_what_each_answer_means(aws, monkeypatch, fault, transient, says):
    with FaultyFront(upstream=aws.endpoint, faults=[fault]) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)
        pub, _ = publisher(attempts=1)
        with pytest.raises(AwsError) as failed:
            pub.put_metrics("NeuronHealthCheck", [datum()])
    assert (failed.value.code, failed.value.status, failed.value.transient) == (fault.code, fault.status, transient)
    assert str(failed.value).startswith(f"cloudwatch:PutMetricData failed: {fault.code}: ")
    assert says in str(failed.value)


def test_a_failure_after_some_requests_says_how_far_it_got(aws, monkeypatch):
    with FaultyFront(upstream=aws.endpoint, faults=[None, INVALID]) as front:  # the second request is refused
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)
        pub, _ = publisher()
        with pytest.raises(AwsError, match=r"\[request 2 of 2; 1 sent\]"):
            pub.put_metrics("NeuronHealthCheck", [datum(name=f"M{i}") for i in range(1500)])


def test_endpoint_down_is_a_transient_error_within_the_timeout(aws, monkeypatch):
    endpoint = closed_endpoint()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    # A refused connection fails at once, not at a timeout: with timeouts far longer than a loaded machine's
    # delays, the error is ConnectionError, never Timeout (no wall-clock figure: issue 33, 3.2 s against 2.0 s).
    pub, slept = publisher(AwsClients(connect_timeout=60.0, read_timeout=60.0), attempts=1)
    with pytest.raises(AwsError) as failed:
        pub.put_metrics("NeuronHealthCheck", [datum()])
    assert (failed.value.code, failed.value.transient) == ("ConnectionError", True)
    assert endpoint in str(failed.value) and "AWS_ENDPOINT_URL" in str(failed.value)


def test_an_endpoint_that_never_answers_times_out(aws, monkeypatch):
    with blackhole() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        pub, _ = publisher(AwsClients(connect_timeout=1.0, read_timeout=0.5), attempts=1)
        with pytest.raises(AwsError) as failed:  # gives up on the small read timeout injected
            pub.put_metrics("NeuronHealthCheck", [datum()])
    assert (failed.value.code, failed.value.transient) == ("Timeout", True)


def test_no_credentials_says_how_to_attach_a_role(aws, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    pub, _ = publisher()
    with pytest.raises(AwsError, match="iam/README.md") as failed:
        pub.put_metrics("NeuronHealthCheck", [datum()])
    assert (failed.value.code, failed.value.transient) == ("NoCredentials", False)
