"""HolderTeller: one Warning ``DeviceFault`` Event per pod holding a failing device, saying which device,
which fault and what recovery will do; and those Events through the real Event sink to the test API server."""

from __future__ import annotations

import contextlib
import random

import pytest

from agent.core.bus import SnapshotFeed
from agent.core.devices import DeviceKind, DeviceRef
from agent.core.holders import Holder, Holders
from agent.core.types import Event, PodRef, Severity
from agent.recovery.holdertell import REASON, HolderTeller, fault_message
from agent.sinks.events import EventSink

from helpers import kube_client
from helpers.sinks import NODE, SimTime, node_api, publish, running, snapshot

GPU3 = DeviceRef(
    kind=DeviceKind.GPU, id="0000:3b:00.0", printed="0000:3b:00", pci="0000:3b:00.0", index=3, uuid="GPU-3"
)
NEURON5 = DeviceRef(kind=DeviceKind.NEURON, id="neuron5", printed="nd5", index=5)
PLAN = "Recovery will drain this pod in 5m (policy GpuXid, scope device)."
NOW = 1_767_225_600.0


def holder(ns: str, pod: str, container: str = "main", resource: str = "nvidia.com/gpu") -> Holder:
    return Holder(ns, pod, container, resource, "GPU-3")


CASES = [
    # (holders, pods told (ns/name, containers named))
    ((), []),
    ((holder("ml", "train-3"),), [("ml/train-3", "main")]),
    # two containers of one pod: one Event naming both
    ((holder("ml", "train-3", "main"), holder("ml", "train-3", "sidecar")), [("ml/train-3", "main, sidecar")]),
    # two pods (a time-sliced GPU), in two namespaces: one Event each
    (
        (holder("ml", "shared-a"), holder("serving", "shared-b", "srv", "nvidia.com/gpu.shared")),
        [("ml/shared-a", "main"), ("serving/shared-b", "srv")],
    ),
]


@pytest.mark.parametrize(("found", "told"), CASES, ids=["none", "one", "two-containers", "two-pods"])
def test_one_event_per_holder_pod(found, told):
    put: list[Event] = []
    teller = HolderTeller(put=put.append, node_name=NODE, clock=lambda: NOW)
    count = teller.tell(device=GPU3, holders=Holders(found), condition="GpuXid", reason="Xid79", plan=PLAN)
    assert count == len(put) == len(told)
    assert [(e.pod.key, e.message) for e in put if e.pod] == [
        (
            key,
            fault_message(device=GPU3, containers=tuple(c.split(", ")), condition="GpuXid", reason="Xid79", plan=PLAN),
        )
        for key, c in told
    ]
    for e in put:
        assert (e.type, e.reason, e.severity, e.timestamp, e.source) == (
            "Warning",
            REASON,
            Severity.WARNING,
            NOW,
            "recovery",
        )
        assert e.condition is None, "not a condition transition: no sink takes it for one"
        assert dict(e.fields) == {
            "device": "gpu:0000:3b:00.0",
            "condition": "GpuXid",
            "faultReason": "Xid79",
            "node": NODE,
        }


MESSAGES = [
    (GPU3, ("main",), "gpu 0000:3b:00.0 (index 3, GPU-3), held by container main of this pod, has a fault: "),
    (NEURON5, ("w", "x"), "neuron neuron5, held by container w, x of this pod, has a fault: "),
]


@pytest.mark.parametrize(("device", "containers", "start"), MESSAGES, ids=["gpu", "neuron"])
def test_the_message_says_which_device_which_fault_and_the_plan(device, containers, start):
    text = fault_message(device=device, containers=containers, condition="NeuronHealth", reason="DMA_ERROR", plan=PLAN)
    assert text == f"{start}NeuronHealth DMA_ERROR. {PLAN}"


def test_an_incomplete_answer_still_tells_the_holders_found():
    put: list[Event] = []
    found = Holders((holder("ml", "train-3"),), incomplete="DRA devices not read: KubeError: 503")
    teller = HolderTeller(put=put.append, node_name=NODE, clock=lambda: NOW)
    assert teller.tell(device=GPU3, holders=found, condition="GpuXid", reason="Xid79", plan=PLAN) == 1
    assert put[0].pod == PodRef(namespace="ml", name="train-3")


# ---- through the Event sink to the API server -----------------------------------------------------


def test_told_twice_is_one_event_with_count_two_on_the_pod(tmp_path):
    sim = SimTime()
    feed = SnapshotFeed(initial=snapshot())
    found = Holders((holder("ml", "train-3"), holder("ml", "train-4")))
    with node_api() as server, contextlib.ExitStack() as stack:
        server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
        client = stack.enter_context(kube_client(server, tmp_path, timeout=0.3))
        sink = EventSink(
            client=client,
            feed=feed,
            node_name=NODE,
            state_dir=None,
            clock=sim.clock,
            monotonic=sim.monotonic,
            wait=sim.wait,
            rng=random.Random(1).random,
        )
        put: list[Event] = []
        teller = HolderTeller(put=put.append, node_name=NODE, clock=sim.clock)
        with running(sink, sim):
            teller.tell(device=GPU3, holders=found, condition="GpuXid", reason="Xid79", plan=PLAN)
            publish(feed, events=put)
            sim.advance(60)
            put.clear()
            teller.tell(device=GPU3, holders=found, condition="GpuXid", reason="Xid79", plan=PLAN)
            publish(feed, events=put)
            sim.advance(60)
        stored = server.list_objects("events", "ml")
    assert sorted((e["involvedObject"]["name"], e["reason"], e["count"]) for e in stored) == [
        ("train-3", "DeviceFault", 2),
        ("train-4", "DeviceFault", 2),
    ]
    assert all(e["related"]["name"] == NODE for e in stored)
