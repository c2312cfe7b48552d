"""The NVIDIA checks: GPU count, ECC and memory repair, NVLink, and PCIe width / thermal warnings.

Each check reads only the part it judges (see :class:`~.nvml.Part`) through NVML, or through
``nvidia-smi`` when NVML cannot load (option ``source``: ``auto``, ``nvml`` or ``nvidia-smi``).
Condition types and healthy reasons are those of the AKS node-problem-detector GPU checks
(``GpuCount``/``GpuCountGood``, ``GpuEcc``/``GpuEccGood``, ``GpuNvlink``/``GpuNvlinkGood``), so
remediation configured on them (draino) keeps working.

Verdicts:

- no NVIDIA library and no ``nvidia-smi``, and nothing says GPUs belong here → OK ``NoNvidiaGpus``
  (a machine without GPUs is not a problem); on a node meant to have GPUs → UNKNOWN;
- the driver not loaded / version mismatch, a lost GPU, zero or too few GPUs → ``GpuCount`` PROBLEM;
  the other checks say UNKNOWN then (they cannot read, and the count check tells why);
- a tool that times out or prints what we do not understand → UNKNOWN naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.sdk import (
    CheckConfigError,
    CheckContext,
    CheckResult,
    CheckStatus,
    ConditionSpec,
    Severity,
    Value,
    parse_duration,
)

from .nvml import THERMAL_SLOWDOWN, Access, Fault, GpuInfo, GpuReader, Inventory, NvmlReader, Part
from .smi import SmiReader

# GPUs per instance type (EC2 and Azure types with NVIDIA GPUs; option instanceTypes adds or overrides).
INSTANCE_TYPE_GPUS: Mapping[str, int] = {
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
    "p5e.48xlarge": 8,
    "p5en.48xlarge": 8,
    "g5.xlarge": 1,
    "g5.2xlarge": 1,
    "g5.4xlarge": 1,
    "g5.8xlarge": 1,
    "g5.16xlarge": 1,
    "g5.12xlarge": 4,
    "g5.24xlarge": 4,
    "g5.48xlarge": 8,
    "standard_nd96asr_v4": 8,
    "standard_nd96amsr_a100_v4": 8,
    "standard_nd96isr_h100_v5": 8,
    "standard_nd96isr_h200_v5": 8,
}

SOURCES = ("auto", "nvml", "nvidia-smi")
COMMON_OPTIONS = frozenset({"source", "commandTimeout"})
DEFAULT_COMMAND_TIMEOUT = 10.0
DEFAULT_RETIRED_PAGES_LIMIT = 63  # DCGM's maximum retired pages

NO_GPUS = "NoNvidiaGpus"


# --- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Readers:
    """Where GPU facts come from: NVML first, ``nvidia-smi`` when NVML cannot load."""

    nvml: GpuReader
    smi: GpuReader


def read_gpus(readers: Readers, *, source: str, parts: frozenset[Part]) -> Inventory:
    if source == "nvidia-smi":
        return readers.smi.read(parts=parts)
    first = readers.nvml.read(parts=parts)
    if source == "nvml" or first.access is not Access.ABSENT:
        return first
    second = readers.smi.read(parts=parts)
    if second.access is Access.ABSENT:
        return replace(second, message=f"NVML: {first.message}; {second.message}")
    return second


def instance_type_gpus(context: CheckContext, table: Mapping[str, int]) -> tuple[int | None, str]:
    """(GPUs the node's instance type has, the instance type) or (None, ...) when unknown."""
    try:
        kind = context.instance_type()
    except Exception:  # the context's lookup failing is no reason to fail the check
        kind = None
    if not kind:
        return None, ""
    return table.get(kind.lower()), kind


# --- options -------------------------------------------------------------------------------------


class _Options:
    """Typed reads of a check's options; every complaint names the option."""

    def __init__(self, options: Mapping[str, Any], *, known: frozenset[str]) -> None:
        unknown = sorted(set(options) - known)
        if unknown:
            raise CheckConfigError(unknown[0], f"unknown option (known: {', '.join(sorted(known))})")
        self._options = options

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        value = self._options.get(key, default)
        if value not in choices:
            raise CheckConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    def seconds(self, key: str, default: float) -> float:
        value = self._options.get(key, default)
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise CheckConfigError(key, str(exc)) from None
        if seconds <= 0:
            raise CheckConfigError(key, f"expected a positive duration such as '10s', got {value!r}")
        return seconds

    def integer(self, key: str, default: int | None, *, minimum: int) -> int | None:
        value = self._options.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise CheckConfigError(key, f"expected a whole number >= {minimum} (or null), got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._options.get(key, default)
        if not isinstance(value, bool):
            raise CheckConfigError(key, f"expected true or false, got {value!r}")
        return value

    def counts(self, key: str) -> dict[str, int]:
        value = self._options.get(key, {})
        if not isinstance(value, Mapping):
            raise CheckConfigError(key, f"expected a mapping of instance type to GPU count, got {value!r}")
        out = {}
        for kind, count in value.items():
            if not isinstance(kind, str) or isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise CheckConfigError(f"{key}.{kind}", f"expected a GPU count >= 1, got {count!r}")
            out[kind.lower()] = count
        return out


# --- results -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Issue:
    """One thing wrong with one GPU (or the node), before a check's issues become one result."""

    reason: str
    severity: Severity
    text: str


def _combine(findings: Sequence[Issue], *, condition: str | None, values: tuple[Value, ...]) -> CheckResult:
    """One PROBLEM for a condition: the most severe finding's reason, every finding in the message."""
    worst = max(findings, key=lambda f: f.severity.rank)  # the first of the most severe
    return CheckResult(
        status=CheckStatus.PROBLEM,
        condition=condition,
        reason=worst.reason,
        message="; ".join(f.text for f in findings),
        severity=worst.severity,
        values=values,
    )


def _gpu_labels(gpu: GpuInfo) -> dict[str, str]:
    return {"gpu": str(gpu.index)}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class _NvidiaCheck:
    """What every NVIDIA check shares: options, readers, and the verdicts when GPUs cannot be read."""

    interval = 60.0
    timeout = 30.0
    conditions: tuple[ConditionSpec, ...] = ()
    condition: str | None = None
    own_options: frozenset[str] = frozenset()  # option names besides source and commandTimeout

    def __init__(
        self,
        *,
        name: str,
        context: CheckContext,
        options: Mapping[str, Any],
        readers: Readers | None = None,
    ) -> None:
        self.name = name
        self._context = context
        opts = _Options(options, known=COMMON_OPTIONS | self.own_options)
        self._source = opts.choice("source", "auto", SOURCES)
        command_timeout = opts.seconds("commandTimeout", DEFAULT_COMMAND_TIMEOUT)
        self._readers = readers or Readers(nvml=NvmlReader(), smi=SmiReader(run=context.run, timeout=command_timeout))
        self._configure(opts)

    def _configure(self, opts: _Options) -> None:
        """Read the check's own options (subclasses)."""

    def _spec(self, *, reason: str, message: str, accelerator: bool) -> tuple[ConditionSpec, ...]:
        return (
            ConditionSpec(
                type=self.condition or "", reason=reason, message=message, accelerator=accelerator, source=self.name
            ),
        )

    def _read(self, parts: frozenset[Part]) -> Inventory:
        return read_gpus(self._readers, source=self._source, parts=parts)

    def _result(self, status: CheckStatus, reason: str, message: str, **kwargs: Any) -> CheckResult:
        return CheckResult(status=status, condition=self.condition, reason=reason, message=message, **kwargs)

    def _unreadable(self, inventory: Inventory, *, what: str) -> CheckResult | None:
        """The verdict when there are no GPUs to judge (None: there are)."""
        if inventory.access is Access.ABSENT:
            expected, kind = instance_type_gpus(self._context, INSTANCE_TYPE_GPUS)
            if expected:
                return self._result(
                    CheckStatus.UNKNOWN,
                    "GpuToolUnavailable",
                    f"cannot read {what}: {inventory.message} (instance type {kind} has {expected} GPUs)",
                )
            return self._result(
                CheckStatus.OK, NO_GPUS, f"no NVIDIA GPU on this node and none expected ({inventory.message})"
            )
        if inventory.access is not Access.OK:
            return self._result(
                CheckStatus.UNKNOWN,
                "GpuUnreadable",
                f"cannot read {what} with {inventory.source}: {inventory.message} (the GPU count check judges this)",
            )
        if not inventory.gpus:
            return self._result(CheckStatus.OK, NO_GPUS, f"no NVIDIA GPU found by {inventory.source}")
        return None

    def _unreadable_gpus(self, gpus: Sequence[GpuInfo], *parts: Part) -> list[str]:
        """Texts for GPUs whose ``parts`` could not be read (lost, or a failed call)."""
        out = []
        for gpu in gpus:
            if gpu.fault is not None:
                out.append(f"{gpu.label}: {gpu.fault.value}")
                continue
            errors = [e for e in (gpu.error(p) for p in parts) if e]
            if errors:
                out.append(f"{gpu.label}: {'; '.join(errors)}")
        return out


# --- GPU count -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Learned:
    """The largest GPU count this node has shown, and the bus ids seen at that count."""

    count: int = 0
    bus_ids: tuple[str, ...] = ()


@dataclass
class LearnedStore:
    """``Learned`` kept in a small JSON file, so a restart does not forget how many GPUs there were."""

    path: Path
    error: str | None = field(default=None, init=False)

    def load(self) -> Learned:
        try:
            data = json.loads(self.path.read_text())
            count = data["maxCount"]
            bus_ids = data.get("busIds", [])
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                return Learned()
            return Learned(count=count, bus_ids=tuple(str(b) for b in bus_ids if isinstance(b, str)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return Learned()  # missing or unreadable: learn again

    def save(self, learned: Learned) -> None:
        text = json.dumps({"maxCount": learned.count, "busIds": list(learned.bus_ids)}, indent=1) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        except OSError as exc:
            self.error = f"cannot save {self.path}: {exc.strerror or exc}"
            return
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(tmp, self.path)
            self.error = None
        except OSError as exc:
            self.error = f"cannot save {self.path}: {exc.strerror or exc}"
            with contextlib.suppress(OSError):
                os.unlink(tmp)


class GpuCountCheck(_NvidiaCheck):
    """``GpuCount``: the GPUs present vs the expected count; driver, lost and reset-required GPUs.

    Expected count: option ``expectedCount``, else the instance-type table (``instanceTypes``
    merged over the built-in one), else (``learnExpectedCount``, default on) the largest count
    this node has shown, kept in ``<stateDir>/<check name>.json``: it rises on its own and never
    falls on its own (delete the file after removing GPUs on purpose).
    """

    timeout = 20.0
    condition = "GpuCount"
    own_options = frozenset({"expectedCount", "instanceTypes", "learnExpectedCount"})

    def _configure(self, opts: _Options) -> None:
        self._expected_count = opts.integer("expectedCount", None, minimum=1)
        self._instance_types = {**INSTANCE_TYPE_GPUS, **opts.counts("instanceTypes")}
        self._learn = opts.boolean("learnExpectedCount", True)
        self._store = LearnedStore(path=self._context.state_dir / f"{self.name.replace('/', '_')}.json")
        self._learned: Learned | None = None
        self.conditions = self._spec(
            reason="GpuCountGood", message="all expected NVIDIA GPUs are present", accelerator=True
        )

    def _expected(self, learned: Learned) -> tuple[int | None, str]:
        if self._expected_count is not None:
            return self._expected_count, "option expectedCount"
        count, kind = instance_type_gpus(self._context, self._instance_types)
        if count is not None:
            return count, f"instance type {kind}"
        if self._learn and learned.count > 0:
            return learned.count, "the most this node has shown"
        return None, ""

    def run(self) -> list[CheckResult]:
        if self._learned is None:
            self._learned = self._store.load()
        learned = self._learned
        expected, why = self._expected(learned)
        inventory = self._read(frozenset({Part.IDENTITY}))
        values: tuple[Value, ...] = ()
        if expected is not None:
            values = (Value(name="gpu_expected_count", value=expected),)
        if inventory.access is not Access.OK:
            return [self._not_counted(inventory, expected=expected, why=why, values=values)]
        gpus = inventory.gpus
        values += (Value(name="gpu_count", value=len(gpus)),)
        self._remember(gpus)
        findings = [self._fault(gpu) for gpu in gpus if gpu.fault is not None]
        missing = self._missing(gpus, expected=expected, why=why, learned=learned, source=inventory.source)
        if missing is not None:
            findings.append(missing)
        if findings:
            return [_combine(findings, condition=self.condition, values=values)]
        message = f"{_plural(len(gpus), 'NVIDIA GPU')} found by {inventory.source}"
        if expected is not None:
            message += f", {expected} expected ({why})"
        if self._store.error:
            message += f"; {self._store.error}"
        return [self._result(CheckStatus.OK, "GpuCountGood", message, values=values)]

    def _not_counted(self, inventory: Inventory, *, expected: int | None, why: str, values: tuple) -> CheckResult:
        access = inventory.access
        if access is Access.ABSENT:
            if expected is None:
                return self._result(
                    CheckStatus.OK, NO_GPUS, f"no NVIDIA GPU on this node and none expected ({inventory.message})"
                )
            return self._result(
                CheckStatus.UNKNOWN,
                "GpuToolUnavailable",
                f"cannot count GPUs ({expected} expected, {why}): {inventory.message}",
                values=values,
            )
        if access is Access.FAILED:
            return self._result(
                CheckStatus.UNKNOWN,
                "GpuCountUnknown",
                f"cannot count GPUs with {inventory.source}: {inventory.message}",
            )
        reason, text = {
            Access.NO_DRIVER: ("GpuDriverNotLoaded", "the NVIDIA driver is not loaded or not answering"),
            Access.DRIVER_MISMATCH: ("GpuDriverMismatch", "the NVIDIA driver and its library differ in version"),
            Access.GPU_LOST: ("GpuLost", "a GPU has fallen off the bus"),
        }[access]
        return self._result(
            CheckStatus.PROBLEM,
            reason,
            f"{text} ({inventory.source}: {inventory.message})",
            severity=Severity.CRITICAL,
            values=values,
        )

    @staticmethod
    def _fault(gpu: GpuInfo) -> Issue:
        reason = "GpuLost" if gpu.fault is Fault.LOST else "GpuResetRequired"
        return Issue(
            reason=reason, severity=Severity.CRITICAL, text=f"{gpu.label}: {gpu.fault.value if gpu.fault else ''}"
        )

    @staticmethod
    def _missing(
        gpus: Sequence[GpuInfo], *, expected: int | None, why: str, learned: Learned, source: str
    ) -> Issue | None:
        found = len(gpus)
        if found == 0:
            wanted = (
                f", {expected} expected ({why})" if expected is not None else " although NVIDIA software is installed"
            )
            return Issue(
                reason="GpuMissing", severity=Severity.CRITICAL, text=f"no NVIDIA GPU found by {source}{wanted}"
            )
        if expected is None or found >= expected:
            return None
        present = {g.bus_id for g in gpus if g.bus_id}
        gone = [b for b in learned.bus_ids if b not in present]
        text = f"{found} of {expected} expected NVIDIA GPUs found by {source} ({why})"
        if gone:
            text += f"; missing: {', '.join(gone)}"
        return Issue(reason="GpuMissing", severity=Severity.CRITICAL, text=text)

    def _remember(self, gpus: Sequence[GpuInfo]) -> None:
        learned = self._learned or Learned()
        bus_ids = tuple(sorted(g.bus_id for g in gpus if g.bus_id))
        if len(gpus) < learned.count or (len(gpus) == learned.count and bus_ids == learned.bus_ids):
            return
        self._learned = Learned(count=len(gpus), bus_ids=bus_ids)
        self._store.save(self._learned)


# --- ECC -----------------------------------------------------------------------------------------


class GpuEccCheck(_NvidiaCheck):
    """``GpuEcc``: uncorrectable ECC errors and memory repair (row remapping, page retirement), every GPU.

    PROBLEM: volatile uncorrectable ECC errors (critical), a failed row remap (critical), a pending
    row remap or page retirement, more retired pages than ``retiredPagesLimit`` (63), and, only when
    configured, SRAM / DRAM correctable counts over ``sramCorrectableLimit`` / ``dramCorrectableLimit``.
    ECC counts are otherwise metrics only. A GPU without ECC (GeForce) is not applicable.
    """

    timeout = 35.0
    condition = "GpuEcc"
    own_options = frozenset({"retiredPagesLimit", "sramCorrectableLimit", "dramCorrectableLimit"})

    def _configure(self, opts: _Options) -> None:
        self._retired_limit = opts.integer("retiredPagesLimit", DEFAULT_RETIRED_PAGES_LIMIT, minimum=0)
        self._sram_limit = opts.integer("sramCorrectableLimit", None, minimum=0)
        self._dram_limit = opts.integer("dramCorrectableLimit", None, minimum=0)
        parts = {Part.ECC}
        if self._sram_limit is not None or self._dram_limit is not None:
            parts.add(Part.ECC_LOCATIONS)
        self._parts = frozenset(parts)
        self.conditions = self._spec(
            reason="GpuEccGood",
            message="no uncorrectable ECC error and no pending or failed memory repair on any NVIDIA GPU",
            accelerator=True,
        )

    def run(self) -> list[CheckResult]:
        inventory = self._read(self._parts)
        early = self._unreadable(inventory, what="GPU ECC state")
        if early is not None:
            return [early]
        gpus = inventory.gpus
        unreadable = self._unreadable_gpus(gpus, *self._parts)
        readable = [g for g in gpus if g.fault is None and not any(g.error(p) for p in self._parts)]
        values = tuple(v for gpu in readable for v in _ecc_values(gpu))
        findings = [f for gpu in readable for f in self._judge(gpu)]
        if findings:
            return [_combine([*findings, *self._notes(unreadable)], condition=self.condition, values=values)]
        if unreadable:
            return [
                self._result(
                    CheckStatus.UNKNOWN,
                    "GpuEccUnknown",
                    f"cannot read ECC state: {'; '.join(unreadable)}",
                    values=values,
                )
            ]
        with_ecc = [g for g in readable if g.ecc_mode is not None]
        if not with_ecc:
            names = ", ".join(sorted({g.name or "?" for g in readable}))
            return [
                self._result(
                    CheckStatus.OK,
                    "GpuEccNotSupported",
                    f"ECC is not supported by these GPUs ({names}): not applicable",
                    values=values,
                )
            ]
        message = f"no uncorrectable ECC error, pending or failed memory repair on {_plural(len(with_ecc), 'GPU')}"
        if len(with_ecc) < len(readable):
            message += f" ({len(readable) - len(with_ecc)} without ECC)"
        return [self._result(CheckStatus.OK, "GpuEccGood", message, values=values)]

    @staticmethod
    def _notes(unreadable: Sequence[str]) -> list[Issue]:
        return [Issue(reason="GpuEccUnknown", severity=Severity.INFO, text=f"unreadable {u}") for u in unreadable]

    def _judge(self, gpu: GpuInfo) -> list[Issue]:
        found: list[Issue] = []

        def add(reason: str, severity: Severity, text: str) -> None:
            found.append(Issue(reason=reason, severity=severity, text=f"{gpu.label}: {text}"))

        uncorrected = gpu.ecc.volatile_uncorrected if gpu.ecc else None
        if uncorrected:
            add(
                "GpuEccUncorrectable",
                Severity.CRITICAL,
                f"{uncorrected} uncorrectable ECC errors since the driver loaded",
            )
        rows = gpu.remapped_rows
        if rows is not None and rows.failure:
            add("GpuRowRemapFailure", Severity.CRITICAL, "row remapping failed (memory can no longer be repaired)")
        if rows is not None and rows.pending:
            add("GpuRowRemapPending", Severity.ERROR, "row remap pending (takes effect at the next GPU reset)")
        pages = gpu.retired_pages
        if pages is not None and pages.pending:
            add(
                "GpuRetiredPagesPending", Severity.ERROR, "page retirement pending (takes effect at the next GPU reset)"
            )
        if pages is not None and self._retired_limit is not None:
            total = pages.single_bit + pages.double_bit
            if total > self._retired_limit:
                add("GpuRetiredPagesOverLimit", Severity.ERROR, f"{total} retired pages (limit {self._retired_limit})")
        for where, counts, limit in (
            ("SRAM", gpu.ecc_sram, self._sram_limit),
            ("DRAM", gpu.ecc_dram, self._dram_limit),
        ):
            if counts is None or limit is None:
                continue
            corrected = max(c or 0 for c in (counts.volatile_corrected, counts.aggregate_corrected))
            if corrected > limit:
                reason = f"Gpu{where.capitalize()}CorrectableOverLimit"
                add(reason, Severity.ERROR, f"{corrected} correctable {where} ECC errors (limit {limit})")
        return found


def _ecc_values(gpu: GpuInfo) -> list[Value]:
    labels = _gpu_labels(gpu)
    out = []
    if gpu.ecc is not None:
        for (kind, counter), value in gpu.ecc.counters().items():
            if value is not None:
                out.append(
                    Value(name="gpu_ecc_errors", value=value, labels={**labels, "type": kind, "counter": counter})
                )
    for location, counts in (("sram", gpu.ecc_sram), ("dram", gpu.ecc_dram)):
        for (kind, counter), value in (counts.counters() if counts else {}).items():
            if value is not None:
                out.append(
                    Value(
                        name="gpu_ecc_errors_by_location",
                        value=value,
                        labels={**labels, "type": kind, "counter": counter, "location": location},
                    )
                )
    rows = gpu.remapped_rows
    if rows is not None:
        out += [
            Value(name="gpu_remapped_rows", value=rows.correctable, labels={**labels, "type": "correctable"}),
            Value(name="gpu_remapped_rows", value=rows.uncorrectable, labels={**labels, "type": "uncorrectable"}),
            Value(name="gpu_row_remap_pending", value=int(rows.pending), labels=labels),
            Value(name="gpu_row_remap_failure", value=int(rows.failure), labels=labels),
        ]
    pages = gpu.retired_pages
    if pages is not None:
        out += [
            Value(name="gpu_retired_pages", value=pages.single_bit, labels={**labels, "cause": "single_bit"}),
            Value(name="gpu_retired_pages", value=pages.double_bit, labels={**labels, "cause": "double_bit"}),
            Value(name="gpu_retired_pages_pending", value=int(pages.pending), labels=labels),
        ]
    return out


# --- NVLink --------------------------------------------------------------------------------------


class GpuNvlinkCheck(_NvidiaCheck):
    """``GpuNvlink``: every NVLink of every GPU is active. A GPU without NVLink is fine."""

    timeout = 35.0
    condition = "GpuNvlink"

    def _configure(self, opts: _Options) -> None:
        self.conditions = self._spec(reason="GpuNvlinkGood", message="all NVLinks are active", accelerator=True)

    def run(self) -> list[CheckResult]:
        inventory = self._read(frozenset({Part.NVLINK}))
        early = self._unreadable(inventory, what="NVLink state")
        if early is not None:
            return [early]
        gpus = inventory.gpus
        unreadable = self._unreadable_gpus(gpus, Part.NVLINK)
        readable = [g for g in gpus if g.fault is None and not g.error(Part.NVLINK) and g.nvlinks is not None]
        values = []
        findings = []
        for gpu in readable:
            links = gpu.nvlinks or ()
            inactive = [str(i) for i, up in enumerate(links) if not up]
            if links:
                labels = _gpu_labels(gpu)
                values.append(
                    Value(name="gpu_nvlinks", value=len(links) - len(inactive), labels={**labels, "state": "active"})
                )
                values.append(Value(name="gpu_nvlinks", value=len(inactive), labels={**labels, "state": "inactive"}))
            if inactive:
                text = f"{gpu.label}: NVLink {', '.join(inactive)} inactive ({len(inactive)} of {len(links)})"
                findings.append(Issue(reason="GpuNvlinkInactive", severity=Severity.ERROR, text=text))
        if findings:
            notes = [
                Issue(reason="GpuNvlinkUnknown", severity=Severity.INFO, text=f"unreadable {u}") for u in unreadable
            ]
            return [_combine([*findings, *notes], condition=self.condition, values=tuple(values))]
        if unreadable:
            text = f"cannot read NVLink state: {'; '.join(unreadable)}"
            return [self._result(CheckStatus.UNKNOWN, "GpuNvlinkUnknown", text, values=tuple(values))]
        total = sum(len(g.nvlinks or ()) for g in readable)
        if total == 0:
            text = f"no NVLink on {_plural(len(readable), 'GPU')}: not applicable"
            return [self._result(CheckStatus.OK, "GpuNvlinkGood", text)]
        text = f"all {total} NVLinks of {_plural(len(readable), 'GPU')} active"
        return [self._result(CheckStatus.OK, "GpuNvlinkGood", text, values=tuple(values))]


# --- PCIe width and thermal slowdown (warnings) ----------------------------------------------------


class GpuPcieThermalCheck(_NvidiaCheck):
    """Warnings (Events and metrics, no condition): PCIe link narrower than its maximum; thermal slowdown.

    Only the link *width* is compared: idle GPUs lower their link *generation* to save power.
    Thermal slowdown is the software or hardware thermal clock event reason being active.
    A check of its own rather than part of ``GpuEcc``/``GpuNvlink``: warnings have no condition,
    and a failing PCIe/thermal query must not make a condition check UNKNOWN.
    """

    timeout = 30.0  # up to two queries (the clock field's old name is retried on drivers before 535)

    def _configure(self, opts: _Options) -> None:
        self.conditions = ()

    def run(self) -> list[CheckResult]:
        inventory = self._read(frozenset({Part.PCIE_THERMAL}))
        early = self._unreadable(inventory, what="PCIe link width and thermal state")
        if early is not None:
            return [early]
        gpus = inventory.gpus
        unreadable = self._unreadable_gpus(gpus, Part.PCIE_THERMAL)
        readable = [g for g in gpus if g.fault is None and not g.error(Part.PCIE_THERMAL)]
        values = tuple(v for gpu in readable for v in _pcie_thermal_values(gpu))
        narrow = [
            f"{g.label}: PCIe link x{g.pcie_width} of x{g.pcie_max_width}"
            for g in readable
            if g.pcie_width is not None and g.pcie_max_width is not None and g.pcie_width < g.pcie_max_width
        ]
        hot = [
            f"{g.label}: thermal slowdown active" + (f" at {g.temperature} C" if g.temperature is not None else "")
            for g in readable
            if g.clock_events is not None and g.clock_events & THERMAL_SLOWDOWN
        ]
        results = []
        for reason, texts in (("GpuPcieLinkDegraded", narrow), ("GpuThermalSlowdown", hot)):
            if texts:  # the metrics ride on the first result only, so they are not reported twice
                first = () if results else values
                results.append(
                    self._result(CheckStatus.PROBLEM, reason, "; ".join(texts), severity=Severity.WARNING, values=first)
                )
        if results:
            return results
        if unreadable:
            text = f"cannot read PCIe / thermal state: {'; '.join(unreadable)}"
            return [self._result(CheckStatus.UNKNOWN, "GpuPcieThermalUnknown", text, values=values)]
        text = f"PCIe links at full width and no thermal slowdown on {_plural(len(readable), 'GPU')}"
        return [self._result(CheckStatus.OK, "GpuPcieThermalGood", text, values=values)]


def _pcie_thermal_values(gpu: GpuInfo) -> list[Value]:
    labels = _gpu_labels(gpu)
    pairs: list[tuple[str, int | None]] = [
        ("gpu_pcie_link_width", gpu.pcie_width),
        ("gpu_pcie_link_width_max", gpu.pcie_max_width),
        ("gpu_temperature_celsius", gpu.temperature),
        ("gpu_thermal_slowdown", None if gpu.clock_events is None else int(bool(gpu.clock_events & THERMAL_SLOWDOWN))),
    ]
    return [Value(name=name, value=value, labels=labels) for name, value in pairs if value is not None]
