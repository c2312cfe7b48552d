"""Reading RDMA ports from sysfs: ``<sys_root>/class/infiniband/<dev>/ports/<n>/``.

Every RDMA device (InfiniBand HCA, RoCE NIC, AWS EFA) appears there, whatever its link layer.
Formats (Linux ``drivers/infiniband/core/sysfs.c``, ``Documentation/ABI/stable/sysfs-class-infiniband``):

- ``state``: ``"<n>: <NAME>"``, e.g. ``4: ACTIVE`` (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER);
- ``phys_state``: ``"<n>: <Name>"``, e.g. ``5: LinkUp`` (2 Polling, 3 Disabled, 6 LinkErrorRecovery, ...);
- ``rate``: ``"<r>[.5] Gb/sec (<w>X[ <SPEED>])"``, e.g. ``200 Gb/sec (4X HDR)``; SDR prints no speed word;
- ``link_layer``: one word (``InfiniBand``, ``Ethernet``, ``Unknown``);
- ``counters/<name>`` (PMA port counters) and ``hw_counters/<name>`` (driver counters): decimal integers.
  A counter read failing with EINVAL, ENOSYS or EOPNOTSUPP means the device does not support it.

Nothing here decides health: a file that cannot be read or parsed becomes a :class:`ReadError`
naming the path and what was wrong, and the caller judges.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
Reader = Callable[[Path], str]  # the text of one sysfs attribute; raises OSError

STATE_ACTIVE = 4
STATE_ACTIVE_DEFER = 5
PHYS_LINK_UP = 5
PHYS_DISABLED = 3
NOT_SUPPORTED_ERRNOS = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})

_STATE = re.compile(r"(\d+): (\S.*)")
_RATE = re.compile(r"(\d+)(\.5)? Gb/sec \((\d+)X(?: (\w+))?\)")
_COUNTER = re.compile(r"\d+")
_MAX_ATTRIBUTE_BYTES = 4096
_COUNTER_GROUPS = ("counters", "hw_counters")
_NOT_COUNTERS = frozenset({"lifespan"})  # hw_counters/lifespan is a setting (ms), not a counter
_STATE_FORMAT = "'<number>: <NAME>' (e.g. '4: ACTIVE')"
_PHYS_STATE_FORMAT = "'<number>: <Name>' (e.g. '5: LinkUp')"
_RATE_FORMAT = "'<n> Gb/sec (<w>X <SPEED>)' (e.g. '200 Gb/sec (4X HDR)')"
_LINK_LAYER_FORMAT = "one word (e.g. 'InfiniBand')"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReadError:
    """A sysfs attribute that could not be read or did not parse: ``<path>: <detail>``."""

    path: Path
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkState:
    """A parsed ``state`` or ``phys_state``: the number and the kernel's name for it."""

    code: int
    name: str

    def __str__(self) -> str:
        return f"{self.code}: {self.name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Rate:
    """A parsed ``rate``: Gb/s over all lanes, the lane count and the speed name (``SDR`` when unnamed)."""

    gbps: float
    lanes: int
    speed: str

    def __str__(self) -> str:
        return f"{self.gbps:g} Gb/s ({self.lanes}X {self.speed})"


