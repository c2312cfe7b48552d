"""The diagnostics bundle (agent.recovery.bundle): what it holds, its bounds in size and time, where it
goes (state directory 0600, newest N; S3 through moto), that trouble is reported and never delays the
remedy, and that the recovery loop records it on the Node before the remedy."""

from __future__ import annotations

import dataclasses
import errno
import gzip
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.adapters.aws import AwsClients, S3Uploader
from agent.adapters.kube import KubeClient
from agent.core.bus import Inbox, SnapshotFeed
from agent.core.ring import LineRing
from agent.core.types import Condition, LogRecord, Snapshot, Status
from agent.recovery import bundle as bundle_module
from agent.recovery.asg import MarkResult
from agent.recovery.budget import ClusterBudget
from agent.recovery.bundle import DIRECTORY, DiagnosticsBundle, parse_s3_url
from agent.recovery.loop import RecoveryLoop
from agent.recovery.model import (
    BUILTIN_CONDITIONS,
    DEFAULT_LEASE,
    INCIDENT_ANNOTATION,
    Action,
    BudgetSettings,
    Incident,
    NodeView,
)
from agent.recovery.policyfile import DEFAULT_POLICY

from helpers import kube_clients
from helpers.aws import REGION
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
NODE = "ip-10-0-0-1.us-west-2.compute.internal"
INCIDENT = Incident(
    id="NeuronHealth/NeuronHasError_DMA_ERROR/uid-1/1767225590",
    condition="NeuronHealth",
    reason="NeuronHasError_DMA_ERROR",
    since=T0 - 10,
    opened=T0,
)
DMA_LINE = "neuron: NEURON_HW_ERR=DMA_ERROR nd_id=3"


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def make(tmp_path: Path, **kw) -> DiagnosticsBundle:
    values: dict = dict(
        state_dir=tmp_path / "state",
        node_name=NODE,
        kernel_log=lambda: ["2026-01-01T00:00:00Z Linux version 6.1", f"2026-01-01T00:00:01Z {DMA_LINE}"],
        checks=lambda: {"neuron-devices": {"status": "PROBLEM", "message": "3 of 16 devices"}},
        configuration=lambda: {"enable_recovery": True},
        tool_path=f"{tmp_path / 'bin'}:/usr/bin:/bin",
        clock=Clock(),
    )
    values.update(kw)
    return DiagnosticsBundle(**values)


def read(path: str | Path) -> dict:
    return json.loads(gzip.decompress(Path(path).read_bytes()))


# ---- what it holds, where it goes -------------------------------------------------------------------


def test_a_bundle_before_a_replace(tmp_path):
    tool(tmp_path / "bin", "nvidia-smi", 'echo "==============NVSMI LOG==============" ; echo "args: $*"')
    snapshot = Snapshot(
        conditions=(
            Condition(
                type="NeuronHealth",
                status=Status.TRUE,
                reason="NeuronHasError_DMA_ERROR",
                message=DMA_LINE,
                last_transition=T0 - 10,
                last_update=T0 - 10,
            ),
        ),
        generated_at=T0,
    )
    bundle = make(tmp_path, snapshot=lambda: snapshot)
    after = bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT)

    (path,) = after.evidence
    assert after == dataclasses.replace(INCIDENT, evidence=(path,))
    assert Path(path).parent == tmp_path / "state" / DIRECTORY
    assert Path(path).name == "000001-20260101T000000Z-NeuronHasError_DMA_ERROR-mark-unhealthy.json.gz"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = read(path)
    assert doc["kind"] == "node-health-agent diagnostics bundle" and doc["node"] == NODE
    assert (doc["remedy"], doc["createdAt"]) == ("mark-unhealthy", "2026-01-01T00:00:00Z")
    assert doc["incident"] == INCIDENT.to_json()
    assert doc["kernelLog"][-1] == f"2026-01-01T00:00:01Z {DMA_LINE}"
    assert doc["checks"] == {"neuron-devices": {"status": "PROBLEM", "message": "3 of 16 devices"}}
    assert doc["conditions"][0]["message"] == DMA_LINE
    assert doc["configuration"] == {"enable_recovery": True}
    smi = doc["tools"]["nvidia-smi -q"]
    assert (smi["present"], smi["exitCode"], smi["timedOut"]) == (True, 0, False)
    assert smi["stdout"] == "==============NVSMI LOG==============\nargs: -q\n"
    assert doc["tools"]["neuron-ls"] == {"present": False}
    assert doc["problems"] == []
    assert (bundle.written, bundle.failures) == (1, 0)


