"""Built-in NVIDIA checks: gpu-count, gpu-ecc, gpu-nvlink, gpu-pcie-thermal.

Three ways in, each with recorded data:

- the NVML path: ``NvmlReader`` over a replayed ``pynvml`` module answering the calls recorded on a
  real H100 (tests/fixtures/nvidia/h100/nvml-calls.json), with single answers changed for faults;
- the nvidia-smi path: an executable named ``nvidia-smi`` on a tmp PATH printing the H100
  recordings or the public recordings in shared/testdata/tool-outputs (read in place);
- the checks' logic: a fake ``GpuReader`` handing them GpuInfo built for the case.

Nothing sleeps; the one hang test relies on the process runner's timeout (0.3 s).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from agent.checks.builtin import import_builtin
from agent.checks.model import CheckConfigError, CheckContext, CheckResult, CheckStatus
from agent.core.types import ConditionSpec, Severity

from helpers import FIXTURES, REPO
from helpers.testdata import tool_output

checks = import_builtin("nvidia.checks")
nvml = import_builtin("nvidia.nvml")
smi = import_builtin("nvidia.smi")
active = import_builtin("nvidia.active")

Access, Fault, Part, GpuInfo, Inventory = nvml.Access, nvml.Fault, nvml.Part, nvml.GpuInfo, nvml.Inventory
EccCounts, RemappedRows, RetiredPages = nvml.EccCounts, nvml.RemappedRows, nvml.RetiredPages

ROOT = REPO
H100 = FIXTURES / "nvidia" / "h100"
CAT, SLEEP = shutil.which("cat") or "/bin/cat", shutil.which("sleep") or "/bin/sleep"  # the tool PATH is only tmp
# Failure answers: a healthy machine cannot be made to print them, so they are rebuilt from nvidia-smi(1)'s
# exit codes (9 driver, 15 GPU lost, 18 mismatch, 6 no devices) and the messages quoted in the reference.
# Two were seen on the H100: `nvidia-smi -i 7 ...` printed "No devices were found" with exit 6, and an
# unknown --query-gpu field printed 'Field "<name>" is not a valid field to query.' with exit 2.
LOST_MESSAGE = (
    "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
)
DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
CHECKS = {
    "gpu-count": checks.GpuCountCheck,
    "gpu-ecc": checks.GpuEccCheck,
    "gpu-nvlink": checks.GpuNvlinkCheck,
    "gpu-pcie-thermal": checks.GpuPcieThermalCheck,
}
ACTIVE = {  # the active checks (issue 36; tests/plugins/test_active_nvidia.py): declared too, own no condition
    "dcgm-diag": active.DcgmDiagCheck,
    "nccl-loopback": active.NcclLoopbackCheck,
}


# --- recorded data -------------------------------------------------------------------------------


def _split(text: str) -> tuple[dict[str, str], str]:
    marker = text.index("---8<---")
    head = text[:marker]
    meta = {}
    for line in head.splitlines():
        key, sep, value = line.removeprefix("# ").partition(": ")
        if sep:
            meta[key] = value
    return meta, text[text.index("\n", marker) + 1 :]


def h100(name: str) -> str:
    """The body of a recording made on the H100 (header lines removed)."""
    return _split((H100 / name).read_text())[1]


def h100_command(name: str) -> str:
    """The nvidia-smi arguments a recording was made with (its ``command:`` header line)."""
    return _split((H100 / name).read_text())[0]["command"].removeprefix("nvidia-smi ")


def plain(obj: Any) -> Any:
    """A dataclass tree as JSON-like data (enums by value), as the recordings are written."""
    if dataclasses.is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    return obj


# --- a replayed pynvml module ----------------------------------------------------------------------


@dataclass(frozen=True)
class Handle:
    index: int


class ReplayError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML return code {self.value}"


def _to_json(value: Any) -> Any:
    return {"handle": value.index} if isinstance(value, Handle) else value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return Handle(value["handle"]) if set(value) == {"handle"} else SimpleNamespace(**value)
    return value


class ReplayNvml:
    """Stands in for the ``pynvml`` module: answers each call as recorded, refuses unrecorded ones."""

    NVMLError = ReplayError

    def __init__(self, calls: Sequence[dict], *, missing: Sequence[str] = ()) -> None:
        self._answers = {(c["fn"], json.dumps(c["args"])): c for c in calls}
        self._missing = set(missing)
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in self._missing or not name.startswith("nvml"):
            raise AttributeError(name)

        def call(*args: Any) -> Any:
            key = (name, json.dumps([_to_json(a) for a in args]))
            self.called.append(name)
            if key not in self._answers:
                raise AssertionError(f"call not in the recording: {key}")
            entry = self._answers[key]
            if "error" in entry:
                raise ReplayError(entry["error"])
            return _from_json(entry["result"])

        return call


def h100_calls(**changes: dict) -> list[dict]:
    """The recorded H100 NVML calls, with ``changes`` = {"fn(args json)": {"result": ...} | {"error": code}}."""
    calls = json.loads(h100("nvml-calls.json"))
    for key, answer in changes.items():
        fn, _, args = key.partition("(")
        args_json = json.dumps(json.loads(f"[{args[:-1]}]"))
        calls = [c for c in calls if (c["fn"], json.dumps(c["args"])) != (fn, args_json)]
        calls.append({"fn": fn, "args": json.loads(args_json), **answer})
    return calls


def nvml_reader(calls: Sequence[dict] | None = None, **kwargs: Any) -> Any:
    module = ReplayNvml(h100_calls() if calls is None else calls, **kwargs)
    return nvml.NvmlReader(load=lambda: module)


def no_nvml() -> Any:
    def load() -> Any:
        raise ImportError("No module named 'pynvml'")

    return nvml.NvmlReader(load=load)


# --- a fake nvidia-smi -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What the fake nvidia-smi does when its arguments match (``exact`` string or ``contains`` substring)."""

    exact: str | None = None
    contains: str | None = None
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    hang: bool = False


