"""Reading GPUs with ``nvidia-smi`` when NVML cannot load: the same :class:`~.nvml.Inventory`, from its text.

One query per part, so a query that fails spoils only the check that needs it:

- identity: ``--query-gpu=index,pci.bus_id,uuid,name,driver_version``;
- ECC: ``--query-gpu=<ECC mode, totals, retired pages>`` plus ``--query-remapped-rows=...``
  (the latter only when some GPU has ECC at all); SRAM / DRAM counts only when asked for;
- PCIe and thermal: ``--query-gpu=<link widths, temperature, clocks_event_reasons.active>``
  (``clocks_throttle_reasons.active`` on drivers older than 535);
- NVLink: ``nvidia-smi nvlink --status`` (empty output: no NVLink).

Queries use ``--format=csv,nounits`` *with* the header and read columns by name, so the column
order does not matter and a recorded query with more fields reads the same. ``[N/A]``, ``N/A``
and ``[Not Supported]`` mean *not applicable* (None), never 0 and never an error. Any other
bracketed value (``[Unknown Error]``) is a read error of that GPU's part; ``[GPU is lost]`` /
``[GPU requires reset]`` is the GPU's :class:`~.nvml.Fault`.

Exit codes (nvidia-smi(1)): 6 no devices found (zero GPUs, not a failure); 9 driver not loaded
(also 255 with "couldn't communicate with the NVIDIA driver"); 15 a GPU fell off the bus;
18 driver/library version mismatch; anything else, a timeout, or output we do not understand
is the agent's trouble (``Access.FAILED``).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.sdk import ProcessResult

from .nvml import (
    Access,
    EccCounts,
    Fault,
    GpuInfo,
    Inventory,
    Part,
    ReadError,
    RemappedRows,
    RetiredPages,
)

TOOL = "nvidia-smi"
MAX_OUTPUT = 1 << 20

IDENTITY = ("index", "pci.bus_id", "uuid", "name")
DRIVER = "driver_version"
ECC_MODE = "ecc.mode.current"
ECC_TOTALS = tuple(
    f"ecc.errors.{kind}.{counter}.total"
    for kind in ("corrected", "uncorrected")
    for counter in ("volatile", "aggregate")
)
RETIRED = ("retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count", "retired_pages.pending")
ECC_LOCATIONS = tuple(
    f"ecc.errors.{kind}.{counter}.{where}"
    for where in ("sram", "dram")
    for kind in ("corrected", "uncorrected")
    for counter in ("volatile", "aggregate")
)
PCIE_THERMAL = ("pcie.link.width.current", "pcie.link.width.max", "temperature.gpu")
CLOCK_EVENTS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # new name (535+), old name
REMAP = (
    "gpu_bus_id",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)

_NOT_APPLICABLE = frozenset({"", "n/a", "[n/a]", "not supported", "[not supported]"})
_NUMBER = re.compile(r"^(\d+)(?:\s*[A-Za-z%/]+)?$")  # "16", "38 %", "8192 MiB" (units when 'nounits' was not given)
_HANDLE_ERROR = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+)")
_GPU_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")
_LINK_LINE = re.compile(r"^\s*Link (\d+): (.*?)\s*$")
_LINK_SPEED = re.compile(r"^\d+(?:\.\d+)? ?[GMK]B/s$")


class SmiOutputError(ValueError):
    """nvidia-smi printed something this parser does not understand."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Cell:
    """One CSV value: a value, not applicable, a GPU fault, or an error text."""

    value: str | None = None
    fault: Fault | None = None
    error: str | None = None


def cell(raw: str) -> _Cell:
    text = raw.strip()
    lowered = text.lower()
    if lowered in _NOT_APPLICABLE:
        return _Cell()
    if text.startswith("[") and text.endswith("]"):
        if "lost" in lowered:
            return _Cell(fault=Fault.LOST)
        if "reset" in lowered or "restart" in lowered:
            return _Cell(fault=Fault.RESET_REQUIRED)
        return _Cell(error=text)
    return _Cell(value=text)


