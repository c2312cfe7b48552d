"""Events about a Pod (a device fault told to a pod holding the device): written into the pod's namespace
with the Pod as involvedObject and the Node as related, aggregated and rate-limited per pod, kept in the
outbox; against the test API server with the real client, on simulated time."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.core.bus import SnapshotFeed
from agent.core.types import Event, PodRef, Severity
from agent.sinks.events import EventSink, bucket_of, event_name
from agent.sinks.outbox import OUTBOX_FILE, Outbox, Series

from helpers import kube_client
from helpers.sinks import NODE, Recorder, SimTime, event, node_api, publish, running, snapshot

T0 = SimTime.EPOCH + 1_000.0
FAULT = "gpu 0000:3b:00.0 (index 3, GPU-3) has a fault: GpuXid Xid79. Recovery drains this pod in 5m."
OTHER = "gpu 0000:3c:00.0 (index 4, GPU-4) has a fault: GpuXid Xid79. Recovery drains this pod in 5m."
TRAIN = PodRef(namespace="ml", name="train-3")
INFER = PodRef(namespace="serving", name="infer-0", uid="pod-uid-9")


def pod_event(pod: PodRef, message: str = FAULT, *, at: float, reason: str = "DeviceFault") -> Event:
    return Event(
        type="Warning",
        reason=reason,
        message=message,
        timestamp=at,
        source="recovery",
        severity=Severity.WARNING,
        pod=pod,
    )


class Setup:
    def __init__(self, server, client, state_dir: Path | None, **kwargs) -> None:
        self.server = server
        self.sim = SimTime()
        self.feed = SnapshotFeed(initial=snapshot(node_uid="node-uid-7"))
        self.client = Recorder(client, self.sim)
        self.sink = EventSink(
            client=self.client,
            feed=self.feed,
            node_name=NODE,
            state_dir=state_dir,
            clock=self.sim.clock,
            monotonic=self.sim.monotonic,
            wait=self.sim.wait,
            rng=random.Random(5).random,
            **kwargs,
        )

    def events(self, namespace: str) -> list[dict]:
        return self.server.list_objects("events", namespace)


@pytest.fixture
def setup(tmp_path) -> Iterator[Callable[..., Setup]]:
    with node_api() as server, contextlib.ExitStack() as stack:
        for namespace in ("ml", "serving"):
            server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

        def make(*, state_dir: Path | None = tmp_path / "state", **kwargs) -> Setup:
            client = stack.enter_context(kube_client(server, tmp_path, timeout=0.3))
            return Setup(server, client, state_dir, **kwargs)

        yield make


def test_a_pod_event_is_about_the_pod_in_its_namespace_and_related_to_the_node(setup):
    s = setup()
    with running(s.sink, s.sim):
        publish(s.feed, events=[pod_event(TRAIN, at=T0), pod_event(INFER, at=T0)])
        s.sim.run()
    (train,) = s.events("ml")
    (infer,) = s.events("serving")
    assert s.events("default") == [], "--event-namespace is for the Node's Events"
    assert train["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "train-3"}
    assert infer["involvedObject"]["uid"] == "pod-uid-9"
    for stored in (train, infer):
        assert stored["related"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-7"}
        assert (stored["type"], stored["reason"], stored["message"], stored["count"]) == (
            "Warning",
            "DeviceFault",
            FAULT,
            1,
        )
        assert stored["source"] == {"component": "node-health-agent", "host": NODE}
        assert stored["reportingInstance"] == NODE
    assert train["metadata"]["name"].startswith("train-3.")


def test_kubectl_finds_them_by_kind_and_reason(setup, tmp_path):
    """``kubectl get events -A --field-selector involvedObject.kind=Pod,reason=DeviceFault``, with the real client."""
    from kubernetes import client, config

    s = setup()
    with running(s.sink, s.sim):
        publish(s.feed, events=[pod_event(TRAIN, at=T0), event("OOMKilling", "Killed process 1", at=T0)])
        s.sim.run()
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(s.server.write_kubeconfig(tmp_path / "kubectl")), client_configuration=cfg)
    with client.ApiClient(configuration=cfg) as api:
        found = client.CoreV1Api(api).list_event_for_all_namespaces(
            field_selector="involvedObject.kind=Pod,reason=DeviceFault"
        )
    assert [(e.metadata.namespace, e.involved_object.name) for e in found.items] == [("ml", "train-3")]


def test_the_same_pod_and_fault_again_bumps_the_count(setup):
    s = setup(min_interval=30.0)
    with running(s.sink, s.sim):
        publish(s.feed, events=[pod_event(TRAIN, at=T0)])
        s.sim.advance(60)
        publish(s.feed, events=[pod_event(TRAIN, at=T0 + 60), pod_event(TRAIN, at=T0 + 61)])
        s.sim.advance(60)
    (stored,) = s.events("ml")
    assert stored["count"] == 3
    methods = [r.method for r in s.server.requests.filter(path_regex=r"/namespaces/ml/events")]
    assert methods == ["POST", "PATCH"]


def test_the_same_message_for_two_pods_is_two_events(setup):
    s = setup()
    twin = PodRef(namespace="ml", name="train-4")
    with running(s.sink, s.sim):
        publish(s.feed, events=[pod_event(TRAIN, at=T0), pod_event(twin, at=T0)])
        s.sim.run()
    assert sorted(e["involvedObject"]["name"] for e in s.events("ml")) == ["train-3", "train-4"]


def test_each_pod_has_its_own_rate_limit(setup):
    """burst 2: a pod told about three devices at once gets two Events; another pod and the Node still get theirs."""
    s = setup(burst=2, refill=300.0)
    third = FAULT.replace("3b", "3d")
    with running(s.sink, s.sim):
        storm = [pod_event(TRAIN, m, at=T0) for m in (FAULT, OTHER, third)]
        publish(s.feed, events=[*storm, pod_event(INFER, at=T0), event("DeviceFault", "node-level", at=T0)])
        s.sim.run()
        assert s.sink.throttled == 1
        s.sim.advance(300)  # one token back for train-3
        publish(s.feed, events=[pod_event(TRAIN, third, at=T0 + 300)])
        s.sim.advance(10)
    assert sorted(e["message"] for e in s.events("ml")) == sorted([FAULT, OTHER, third])
    assert len(s.events("serving")) == 1 and len(s.events("default")) == 1


def test_an_event_for_a_pod_whose_namespace_is_gone_is_dropped_alone(setup):
    s = setup()
    with running(s.sink, s.sim):
        publish(s.feed, events=[pod_event(PodRef(namespace="gone", name="p"), at=T0), pod_event(TRAIN, at=T0)])
        s.sim.run()
    assert len(s.events("ml")) == 1
    assert s.sink.dropped == {404: 1} and s.sink.pending() == 0


def test_the_nodes_many_reasons_never_crowd_out_a_pod_event(setup):
    """max_reasons 2: the source's third Node reason is summarized; its pod Event is not."""
    s = setup(max_reasons=2)
    node = [
        Event(type="Warning", reason=r, message=r, timestamp=T0, source="recovery", severity=Severity.WARNING)
        for r in ("Cordoned", "Draining", "Fenced")
    ]
    with running(s.sink, s.sim):
        publish(s.feed, events=[*node, pod_event(TRAIN, at=T0)])
        s.sim.run()
    assert sorted(e["reason"] for e in s.events("default")) == ["Cordoned", "Draining", "TooManyReasons"]
    assert [e["reason"] for e in s.events("ml")] == ["DeviceFault"]


