"""Real agent processes for end-to-end tests: the walkthrough's cluster, an agent as the DaemonSet runs
it, and what the tests read back from the test API server and moto.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from helpers.aws import AwsTestEnv
from kubeapi import KubeApiServer

NODE = "ip-10-0-0-1.us-west-2.compute.internal"


OTHERS = ("ip-10-0-0-2", "ip-10-0-0-3", "ip-10-0-0-4")  # the walkthrough's cluster: 4 nodes, 1 failing


NAMESPACE = "node-health-agent"


DMA_LINE = "test NEURON_HW_ERR=DMA_ERROR test"


def node(name: str, *, provider_id: str = "", unschedulable: bool = False) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        # No instance-type label: this machine has no Neuron devices, and a trn1 label would (rightly) make
        # the neuron-devices check report them missing.
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"providerID": provider_id, "unschedulable": unschedulable},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}]},
    }


@contextlib.contextmanager
def walkthrough_api() -> Iterator[KubeApiServer]:
    """The test API server with the agent's namespace and the walkthrough's other nodes."""
    server = KubeApiServer()
    server.start()
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for other in OTHERS:
        server.put_object(node(other))
    try:
        yield server
    finally:
        server.stop()


def recent_usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


class Agent:
    """``node-health-agent run`` as the DaemonSet runs it (env from the recovery + cloudwatch components)."""

    def __init__(
        self,
        tmp: Path,
        api: KubeApiServer,
        *,
        enable: str,
        endpoint: str | None = None,
        listen: str = "0",
        packs: str = "kernel,neuron",
        env: dict[str, str] | None = None,
    ) -> None:
        self.kmsg = tmp / "kmsg"
        if not self.kmsg.exists():
            self.kmsg.write_text(f"6,1,{recent_usec()},-;boot\n")
        extra = env
        env = dict(os.environ)
        env.update(
            ENABLE_RECOVERY=enable,
            RECOVERY_STARTUP_DELAY="0",
            CLUSTER_NAME="walkthrough",
            POD_NAMESPACE=NAMESPACE,
            NHA_CLOUDWATCH="true",
        )
        if endpoint is not None:
            env["AWS_ENDPOINT_URL"] = endpoint
        env.update(extra or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--kubeconfig", str(api.write_kubeconfig(tmp / "kubeconfig"))]
            + ["--node-name", NODE, "--kmsg-path", str(self.kmsg), "--state-dir", str(tmp / "state")]
            + ["--listen", listen, "--aggregate-condition", "true", "--pack", packs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def fault(self, line: str = DMA_LINE) -> None:
        with self.kmsg.open("a") as f:
            f.write(f"3,{int(time.time() * 1000) % 10**9},{recent_usec()},-;{line}\n")

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=15)
        assert self.proc.returncode == 0, err
        return err


class PolicyAgent:
    """``node-health-agent run`` for one node of a multi-node test: recovery on under ``policy``, no AWS, the
    kernel and Neuron packs, /metrics on ``listen`` (tests/recovery: pause and zone end to end)."""

    def __init__(
        self,
        tmp: Path,
        api: KubeApiServer,
        node: str,
        policy: Path,
        *,
        listen: str = "0",
        env: Mapping[str, str] | None = None,  # more environment (CLUSTER_NAME, ...)
    ) -> None:
        tmp.mkdir()
        self.kmsg = tmp / "kmsg"
        self.kmsg.write_text(f"6,1,{recent_usec()},-;boot\n")
        env = {
            **os.environ,
            "ENABLE_RECOVERY": "true",
            "RECOVERY_STARTUP_DELAY": "0",
            "POD_NAMESPACE": NAMESPACE,
            **(env or {}),
        }
        env.pop("NHA_CLOUDWATCH", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--kubeconfig", str(api.write_kubeconfig(tmp / "kubeconfig"))]
            + ["--node-name", node, "--kmsg-path", str(self.kmsg), "--state-dir", str(tmp / "state")]
            + ["--listen", listen, "--pack", "kernel,neuron", "--recovery-policy", str(policy)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def fault(self, line: str = DMA_LINE) -> None:
        with self.kmsg.open("a") as f:
            f.write(f"3,2,{recent_usec()},-;{line}\n")

    def stop(self) -> str:
        """SIGTERM; the agent's stderr."""
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=15)
        return err


def health(aws: AwsTestEnv, instance_id: str) -> str:
    answer = aws.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[instance_id])
    return answer["AutoScalingInstances"][0]["HealthStatus"].upper()


def cloudwatch_metrics(aws: AwsTestEnv) -> list[dict]:
    return aws.client("cloudwatch").list_metrics(Namespace="NeuronHealthCheck")["Metrics"]


def events(api: KubeApiServer, reason: str) -> list[dict]:
    return [e for e in api.list_objects("events", "default") if e["reason"] == reason]


def condition(api: KubeApiServer, type_: str) -> dict | None:
    conds = (api.get_object("nodes", NODE).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)
