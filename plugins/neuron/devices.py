"""The host's Neuron devices: sysfs and /dev discovery, ECC counters, expected count, and the ``neuron-devices`` check.

Where devices are counted (the count of record is the HOST's view):

- sysfs (``<sys_root>``, the host's ``/sys``): ``devices/virtual/neuron_device/neuron<N>`` and
  ``class/neuron_device/neuron<N>`` (globs, option ``sysfsGlobs``; driver 2.31 moved sysfs nodes, so
  nothing relies on one layout).
- device files (``<dev_root>``, the host's ``/dev``): ``neuron<N>``.
- ``neuron-ls`` (when installed) is a witness only: inside a container it lists just the devices mounted
  into that container, so it may show fewer (or none) while the host is healthy.

A device is usable when sysfs and /dev both show it; when one of them shows no Neuron device at all
(that root is probably not the host's) the other one decides, and the message says so. Hardware counters
(``stats/hardware/<counter>``, a number or a directory with ``total``/``present``) are only ever read:
writing a counter clears it, and ``reset`` (which resets the device) is never opened.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
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

from .neuronls import NeuronLs, NeuronLsOutcome, ToolState

CONDITION = "NeuronDevices"
HEALTHY_REASON = "NeuronDevicesOk"
HEALTHY_MESSAGE = "all expected Neuron devices are present and no uncorrected ECC error is rising"

DEFAULT_SYSFS_GLOBS: tuple[str, ...] = ("devices/virtual/neuron_device/neuron*", "class/neuron_device/neuron*")
DEFAULT_ECC_COUNTERS: tuple[str, ...] = (
    "mem_ecc_uncorrected",
    "mem_ecc_repairable_uncorrected",
    "sram_ecc_uncorrected",
)
# Where a device's hardware counters live, relative to neuron<N>/ (first existing wins). The first is the
# documented layout; the others cover a reorganised tree without reading anything but counters.
HARDWARE_DIRS: tuple[str, ...] = ("stats/hardware", "*/stats/hardware", "*/hardware")
NEVER_READ = frozenset({"reset"})

# Neuron devices (chips) per instance type (Neuron architecture pages; trn2n.48xlarge from the neuron-ls
# docs example). Extend or override with the ``instanceTypes`` option.
DEVICES_BY_INSTANCE_TYPE: Mapping[str, int] = MappingProxyType(
    {
        "inf1.xlarge": 1,
        "inf1.2xlarge": 1,
        "inf1.6xlarge": 4,
        "inf1.24xlarge": 16,
        "inf2.xlarge": 1,
        "inf2.8xlarge": 1,
        "inf2.24xlarge": 6,
        "inf2.48xlarge": 12,
        "trn1.2xlarge": 1,
        "trn1.32xlarge": 16,
        "trn1n.32xlarge": 16,
        "trn2.48xlarge": 16,
        "trn2n.48xlarge": 16,
        "trn2u.48xlarge": 16,
    }
)

_DEVICE_NAME = re.compile(r"neuron(\d+)")
_MAGIC = re.compile(r"[*?\[]")


# --- options -------------------------------------------------------------------------------------------


def reject_unknown(options: Mapping[str, Any], known: Iterable[str]) -> None:
    allowed = sorted(known)
    for key in options:
        if key not in allowed:
            raise CheckConfigError(field=str(key), message=f"unknown option; known options: {', '.join(allowed)}")


def opt_count(options: Mapping[str, Any], key: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckConfigError(field=key, message=f"expected a whole number >= 0, got {value!r}")
    return value


def opt_duration(options: Mapping[str, Any], key: str, default: str) -> float:
    try:
        return parse_duration(options.get(key, default))
    except ValueError as exc:
        raise CheckConfigError(field=key, message=str(exc)) from None


def opt_strings(options: Mapping[str, Any], key: str, default: Sequence[str]) -> tuple[str, ...]:
    value = options.get(key, default)
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise CheckConfigError(field=key, message=f"expected a non-empty list of strings, got {value!r}")
    if not all(isinstance(v, str) and v.strip() for v in value):
        raise CheckConfigError(field=key, message=f"expected a non-empty list of strings, got {value!r}")
    return tuple(v.strip() for v in value)


def opt_bool(options: Mapping[str, Any], key: str, default: bool) -> bool:
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise CheckConfigError(field=key, message=f"expected true or false, got {value!r}")
    return value


def opt_instance_counts(options: Mapping[str, Any], key: str = "instanceTypes") -> dict[str, int]:
    """The built-in device table, extended/overridden by ``{instance type: device count}``."""
    table = dict(DEVICES_BY_INSTANCE_TYPE)
    extra = options.get(key)
    if extra is None:
        return table
    if not isinstance(extra, Mapping):
        raise CheckConfigError(field=key, message=f"expected a map of instance type to device count, got {extra!r}")
    for name, count in extra.items():
        if not isinstance(name, str) or not name.strip():
            raise CheckConfigError(field=key, message=f"instance type must be a non-empty string, got {name!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise CheckConfigError(field=key, message=f"{name}: expected a whole number >= 0, got {count!r}")
        table[name.strip().lower()] = count
    return table


def opt_neuron_ls(options: Mapping[str, Any], *, timeout_default: str = "10s") -> NeuronLs | None:
    """``neuronLs`` (command name or path; empty or false = do not run it) and ``neuronLsTimeout``."""
    command = options.get("neuronLs", "neuron-ls")
    timeout = opt_duration(options, "neuronLsTimeout", timeout_default)
    if timeout <= 0:
        raise CheckConfigError(field="neuronLsTimeout", message="expected a duration above 0, e.g. '10s'")
    if command is False or command == "" or command is None:
        return None
    if not isinstance(command, str):
        raise CheckConfigError(field="neuronLs", message=f"expected a command name or path, got {command!r}")
    return NeuronLs(command=command.strip(), timeout=timeout)


# --- discovery -----------------------------------------------------------------------------------------


class DeviceScanError(Exception):
    """A host root exists but cannot be listed (the agent's trouble, reported as UNKNOWN)."""


def _literal_base(root: Path, pattern: str) -> Path:
    parts: list[str] = []
    for part in Path(pattern).parts:
        if _MAGIC.search(part):
            break
        parts.append(part)
    return root.joinpath(*parts)


def _listable(directory: Path) -> bool:
    """Whether ``directory`` exists as a directory; raises DeviceScanError when it cannot be listed."""
    try:
        with os.scandir(directory):
            return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError:
        raise DeviceScanError(f"cannot list {directory}: permission denied") from None
    except OSError as exc:
        raise DeviceScanError(f"cannot list {directory}: {exc.strerror or exc}") from None


def sysfs_devices(sys_root: Path, globs: Sequence[str] = DEFAULT_SYSFS_GLOBS) -> dict[int, Path]:
    """Index → sysfs directory of each ``neuron<N>`` the globs find (first glob wins for an index)."""
    found: dict[int, Path] = {}
    for pattern in globs:
        if not _listable(_literal_base(sys_root, pattern)):
            continue
        for path in sorted(sys_root.glob(pattern)):
            match = _DEVICE_NAME.fullmatch(path.name)
            if match and path.is_dir():
                found.setdefault(int(match.group(1)), path)
    return found


def dev_devices(dev_root: Path) -> frozenset[int]:
    """Indices of ``<dev_root>/neuron<N>`` device files."""
    if not _listable(dev_root):
        return frozenset()
    found = set()
    with os.scandir(dev_root) as entries:
        for entry in entries:
            match = _DEVICE_NAME.fullmatch(entry.name)
            if match and not entry.is_dir(follow_symlinks=False):
                found.add(int(match.group(1)))
    return frozenset(found)


def _names(indices: Iterable[int]) -> str:
    return ", ".join(f"neuron{i}" for i in sorted(indices))


@dataclass(frozen=True, kw_only=True, slots=True)
class HostDevices:
    """What the host's sysfs and /dev show, and which devices count as usable."""

    sysfs: Mapping[int, Path]
    dev: frozenset[int]
    sys_root: Path
    dev_root: Path

    @property
    def usable(self) -> frozenset[int]:
        in_sysfs = frozenset(self.sysfs)
        if in_sysfs and self.dev:
            return in_sysfs & self.dev
        return in_sysfs or self.dev

    def notes(self) -> list[str]:
        """Where sysfs and /dev disagree, in words."""
        in_sysfs = frozenset(self.sysfs)
        if in_sysfs and self.dev:
            notes = []
            if in_sysfs - self.dev:
                notes.append(f"in sysfs but without a device file under {self.dev_root}: {_names(in_sysfs - self.dev)}")
            if self.dev - in_sysfs:
                notes.append(f"device file under {self.dev_root} but not in sysfs: {_names(self.dev - in_sysfs)}")
            return notes
        if in_sysfs:
            return [f"no neuron device files under {self.dev_root} (host /dev not mounted?): judged from sysfs"]
        if self.dev:
            return [
                f"no neuron device in sysfs under {self.sys_root} (host /sys not mounted, or a sysfs layout "
                f"the globs miss?): judged from {self.dev_root}"
            ]
        return []


def discover(*, sys_root: Path, dev_root: Path, globs: Sequence[str] = DEFAULT_SYSFS_GLOBS) -> HostDevices:
    """The host's Neuron devices. Raises DeviceScanError when a root cannot be listed."""
    return HostDevices(
        sysfs=sysfs_devices(sys_root, globs), dev=dev_devices(dev_root), sys_root=sys_root, dev_root=dev_root
    )


# --- hardware counters ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class CounterReading:
    device: int
    counter: str
    value: int | None
    error: str | None = None


def _read_number(path: Path) -> int:
    """An integer from a sysfs file, opened read-only (never for writing: writing clears counters)."""
    if path.name in NEVER_READ:
        raise ValueError(f"refusing to read {path}")
    with open(path, "rb") as f:
        text = f.read(256).decode("ascii", errors="replace").strip()
    token = text.split()[0] if text else ""
    try:
        return int(token, 0) if token.lower().startswith("0x") else int(token)
    except ValueError:
        raise ValueError(f"{path}: not a number: {text[:40]!r}") from None


def _hardware_dir(device_dir: Path) -> Path | None:
    for pattern in HARDWARE_DIRS:
        for candidate in sorted(device_dir.glob(pattern)):
            if candidate.is_dir():
                return candidate
    return None


def read_counters(device: int, device_dir: Path, counters: Sequence[str]) -> list[CounterReading]:
    """The device's uncorrected-error counters; a counter the driver lacks is left out (older drivers)."""
    hardware = _hardware_dir(device_dir)
    if hardware is None:
        return []
    readings = []
    for name in counters:
        node = hardware / name
        if node.is_dir():
            node = next((node / f for f in ("total", "present") if (node / f).is_file()), node / "total")
        elif not node.exists():
            continue
        try:
            readings.append(CounterReading(device=device, counter=name, value=_read_number(node)))
        except PermissionError:
            readings.append(CounterReading(device=device, counter=name, value=None, error=f"{node}: permission denied"))
        except (OSError, ValueError) as exc:
            readings.append(CounterReading(device=device, counter=name, value=None, error=str(exc)))
    return readings


@dataclass(frozen=True, kw_only=True, slots=True)
class EccIncrease:
    device: int
    counter: str
    before: int
    after: int
    at: float

    def describe(self) -> str:
        return f"neuron{self.device} {self.counter} rose {self.before} -> {self.after}"


class EccTracker:
    """Rises of uncorrected counters between runs. The first reading is the baseline.

    A rise stays reported for ``hold`` seconds after it was seen (so one interval of quiet does not
    clear a fault the hardware still has); a counter going down (driver reloaded, counters cleared)
    is a new baseline and ends the hold for that counter.
    """

    def __init__(self, *, hold: float) -> None:
        self.hold = hold
        self._last: dict[tuple[int, str], int] = {}
        self._rises: dict[tuple[int, str], EccIncrease] = {}

    def update(self, readings: Iterable[CounterReading], *, now: float) -> list[EccIncrease]:
        for reading in readings:
            if reading.value is None:
                continue
            key = (reading.device, reading.counter)
            before = self._last.get(key)
            self._last[key] = reading.value
            if before is None:
                continue
            if reading.value < before:
                self._rises.pop(key, None)
            elif reading.value > before:
                first = self._rises.get(key)
                start = first.before if first is not None else before
                self._rises[key] = EccIncrease(
                    device=reading.device, counter=reading.counter, before=start, after=reading.value, at=now
                )
        for key, rise in list(self._rises.items()):
            if now - rise.at > self.hold:
                del self._rises[key]
        return [self._rises[k] for k in sorted(self._rises)]


# --- expected count ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Expectation:
    count: int | None  # None: nothing says how many
    source: str


def expected_count(
    *, option: int | None, table: Mapping[str, int], instance_type: str | None, learned: int
) -> Expectation:
    """``expectedCount``, else the instance-type table, else the largest count seen (when above 0)."""
    if option is not None:
        return Expectation(count=option, source="expectedCount option")
    if instance_type is not None and instance_type.lower() in table:
        return Expectation(count=table[instance_type.lower()], source=f"instance type {instance_type}")
    if learned > 0:
        return Expectation(count=learned, source="largest count seen on this node")
    return Expectation(count=None, source="nothing")


class LearnedCount:
    """The largest device count this node has seen, kept in ``<state_dir>/<file>`` (rises, never falls).

    A different instance type in the file (the instance was resized) starts afresh. A file that cannot be
    read or written costs a note in the message, never the check: the count is kept in memory then.
    """

    def __init__(self, *, path: Path) -> None:
        self.path = path
        self._loaded = False
        self._count = 0
        self._instance_type: str | None = None
        self.note: str | None = None

    def _load(self) -> None:
        self._loaded = True
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self.note = f"ignored unreadable {self.path}: {exc}"
            return
        count = doc.get("maxSeen") if isinstance(doc, dict) else None
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            self._count = count
            kind = doc.get("instanceType")
            self._instance_type = kind if isinstance(kind, str) else None
        else:
            self.note = f"ignored malformed {self.path}"

    def get(self, instance_type: str | None) -> int:
        if not self._loaded:
            self._load()
        if instance_type and self._instance_type and instance_type != self._instance_type:
            return 0
        return self._count

    def observe(self, count: int, instance_type: str | None) -> None:
        if count <= self.get(instance_type):  # get() is 0 after a change of instance type
            return
        self._count = count
        self._instance_type = instance_type or self._instance_type
        data = {"version": 1, "maxSeen": self._count, "instanceType": self._instance_type}
        from agent.sdk import atomic_write

        try:
            atomic_write(self.path, (json.dumps(data) + "\n").encode())
            self.note = None
        except OSError as exc:
            self.note = f"cannot save the learned count to {self.path}: {exc.strerror or exc}"


# --- the check -----------------------------------------------------------------------------------------


def _tool_note(tool: NeuronLsOutcome, usable: frozenset[int]) -> str | None:
    if tool.state is ToolState.NO_DEVICES and usable:
        return "neuron-ls found none (it sees only the devices mounted into this container)"
    if tool.state is not ToolState.OK or tool.report is None:
        return None
    listed = tool.report.indices
    if usable and listed < usable:
        return (
            f"neuron-ls lists {len(listed)} of them (it sees only the devices mounted into this container; "
            "host sysfs and /dev are the count of record)"
        )
    if listed - usable and usable:
        return f"neuron-ls also lists {_names(listed - usable)}, which the host sysfs and /dev do not show as usable"
    return None


class NeuronDevicesCheck:
    """``neuron-devices``: every expected Neuron device present, and no uncorrected ECC count rising."""

    interval = 60.0
    timeout = 30.0
    OPTIONS = (
        "expectedCount",
        "instanceTypes",
        "neuronLs",
        "neuronLsTimeout",
        "sysfsGlobs",
        "eccCounters",
        "eccHold",
        "stateFile",
    )

    def __init__(self, *, name: str, context: CheckContext, options: Mapping[str, Any]) -> None:
        reject_unknown(options, self.OPTIONS)
        self.name = name
        self.context = context
        self.expected_option = opt_count(options, "expectedCount")
        self.table = opt_instance_counts(options)
        self.neuron_ls = opt_neuron_ls(options)
        self.globs = opt_strings(options, "sysfsGlobs", DEFAULT_SYSFS_GLOBS)
        self.counters = opt_strings(options, "eccCounters", DEFAULT_ECC_COUNTERS)
        if "reset" in self.counters:
            raise CheckConfigError(field="eccCounters", message="'reset' is not a counter (reading it is never done)")
        self.ecc = EccTracker(hold=opt_duration(options, "eccHold", "24h"))
        state_file = options.get("stateFile", f"{name}.json")
        if not isinstance(state_file, str) or not state_file or "/" in state_file:
            raise CheckConfigError(field="stateFile", message=f"expected a file name, got {state_file!r}")
        self.learned = LearnedCount(path=context.state_dir / state_file)
        self.conditions = (
            ConditionSpec(
                type=CONDITION, reason=HEALTHY_REASON, message=HEALTHY_MESSAGE, accelerator=True, source=name
            ),
        )

    def _result(self, status: CheckStatus, reason: str, message: str, **kw: Any) -> CheckResult:
        return CheckResult(status=status, condition=CONDITION, reason=reason, message=message, **kw)

    def run(self) -> list[CheckResult]:
        ctx = self.context
        try:
            host = discover(sys_root=ctx.sys_root, dev_root=ctx.dev_root, globs=self.globs)
        except DeviceScanError as exc:
            return [self._result(CheckStatus.UNKNOWN, "NeuronSysfsUnreadable", str(exc))]
        tool = self.neuron_ls.run(ctx) if self.neuron_ls else NeuronLsOutcome(state=ToolState.ABSENT)
        report = tool.report if tool.state is ToolState.OK else None
        instance_type = ctx.instance_type() or (report.instance_type if report else None)

        usable = host.usable
        notes = host.notes()
        if not usable and report is not None and report.indices:
            usable = report.indices
            notes = ["host sysfs and /dev show no Neuron device: judged from neuron-ls"]
        tool_note = _tool_note(tool, usable)
        if tool_note:
            notes.append(tool_note)

        expectation = expected_count(
            option=self.expected_option,
            table=self.table,
            instance_type=instance_type,
            learned=self.learned.get(instance_type),
        )
        self.learned.observe(len(usable), instance_type)
        if self.learned.note:
            notes.append(self.learned.note)

        readings = [r for i in sorted(host.sysfs) for r in read_counters(i, host.sysfs[i], self.counters)]
        rises = self.ecc.update(readings, now=ctx.clock())
        values = self._values(host, tool, usable, expectation, readings)

        main = self._verdict(usable, expectation, tool, rises, notes, values)
        results = [main]
        if tool.state is ToolState.FAILED:
            results.append(
                CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason="NeuronLsFailed", message=tool.detail)
            )
        unreadable = [r.error for r in readings if r.error]
        if unreadable:
            results.append(
                CheckResult(
                    status=CheckStatus.UNKNOWN,
                    condition=None,
                    reason="NeuronCounterUnreadable",
                    message="; ".join(e for e in unreadable if e),
                )
            )
        return results

    def _verdict(
        self,
        usable: frozenset[int],
        expectation: Expectation,
        tool: NeuronLsOutcome,
        rises: list[EccIncrease],
        notes: list[str],
        values: tuple[Value, ...],
    ) -> CheckResult:
        found = len(usable)
        expected = expectation.count
        tool_present = tool.state is not ToolState.ABSENT
        tool_said = f"; {tool.detail}" if tool.state is ToolState.NO_DEVICES else ""
        tail = "".join(f"; {n}" for n in notes)
        ecc_text = "; ".join(r.describe() for r in rises)

        def problem(reason: str, message: str) -> CheckResult:
            extra = f"; uncorrected ECC: {ecc_text}" if rises and reason != "NeuronEccUncorrected" else ""
            return self._result(
                CheckStatus.PROBLEM, reason, message + extra + tail, severity=Severity.CRITICAL, values=values
            )

        if found == 0:
            if expected:
                return problem(
                    "NeuronDevicesNotFound",
                    f"no Neuron device found, expected {expected} ({expectation.source}){tool_said}",
                )
            if expected is None and tool_present:
                return problem(
                    "NeuronDevicesNotFound",
                    f"no Neuron device found although neuron-ls is installed{tool_said}",
                )
            return self._result(
                CheckStatus.OK, "NoNeuronDevices", "no Neuron device on this node and none expected" + tail
            )
        if expected and found < expected:
            missing = sorted(set(range(expected)) - usable)
            which = f"; missing: {_names(missing)}" if missing else ""
            return problem(
                "NeuronDeviceMissing",
                f"{found} of {expected} Neuron devices present ({expectation.source}){which}",
            )
        if rises:
            return problem("NeuronEccUncorrected", f"uncorrected ECC errors rising: {ecc_text}")
        basis = "no expected count known" if expected is None else f"expected {expected}, {expectation.source}"
        return self._result(
            CheckStatus.OK, HEALTHY_REASON, f"{found} Neuron devices present ({basis}){tail}", values=values
        )

    def _values(
        self,
        host: HostDevices,
        tool: NeuronLsOutcome,
        usable: frozenset[int],
        expectation: Expectation,
        readings: list[CounterReading],
    ) -> tuple[Value, ...]:
        values = [
            Value(name="neuron_devices", value=len(host.sysfs), labels={"source": "sysfs"}),
            Value(name="neuron_devices", value=len(host.dev), labels={"source": "dev"}),
            Value(name="neuron_devices", value=len(usable), labels={"source": "usable"}),
        ]
        if tool.state is ToolState.OK and tool.report is not None:
            values.append(Value(name="neuron_devices", value=len(tool.report.devices), labels={"source": "neuron_ls"}))
        elif tool.state is ToolState.NO_DEVICES:
            values.append(Value(name="neuron_devices", value=0, labels={"source": "neuron_ls"}))
        if expectation.count is not None:
            values.append(Value(name="neuron_devices_expected", value=expectation.count))
            values.append(Value(name="neuron_devices_missing", value=max(0, expectation.count - len(usable))))
        values.extend(
            Value(
                name="neuron_ecc_uncorrected",
                value=r.value,
                labels={"device": str(r.device), "counter": r.counter},
            )
            for r in readings
            if r.value is not None
        )
        return tuple(values)
