"""The active NVIDIA checks: DCGM diagnostics (``dcgmi diag -r N -j``) and the NCCL loopback all-reduce.

Both load every GPU of the node, so they are declared ``active`` (exclusive, never while a pod holds a
GPU) and ``enabled: false``: they run when a validation request names them. Each returns one verdict
per GPU where the tool reports per GPU (DCGM), or one for the node (NCCL), with ``devices`` naming the
GPUs' device keys (``gpu:0000:3b:00.0``).

Verdicts: OK = pass, PROBLEM = fail, UNKNOWN = the tool is absent, timed out (reason ``Timeout``), was
cancelled, or printed what we cannot read. Never a pass without a reading. ``condition`` is None: a
failure is a validation record (and an Event), the passive checks own the node conditions.

DCGM's JSON, as ``dcgmi/Diag.cpp`` writes it (NVIDIA/DCGM, ``HelperJsonBuildOutput``):

- DCGM 4.x: ``{"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results":
  [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": <gpu id>, "status", "warnings":
  [{"warning", "error_id", ...}], "info": [...]}], "test_summary": {...}}]}], "runtime_error"?},
  "entity_groups": [...], "metadata": {"version", "Driver Version Detected"}}``; status is one of
  ``Pass``, ``Fail``, ``Warn``, ``Skip`` (``Not Run`` results are left out).
- DCGM 3.x: ``{"DCGM GPU Diagnostic": {"test_categories": [... "results": [{"gpu_id": "0", "status",
  "warnings": [...], "info": ...}]]}}``; deployment tests carry one result for all GPUs (``gpu_ids``
  "0,1,2" in NVVS's own output).

A DCGM GPU id is taken to be the NVML index (DCGM enumerates GPUs through NVML); the PCI address
comes from NVML (or nvidia-smi), as for the other NVIDIA checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.sdk import (
    CheckConfigError,
    CheckContext,
    CheckResult,
    CheckStatus,
    ConditionSpec,
    ProcessResult,
    Value,
    tool_trouble,
    unknown,
)

from .checks import SOURCES, Readers, _Options, read_gpus
from .nvml import Access, NvmlReader, Part
from .smi import SmiReader

GRACE = 30.0  # the scheduler's timeout is the command's plus this, so the command's own timeout comes first
DCGM_LEVELS = (1, 2, 3, 4)
# Default command timeouts per level. Typical run times: level 1 seconds, level 2 about 2 minutes,
# level 3 about 15 minutes (DCGM diagnostics guide; NVSentinel allows 1800 s for level 2).
DCGM_TIMEOUTS: Mapping[int, float] = {1: 120.0, 2: 600.0, 3: 1800.0, 4: 7200.0}
NCCL_TIMEOUT = 600.0

_STATUSES = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "skip", "skipped": "skip", "not run": "skip"}
# dcgmi's message when nv-hostengine is not running (dcgmi/Command.cpp: "Error: unable to establish a connection
# to the specified host: ...").
_NO_HOSTENGINE = re.compile(r"unable to establish a connection to the specified host", re.IGNORECASE)
_PCI = re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?")


# --- shared verdicts -------------------------------------------------------------------------------


def pci_key(bus_id: str | None) -> str | None:
    """``gpu:dddd:bb:ss.f`` for an NVML/nvidia-smi bus id (``00000000:3B:00.0``), None when it is none."""
    match = _PCI.fullmatch((bus_id or "").strip())
    if match is None:
        return None
    domain, bus, slot, function = match.groups()
    return f"gpu:{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(slot, 16):02x}.{int(function or '0')}"


def gpu_keys(readers: Readers, source: str) -> tuple[dict[int, str], str]:
    """GPU index -> device key, and a note when the map cannot be read (results then name the node)."""
    inventory = read_gpus(readers, source=source, parts=frozenset({Part.IDENTITY}))
    if inventory.access is not Access.OK:
        return {}, f"GPU PCI addresses unknown ({inventory.source}: {inventory.message})"
    keys = {g.index: k for g in inventory.gpus if (k := pci_key(g.bus_id)) is not None}
    return keys, ""


# --- DCGM diagnostics: parsing --------------------------------------------------------------------


class DcgmParseError(ValueError):
    """dcgmi printed something that is not its diagnostic JSON (the message says what)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DiagResult:
    """One result line: a test's verdict for some GPUs (``gpus`` () = not tied to a GPU)."""

    category: str
    test: str
    status: str  # pass | fail | warn | skip
    gpus: tuple[int, ...] = ()
    entity: str = ""  # a non-GPU entity the result is about ("CPU 0"), else ""
    messages: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class DiagReport:
    results: tuple[DiagResult, ...]
    gpus: tuple[int, ...] = ()  # the GPUs the run covered (entity_groups), where listed
    version: str | None = None
    runtime_error: str | None = None