def test_only_before_a_remedy_and_once_per_incident_and_remedy(tmp_path):
    bundle = make(tmp_path)
    for action in (Action.CORDON, Action.TAINT, Action.DRAIN, Action.UNCORDON):
        assert bundle.before_remedy(action, INCIDENT) is INCIDENT
    first = bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT)
    again = bundle.before_remedy(Action.MARK_UNHEALTHY, first)  # a retried remedy (throttled, say)
    assert again == first and bundle.written == 1
    assert len(list((tmp_path / "state" / DIRECTORY).iterdir())) == 1


def test_the_newest_bundles_are_kept(tmp_path):
    clock = Clock()
    bundle = make(tmp_path, keep=3, clock=clock)
    for i in range(5):
        clock.now = T0 + 60 * i
        bundle.before_remedy(Action.MARK_UNHEALTHY, dataclasses.replace(INCIDENT, id=f"incident-{i}"))
    kept = sorted(p.name for p in (tmp_path / "state" / DIRECTORY).iterdir())
    assert [name[:23] for name in kept] == [
        "000003-20260101T000200Z",
        "000004-20260101T000300Z",
        "000005-20260101T000400Z",
    ]


@pytest.mark.parametrize(
    ("strays", "kept"),
    [
        # A clock that once ran ahead (year 9999), in an older version's names: those go first.
        (
            [f"99991231T23595{i}Z-GpuXid79-reboot.json.gz" for i in range(5)],
            ["000001", "000002", "000003"],
        ),
        # ... and in ours: the sequence decides, not the time in the name.
        (
            [f"00000{i}-99991231T23595{i}Z-GpuXid79-reboot.json.gz" for i in range(1, 6)],
            ["000006", "000007", "000008"],
        ),
    ],
)
def test_bundles_are_pruned_by_when_they_were_written_not_by_their_names(tmp_path, strays, kept):
    directory = tmp_path / "state" / DIRECTORY
    directory.mkdir(parents=True)
    for name in strays:
        (directory / name).write_bytes(b"old")
    clock = Clock()
    bundle = make(tmp_path, keep=3, clock=clock)
    for i in range(3):
        clock.now = T0 + 60 * i
        after = bundle.before_remedy(Action.MARK_UNHEALTHY, dataclasses.replace(INCIDENT, id=f"incident-{i}"))
        (path,) = after.evidence
        assert Path(path).is_file()  # the bundle the incident names is there once written
    assert sorted(p.name[:6] for p in directory.iterdir()) == kept


def test_the_bundles_the_current_incident_names_are_never_pruned(tmp_path):
    # keep=1: the reboot's bundle and then the replace's, both named by one incident, are both kept.
    bundle = make(tmp_path, keep=1)
    after_reboot = bundle.before_remedy(Action.REBOOT, INCIDENT)
    after_replace = bundle.before_remedy(Action.MARK_UNHEALTHY, after_reboot)
    assert len(after_replace.evidence) == 2
    assert all(Path(p).is_file() for p in after_replace.evidence)
    # The next incident's bundle: the older incident's go, the new one stays.
    other = bundle.before_remedy(Action.MARK_UNHEALTHY, dataclasses.replace(INCIDENT, id="incident-2"))
    assert [p.name for p in (tmp_path / "state" / DIRECTORY).iterdir()] == [Path(other.evidence[0]).name]


def test_keep_zero_and_no_s3_takes_none(tmp_path):
    bundle = make(tmp_path, keep=0)
    assert bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT) is INCIDENT
    assert not (tmp_path / "state").exists()


# ---- bounds ---------------------------------------------------------------------------------------------


