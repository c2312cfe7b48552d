"""The executable check contract: exit 0 OK, 1 PROBLEM, anything else UNKNOWN; stdout is the message.

Real scripts written to tmp_path run through the real process runner; the only waiting is what
the scripts themselves do (a hang is cut at 0.3 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from agent.checks.executable import (
    MAX_OUTPUT_LENGTH,
    READ_LIMIT,
    UNKNOWN_REASON,
    ExecutableCheck,
    Verdict,
    cut_output,
)
from agent.checks.model import CheckResult, CheckStatus, ProcessResult
from agent.core import proctree
from agent.core.process import DEFAULT_PATH, OUTPUT_MAX, run_process
from agent.core.types import Severity

from helpers import finishes, process_gone, wait_for

OK, PROBLEM, UNKNOWN = CheckStatus.OK, CheckStatus.PROBLEM, CheckStatus.UNKNOWN
VERDICT = Verdict(condition="GpuCount", problem_reason="GpuCountBad", ok_reason="GpuCountGood")


def script(tmp_path: Path, body: str, *, name: str = "check.sh", mode: int = 0o755, shebang: str = "#!/bin/sh") -> Path:
    path = tmp_path / name
    path.write_text(f"{shebang}\n{body}\n" if shebang else f"{body}\n")
    path.chmod(mode)
    return path


def make_check(argv: list[str], *, timeout: float = 10.0, max_output_length: int = 80, **kwargs) -> ExecutableCheck:
    return ExecutableCheck(
        name="test/check",
        argv=argv,
        interval=60.0,
        timeout=timeout,
        verdicts=[VERDICT],
        max_output_length=max_output_length,
        **kwargs,
    )


def run_one(check: ExecutableCheck) -> CheckResult:
    (result,) = check.run()
    return result


# --- the exit-code protocol ----------------------------------------------------------------------

PROTOCOL = [
    pytest.param('echo "Expected 8 and found 8"; exit 0', OK, "GpuCountGood", "Expected 8 and found 8", id="exit-0-ok"),
    pytest.param(
        'echo "Expected to see 8 but found 7. FaultCode: NHC2009"; exit 1',
        PROBLEM,
        "GpuCountBad",
        "Expected to see 8 but found 7. FaultCode: NHC2009",
        id="exit-1-problem",
    ),
    pytest.param(
        "exit 1", PROBLEM, "GpuCountBad", "check.sh: exit code 1 (a problem, without a message)", id="exit-1-silent"
    ),
    pytest.param("exit 0", OK, "GpuCountGood", "check.sh: ok (exit code 0)", id="exit-0-silent"),
    pytest.param(
        'echo "nvidia-smi returned error code 9. FaultCode: NHCNA"; exit 2',
        UNKNOWN,
        UNKNOWN_REASON,
        "check.sh: exit code 2: nvidia-smi returned error code 9. FaultCode: NHCNA",
        id="exit-2-unknown",
    ),
    pytest.param(
        "echo 'cannot open /dev/nvidiactl' >&2; exit 3",
        UNKNOWN,
        UNKNOWN_REASON,
        "check.sh: exit code 3: cannot open /dev/nvidiactl",
        id="exit-3-stderr-named",
    ),
    pytest.param(
        "exit 137",
        UNKNOWN,
        UNKNOWN_REASON,
        "check.sh: exit code 137 (128+9: something it ran was killed by SIGKILL?)",
        id="exit-137-unknown",
    ),
    pytest.param("kill -9 $$", UNKNOWN, UNKNOWN_REASON, "check.sh: killed by signal 9", id="sigkill-unknown"),
    pytest.param("kill -TERM $$", UNKNOWN, UNKNOWN_REASON, "check.sh: killed by signal 15", id="sigterm-unknown"),
    pytest.param(
        'printf "\\n\\n   GPU 0 ok  \\n\\n  GPU 1 ok\\n\\n"; exit 0',
        OK,
        "GpuCountGood",
        "GPU 0 ok; GPU 1 ok",
        id="output-trimmed-one-line",
    ),
]


@pytest.mark.parametrize(("body", "status", "reason", "message"), PROTOCOL)
def test_exit_code_protocol(tmp_path: Path, body: str, status: CheckStatus, reason: str, message: str) -> None:
    result = run_one(make_check([str(script(tmp_path, body))]))
    assert (result.status, result.reason, result.message) == (status, reason, message)
    assert result.condition == "GpuCount"


# --- programs that cannot run ---------------------------------------------------------------------


def test_not_executable(tmp_path: Path) -> None:
    path = script(tmp_path, "exit 0", mode=0o644)
    result = run_one(make_check([str(path)]))
    assert (result.status, result.message) == (UNKNOWN, "check.sh: not executable (permission denied)")


def test_does_not_exist(tmp_path: Path) -> None:
    result = run_one(make_check([str(tmp_path / "check_gpu_count.sh")]))
    assert (result.status, result.message) == (UNKNOWN, "check_gpu_count.sh: no such file")


def test_directory(tmp_path: Path) -> None:
    (tmp_path / "plugin").mkdir()
    result = run_one(make_check([str(tmp_path / "plugin")]))
    assert (result.status, result.message) == (UNKNOWN, "plugin: is a directory")


def test_script_without_shebang_line(tmp_path: Path) -> None:
    path = script(tmp_path, "echo hello; exit 0", shebang="")
    result = run_one(make_check([str(path)]))
    assert result.status is UNKNOWN
    assert result.message == "check.sh: cannot start: exec format error (a script without #! line?)"


# --- time and output bounds -------------------------------------------------------------------------


def test_hang_past_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    path = script(tmp_path, 'sleep 60 &\necho $! > "$1"\necho started\nsleep 60', name="check_gpu.sh")
    check = make_check([str(path), str(pid_file)], timeout=0.3)
    execution = check.execute()
    assert execution.status is UNKNOWN
    assert re.fullmatch(r"check_gpu\.sh: timed out after 0\.\ds \(killed\)", execution.message), execution.message
    assert execution.process.timed_out
    child = int(pid_file.read_text())
    wait_for(lambda: process_gone(child), timeout=5.0)


def test_background_child_left_behind_on_exit_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    path = script(tmp_path, 'sleep 60 &\necho $! > "$1"\necho "all good"\nexit 0')
    result = run_one(make_check([str(path), str(pid_file)]))
    assert (result.status, result.message) == (OK, "all good")
    child = int(pid_file.read_text())
    wait_for(lambda: process_gone(child), timeout=5.0)


# A child that leaves the run's process group with setsid (a daemonizing double fork): the intermediate
# shell exits at once, so the grandchild is an orphan in a session of its own.
ESCAPE = 'setsid sh -c \'sleep 300 & echo $! > "$1"\' sh "$1"'


def gone_and_reaped(pid: int) -> bool:
    """Dead, and not left a zombie: the agent (the subreaper of its runs) waited for it."""
    return not Path(f"/proc/{pid}").exists() if proctree.become_subreaper() else process_gone(pid)


@pytest.mark.parametrize(
    ("body", "timeout", "status"),
    [
        pytest.param(f"{ESCAPE}\necho fine\nexit 0", 10.0, OK, id="after-exit"),
        pytest.param(f"{ESCAPE}\nsleep 60", 0.5, UNKNOWN, id="at-timeout"),
        pytest.param(f"env -i {ESCAPE}\nexit 1", 10.0, PROBLEM, id="environment-cleared"),
    ],
)
def test_a_setsid_grandchild_is_killed_with_the_run(tmp_path: Path, body: str, timeout: float, status) -> None:
    pid_file = tmp_path / "grandchild.pid"
    result = run_one(make_check([str(script(tmp_path, body)), str(pid_file)], timeout=timeout))
    assert result.status is status
    grandchild = int(pid_file.read_text())
    wait_for(lambda: gone_and_reaped(grandchild), timeout=5.0)  # on the old code it lives on (300 s)


def test_a_run_ending_leaves_a_helper_of_another_run_in_flight_alone(tmp_path: Path) -> None:
    helper_file, done = tmp_path / "helper.pid", tmp_path / "other-run-done"
    waits_for_the_other_run = f"""{ESCAPE}
