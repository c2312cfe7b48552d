"""The active Neuron checks: ``nccom-test`` all-reduce bandwidth and Neuron Observer's ``nobs health run``.

Both occupy every NeuronCore of the node, so they are declared ``active`` (never while a pod holds a
Neuron device) and ``enabled: false`` (they run when a validation request names them). Verdicts:
OK = pass, PROBLEM = fail, UNKNOWN = the tool is absent, timed out (``Timeout``), or printed what we
cannot read; a busy device is UNKNOWN ``DeviceBusy``, never a fail. ``condition`` is None: the
verdict is a validation record; the passive checks own the node conditions.

``nccom-test -r <ranks> allr`` prints (Neuron docs, ``tools/neuron-sys-tools/nccom-test.rst``)::

         size(B)    count(elems)     type    time(us)    algbw(GB/s)    busbw(GB/s)
        33554432        33554432    uint8         768          40.69          40.69
    Avg bus bandwidth:      40.6901GB/s

``nobs health run`` (Neuron Observer, public beta, Neuron 2.33; Neuron docs
``tools/neuron-observer/health-check.rst``) runs reference NEFFs on every NeuronCore and reports one of
``passed``, ``failed``, ``timeout``, ``device_busy``. ASSUMPTIONS (no published output found): the
outcome is printed as the value of a line (``outcome: passed``, ``status=failed``, or the word alone
on its line; a count such as ``3 passed, 0 failed`` is not an outcome); a line that also names a
device (``neuron3``, ``device 3``) is that device's outcome; a JSON document is read for
``outcome``/``status``/``result`` keys at the top and in a ``devices`` list. Anything else is UNKNOWN
``OutputUnparsable`` quoting the output, never a pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
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

from .devices import DeviceScanError, discover, opt_duration, reject_unknown
from .neuronls import NeuronLs, ToolState

GRACE = 30.0  # the scheduler's timeout is the command's plus this, so the command's own timeout comes first


def device_keys(context: CheckContext) -> tuple[str, ...]:
    """``neuron:neuron<N>`` for every Neuron device on the host (() when none can be listed)."""
    try:
        host = discover(sys_root=context.sys_root, dev_root=context.dev_root)
    except DeviceScanError:
        return ()
    return tuple(f"neuron:neuron{i}" for i in sorted(host.usable))


def _positive(options: Mapping[str, Any], key: str) -> float | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CheckConfigError(key, f"expected a number > 0 (or null), got {value!r}")
    return float(value)


# --- nccom-test -------------------------------------------------------------------------------------


class NccomParseError(ValueError):
    """nccom-test printed something that is not its result table."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NccomRow:
    size: int
    busbw: float  # GB/s


@dataclass(frozen=True, kw_only=True, slots=True)
class NccomReport:
    rows: tuple[NccomRow, ...]
    avg_busbw: float  # GB/s


_NCCOM_AVG = re.compile(r"Avg bus bandwidth:\s*([0-9.]+)\s*GB/s", re.IGNORECASE)