def test_a_huge_tool_output_and_kernel_log_are_cut_to_fit(tmp_path):
    tool(tmp_path / "bin", "neuron-ls", "head -c 3000000 /dev/zero | tr '\\0' x")  # 3 MB: the runner keeps 1 MiB
    ring = LineRing(max_lines=100_000, max_bytes=8 << 20)
    ring.extend(
        [LogRecord(message=f"line {i} " + "y" * 200, timestamp=1_767_225_600.0) for i in range(20_000)]
    )  # 4.5 MB
    bundle = make(tmp_path, kernel_log=ring.lines, max_bytes=1 << 20)
    (path,) = bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT).evidence
    raw = gzip.decompress(Path(path).read_bytes())
    assert len(raw) <= 1 << 20
    doc = json.loads(raw)
    assert doc["kernelLog"][-1].startswith("2026-01-01T00:00:00Z line 19999 ")  # the newest lines stay
    assert doc["tools"]["neuron-ls"]["stdoutTruncated"] is True
    assert doc["problems"] == ["cut to fit 1048576 bytes: kernel log (oldest lines), tool output"]


def test_a_hung_tool_is_killed_at_its_timeout(tmp_path):
    tool(tmp_path / "bin", "nvidia-smi", "sleep 600")
    bundle = make(tmp_path, tool_timeout=0.5)
    (path,) = bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT).evidence
    smi = read(path)["tools"]["nvidia-smi -q"]
    assert smi["timedOut"] is True and smi["exitCode"] is None  # killed with its process group


def test_a_bundle_that_takes_too_long_does_not_hold_the_remedy(tmp_path):
    release = threading.Event()

    def stuck() -> list[str]:
        release.wait(60)
        return []

    bundle = make(tmp_path, kernel_log=stuck, deadline=0.3)
    try:
        after = bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT)  # returns: the test would hang otherwise
        assert after is INCIDENT
        assert bundle.last is not None
        assert bundle.last.problems == ("the bundle took longer than 0.3s: the remedy goes on without it",)
        assert bundle.failures == 1
    finally:
        release.set()


def test_an_unwritable_state_directory_is_reported(tmp_path):
    (tmp_path / "state").write_text("a file, not a directory")
    bundle = make(tmp_path)
    assert bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT) is INCIDENT
    assert bundle.last is not None and bundle.last.path == ""
    (problem,) = bundle.last.problems
    assert problem.startswith(f"cannot write {tmp_path / 'state' / DIRECTORY}/000001-20260101T000000Z-")
    assert bundle.failures == 1


def test_a_full_disk_is_reported(tmp_path, monkeypatch):
    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bundle_module, "atomic_write", full)  # our own seam: the state directory writer
    bundle = make(tmp_path)
    assert bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT) is INCIDENT
    assert bundle.last is not None and bundle.last.problems[0].endswith(": No space left on device")


def test_a_part_that_fails_is_reported_and_the_rest_kept(tmp_path):
    def broken() -> dict:
        raise RuntimeError("scheduler gone")

    (path,) = make(tmp_path, checks=broken).before_remedy(Action.MARK_UNHEALTHY, INCIDENT).evidence
    doc = read(path)
    assert doc["checks"] is None and doc["kernelLog"]
    assert doc["problems"] == ["cannot read the check results: RuntimeError: scheduler gone"]


def test_a_bug_in_the_bundle_never_holds_the_remedy(tmp_path):
    def broken_clock() -> float:
        raise RuntimeError("clock gone")

    bundle = make(tmp_path, clock=broken_clock)
    assert bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT) is INCIDENT
    assert bundle.last is not None
    assert bundle.last.problems == ("the bundle failed: RuntimeError: clock gone",)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://my-bucket/node-health", ("my-bucket", "node-health")),
        ("s3://my-bucket/a/b/", ("my-bucket", "a/b")),
        ("s3://my-bucket", ("my-bucket", "")),
        ("s3://My_Bucket/x", None),
        ("https://my-bucket/x", None),
        ("s3://my-bucket/a//b", None),
        ("s3://my-bucket/a/../b", None),
    ],
)
def test_parse_s3_url(url, expected):
    if expected is None:
        with pytest.raises(ValueError):
            parse_s3_url(url)
    else:
        assert parse_s3_url(url) == expected


# ---- S3 (moto) ------------------------------------------------------------------------------------------


