"""The command line as users run it: simulate, validate-config, run --standalone (real processes)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from agent.app.cli import main

from helpers import free_port, kmsg_problem, wait_for

pytestmark = pytest.mark.slow  # starts agent processes

AGENT = [sys.executable, "-m", "agent"]


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_simulate_prints_one_json_object_per_finding(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(
        "Jan 14 22:15:17 node-1 kernel: [2437042.862382] hello world\n"
        "[  12.345678] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "test NEURON_HW_ERR=DMA_ERROR test\n"
    )
    proc = run_cli("simulate", str(log))
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(o["line"], o["rule"], o["type"], o["condition"], o["reason"]) for o in out] == [
        (2, "nvidia/xid-node", "permanent", "GpuXid", "GpuXid79"),
        (3, "neuron/hw-error", "permanent", "NeuronHealth", "NeuronHasError_DMA_ERROR"),
    ]
    assert out[0]["fields"] == {
        "pci": "0000:3b:00",
        "xid": 79,
        "pid": "<unknown>",
        "name": "<unknown>",
        "detail": "GPU has fallen off the bus.",
    }
    assert set(out[0]) == {"line", "rule", "type", "condition", "reason", "severity", "message", "fields"}


def test_simulate_reads_stdin_and_extra_config(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "source: mine\nrules:\n  - name: mine/hello\n    type: temporary\n    reason: Hello\n"
        "    pattern: 'hello (?P<who>\\w+)'\n"
    )
    proc = run_cli("simulate", "--config", str(extra), "-", stdin="say hello bob\n")
    assert proc.returncode == 0, proc.stderr
    (found,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert (found["rule"], found["type"], found["condition"], found["fields"]) == (
        "mine/hello",
        "temporary",
        None,
        {"who": "bob"},
    )


@pytest.mark.parametrize(
    ("args", "stderr_part"),
    [
        pytest.param(["simulate", "/nonexistent/file.log"], "cannot read /nonexistent/file.log", id="missing-input"),
        pytest.param(["simulate", "--config", "{bad}", "-"], "rules[0].pattern", id="bad-config"),
        pytest.param(["validate-config", "{bad}"], "rules[0].pattern", id="validate-bad"),
        pytest.param(["run", "--standalone", "--config", "{bad}"], "rules[0].pattern", id="run-bad-config"),
        pytest.param(["run", "--standalone", "--listen", "nonsense:port"], "--listen / NHA_LISTEN", id="bad-listen"),
        pytest.param(["run", "--standalone", "--lookback", "five"], "--lookback", id="bad-lookback"),
        pytest.param(["validate-config", "--pack", "nope"], "unknown built-in pack 'nope'", id="bad-pack"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(tmp_path, args, stderr_part):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - type: temporary\n    reason: Broken\n    pattern: '(unclosed'\n")
    args = [a.replace("{bad}", str(bad)) for a in args]
    proc = run_cli(*args, stdin="")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert stderr_part in proc.stderr
    if "rules[0].pattern" in stderr_part:
        assert f"{bad}:4" in proc.stderr, "YAML problems carry the line number"


def test_validate_config_summary():
    proc = run_cli("validate-config")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK: ")
    assert "kernel-monitor.yaml (rule pack)" in proc.stdout
    assert "neuron/checks.yaml (checks)" in proc.stdout
    assert "condition: NeuronHealth (healthy reason NeuronHasNoError)" in proc.stdout


def test_main_is_callable_in_process(capsys, tmp_path):
    log = tmp_path / "x.log"
    log.write_text("INFO: task docker:20744 blocked for more than 120 seconds.\n")
    assert main(["simulate", str(log)]) == 0
    reasons = [json.loads(line)["reason"] for line in capsys.readouterr().out.splitlines()]
    assert reasons == ["TaskHung", "DockerHung"]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _start_agent(kmsg: Path, state: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *AGENT,
            "run",
            "--standalone",
            "--kmsg-path",
            str(kmsg),
            "--state-dir",
            str(state),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str, float]:
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    return out, err, time.monotonic() - start


def _healthy(base: str) -> tuple[int, str] | None:
    status, body = _get(f"{base}/healthz")
    return (status, body) if status == 200 else None


def test_run_standalone_end_to_end_with_restart(tmp_path):
    """Records in a kmsg-format file → JSON transition lines, /conditions, /metrics, /healthz; a restart
    rebuilds the permanent condition from records already processed but does not repeat the Event."""
    kmsg = tmp_path / "kmsg"
    usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6) - 1_000_000  # recent: within the 5m lookback
    kmsg.write_text(
        f"6,1,{usec},-;hello\n"
        f"3,2,{usec + 1},-;NEURON_HW_ERR=DMA_ERROR instance-id=i-0abc hostname=ip-10-0-0-1 nd-id=3 nc-id=1 "
        "serial-num=19fcda00f5ff6eb9 action=TERMINATE_INSTANCE\n"
        f"4,3,{usec + 2},-;Killed process 1012 (python) total-vm:1kB, anon-rss:1kB, file-rss:1kB, shmem-rss:0kB\n"
    )
    state = tmp_path / "state"
    port = free_port()
    proc = _start_agent(kmsg, state, port)
    try:
        base = f"http://127.0.0.1:{port}"
        doc = wait_for(lambda: _conditions_with(base, "NeuronHealth", "True"))
        neuron = next(c for c in doc["conditions"] if c["type"] == "NeuronHealth")
        assert neuron["reason"] == "NeuronHasError_DMA_ERROR"
        assert neuron["fields"]["nd_id"] == 3
        # The server listens before the supervisor has started every thread: /healthz is 503 until it has.
        status, body = wait_for(lambda: _healthy(base))
        components = json.loads(body)["components"]
        assert status == 200, body
        assert components == {
            "kmsg_reader": True,
            "main_loop": True,
            "stdout": True,
            "http": True,
            "check_scheduler": True,
            "config_watcher": True,
        }
        metrics = _get(f"{base}/metrics")[1]
        assert 'problem_gauge{reason="NeuronHasError_DMA_ERROR",type="NeuronHealth"} 1.0' in metrics
        assert 'problem_counter{reason="OOMKilling"} 1.0' in metrics
        assert "node_health_agent_kmsg_records_read_total 3.0" in metrics
    finally:
        out, err, took = _stop(proc)
    assert proc.returncode == 0, err  # a clean shutdown on SIGTERM (the supervisor's shared deadline is tested apart)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(e["kind"], e["reason"]) for e in lines] == [
        ("condition", "NeuronHasError_DMA_ERROR"),
        ("event", "OOMKilling"),
    ]
    assert json.loads((state / "kmsg-cursor.json").read_text())["last_seq"] == 3

    # Restart: the same records are still in the "ring buffer". The condition is kept (state
    # directory) and rebuilt from the replay without a new transition; the OOM event (temporary,
    # already reported) is not repeated: nothing is printed twice.
    proc = _start_agent(kmsg, state, port)
    try:
        wait_for(lambda: _conditions_with(f"http://127.0.0.1:{port}", "NeuronHealth", "True"))
        wait_for(lambda: "node_health_agent_lines_matched_total 3.0" in _get(f"http://127.0.0.1:{port}/metrics")[1])
    finally:
        out, err, _ = _stop(proc)
    assert out.splitlines() == []


def _conditions_with(base: str, type_: str, status: str, reason: str | None = None):
    try:
        code, body = _get(f"{base}/conditions")
    except OSError:
        return None
    if code != 200:
        return None
    doc = json.loads(body)
    wanted = [c for c in doc["conditions"] if c["type"] == type_ and c["status"] == status]
    return doc if wanted and (reason is None or wanted[0]["reason"] == reason) else None


@pytest.mark.kmsg
@pytest.mark.skipif(kmsg_problem() is not None, reason=kmsg_problem() or "")
def test_real_dev_kmsg_line_is_detected(tmp_path):
    """A uniquely marked Neuron error written to the real /dev/kmsg becomes a condition."""
    port = free_port()
    marker = uuid.uuid4().hex.upper()  # a unique error type: earlier test lines may still be in the ring buffer
    proc = _start_agent(Path("/dev/kmsg"), tmp_path / "state", port)
    try:
        wait_for(lambda: _get(f"http://127.0.0.1:{port}/healthz")[0] == 200 if _port_open(port) else False)
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<3>NEURON_HW_ERR=NHA_TEST_{marker} nd-id=7 nc-id=0\n")
        reason = f"NeuronHasError_NHA_TEST_{marker}"
        doc = wait_for(lambda: _conditions_with(f"http://127.0.0.1:{port}", "NeuronHealth", "True", reason))
        neuron = next(c for c in doc["conditions"] if c["type"] == "NeuronHealth")
        assert neuron["fields"] == {"error": f"NHA_TEST_{marker}", "nd_id": 7, "nc_id": 0}
    finally:
        out, err, _ = _stop(proc)
    assert any(marker in line for line in out.splitlines()), (out, err)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("pattern", "warning"),
    [
        ("foo bar|baz qux", "top-level alternation: node-problem-detector releases before PR #1338 (August 2026)"),
        ("^start of line", "anchored at the start: node-problem-detector never matches it before its line buffer"),
        ("grouped (?:a b|c d) is fine", None),
        ("[|] and \\| are literal bars", None),
    ],
    ids=["alternation", "anchored", "grouped", "escaped"],
)
def test_validate_config_warns_where_npd_would_match_a_users_pattern_differently(tmp_path, capsys, pattern, warning):
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"rules:\n  - type: temporary\n    reason: R\n    pattern: '{pattern}'\n")
    assert main(["validate-config", "--pack", "kernel", str(rules)]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning:" in line]
    if warning is None:
        assert warnings == []
    else:
        assert warnings == [f"  warning: {rules}:4: rules[0].pattern: " + warnings[0].split(".pattern: ", 1)[1]]
        assert warning in warnings[0]


def test_an_empty_pattern_is_refused_saying_what_npd_would_do(tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - type: temporary\n    reason: R\n    pattern: ''\n")
    assert main(["validate-config", "--pack", "kernel", str(rules)]) == 2
    assert "must not be empty: node-problem-detector accepts an empty pattern and fires it on every line" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("command", ["run", "simulate", "check", "plugins", "validate-config"])
def test_pack_help_names_every_built_in_pack(command, capsys):
    from agent.app.settings import builtin_packs

    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    assert set(builtin_packs()) >= {"kernel", "neuron", "nvidia", "rdma"}
    for pack in builtin_packs():
        assert pack in out.split("--pack NAME", 1)[1], f"{command} --help omits pack {pack}"


def test_run_takes_a_config_directory_as_check_and_simulate_do(tmp_path):
    from agent.app.cli import build_parser
    from agent.app.config import load_agent_config
    from agent.app.settings import build_settings
    from agent.core.errors import ConfigError

    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "mine.yaml").write_text(
        "source: mine\nrules:\n  - {name: mine/x, type: temporary, reason: MineSeen, pattern: 'mine happened'}\n"
    )
    args = build_parser().parse_args(["run", "--standalone", "--pack", "kernel", "--config", str(extra)])
    settings = build_settings(args)
    config = load_agent_config(list(settings.rule_paths))
    assert "mine/x" in {r.name for r in config.rule_set.rules}
    args = build_parser().parse_args(["run", "--standalone", "--config", str(tmp_path / "missing")])
    with pytest.raises(ConfigError, match="no such file or directory"):
        build_settings(args)


def test_nha_config_adds_files_after_the_config_flags(tmp_path, monkeypatch):
    from agent.app.cli import build_parser
    from agent.app.settings import build_settings

    a, b, c = (tmp_path / n for n in ("a.yaml", "b", "c.json"))
    for path in (a, c):
        path.write_text("rules: []\n")
    b.mkdir()
    monkeypatch.setenv("NHA_CONFIG", f"{b}, {c}")
    settings = build_settings(build_parser().parse_args(["run", "--standalone", "--config", str(a)]))
    assert settings.config_files == (a, b, c)


@pytest.mark.parametrize(
    ("argv", "env", "served"),
    [
        (["run"], {}, False),  # Kubernetes mode: kernel-log text stays off the pod network unless asked for
        (["run", "--standalone"], {}, True),
        (["run"], {"NHA_SERVE_CONDITIONS": "true"}, True),
        (["run", "--serve-conditions", "true"], {}, True),
        (["run", "--standalone", "--serve-conditions", "false"], {}, False),
        (["run", "--standalone"], {"NHA_SERVE_CONDITIONS": "false"}, False),
    ],
)
def test_conditions_endpoint_default_follows_the_mode(monkeypatch, argv, env, served):
    from agent.app.cli import build_parser
    from agent.app.settings import build_settings

    for name in ("NHA_SERVE_CONDITIONS", "NHA_STANDALONE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert build_settings(build_parser().parse_args(argv)).serve_conditions is served


def test_a_bad_serve_conditions_value_exits_2():
    proc = run_cli("run", "--standalone", "--serve-conditions", "perhaps")
    assert proc.returncode == 2
    assert "--serve-conditions / NHA_SERVE_CONDITIONS" in proc.stderr