def _json_object(text: str) -> Any:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise DcgmParseError("no JSON object in the output")
    try:
        return json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise DcgmParseError(f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None


def _ids(value: Any) -> tuple[int, ...]:
    """GPU ids from ``entity_id`` (int), ``gpu_id`` ("0") or ``gpu_ids`` ("0,1,2")."""
    if isinstance(value, bool):
        raise DcgmParseError(f"GPU id {value!r} is not a number")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        try:
            return tuple(int(p) for p in value.split(",") if p.strip())
        except ValueError:
            raise DcgmParseError(f"GPU id {value!r} is not a number") from None
    raise DcgmParseError(f"GPU id {value!r} is not a number")


def _messages(entry: Mapping[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    warnings = entry.get("warnings") or []
    for w in warnings if isinstance(warnings, list) else [warnings]:
        text = w.get("warning") or w.get("warnings") if isinstance(w, dict) else w
        if isinstance(text, str) and text.strip():
            out.append(text.strip())
    return tuple(out)


def _result(category: str, test: str, entry: Any) -> DiagResult:
    if not isinstance(entry, dict):
        raise DcgmParseError(f"{test}: a result is {type(entry).__name__}, not an object")
    raw = entry.get("status")
    status = _STATUSES.get(raw.strip().lower()) if isinstance(raw, str) else None
    if status is None:
        raise DcgmParseError(f"{test}: unknown status {raw!r}")
    group = entry.get("entity_group")
    if group is not None and str(group).upper() != "GPU":
        entity = f"{group} {entry.get('entity_id', '?')}"
        return DiagResult(category=category, test=test, status=status, entity=entity, messages=_messages(entry))
    for key in ("entity_id", "gpu_id", "gpu_ids"):
        if key in entry:
            gpus = _ids(entry[key])
            break
    else:
        gpus = ()
    return DiagResult(category=category, test=test, status=status, gpus=gpus, messages=_messages(entry))


def _covered(doc: Mapping[str, Any]) -> tuple[int, ...]:
    groups = doc.get("entity_groups")
    out: list[int] = []
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, dict) and str(group.get("entity_group", "")).upper() == "GPU":
            for entity in group.get("entities") or []:
                if isinstance(entity, dict) and isinstance(entity.get("entity_id"), int):
                    out.append(entity["entity_id"])
    return tuple(sorted(set(out)))


def parse_dcgm_diag(text: str) -> DiagReport:
    """The results in ``dcgmi diag -j`` output (DCGM 3.x or 4.x). Raises DcgmParseError."""
    doc = _json_object(text)
    root = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic")) if isinstance(doc, dict) else None
    if not isinstance(root, dict):
        raise DcgmParseError("no 'DCGM Diagnostic' (4.x) or 'DCGM GPU Diagnostic' (3.x) object")
    categories = root.get("test_categories", [])
    if not isinstance(categories, list):
        raise DcgmParseError("test_categories is not a list")
    results: list[DiagResult] = []
    for category in categories:
        if not isinstance(category, dict):
            raise DcgmParseError("a test category is not an object")
        name = str(category.get("category", "?"))
        for test in category.get("tests") or []:
            if test is None:
                continue  # DCGM 3.x leaves nulls between tests
            if not isinstance(test, dict) or not isinstance(test.get("results", []), list):
                raise DcgmParseError(f"{name}: a test is not an object with a results list")
            results += [_result(name, str(test.get("name", "?")), r) for r in test.get("results", [])]
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = metadata.get("version") or root.get("version")
    error = root.get("runtime_error")
    return DiagReport(
        results=tuple(results),
        gpus=_covered(doc),
        version=str(version) if version else None,
        runtime_error=str(error) if error else None,
    )


# --- DCGM diagnostics: the check ------------------------------------------------------------------


def _line(r: DiagResult) -> str:
    return f"{r.category}/{r.test}: {r.status}" + (f" ({'; '.join(r.messages)[:300]})" if r.messages else "")


def judge_gpu(index: int, label: str, results: Sequence[DiagResult], key: str | None) -> CheckResult:
    """One GPU's verdict from the results that name it."""
    devices = (key,) if key else ()
    failed = [r for r in results if r.status == "fail"]
    if failed:
        return CheckResult(
            status=CheckStatus.PROBLEM,
            condition=None,
            reason="DcgmDiagFailed",
            message=f"{label}: " + "; ".join(_line(r) for r in failed),
            devices=devices,
        )
    if not any(r.status in ("pass", "warn") for r in results):
        return unknown("DcgmDiagSkipped", f"{label}: no test ran on this GPU (all skipped)", devices)
    warned = [r for r in results if r.status == "warn"]
    note = f"; warnings: {'; '.join(_line(r) for r in warned)}" if warned else ""
    passed = sum(r.status == "pass" for r in results)
    return CheckResult(
        status=CheckStatus.OK,
        condition=None,
        reason="DcgmDiagPassed",
        message=f"{label}: {passed} test results passed{note}",
        devices=devices,
    )


def judge_report(report: DiagReport, keys: Mapping[int, str], note: str) -> list[CheckResult]:
    """Per-GPU verdicts, plus one for the node when a node-wide result failed."""
    if not report.results:
        why = report.runtime_error or "the diagnostic printed no results"
        return [unknown("DcgmDiagNoResults" if not report.runtime_error else "DcgmRuntimeError", why)]
    gpus = sorted(set(report.gpus) | {g for r in report.results for g in r.gpus})
    out = []
    for index in gpus:
        key = keys.get(index)
        label = f"GPU {index}" + (f" ({key.removeprefix('gpu:')})" if key else f" ({note or 'PCI address unknown'})")
        out.append(judge_gpu(index, label, [r for r in report.results if index in r.gpus], key))
    node_wide = [r for r in report.results if not r.gpus]
    failed = [r for r in node_wide if r.status == "fail"]
    if failed:
        text = "; ".join((f"{r.entity}: " if r.entity else "") + _line(r) for r in failed)
        out.append(CheckResult(status=CheckStatus.PROBLEM, condition=None, reason="DcgmDiagFailed", message=text))
    elif not gpus:
        out.append(judge_gpu(-1, "node", node_wide, None))
    if any(g not in keys for g in gpus):
        return [merge(out)]  # a verdict naming no device speaks for the node: one, never a pass beside a fail
    return out


def merge(results: Sequence[CheckResult]) -> CheckResult:
    """One node verdict from several: the worst status (PROBLEM, then UNKNOWN, then OK), every message."""
    order = (CheckStatus.PROBLEM, CheckStatus.UNKNOWN, CheckStatus.OK)
    worst = min(results, key=lambda r: order.index(r.status))
    message = "; ".join(r.message for r in results)
    return CheckResult(status=worst.status, condition=None, reason=worst.reason, message=message[:2000])


class DcgmDiagCheck:
    """``dcgmi diag -r <level> -j`` on every GPU; one verdict per GPU. Options: level (2),
    commandTimeout (per level), dcgmi (command), source (auto: where GPU PCI addresses come from)."""

    interval: float | None = None
    conditions: tuple[ConditionSpec, ...] = ()

    def __init__(
        self, *, name: str, context: CheckContext, options: Mapping[str, Any], readers: Readers | None = None
    ) -> None:
        self.name = name
        self._context = context
        opts = _Options(options, known=frozenset({"level", "commandTimeout", "dcgmi", "source"}))
        level = opts.integer("level", 2, minimum=1)
        if level is None or level not in DCGM_LEVELS:
            raise CheckConfigError("level", f"expected one of {', '.join(map(str, DCGM_LEVELS))}, got {level!r}")
        self.level: int = level
        self.command_timeout = opts.seconds("commandTimeout", DCGM_TIMEOUTS[level])
        self.timeout = self.command_timeout + GRACE
        self._command = str(options.get("dcgmi", "dcgmi"))
        self._source = opts.choice("source", "auto", SOURCES)
        self._readers = readers or Readers(nvml=NvmlReader(), smi=SmiReader(run=context.run, timeout=10.0))

    def run(self) -> list[CheckResult]:
        argv = (self._command, "diag", "-r", str(self.level), "-j")
        result = self._context.run(argv, timeout=self.command_timeout)
        trouble = tool_trouble(result)
        if trouble is not None:
            return [trouble]
        if _NO_HOSTENGINE.search(result.stdout + result.stderr):
            return [unknown("DcgmHostEngineUnreachable", f"dcgmi cannot reach nv-hostengine: {result.describe()}")]
        try:
            report = parse_dcgm_diag(result.stdout)
        except DcgmParseError as exc:
            cut = " (output cut at the size limit)" if result.stdout_truncated else ""
            return [unknown("OutputUnparsable", f"dcgmi diag -r {self.level}: {exc}{cut}; {result.describe()}")]
        keys, note = gpu_keys(self._readers, self._source)
        return judge_report(report, keys, note)


# --- NCCL loopback (nccl-tests all_reduce_perf) ---------------------------------------------------


class NcclParseError(ValueError):
    """all_reduce_perf printed something that is not its result table."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NcclRow:
    size: int  # bytes
    busbw_out: float  # GB/s, out-of-place
    busbw_in: float  # GB/s, in-place
    wrong: int  # #wrong of both columns together ("N/A" counts 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class NcclReport:
    rows: tuple[NcclRow, ...]
    avg_busbw: float  # GB/s, the "# Avg bus bandwidth" line
    out_of_bounds: int | None = None  # "# Out of bounds values : N OK|FAILED"

    @property
    def peak_busbw(self) -> float:
        return max((max(r.busbw_out, r.busbw_in) for r in self.rows), default=0.0)

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)


_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", re.MULTILINE)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)", re.MULTILINE)


def _wrong(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _row(line: str) -> NcclRow | None:
    """A data row: size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong."""
    parts = line.split()
    if len(parts) < 13 or not parts[0].isdigit():
        return None
    try:
        return NcclRow(
            size=int(parts[0]),
            busbw_out=float(parts[7]),
            busbw_in=float(parts[11]),
            wrong=_wrong(parts[8]) + _wrong(parts[12]),
        )
    except ValueError:
        return None


def parse_all_reduce(text: str) -> NcclReport:
    """The table and summary of nccl-tests ``all_reduce_perf`` output. Raises NcclParseError."""
    rows = tuple(r for line in text.splitlines() if not line.startswith("#") and (r := _row(line)))
    avg = _AVG.search(text)
    if avg is None:
        raise NcclParseError("no '# Avg bus bandwidth' line")
    if not rows:
        raise NcclParseError("no result rows")
    oob = _OOB.search(text)
    return NcclReport(rows=rows, avg_busbw=float(avg.group(1)), out_of_bounds=int(oob.group(1)) if oob else None)


# Bus-bandwidth floors (GB/s, the "# Avg bus bandwidth" of -b 8 -e 8G) per instance type, only where a
# public source gives a figure: none found for a single-node -b 8 -e 8G average, so the table is empty
# and a floor comes from the option busbwFloor or busbwFloors. NVSentinel's GB200 NVL figures (>= 580 /
# >= 700 GB/s) are peak bus bandwidths of large messages across a rack (docs/checks-nvidia.md).
NCCL_FLOORS: Mapping[str, float] = {}


class NcclLoopbackCheck:
    """``all_reduce_perf -b 8 -e 8G -f 2 -g <gpus>`` on one node; one verdict for the node covering every
    GPU. Options: busbwFloor (GB/s), busbwFloors ({instance type: GB/s}), measure (avg | peak),
    gpus (null: all), command, commandTimeout (10m), source."""

    interval: float | None = None
    conditions: tuple[ConditionSpec, ...] = ()

    def __init__(
        self, *, name: str, context: CheckContext, options: Mapping[str, Any], readers: Readers | None = None
    ) -> None:
        known = {"busbwFloor", "busbwFloors", "measure", "gpus", "command", "commandTimeout", "source"}
        opts = _Options(options, known=frozenset(known))
        self.name = name
        self._context = context
        self.command_timeout = opts.seconds("commandTimeout", NCCL_TIMEOUT)
        self.timeout = self.command_timeout + GRACE
        self._measure = opts.choice("measure", "avg", ("avg", "peak"))
        self._gpus = opts.integer("gpus", None, minimum=1)
        self._command = str(options.get("command", "all_reduce_perf"))
        self._source = opts.choice("source", "auto", SOURCES)
        self._floor = _floor(options.get("busbwFloor"), "busbwFloor")
        floors = options.get("busbwFloors", {})
        if not isinstance(floors, Mapping):
            raise CheckConfigError("busbwFloors", f"expected a mapping of instance type to GB/s, got {floors!r}")
        self._floors = {**NCCL_FLOORS, **{str(k).lower(): _floor(v, f"busbwFloors.{k}") for k, v in floors.items()}}
        self._readers = readers or Readers(nvml=NvmlReader(), smi=SmiReader(run=context.run, timeout=10.0))

    def _floor_for(self) -> tuple[float | None, str]:
        if self._floor is not None:
            return self._floor, "option busbwFloor"
        try:
            kind = (self._context.instance_type() or "").lower()
        except Exception:  # the context's lookup failing is no reason to fail the check
            kind = ""
        floor = self._floors.get(kind)
        return (floor, f"instance type {kind}") if floor is not None else (None, "")

    def run(self) -> list[CheckResult]:
        keys, note = gpu_keys(self._readers, self._source)
        count = self._gpus or len(keys)
        if count < 1:
            return [unknown("NoGpus", f"no GPU to run all_reduce_perf on ({note or 'NVML saw none'}; or set gpus)")]
        argv = (self._command, "-b", "8", "-e", "8G", "-f", "2", "-g", str(count))
        result = self._context.run(argv, timeout=self.command_timeout)
        trouble = tool_trouble(result)
        if trouble is not None:
            return [trouble]
        try:
            report = parse_all_reduce(result.stdout)
        except NcclParseError as exc:
            return [unknown("OutputUnparsable", f"all_reduce_perf: {exc}; {result.describe()}")]
        return [self._judge(report, result, tuple(keys[i] for i in sorted(keys)))]

    def _judge(self, report: NcclReport, result: ProcessResult, devices: tuple[str, ...]) -> CheckResult:
        measured = report.avg_busbw if self._measure == "avg" else report.peak_busbw
        values = (
            Value(name="nccl_busbw_gbps", value=report.avg_busbw, labels={"measure": "avg"}),
            Value(name="nccl_busbw_gbps", value=report.peak_busbw, labels={"measure": "peak"}),
        )
        seen = f"{self._measure} bus bandwidth {measured:.2f} GB/s over {len(report.rows)} sizes"

        def verdict(status: CheckStatus, reason: str, message: str) -> CheckResult:
            return CheckResult(
                status=status, condition=None, reason=reason, message=message, devices=devices, values=values
            )

        if report.wrong or (report.out_of_bounds or 0) > 0 or result.exit_code != 0:
            why = (
                f"{report.wrong} wrong values, {report.out_of_bounds or 0} out of bounds, exit code {result.exit_code}"
            )
            return verdict(CheckStatus.PROBLEM, "NcclDataErrors", f"all_reduce_perf: {why}; {seen}")
        floor, where = self._floor_for()
        if floor is None:
            return verdict(CheckStatus.OK, "NcclLoopbackRan", f"{seen} (no floor configured: reported only)")
        if measured < floor:
            return verdict(CheckStatus.PROBLEM, "NcclBandwidthLow", f"{seen}, below the floor {floor:g} GB/s ({where})")
        return verdict(CheckStatus.OK, "NcclBandwidthGood", f"{seen}, at or above the floor {floor:g} GB/s ({where})")


def _floor(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CheckConfigError(key, f"expected a bandwidth in GB/s > 0 (or null), got {value!r}")
    return float(value)