def fake_smi(directory: Path, answers: Sequence[Answer]) -> Path:
    """Write an executable ``nvidia-smi`` into ``directory`` answering as told; returns its call log."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "calls.log"
    lines = ["#!/bin/sh", f"printf '%s\\n' \"$*\" >> {shlex.quote(str(log))}", 'case "$*" in']
    for i, answer in enumerate(answers):
        out, err = directory / f"answer{i}.out", directory / f"answer{i}.err"
        out.write_text(answer.stdout)
        err.write_text(answer.stderr)
        pattern = shlex.quote(answer.exact) if answer.exact is not None else f"*{shlex.quote(answer.contains or '')}*"
        action = (
            f"exec {SLEEP} 30"
            if answer.hang
            else f"{CAT} {shlex.quote(str(out))}; {CAT} {shlex.quote(str(err))} >&2; exit {answer.exit_code}"
        )
        lines.append(f"  {pattern}) {action} ;;")
    lines += ["esac", 'echo "fake nvidia-smi: unexpected arguments: $*" >&2', "exit 2", ""]
    tool = directory / "nvidia-smi"
    tool.write_text("\n".join(lines))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return log


def calls_of(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def h100_answers() -> list[Answer]:
    names = [
        "query-gpu-identity.csv",
        "query-gpu-ecc.csv",
        "query-gpu-ecc-locations.csv",
        "query-remapped-rows.csv",
        "query-gpu-pcie-thermal.csv",
        "nvlink-status.txt",
    ]
    return [Answer(exact=h100_command(name), stdout=h100(name)) for name in names]


def context(tmp_path: Path, *, instance_type: str | None = None, tools: Path | None = None) -> CheckContext:
    return CheckContext(
        state_dir=tmp_path / "state",
        sys_root=tmp_path / "sys",
        dev_root=tmp_path / "dev",
        tool_path=str(tools or tmp_path / "bin"),
        instance_type=lambda: instance_type,
        clock=lambda: 1_000_000.0,
    )


def smi_check(kind: str, tmp_path: Path, *, options: dict | None = None, nvml_reader: Any = None, **ctx: Any) -> Any:
    """A check reading through the fake nvidia-smi in tmp_path/bin (NVML absent unless given)."""
    context_ = context(tmp_path, **ctx)
    opts = {"commandTimeout": 5, **(options or {})}
    timeout = checks._Options(opts, known=checks.COMMON_OPTIONS | CHECKS[kind].own_options).seconds(
        "commandTimeout", 10
    )
    readers = checks.Readers(nvml=nvml_reader or no_nvml(), smi=smi.SmiReader(run=context_.run, timeout=timeout))
    return CHECKS[kind](name=kind, context=context_, options=opts, readers=readers)


def run_one(check: Any) -> CheckResult:
    results = check.run()
    assert len(results) == 1, results
    return results[0]


# --- a fake reader and GPUs ---------------------------------------------------------------------------


@dataclass
class FakeReader:
    inventory: Any
    source: str = "NVML"
    asked: list = field(default_factory=list)

    def read(self, *, parts: frozenset) -> Any:
        self.asked.append(parts)
        return self.inventory


def inventory(*gpus: Any, access: Any = None, message: str = "") -> Any:
    return Inventory(source="NVML", access=access or Access.OK, message=message, gpus=tuple(gpus))


def gpu(index: int, **fields: Any) -> Any:
    return GpuInfo(
        index=index,
        bus_id=f"00000000:{0x10 + index:02X}:00.0",
        uuid=f"GPU-{index:08d}",
        name="NVIDIA A100-SXM4-80GB",
        **fields,
    )


HEALTHY_ECC = {
    "ecc_mode": True,
    "ecc": EccCounts(volatile_corrected=0, volatile_uncorrected=0, aggregate_corrected=0, aggregate_uncorrected=0),
    "remapped_rows": RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
}


def fake_check(kind: str, tmp_path: Path, found: Any, *, options: dict | None = None, **ctx: Any) -> Any:
    reader = FakeReader(found)
    absent = FakeReader(inventory(access=Access.ABSENT, message="nvidia-smi: not found in PATH"))
    readers = checks.Readers(nvml=reader, smi=absent)
    return CHECKS[kind](name=kind, context=context(tmp_path, **ctx), options=options or {}, readers=readers)


# === the real H100: replayed recordings give the verdicts the hardware gave =========================


def test_nvml_replay_reads_what_the_h100_showed():
    got = nvml_reader().read(parts=frozenset(Part))
    assert plain(got) == json.loads(h100("nvml-inventory.json"))
    gpu0 = got.gpus[0]
    assert (gpu0.name, gpu0.ecc_mode, gpu0.nvlinks, gpu0.retired_pages) == ("NVIDIA H100 80GB HBM3", True, (), None)
    assert gpu0.remapped_rows == RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False)


@pytest.mark.parametrize(
    "parts",
    [{Part.IDENTITY}, {Part.ECC, Part.ECC_LOCATIONS}, {Part.NVLINK}, {Part.PCIE_THERMAL}],
    ids=["identity", "ecc", "nvlink", "pcie-thermal"],
)
def test_nvidia_smi_recordings_agree_with_nvml_on_the_h100(tmp_path, parts):
    """Same GPU, two sources: every field the nvidia-smi query covers equals what NVML said."""
    fake_smi(tmp_path / "bin", h100_answers())
    ctx = context(tmp_path)
    by_smi = smi.SmiReader(run=ctx.run, timeout=5).read(parts=frozenset(parts))
    by_nvml = nvml_reader().read(parts=frozenset(parts))
    assert by_smi.access is Access.OK
    assert [plain(g) for g in by_smi.gpus] == [plain(g) for g in by_nvml.gpus]


def test_checks_replayed_give_the_verdicts_recorded_on_the_h100(tmp_path):
    recorded = json.loads(h100("verdicts.json"))
    fake_smi(tmp_path / "bin", h100_answers())
    ctx = context(tmp_path)  # one state dir for every case, as on the device
    got = []
    seen = []
    for row in recorded:
        key = (row["source"], row["check"], json.dumps(row["options"]))
        if key in seen:
            continue  # a check with several results appears once per result
        seen.append(key)
        readers = checks.Readers(nvml=nvml_reader(), smi=smi.SmiReader(run=ctx.run, timeout=5))
        check = CHECKS[row["check"]](
            name=row["check"], context=ctx, options={**row["options"], "source": row["source"]}, readers=readers
        )
        for result in check.run():
            got.append(
                {
                    "check": row["check"],
                    "source": row["source"],
                    "options": row["options"],
                    "status": result.status.value,
                    "condition": result.condition,
                    "reason": result.reason,
                    "message": result.message,
                    "severity": result.severity.value,
                    "values": [plain(v) for v in result.values],
                }
            )
    assert got == recorded
    # On the real H100 everything is healthy; only asking for two GPUs makes a problem (on every source).
    problems = {(r["source"], r["reason"]) for r in recorded if r["status"] != "OK"}
    assert problems == {(source, "GpuMissing") for source in ("auto", "nvml", "nvidia-smi")}
    assert all(r["options"] == {"expectedCount": 2} for r in recorded if r["status"] != "OK")


# === public recordings (shared/testdata/tool-outputs), through the fake nvidia-smi ===================


def test_nvlink_status_a100_eight_gpus_all_links_up_is_healthy(tmp_path):
    log = fake_smi(
        tmp_path / "bin",
        [Answer(exact="nvlink --status", stdout=tool_output("nvidia-smi-nvlink-status-a100-8gpu-healthy.txt"))],
    )
    result = run_one(smi_check("gpu-nvlink", tmp_path))
    assert (result.status, result.condition, result.reason) == (CheckStatus.OK, "GpuNvlink", "GpuNvlinkGood")
    assert result.message == "all 96 NVLinks of 8 GPUs active"
    active = {v.labels["gpu"]: v.value for v in result.values if v.labels["state"] == "active"}
    assert active == {str(i): 12 for i in range(8)}
    assert calls_of(log) == ["nvlink --status"]


@pytest.mark.parametrize(
    "recording",
    [
        pytest.param(lambda: tool_output("nvidia-smi-nvlink-status-a10-empty.txt"), id="a10-public"),
        pytest.param(lambda: h100("nvlink-status.txt"), id="h100-recorded"),
    ],
)
def test_empty_nvlink_status_means_no_nvlink_not_links_down(tmp_path, recording):
    text = recording()
    assert text.strip() == ""
    answers = [
        Answer(exact="nvlink --status", stdout=text),
        Answer(exact=h100_command("query-gpu-identity.csv"), stdout=h100("query-gpu-identity.csv")),
    ]
    fake_smi(tmp_path / "bin", answers)
    result = run_one(smi_check("gpu-nvlink", tmp_path))
    assert (result.status, result.reason, result.message) == (
        CheckStatus.OK,
        "GpuNvlinkGood",
        "no NVLink on 1 GPU: not applicable",
    )


def test_consumer_gpu_without_ecc_is_not_applicable_never_zero_or_error(tmp_path):
    """RTX 2080 SUPER, 111-field CSV with units in the header: every ECC / retired-pages field is [N/A]."""
    log = fake_smi(
        tmp_path / "bin",
        [Answer(contains="--query-gpu=", stdout=tool_output("nvidia-smi-query-gpu-csv-rtx2080super-consumer.txt"))],
    )
    ecc = run_one(smi_check("gpu-ecc", tmp_path))
    assert (ecc.status, ecc.condition, ecc.reason) == (CheckStatus.OK, "GpuEcc", "GpuEccNotSupported")
    assert "NVIDIA GeForce RTX 2080 SUPER" in ecc.message and "not applicable" in ecc.message
    assert ecc.values == ()  # no ECC counter reported as 0
    assert not any("--query-remapped-rows" in c for c in calls_of(log))  # no ECC, no row remapping to ask about

    count = run_one(smi_check("gpu-count", tmp_path))
    assert (count.status, count.reason, count.message) == (
        CheckStatus.OK,
        "GpuCountGood",
        "1 NVIDIA GPU found by nvidia-smi",
    )

    warnings = run_one(smi_check("gpu-pcie-thermal", tmp_path))  # x16 of x16; 0x1 = GPU idle, benign
    assert (warnings.status, warnings.condition, warnings.reason) == (CheckStatus.OK, None, "GpuPcieThermalGood")
    assert {v.name: v.value for v in warnings.values} == {
        "gpu_pcie_link_width": 16,
        "gpu_pcie_link_width_max": 16,
        "gpu_temperature_celsius": 36,
        "gpu_thermal_slowdown": 0,
    }


def test_consumer_csv_fields_parse_to_not_applicable():
    text = tool_output("nvidia-smi-query-gpu-csv-rtx2080super-consumer.txt")
    (got,) = smi.gpus_from_ecc(text, locations=True)
    assert (got.ecc_mode, got.ecc, got.ecc_sram, got.ecc_dram, got.retired_pages, got.errors) == (
        None,
        None,
        None,
        None,
        None,
        (),
    )
    (pcie,) = smi.gpus_from_pcie_thermal(text)  # the 471 driver names the field clocks_throttle_reasons.active
    assert (pcie.pcie_width, pcie.pcie_max_width, pcie.clock_events) == (16, 16, 1)
    assert smi.cell("N/A").value is None and smi.cell("[Not Supported]").value is None


# --- nvidia-smi -q excerpts: facts translated into the readers' data ----------------------------------
# The checks read nvidia-smi's CSV query interface (stable for scripts), never the -q report, whose
# labels change between drivers (510: "SRAM Uncorrectable"; 580 on the H100: "SRAM Uncorrectable
# Parity" and "SEC-DED"). The published -q excerpts are translated here, field by field, into the
# GpuInfo a reader returns, and into the CSV the same GPU would print, and judged both ways.

_Q_VALUE = re.compile(r"^(\s*)(.*?)\s+:\s(.*)$")


def q_facts(text: str) -> tuple[str | None, dict[tuple[str, ...], str]]:
    """(bus id, {(section, ..., key): value}) of an ``nvidia-smi -q`` excerpt; keys lower case."""
    stack: list[tuple[int, str]] = []
    facts: dict[tuple[str, ...], str] = {}
    bus_id = None
    for line in text.splitlines():
        if not line.strip() or line.strip() == "[...]":
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        match = _Q_VALUE.match(line)
        if match is None:
            name = line.strip()
            if name.startswith("GPU "):
                bus_id = name.removeprefix("GPU ")
            stack.append((indent, name.lower()))
            continue
        facts[(*(n for _, n in stack), match.group(2).strip().lower())] = match.group(3).strip()
    return bus_id, facts


def gpu_from_q(text: str) -> Any:
    bus_id, facts = q_facts(text)

    def value(*suffix: str) -> str | None:
        return next((v for k, v in facts.items() if k[-len(suffix) :] == suffix), None)

    def total(counter: str, kind: str) -> int | None:
        found = [value("ecc errors", counter, f"{where} {kind}") for where in ("sram", "dram")]
        numbers = [int(v) for v in found if v is not None]
        return sum(numbers) if numbers else None

    fields: dict[str, Any] = {}
    ecc = EccCounts(
        volatile_corrected=total("volatile", "correctable"),
        volatile_uncorrected=total("volatile", "uncorrectable"),
        aggregate_corrected=total("aggregate", "correctable"),
        aggregate_uncorrected=total("aggregate", "uncorrectable"),
    )
    if ecc.supported():
        fields.update(ecc_mode=True, ecc=ecc)
    if value("remapped rows", "pending") is not None:
        fields["remapped_rows"] = RemappedRows(
            correctable=int(value("remapped rows", "correctable error") or 0),
            uncorrectable=int(value("remapped rows", "uncorrectable error") or 0),
            pending=value("remapped rows", "pending") == "Yes",
            failure=value("remapped rows", "remapping failure occurred") == "Yes",
        )
    pages = [value("retired pages", k) for k in ("single bit ecc", "double bit ecc", "pending page blacklist")]
    if all(p is not None and p != "N/A" for p in pages):
        fields["retired_pages"] = RetiredPages(
            single_bit=int(pages[0]), double_bit=int(pages[1]), pending=pages[2] == "Yes"
        )
        fields.setdefault("ecc_mode", True)
    return GpuInfo(index=0, bus_id=bus_id, name="(from nvidia-smi -q)", **fields)


def csv_answers(g: Any) -> list[Answer]:
    """What nvidia-smi's ECC and remapped-rows queries print for ``g`` (the formats recorded on the H100)."""

    def show(v: Any) -> str:
        return "[N/A]" if v is None else ("Yes" if v is True else "No" if v is False else str(v))

    ecc = g.ecc or EccCounts()
    pages = g.retired_pages
    mode = {True: "Enabled", False: "Disabled", None: "[N/A]"}[g.ecc_mode]
    row = [g.index, g.bus_id, g.uuid or "GPU-x", g.name, mode]
    row += [ecc.volatile_corrected, ecc.aggregate_corrected, ecc.volatile_uncorrected, ecc.aggregate_uncorrected]
    row += [pages.single_bit, pages.double_bit, pages.pending] if pages else [None, None, None]
    header = ", ".join((*smi.IDENTITY, smi.ECC_MODE, *smi.ECC_TOTALS, *smi.RETIRED))
    answers = [Answer(contains="ecc.mode.current", stdout=f"{header}\n{', '.join(show(v) for v in row)}\n")]
    rows = g.remapped_rows
    remap = f"{', '.join(smi.REMAP)}\n"
    if rows is not None:
        remap += f"{g.bus_id}, {rows.correctable}, {rows.uncorrectable}, {show(rows.pending)}, {show(rows.failure)}\n"
    answers.append(Answer(contains="--query-remapped-rows", stdout=remap))
    return answers


