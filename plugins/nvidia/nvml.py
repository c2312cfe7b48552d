"""What the NVIDIA checks know about the node's GPUs, and how NVML tells it (our adapter seam).

The checks never call NVML or ``nvidia-smi`` themselves: they ask a :class:`GpuReader` for an
:class:`Inventory` of the :class:`Part` they judge and get frozen data back. Two readers exist:
:class:`NvmlReader` here (the ``pynvml`` module of the ``nvidia-ml-py`` package, imported lazily
inside :func:`_import_pynvml`, the only place that imports it) and ``smi.SmiReader``
(``nvidia-smi``, used when NVML cannot load). Tests hand the checks a fake reader, or this
reader a replayed ``pynvml`` module.

Conventions, for both readers:

- ``None`` means *not applicable* (the GPU does not support it: a consumer GPU has no ECC, an H100
  has no retired pages, a PCIe card has no NVLink), never 0 and never an error;
- a call that failed for another reason is a :class:`ReadError` naming the part it spoils, so only
  the check judging that part becomes UNKNOWN;
- a GPU that is lost (``NVML_ERROR_GPU_IS_LOST``, 15) or needs a reset
  (``NVML_ERROR_RESET_REQUIRED``, 16) is data (:attr:`GpuInfo.fault`), not an exception;
- whether the library, the driver or a tool could be used at all is :attr:`Inventory.access`.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# nvmlReturn_t codes (nvml.h; stable ABI) this module acts on.
NOT_SUPPORTED = 3
INVALID_ARGUMENT = 2
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
_UNSUPPORTED = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})

# nvml.h enums used as call arguments.
CORRECTED, UNCORRECTED = 0, 1  # nvmlMemoryErrorType_t
VOLATILE, AGGREGATE = 0, 1  # nvmlEccCounterType_t
LOCATION_DRAM, LOCATION_SRAM = 2, 7  # nvmlMemoryLocation_t (Turing and later)
RETIRED_SINGLE_BIT, RETIRED_DOUBLE_BIT = 0, 1  # nvmlPageRetirementCause_t
TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t
NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in nvidia-ml-py 13.x

# Clock event reasons (nvmlClocksEventReason*): the two that mean "slowed down because too hot".
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
THERMAL_SLOWDOWN = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN


class Part(enum.Enum):
    """What a check needs read. Identity (index, bus id, UUID, name) always comes along."""

    IDENTITY = "identity"
    ECC = "ECC"  # ECC mode, total counts, row remapping, retired pages
    ECC_LOCATIONS = "ECC by location"  # SRAM / DRAM counts (only read when an option needs them)
    NVLINK = "NVLink"
    PCIE_THERMAL = "PCIe and thermal"


class Access(enum.Enum):
    """Whether the GPUs could be read at all."""

    OK = "ok"
    ABSENT = "absent"  # library not loadable / tool not installed: no NVIDIA software here
    NO_DRIVER = "no-driver"  # driver not loaded, or the tool "couldn't communicate with the NVIDIA driver"
    DRIVER_MISMATCH = "driver-mismatch"  # NVML library and kernel module versions differ
    GPU_LOST = "gpu-lost"  # the tool itself says a GPU fell off the bus
    FAILED = "failed"  # our trouble: timeout, garbage output, permission, unexpected error


class Fault(enum.Enum):
    """A GPU that cannot be used until something is done to it."""

    LOST = "GPU is lost"
    RESET_REQUIRED = "GPU requires reset"


@dataclass(frozen=True, kw_only=True, slots=True)
class EccCounts:
    """One family of ECC counters; a field is None where the GPU does not report it."""

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None

    def supported(self) -> bool:
        return any(v is not None for v in self.counters().values())

    def counters(self) -> dict[tuple[str, str], int | None]:
        """``{(type, counter): value}`` with type corrected/uncorrected and counter volatile/aggregate."""
        return {
            ("corrected", "volatile"): self.volatile_corrected,
            ("uncorrected", "volatile"): self.volatile_uncorrected,
            ("corrected", "aggregate"): self.aggregate_corrected,
            ("uncorrected", "aggregate"): self.aggregate_uncorrected,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class RemappedRows:
    """Row remapping (Ampere and later): rows remapped so far, and whether a remap waits or failed."""

    correctable: int
    uncorrectable: int
    pending: bool  # a remap takes effect at the next GPU reset
    failure: bool  # a remap failed: the GPU cannot repair its memory any more


@dataclass(frozen=True, kw_only=True, slots=True)
class RetiredPages:
    """Dynamic page retirement (before Ampere)."""

    single_bit: int
    double_bit: int
    pending: bool  # pages wait to be retired at the next reset / driver reload


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadError:
    part: Part
    message: str


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuInfo:
    """One GPU as read; only the requested parts are filled in."""

    index: int
    bus_id: str | None = None  # "00000000:10:1C.0" (upper case)
    uuid: str | None = None
    name: str | None = None
    fault: Fault | None = None
    errors: tuple[ReadError, ...] = ()
    ecc_mode: bool | None = None  # current ECC mode; None: the GPU has no ECC
    ecc: EccCounts | None = None  # totals over all memory locations
    ecc_sram: EccCounts | None = None
    ecc_dram: EccCounts | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    nvlinks: tuple[bool, ...] | None = None  # per link, True = active; () = no NVLink; None = not read
    pcie_width: int | None = None
    pcie_max_width: int | None = None
    temperature: int | None = None  # degrees C
    clock_events: int | None = None  # nvmlClocksEventReason bitmask

    @property
    def label(self) -> str:
        return f"GPU {self.index}" + (f" ({self.bus_id})" if self.bus_id else "")

    def error(self, part: Part) -> str | None:
        """Why ``part`` could not be read for this GPU (None: it was read)."""
        found = [e.message for e in self.errors if e.part is part]
        return "; ".join(found) if found else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Inventory:
    """The outcome of one read: the GPUs (``access`` OK) or why there are none to judge."""

    source: str  # "NVML" or "nvidia-smi"
    access: Access
    message: str = ""  # what happened when access is not OK (names the library / tool)
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str | None = None


class GpuReader(Protocol):
    """Reads the node's GPUs; never raises for the node's or the library's sake."""

    source: str

    def read(self, *, parts: frozenset[Part]) -> Inventory: ...


