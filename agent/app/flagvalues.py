"""What a flag of the agent may hold: the value parsers of the flag table (:mod:`agent.app.flags`).

Each parser takes the text of a flag or its environment variable and returns the typed value, or
raises ValueError with the message the CLI prints (``--flag / VAR: message``, exit 2).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.docreader import not_a_regular_file
from agent.core.durations import parse_duration
from agent.core.errors import ConfigError, ConfigProblem
from agent.core.paths import builtin_plugins_dir
from agent.core.types import reserved_condition
from agent.recovery.bundle import parse_s3_url

DEFAULT_LISTEN = "0.0.0.0:20257"
DEFAULT_STATE_DIR = Path("/var/lib/node-health-agent")
DEFAULT_KMSG = Path("/dev/kmsg")
DEFAULT_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
DEFAULT_NAMESPACE = "node-health-agent"
EVENT_NAMESPACE = "default"  # Events about cluster-scoped objects (Nodes) must live here
NOT_PACKS = frozenset({"examples"})  # plugins/examples holds example third-party packages, not built-ins


class Refused(ValueError):
    """Several problems with one flag's value (one per path or condition type)."""

    def __init__(self, messages: Sequence[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = tuple(messages)


def env_default(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get(f"NHA_{name.upper().replace('-', '_')}", default)


def builtin_packs() -> tuple[str, ...]:
    root = builtin_plugins_dir()
    return tuple(
        sorted(
            p.name
            for p in root.iterdir()
            if p.is_dir() and not p.name.startswith(("_", ".")) and p.name not in NOT_PACKS
        )
    )


def pack_names(packs: Sequence[str] | None) -> list[str]:
    """Built-in pack names from ``--pack`` items (or ``NHA_PACKS``); ValueError naming an unknown one."""
    names = [n.strip() for item in (packs or [env_default("packs") or ""]) for n in item.split(",") if n.strip()]
    known = builtin_packs()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown built-in pack {unknown[0]!r} (available: {', '.join(known)})")
    return names


def rule_dirs(*, plugins_dirs: Sequence[str] | None, packs: Sequence[str] | None) -> list[Path]:
    """Rule pack directories from ``--plugins-dir`` and ``--pack`` (``NHA_PACKS``); default: all built-ins.

    Raises ConfigError for an unknown pack name.
    """
    try:
        names = pack_names(packs)
    except ValueError as exc:
        raise ConfigError([ConfigProblem(file="--pack / NHA_PACKS", field="", message=str(exc))]) from None
    dirs = [Path(p) for p in plugins_dirs or ()]
    dirs.extend(builtin_plugins_dir() / n for n in names)
    return dirs or [builtin_plugins_dir() / n for n in builtin_packs()]


@dataclass(frozen=True, kw_only=True, slots=True)
class Listen:
    host: str
    port: int


def parse_listen(value: str) -> Listen | None:
    """``HOST:PORT``, ``:PORT`` or ``PORT``; a bare ``0`` disables the server; ``HOST:0`` picks any free port."""
    text = value.strip()
    if text in ("0", ""):
        return None
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "0.0.0.0", text
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(
            f"invalid listen address {value!r}: expected HOST:PORT with a port 0-65535 (0 = any free port), "
            "or a bare 0 to disable"
        )
    return Listen(host=host, port=int(port))


TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off", "")


def parse_bool(value: object) -> bool:
    """A boolean flag or environment value; anything but true/false words raises ValueError."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ValueError(f"must be true or false, got {value!r}")


def boolean(value: object) -> bool:
    """A boolean flag; unset (None) is false."""
    return parse_bool(value if value is not None else "false")


def optional_bool(value: object) -> bool | None:
    """A boolean flag whose default depends on another (None: not given)."""
    return None if value is None else parse_bool(value)


def parse_enable_recovery(value: str | None) -> bool:
    """``ENABLE_RECOVERY``: exactly ``true`` acts; unset, empty or ``false`` reports only (any case).

    Anything else (``yes``, ``1``, ``ture``) is refused: a typo must not silently leave a fleet
    unprotected, nor arm it."""
    text = (value or "").strip().lower()
    if text in ("", "false"):
        return False
    if text == "true":
        return True
    raise ValueError(f"must be true or false, got {value!r} (unset or false = report only)")


def duration(*, at_least: float = 0.0, why: str = "") -> Callable[[str], float]:
    """A Go-style duration (``30s``, ``5m``) in seconds, refused below ``at_least`` saying ``why``."""

    def parse(value: str) -> float:
        seconds = parse_duration(value)
        if seconds < at_least:
            raise ValueError(why)
        return seconds

    return parse


def startup_delay(value: str | None) -> float | None:
    if value in (None, ""):
        return None
    try:
        return parse_duration(str(value))
    except ValueError as exc:
        raise ValueError(f"{exc} (0 = no delay)") from None


def concurrency(value: object) -> int:
    """Checks running at once: 1 to 64 (the message quotes the value as given)."""
    text = str(value).strip()
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise ValueError(f"must be an integer from 1 to 64, got {value!r}")
    return int(text)


def share(value: object) -> float:
    """A share of the fleet: ``10%`` (or ``10``), 1 to 100 percent, as a fraction."""
    text = str(value).strip().removesuffix("%").strip()
    try:
        percent = float(text)
    except ValueError:
        percent = math.nan
    if not 1 <= percent <= 100:  # NaN fails too
        raise ValueError(f"must be a percentage from 1% to 100%, got {value!r}")
    return percent / 100


def bundles_kept(value: object) -> int:
    """Diagnostics bundles kept: 0 to 100."""
    text = str(value or "5").strip()
    if not text.isdigit() or int(text) > 100:
        raise ValueError(f"must be an integer from 0 to 100, got {text!r}")
    return int(text)


def path(value: str) -> Path:
    return Path(value)


def optional_path(value: str | None) -> Path | None:
    return Path(value) if value else None


def optional_text(value: str | None) -> str | None:
    return (value or "").strip() or None


def host_root(root: str) -> Callable[[str], Path]:
    """A directory standing for the host's ``root`` (``/sys``, ``/dev``) as a pod mounts it."""

    def parse(value: str) -> Path:
        found = Path(value)
        if not found.is_dir():
            raise ValueError(f"{found}: not a directory (mount the host's {root} read-only and point here)")
        return found

    return parse


def config_files(items: Sequence[str] | None) -> tuple[Path, ...]:
    """``--config`` files and directories (as ``--plugins-dir``; what check and simulate take)."""
    files = tuple(Path(p) for p in items or ())
    problems = []
    for found in files:
        if not found.exists():
            problems.append(f"{found}: no such file or directory")
        elif not found.is_dir() and (why := not_a_regular_file(found)) is not None:
            problems.append(f"{found}: {why}")
    if problems:
        raise Refused(problems)
    return files


def plugins_dirs(items: Sequence[str] | None) -> tuple[str, ...] | None:
    missing = [f"{p}: no such file or directory" for p in items or () if not Path(p).exists()]
    if missing:
        raise Refused(missing)
    return tuple(items) if items else None


def packs(items: Sequence[str] | None) -> tuple[str, ...] | None:
    pack_names(items)
    return tuple(items) if items else None


def condition_types(items: Sequence[str] | None) -> tuple[str, ...]:
    """Condition types to delete (repeatable or comma-separated); ours and the kubelet's are refused."""
    types = tuple(t.strip() for item in items or () for t in item.split(",") if t.strip())
    reserved = [why for t in types if (why := reserved_condition(t)) is not None]
    if reserved:
        raise Refused(reserved)
    return types


def event_namespace(value: str) -> str:
    if value != EVENT_NAMESPACE:
        raise ValueError(
            f"must be {EVENT_NAMESPACE!r}, got {value!r}: the API server accepts Events about a "
            "Node (a cluster-scoped object) only in the default namespace"
        )
    return value


def cluster_name(value: str | None) -> str:
    name = (value or "").strip()
    if name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise ValueError(f"{name!r}: use letters, digits, '.', '_' and '-' (at most 100)")
    return name


def recovery_policy(value: str | None) -> Path | None:
    if not value:
        return None
    if (why := not_a_regular_file(Path(value))) is not None:
        raise ValueError(f"{value}: {why}")
    return Path(value)


def s3_prefix(value: str | None) -> str:
    text = (value or "").strip()
    if text:
        parse_s3_url(text)
    return text


def namespace(value: str | None) -> str:
    name = (value or DEFAULT_NAMESPACE).strip()
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise ValueError(f"{name!r} is not a valid namespace name")
    return name


def socket_path(value: str | None) -> str:
    """A UNIX socket's path: absolute (the kubelet's pod-resources socket, as the pod mounts it)."""
    text = (value or "").strip()
    if not text.startswith("/"):
        raise ValueError(f"{text!r} is not an absolute path")
    return text
