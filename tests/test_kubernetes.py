"""The agent against the test Kubernetes API server (real `kubernetes` client over HTTP).

End to end (subprocess, kubeconfig) for what a user sees, and in-process scenarios with our own
record source (the seam the agent reads from) for storms, outages and restarts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.app import Agent
from agent.detectors.rulepack import load_rule_set
from agent.kube import KubeClient
from agent.settings import builtin_plugins_dir
from agent.sinks.conditions import ConditionSink, node_conditions
from agent.sinks.events import EventSink
from agent.sources.kmsg import KmsgStats
from agent.types import LogRecord

from helpers import wait_for
from kubeapi.server import KubeApiServer

NODE = "ip-10-0-0-1.ec2.internal"
KUBELET_CONDITIONS = [
    {
        "type": t,
        "status": s,
        "reason": r,
        "message": m,
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    for t, s, r, m in [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
]
DMA_LINE = (
    "NEURON_HW_ERR=DMA_ERROR instance-id=i-0592464924bd45322 hostname=ip-10-0-0-1 nd-id=0 nc-id=1 "
    "serial-num=19fcda00f5ff6eb9 action=TERMINATE_INSTANCE"
)


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    server.start()
    server.put_object(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"node.kubernetes.io/instance-type": "trn1.32xlarge"}},
            "status": {"conditions": KUBELET_CONDITIONS},
        }
    )
    try:
        yield server
    finally:
        server.stop()


def node_conditions_on(server: KubeApiServer) -> dict[str, dict]:
    node = server.get_object("nodes", NODE)
    return {c["type"]: c for c in node["status"]["conditions"]}


def recent_usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


def start_agent(tmp_path: Path, kubeconfig: Path, kmsg: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--node-name",
            NODE,
            "--kmsg-path",
            str(kmsg),
            "--state-dir",
            str(tmp_path / "state"),
            "--listen",
            "0",
            "--aggregate-condition",
            "true",
            "--pack",
            "kernel",
            "--pack",
            "neuron",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_agent(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.terminate()
    return proc.communicate(timeout=10)


def test_neuron_fault_sets_conditions_and_event_kubelet_untouched(api, tmp_path):
    """Done-means of the Kubernetes issue, end to end with the real client and a kubeconfig."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(f"6,1,{recent_usec()},-;boot\n")
    proc = start_agent(tmp_path, kubeconfig, kmsg)
    try:
        initial = wait_for(lambda: "NeuronHealth" in node_conditions_on(api) and node_conditions_on(api))
        assert initial["NeuronHealth"]["status"] == "False"
        assert initial["AcceleratedHardwareReady"]["status"] == "True"
        with kmsg.open("a") as f:
            f.write(f"3,2,{recent_usec()},-;{DMA_LINE}\n")
        conds = wait_for(lambda: (c := node_conditions_on(api))["NeuronHealth"]["status"] == "True" and c)
        assert conds["NeuronHealth"]["reason"] == "NeuronHasError_DMA_ERROR"
        assert conds["AcceleratedHardwareReady"]["status"] == "False"
        assert conds["AcceleratedHardwareReady"]["reason"] == "NeuronHasError_DMA_ERROR"
        for kubelet in KUBELET_CONDITIONS:
            assert conds[kubelet["type"]] == kubelet, "kubelet-owned conditions are never touched"
        events = wait_for(
            lambda: [e for e in api.list_objects("events", "default") if e["reason"] == "NeuronHasError_DMA_ERROR"]
        )
        (event,) = events
        assert event["type"] == "Warning"
        node_uid = api.get_object("nodes", NODE)["metadata"]["uid"]
        assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}
        assert event["reportingComponent"] == "node-health-agent"
        assert "NEURON_HW_ERR=DMA_ERROR" in event["message"]
    finally:
        out, err = stop_agent(proc)
    assert proc.returncode == 0, err
    patches = api.requests.count(method="PATCH", path_regex=r"/nodes/.*/status")
    assert patches <= 3, f"{patches} status PATCHes for one fault"

    # Restart: the problem and its transition time survive; no flap to healthy is ever written.
    before = node_conditions_on(api)
    api.reset_requests()
    proc = start_agent(tmp_path, kubeconfig, kmsg)
    try:
        wait_for(lambda: api.requests.count(method="PATCH", path_regex=r"/nodes/.*/status") >= 1)
        time.sleep(0.5)
    finally:
        stop_agent(proc)
    after = node_conditions_on(api)
    for type_ in ("NeuronHealth", "AcceleratedHardwareReady"):
        assert (after[type_]["status"], after[type_]["reason"], after[type_]["lastTransitionTime"]) == (
            before[type_]["status"],
            before[type_]["reason"],
            before[type_]["lastTransitionTime"],
        )
    for record in api.requests.filter(method="PATCH", path_regex=r"/nodes/.*/status"):
        body = record.body if isinstance(record.body, dict) else json.loads(record.body)
        sent = {c["type"]: c for c in body["status"]["conditions"]}
        assert sent["NeuronHealth"]["status"] == "True", "a restart must not write the problem back to healthy"


