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

from agent.adapters.kube import KubeClient
from agent.app.assembly import KubeSetup, build_runtime
from agent.app.config import load_rule_set
from agent.app.settings import Settings
from agent.core.paths import builtin_plugins_dir
from agent.core.types import LogRecord
from agent.sources.kmsg.stats import KmsgStats

from helpers import wait_for
from kubeapi.server import KubeApiServer

pytestmark = pytest.mark.slow  # starts agent processes against the test API server

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
            # No instance-type label: a trn1 label makes the neuron-devices check (rightly) report this
            # machine's missing devices, racing AcceleratedHardwareReady against the first PATCH.
            "metadata": {"name": NODE, "labels": {"kubernetes.io/os": "linux"}},
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


def test_sigkill_with_the_api_down_loses_no_event(api, tmp_path):
    """The Event waits in the durable outbox; after SIGKILL and restart it is delivered exactly once."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(f"3,1,{recent_usec()},-;{DMA_LINE}\n")
    outbox = tmp_path / "state" / "events-outbox.json"
    api.set_outage("refuse")
    proc = start_agent(tmp_path, kubeconfig, kmsg, "--api-wait-timeout", "0s")
    try:
        wait_for(lambda: outbox.exists() and "NeuronHasError_DMA_ERROR" in outbox.read_text())
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    api.set_outage(None)
    proc = start_agent(tmp_path, kubeconfig, kmsg)
    try:
        wait_for(
            lambda: [e for e in api.list_objects("events", "default") if e["reason"] == "NeuronHasError_DMA_ERROR"]
        )
        wait_for(lambda: node_conditions_on(api).get("NeuronHealth", {}).get("status") == "True")
    finally:
        _, err = stop_agent(proc)
    assert proc.returncode == 0, err
    reasons = [e["reason"] for e in api.list_objects("events", "default")]
    assert reasons.count("NeuronHasError_DMA_ERROR") == 1


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
    """A record source at our own seam: yields prepared records in batches, then idles until stopped."""

    def __init__(self, records: list[LogRecord], *, batch: int = 4096) -> None:
        self.stats = KmsgStats()
        self._records = records
        self._batch = batch

    def batches(self, *, stop: threading.Event) -> Iterator[list[LogRecord]]:
        for i in range(0, len(self._records), self._batch):
            chunk = self._records[i : i + self._batch]
            self.stats.records_read += len(chunk)
            self.stats.last_activity = time.monotonic()
            yield chunk
        while not stop.wait(0.05):
            self.stats.last_activity = time.monotonic()

    chunks = batches  # the Source interface: chunks are ready record batches

    @staticmethod
    def decode(chunk):
        return chunk


def make_records(messages: list[str], *, start_seq: int = 1) -> list[LogRecord]:
    now = time.time()
    return [LogRecord(message=m, timestamp=now, seq=start_seq + i, priority=3) for i, m in enumerate(messages)]


def settings_for(tmp_path: Path, **overrides) -> Settings:
    values = dict(
        standalone=False,
        config_files=(),
        plugins_dirs=(builtin_plugins_dir() / "kernel", builtin_plugins_dir() / "neuron"),
        kmsg_path=tmp_path / "unused-kmsg",
        kmsg_relay=None,
        listen=None,
        state_dir=tmp_path / "state",
        lookback=300.0,
        stall_timeout=60.0,
        node_name=NODE,
        aggregate_condition=True,
    )
    values.update(overrides)
    return Settings(**values)


class Running:
    """An in-process agent (the real wiring) against the test API server, stopped on exit."""

    def __init__(
        self, api: KubeApiServer, tmp_path: Path, records: list[LogRecord], *, read_node=True, resync=0.5, **kw
    ):
        self.settings = settings_for(tmp_path, **kw)
        self.client = KubeClient.load(kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"))
        node = self.client.get_node(NODE) if read_node else None
        self.runtime = build_runtime(
            settings=self.settings,
            rule_set=load_rule_set(list(self.settings.rule_paths)),
            source=ListSource(records),
            # a failed write is retried after 0.5 s, not 10 s: the outage tests wait on it (the policy is the same)
            kube=KubeSetup(client=self.client, node_name=NODE, node=node, resync=resync),
        )
        comps = {c.name: c for c in self.runtime.supervisor.components}
        self.conditions = comps["condition_sink"]
        self.events = comps["event_sink"]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.runtime.run, args=(self.stop,))

    def snapshot(self):
        return self.runtime.feed.latest().snapshot

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.client.close()


def test_storm_of_100k_lines_costs_few_writes(api, tmp_path):
    storm = make_records(
        [DMA_LINE] * 50_000
        + ["Killed process 4242 (python) total-vm:1kB, anon-rss:1kB, file-rss:1kB, shmem-rss:0kB"] * 50_000
    )
    with Running(api, tmp_path, storm) as agent:
        wait_for(lambda: agent.runtime.main_loop.pipeline.lines_matched == len(storm) and agent.conditions.in_sync)
        # Every occurrence is published and folded into the Event sink's outbox before the stop: all
        # components see the stop at once, so on a loaded machine a last publication could come after
        # the sink's final take. What is left for the stop is one write per series.
        pub = wait_for(
            lambda: (p := agent.runtime.feed.latest()).snapshot.problem_counts.get("OOMKilling") == 50_000 and p
        )
        wait_for(lambda: agent.events.acked() >= pub.number, timeout=60)
    # stopping the agent flushes the Event series counts
    patches = api.requests.count(method="PATCH", path_regex=r"/nodes/.*/status")
    event_writes = api.requests.count(path_regex=r"/events")
    assert patches <= 3, patches
    assert event_writes <= 10, event_writes
    stored = api.list_objects("events", "default")
    oom = [e for e in stored if e["reason"] == "OOMKilling"]
    assert len(oom) == 1 and oom[0]["count"] == 50_000
    assert agent.snapshot().problem_counts["OOMKilling"] == 50_000


def test_api_outage_loses_nothing(api, tmp_path):
    """Findings during an outage (refused connections) reach the Node once it returns."""
    api.set_outage("refuse")
    with Running(api, tmp_path, make_records([DMA_LINE]), read_node=False) as agent:
        wait_for(lambda: agent.snapshot().condition("NeuronHealth").status.value == "True" or None)
        wait_for(lambda: sum(agent.events.failures.values()) + sum(agent.conditions.failures.values()) >= 1)
        api.set_outage(None)
        wait_for(lambda: agent.conditions.in_sync and agent.events.pending() == 0, timeout=60)
    conds = node_conditions_on(api)
    assert (conds["NeuronHealth"]["status"], conds["AcceleratedHardwareReady"]["status"]) == ("True", "False")
    assert conds["Ready"] == KUBELET_CONDITIONS[3]
    assert [e["reason"] for e in api.list_objects("events", "default")].count("NeuronHasError_DMA_ERROR") == 1


def test_restart_with_the_api_down_keeps_conditions_and_reposts_nothing(api, tmp_path):
    """Our conditions live in the state directory: a restart needs no API server to stay consistent."""
    with Running(api, tmp_path, make_records([DMA_LINE])) as agent:
        wait_for(lambda: agent.conditions.in_sync and agent.events.pending() == 0 and agent.events.writes >= 1)
    before = node_conditions_on(api)
    assert before["AcceleratedHardwareReady"]["status"] == "False"
    events_before = len(api.list_objects("events", "default"))
    api.set_outage("refuse")
    with Running(api, tmp_path, make_records([DMA_LINE]), read_node=False) as agent:
        snap = wait_for(lambda: agent.runtime.main_loop.pipeline.lines_matched >= 1 and agent.snapshot())
        assert snap.seeded, "conditions restored from the state directory count as seeded"
        api.set_outage(None)
        wait_for(lambda: agent.conditions.in_sync, timeout=60)
    after = node_conditions_on(api)
    for type_ in ("NeuronHealth", "AcceleratedHardwareReady"):
        assert (after[type_]["status"], after[type_]["lastTransitionTime"]) == (
            before[type_]["status"],
            before[type_]["lastTransitionTime"],
        )
    assert len(api.list_objects("events", "default")) == events_before, "no transition Event is re-posted"


def test_unknown_reason_read_back_from_the_node_is_not_critical(api, tmp_path):
    """A True condition whose reason no loaded rule produces must not flip AcceleratedHardwareReady."""
    node = api.get_object("nodes", NODE)
    node["status"]["conditions"].append(
        {
            "type": "NeuronHealth",
            "status": "True",
            "reason": "NeuronDeviceMissingFromAnOldRule",
            "message": "old",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    )
    api.put_object(node)
    with Running(api, tmp_path, []) as agent:
        wait_for(lambda: agent.conditions.in_sync)
        snap = agent.snapshot()
    assert snap.condition("NeuronHealth").severity.value == "error"
    assert snap.condition("AcceleratedHardwareReady").status.value == "True"


def test_transient_errors_are_retried_without_changing_state(api, tmp_path):
    api.faults.add(method="PATCH", path_regex=r"/nodes/.*/status", status=429, count=1, retry_after=0)
    with Running(api, tmp_path, make_records([DMA_LINE])) as agent:
        wait_for(lambda: agent.conditions.in_sync and agent.conditions.writes >= 1, timeout=60)
    assert node_conditions_on(api)["NeuronHealth"]["status"] == "True"
    statuses = [r.status for r in api.requests.filter(method="PATCH", path_regex=r"/nodes/.*/status")]
    assert statuses[0] == 429 and statuses[-1] == 200


@pytest.mark.parametrize(("delete", "expect_present"), [((), True), (("OldNeuronCheck",), False)])
def test_deprecated_condition_is_deleted_only_when_asked(api, tmp_path, delete, expect_present):
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
    with Running(api, tmp_path, [], delete_conditions=delete) as agent:
        wait_for(lambda: agent.conditions.in_sync)
    assert ("OldNeuronCheck" in node_conditions_on(api)) is expect_present