def parse_csv(text: str, *, fields: Sequence[str | Sequence[str]]) -> list[dict[str, str]]:
    """Rows of a ``--format=csv`` answer with its header, keyed by the first name of each field.

    A field given as several names (new name, old name) matches whichever the header has. The
    header may carry units (``fan.speed [%]``). Raises :class:`SmiOutputError` when a field is
    missing or a row does not fit the header.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SmiOutputError("no output (expected a CSV header)")
    rows = list(csv.reader(lines, skipinitialspace=True))
    header = [re.sub(r"\s*\[[^\]]*\]$", "", name.strip()) for name in rows[0]]
    columns: dict[str, int] = {}
    for field in fields:
        names = (field,) if isinstance(field, str) else tuple(field)
        where = next((header.index(n) for n in names if n in header), None)
        if where is None:
            raise SmiOutputError(f"field {names[0]!r} missing from the CSV header: {lines[0][:200]!r}")
        columns[names[0]] = where
    out = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise SmiOutputError(
                f"line {number} has {len(row)} values for {len(header)} columns: {lines[number - 1][:200]!r}"
            )
        out.append({key: row[col].strip() for key, col in columns.items()})
    return out


class _Row:
    """Typed access to one CSV row, collecting faults and per-part errors."""

    def __init__(self, row: dict[str, str], *, part: Part) -> None:
        self._row = row
        self._part = part
        self.fault: Fault | None = None
        self.errors: list[ReadError] = []

    def text(self, field: str) -> str | None:
        got = cell(self._row[field])
        if got.fault is not None:
            self.fault = got.fault
        if got.error is not None:
            self.errors.append(ReadError(part=self._part, message=f"{field}: {got.error}"))
        return got.value

    def _typed(self, field: str, convert: Callable[[str], Any], expected: str) -> Any:
        value = self.text(field)
        if value is None:
            return None
        try:
            return convert(value)
        except ValueError:
            self.errors.append(ReadError(part=self._part, message=f"{field}: expected {expected}, got {value!r}"))
            return None

    def number(self, field: str) -> int | None:
        def convert(value: str) -> int:
            match = _NUMBER.match(value)
            if match is None:
                raise ValueError(value)
            return int(match.group(1))

        return self._typed(field, convert, "a number")

    def bitmask(self, field: str) -> int | None:
        return self._typed(field, lambda v: int(v, 16), "a hexadecimal bitmask")

    def flag(self, field: str, *, yes: str, no: str) -> bool | None:
        def convert(value: str) -> bool:
            if value.lower() not in (yes.lower(), no.lower()):
                raise ValueError(value)
            return value.lower() == yes.lower()

        return self._typed(field, convert, f"{yes} or {no}")


def _identity(row: _Row) -> dict[str, Any]:
    index = row.text("index")
    if index is None or not index.isdigit():
        raise SmiOutputError(f"GPU index {index!r} is not a number")
    bus_id = row.text("pci.bus_id")
    return {
        "index": int(index),
        "bus_id": bus_id.upper() if bus_id else None,
        "uuid": row.text("uuid"),
        "name": row.text("name"),
    }


def _gpu(row: _Row, **fields: Any) -> GpuInfo:
    identity = _identity(row)
    if row.fault is not None:
        return GpuInfo(**identity, fault=row.fault)
    return GpuInfo(**identity, errors=tuple(row.errors), **fields)


def _counts(row: _Row, fields: Sequence[str]) -> EccCounts | None:
    """EccCounts from four fields ordered corrected.volatile, corrected.aggregate, uncorrected.volatile, .aggregate."""
    cv, ca, uv, ua = (row.number(f) for f in fields)
    counts = EccCounts(volatile_corrected=cv, aggregate_corrected=ca, volatile_uncorrected=uv, aggregate_uncorrected=ua)
    return counts if counts.supported() else None


def gpus_from_identity(text: str) -> tuple[list[GpuInfo], str | None]:
    """The identity query's GPUs and the driver version."""
    rows = parse_csv(text, fields=(*IDENTITY, DRIVER))
    gpus, driver = [], None
    for raw in rows:
        row = _Row(raw, part=Part.IDENTITY)
        driver = driver or row.text(DRIVER)
        gpus.append(_gpu(row))
    return gpus, driver


def gpus_from_ecc(text: str, *, locations: bool) -> list[GpuInfo]:
    """The ECC query's GPUs: mode, totals, retired pages (and SRAM / DRAM counts when ``locations``)."""
    fields: tuple[str, ...] = (*IDENTITY, ECC_MODE, *ECC_TOTALS, *RETIRED) + (ECC_LOCATIONS if locations else ())
    gpus = []
    for raw in parse_csv(text, fields=fields):
        row = _Row(raw, part=Part.ECC)
        mode = row.flag(ECC_MODE, yes="Enabled", no="Disabled")
        values: dict[str, Any] = {"ecc_mode": mode, "ecc": _counts(row, ECC_TOTALS)}
        single, double = row.number(RETIRED[0]), row.number(RETIRED[1])
        pending = row.flag(RETIRED[2], yes="Yes", no="No")
        if single is not None and double is not None and pending is not None:
            values["retired_pages"] = RetiredPages(single_bit=single, double_bit=double, pending=pending)
        if locations:
            values["ecc_sram"] = _counts(row, ECC_LOCATIONS[:4])
            values["ecc_dram"] = _counts(row, ECC_LOCATIONS[4:])
        gpus.append(_gpu(row, **values))
    return gpus