@pytest.mark.parametrize("path", ["reader", "nvidia-smi"])
@pytest.mark.parametrize(
    ("recording", "reason", "severity", "says"),
    [
        # index.md: needs a GPU reset, no uncorrectable errors, no failure: not an RMA case.
        (
            "nvidia-smi-q-a100-row-remap-pending.txt",
            "GpuRowRemapPending",
            Severity.ERROR,
            "GPU 0 (00000000:10:1C.0): row remap pending",
        ),
        # index.md: volatile SRAM uncorrectable 1 (aggregate 5): reset the GPU now.
        (
            "nvidia-smi-q-ecc-sram-uncorrectable.txt",
            "GpuEccUncorrectable",
            Severity.CRITICAL,
            "1 uncorrectable ECC errors since the driver loaded",
        ),
        # index.md: pending page blacklist = Yes, 2 single-bit pages: reboot / reset, not an RMA by itself.
        ("nvidia-smi-q-retired-pages-pending.txt", "GpuRetiredPagesPending", Severity.ERROR, "page retirement pending"),
    ],
    ids=["a100-row-remap-pending", "sram-uncorrectable", "retired-pages-pending"],
)
def test_nvidia_smi_q_excerpts_are_problems(tmp_path, path, recording, reason, severity, says):
    g = gpu_from_q(tool_output(recording))
    if g.bus_id is None:
        g = dataclasses.replace(g, bus_id="00000000:3B:00.0")
    if path == "reader":
        result = run_one(fake_check("gpu-ecc", tmp_path, inventory(g)))
    else:
        fake_smi(tmp_path / "bin", csv_answers(g))
        result = run_one(smi_check("gpu-ecc", tmp_path))
    assert (result.status, result.condition, result.reason, result.severity) == (
        CheckStatus.PROBLEM,
        "GpuEcc",
        reason,
        severity,
    )
    assert says in result.message


