"""The ladder end to end: real agent processes, the real kubernetes client against tests/kubeapi, real boto3
against moto's server (through FaultyFront, which counts the AWS calls).

Xid 79 (GPU fallen off the bus) → cordon → drain (the pod is evicted) → one RebootInstances → the host
comes back (a new boot id, a fresh kernel log, a new agent process) → healthy through the observation
window → uncordoned. The same Xid again within the window → replace (SetInstanceHealth), no second reboot.
The window is a few seconds in the test policy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.recovery.ladder import HISTORY_ANNOTATION
from agent.recovery.model import INCIDENT_ANNOTATION, TAINT_KEY

from helpers import wait_for
from helpers.aws import REGION, AwsTestEnv, FaultyFront
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # starts agent processes

NODE = "ip-10-0-0-1.us-west-2.compute.internal"
OTHERS = ("ip-10-0-0-2", "ip-10-0-0-3", "ip-10-0-0-4")
NAMESPACE = "node-health-agent"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def node(name: str, *, provider_id: str = "") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"providerID": provider_id},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}]},
    }


def workload(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}],
            "terminationGracePeriodSeconds": 30,
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    server.start()
    server.kubelet.auto_confirm(0.1)
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for other in OTHERS:
        server.put_object(node(other))
    try:
        yield server
    finally:
        server.stop()


def monotonic_usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


class Host:
    """The node's host as the agent sees it: a boot id file and this boot's kernel log."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.boot_id = tmp / "boot_id"
        self.kmsg = tmp / "kmsg"
        self.boots = 0
        self.reboot()

    def reboot(self) -> None:
        self.boots += 1
        self.boot_id.write_text(f"00000000-0000-4000-8000-{self.boots:012d}\n")
        self.kmsg.write_text(f"6,1,{monotonic_usec()},-;Linux version 6.1 (boot {self.boots})\n")

    def xid(self) -> None:
        with self.kmsg.open("a") as f:
            f.write(f"3,{int(time.time() * 1000) % 10**9},{monotonic_usec()},-;{XID79}\n")


class Agent:
    def __init__(self, host: Host, api: KubeApiServer, *, endpoint: str, window: str) -> None:
        policy = host.tmp / "policy.yaml"
        policy.write_text(
            "rules:\n  - condition: GpuXid\n    reasons: [GpuXid79]\n    ladder: [reboot, replace]\n"
            f"    window: {window}\n"
            "drain:\n  podDeadline: 20s\n  timeout: 30s\n  waitForDeletion: 20s\n"
        )
        env = dict(os.environ)
        env.update(
            ENABLE_RECOVERY="true",
            RECOVERY_STARTUP_DELAY="0",
            CLUSTER_NAME="ladder",
            POD_NAMESPACE=NAMESPACE,
            AWS_ENDPOINT_URL=endpoint,
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--kubeconfig", str(api.write_kubeconfig(host.tmp / "kubeconfig"))]
            + ["--node-name", NODE, "--kmsg-path", str(host.kmsg), "--state-dir", str(host.tmp / "state")]
            + ["--boot-id-file", str(host.boot_id), "--recovery-policy", str(policy)]
            + ["--listen", "0", "--pack", "kernel,nvidia"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=15)
        assert self.proc.returncode == 0, err
        assert "Traceback" not in err, err
        return err


def condition(api: KubeApiServer, type_: str) -> dict | None:
    conds = (api.get_object("nodes", NODE).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


def annotation(api: KubeApiServer, key: str) -> dict | None:
    text = (api.get_object("nodes", NODE)["metadata"].get("annotations") or {}).get(key)
    return None if text is None else json.loads(text)


def health(aws: AwsTestEnv, instance_id: str) -> str:
    answer = aws.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[instance_id])
    return answer["AutoScalingInstances"][0]["HealthStatus"].upper()


def events(api: KubeApiServer, reason: str) -> list[dict]:
    return [e for e in api.list_objects("events", "default") if e["reason"] == reason]


def rebooted_by_us(api: KubeApiServer, aws: AwsTestEnv, tmp_path: Path, front: FaultyFront, *, window: str):
    """Up to the host back from our reboot, its new agent running; returns (host, agent, instance id)."""
    group = aws.node_group(size=1)
    (instance_id,) = group.instance_ids
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}"))
    api.put_object(workload("trainer"))
    host = Host(tmp_path)
    first = Agent(host, api, endpoint=front.endpoint, window=window)
    try:
        wait_for(lambda: (c := condition(api, "GpuXid")) and c["status"] == "False", timeout=90)
        host.xid()
        wait_for(lambda: "reboot" in ((annotation(api, INCIDENT_ANNOTATION) or {}).get("done") or []), timeout=90)
    finally:
        first.stop()
    assert front.actions.count("RebootInstances") == 1
    assert api.get_object("pods", "trainer", "default") is None, "drained before the reboot"
    assert api.get_object("nodes", NODE)["spec"]["unschedulable"] is True
    assert events(api, "RecoveryRebootRequested") and events(api, "RecoveryDrainSucceeded")
    host.reboot()
    return host, Agent(host, api, endpoint=front.endpoint, window=window), instance_id


