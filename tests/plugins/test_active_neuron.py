"""The active Neuron checks: nccom-test bandwidth and Neuron Observer's health check, with a fake runner.

nccom-test's fixture is the Neuron docs' example output (tests/fixtures/active/, source in its header).
No published ``nobs health run`` output was found: its cases are CONSTRUCTED from the outcome words of the
Neuron docs (tools/neuron-observer/health-check.rst: passed, failed, timeout, device_busy) in the forms the
parser assumes (plugins/neuron/active.py says which).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.checks.builtin import import_builtin
from agent.sdk import CheckConfigError, CheckContext, CheckStatus, ProcessResult

active = import_builtin("neuron.active")
NccomParseError, NccomTestCheck, parse_nccom = active.NccomParseError, active.NccomTestCheck, active.parse_nccom
NobsHealthCheck, NobsParseError, parse_nobs = active.NobsHealthCheck, active.NobsParseError, active.parse_nobs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "active"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text().split("---8<---\n", 1)[1]


class Runner:
    """A fake CheckContext.run_process: answers by program name, records what it was asked."""

    def __init__(self, answers: dict[str, ProcessResult | Callable[[tuple[str, ...]], ProcessResult]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float, max_output: int = 0, path: str = "") -> ProcessResult:
        argv = tuple(argv)
        self.calls.append(argv)
        answer = self.answers.get(argv[0])
        if answer is None:
            return ProcessResult(argv=argv, exit_code=None, error=f"not found in PATH ({path})")
        return answer(argv) if callable(answer) else answer


def ran(stdout: str = "", *, exit_code: int = 0, **kw: Any) -> ProcessResult:
    return ProcessResult(argv=("tool",), exit_code=exit_code, stdout=stdout, **kw)


def host(tmp_path: Path, count: int) -> CheckContext:
    """A host with ``count`` Neuron devices in sysfs and /dev (the documented layout)."""
    for i in range(count):
        (tmp_path / "sys" / "devices" / "virtual" / "neuron_device" / f"neuron{i}").mkdir(parents=True)
        (tmp_path / "dev").mkdir(exist_ok=True)
        (tmp_path / "dev" / f"neuron{i}").touch()
    (tmp_path / "sys").mkdir(exist_ok=True)
    (tmp_path / "dev").mkdir(exist_ok=True)
    return CheckContext(sys_root=tmp_path / "sys", dev_root=tmp_path / "dev")


def with_runner(ctx: CheckContext, runner: Runner) -> CheckContext:
    return CheckContext(sys_root=ctx.sys_root, dev_root=ctx.dev_root, run_process=runner)


# Constructed from the neuron-ls -j format (neuron-ls.rst; a trn2 device has nc_count 4 with LNC 2).
NEURON_LS_TWO = json.dumps([{"neuron_device": 0, "nc_count": 4}, {"neuron_device": 1, "nc_count": 4}])


# --- nccom-test -------------------------------------------------------------------------------------------


def test_nccom_docs_output_is_read() -> None:
    report = parse_nccom(recorded("nccom-test-allr-neuron-docs.txt"))
    assert [(r.size, r.busbw) for r in report.rows] == [(33554432, 40.69)]
    assert report.avg_busbw == pytest.approx(40.6901)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "no table header"),
        ("     size(B)    count(elems)     type    time(us)    algbw(GB/s)    busbw(GB/s)\n", "Avg bus bandwidth"),
        (
            "     size(B)    count(elems)     type    time(us)    algbw(GB/s)    busbw(GB/s)\n"
            "Avg bus bandwidth: 1GB/s\n",
            "no result rows",
        ),
    ],
)
def test_nccom_garbage_is_a_parse_error(text: str, complaint: str) -> None:
    with pytest.raises(NccomParseError, match=complaint):
        parse_nccom(text)


def nccom(ctx: CheckContext, runner: Runner, **options: Any) -> NccomTestCheck:
    return NccomTestCheck(name="nccom-test", context=with_runner(ctx, runner), options=options)


def test_nccom_runs_on_every_neuroncore_and_covers_every_device(tmp_path: Path) -> None:
    runner = Runner({"neuron-ls": ran(NEURON_LS_TWO), "nccom-test": ran(recorded("nccom-test-allr-neuron-docs.txt"))})
    (result,) = nccom(host(tmp_path, 2), runner).run()
    assert runner.calls[-1] == ("nccom-test", "-r", "8", "allr")
    assert (result.status, result.reason) == (CheckStatus.OK, "NccomTestRan")
    assert result.devices == ("neuron:neuron0", "neuron:neuron1")
    assert result.values[0].value == pytest.approx(40.6901)


@pytest.mark.parametrize(
    ("floor", "status", "reason"),
    [(40, CheckStatus.OK, "NccomBandwidthGood"), (41, CheckStatus.PROBLEM, "NccomBandwidthLow")],
)
def test_nccom_floor(tmp_path: Path, floor: float, status: CheckStatus, reason: str) -> None:
    runner = Runner({"nccom-test": ran(recorded("nccom-test-allr-neuron-docs.txt"))})
    (result,) = nccom(host(tmp_path, 1), runner, ranks=2, busbwFloor=floor).run()
    assert runner.calls == [("nccom-test", "-r", "2", "allr")]
    assert (result.status, result.reason) == (status, reason)


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        ({"neuron-ls": ran(NEURON_LS_TWO)}, "ToolMissing"),
        ({}, "NeuronCoresUnknown"),  # no neuron-ls either, no ranks option
        (
            {
                "neuron-ls": ran(NEURON_LS_TWO),
                "nccom-test": ProcessResult(argv=("nccom-test",), exit_code=-9, timed_out=True),
            },
            "Timeout",
        ),
        (
            {"neuron-ls": ran(NEURON_LS_TWO), "nccom-test": ran("ERROR: nrt_init failed", exit_code=1)},
            "OutputUnparsable",
        ),
    ],
)
def test_nccom_without_a_reading_is_unknown(tmp_path: Path, answers: dict[str, ProcessResult], reason: str) -> None:
    (result,) = nccom(host(tmp_path, 2), Runner(answers)).run()
    assert (result.status, result.reason) == (CheckStatus.UNKNOWN, reason)


@pytest.mark.parametrize(
    ("options", "field"), [({"ranks": 0}, "ranks"), ({"busbwFloor": -1}, "busbwFloor"), ({"x": 1}, "x")]
)
def test_nccom_bad_options_name_the_option(tmp_path: Path, options: dict[str, Any], field: str) -> None:
    with pytest.raises(CheckConfigError) as caught:
        nccom(host(tmp_path, 0), Runner({}), **options)
    assert caught.value.field == field


# --- nobs health run (constructed outputs: see the module docstring) --------------------------------------


@pytest.mark.parametrize(
    ("text", "outcome", "devices"),
    [
        ("Health check started\nWaiting for completion...\noutcome: passed\n", "passed", {}),
        ("status=failed\n", "failed", {}),
        ("timeout\n", "timeout", {}),
        ("Health check result: device_busy\n", "device_busy", {}),
        ("neuron0: passed\nneuron1: failed\nneuron2: passed\n", "failed", {0: "passed", 1: "failed", 2: "passed"}),
        ("device 3: device_busy\ndevice 4: passed\n", "device_busy", {3: "device_busy", 4: "passed"}),
        ('{"outcome": "passed"}', "passed", {}),
        (
            '{"devices": [{"device": 0, "status": "passed"}, {"device": 1, "status": "failed"}]}',
            "failed",
            {0: "passed", 1: "failed"},
        ),
    ],
)
def test_nobs_outcomes(text: str, outcome: str, devices: dict[int, str]) -> None:
    report = parse_nobs(text)
    assert (report.outcome, dict(report.devices)) == (outcome, devices)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Starting health check\n",
        "3 passed, 0 failed in 12s\n",
        "Results: 3 passed, 0 failed\n",
        '{"state": "done"}',
        "{not json",
    ],
)
def test_nobs_without_an_outcome_is_a_parse_error(text: str) -> None:
    with pytest.raises(NobsParseError):
        parse_nobs(text)


def nobs(ctx: CheckContext, runner: Runner) -> NobsHealthCheck:
    return NobsHealthCheck(name="nobs-health", context=with_runner(ctx, runner), options={})


@pytest.mark.parametrize(
    ("answer", "status", "reason"),
    [
        (ran("outcome: passed\n"), CheckStatus.OK, "NobsHealthPassed"),
        (ran("outcome: failed\n", exit_code=1), CheckStatus.PROBLEM, "NobsHealthFailed"),
        (ran("outcome: timeout\n", exit_code=1), CheckStatus.UNKNOWN, "Timeout"),
        (ran("outcome: device_busy\n", exit_code=1), CheckStatus.UNKNOWN, "DeviceBusy"),  # busy is a skip, never a fail
        (None, CheckStatus.UNKNOWN, "ToolMissing"),
        (ProcessResult(argv=("nobs",), exit_code=-9, timed_out=True), CheckStatus.UNKNOWN, "Timeout"),
        (
            ran("error: cannot connect to the Neuron Observer daemon\n", exit_code=1),
            CheckStatus.UNKNOWN,
            "OutputUnparsable",
        ),
    ],
)
def test_nobs_verdicts_for_the_node(
    tmp_path: Path, answer: ProcessResult | None, status: CheckStatus, reason: str
) -> None:
    runner = Runner({} if answer is None else {"nobs": answer})
    results = nobs(host(tmp_path, 2), runner).run()
    assert [(r.status, r.reason) for r in results] == [(status, reason)]
    if answer is not None and status is not CheckStatus.UNKNOWN:
        assert runner.calls == [("nobs", "health", "run")]
        assert results[0].devices == ("neuron:neuron0", "neuron:neuron1")


def test_nobs_per_device_outcomes_become_per_device_verdicts(tmp_path: Path) -> None:
    runner = Runner({"nobs": ran("neuron0: passed\nneuron1: failed\nneuron2: device_busy\n", exit_code=1)})
    results = nobs(host(tmp_path, 3), runner).run()
    assert [(r.devices, r.status, r.reason) for r in results] == [
        (("neuron:neuron0",), CheckStatus.OK, "NobsHealthPassed"),
        (("neuron:neuron1",), CheckStatus.PROBLEM, "NobsHealthFailed"),
        (("neuron:neuron2",), CheckStatus.UNKNOWN, "DeviceBusy"),
    ]