def test_row_remap_pending_keeps_correctable_counts_as_metrics_only(tmp_path):
    g = gpu_from_q(tool_output("nvidia-smi-q-a100-row-remap-pending.txt"))
    result = run_one(fake_check("gpu-ecc", tmp_path, inventory(g)))
    assert result.message == "GPU 0 (00000000:10:1C.0): row remap pending (takes effect at the next GPU reset)"
    values = {(v.name, *sorted(v.labels.items())): v.value for v in result.values}
    assert values[("gpu_ecc_errors", ("counter", "volatile"), ("gpu", "0"), ("type", "corrected"))] == 177
    assert values[("gpu_remapped_rows", ("gpu", "0"), ("type", "correctable"))] == 1
    assert values[("gpu_row_remap_pending", ("gpu", "0"))] == 1


# === nvidia-smi failures: which are the node's, which are ours =======================================


@pytest.mark.parametrize(
    ("answer", "options", "status", "reason"),
    [
        (Answer(contains="", stdout=DRIVER_MESSAGE, exit_code=9), {}, CheckStatus.PROBLEM, "GpuDriverNotLoaded"),
        (Answer(contains="", stdout=DRIVER_MESSAGE, exit_code=255), {}, CheckStatus.PROBLEM, "GpuDriverNotLoaded"),
        (
            Answer(contains="", stdout="Failed to initialize NVML: Driver/library version mismatch\n", exit_code=18),
            {},
            CheckStatus.PROBLEM,
            "GpuDriverMismatch",
        ),
        (Answer(contains="", stdout=LOST_MESSAGE, exit_code=15), {}, CheckStatus.PROBLEM, "GpuLost"),
        (Answer(contains="", stdout="No devices were found\n", exit_code=6), {}, CheckStatus.PROBLEM, "GpuMissing"),
        (Answer(contains="", hang=True), {"commandTimeout": 0.3}, CheckStatus.UNKNOWN, "GpuCountUnknown"),
        (Answer(contains="", stdout="<html>502 Bad Gateway</html>\n"), {}, CheckStatus.UNKNOWN, "GpuCountUnknown"),
        (
            Answer(contains="", stdout="index, pci.bus_id\n0, 00000000:10:00.0\n"),
            {},
            CheckStatus.UNKNOWN,
            "GpuCountUnknown",
        ),
        (Answer(contains="", stderr="Segmentation fault\n", exit_code=139), {}, CheckStatus.UNKNOWN, "GpuCountUnknown"),
    ],
    ids=[
        "exit-9-driver",
        "exit-255-driver",
        "exit-18-mismatch",
        "exit-15-lost",
        "exit-6-no-devices",
        "hang",
        "garbage",
        "missing-fields",
        "crash",
    ],
)
def test_gpu_count_on_nvidia_smi_failures(tmp_path, answer, options, status, reason):
    fake_smi(tmp_path / "bin", [answer])
    result = run_one(smi_check("gpu-count", tmp_path, options=options))
    assert (result.status, result.condition, result.reason) == (status, "GpuCount", reason)
    if status is CheckStatus.PROBLEM:
        assert result.severity is Severity.CRITICAL
    if reason == "GpuLost":
        assert "0000:3B:00.0" in result.message
    if answer.hang:
        assert "timed out" in result.message


@pytest.mark.parametrize("kind", ["gpu-ecc", "gpu-nvlink", "gpu-pcie-thermal"])
@pytest.mark.parametrize("exit_code", [9, 15])
def test_other_checks_leave_driver_and_lost_gpu_to_the_count_check(tmp_path, kind, exit_code):
    fake_smi(
        tmp_path / "bin",
        [Answer(contains="", stdout=DRIVER_MESSAGE if exit_code == 9 else "GPU is lost\n", exit_code=exit_code)],
    )
    result = run_one(smi_check(kind, tmp_path))
    assert result.status is CheckStatus.UNKNOWN
    assert "the GPU count check judges this" in result.message


@pytest.mark.parametrize(
    ("expected", "status", "reason"),
    [
        ({}, CheckStatus.OK, "NoNvidiaGpus"),
        ({"expectedCount": 8}, CheckStatus.UNKNOWN, "GpuToolUnavailable"),
        ({"instance_type": "p5.48xlarge"}, CheckStatus.UNKNOWN, "GpuToolUnavailable"),
    ],
    ids=["none-expected", "expected-count", "gpu-instance-type"],
)
def test_no_library_and_no_tool(tmp_path, expected, status, reason):
    (tmp_path / "bin").mkdir()
    options = {k: v for k, v in expected.items() if k != "instance_type"}
    result = run_one(smi_check("gpu-count", tmp_path, options=options, instance_type=expected.get("instance_type")))
    assert (result.status, result.reason) == (status, reason)
    assert "nvidia-ml-py is not installed" in result.message and "nvidia-smi: not found in PATH" in result.message


@pytest.mark.parametrize("kind", sorted(CHECKS))
def test_no_gpu_machine_is_never_a_problem(tmp_path, kind):
    (tmp_path / "bin").mkdir()
    result = run_one(smi_check(kind, tmp_path))
    assert (result.status, result.reason) == (CheckStatus.OK, "NoNvidiaGpus")
    assert result.message.startswith("no NVIDIA GPU on this node and none expected")


def test_this_machine_with_default_readers_says_no_problem(tmp_path):
    """What ``check --json`` sees here: the real NVML reader and the real tool PATH."""
    ctx = CheckContext(state_dir=tmp_path / "state")
    if shutil.which("nvidia-smi", path=ctx.tool_path):
        pytest.skip("this machine has nvidia-smi")
    for kind, cls in CHECKS.items():
        for result in cls(name=kind, context=ctx, options={}).run():
            assert result.status is not CheckStatus.PROBLEM, result


def test_a_failing_query_spoils_only_its_own_check(tmp_path):
    answers = [Answer(contains="ecc.mode.current", stdout="garbage\n", exit_code=0), *h100_answers()]
    fake_smi(tmp_path / "bin", answers)
    assert run_one(smi_check("gpu-ecc", tmp_path)).status is CheckStatus.UNKNOWN
    assert run_one(smi_check("gpu-count", tmp_path)).status is CheckStatus.OK
    assert run_one(smi_check("gpu-pcie-thermal", tmp_path)).status is CheckStatus.OK
    assert run_one(smi_check("gpu-nvlink", tmp_path)).status is CheckStatus.OK