def remapped_rows(text: str) -> dict[str, RemappedRows | ReadError]:
    """``--query-remapped-rows`` answer by bus id (upper case); GPUs without row remapping are left out."""
    out: dict[str, RemappedRows | ReadError] = {}
    for raw in parse_csv(text, fields=REMAP):
        row = _Row(raw, part=Part.ECC)
        bus_id = (row.text("gpu_bus_id") or "").upper()
        corr, unc = row.number(REMAP[1]), row.number(REMAP[2])
        pending = row.flag(REMAP[3], yes="Yes", no="No")
        failure = row.flag(REMAP[4], yes="Yes", no="No")
        if row.errors:
            out[bus_id] = row.errors[0]
        elif None not in (corr, unc, pending, failure):
            out[bus_id] = RemappedRows(correctable=corr, uncorrectable=unc, pending=pending, failure=failure)
    return out


def gpus_from_pcie_thermal(text: str) -> list[GpuInfo]:
    gpus = []
    for raw in parse_csv(text, fields=(*IDENTITY, *PCIE_THERMAL, CLOCK_EVENTS)):
        row = _Row(raw, part=Part.PCIE_THERMAL)
        gpus.append(
            _gpu(
                row,
                pcie_width=row.number(PCIE_THERMAL[0]),
                pcie_max_width=row.number(PCIE_THERMAL[1]),
                temperature=row.number(PCIE_THERMAL[2]),
                clock_events=row.bitmask(CLOCK_EVENTS[0]),
            )
        )
    return gpus


def gpus_from_nvlink_status(text: str) -> list[GpuInfo]:
    """``nvidia-smi nvlink --status``: per GPU its links, ``Link <n>: <speed>`` or ``Link <n>: <inactive>``.

    Empty output means no GPU has NVLink. A GPU block saying that all links are inactive (the
    count is not printed) is read as one inactive link.
    """
    gpus: list[GpuInfo] = []
    links: list[bool] = []
    errors: list[ReadError] = []

    def close() -> None:
        if gpus:
            gpus[-1] = replace(gpus[-1], nvlinks=tuple(links), errors=tuple(errors))

    for line in text.splitlines():
        if not line.strip():
            continue
        header = _GPU_LINE.match(line)
        if header is not None:
            close()
            links, errors = [], []
            gpus.append(GpuInfo(index=int(header.group(1)), name=header.group(2), uuid=header.group(3)))
            continue
        if not gpus:
            raise SmiOutputError(f"expected 'GPU <n>: ...' first, got {line.strip()[:200]!r}")
        link = _LINK_LINE.match(line)
        if link is not None:
            state = link.group(2)
            if "inactive" in state.lower():
                links.append(False)
            elif _LINK_SPEED.match(state):
                links.append(True)
            else:
                errors.append(ReadError(part=Part.NVLINK, message=f"link {link.group(1)}: unexpected state {state!r}"))
        elif "all links are inactive" in line.lower():
            links.append(False)
    close()
    return gpus


