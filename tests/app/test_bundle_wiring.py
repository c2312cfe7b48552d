"""The real wiring (agent.app.assembly) of issue 15's evidence: an in-process agent in Kubernetes mode,
recovery acting, against the test API server and moto. A DMA error line → cordon → a diagnostics bundle
holding that line (read by the main loop, not re-read from /dev/kmsg) → SetInstanceHealth; the bundle's
location is on the Node and the object is in S3."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.adapters.kube import KubeClient
from agent.app.assembly import KubeSetup, build_runtime
from agent.app.config import load_rule_set
from agent.app.settings import Settings
from agent.core.paths import builtin_plugins_dir
from agent.core.types import LogRecord
from agent.recovery.model import INCIDENT_ANNOTATION
from agent.sources.kmsg.stats import KmsgStats

from helpers import wait_for
from helpers.aws import REGION
from kubeapi.server import KubeApiServer

NODE = "ip-10-0-0-1.ec2.internal"
DMA_LINE = "NEURON_HW_ERR=DMA_ERROR instance-id=i-0592464924bd45322 nd-id=0 nc-id=1 action=TERMINATE_INSTANCE"


class ListSource:
    """Records at our own seam: one batch, then idle until stopped."""

    def __init__(self, records: list[LogRecord]) -> None:
        self.stats = KmsgStats()
        self._records = records

    def batches(self, *, stop: threading.Event) -> Iterator[list[LogRecord]]:
        self.stats.records_read += len(self._records)
        self.stats.last_activity = time.monotonic()
        yield self._records
        while not stop.wait(0.05):
            self.stats.last_activity = time.monotonic()

    chunks = batches  # the Source interface: chunks are ready record batches

    @staticmethod
    def decode(chunk: list[LogRecord]) -> list[LogRecord]:
        return chunk


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    server.start()
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "node-health-agent"}})
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow  # over 2 s: the full suite runs it, the fast lane does not
def test_a_bundle_is_taken_and_recorded_before_the_instance_is_marked(api, aws, tmp_path: Path):
    group = aws.node_group("eks-trn1-ng")
    instance = group.instance_ids[0]
    aws.client("s3").create_bucket(Bucket="evidence", CreateBucketConfiguration={"LocationConstraint": REGION})
    api.put_object(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/os": "linux"}},
            "spec": {"providerID": f"aws:///{REGION}a/{instance}"},
        }
    )
    settings = Settings(
        standalone=False,
        config_files=(),
        plugins_dirs=(builtin_plugins_dir() / "neuron",),
        kmsg_path=tmp_path / "unused-kmsg",
        kmsg_relay=None,
        listen=None,
        state_dir=tmp_path / "state",
        lookback=300.0,
        stall_timeout=60.0,
        node_name=NODE,
        enable_recovery=True,
        recovery_startup_delay=0.0,
        diagnostics_s3="s3://evidence/fleet",
    )
    client = KubeClient.load(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
    now = time.time()
    records = [
        LogRecord(message="Linux version 6.1", timestamp=now, seq=1),
        LogRecord(message=DMA_LINE, timestamp=now, seq=2),
    ]
    runtime = build_runtime(
        settings=settings,
        rule_set=load_rule_set(list(settings.rule_paths)),
        source=ListSource(records),
        kube=KubeSetup(client=client, node_name=NODE, node=client.get_node(NODE)),
    )
    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,))
    thread.start()

    def incident() -> dict | None:
        text = ((api.get_object("nodes", NODE) or {}).get("metadata", {}).get("annotations") or {}).get(
            INCIDENT_ANNOTATION
        )
        return json.loads(text) if text else None

    try:
        wait_for(lambda: (found := incident()) is not None and "mark-unhealthy" in found["done"], timeout=60)
    finally:
        stop.set()
        thread.join(timeout=10)
        client.close()
    local, remote = incident()["evidence"]  # type: ignore[index]
    doc = json.loads(gzip.decompress(Path(local).read_bytes()))
    assert doc["remedy"] == "mark-unhealthy" and doc["node"] == NODE
    assert [line.split(" ", 1)[1] for line in doc["kernelLog"]] == ["Linux version 6.1", DMA_LINE]
    assert doc["incident"]["reason"] == "NeuronHasError_DMA_ERROR"
    assert doc["configuration"]["diagnostics_s3"] == "s3://evidence/fleet"
    assert any(c["type"] == "NeuronHealth" and c["status"] == "True" for c in doc["conditions"])
    assert remote == f"s3://evidence/fleet/{NODE}/{Path(local).name}"
    stored = aws.client("s3").get_object(Bucket="evidence", Key=remote.removeprefix("s3://evidence/"))
    assert stored["Body"].read() == Path(local).read_bytes()
    health = aws.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[instance])
    assert health["AutoScalingInstances"][0]["HealthStatus"].upper() == "UNHEALTHY"
