"""Faults an operator, a reviewer or an attacker hit from outside: each was reproduced and fixed.

Real processes (``python -m agent``), real files and sockets; waits are bounded, never timed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import wait_for

pytestmark = pytest.mark.slow  # starts agent processes

AGENT = [sys.executable, "-m", "agent"]


def run_cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT, *args], capture_output=True, text=True, timeout=60, env=env, **kw)


def recent_usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6) - 1_000_000


# ---- configuration and CLI: exit 2 with a clear message, never a traceback ---------------------


@pytest.mark.parametrize(
    ("args", "env", "stderr_part"),
    [
        pytest.param(["run"], {"NHA_STANDALONE": "yes-please"}, "--standalone / NHA_STANDALONE", id="bad-bool-env"),
        pytest.param(
            ["run", "--standalone", "--event-namespace", "kube-system"],
            {},
            "must be 'default'",
            id="event-namespace",
        ),
        pytest.param(["simulate", "{dir}"], {}, "is a directory", id="simulate-directory"),
        pytest.param(
            ["run", "--standalone", "--aggregate-condition", "maybe"], {}, "--aggregate-condition", id="bad-bool-flag"
        ),
    ],
)
def test_bad_input_exits_2(tmp_path, args, env, stderr_part):
    args = [a.replace("{dir}", str(tmp_path)) for a in args]
    proc = run_cli(*args, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert stderr_part in proc.stderr
    assert "Traceback" not in proc.stderr


def test_simulate_with_stdin_closed_exits_2(tmp_path):
    proc = subprocess.run(
        [*AGENT, "simulate", "-"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        close_fds=True,
        preexec_fn=lambda: os.close(0),
    )
    assert proc.returncode == 2, proc.stderr
    assert "no standard input" in proc.stderr and "Traceback" not in proc.stderr


def test_log_level_is_accepted_after_the_subcommand():
    proc = run_cli("validate-config", "--log-level", "debug")
    assert proc.returncode == 0, proc.stderr


def test_validate_config_into_a_closed_pipe_has_no_traceback():
    proc = subprocess.run(
        f"{sys.executable} -m agent validate-config | head -1", shell=True, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.startswith("OK:")
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


# ---- a running standalone agent --------------------------------------------------------------


class Agent:
    """``run --standalone`` on any free port (``127.0.0.1:0``); the port is read from its log."""

    def __init__(self, tmp_path: Path, *args: str, kmsg: Path | None = None, state: Path | None = None):
        self.kmsg = kmsg or tmp_path / "kmsg"
        self.state = state or tmp_path / "state"
        self.proc = subprocess.Popen(
            [
                *AGENT,
                "run",
                "--standalone",
                "--kmsg-path",
                str(self.kmsg),
                "--state-dir",
                str(self.state),
                "--listen",
                "127.0.0.1:0",
                "--stall-timeout",
                "1s",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.err_lines: list[str] = []
        self.port = wait_for(self._port)

    def _port(self) -> int | None:
        line = self.proc.stderr.readline()
        self.err_lines.append(line)
        if "serving /metrics" in line:
            return int(line.rsplit(":", 1)[1])
        if not line and self.proc.poll() is not None:
            raise AssertionError("agent exited: " + "".join(self.err_lines))
        return None

    def get(self, path: str) -> tuple[int, dict | str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                status, body = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read().decode()
        return status, (json.loads(body) if body.startswith("{") else body)

    def stop(self, sig: int = signal.SIGTERM) -> tuple[str, str]:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=15)
        return out, "".join(self.err_lines) + err


def test_listen_on_any_free_port(tmp_path):
    (tmp_path / "kmsg").write_text("")
    agent = Agent(tmp_path)
    try:
        assert agent.port > 0 and agent.get("/healthz")[0] in (200, 503)
    finally:
        agent.stop()


@pytest.mark.parametrize("broken", ["missing", "unreadable-directory"])
def test_healthz_turns_red_when_the_kernel_log_cannot_be_read(tmp_path, broken):
    """node-problem-detector's bug that we fix: liveness must not stay green while blind."""
    kmsg = tmp_path / "kmsg"
    if broken == "unreadable-directory":
        kmsg.mkdir()  # opening a directory for reading kmsg fails every time, like EPERM does
    agent = Agent(tmp_path, kmsg=kmsg)
    try:
        status, body = wait_for(lambda: (r := agent.get("/healthz"))[0] == 503 and "details" in r[1] and r)
        assert body["components"]["kmsg_reader"] is False
        assert str(kmsg) in body["details"]["kmsg_reader"]
        assert 'node_health_agent_component_healthy{component="kmsg_reader"} 0.0' in agent.get("/metrics")[1]
    finally:
        agent.stop()