def test_bad_credentials_exit_2_with_a_clear_error(api, tmp_path):
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token="wrong-token")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    proc = start_agent(tmp_path, kubeconfig, kmsg)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "401" in err and "credentials" in err


def test_no_credentials_exit_2(tmp_path, monkeypatch):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "run",
            "--kmsg-path",
            str(tmp_path / "k"),
            "--state-dir",
            str(tmp_path / "s"),
            "--listen",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert proc.returncode == 2
    assert "--standalone" in proc.stderr


# ---- in-process scenarios -------------------------------------------------------------------


class ListSource:
    """A record source at our own seam: yields prepared records, then idles until stopped."""

    def __init__(self, records: list[LogRecord]) -> None:
        self.stats = KmsgStats()
        self._records = records

    def records(self, *, stop: threading.Event) -> Iterator[LogRecord]:
        for record in self._records:
            self.stats.records_read += 1
            self.stats.last_activity = time.monotonic()
            yield record
        while not stop.wait(0.05):
            self.stats.last_activity = time.monotonic()


def make_records(messages: list[str], *, start_seq: int = 1) -> list[LogRecord]:
    now = time.time()
    return [LogRecord(message=m, timestamp=now, seq=start_seq + i, priority=3) for i, m in enumerate(messages)]


def run_in_process(
    api: KubeApiServer,
    tmp_path: Path,
    records: list[LogRecord],
    *,
    until,
    seed_from_node=True,
    resync: float = 10.0,
    timeout: float = 30.0,
) -> tuple[ConditionSink, EventSink, Agent]:
    rule_set = load_rule_set([builtin_plugins_dir() / "kernel", builtin_plugins_dir() / "neuron"])
    client = KubeClient.load(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
    agent = Agent(
        rule_set=rule_set,
        source=ListSource(records),
        sinks=[],
        cursor_store=None,
        boot_id="b",
        lookback=300,
        stall_timeout=60,
        aggregate=True,
    )
    if seed_from_node:
        agent.state.seed(
            node_conditions(
                client.get_node(NODE),
                types=agent.state.owned_types,
                severity=lambda t, r: agent.state.snapshot().condition(t).severity,
                now=time.time(),
            )
        )
    conditions = ConditionSink(client=client, node_name=NODE, resync=resync, retry_attempts=2, retry_max_wait=0.1)
    events = EventSink(client=client, node_name=NODE, node_uid=lambda: "uid-1")
    agent.sinks.extend([conditions, events])
    conditions.start()
    events.start()
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: until(conditions, events, agent), timeout=timeout)
    finally:
        stop.set()
        thread.join(timeout=10)
        client.close()
    return conditions, events, agent


