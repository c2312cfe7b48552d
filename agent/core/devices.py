"""The device a finding names: a GPU, a Neuron device or an RDMA device, as the kernel line printed it.

A rule declares which of its fields names the device (``device: {kind: gpu, field: pci}`` in a rule
pack); :func:`device_from` turns that field's text into a :class:`DeviceRef`, or None when the text is
not a name of that kind (the finding then stays node-scoped, as every finding was before). The
resolver (:mod:`agent.core.deviceresolver`) later adds what the node knows about it: the index, the
UUID, the PCI address, whether the device is present at all.

How each kind is printed (the forms the built-in rules carry):

- ``gpu``: a PCI address. The NVIDIA Xid printer prints ``PCI:%04x:%02x:%02x`` (domain, bus, slot; no
  function: ``src/nvidia/src/kernel/gpu/rc/kernel_rc.c``), ``NV_DEV_PRINTF`` prints ``GPU %04x:%02x:%02x.%x``
  (``kernel-open/common/inc/os-interface.h``), drivers before R515 printed no ``PCI:`` and some prints no
  domain. All become ``dddd:bb:ss.f`` in lower case, the form of ``/sys/bus/pci/devices/`` and of
  ``/proc/driver/nvidia/gpus/`` (``kernel-open/nvidia/nv-procfs.c``, ``nv_procfs_add_gpu``: ``"%04x:%02x:%02x.%1x"``);
  a missing function is 0 (a GPU is function 0 of its slot).
- ``neuron``: the device number (``nd-id=3``, ``[ND 3]``, ``nd3``, ``neuron3``): ``/dev/neuron3``
  (``aws-neuron-driver:neuron_cdev.c``, ``ncdev_create_device_node``: ``"neuron%d"``).
- ``rdma``: the RDMA device name (``efa_0``, ``mlx5_0``: ``/sys/class/infiniband/<name>``) or the PCI
  address its driver printed (``mlx5_core 0000:17:00.0: ...``).
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import TypeVar

from agent.core.types import Severity


class DeviceKind(enum.StrEnum):
    GPU = "gpu"  # an NVIDIA GPU, named by its PCI address
    NEURON = "neuron"  # an AWS Neuron device, named by its number
    RDMA = "rdma"  # an RDMA device (EFA, mlx5, InfiniBand), named by its name or PCI address


_PCI = re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?")
_NEURON = re.compile(r"(?:neuron|nd|ND ?)?(\d{1,4})")
_RDMA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
MAX_SLOT = 0x1F  # a PCI device (slot) number has 5 bits


def normalize_pci(text: str) -> str | None:
    """``text`` as a full PCI address ``dddd:bb:ss.f`` in lower case, or None when it is not one.

    ``0000:3B:00`` (the Xid printer), ``3b:00.0`` (no domain), ``00000009:01:00.0`` (a wide domain)
    all work; a missing domain or function is 0."""
    match = _PCI.fullmatch(text.strip())
    if match is None:
        return None
    domain, bus, slot, function = match.groups()
    if int(slot, 16) > MAX_SLOT:
        return None
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(slot, 16):02x}.{int(function or '0')}"


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceRef:
    """One device a finding names. ``id`` is its canonical name (the key of its state); ``printed`` the
    text the line carried; the rest is what the resolver found on this node (None: not known)."""

    kind: DeviceKind
    id: str  # gpu: the PCI address; neuron: "neuron<N>"; rdma: the device name, or its PCI address
    printed: str
    pci: str | None = None
    index: int | None = None  # gpu: the driver's device minor (/dev/nvidia<N>); neuron: N of /dev/neuron<N>
    uuid: str | None = None  # gpu: the GPU UUID the driver reports (GPU-...)
    name: str | None = None  # rdma: the RDMA device name where the line printed the PCI address
    present: bool = False  # the resolver found the device on this node
    # ``kind:id``, unique on a node: what state, metrics and messages call the device. Made once with the
    # ref (a condition compares it for each of its devices on every finding), never given.
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.kind.value}:{self.id}")

    def describe(self) -> str:
        """A short text for messages, e.g. ``gpu 0000:3b:00.0 (index 0, GPU-5a1c...)``."""
        known = [
            f"index {self.index}" if self.index is not None and self.kind is DeviceKind.GPU else "",
            self.uuid or "",
            self.name if self.name and self.name != self.id else "",
            f"pci {self.pci}" if self.pci and self.pci != self.id else "",
        ]
        extra = ", ".join(k for k in known if k)
        return f"{self.kind.value} {self.id}" + (f" ({extra})" if extra else "")

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind.value, "id": self.id, "printed": self.printed}
        for key in ("pci", "index", "uuid", "name"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["present"] = self.present
        return out


def device_from(kind: DeviceKind, value: object) -> DeviceRef | None:
    """The device ``value`` (a rule's field) names, or None where it names none of this kind."""
    text = str(value).strip()
    if kind is DeviceKind.GPU:
        pci = normalize_pci(text)
        return None if pci is None else DeviceRef(kind=kind, id=pci, printed=text, pci=pci)
    if kind is DeviceKind.NEURON:
        match = _NEURON.fullmatch(text)
        if match is None:
            return None
        number = int(match.group(1))
        return DeviceRef(kind=kind, id=f"neuron{number}", printed=text, index=number)
    pci = normalize_pci(text)
    if pci is not None:
        return DeviceRef(kind=kind, id=pci, printed=text, pci=pci)
    if _RDMA_NAME.fullmatch(text) is None:
        return None
    return DeviceRef(kind=kind, id=text, printed=text, name=text)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceProblem:
    """An open problem of one device within a condition: what it is, since when, last seen when."""

    device: DeviceRef
    reason: str
    severity: Severity
    since: float
    last_update: float

    def to_json(self) -> dict[str, object]:
        return {
            **self.device.to_json(),
            "reason": self.reason,
            "severity": self.severity.value,
            "since": self.since,
            "lastUpdate": self.last_update,
        }


class BadDevice(ValueError):
    """A device entry read back (the state directory) that is not one this agent writes: names the field."""


_Choice = TypeVar("_Choice", bound=enum.StrEnum)
MAX_TEXT = 256  # characters of a device's id, printed text, UUID or name read back (ours are far shorter)


def device_problem_from_json(raw: object) -> DeviceProblem:
    """The :class:`DeviceProblem` that :meth:`DeviceProblem.to_json` wrote. Hostile input: raises
    :class:`BadDevice` (naming the field) for anything else, e.g. an id that is not the canonical name of
    its kind (``gpu:3B:00`` for ``gpu:0000:3b:00.0``), a time that is not a finite number."""
    if not isinstance(raw, dict):
        raise BadDevice(f"not an object: {type(raw).__name__}")
    kind = _choice(DeviceKind, raw, "kind")
    ident = _text(raw, "id")
    canonical = device_from(kind, ident) if ident else None
    if canonical is None or canonical.id != ident:
        raise BadDevice(f"id: {ident[:64]!r} is not the name of a {kind.value} device")
    index = raw.get("index")
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 1 << 16):
        raise BadDevice("index: must be a whole number from 0")
    pci = _optional(raw, "pci")
    if pci is not None and normalize_pci(pci) != pci:
        raise BadDevice(f"pci: {pci[:64]!r} is not a PCI address")
    present = raw.get("present", False)
    if not isinstance(present, bool):
        raise BadDevice("present: must be true or false")
    severity = _choice(Severity, raw, "severity")
    device = DeviceRef(
        kind=kind,
        id=ident,
        printed=_text(raw, "printed"),
        pci=pci,
        index=index,
        uuid=_optional(raw, "uuid"),
        name=_optional(raw, "name"),
        present=present,
    )
    reason = _text(raw, "reason")
    if not reason:
        raise BadDevice("reason: must be a non-empty string")
    return DeviceProblem(
        device=device, reason=reason, severity=severity, since=_time(raw, "since"), last_update=_time(raw, "lastUpdate")
    )


def _choice(kinds: type[_Choice], raw: dict[str, object], key: str) -> _Choice:
    found = next((k for k in kinds if k.value == raw.get(key)), None)
    if found is None:
        raise BadDevice(f"{key}: must be one of {', '.join(k.value for k in kinds)}")
    return found


def _text(raw: dict[str, object], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise BadDevice(f"{key}: must be a string of at most {MAX_TEXT} characters")
    return value


def _optional(raw: dict[str, object], key: str) -> str | None:
    return None if raw.get(key) is None else _text(raw, key)


def _time(raw: dict[str, object], key: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise BadDevice(f"{key}: must be a time (seconds since the epoch)")
    return float(value)
