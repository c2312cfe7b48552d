"""``node-health-agent clear``: an operator's clear, with a boundary that holds across a restart.

End to end: the agent as a process in Kubernetes mode (the real client, the test API server), its kernel
log a kmsg-format file that stays in place across restarts as the kernel's ring buffer does; the CLI in
process through ``main``. ``device.refire_after_clear`` (issue 35) is what the restart asserts: 0."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from agent.app.cli import main
from agent.core.clears import CLEAR_REQUEST_ANNOTATION, CLEARS_ANNOTATION, parse_records

from helpers import wait_for
from kubeapi.server import KubeApiServer

pytestmark = pytest.mark.slow  # starts agent processes against the test API server

NODE = "ip-10-0-0-7.ec2.internal"
NS = "node-health-agent"
DMA = "NEURON_HW_ERR=DMA_ERROR instance-id=i-0592464924bd45322 hostname=ip-10-0-0-7 nd-id={nd} nc-id=1 action=RESET"


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    server.start()
    server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "status": {"conditions": []}})
    server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    server.put_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "agent-x",
                "namespace": NS,
                "labels": {"app.kubernetes.io/name": "node-health-agent", "app.kubernetes.io/component": "agent"},
            },
            "spec": {"nodeName": NODE, "containers": [{"name": "agent", "image": "a", "args": ["run"]}]},
        }
    )
    try:
        yield server
    finally:
        server.stop()


def usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


class Agent:
    def __init__(self, tmp: Path, api: KubeApiServer) -> None:
        self.tmp, self.api = tmp, api
        self.kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        self.kmsg = tmp / "kmsg"
        self.kmsg.write_text(f"6,1,{usec()},-;boot\n")
        self.seq = 1
        self.boot("boot-1")

    def boot(self, boot_id: str) -> None:
        (self.tmp / "boot_id").write_text(boot_id + "\n")

    def line(self, text: str) -> None:
        self.seq += 1
        with self.kmsg.open("a") as f:
            f.write(f"3,{self.seq},{usec()},-;{text}\n")

    def start(self) -> subprocess.Popen[str]:
        args = ["--kubeconfig", str(self.kubeconfig), "--node-name", NODE, "--kmsg-path", str(self.kmsg)]
        args += ["--state-dir", str(self.tmp / "state"), "--listen", "0", "--pack", "kernel", "--pack", "neuron"]
        args += ["--boot-id-file", str(self.tmp / "boot_id"), "--clear-poll", "1s"]
        return subprocess.Popen(
            [sys.executable, "-m", "agent", "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def neuron(self) -> dict:
        node = self.api.get_object("nodes", NODE)
        return {c["type"]: c for c in node["status"].get("conditions") or []}.get("NeuronHealth") or {}

    def clear(self, *extra: str) -> tuple[int, str]:
        out = io.StringIO()
        with redirect_stdout(out):
            code = main(["clear", "--kubeconfig", str(self.kubeconfig), "--namespace", NS, "--node", NODE, *extra])
        return code, out.getvalue()


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def true_then(agent: Agent, status: str) -> dict:
    return wait_for(lambda: (c := agent.neuron()).get("status") == status and c, timeout=60)


def test_a_clear_holds_across_a_restart_with_the_same_ring_and_a_new_line_fires_again(api, tmp_path):
    agent = Agent(tmp_path, api)
    agent.line(DMA.format(nd=0))
    proc = agent.start()
    try:
        true_then(agent, "True")
        code, out = agent.clear("--condition", "NeuronHealth", "--reason", "device replaced", "--by", "alice")
        assert code == 0, out
        assert "applied" in out and "boot boot-1, seq 2" in out
        true_then(agent, "False")
    finally:
        stop(proc)
    (record,) = parse_records(api.get_object("nodes", NODE)["metadata"]["annotations"][CLEARS_ANNOTATION])
    assert (record.request.by, record.request.reason, record.boot_id, record.seq) == (
        "alice",
        "device replaced",
        "boot-1",
        2,
    )

    proc = agent.start()  # the same ring: the DMA_ERROR line is replayed
    try:
        wait_for(lambda: api.requests.count(method="PATCH", path_regex=r"/nodes/.*/status") >= 3, timeout=60)
        time.sleep(2.0)
        refire_after_clear = int(agent.neuron().get("status") == "True")
        assert refire_after_clear == 0, agent.neuron()
        agent.line(DMA.format(nd=0))  # a new fault after the boundary fires as usual
        true_then(agent, "True")
    finally:
        stop(proc)


def test_a_new_boot_voids_the_boundary(api, tmp_path):
    agent = Agent(tmp_path, api)
    agent.line(DMA.format(nd=0))
    proc = agent.start()
    try:
        true_then(agent, "True")
        assert agent.clear("--condition", "NeuronHealth", "--reason", "checked")[0] == 0
        true_then(agent, "False")
    finally:
        stop(proc)
    agent.boot("boot-2")  # a new ring whose sequence numbers start again: the old boundary says nothing of it
    agent.kmsg.write_text(f"6,1,{usec()},-;boot\n3,2,{usec()},-;{DMA.format(nd=0)}\n")
    proc = agent.start()
    try:
        true_then(agent, "True")
    finally:
        stop(proc)


def test_clearing_one_of_two_failing_devices_leaves_the_other_holding_the_condition(api, tmp_path, capsys):
    agent = Agent(tmp_path, api)
    agent.line(DMA.format(nd=0))
    agent.line(DMA.format(nd=1))
    proc = agent.start()
    try:
        wait_for(lambda: "neuron1" in agent.neuron().get("message", ""), timeout=60)
        code, out = agent.clear("--condition", "NeuronHealth", "--device", "nd0", "--reason", "reseated")
        assert code == 0, out
        held = wait_for(lambda: (c := agent.neuron()) and "neuron0" not in c["message"] and c, timeout=60)
        assert held["status"] == "True" and "neuron1" in held["message"]
        code, out = agent.clear("--condition", "NeuronHealth", "--device", "neuron0", "--reason", "again")
        assert code == 2 and "device neuron0 is not failing" in capsys.readouterr().err  # refused, nothing written
    finally:
        stop(proc)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--condition", "Ready", "--reason", "x"], "not one the agent owns"),
        (["--condition", "NeuronHealth", "--reason", " "], "--reason"),
        (["--condition", "NeuronHealth", "--reason", "x"], "not failing"),
        (["--condition", "NeuronHealth", "--device", "neuron\x1b[2J", "--reason", "x", "--force"], "not a device"),
    ],
)
def test_refused_before_anything_is_written(api, tmp_path, capsys, args, message):
    node = api.get_object("nodes", NODE)
    node["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""},
        {"type": "NeuronHealth", "status": "False", "reason": "NeuronHealthy", "message": "ok"},
    ]
    api.put_object(node)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    code = main(["clear", "--kubeconfig", str(kubeconfig), "--namespace", NS, "--node", NODE, *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert CLEAR_REQUEST_ANNOTATION not in (api.get_object("nodes", NODE)["metadata"].get("annotations") or {})


def test_a_node_that_does_not_exist_is_refused(api, tmp_path, capsys):
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    code = main(["clear", "--kubeconfig", str(kubeconfig), "--node", "nope", "--condition", "X", "--reason", "y"])
    assert code == 2 and "nope" in capsys.readouterr().err


def test_without_an_agent_on_the_node_the_request_stays_pending(api, tmp_path, capsys):
    node = api.get_object("nodes", NODE)
    node["status"]["conditions"] = [{"type": "NeuronHealth", "status": "True", "reason": "R", "message": "m"}]
    api.put_object(node)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    args = ["clear", "--kubeconfig", str(kubeconfig), "--namespace", "elsewhere", "--node", NODE, "--reason", "r"]
    assert main(args) == 1
    assert "pending" in capsys.readouterr().out
    pending = json.loads(api.get_object("nodes", NODE)["metadata"]["annotations"][CLEAR_REQUEST_ANNOTATION])
    assert pending["condition"] == "NeuronHealth" and pending["reason"] == "r"