def test_remapped_rows_query_failing_makes_ecc_unknown(tmp_path):
    answers = [Answer(contains="--query-remapped-rows", stderr="Unknown Error\n", exit_code=255), *h100_answers()]
    fake_smi(tmp_path / "bin", answers)
    result = run_one(smi_check("gpu-ecc", tmp_path))
    assert result.status is CheckStatus.UNKNOWN
    assert "--query-remapped-rows" in result.message


def test_nvidia_smi_without_remapped_rows_option_still_judges_ecc(tmp_path):
    answers = [
        Answer(contains="--query-remapped-rows", stdout="Invalid combination of input arguments.\n", exit_code=2),
        *h100_answers(),
    ]
    fake_smi(tmp_path / "bin", answers)
    result = run_one(smi_check("gpu-ecc", tmp_path))
    assert (result.status, result.reason) == (CheckStatus.OK, "GpuEccGood")


def test_drivers_before_535_get_the_old_clock_field_name(tmp_path):
    new = h100_command("query-gpu-pcie-thermal.csv")
    old_output = h100("query-gpu-pcie-thermal.csv").replace(
        "clocks_event_reasons.active", "clocks_throttle_reasons.active"
    )
    answers = [
        Answer(exact=new, stdout='Field "clocks_event_reasons.active" is not a valid field to query.\n\n', exit_code=2),
        Answer(contains="clocks_throttle_reasons.active", stdout=old_output),
    ]
    log = fake_smi(tmp_path / "bin", answers)
    result = run_one(smi_check("gpu-pcie-thermal", tmp_path))
    assert (result.status, result.reason) == (CheckStatus.OK, "GpuPcieThermalGood")
    assert len(calls_of(log)) == 2


@pytest.mark.parametrize(
    ("text", "links"),
    [
        ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n", (True, False)),
        (
            "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-a)\n"
            "NVML: Unable to retrieve NVLink information as all links are inActive\n",
            (False,),
        ),
    ],
    ids=["one-inactive", "all-inactive"],
)
def test_nvlink_status_inactive_forms(text, links):
    (got,) = smi.gpus_from_nvlink_status(text)
    assert (got.index, got.uuid, got.nvlinks) == (0, "GPU-a", links)


@pytest.mark.parametrize(
    ("text", "fields", "error"),
    [
        ("", ("index",), "no output"),
        ("index, name\n0\n", ("index",), "line 2 has 1 values for 2 columns"),
        ("idx, name\n0, x\n", ("index",), "field 'index' missing"),
    ],
    ids=["empty", "short-row", "wrong-header"],
)
def test_csv_parser_refuses_what_it_does_not_understand(text, fields, error):
    with pytest.raises(smi.SmiOutputError, match=error):
        smi.parse_csv(text, fields=fields)


def test_bracketed_cells_are_faults_or_errors_of_that_gpu():
    header = ", ".join((*smi.IDENTITY, *smi.PCIE_THERMAL, smi.CLOCK_EVENTS[0]))
    text = (
        f"{header}\n"
        "0, 00000000:10:00.0, GPU-a, A100, 16, 16, 40, 0x0000000000000000\n"
        "1, 00000000:11:00.0, GPU-b, A100, [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost]\n"
        "2, 00000000:12:00.0, GPU-c, A100, [Unknown Error], 16, 40, 0x0000000000000000\n"
        "3, 00000000:13:00.0, GPU-d, A100, sixteen, 16, 40, 0x0000000000000000\n"
    )
    gpus = smi.gpus_from_pcie_thermal(text)
    assert [g.fault for g in gpus] == [None, Fault.LOST, None, None]
    assert gpus[2].error(Part.PCIE_THERMAL) == "pcie.link.width.current: [Unknown Error]"
    assert gpus[3].error(Part.PCIE_THERMAL) == "pcie.link.width.current: expected a number, got 'sixteen'"


# === the NVML adapter: errors as data ================================================================


@pytest.mark.parametrize(
    ("calls", "access", "says"),
    [
        ({"nvmlInit()": {"error": 12}}, Access.ABSENT, "libnvidia-ml.so.1 cannot be loaded"),
        ({"nvmlInit()": {"error": 9}}, Access.NO_DRIVER, "NVML error 9"),
        ({"nvmlInit()": {"error": 18}}, Access.DRIVER_MISMATCH, "NVML error 18"),
        ({"nvmlInit()": {"error": 999}}, Access.FAILED, "nvmlInit failed"),
        ({"nvmlDeviceGetCount()": {"error": 15}}, Access.GPU_LOST, "NVML error 15"),
    ],
    ids=["library-not-found", "driver-not-loaded", "version-mismatch", "unknown", "count-gpu-lost"],
)
def test_nvml_init_outcomes(calls, access, says):
    got = nvml_reader(h100_calls(**calls)).read(parts=frozenset({Part.IDENTITY}))
    assert got.access is access
    assert says in got.message


def test_nvml_binding_misbehaving_is_our_trouble_not_an_exception():
    got = nvml_reader(h100_calls(**{"nvmlDeviceGetCount()": {"result": "many"}})).read(parts=frozenset(Part))
    assert (got.access, got.message) == (
        Access.FAILED,
        "NVML: ValueError: invalid literal for int() with base 10: 'many'",
    )


def test_nvml_package_missing_is_absent():
    got = no_nvml().read(parts=frozenset({Part.IDENTITY}))
    assert (got.access, got.message) == (Access.ABSENT, "nvidia-ml-py is not installed (No module named 'pynvml')")


@pytest.mark.parametrize(
    ("calls", "fault"),
    [
        ({"nvmlDeviceGetHandleByIndex(0)": {"error": 15}}, Fault.LOST),
        ({'nvmlDeviceGetEccMode({"handle": 0})': {"error": 16}}, Fault.RESET_REQUIRED),
        ('nvmlDeviceGetNvLinkState({"handle": 0}, 0)', Fault.LOST),
    ],
    ids=["handle-lost", "reset-required", "nvlink-lost"],
)
def test_nvml_lost_or_reset_gpu_is_data_not_an_exception(calls, fault):
    if isinstance(calls, str):
        calls = {calls: {"error": 15}}
    got = nvml_reader(h100_calls(**calls)).read(parts=frozenset(Part))
    assert got.access is Access.OK
    assert got.gpus[0].fault is fault


def test_nvml_call_failure_spoils_only_its_part():
    got = nvml_reader(h100_calls(**{'nvmlDeviceGetRemappedRows({"handle": 0})': {"error": 999}})).read(
        parts=frozenset(Part)
    )
    g = got.gpus[0]
    assert g.error(Part.ECC) == "nvmlDeviceGetRemappedRows: NVML return code 999 (NVML error 999)"
    assert g.error(Part.NVLINK) is None and g.error(Part.PCIE_THERMAL) is None
    assert g.pcie_width == 16


def test_nvml_links_are_read_until_not_supported():
    calls = {
        f'nvmlDeviceGetNvLinkState({{"handle": 0}}, {link})': {"result": 0 if link == 5 else 1} for link in range(18)
    }
    calls['nvmlDeviceGetNvLinkState({"handle": 0}, 18)'] = {"error": 3}
    got = nvml_reader(h100_calls(**calls)).read(parts=frozenset({Part.NVLINK}))
    links = got.gpus[0].nvlinks
    assert len(links) == 18 and [i for i, up in enumerate(links) if not up] == [5]