class NvmlLibraryMissing(Exception):
    """libnvidia-ml.so.1 is not there (no driver, or not given to this container)."""


def _import_pynvml() -> Any:
    """The ``pynvml`` module, imported only where the NVML library exists: on the many nodes without a
    GPU the binding (about 1.3 MiB of Python objects) is never loaded."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")  # the name pynvml itself loads on Linux
    except OSError as exc:
        raise NvmlLibraryMissing(f"libnvidia-ml.so.1 cannot be loaded: {exc}") from exc
    import pynvml  # the nvidia-ml-py package

    return pynvml


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    code = _code(exc)
    return f"{exc} (NVML error {code})" if code is not None else f"{type(exc).__name__}: {exc}"


def _access_for(code: int | None) -> Access:
    return {
        LIBRARY_NOT_FOUND: Access.ABSENT,
        DRIVER_NOT_LOADED: Access.NO_DRIVER,
        LIB_RM_VERSION_MISMATCH: Access.DRIVER_MISMATCH,
        GPU_IS_LOST: Access.GPU_LOST,
    }.get(code if code is not None else -1, Access.FAILED)


class _FaultSeen(Exception):
    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.value)
        self.fault = fault


class _Calls:
    """NVML calls for one GPU: unsupported → None, failures → :class:`ReadError`, lost/reset → raise."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self.errors: list[ReadError] = []

    def get(self, part: Part, function: str, *args: Any) -> Any:
        fn = getattr(self._nv, function, None)
        if fn is None:  # this nvidia-ml-py has no such binding
            return None
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            code = _code(exc)
            if code == GPU_IS_LOST:
                raise _FaultSeen(Fault.LOST) from exc
            if code == RESET_REQUIRED:
                raise _FaultSeen(Fault.RESET_REQUIRED) from exc
            if code not in _UNSUPPORTED:
                self.errors.append(ReadError(part=part, message=f"{function}: {_describe(exc)}"))
            return None

    def first(self, part: Part, functions: Sequence[str], *args: Any) -> Any:
        """The first of ``functions`` that answers (newer name first, older name as fallback)."""
        for function in functions:
            value = self.get(part, function, *args)
            if value is not None:
                return value
        return None