for i in $(seq 200); do [ -e "$2" ] && break; sleep 0.05; done
kill -0 "$(cat "$1")" && echo "helper alive" && exit 0
echo "helper killed"; exit 1"""
    long = script(tmp_path, waits_for_the_other_run, name="long.sh")
    results: list[ProcessResult] = []
    thread = threading.Thread(
        target=lambda: results.append(run_process([str(long), str(helper_file), str(done)], timeout=30))
    )
    thread.start()
    try:
        wait_for(lambda: helper_file.exists() and helper_file.read_text().strip())
        helper = int(helper_file.read_text())
        other = run_process(
            [str(script(tmp_path, f"{ESCAPE}\nexit 0", name="short.sh")), str(tmp_path / "x.pid")], timeout=10
        )
        assert other.exit_code == 0  # this run's own grandchild was killed at its end; not the long run's helper
        wait_for(lambda: gone_and_reaped(int((tmp_path / "x.pid").read_text())), timeout=5.0)
        done.touch()
    finally:
        thread.join(30)
    assert (results[0].exit_code, results[0].stdout) == (0, "helper alive\n")
    wait_for(lambda: gone_and_reaped(helper), timeout=5.0)  # killed when its own run ended


def test_the_reaper_never_takes_a_child_someone_else_waits_for(tmp_path: Path) -> None:
    """A child in the agent's own session (started by someone else), and one started through proctree.start
    (waited for by its owner), keep their exit status for their owner: only adopted orphans are reaped."""
    proctree.become_subreaper()
    own_session = subprocess.Popen(["sh", "-c", "exit 3"])
    started = proctree.start(["sh", "-c", "exit 4"], env={"PATH": DEFAULT_PATH})
    wait_for(lambda: all(proctree.processes()[p.pid].zombie for p in (own_session, started)))
    proctree.reap_adopted()
    assert own_session.wait() == 3 and proctree.wait(started) == 4


def test_ten_megabytes_of_output(tmp_path: Path) -> None:
    path = script(tmp_path, "head -c 10485760 /dev/zero | tr '\\0' x\nexit 1")
    execution = make_check([str(path)], timeout=60.0).execute()
    assert execution.status is PROBLEM  # finished on its own, long before the timeout
    assert execution.message == "x" * 80
    assert execution.process.stdout_truncated
    assert len(execution.process.stdout) <= READ_LIMIT  # the rest was read and dropped


def test_the_runner_keeps_at_most_one_mebibyte_whatever_it_is_asked(tmp_path: Path) -> None:
    path = script(tmp_path, "head -c 20971520 /dev/zero | tr '\\0' x")
    result = run_process([str(path)], timeout=60.0, max_output=100 * 1024 * 1024)
    assert result.exit_code == 0 and result.stdout_truncated
    assert len(result.stdout) == OUTPUT_MAX  # on the old code: all 20 MiB were kept


@pytest.mark.parametrize("length", [0, MAX_OUTPUT_LENGTH + 1, 100_000_000])
def test_max_output_length_is_bounded_by_what_is_kept(length: int) -> None:
    with pytest.raises(ValueError, match=f"max_output_length must be from 1 to {MAX_OUTPUT_LENGTH} bytes"):
        make_check(["/bin/true"], max_output_length=length)


def test_binary_garbage_output_is_replaced(tmp_path: Path) -> None:
    path = script(tmp_path, "printf '\\377\\376\\000GPU\\300 lost'\nexit 1")
    result = run_one(make_check([str(path)]))
    assert (result.status, result.message) == (PROBLEM, "\ufffd\ufffd\ufffdGPU\ufffd lost")


@pytest.mark.parametrize(
    ("limit", "printed", "message"),
    [
        pytest.param(80, "a" * 100, "a" * 80, id="default-80-bytes"),
        pytest.param(10, "0123456789abc", "0123456789", id="custom-limit"),
        pytest.param(5, "ééé", "éé", id="never-inside-a-character"),
        pytest.param(8, "   padded   ", "padded", id="trimmed-before-cut"),
    ],
)
def test_message_cut_to_max_output_length_bytes(tmp_path: Path, limit: int, printed: str, message: str) -> None:
    path = script(tmp_path, f"printf '%s' '{printed}'\nexit 1")
    result = run_one(make_check([str(path)], max_output_length=limit))
    assert result.message == message


# --- how the program runs ---------------------------------------------------------------------------


def test_environment_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("HOME", "/root")
    path = script(tmp_path, "exec env")
    check = make_check([str(path)], cwd=tmp_path, tool_path="/usr/bin:/bin")
    env = dict(line.split("=", 1) for line in check.execute().process.stdout.splitlines())
    # The run's mark, which finds what it leaves behind (see agent.core.proctree): this agent's pid, a number.
    assert re.fullmatch(rf"{os.getpid()}-\d+", env.pop("NODE_HEALTH_AGENT_RUN"))
    # The shell itself exports PWD (the working directory it was started in); nothing else is added.
    assert env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PWD": str(tmp_path.resolve())}


def test_arguments_are_not_interpreted_by_a_shell(tmp_path: Path) -> None:
    path = script(tmp_path, "printf '[%s]' \"$@\"\nexit 0")
    args = ["$HOME", "a; touch pwned", "`id`", "*", "two words"]
    result = run_one(make_check([str(path), *args], max_output_length=200))
    assert result.message == "[$HOME][a; touch pwned][`id`][*][two words]"
    assert not (tmp_path / "pwned").exists()


def test_runs_in_the_given_working_directory(tmp_path: Path) -> None:
    (tmp_path / "var" / "log").mkdir(parents=True)
    (tmp_path / "var" / "log" / "syslog").write_text("quiet\n")
    path = script(tmp_path, "cat var/log/syslog; exit 0")  # a relative path, as check_gpu_xid.sh reads
    assert run_one(make_check([str(path)], cwd=tmp_path)).message == "quiet"


# --- one execution, several verdicts; the runner seam -------------------------------------------------


def fake_runner(result: ProcessResult, calls: list[dict]):
    def run(argv, **kwargs):
        calls.append({"argv": tuple(argv), **kwargs})
        return result

    return run


@pytest.mark.parametrize(
    ("process", "statuses", "reasons", "messages"),
    [
        pytest.param(
            ProcessResult(argv=("/p/x.sh",), exit_code=1, stdout="GPU 3 missing\n"),
            (PROBLEM, PROBLEM),
            ("GpuCountBad", "GpuCountBad"),
            ("GPU 3 missing", "GPU 3 missing"),
            id="problem-feeds-both",
        ),
        pytest.param(
            ProcessResult(argv=("/p/x.sh",), exit_code=0, stdout="Expected 8 and found 8"),
            (OK, OK),
            ("GpuCountBad", "GpuCountGood"),
            ("Expected 8 and found 8", "GPU count is correct"),
            id="ok-warning-keeps-output-condition-takes-default",
        ),
        pytest.param(
            ProcessResult(argv=("/p/x.sh",), exit_code=None, timed_out=True, duration=10.02),
            (UNKNOWN, UNKNOWN),
            (UNKNOWN_REASON, UNKNOWN_REASON),
            ("x.sh: timed out after 10.0s (killed)", "x.sh: timed out after 10.0s (killed)"),
            id="unknown-is-unknown-for-both",
        ),
    ],
)
def test_one_execution_feeds_every_verdict(process, statuses, reasons, messages) -> None:
    calls: list[dict] = []
    check = ExecutableCheck(
        name="custom-plugin-gpu-count/gpu-count-bad",
        argv=["/p/x.sh", "--expected", "8"],
        interval=60.0,
        timeout=10.0,
        verdicts=[
            Verdict(
                condition=None,
                problem_reason="GpuCountBad",
                ok_reason="GpuCountBad",
                severity=Severity.WARNING,
                repeat_event=True,
            ),
            Verdict(
                condition="GpuCount",
                problem_reason="GpuCountBad",
                ok_reason="GpuCountGood",
                ok_message="GPU count is correct",
            ),
        ],
        cwd=Path("/"),
        run_process=fake_runner(process, calls),
    )
    results = check.run()
    assert tuple(r.status for r in results) == statuses
    assert tuple(r.reason for r in results) == reasons
    assert tuple(r.message for r in results) == messages
    assert [(r.condition, r.severity, r.repeat_event) for r in results] == [
        (None, Severity.WARNING, True),
        ("GpuCount", Severity.ERROR, False),
    ]
    assert calls == [
        {
            "argv": ("/p/x.sh", "--expected", "8"),
            "timeout": 10.0,
            "max_output": READ_LIMIT,
            "path": DEFAULT_PATH,
            "cwd": "/",
        }
    ]


def test_check_protocol_attributes() -> None:
    from agent.checks.model import Check

    check = make_check(["/bin/true"])
    assert isinstance(check, Check)
    assert (check.name, check.interval, check.timeout, check.conditions) == ("test/check", 60.0, 10.0, ())


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        pytest.param("  one  \n\n two \r\n", 80, "one; two", id="lines-joined"),
        pytest.param("a\x00b\x1bc", 80, "a\ufffdb\ufffdc", id="control-characters-replaced"),
        pytest.param("tab\there", 80, "tab\there", id="tab-kept"),
        pytest.param("x" * 81, 80, "x" * 80, id="cut"),
        pytest.param("", 80, "", id="empty"),
    ],
)
def test_cut_output(text: str, limit: int, expected: str) -> None:
    assert cut_output(text, limit=limit) == expected


# --- the runner's working directory ------------------------------------------------------------------


def test_runner_relative_program_is_looked_up_in_cwd(tmp_path: Path) -> None:
    from agent.core.process import run_process

    (tmp_path / "plugin").mkdir()
    script(tmp_path / "plugin", "echo ran; exit 0", name="x.sh")
    result = run_process(["./plugin/x.sh"], timeout=5.0, cwd=str(tmp_path))
    assert (result.error, result.stdout) == (None, "ran\n")


def test_runner_names_a_missing_working_directory(tmp_path: Path) -> None:
    from agent.core.process import run_process

    result = run_process(["/bin/true"], timeout=5.0, cwd=str(tmp_path / "gone"))
    assert result.error is not None and "working directory" in result.error


def test_runner_cancel_kills_the_process_group_at_once(tmp_path: Path) -> None:
    """When the agent stops, a plugin still running is killed with everything it started."""
    import threading

    from agent.core.process import run_process

    pidfile = tmp_path / "child.pid"
    prog = script(tmp_path, f"sleep 1000 & echo $! > {pidfile}; sleep 1000")
    cancel = threading.Event()

    def stop_once_running() -> None:
        try:
            wait_for(pidfile.exists, timeout=60)
        finally:
            cancel.set()

    timer = threading.Thread(target=stop_once_running)
    timer.start()
    # Its own timeout is an hour: only the cancel can end it; a cancel that kills nothing hangs the run.
    result = finishes(lambda: run_process([str(prog)], timeout=3600.0, cancel=cancel), what="the cancelled plugin run")
    timer.join()
    assert result.error == "cancelled: the agent is stopping (process group killed)"
    assert not result.timed_out  # ended by the cancel, not by its own timeout
    child = int(pidfile.read_text())
    wait_for(lambda: process_gone(child), timeout=30)