def test_nvml_uses_the_old_clock_reason_call_where_the_new_one_is_missing():
    calls = h100_calls(**{'nvmlDeviceGetCurrentClocksThrottleReasons({"handle": 0})': {"result": 0x40}})
    module = ReplayNvml(calls, missing=["nvmlDeviceGetCurrentClocksEventReasons"])
    got = nvml.NvmlReader(load=lambda: module).read(parts=frozenset({Part.PCIE_THERMAL}))
    assert got.gpus[0].clock_events == 0x40


def test_nvml_reads_only_the_parts_asked_for():
    module = ReplayNvml(h100_calls())
    nvml.NvmlReader(load=lambda: module).read(parts=frozenset({Part.IDENTITY}))
    assert set(module.called) == {
        "nvmlInit",
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlShutdown",
    }


def test_nvml_preferred_nvidia_smi_only_when_nvml_cannot_load(tmp_path):
    log = fake_smi(tmp_path / "bin", h100_answers())
    with_nvml = smi_check("gpu-count", tmp_path, nvml_reader=nvml_reader())
    assert run_one(with_nvml).message == "1 NVIDIA GPU found by NVML"
    assert calls_of(log) == []
    driver_gone = smi_check("gpu-count", tmp_path, nvml_reader=nvml_reader(h100_calls(**{"nvmlInit()": {"error": 9}})))
    assert run_one(driver_gone).reason == "GpuDriverNotLoaded"  # NVML loaded and spoke: no fallback
    assert calls_of(log) == []
    library_gone = smi_check(
        "gpu-count", tmp_path, nvml_reader=nvml_reader(h100_calls(**{"nvmlInit()": {"error": 12}}))
    )
    assert run_one(library_gone).message.startswith("1 NVIDIA GPU found by nvidia-smi")


# === gpu-count logic ==================================================================================


EIGHT = tuple(gpu(i) for i in range(8))


@pytest.mark.parametrize(
    ("found", "options", "instance_type", "status", "reason", "message"),
    [
        (
            EIGHT,
            {"expectedCount": 8},
            None,
            CheckStatus.OK,
            "GpuCountGood",
            "8 NVIDIA GPUs found by NVML, 8 expected (option expectedCount)",
        ),
        (
            EIGHT[:7],
            {"expectedCount": 8},
            None,
            CheckStatus.PROBLEM,
            "GpuMissing",
            "7 of 8 expected NVIDIA GPUs found by NVML (option expectedCount)",
        ),
        (
            EIGHT,
            {},
            "p4d.24xlarge",
            CheckStatus.OK,
            "GpuCountGood",
            "8 NVIDIA GPUs found by NVML, 8 expected (instance type p4d.24xlarge)",
        ),
        (
            EIGHT[:4],
            {},
            "Standard_ND96isr_H100_v5",
            CheckStatus.PROBLEM,
            "GpuMissing",
            "4 of 8 expected NVIDIA GPUs found by NVML (instance type Standard_ND96isr_H100_v5)",
        ),
        (
            EIGHT[:4],
            {"instanceTypes": {"p5.48xlarge": 4}},
            "p5.48xlarge",
            CheckStatus.OK,
            "GpuCountGood",
            "4 NVIDIA GPUs found by NVML, 4 expected (instance type p5.48xlarge)",
        ),
        (
            EIGHT,
            {"expectedCount": 4},
            "p5.48xlarge",
            CheckStatus.OK,
            "GpuCountGood",
            "8 NVIDIA GPUs found by NVML, 4 expected (option expectedCount)",
        ),
        (EIGHT[:1], {}, "m5.large", CheckStatus.OK, "GpuCountGood", "1 NVIDIA GPU found by NVML"),
        (
            (),
            {},
            None,
            CheckStatus.PROBLEM,
            "GpuMissing",
            "no NVIDIA GPU found by NVML although NVIDIA software is installed",
        ),
        (
            (),
            {"expectedCount": 8},
            None,
            CheckStatus.PROBLEM,
            "GpuMissing",
            "no NVIDIA GPU found by NVML, 8 expected (option expectedCount)",
        ),
        (
            (*EIGHT[:3], dataclasses.replace(EIGHT[3], fault=Fault.LOST), *EIGHT[4:]),
            {"expectedCount": 8},
            None,
            CheckStatus.PROBLEM,
            "GpuLost",
            "GPU 3 (00000000:13:00.0): GPU is lost",
        ),
        (
            (dataclasses.replace(EIGHT[0], fault=Fault.RESET_REQUIRED),),
            {},
            None,
            CheckStatus.PROBLEM,
            "GpuResetRequired",
            "GPU 0 (00000000:10:00.0): GPU requires reset",
        ),
    ],
    ids=[
        "all-present",
        "one-missing",
        "instance-table",
        "instance-table-azure",
        "instance-option-overrides",
        "option-beats-table",
        "unknown-instance-type",
        "zero-found",
        "zero-found-expected",
        "lost",
        "reset-required",
    ],
)
def test_gpu_count(tmp_path, found, options, instance_type, status, reason, message):
    result = run_one(fake_check("gpu-count", tmp_path, inventory(*found), options=options, instance_type=instance_type))
    assert (result.status, result.condition, result.reason, result.message) == (status, "GpuCount", reason, message)
    if status is CheckStatus.PROBLEM:
        assert result.severity is Severity.CRITICAL
    assert {v.name: v.value for v in result.values}["gpu_count"] == len(found)


def test_gpu_count_learns_the_largest_count_and_names_the_missing_bus_ids(tmp_path):
    run_one(fake_check("gpu-count", tmp_path, inventory(*EIGHT)))
    saved = json.loads((tmp_path / "state" / "gpu-count.json").read_text())
    assert saved == {"maxCount": 8, "busIds": [g.bus_id for g in EIGHT]}
    # a new agent process (restart) remembers: 7 of 8 is a problem naming the GPU that went away
    without_5 = (*EIGHT[:5], *EIGHT[6:])
    result = run_one(fake_check("gpu-count", tmp_path, inventory(*without_5)))
    assert (result.status, result.reason) == (CheckStatus.PROBLEM, "GpuMissing")
    assert result.message == (
        "7 of 8 expected NVIDIA GPUs found by NVML (the most this node has shown); missing: 00000000:15:00.0"
    )
    assert json.loads((tmp_path / "state" / "gpu-count.json").read_text())["maxCount"] == 8  # never falls
    check = fake_check("gpu-count", tmp_path, inventory(*EIGHT, gpu(8)))
    assert run_one(check).status is CheckStatus.OK
    assert json.loads((tmp_path / "state" / "gpu-count.json").read_text())["maxCount"] == 9  # rises on its own


def test_gpu_count_without_learning_has_no_expectation(tmp_path):
    run_one(fake_check("gpu-count", tmp_path, inventory(*EIGHT)))
    result = run_one(fake_check("gpu-count", tmp_path, inventory(*EIGHT[:2]), options={"learnExpectedCount": False}))
    assert (result.status, result.message) == (CheckStatus.OK, "2 NVIDIA GPUs found by NVML")


def test_gpu_count_state_dir_not_writable_still_counts(tmp_path):
    (tmp_path / "state").write_text("a file where the directory should be")
    result = run_one(fake_check("gpu-count", tmp_path, inventory(*EIGHT)))
    assert result.status is CheckStatus.OK
    assert "cannot save" in result.message