def test_unwritable_state_dir_is_reported_but_liveness_stays_green(tmp_path):
    (tmp_path / "kmsg").write_text(f"6,1,{recent_usec()},-;hello\n")
    state = tmp_path / "state-is-a-file"
    state.write_text("")
    agent = Agent(tmp_path, state=state)
    try:
        status, body = wait_for(lambda: (r := agent.get("/healthz"))[0] == 200 and r)
        assert body["stateDir"]["ok"] is False and body["stateDir"]["problems"]
        assert "node_health_agent_state_dir_ok 0.0" in agent.get("/metrics")[1]
    finally:
        _, err = agent.stop()
    said = [
        line.split(f"state directory {state}: ", 1)[1]
        for line in err.splitlines()
        if f"state directory {state}: " in line
    ]
    parts = [what.split(": [Errno", 1)[0].split(": File exists", 1)[0] for what in said]  # "cannot read <file>"
    assert parts and len(parts) == len(set(parts)), f"one log line per broken part, not one per write: {parts}"


def test_cursor_that_is_a_directory_is_reported(tmp_path):
    (tmp_path / "kmsg").write_text(f"6,1,{recent_usec()},-;hello\n")
    (tmp_path / "state" / "kmsg-cursor.json").mkdir(parents=True)
    agent = Agent(tmp_path)
    try:
        _, body = wait_for(lambda: (r := agent.get("/healthz"))[0] == 200 and r)
        assert "cursor" in body["stateDir"]["problems"]
    finally:
        agent.stop()


def test_a_record_with_a_huge_timestamp_does_not_break_the_output(tmp_path):
    (tmp_path / "kmsg").write_text("3,1,99999999999999999999,-;test NEURON_HW_ERR=DMA_ERROR test\n")
    agent = Agent(tmp_path)
    try:
        wait_for(
            lambda: (
                agent.get("/conditions")[1]["conditions"][0]
                and any(c["status"] == "True" for c in agent.get("/conditions")[1]["conditions"])
            )
        )
    finally:
        out, err = agent.stop()
    assert agent.proc.returncode == 0, err
    assert [json.loads(line)["reason"] for line in out.splitlines()] == ["NeuronHasError_DMA_ERROR"]


def test_sigkill_mid_incident_loses_no_event(tmp_path):
    """SIGKILL right after detection: the Event is printed on restart if it was not before."""
    (tmp_path / "kmsg").write_text(f"3,1,{recent_usec()},-;test NEURON_HW_ERR=DMA_ERROR test\n")
    agent = Agent(tmp_path)
    try:
        wait_for(lambda: any(c["status"] == "True" for c in agent.get("/conditions")[1]["conditions"]))
    finally:
        first, _ = agent.stop(signal.SIGKILL)
    agent = Agent(tmp_path)
    try:
        wait_for(lambda: "node_health_agent_lines_matched_total 1.0" in agent.get("/metrics")[1])
    finally:
        second, _ = agent.stop()
    printed = [json.loads(line)["reason"] for line in (first + second).splitlines()]
    assert printed.count("NeuronHasError_DMA_ERROR") >= 1