def parse_nccom(text: str) -> NccomReport:
    """The table and the average of ``nccom-test`` output. Raises NccomParseError."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if "size(B)" in line and "busbw" in line), None)
    if header is None:
        raise NccomParseError("no table header with size(B) and busbw(GB/s)")
    names = lines[header].split()
    size_at, bw_at = names.index("size(B)"), next(i for i, n in enumerate(names) if n.startswith("busbw"))
    rows = []
    for line in lines[header + 1 :]:
        parts = line.split()
        if len(parts) != len(names) or not parts[size_at].isdigit():
            continue
        try:
            rows.append(NccomRow(size=int(parts[size_at]), busbw=float(parts[bw_at])))
        except ValueError:
            continue
    avg = _NCCOM_AVG.search(text)
    if avg is None:
        raise NccomParseError("no 'Avg bus bandwidth' line")
    if not rows:
        raise NccomParseError("no result rows under the table header")
    return NccomReport(rows=tuple(rows), avg_busbw=float(avg.group(1)))


class NccomTestCheck:
    """``nccom-test -r <ranks> allr`` on this node; one verdict covering every Neuron device.
    Options: ranks (null: every NeuronCore neuron-ls lists), busbwFloor (GB/s; null: report only),
    command (nccom-test), neuronLs (neuron-ls), commandTimeout (10m)."""

    interval: float | None = None
    conditions: tuple[ConditionSpec, ...] = ()

    def __init__(self, *, name: str, context: CheckContext, options: Mapping[str, Any]) -> None:
        reject_unknown(options, {"ranks", "busbwFloor", "command", "neuronLs", "commandTimeout"})
        self.name = name
        self._context = context
        self.command_timeout = opt_duration(options, "commandTimeout", "10m")
        self.timeout = self.command_timeout + GRACE
        ranks = options.get("ranks")
        if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
            raise CheckConfigError("ranks", f"expected a whole number >= 1 (or null), got {ranks!r}")
        self._ranks: int | None = ranks
        self._floor = _positive(options, "busbwFloor")
        self._command = str(options.get("command", "nccom-test"))
        self._neuron_ls = NeuronLs(command=str(options.get("neuronLs", "neuron-ls")), timeout=10.0)

    def _count_ranks(self) -> tuple[int | None, str]:
        if self._ranks is not None:
            return self._ranks, ""
        outcome = self._neuron_ls.run(self._context)
        if outcome.state is not ToolState.OK or outcome.report is None:
            return None, f"cannot count NeuronCores: neuron-ls {outcome.state.value} {outcome.detail}".strip()
        cores = sum(d.core_count or 0 for d in outcome.report.devices)
        return (cores, "") if cores else (None, "cannot count NeuronCores: neuron-ls lists none")

    def run(self) -> list[CheckResult]:
        ranks, why = self._count_ranks()
        if ranks is None:
            return [unknown("NeuronCoresUnknown", f"{why} (set option ranks)")]
        result = self._context.run((self._command, "-r", str(ranks), "allr"), timeout=self.command_timeout)
        trouble = tool_trouble(result)
        if trouble is not None:
            return [trouble]
        try:
            report = parse_nccom(result.stdout)
        except NccomParseError as exc:
            return [unknown("OutputUnparsable", f"nccom-test: {exc}; {result.describe()}")]
        return [self._judge(report, result, ranks)]

    def _judge(self, report: NccomReport, result: ProcessResult, ranks: int) -> CheckResult:
        devices = device_keys(self._context)
        values = (Value(name="nccom_busbw_gbps", value=report.avg_busbw, labels={"measure": "avg"}),)
        seen = f"nccom-test all-reduce over {ranks} ranks: avg bus bandwidth {report.avg_busbw:g} GB/s"

        def verdict(status: CheckStatus, reason: str, message: str) -> CheckResult:
            return CheckResult(
                status=status, condition=None, reason=reason, message=message, devices=devices, values=values
            )

        if result.exit_code != 0:
            return verdict(CheckStatus.PROBLEM, "NccomTestFailed", f"{seen}, but {result.describe()}")
        if self._floor is None:
            return verdict(CheckStatus.OK, "NccomTestRan", f"{seen} (no floor configured: reported only)")
        if report.avg_busbw < self._floor:
            return verdict(CheckStatus.PROBLEM, "NccomBandwidthLow", f"{seen}, below the floor {self._floor:g} GB/s")
        return verdict(CheckStatus.OK, "NccomBandwidthGood", f"{seen}, at or above the floor {self._floor:g} GB/s")


# --- Neuron Observer health check ---------------------------------------------------------------------

OUTCOMES = ("passed", "failed", "timeout", "device_busy")
_OUTCOME_AT_END = re.compile(r"(?:^|[:=]\s*)(passed|failed|timeout|device_busy)\W*$", re.IGNORECASE)
_DEVICE = re.compile(r"\b(?:neuron|nd|device)[ _-]?(\d{1,4})\b", re.IGNORECASE)


class NobsParseError(ValueError):
    """nobs printed no outcome we can read."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NobsReport:
    outcome: str  # the node's: passed | failed | timeout | device_busy (the worst of the devices' when only those)
    devices: Mapping[int, str]  # device number -> its outcome, where the output names devices


