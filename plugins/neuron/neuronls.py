"""Running ``neuron-ls`` for its JSON device list, and reading what it prints.

Two JSON forms exist: ``--json-output`` / ``-j`` prints a top-level array with one object per device
(``neuron_device``, ``bdf``, ``nc_count``, ``memory_size``, ``connected_to``, ...); from Neuron 2.34
``--output-format json`` replaces it with a top-level object that adds instance and UltraServer fields.
Both are read here: the device list is the array itself, or the list inside the object whose entries
carry ``neuron_device``. Unknown fields are ignored.

Without a driver or devices, neuron-ls prints nothing on stdout, one logfmt line on stderr
(``level=fatal msg="Failed to load MLA system information" error="failed to discover Neuron devices"``)
and exits 1: that is :attr:`ToolState.NO_DEVICES`, an answer about the node, not the tool failing.

Run inside a container, neuron-ls lists only the devices mounted into that container, so its count
is a witness, never the count of record (see :mod:`.devices`).
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.sdk import CheckContext, ProcessResult

JSON_FORMS: tuple[tuple[str, ...], ...] = (("--json-output",), ("--output-format", "json"))
"""Argument forms asking for JSON, oldest first; the first one a tool accepts is remembered."""

_INDEX_KEYS = ("neuron_device", "neuron_device_index")
_USAGE_ERROR = re.compile(
    r"unknown (?:flag|option|shorthand|command)|flag provided but not defined|unrecognized|invalid option|usage:",
    re.IGNORECASE,
)
_LOGFMT_PAIR = re.compile(r'([A-Za-z_][\w.-]*)=("(?:[^"\\]|\\.)*"|\S*)')
_FATAL_LEVELS = frozenset({"fatal", "panic", "error"})
_NO_DEVICES = re.compile(r"failed to discover neuron devices|no neuron devices", re.IGNORECASE)


class NeuronLsParseError(ValueError):
    """neuron-ls printed something that is not the JSON device list (the message says what)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NeuronLsDevice:
    index: int
    bdf: str | None = None
    core_count: int | None = None
    memory_bytes: int | None = None
    connected_to: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class NeuronLsReport:
    devices: tuple[NeuronLsDevice, ...]
    instance_type: str | None = None

    @property
    def indices(self) -> frozenset[int]:
        return frozenset(d.index for d in self.devices)


class ToolState(enum.StrEnum):
    ABSENT = "absent"  # not installed (not in the tool path): nothing to say
    OK = "ok"  # printed a device list (possibly only the devices mounted into this container)
    NO_DEVICES = "no-devices"  # ran and said it found no Neuron device (driver not loaded, no device files)
    FAILED = "failed"  # the tool's own trouble: not executable, timed out, garbage output


@dataclass(frozen=True, kw_only=True, slots=True)
class NeuronLsOutcome:
    state: ToolState
    report: NeuronLsReport | None = None
    detail: str = ""  # for NO_DEVICES / FAILED: what the tool said or why it could not be read


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _device_index(entry: Mapping[str, Any]) -> int | None:
    for key in _INDEX_KEYS:
        if key in entry:
            return _int(entry[key])
    return None


def _looks_like_devices(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(e, dict) and any(k in e for k in _INDEX_KEYS) for e in value)
    )


def _find_device_list(doc: Mapping[str, Any]) -> list[Any]:
    """The device list inside the newer top-level object (searched two levels deep)."""
    for value in doc.values():
        if _looks_like_devices(value):
            return value
    for value in doc.values():
        if isinstance(value, dict):
            for inner in value.values():
                if _looks_like_devices(inner):
                    return inner
    for key, value in doc.items():
        if "device" in key.lower() and isinstance(value, list) and not value:
            return value  # an explicitly empty device list
    raise NeuronLsParseError(f"JSON object without a device list (top-level keys: {', '.join(sorted(doc)) or 'none'})")


def _find_instance_type(doc: Any, entries: Sequence[Any]) -> str | None:
    candidates: list[Any] = []
    if isinstance(doc, dict):
        candidates.append(doc.get("instance_type"))
        for key in ("instance", "instance_info", "instance_data"):
            inner = doc.get(key)
            if isinstance(inner, dict):
                candidates.append(inner.get("instance_type"))
    candidates.extend(e.get("instance_type") for e in entries if isinstance(e, dict))
    for value in candidates:
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _device(position: int, entry: Any) -> NeuronLsDevice:
    if not isinstance(entry, dict):
        raise NeuronLsParseError(f"device entry {position} is {type(entry).__name__}, not an object")
    index = _device_index(entry)
    if index is None or index < 0:
        raise NeuronLsParseError(f"device entry {position} has no non-negative integer neuron_device")
    peers = entry.get("connected_to")
    connected = tuple(p for p in peers if _int(p) is not None) if isinstance(peers, list) else ()
    bdf = entry.get("bdf")
    return NeuronLsDevice(
        index=index,
        bdf=bdf if isinstance(bdf, str) else None,
        core_count=_int(entry.get("nc_count")),
        memory_bytes=_int(entry.get("memory_size")),
        connected_to=connected,
    )


