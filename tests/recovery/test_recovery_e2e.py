"""Recovery end to end: a real agent process, the real kubernetes client against tests/kubeapi, the real
boto3 against moto's server (``ThreadedMotoServer``).

The AWS walkthrough this replaces: ``NEURON_HW_ERR=DMA_ERROR`` in the kernel log → NeuronHealth=True →
cordoned → the instance Unhealthy in its Auto Scaling group → ``NeuronHasError_DMA_ERROR`` in CloudWatch
namespace NeuronHealthCheck. Then: report-only does none of the side effects (CloudWatch still
published), a restart repeats nothing, a node already cordoned by someone else stays theirs, a node in
no Auto Scaling group (Karpenter) is reported, not an error.
"""

from __future__ import annotations

import json

import pytest

from agent.recovery.model import INCIDENT_ANNOTATION, TAINT_KEY

from helpers import free_port, http_get, wait_for
from helpers.agents import (
    NAMESPACE,
    NODE,
    OTHERS,
    Agent,
    cloudwatch_metrics,
    condition,
    events,
    health,
    node,
)
from helpers.aws import REGION, FaultyFront

pytestmark = pytest.mark.slow  # starts agent processes


def test_the_aws_walkthrough_then_a_restart_repeats_nothing(api, aws, tmp_path):
    group = aws.node_group(size=1)
    (instance_id,) = group.instance_ids
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}"))
    with FaultyFront(upstream=aws.endpoint, faults=[]) as front:
        agent = Agent(tmp_path, api, enable="true", endpoint=front.endpoint)
        try:
            wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "False", timeout=30)
            agent.fault()
            wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "True", timeout=30)
            wait_for(lambda: health(aws, instance_id) == "UNHEALTHY", timeout=30)
            found = wait_for(lambda: cloudwatch_metrics(aws), timeout=30)
        finally:
            agent.stop()
        assert {m["MetricName"] for m in found} == {"NeuronHasError_DMA_ERROR"}
        assert {d["Name"]: d["Value"] for d in found[0]["Dimensions"]} == {
            "ClusterName": "walkthrough",
            "InstanceId": instance_id,
        }
        spec = api.get_object("nodes", NODE)["spec"]
        assert spec["unschedulable"] is True
        assert [t["key"] for t in spec["taints"]] == [TAINT_KEY]
        incident = json.loads(api.get_object("nodes", NODE)["metadata"]["annotations"][INCIDENT_ANNOTATION])
        assert incident["done"] == ["cordon", "mark-unhealthy"] and incident["cordonedByUs"] is True
        assert (incident["condition"], incident["reason"]) == ("NeuronHealth", "NeuronHasError_DMA_ERROR")
        assert events(api, "RecoveryCordoned") and events(api, "RecoveryMarkedUnhealthy")
        lease = api.get_object("leases", "node-health-agent-recovery-budget-walkthrough", NAMESPACE)
        assert NODE in lease["metadata"]["annotations"]["node-health-agent.io/budget"]
        for other in OTHERS:
            assert not api.get_object("nodes", other)["spec"].get("unschedulable"), "only the failing node"

        # A restart: the incident is on the Node, so nothing is repeated (AWS sees no SetInstanceHealth,
        # the Node no second cordon).
        api.reset_requests()
        calls_before = list(front.actions)
        agent = Agent(tmp_path, api, enable="true", endpoint=front.endpoint)
        try:
            wait_for(lambda: api.requests.count(method="GET", path_regex=rf"/nodes/{NODE}$") >= 3, timeout=30)
        finally:
            agent.stop()
        repeated = [a for a in front.actions[len(calls_before) :] if a == "SetInstanceHealth"]
        assert repeated == [], "a restart must never repeat SetInstanceHealth"
        assert calls_before.count("SetInstanceHealth") == 1
        assert api.requests.count(method="PATCH", path_regex=rf"/nodes/{NODE}$") == 0


def test_report_only_does_nothing_but_cloudwatch_still_publishes(api, aws, tmp_path):
    group = aws.node_group(size=1)
    (instance_id,) = group.instance_ids
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}"))
    port = free_port()
    agent = Agent(tmp_path, api, enable="false", listen=f"127.0.0.1:{port}")
    try:
        wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "False", timeout=30)
        agent.fault()
        wait_for(lambda: cloudwatch_metrics(aws), timeout=30)
        dry = wait_for(lambda: events(api, "RecoveryDryRun"), timeout=30)
        status, metrics = http_get(f"http://127.0.0.1:{port}/metrics")
    finally:
        agent.stop()
    assert status == 200
    assert 'node_health_agent_recovery_would_actions_total{action="cordon"} 1.0' in metrics
    assert "node_health_agent_recovery_enabled 0.0" in metrics
    assert "node_health_agent_cloudwatch_requests_total" in metrics
    assert health(aws, instance_id) == "HEALTHY"
    n = api.get_object("nodes", NODE)
    assert not n["spec"].get("unschedulable") and not n["spec"].get("taints")
    assert INCIDENT_ANNOTATION not in (n["metadata"].get("annotations") or {})
    assert api.list_objects("leases", NAMESPACE) == []
    assert any("would cordon" in e["message"] for e in dry)
    assert api.requests.count(method="PATCH", path_regex=rf"/nodes/{NODE}$") == 0


def test_a_node_in_no_auto_scaling_group_is_reported_not_an_error(api, aws, tmp_path):
    instance_id = aws.lone_instance()
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}"))
    agent = Agent(tmp_path, api, enable="true")
    try:
        wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "False", timeout=30)
        agent.fault()
        (event,) = wait_for(lambda: events(api, "RecoveryNoAutoScalingGroup"), timeout=30)
        wait_for(lambda: (c := condition(api, "AcceleratedHardwareReady")) and c["status"] == "False", timeout=30)
    finally:
        err = agent.stop()
    assert instance_id in event["message"] and "AcceleratedHardwareReady" in event["message"]
    assert "NeuronHasError_DMA_ERROR" in event["message"]
    assert api.get_object("nodes", NODE)["spec"]["unschedulable"] is True
    assert "Traceback" not in err


def test_a_node_cordoned_by_someone_else_stays_theirs(api, aws, tmp_path):
    group = aws.node_group(size=1)
    (instance_id,) = group.instance_ids
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}", unschedulable=True))
    agent = Agent(tmp_path, api, enable="true")
    try:
        wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "False", timeout=30)
        agent.fault()
        wait_for(lambda: health(aws, instance_id) == "UNHEALTHY", timeout=30)
    finally:
        agent.stop()
    incident = json.loads(api.get_object("nodes", NODE)["metadata"]["annotations"][INCIDENT_ANNOTATION])
    assert incident["reason"] == "NeuronHasError_DMA_ERROR"
    assert incident["cordonedByUs"] is False
    assert "cordon" not in incident["done"]


@pytest.mark.parametrize("value", ["yes", "1", "on", "ture"])
def test_bad_enable_recovery_values_exit_2_before_the_cluster(api, tmp_path, value):
    agent = Agent(tmp_path, api, enable=value)
    _, err = agent.proc.communicate(timeout=30)
    assert agent.proc.returncode == 2
    assert "ENABLE_RECOVERY" in err and repr(value) in err
    assert api.requests.count() == 0, "nothing touched the cluster"