class NvmlReader:
    """Reads GPUs through NVML. ``load`` returns the ``pynvml`` module (tests pass a replay)."""

    source = "NVML"

    def __init__(self, *, load: Callable[[], Any] = _import_pynvml) -> None:
        self._load = load

    def read(self, *, parts: frozenset[Part]) -> Inventory:
        try:
            nv = self._load()
        except NvmlLibraryMissing as exc:
            return Inventory(source=self.source, access=Access.ABSENT, message=str(exc))
        except ImportError as exc:
            return Inventory(source=self.source, access=Access.ABSENT, message=f"nvidia-ml-py is not installed ({exc})")
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            code = _code(exc)
            what = "libnvidia-ml.so.1 cannot be loaded" if code == LIBRARY_NOT_FOUND else "nvmlInit failed"
            return Inventory(source=self.source, access=_access_for(code), message=f"{what}: {_describe(exc)}")
        except Exception as exc:  # the binding itself misbehaving is our trouble, never an exception out
            return Inventory(source=self.source, access=Access.FAILED, message=f"nvmlInit: {_describe(exc)}")
        try:
            return self._read_gpus(nv, parts)
        except nv.NVMLError as exc:
            return Inventory(source=self.source, access=_access_for(_code(exc)), message=f"NVML: {_describe(exc)}")
        except Exception as exc:
            return Inventory(source=self.source, access=Access.FAILED, message=f"NVML: {_describe(exc)}")
        finally:
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()

    def _read_gpus(self, nv: Any, parts: frozenset[Part]) -> Inventory:
        driver: str | None
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = None
        count = int(nv.nvmlDeviceGetCount())
        gpus = tuple(_read_gpu(nv, index, parts) for index in range(count))
        return Inventory(source=self.source, access=Access.OK, gpus=gpus, driver_version=driver)


def _order(part: Part) -> int:
    return list(Part).index(part)


