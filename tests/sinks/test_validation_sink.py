"""The validations sink against the test API server with the real client: one PATCH of the Node's
annotation when the records change, coalesced, and nothing when they do not."""

from __future__ import annotations

from pathlib import Path

from agent.core.bus import SnapshotFeed
from agent.core.types import Snapshot
from agent.core.validation import VALIDATIONS_ANNOTATION, ValidationRecord, Verdict, parse_records
from agent.sinks.validations import ValidationSink

from helpers import kube_client
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]

NODE = "ip-10-0-0-1"


def snapshot(*records: ValidationRecord) -> Snapshot:
    return Snapshot(conditions=(), generated_at=1000.0, validations=records)


def passed(at: float, device: str = "gpu:0000:3b:00.0") -> ValidationRecord:
    return ValidationRecord(
        check="dcgm-diag", devices=(device,), verdict=Verdict.PASS, reason="DiagPassed", message="", at=at,
        valid_until=at + 86400,
    )  # fmt: skip


def test_the_records_are_written_once_per_change_and_changes_are_coalesced(
    kube_api_server: KubeApiServer, tmp_path: Path
):
    kube_api_server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    feed = SnapshotFeed(initial=snapshot())
    with kube_client(kube_api_server, tmp_path) as client:
        sink = ValidationSink(client=client, node_name=NODE, feed=feed)
        patches = lambda: kube_api_server.requests.count(method="PATCH", path_regex=r"/nodes/.*/status$")  # noqa: E731
        sink.take(feed.latest())
        sink.work(0.0)
        assert patches() == 0  # no record yet: nothing to write
        for at in (1000.0, 1001.0):  # two changes before the sink looks: one write of the newest
            sink.take(feed.publish(snapshot=snapshot(passed(at)), events=[], health={}, inputs=0))
        sink.work(1.0)
        sink.work(2.0)  # unchanged: no second PATCH
        assert patches() == 1
        node = client.get_node(NODE)
        [back] = parse_records(node["metadata"]["annotations"][VALIDATIONS_ANNOTATION])
        assert (back.check, back.verdict, back.at, back.valid_until) == ("dcgm-diag", Verdict.PASS, 1001.0, 87401.0)