@pytest.mark.parametrize(
    ("access", "status", "reason"),
    [
        (Access.NO_DRIVER, CheckStatus.PROBLEM, "GpuDriverNotLoaded"),
        (Access.DRIVER_MISMATCH, CheckStatus.PROBLEM, "GpuDriverMismatch"),
        (Access.GPU_LOST, CheckStatus.PROBLEM, "GpuLost"),
        (Access.FAILED, CheckStatus.UNKNOWN, "GpuCountUnknown"),
    ],
)
def test_gpu_count_when_gpus_cannot_be_read(tmp_path, access, status, reason):
    result = run_one(fake_check("gpu-count", tmp_path, inventory(access=access, message="what the source said")))
    assert (result.status, result.reason) == (status, reason)
    assert "what the source said" in result.message


# === gpu-ecc logic =====================================================================================


def ecc_gpu(index: int, **changes: Any) -> Any:
    return gpu(index, **{**HEALTHY_ECC, **changes})


@pytest.mark.parametrize(
    ("changes", "options", "reason", "severity", "message"),
    [
        (
            {"ecc": EccCounts(volatile_uncorrected=2, aggregate_uncorrected=7)},
            {},
            "GpuEccUncorrectable",
            Severity.CRITICAL,
            "2 uncorrectable ECC errors since the driver loaded",
        ),
        (
            {"remapped_rows": RemappedRows(correctable=0, uncorrectable=3, pending=False, failure=True)},
            {},
            "GpuRowRemapFailure",
            Severity.CRITICAL,
            "row remapping failed (memory can no longer be repaired)",
        ),
        (
            {"remapped_rows": RemappedRows(correctable=1, uncorrectable=0, pending=True, failure=False)},
            {},
            "GpuRowRemapPending",
            Severity.ERROR,
            "row remap pending (takes effect at the next GPU reset)",
        ),
        (
            {"remapped_rows": None, "retired_pages": RetiredPages(single_bit=2, double_bit=0, pending=True)},
            {},
            "GpuRetiredPagesPending",
            Severity.ERROR,
            "page retirement pending (takes effect at the next GPU reset)",
        ),
        (
            {"remapped_rows": None, "retired_pages": RetiredPages(single_bit=60, double_bit=4, pending=False)},
            {},
            "GpuRetiredPagesOverLimit",
            Severity.ERROR,
            "64 retired pages (limit 63)",
        ),
        (
            {"remapped_rows": None, "retired_pages": RetiredPages(single_bit=11, double_bit=0, pending=False)},
            {"retiredPagesLimit": 10},
            "GpuRetiredPagesOverLimit",
            Severity.ERROR,
            "11 retired pages (limit 10)",
        ),
        (
            {"ecc_sram": EccCounts(volatile_corrected=5, aggregate_corrected=10001)},
            {"sramCorrectableLimit": 10000},
            "GpuSramCorrectableOverLimit",
            Severity.ERROR,
            "10001 correctable SRAM ECC errors (limit 10000)",
        ),
        (
            {"ecc_dram": EccCounts(volatile_corrected=20000001, aggregate_corrected=0)},
            {"dramCorrectableLimit": 20000000},
            "GpuDramCorrectableOverLimit",
            Severity.ERROR,
            "20000001 correctable DRAM ECC errors (limit 20000000)",
        ),
    ],
    ids=[
        "uncorrectable",
        "remap-failure",
        "remap-pending",
        "retired-pending",
        "retired-over-63",
        "retired-limit-option",
        "sram-option",
        "dram-option",
    ],
)
def test_gpu_ecc_problem_on_any_gpu_not_only_gpu0(tmp_path, changes, options, reason, severity, message):
    gpus = [ecc_gpu(i) for i in range(8)]
    gpus[5] = ecc_gpu(5, **changes)
    result = run_one(fake_check("gpu-ecc", tmp_path, inventory(*gpus), options=options))
    assert (result.status, result.condition, result.reason, result.severity) == (
        CheckStatus.PROBLEM,
        "GpuEcc",
        reason,
        severity,
    )
    assert result.message == f"GPU 5 (00000000:15:00.0): {message}"


@pytest.mark.parametrize(
    ("changes", "options"),
    [
        ({"ecc": EccCounts(volatile_corrected=900, aggregate_corrected=5000, aggregate_uncorrected=3)}, {}),
        ({"ecc_sram": EccCounts(aggregate_corrected=10001), "ecc_dram": EccCounts(aggregate_corrected=30000000)}, {}),
        ({"remapped_rows": None, "retired_pages": RetiredPages(single_bit=63, double_bit=0, pending=False)}, {}),
    ],
    ids=["counts-are-metrics", "location-limits-off-by-default", "retired-at-limit"],
)
def test_gpu_ecc_counts_alone_are_not_problems(tmp_path, changes, options):
    result = run_one(fake_check("gpu-ecc", tmp_path, inventory(ecc_gpu(0, **changes)), options=options))
    assert (result.status, result.reason) == (CheckStatus.OK, "GpuEccGood")


def test_gpu_ecc_several_problems_one_verdict_most_severe_reason(tmp_path):
    gpus = [
        ecc_gpu(0, remapped_rows=RemappedRows(correctable=1, uncorrectable=0, pending=True, failure=False)),
        ecc_gpu(1),
        ecc_gpu(2, ecc=EccCounts(volatile_uncorrected=1)),
        gpu(3, fault=Fault.LOST),
    ]
    result = run_one(fake_check("gpu-ecc", tmp_path, inventory(*gpus)))
    assert (result.reason, result.severity) == ("GpuEccUncorrectable", Severity.CRITICAL)
    assert result.message == (
        "GPU 0 (00000000:10:00.0): row remap pending (takes effect at the next GPU reset); "
        "GPU 2 (00000000:12:00.0): 1 uncorrectable ECC errors since the driver loaded; "
        "unreadable GPU 3 (00000000:13:00.0): GPU is lost"
    )


def test_gpu_ecc_unreadable_gpu_without_problems_elsewhere_is_unknown(tmp_path):
    broken = gpu(1, errors=(nvml.ReadError(part=Part.ECC, message="nvmlDeviceGetRemappedRows: Unknown Error"),))
    result = run_one(fake_check("gpu-ecc", tmp_path, inventory(ecc_gpu(0), broken)))
    assert (result.status, result.reason) == (CheckStatus.UNKNOWN, "GpuEccUnknown")
    assert result.message == "cannot read ECC state: GPU 1 (00000000:11:00.0): nvmlDeviceGetRemappedRows: Unknown Error"


def test_gpu_ecc_reads_locations_only_when_a_location_limit_is_set(tmp_path):
    plain_check = fake_check("gpu-ecc", tmp_path, inventory(ecc_gpu(0)))
    plain_check.run()
    assert plain_check._readers.nvml.asked == [frozenset({Part.ECC})]
    with_limit = fake_check("gpu-ecc", tmp_path, inventory(ecc_gpu(0)), options={"dramCorrectableLimit": 1})
    with_limit.run()
    assert with_limit._readers.nvml.asked == [frozenset({Part.ECC, Part.ECC_LOCATIONS})]