def test_a_bundle_goes_to_s3_under_the_prefix(tmp_path, aws):
    aws.client("s3").create_bucket(Bucket="evidence", CreateBucketConfiguration={"LocationConstraint": REGION})
    put = S3Uploader(clients=AwsClients(), bucket="evidence").put
    bundle = make(tmp_path, s3_url="s3://evidence/fleet/bundles", s3_put=put)
    local, remote = bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT).evidence
    key = f"fleet/bundles/{NODE}/{Path(local).name}"
    assert remote == f"s3://evidence/{key}"
    body = aws.client("s3").get_object(Bucket="evidence", Key=key)["Body"].read()
    assert body == Path(local).read_bytes()


def test_s3_trouble_is_reported_and_the_local_copy_kept(tmp_path, aws):
    put = S3Uploader(clients=AwsClients(), bucket="no-such-bucket").put
    bundle = make(tmp_path, s3_url="s3://no-such-bucket/x", s3_put=put)
    (local,) = bundle.before_remedy(Action.MARK_UNHEALTHY, INCIDENT).evidence
    assert Path(local).exists()
    assert bundle.last is not None
    (problem,) = bundle.last.problems
    assert problem.startswith(f"cannot put s3://no-such-bucket/x/{NODE}/") and "NoSuchBucket" in problem


# ---- the recovery loop records it before the remedy ------------------------------------------------------


class Marker:
    """``mark_unhealthy`` that notes the incident on the Node as it was when the remedy began."""

    def __init__(self, api: KubeApiServer) -> None:
        self.api = api
        self.seen: list[dict] = []

    def __call__(self, node: NodeView) -> MarkResult:
        found = self.api.get_object("nodes", NODE)
        assert found is not None
        self.seen.append(json.loads(found["metadata"]["annotations"][INCIDENT_ANNOTATION]))
        return MarkResult(outcome="marked", instance_id="i-0123456789abcdef0", group="ng", message="marked")


@pytest.fixture
def client(kube_api_server: KubeApiServer, tmp_path: Path) -> Iterator[KubeClient]:
    kube_api_server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "node-health-agent"}})
    kube_api_server.put_object(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {}},
            "spec": {"providerID": "aws:///us-west-2a/i-0123456789abcdef0"},
        }
    )
    with kube_clients(kube_api_server, tmp_path, timeout=5.0) as make_client:
        yield make_client()


def test_the_loop_records_the_bundle_on_the_node_before_the_remedy(kube_api_server, client, tmp_path):
    clock = Clock(T0 + 120)
    feed = SnapshotFeed(initial=Snapshot(conditions=(), generated_at=T0, seeded=False))
    marker = Marker(kube_api_server)
    bundle = make(tmp_path, clock=clock)
    policy = dataclasses.replace(DEFAULT_POLICY, startup_delay=0.0, budget=BudgetSettings(max_actions=100))
    loop = RecoveryLoop(
        feed=feed,
        inbox=Inbox(),
        client=client,
        node_name=NODE,
        policy=policy,
        enabled=True,
        budget=ClusterBudget(
            client=client,
            namespace="node-health-agent",
            lease_name=DEFAULT_LEASE,
            node_name=NODE,
            settings=policy.budget,
            clock=clock,
            sleep=lambda s: None,
        ),
        mark_unhealthy=marker,
        bundle=bundle.before_remedy,
        clock=clock,
    )
    dma = Condition(
        type="NeuronHealth",
        status=Status.TRUE,
        reason="NeuronHasError_DMA_ERROR",
        message=DMA_LINE,
        last_transition=T0,
        last_update=T0,
    )
    feed.publish(
        snapshot=Snapshot(conditions=(dma,), generated_at=clock(), provenance=BUILTIN_CONDITIONS), events=[], health={}
    )
    decision = loop.step()
    assert decision is not None and decision.actions == (Action.CORDON, Action.MARK_UNHEALTHY)
    (seen,) = marker.seen
    (path,) = seen["evidence"]  # on the Node before SetInstanceHealth was asked for
    assert read(path)["remedy"] == "mark-unhealthy"
    node = kube_api_server.get_object("nodes", NODE)
    assert node is not None
    stored = json.loads(node["metadata"]["annotations"][INCIDENT_ANNOTATION])
    assert stored["evidence"] == [path] and stored["done"] == ["cordon", "mark-unhealthy"]
    assert bundle.written == 1