def test_xid_79_is_drained_rebooted_once_watched_and_uncordoned(api, aws, tmp_path):
    with FaultyFront(upstream=aws.endpoint, faults=[]) as front:
        host, agent, instance_id = rebooted_by_us(api, aws, tmp_path, front, window="6s")
        try:
            rung = wait_for(
                lambda: (h := annotation(api, HISTORY_ANNOTATION)) and h["rungs"][0]["windowEnd"] and h["rungs"][0],
                timeout=90,
            )
            assert rung["finishedBoot"] == host.boot_id.read_text().strip() and rung["outcome"] == "ok"
            assert api.get_object("nodes", NODE)["spec"]["unschedulable"] is True, "watched before work comes back"
            wait_for(lambda: not api.get_object("nodes", NODE)["spec"].get("unschedulable"), timeout=90)
            assert time.time() >= rung["windowEnd"] - 0.5, "not before the window ended"
            wait_for(lambda: events(api, "RecoveryUncordoned"), timeout=90)
        finally:
            agent.stop()
    spec = api.get_object("nodes", NODE)["spec"]
    assert not any(t["key"] == TAINT_KEY for t in spec.get("taints") or [])
    assert annotation(api, INCIDENT_ANNOTATION) is None
    assert front.actions.count("RebootInstances") == 1 and "SetInstanceHealth" not in front.actions
    assert health(aws, instance_id) == "HEALTHY"


def test_the_same_xid_again_within_the_window_is_replaced(api, aws, tmp_path):
    with FaultyFront(upstream=aws.endpoint, faults=[]) as front:
        host, agent, instance_id = rebooted_by_us(api, aws, tmp_path, front, window="10m")
        try:
            wait_for(lambda: (h := annotation(api, HISTORY_ANNOTATION)) and h["rungs"][0]["windowEnd"], timeout=90)
            host.xid()
            wait_for(lambda: health(aws, instance_id) == "UNHEALTHY", timeout=90)
            climbed = wait_for(lambda: events(api, "RecoveryLadderClimbed"), timeout=90)
        finally:
            agent.stop()
    assert front.actions.count("RebootInstances") == 1 and front.actions.count("SetInstanceHealth") == 1
    assert "again within the window" in climbed[0]["message"]
    assert api.get_object("nodes", NODE)["spec"]["unschedulable"] is True
    incident = annotation(api, INCIDENT_ANNOTATION)
    assert incident is not None and "mark-unhealthy" in incident["done"]


def node_patches(api: KubeApiServer) -> list[str]:
    """The recovery writes to the Node object (status PATCHes are the conditions, not recovery's)."""
    return [
        ",".join(sorted(_patched(r.body)))
        for r in api.requests.filter(method="PATCH", path_regex=f"/api/v1/nodes/{NODE}$")
    ]


def _patched(body: object) -> set[str]:
    if not isinstance(body, dict):
        return {"?"}
    notes = (body.get("metadata") or {}).get("annotations") or {}
    return {k.rsplit("/", 1)[-1] for k in notes} | {f"spec.{k}" for k in body.get("spec") or {}}


def test_one_reboot_from_detection_to_uncordon_writes_few_node_patches(api, aws, tmp_path):
    """Detection to reboot finished to uncordon, counted in the API server's request log: what recovery keeps
    on the Node rides with the step's next PATCH (the opened incident with its record, the evidence with the
    reboot's intent, the settled ledger with the healed incident): 8 PATCHes where there were 11."""
    with FaultyFront(upstream=aws.endpoint, faults=[]) as front:
        host, agent, _ = rebooted_by_us(api, aws, tmp_path, front, window="3s")
        try:
            wait_for(lambda: events(api, "RecoveryUncordoned"), timeout=90)
        finally:
            agent.stop()
    patches = node_patches(api)
    print("node PATCHes per reboot:", len(patches), patches)
    assert len(patches) <= 9, patches  # 8 measured; one more when the settle and the heal fall in two steps
    assert "incident,recovery-history" in patches, "the opened incident and its history in one PATCH"
