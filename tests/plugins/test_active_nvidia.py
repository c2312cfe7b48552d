"""The active NVIDIA checks: DCGM diagnostics and the NCCL loopback, on recorded outputs and a fake runner.

Fixtures (tests/fixtures/active/) name their source in their header; the constructed one says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.checks.builtin import import_builtin
from agent.sdk import CheckConfigError, CheckContext, CheckResult, CheckStatus, ProcessResult

active = import_builtin("nvidia.active")
nvml = import_builtin("nvidia.nvml")
Readers = import_builtin("nvidia.checks").Readers
Access, GpuInfo, Inventory, Part = nvml.Access, nvml.GpuInfo, nvml.Inventory, nvml.Part
DcgmDiagCheck, DcgmParseError, parse_dcgm_diag, pci_key = (
    active.DcgmDiagCheck,
    active.DcgmParseError,
    active.parse_dcgm_diag,
    active.pci_key,
)
NcclLoopbackCheck, NcclParseError, parse_all_reduce = (
    active.NcclLoopbackCheck,
    active.NcclParseError,
    active.parse_all_reduce,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "active"


def recorded(name: str) -> str:
    """The output part of a fixture (after its ``---8<---`` header line)."""
    return (FIXTURES / name).read_text().split("---8<---\n", 1)[1]


class FakeReader:
    def __init__(self, inventory: Inventory) -> None:
        self.source = inventory.source
        self._inventory = inventory

    def read(self, *, parts: frozenset[Part]) -> Inventory:
        return self._inventory


def readers(*bus_ids: str, access: Access = Access.OK) -> Readers:
    gpus = tuple(GpuInfo(index=i, bus_id=b) for i, b in enumerate(bus_ids))
    nvml = FakeReader(Inventory(source="NVML", access=access, gpus=gpus, message="" if access is Access.OK else "x"))
    return Readers(nvml=nvml, smi=FakeReader(Inventory(source="nvidia-smi", access=Access.ABSENT, message="absent")))


EIGHT = tuple(f"00000000:{b}:00.0" for b in ("18", "3E", "51", "65", "9E", "BA", "C8", "DB"))


class Runner:
    """A fake CheckContext.run_process: answers by program name, records what it was asked."""

    def __init__(self, answers: dict[str, ProcessResult | Callable[[tuple[str, ...]], ProcessResult]]) -> None:
        self.answers = answers
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float, max_output: int = 0, path: str = "") -> ProcessResult:
        argv = tuple(argv)
        self.calls.append((argv, timeout))
        answer = self.answers.get(argv[0])
        if answer is None:
            return ProcessResult(argv=argv, exit_code=None, error=f"not found in PATH ({path})")
        return answer(argv) if callable(answer) else answer


def ran(stdout: str = "", *, exit_code: int = 0, **kw: Any) -> ProcessResult:
    return ProcessResult(argv=("tool",), exit_code=exit_code, stdout=stdout, **kw)


def context(runner: Runner, instance_type: str | None = None) -> CheckContext:
    return CheckContext(run_process=runner, instance_type=lambda: instance_type)


# --- DCGM: parsing recorded outputs -------------------------------------------------------------------


def test_dcgm_3x_real_output_every_gpu_passes() -> None:
    report = parse_dcgm_diag(recorded("dcgm-diag-3x-nvvs-real-output.txt"))
    assert report.version == "3.1.0"
    assert {r.status for r in report.results} == {"pass"}
    deployment = [r for r in report.results if r.category == "Deployment"]
    assert deployment and all(r.gpus == tuple(range(8)) for r in deployment)  # one result for all GPUs
    assert sorted(g for r in report.results if r.test == "software" for g in r.gpus) == list(range(8))


def test_dcgm_4x_diagnostic_entry_from_the_issue_is_read_per_gpu() -> None:
    report = parse_dcgm_diag(recorded("dcgm-diag-4x-r3-issue215.txt"))
    assert report.gpus == tuple(range(8))
    assert [(r.test, r.gpus, r.status) for r in report.results] == [("diagnostic", (i,), "pass") for i in range(8)]


def test_dcgm_4x_failure_names_the_test_and_the_warning() -> None:
    report = parse_dcgm_diag(recorded("dcgm-diag-4x-stress-fail-constructed.txt"))
    failed = [r for r in report.results if r.status == "fail"]
    assert [(r.category, r.test, r.gpus) for r in failed] == [("Stress", "SM Stress", (0,))]
    assert "exceeded user-specified maximum allowed temperature" in failed[0].messages[0]
    assert report.version == "4.1.1"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "no JSON object"),
        ("Error: unable to establish a connection to the specified host: localhost", "no JSON object"),
        ('{"DCGM Diagnostic": {"test_categories": [', "no JSON object"),
        ('{"something": {}}', "no 'DCGM Diagnostic'"),
        ('{"DCGM Diagnostic": {"test_categories": {}}}', "not a list"),
        (
            '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "t", "results": '
            '[{"entity_id": 0, "status": "Maybe"}]}]}]}}',
            "unknown status 'Maybe'",
        ),
        (
            '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "t", "results": '
            '[{"gpu_id": "zero", "status": "Pass"}]}]}]}}',
            "not a number",
        ),
    ],
)
def test_dcgm_garbage_is_a_parse_error_naming_what_was_wrong(text: str, complaint: str) -> None:
    with pytest.raises(DcgmParseError, match=complaint):
        parse_dcgm_diag(text)


@pytest.mark.parametrize(
    ("bus_id", "key"),
    [
        ("00000000:3B:00.0", "gpu:0000:3b:00.0"),
        ("0000:3b:00.0", "gpu:0000:3b:00.0"),
        ("3b:00.0", "gpu:0000:3b:00.0"),
        ("00000009:01:00.0", "gpu:0009:01:00.0"),
        (None, None),
        ("GPU-1234", None),
    ],
)
def test_pci_keys_are_the_device_keys_of_agent_core(bus_id: str | None, key: str | None) -> None:
    assert pci_key(bus_id) == key


# --- DCGM: the check ----------------------------------------------------------------------------------


def dcgm(runner: Runner, gpus: Readers | None = None, **options: Any) -> DcgmDiagCheck:
    return DcgmDiagCheck(name="dcgm-diag", context=context(runner), options=options, readers=gpus or readers(*EIGHT))


def by_device(results: Sequence[CheckResult]) -> dict[tuple[str, ...], tuple[CheckStatus, str]]:
    return {r.devices: (r.status, r.reason) for r in results}


def test_a_passing_run_is_one_pass_per_gpu_keyed_by_pci_address() -> None:
    runner = Runner({"dcgmi": ran(recorded("dcgm-diag-4x-r3-issue215.txt"))})
    results = dcgm(runner, level=3).run()
    assert runner.calls == [(("dcgmi", "diag", "-r", "3", "-j"), 1800.0)]
    assert by_device(results) == {
        (f"gpu:0000:{b.lower()}:00.0",): (CheckStatus.OK, "DcgmDiagPassed")
        for b in ("18", "3E", "51", "65", "9E", "BA", "C8", "DB")
    }
    assert all(r.condition is None for r in results)


def test_a_failing_gpu_fails_alone_and_a_skip_is_not_a_fail() -> None:
    # dcgmi exits non-zero when a test fails; the JSON still says which.
    runner = Runner({"dcgmi": ran(recorded("dcgm-diag-4x-stress-fail-constructed.txt"), exit_code=226)})
    results = dcgm(runner, readers("00000000:3B:00.0", "00000000:86:00.0")).run()
    assert by_device(results) == {
        ("gpu:0000:3b:00.0",): (CheckStatus.PROBLEM, "DcgmDiagFailed"),
        ("gpu:0000:86:00.0",): (CheckStatus.OK, "DcgmDiagPassed"),
    }
    failed = next(r for r in results if r.status is CheckStatus.PROBLEM)
    assert "Stress/SM Stress: fail" in failed.message


def test_3x_deployment_results_for_all_gpus_count_for_each() -> None:
    runner = Runner({"dcgmi": ran(recorded("dcgm-diag-3x-nvvs-real-output.txt"))})
    results = dcgm(runner).run()
    assert len(results) == 8 and {r.status for r in results} == {CheckStatus.OK}


def test_without_pci_addresses_one_verdict_speaks_for_the_node() -> None:
    runner = Runner({"dcgmi": ran(recorded("dcgm-diag-4x-stress-fail-constructed.txt"))})
    results = dcgm(runner, readers(access=Access.NO_DRIVER)).run()
    assert [(r.devices, r.status, r.reason) for r in results] == [((), CheckStatus.PROBLEM, "DcgmDiagFailed")]
    assert "PCI addresses unknown" in results[0].message


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (None, "ToolMissing"),
        (ProcessResult(argv=("dcgmi",), exit_code=None, error="permission denied"), "ToolCannotStart"),
        (ProcessResult(argv=("dcgmi",), exit_code=-9, timed_out=True, duration=600.0), "Timeout"),
        (ProcessResult(argv=("dcgmi",), exit_code=None, error="cancelled", cancelled=True), "Cancelled"),
        (
            # dcgmi/Command.cpp's message when nv-hostengine is not running
            ran("Error: unable to establish a connection to the specified host: localhost", exit_code=255),
            "DcgmHostEngineUnreachable",
        ),
        (ran("Error: Unable to run diagnostic on unsupported GPU 0.", exit_code=226), "OutputUnparsable"),
        (
            ran('{"DCGM Diagnostic": {"version": "4.6.0", "runtime_error": "No GPUs found"}}', exit_code=1),
            "DcgmRuntimeError",
        ),
        (ran('{"DCGM Diagnostic": {"test_categories": []}}'), "DcgmDiagNoResults"),
    ],
)
def test_no_reading_is_unknown_never_a_pass(answer: ProcessResult | None, reason: str) -> None:
    runner = Runner({} if answer is None else {"dcgmi": answer})
    results = dcgm(runner).run()
    assert [(r.status, r.reason) for r in results] == [(CheckStatus.UNKNOWN, reason)]


def test_a_gpu_whose_every_test_was_skipped_is_unknown() -> None:
    doc = (
        '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "memory", "results": '
        '[{"entity_group": "GPU", "entity_id": 0, "status": "Skip"}, {"entity_group": "GPU", "entity_id": 1, '
        '"status": "Pass"}]}]}]}}'
    )  # constructed from the dcgmi/Diag.cpp format
    results = dcgm(Runner({"dcgmi": ran(doc)}), readers("0000:3b:00.0", "0000:86:00.0")).run()
    assert by_device(results)[("gpu:0000:3b:00.0",)] == (CheckStatus.UNKNOWN, "DcgmDiagSkipped")


def test_a_failing_cpu_entity_fails_the_node() -> None:
    doc = (
        '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "cpu_eud", "results": '
        '[{"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0, "status": "Fail"}]}, {"name": "memory", '
        '"results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}]}]}]}}'
    )  # constructed from the dcgmi/Diag.cpp format (DcgmFieldsGetEntityGroupString names CPU entities "CPU")
    results = dcgm(Runner({"dcgmi": ran(doc)}), readers("0000:3b:00.0")).run()
    assert by_device(results) == {
        ("gpu:0000:3b:00.0",): (CheckStatus.OK, "DcgmDiagPassed"),
        (): (CheckStatus.PROBLEM, "DcgmDiagFailed"),
    }


@pytest.mark.parametrize(("level", "timeout"), [(1, 120.0), (2, 600.0), (3, 1800.0), (4, 7200.0)])
def test_default_timeouts_follow_the_level(level: int, timeout: float) -> None:
    check = dcgm(Runner({}), level=level)
    assert (check.command_timeout, check.timeout) == (timeout, timeout + 30.0)


@pytest.mark.parametrize(("options", "field"), [({"level": 5}, "level"), ({"level": None}, "level"), ({"x": 1}, "x")])
def test_bad_options_name_the_option(options: dict[str, Any], field: str) -> None:
    with pytest.raises(CheckConfigError) as caught:
        dcgm(Runner({}), **options)
    assert caught.value.field == field


# --- NCCL loopback ------------------------------------------------------------------------------------


def test_all_reduce_perf_recorded_output_is_read() -> None:
    report = parse_all_reduce(recorded("nccl-all-reduce-a3mega-2x8-h100.txt"))
    assert len(report.rows) == 31
    assert (report.rows[0].size, report.rows[-1].size) == (8, 8589934592)
    assert report.avg_busbw == pytest.approx(70.742)
    assert report.peak_busbw == pytest.approx(338.82)
    assert (report.wrong, report.out_of_bounds) == (0, 0)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "Avg bus bandwidth"),
        ("# Avg bus bandwidth    : 70.742\n", "no result rows"),
        (
            "           8             2     float     sum      -1    135.8    0.00    0.00      0"
            "    123.5    0.00    0.00      0\n",
            "Avg bus bandwidth",
        ),
    ],
)
def test_all_reduce_garbage_is_a_parse_error(text: str, complaint: str) -> None:
    with pytest.raises(NcclParseError, match=complaint):
        parse_all_reduce(text)


def nccl(runner: Runner, instance_type: str | None = None, **options: Any) -> NcclLoopbackCheck:
    return NcclLoopbackCheck(
        name="nccl-loopback", context=context(runner, instance_type), options=options, readers=readers(*EIGHT)
    )


def test_without_a_floor_the_bandwidth_is_reported_and_the_run_passes() -> None:
    runner = Runner({"all_reduce_perf": ran(recorded("nccl-all-reduce-a3mega-2x8-h100.txt"))})
    (result,) = nccl(runner).run()
    assert runner.calls[0][0] == ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8")
    assert (result.status, result.reason) == (CheckStatus.OK, "NcclLoopbackRan")
    assert len(result.devices) == 8 and result.devices[0] == "gpu:0000:18:00.0"
    assert {v.labels["measure"]: v.value for v in result.values} == {"avg": 70.742, "peak": 338.82}


@pytest.mark.parametrize(
    ("options", "instance_type", "status", "reason"),
    [
        ({"busbwFloor": 60}, None, CheckStatus.OK, "NcclBandwidthGood"),
        ({"busbwFloor": 100}, None, CheckStatus.PROBLEM, "NcclBandwidthLow"),
        ({"busbwFloor": 300, "measure": "peak"}, None, CheckStatus.OK, "NcclBandwidthGood"),
        ({"busbwFloors": {"p5.48xlarge": 100}}, "p5.48xlarge", CheckStatus.PROBLEM, "NcclBandwidthLow"),
        ({"busbwFloors": {"p5.48xlarge": 100}}, "g5.48xlarge", CheckStatus.OK, "NcclLoopbackRan"),
    ],
)
def test_the_floor_comes_from_the_options(
    options: dict[str, Any], instance_type: str | None, status: CheckStatus, reason: str
) -> None:
    runner = Runner({"all_reduce_perf": ran(recorded("nccl-all-reduce-a3mega-2x8-h100.txt"))})
    (result,) = nccl(runner, instance_type, **options).run()
    assert (result.status, result.reason) == (status, reason)


def test_wrong_values_fail_whatever_the_bandwidth() -> None:
    text = recorded("nccl-all-reduce-a3mega-2x8-h100.txt").replace(
        "338.82      0    47743", "338.82      3    47743"
    )  # the recorded run with 3 wrong values in its last row (edited)
    (result,) = nccl(Runner({"all_reduce_perf": ran(text, exit_code=1)})).run()
    assert (result.status, result.reason) == (CheckStatus.PROBLEM, "NcclDataErrors")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (None, "ToolMissing"),
        (ProcessResult(argv=("all_reduce_perf",), exit_code=-9, timed_out=True), "Timeout"),
        (ran("NCCL failure common.cu:958 'unhandled cuda error'", exit_code=1), "OutputUnparsable"),
    ],
)
def test_nccl_without_a_reading_is_unknown(answer: ProcessResult | None, reason: str) -> None:
    runner = Runner({} if answer is None else {"all_reduce_perf": answer})
    (result,) = nccl(runner).run()
    assert (result.status, result.reason) == (CheckStatus.UNKNOWN, reason)


def test_nccl_on_a_node_without_gpus_is_unknown() -> None:
    check = NcclLoopbackCheck(
        name="nccl-loopback", context=context(Runner({})), options={}, readers=readers(access=Access.ABSENT)
    )
    assert [(r.status, r.reason) for r in check.run()] == [(CheckStatus.UNKNOWN, "NoGpus")]


@pytest.mark.parametrize(
    ("options", "field"),
    [({"busbwFloor": 0}, "busbwFloor"), ({"busbwFloors": {"p5.48xlarge": "fast"}}, "busbwFloors.p5.48xlarge")],
)
def test_nccl_bad_floors_name_the_option(options: dict[str, Any], field: str) -> None:
    with pytest.raises(CheckConfigError) as caught:
        nccl(Runner({}), **options)
    assert caught.value.field == field