def _read_gpu(nv: Any, index: int, parts: frozenset[Part]) -> GpuInfo:
    calls = _Calls(nv)
    fields: dict[str, Any] = {}
    try:
        handle = calls.get(Part.IDENTITY, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:  # nothing about this GPU can be read: every requested part fails
            why = "; ".join(e.message for e in calls.errors) or "no handle for this GPU index"
            errors = tuple(ReadError(part=part, message=why) for part in sorted({Part.IDENTITY, *parts}, key=_order))
            return GpuInfo(index=index, errors=errors)
        pci = calls.get(Part.IDENTITY, "nvmlDeviceGetPciInfo", handle)
        if pci is not None:
            fields["bus_id"] = _text(pci.busId).upper()
        uuid = calls.get(Part.IDENTITY, "nvmlDeviceGetUUID", handle)
        name = calls.get(Part.IDENTITY, "nvmlDeviceGetName", handle)
        fields["uuid"] = None if uuid is None else _text(uuid)
        fields["name"] = None if name is None else _text(name)
        if Part.ECC in parts:
            fields.update(_read_ecc(calls, handle, locations=Part.ECC_LOCATIONS in parts))
        if Part.NVLINK in parts:
            fields["nvlinks"] = _read_nvlinks(nv, calls, handle)
        if Part.PCIE_THERMAL in parts:
            fields.update(_read_pcie_thermal(calls, handle))
    except _FaultSeen as seen:
        return GpuInfo(index=index, bus_id=fields.get("bus_id"), uuid=fields.get("uuid"), fault=seen.fault)
    return GpuInfo(index=index, errors=tuple(calls.errors), **fields)


def _counts(calls: _Calls, part: Part, function: str, handle: Any, *location: int) -> EccCounts:
    def one(error_type: int, counter: int) -> int | None:
        value = calls.get(part, function, handle, error_type, counter, *location)
        return None if value is None else int(value)

    return EccCounts(
        volatile_corrected=one(CORRECTED, VOLATILE),
        volatile_uncorrected=one(UNCORRECTED, VOLATILE),
        aggregate_corrected=one(CORRECTED, AGGREGATE),
        aggregate_uncorrected=one(UNCORRECTED, AGGREGATE),
    )


def _read_ecc(calls: _Calls, handle: Any, *, locations: bool) -> dict[str, Any]:
    mode = calls.get(Part.ECC, "nvmlDeviceGetEccMode", handle)
    if mode is None:  # no ECC on this GPU: nothing of this part applies
        return {}
    out: dict[str, Any] = {"ecc_mode": bool(mode[0])}
    totals = _counts(calls, Part.ECC, "nvmlDeviceGetTotalEccErrors", handle)
    out["ecc"] = totals if totals.supported() else None
    if locations:
        for key, location in (("ecc_sram", LOCATION_SRAM), ("ecc_dram", LOCATION_DRAM)):
            counts = _counts(calls, Part.ECC_LOCATIONS, "nvmlDeviceGetMemoryErrorCounter", handle, location)
            out[key] = counts if counts.supported() else None
    rows = calls.get(Part.ECC, "nvmlDeviceGetRemappedRows", handle)
    if rows is not None:
        corr, unc, pending, failure = rows
        out["remapped_rows"] = RemappedRows(
            correctable=int(corr), uncorrectable=int(unc), pending=bool(pending), failure=bool(failure)
        )
    single = calls.get(Part.ECC, "nvmlDeviceGetRetiredPages", handle, RETIRED_SINGLE_BIT)
    double = calls.get(Part.ECC, "nvmlDeviceGetRetiredPages", handle, RETIRED_DOUBLE_BIT)
    pending = calls.get(Part.ECC, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    if single is not None and double is not None and pending is not None:
        out["retired_pages"] = RetiredPages(single_bit=len(single), double_bit=len(double), pending=bool(pending))
    return out


def _read_nvlinks(nv: Any, calls: _Calls, handle: Any) -> tuple[bool, ...] | None:
    """Link states from link 0 up; NotSupported (or InvalidArgument) ends the list: on link 0, no NVLink."""
    states: list[bool] = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            state = nv.nvmlDeviceGetNvLinkState(handle, link)
        except nv.NVMLError as exc:
            code = _code(exc)
            if code in (NOT_SUPPORTED, INVALID_ARGUMENT):
                break
            if code == GPU_IS_LOST:
                raise _FaultSeen(Fault.LOST) from exc
            if code == RESET_REQUIRED:
                raise _FaultSeen(Fault.RESET_REQUIRED) from exc
            calls.errors.append(
                ReadError(part=Part.NVLINK, message=f"nvmlDeviceGetNvLinkState link {link}: {_describe(exc)}")
            )
            return None
        states.append(int(state) == 1)
    return tuple(states)


def _read_pcie_thermal(calls: _Calls, handle: Any) -> dict[str, Any]:
    part = Part.PCIE_THERMAL
    events = calls.first(
        part, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), handle
    )
    values = {
        "pcie_width": calls.get(part, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_max_width": calls.get(part, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        "temperature": calls.get(part, "nvmlDeviceGetTemperature", handle, TEMPERATURE_GPU),
        "clock_events": events,
    }
    return {key: None if value is None else int(value) for key, value in values.items()}