def test_gpu_ecc_metrics(tmp_path):
    g = ecc_gpu(
        2,
        ecc=EccCounts(volatile_corrected=1, volatile_uncorrected=0, aggregate_corrected=9, aggregate_uncorrected=0),
        retired_pages=RetiredPages(single_bit=3, double_bit=1, pending=False),
    )
    result = run_one(fake_check("gpu-ecc", tmp_path, inventory(g)))
    got = {(v.name, tuple(sorted(v.labels.items()))): v.value for v in result.values}
    gpu2 = (("gpu", "2"),)
    assert got == {
        ("gpu_ecc_errors", (("counter", "volatile"), *gpu2, ("type", "corrected"))): 1,
        ("gpu_ecc_errors", (("counter", "volatile"), *gpu2, ("type", "uncorrected"))): 0,
        ("gpu_ecc_errors", (("counter", "aggregate"), *gpu2, ("type", "corrected"))): 9,
        ("gpu_ecc_errors", (("counter", "aggregate"), *gpu2, ("type", "uncorrected"))): 0,
        ("gpu_remapped_rows", (*gpu2, ("type", "correctable"))): 0,
        ("gpu_remapped_rows", (*gpu2, ("type", "uncorrectable"))): 0,
        ("gpu_row_remap_pending", gpu2): 0,
        ("gpu_row_remap_failure", gpu2): 0,
        ("gpu_retired_pages", (("cause", "single_bit"), *gpu2)): 3,
        ("gpu_retired_pages", (("cause", "double_bit"), *gpu2)): 1,
        ("gpu_retired_pages_pending", gpu2): 0,
    }


# === gpu-nvlink and gpu-pcie-thermal logic ==============================================================


def test_gpu_nvlink_inactive_link_on_any_gpu(tmp_path):
    gpus = [gpu(i, nvlinks=(True,) * 12) for i in range(8)]
    gpus[6] = gpu(6, nvlinks=(True, True, False, True, True, True, True, False, True, True, True, True))
    result = run_one(fake_check("gpu-nvlink", tmp_path, inventory(*gpus)))
    assert (result.status, result.condition, result.reason, result.severity) == (
        CheckStatus.PROBLEM,
        "GpuNvlink",
        "GpuNvlinkInactive",
        Severity.ERROR,
    )
    assert result.message == "GPU 6 (00000000:16:00.0): NVLink 2, 7 inactive (2 of 12)"


def test_gpu_nvlink_without_nvlink_is_fine(tmp_path):
    result = run_one(fake_check("gpu-nvlink", tmp_path, inventory(gpu(0, nvlinks=()))))
    assert (result.status, result.reason, result.values) == (CheckStatus.OK, "GpuNvlinkGood", ())


@pytest.mark.parametrize(
    ("fields", "reasons", "message"),
    [
        (
            {"pcie_width": 8, "pcie_max_width": 16, "clock_events": 0x1},
            ["GpuPcieLinkDegraded"],
            "GPU 1 (00000000:11:00.0): PCIe link x8 of x16",
        ),
        (
            {"pcie_width": 16, "pcie_max_width": 16, "clock_events": 0x40, "temperature": 91},
            ["GpuThermalSlowdown"],
            "GPU 1 (00000000:11:00.0): thermal slowdown active at 91 C",
        ),
        (
            {"pcie_width": 16, "pcie_max_width": 16, "clock_events": 0x20},
            ["GpuThermalSlowdown"],
            "GPU 1 (00000000:11:00.0): thermal slowdown active",
        ),
        (
            {"pcie_width": 4, "pcie_max_width": 16, "clock_events": 0x40},
            ["GpuPcieLinkDegraded", "GpuThermalSlowdown"],
            None,
        ),
        ({"pcie_width": 16, "pcie_max_width": 16, "clock_events": 0x4 | 0x8 | 0x1}, [], None),
    ],
    ids=["narrow-link", "hw-thermal", "sw-thermal", "both", "power-cap-is-not-thermal"],
)
def test_gpu_pcie_thermal_warnings(tmp_path, fields, reasons, message):
    gpus = [gpu(0, pcie_width=16, pcie_max_width=16, clock_events=0), gpu(1, **fields)]
    results = fake_check("gpu-pcie-thermal", tmp_path, inventory(*gpus)).run()
    problems = [r for r in results if r.status is CheckStatus.PROBLEM]
    assert [r.reason for r in problems] == reasons
    assert all(
        r.condition is None and r.severity is Severity.WARNING for r in results if r.status is CheckStatus.PROBLEM
    )
    if message is not None:
        assert problems[0].message == message
    if not reasons:
        assert [(r.status, r.reason) for r in results] == [(CheckStatus.OK, "GpuPcieThermalGood")]


# === options, declarations, imports ======================================================================


@pytest.mark.parametrize(
    ("kind", "options", "field_name"),
    [
        ("gpu-count", {"expectedCount": 0}, "expectedCount"),
        ("gpu-count", {"expectedCount": "8"}, "expectedCount"),
        ("gpu-count", {"instanceTypes": {"p5.48xlarge": 0}}, "instanceTypes.p5.48xlarge"),
        ("gpu-count", {"instanceTypes": ["p5.48xlarge"]}, "instanceTypes"),
        ("gpu-count", {"learnExpectedCount": "yes"}, "learnExpectedCount"),
        ("gpu-ecc", {"retiredPagesLimit": -1}, "retiredPagesLimit"),
        ("gpu-ecc", {"sramCorrectableLimit": True}, "sramCorrectableLimit"),
        ("gpu-nvlink", {"source": "dcgm"}, "source"),
        ("gpu-pcie-thermal", {"commandTimeout": "soon"}, "commandTimeout"),
        ("gpu-pcie-thermal", {"commandTimeout": 0}, "commandTimeout"),
        ("gpu-ecc", {"expectedCount": 8}, "expectedCount"),
    ],
)
def test_bad_options_name_the_option(tmp_path, kind, options, field_name):
    with pytest.raises(CheckConfigError) as caught:
        CHECKS[kind](name=kind, context=context(tmp_path), options=options)
    assert caught.value.field == field_name


def test_checks_yaml_declares_every_check_with_its_condition():
    declared = yaml.safe_load((ROOT / "plugins" / "nvidia" / "checks.yaml").read_text())["checks"]
    by_name = {d["name"]: d for d in declared}
    assert set(by_name) == set(CHECKS) | set(ACTIVE)
    conditions = {}
    for name, decl in by_name.items():
        module, _, attr = decl["use"].partition(":")
        factory = getattr(import_builtin(module), attr)
        assert factory is {**CHECKS, **ACTIVE}[name]
        check = factory(name=name, context=CheckContext(), options=dict(decl.get("options", {})))
        assert check.name == name
        assert all(isinstance(c, ConditionSpec) and c.source == name for c in check.conditions)
        conditions[name] = [(c.type, c.reason, c.accelerator) for c in check.conditions]
    assert conditions == {
        "gpu-count": [("GpuCount", "GpuCountGood", True)],
        "gpu-ecc": [("GpuEcc", "GpuEccGood", True)],
        "gpu-nvlink": [("GpuNvlink", "GpuNvlinkGood", True)],
        "gpu-pcie-thermal": [],
        "dcgm-diag": [],
        "nccl-loopback": [],
    }


def test_importing_the_checks_loads_no_nvml():
    code = (
        "import sys\n"
        "from agent.checks.builtin import import_builtin\n"
        "from agent.checks.model import CheckContext\n"
        "import_builtin('nvidia.checks').GpuCountCheck(name='gpu-count', context=CheckContext(), options={})\n"
        "print('pynvml' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ}
    )
    assert out.stdout.strip() == "False"