def test_a_pod_series_survives_a_restart_in_the_outbox(setup, tmp_path):
    before = setup(state_dir=tmp_path / "kept")
    before.server.set_outage("refuse")
    with running(before.sink, before.sim):
        publish(before.feed, events=[pod_event(INFER, at=T0)] * 2)
        before.sim.advance(1)
    before.server.set_outage(None)
    after = setup(state_dir=tmp_path / "kept")
    with running(after.sink, after.sim):
        after.sim.run()
    (stored,) = after.events("serving")
    assert stored["count"] == 2 and stored["involvedObject"]["uid"] == "pod-uid-9"


# ---- the values the sink keys by ------------------------------------------------------------------


def test_names_and_buckets_keep_the_node_events_as_they_were():
    node_name = event_name(NODE, type_="Warning", reason="R", message="m", first=T0)
    pod_name = event_name(NODE, type_="Warning", reason="R", message="m", first=T0, pod=TRAIN)
    other_node = event_name("ip-10-0-0-2", type_="Warning", reason="R", message="m", first=T0, pod=TRAIN)
    assert node_name.startswith(f"{NODE}.") and pod_name.startswith("train-3.")
    assert len({node_name, pod_name, other_node}) == 3
    assert bucket_of("R", None) == "R" and bucket_of("R", TRAIN) != bucket_of("R", INFER)


@pytest.mark.parametrize("pod", [None, TRAIN, INFER], ids=["node", "pod", "pod-with-uid"])
def test_a_series_round_trips_through_the_outbox_file(tmp_path, pod):
    outbox = Outbox(path=tmp_path / OUTBOX_FILE)
    outbox.add(Series(name="n.1", type="Warning", reason="DeviceFault", message=FAULT, first=T0, last=T0, pod=pod))
    outbox.save()
    again = Outbox(path=tmp_path / OUTBOX_FILE)
    assert again.load() == 1
    (series,) = list(again)
    assert series.pod == pod
    assert again.current(("Warning", "DeviceFault", FAULT, pod.key if pod else "")) is series


@pytest.mark.parametrize(("pod", "shown"), [(None, None), (TRAIN, "ml/train-3")], ids=["node", "pod"])
def test_standalone_json_names_the_pod(pod, shown):
    from agent.sinks.stdout import event_json

    out = event_json(dataclasses.replace(pod_event(TRAIN, at=T0), pod=pod))
    assert out.get("pod") == shown