def _worst(outcomes: list[str]) -> str:
    order = ("device_busy", "failed", "timeout", "passed")  # busy first: a busy node says nothing else
    return next(o for o in order if o in outcomes)


def _from_json(doc: Any) -> NobsReport:
    def outcome_of(entry: Mapping[str, Any]) -> str | None:
        for key in ("outcome", "status", "result"):
            value = entry.get(key)
            if isinstance(value, str) and value.lower() in OUTCOMES:
                return value.lower()
        return None

    if not isinstance(doc, dict):
        raise NobsParseError(f"JSON {type(doc).__name__}, not an object")
    devices: dict[int, str] = {}
    for entry in doc.get("devices") or []:
        if isinstance(entry, dict) and (o := outcome_of(entry)) is not None:
            index = next(
                (entry[k] for k in ("device", "neuron_device", "index", "id") if isinstance(entry.get(k), int)), None
            )
            if index is not None:
                devices[index] = o
    node = outcome_of(doc) or (_worst(list(devices.values())) if devices else None)
    if node is None:
        raise NobsParseError("JSON without an outcome (passed/failed/timeout/device_busy)")
    return NobsReport(outcome=node, devices=devices)


def parse_nobs(text: str) -> NobsReport:
    """The outcome of ``nobs health run`` (see the module's assumptions). Raises NobsParseError."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            return _from_json(json.loads(stripped))
        except json.JSONDecodeError as exc:
            raise NobsParseError(f"not valid JSON ({exc.msg})") from None
    node: list[str] = []
    devices: dict[int, str] = {}
    for line in text.splitlines():
        match = _OUTCOME_AT_END.search(line.strip())
        if match is None:
            continue
        outcome = match.group(1).lower()
        device = _DEVICE.search(line[: match.start()])
        if device is not None:
            devices[int(device.group(1))] = outcome
        else:
            node.append(outcome)
    if not node and not devices:
        raise NobsParseError("no outcome (passed/failed/timeout/device_busy) at the end of any line")
    return NobsReport(outcome=_worst(node or list(devices.values())), devices=devices)


_NOBS_VERDICTS: Mapping[str, tuple[CheckStatus, str]] = {
    "passed": (CheckStatus.OK, "NobsHealthPassed"),
    "failed": (CheckStatus.PROBLEM, "NobsHealthFailed"),
    "timeout": (CheckStatus.UNKNOWN, "Timeout"),
    "device_busy": (CheckStatus.UNKNOWN, "DeviceBusy"),
}


class NobsHealthCheck:
    """``nobs health run`` where Neuron Observer is installed; one verdict per device the output names,
    else one covering every device. Options: command (nobs), commandTimeout (10m)."""

    interval: float | None = None
    conditions: tuple[ConditionSpec, ...] = ()

    def __init__(self, *, name: str, context: CheckContext, options: Mapping[str, Any]) -> None:
        reject_unknown(options, {"command", "commandTimeout"})
        self.name = name
        self._context = context
        self.command_timeout = opt_duration(options, "commandTimeout", "10m")
        self.timeout = self.command_timeout + GRACE
        self._command = str(options.get("command", "nobs"))

    def run(self) -> list[CheckResult]:
        result = self._context.run((self._command, "health", "run"), timeout=self.command_timeout)
        trouble = tool_trouble(result)
        if trouble is not None:
            return [trouble]
        try:
            report = parse_nobs(result.stdout + "\n" + result.stderr)
        except NobsParseError as exc:
            shown = (result.stdout or result.stderr).strip()[:200]
            return [unknown("OutputUnparsable", f"nobs health run: {exc}; {result.describe()}; output: {shown!r}")]
        if report.devices:
            return [self._verdict(o, f"neuron{i}", (f"neuron:neuron{i}",)) for i, o in sorted(report.devices.items())]
        return [self._verdict(report.outcome, "every NeuronCore", device_keys(self._context))]

    @staticmethod
    def _verdict(outcome: str, what: str, devices: tuple[str, ...]) -> CheckResult:
        status, reason = _NOBS_VERDICTS[outcome]
        return CheckResult(
            status=status,
            condition=None,
            reason=reason,
            message=f"nobs health run: {outcome} on {what}",
            devices=devices,
        )