@dataclass(frozen=True, kw_only=True, slots=True)
class PortReading:
    """One port as read in one pass. Counters from ``counters/`` win over ``hw_counters/`` on a name clash."""

    device: str
    port: int
    state: LinkState | ReadError
    phys_state: LinkState | ReadError
    rate: Rate | ReadError
    link_layer: str | ReadError
    counters: Mapping[str, int] = field(default_factory=dict)
    unsupported: frozenset[str] = frozenset()  # counters whose read said "not supported"
    counter_errors: tuple[ReadError, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def link_up(self) -> bool | None:
        """ACTIVE (or ACTIVE_DEFER) with the physical link up; None when either file was unusable."""
        if isinstance(self.state, ReadError) or isinstance(self.phys_state, ReadError):
            return None
        return self.state.code in (STATE_ACTIVE, STATE_ACTIVE_DEFER) and self.phys_state.code == PHYS_LINK_UP

    @property
    def link_errors(self) -> tuple[ReadError, ...]:
        return tuple(v for v in (self.state, self.phys_state) if isinstance(v, ReadError))


@dataclass(frozen=True, kw_only=True, slots=True)
class Scan:
    """Everything found under ``class/infiniband``.

    ``present`` is False when the directory does not exist (no RDMA driver loaded). ``error`` is set
    when it exists but cannot be listed. ``devices`` names every device, with or without ports;
    ``device_errors`` are devices whose ``ports/`` could not be listed.
    """

    class_dir: Path
    present: bool
    error: ReadError | None = None
    devices: tuple[str, ...] = ()
    ports: tuple[PortReading, ...] = ()
    device_errors: tuple[ReadError, ...] = ()


def class_dir(sys_root: Path) -> Path:
    return sys_root / "class" / "infiniband"


def read_attribute(path: Path) -> str:
    """The text of one sysfs attribute (at most 4 KiB, bad bytes replaced). Raises OSError."""
    with open(path, "rb") as f:
        return f.read(_MAX_ATTRIBUTE_BYTES).decode("utf-8", errors="replace")


def natural_key(name: str) -> tuple[object, ...]:
    """Sort ``mlx5_2`` before ``mlx5_10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def describe_os_error(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or type(exc).__name__


def _shown(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


def parse_link_state(text: str) -> LinkState | None:
    m = _STATE.fullmatch(text.strip())
    return LinkState(code=int(m.group(1)), name=m.group(2).strip()) if m else None


def parse_rate(text: str) -> Rate | None:
    m = _RATE.fullmatch(text.strip())
    if not m:
        return None
    gbps = int(m.group(1)) + (0.5 if m.group(2) else 0.0)
    return Rate(gbps=gbps, lanes=int(m.group(3)), speed=m.group(4) or "SDR")


def parse_counter(text: str) -> int | None:
    text = text.strip()
    return int(text) if _COUNTER.fullmatch(text) else None


def _read_parsed(path: Path, parse: Callable[[str], T | None], expected: str, read: Reader) -> T | ReadError:
    try:
        text = read(path)
    except OSError as exc:
        return ReadError(path=path, detail=f"cannot read ({describe_os_error(exc)})")
    value = parse(text)
    if value is None:
        return ReadError(path=path, detail=f"expected {expected}, got {_shown(text)}")
    return value


def _read_word(text: str) -> str | None:
    word = text.strip()
    return word if word and word.isprintable() and " " not in word else None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Counters:
    values: dict[str, int]
    unsupported: frozenset[str]
    errors: tuple[ReadError, ...]


def _counter_paths(port_dir: Path, names: Collection[str] | None) -> dict[str, Path]:
    """Counter name → file, ``counters/`` before ``hw_counters/``; only ``names`` when given."""
    found: dict[str, Path] = {}
    for group in _COUNTER_GROUPS:
        directory = port_dir / group
        if names is None:
            try:
                entries = sorted(p.name for p in directory.iterdir())
            except OSError:
                continue  # no such group on this device (EFA has no PMA counters/, old kernels no hw_counters/)
            candidates = [n for n in entries if n not in _NOT_COUNTERS]
        else:
            candidates = [n for n in names if (directory / n).is_file()]
        for name in candidates:
            found.setdefault(name, directory / name)
    return found


def read_counters(port_dir: Path, *, names: Collection[str] | None = None, read: Reader = read_attribute) -> _Counters:
    values: dict[str, int] = {}
    unsupported: set[str] = set()
    errors: list[ReadError] = []
    for name, path in _counter_paths(port_dir, names).items():
        try:
            text = read(path)
        except OSError as exc:
            if exc.errno in NOT_SUPPORTED_ERRNOS:
                unsupported.add(name)
            else:
                errors.append(ReadError(path=path, detail=f"cannot read ({describe_os_error(exc)})"))
            continue
        value = parse_counter(text)
        if value is None:
            errors.append(ReadError(path=path, detail=f"expected a decimal counter, got {_shown(text)}"))
        else:
            values[name] = value
    return _Counters(values=values, unsupported=frozenset(unsupported), errors=tuple(errors))


def read_port(
    port_dir: Path,
    *,
    device: str,
    port: int,
    counter_names: Collection[str] | None = None,
    read: Reader = read_attribute,
) -> PortReading:
    """Read one port's attributes and counters (only ``counter_names`` when given, else all)."""
    counters = read_counters(port_dir, names=counter_names, read=read)
    return PortReading(
        device=device,
        port=port,
        state=_read_parsed(port_dir / "state", parse_link_state, _STATE_FORMAT, read),
        phys_state=_read_parsed(port_dir / "phys_state", parse_link_state, _PHYS_STATE_FORMAT, read),
        rate=_read_parsed(port_dir / "rate", parse_rate, _RATE_FORMAT, read),
        link_layer=_read_parsed(port_dir / "link_layer", _read_word, _LINK_LAYER_FORMAT, read),
        counters=counters.values,
        unsupported=counters.unsupported,
        counter_errors=counters.errors,
    )


def _port_numbers(ports_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in ports_dir.iterdir() if p.name.isdigit())


def scan(
    sys_root: Path,
    *,
    select: Callable[[str, int], bool] = lambda device, port: True,
    counter_names: Collection[str] | None = None,
    read: Reader = read_attribute,
) -> Scan:
    """Read every port that ``select(device, port)`` accepts (counters limited to ``counter_names``)."""
    root = class_dir(sys_root)
    try:
        device_names = sorted((p.name for p in root.iterdir()), key=natural_key)
    except FileNotFoundError:
        return Scan(class_dir=root, present=False)
    except OSError as exc:
        return Scan(class_dir=root, present=True, error=ReadError(path=root, detail=describe_os_error(exc)))
    ports: list[PortReading] = []
    device_errors: list[ReadError] = []
    for device in device_names:
        ports_dir = root / device / "ports"
        try:
            numbers = _port_numbers(ports_dir)
        except FileNotFoundError:
            continue  # a device without ports (switch management port devices, partly removed devices)
        except OSError as exc:
            device_errors.append(ReadError(path=ports_dir, detail=f"cannot list ({describe_os_error(exc)})"))
            continue
        for number in numbers:
            if select(device, number):
                port_dir = ports_dir / str(number)
                ports.append(read_port(port_dir, device=device, port=number, counter_names=counter_names, read=read))
    return Scan(
        class_dir=root,
        present=True,
        devices=tuple(device_names),
        ports=tuple(ports),
        device_errors=tuple(device_errors),
    )