def parse_json_output(text: str) -> NeuronLsReport:
    """The devices in neuron-ls JSON output (either form). Raises NeuronLsParseError."""
    if not text.strip():
        raise NeuronLsParseError("empty output")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NeuronLsParseError(f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    if isinstance(doc, list):
        entries = doc
    elif isinstance(doc, dict):
        entries = _find_device_list(doc)
    else:
        raise NeuronLsParseError(f"JSON {type(doc).__name__} where a device list was expected")
    devices: dict[int, NeuronLsDevice] = {}
    for position, entry in enumerate(entries):
        device = _device(position, entry)
        devices.setdefault(device.index, device)
    return NeuronLsReport(
        devices=tuple(devices[i] for i in sorted(devices)),
        instance_type=_find_instance_type(doc, entries),
    )


def parse_logfmt(line: str) -> dict[str, str]:
    """``key=value`` pairs of one logfmt line (quoted values unescaped)."""
    fields: dict[str, str] = {}
    for key, raw in _LOGFMT_PAIR.findall(line):
        value = raw
        if raw.startswith('"'):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw[1:-1]
        fields[key] = value
    return fields


def fatal_error(stderr: str) -> str | None:
    """``msg: error`` of the last fatal/error logfmt line on stderr, or None."""
    for line in reversed(stderr.strip().splitlines()):
        fields = parse_logfmt(line)
        if fields.get("level", "").lower() in _FATAL_LEVELS:
            parts = [fields.get("msg", ""), fields.get("error", "")]
            text = ": ".join(p for p in parts if p)
            return text or line.strip()
    return None


def interpret(result: ProcessResult) -> NeuronLsOutcome | None:
    """What one run of ``neuron-ls <json form>`` says; None when it rejected the arguments (try the next form)."""
    if result.error is not None:
        if result.error.startswith("not found") or result.error == "no such file":
            return NeuronLsOutcome(state=ToolState.ABSENT, detail=result.describe())
        return NeuronLsOutcome(state=ToolState.FAILED, detail=result.describe())
    if result.timed_out or result.exit_code is None or result.exit_code < 0:
        return NeuronLsOutcome(state=ToolState.FAILED, detail=result.describe())
    if result.exit_code != 0:
        fatal = fatal_error(result.stderr)
        if fatal is not None and _NO_DEVICES.search(fatal):
            return NeuronLsOutcome(state=ToolState.NO_DEVICES, detail=f"neuron-ls: {fatal}")
        if fatal is None and not result.stdout.strip() and _USAGE_ERROR.search(result.stderr):
            return None
        return NeuronLsOutcome(state=ToolState.FAILED, detail=result.describe())
    try:
        report = parse_json_output(result.stdout)
    except NeuronLsParseError as exc:
        cut = " (output cut at the size limit)" if result.stdout_truncated else ""
        return NeuronLsOutcome(state=ToolState.FAILED, detail=f"neuron-ls printed unreadable JSON: {exc}{cut}")
    return NeuronLsOutcome(state=ToolState.OK, report=report)


def not_executable(command: str, path: str) -> str | None:
    """The file a PATH lookup skipped because it cannot be executed (the runner reports it as not found)."""
    candidates = [command] if "/" in command else [os.path.join(d, command) for d in path.split(os.pathsep) if d]
    for candidate in candidates:
        if os.path.isfile(candidate) and not os.access(candidate, os.X_OK):
            return candidate
    return None


class NeuronLs:
    """Runs ``<command> <json form>``; remembers which form the installed tool accepts."""

    def __init__(self, *, command: str, timeout: float, forms: Sequence[Sequence[str]] = JSON_FORMS) -> None:
        self.command = command
        self.timeout = timeout
        self._forms = tuple(tuple(f) for f in forms)
        self._form = 0

    def run(self, context: CheckContext) -> NeuronLsOutcome:
        last: ProcessResult | None = None
        order = list(range(self._form, len(self._forms))) + list(range(self._form))
        for i in order:
            last = context.run((self.command, *self._forms[i]), timeout=self.timeout)
            outcome = interpret(last)
            if outcome is None:
                continue
            if outcome.state is ToolState.ABSENT:
                blocked = not_executable(self.command, context.tool_path)
                if blocked is not None:
                    return NeuronLsOutcome(state=ToolState.FAILED, detail=f"{blocked}: not executable")
            if outcome.state in (ToolState.OK, ToolState.NO_DEVICES):
                self._form = i
            return outcome
        tried = " / ".join(" ".join(f) for f in self._forms)
        why = last.describe() if last is not None else "nothing run"
        return NeuronLsOutcome(state=ToolState.FAILED, detail=f"neuron-ls accepted none of {tried}: {why}")