class SmiReader:
    """Reads GPUs by running ``nvidia-smi`` (``run`` = :meth:`CheckContext.run`) with a timeout per query."""

    source = TOOL

    def __init__(self, *, run: Callable[..., ProcessResult], timeout: float) -> None:
        self._run = run
        self._timeout = timeout

    def read(self, *, parts: frozenset[Part]) -> Inventory:
        try:
            if Part.ECC in parts:
                return self._read_ecc(locations=Part.ECC_LOCATIONS in parts)
            if Part.NVLINK in parts:
                return self._read_nvlinks()
            if Part.PCIE_THERMAL in parts:
                return self._read_pcie_thermal()
            return self._read_identity()
        except SmiOutputError as exc:
            return self._inventory(Access.FAILED, f"{TOOL} printed output this agent does not understand: {exc}")
        except Exception as exc:  # a parser bug must still say what failed, not escape the check
            return self._inventory(Access.FAILED, f"reading {TOOL} output failed: {type(exc).__name__}: {exc}")

    def _inventory(self, access: Access, message: str = "", **kwargs: Any) -> Inventory:
        return Inventory(source=self.source, access=access, message=message, **kwargs)

    def _call(self, args: Sequence[str]) -> tuple[ProcessResult, Inventory | None]:
        """Run one query: (result, the Inventory to return now when it did not succeed, else None).

        "No devices were found" (exit 6) comes back as an OK Inventory without GPUs.
        """
        result = self._run([TOOL, *args], timeout=self._timeout, max_output=MAX_OUTPUT)
        return result, self._failure(result)

    def _failure(self, result: ProcessResult) -> Inventory | None:
        if result.ok:
            return None
        if result.error is not None:
            missing = result.error.startswith(("not found", "no such file"))
            return self._inventory(Access.ABSENT if missing else Access.FAILED, result.describe())
        if result.timed_out or result.exit_code is None:
            return self._inventory(Access.FAILED, result.describe())
        output = f"{result.stdout}\n{result.stderr}"
        lowered = output.lower()
        code = result.exit_code
        if code == 6 and "no devices were found" in lowered:
            return self._inventory(Access.OK)
        if code == 9 or "couldn't communicate with the nvidia driver" in lowered:
            return self._inventory(Access.NO_DRIVER, result.describe())
        if code == 18 or "version mismatch" in lowered:
            return self._inventory(Access.DRIVER_MISMATCH, result.describe())
        if code == 15 or "gpu is lost" in lowered or "fallen off the bus" in lowered:
            lost = sorted({m.group(1).rstrip(":.").upper() for m in _HANDLE_ERROR.finditer(output)})
            where = f" (GPU {', '.join(lost)})" if lost else ""
            return self._inventory(Access.GPU_LOST, result.describe() + where)
        return self._inventory(Access.FAILED, result.describe())

    def _read_nvlinks(self) -> Inventory:
        result, early = self._call(["nvlink", "--status"])
        if early is not None:
            return early
        gpus = gpus_from_nvlink_status(result.stdout)
        if gpus:
            return self._inventory(Access.OK, gpus=tuple(gpus))
        # Empty output: no GPU has NVLink. Which GPUs there are comes from the identity query.
        identity = self._read_identity()
        return replace(identity, gpus=tuple(replace(g, nvlinks=()) for g in identity.gpus))

    def _read_identity(self) -> Inventory:
        result, early = self._call(_query_gpu((*IDENTITY, DRIVER)))
        if early is not None:
            return early
        gpus, driver = gpus_from_identity(result.stdout)
        return self._inventory(Access.OK, gpus=tuple(gpus), driver_version=driver)

    def _read_ecc(self, *, locations: bool) -> Inventory:
        fields = (*IDENTITY, ECC_MODE, *ECC_TOTALS, *RETIRED) + (ECC_LOCATIONS if locations else ())
        result, early = self._call(_query_gpu(fields))
        if early is not None:
            return early
        gpus = gpus_from_ecc(result.stdout, locations=locations)
        if not any(g.ecc_mode is not None for g in gpus):
            return self._inventory(Access.OK, gpus=tuple(gpus))  # no ECC anywhere: no row remapping either
        remap, early = self._call([f"--query-remapped-rows={','.join(REMAP)}", "--format=csv,nounits"])
        if early is not None and (early.access is Access.OK or remap.exit_code in (2, 3)):
            return self._inventory(Access.OK, gpus=tuple(gpus))  # no rows / option unknown here / not supported
        if early is not None:
            return replace(early, message=f"--query-remapped-rows: {early.message}")
        rows = remapped_rows(remap.stdout)
        merged = []
        for gpu in gpus:
            found = rows.get(gpu.bus_id or "")
            if isinstance(found, ReadError):
                gpu = replace(gpu, errors=(*gpu.errors, found))
            elif found is not None:
                gpu = replace(gpu, remapped_rows=found)
            merged.append(gpu)
        return self._inventory(Access.OK, gpus=tuple(merged))

    def _read_pcie_thermal(self) -> Inventory:
        fields = (*IDENTITY, *PCIE_THERMAL)
        result, early = self._call(_query_gpu((*fields, CLOCK_EVENTS[0])))
        if early is not None and result.exit_code == 2 and CLOCK_EVENTS[0] in result.stdout + result.stderr:
            result, early = self._call(_query_gpu((*fields, CLOCK_EVENTS[1])))  # driver older than 535
        if early is not None:
            return early
        return self._inventory(Access.OK, gpus=tuple(gpus_from_pcie_thermal(result.stdout)))


def _query_gpu(fields: Sequence[str]) -> list[str]:
    return [f"--query-gpu={','.join(fields)}", "--format=csv,nounits"]