def test_storm_of_100k_lines_costs_few_writes(api, tmp_path):
    storm = make_records(
        [DMA_LINE] * 50_000
        + ["Killed process 4242 (python) total-vm:1kB, anon-rss:1kB, file-rss:1kB, shmem-rss:0kB"] * 50_000
    )
    conditions, events, agent = run_in_process(
        api,
        tmp_path,
        storm,
        until=lambda c, e, a: a.source.stats.records_read == len(storm) and a._queue.empty() and c.in_sync,
    )  # stopping the agent closes the sinks: the Event series counts are flushed then
    patches = api.requests.count(method="PATCH", path_regex=r"/nodes/.*/status")
    event_writes = api.requests.count(path_regex=r"/events")
    assert patches <= 3, patches
    assert event_writes <= 10, event_writes
    stored = api.list_objects("events", "default")
    oom = [e for e in stored if e["reason"] == "OOMKilling"]
    assert len(oom) == 1 and oom[0]["count"] == 50_000
    assert agent.state.snapshot().problem_counts["OOMKilling"] == 50_000


def test_api_outage_loses_nothing(api, tmp_path):
    """Findings during a long outage (refused connections) reach the Node once it returns."""
    api.set_outage("refuse")
    done = threading.Event()

    def back_when_detected(c, e, a):
        snap = a.state.snapshot().condition("NeuronHealth")
        if snap.status.value == "True" and not done.is_set():
            time.sleep(0.5)  # several failed attempts happen meanwhile
            api.set_outage(None)
            done.set()
        return done.is_set() and c.in_sync and e.idle()

    conditions, events, _ = run_in_process(
        api, tmp_path, make_records([DMA_LINE]), until=back_when_detected, seed_from_node=False, resync=0.2
    )
    assert conditions.failures >= 1
    conds = node_conditions_on(api)
    assert (conds["NeuronHealth"]["status"], conds["AcceleratedHardwareReady"]["status"]) == ("True", "False")
    assert conds["Ready"] == KUBELET_CONDITIONS[3]
    assert [e["reason"] for e in api.list_objects("events", "default")].count("NeuronHasError_DMA_ERROR") == 1


def test_transient_errors_are_retried_without_changing_state(api, tmp_path):
    api.faults.add(method="PATCH", path_regex=r"/nodes/.*/status", status=429, count=1, retry_after=0)
    api.faults.add(method="PATCH", path_regex=r"/nodes/.*/status", status=503, count=1)
    conditions, _, _ = run_in_process(
        api, tmp_path, make_records([DMA_LINE]), until=lambda c, e, a: c.in_sync and c.patches >= 1, resync=0.2
    )
    assert node_conditions_on(api)["NeuronHealth"]["status"] == "True"
    statuses = [r.status for r in api.requests.filter(method="PATCH", path_regex=r"/nodes/.*/status")]
    assert statuses[:2] == [429, 503] and statuses[-1] == 200


def test_deprecated_condition_is_deleted_only_when_asked(api, tmp_path):
    node = api.get_object("nodes", NODE)
    node["status"]["conditions"].append(
        {
            "type": "OldNeuronCheck",
            "status": "False",
            "reason": "Fine",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    )
    api.put_object(node)
    rule_set = load_rule_set([builtin_plugins_dir() / "neuron"])
    client = KubeClient.load(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
    for delete, expect_present in (((), True), (("OldNeuronCheck",), False)):
        agent = Agent(
            rule_set=rule_set,
            source=ListSource([]),
            sinks=[],
            cursor_store=None,
            boot_id="b",
            lookback=300,
            stall_timeout=60,
        )
        sink = ConditionSink(client=client, node_name=NODE, delete_types=delete)
        sink.publish(events=[], snapshot=agent.state.snapshot())
        sink.start()
        wait_for(lambda s=sink: s.in_sync)
        sink.close()
        assert ("OldNeuronCheck" in node_conditions_on(api)) is expect_present
    client.close()
