"""Frozen, validated settings for the ``run`` command (flags, with environment-variable defaults).

Every flag of ``run`` can also be set through an environment variable ``NHA_<FLAG>`` (dashes
become underscores, e.g. ``NHA_STATE_DIR``); flags win over the environment. Errors name the
flag and the variable so a DaemonSet author knows what to fix; they make the CLI exit 2 before
anything touches the cluster.
"""

from __future__ import annotations

import argparse
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
EVENT_NAMESPACE = "default"  # Events about cluster-scoped objects (Nodes) must live here


NOT_PACKS = frozenset({"examples"})  # plugins/examples holds example third-party packages, not built-ins


def builtin_packs() -> tuple[str, ...]:
    root = builtin_plugins_dir()
    return tuple(
        sorted(
            p.name
            for p in root.iterdir()
            if p.is_dir() and not p.name.startswith(("_", ".")) and p.name not in NOT_PACKS
        )
    )


def rule_dirs(*, plugins_dirs: Sequence[str] | None, packs: Sequence[str] | None) -> list[Path]:
    """Rule pack directories from ``--plugins-dir`` and ``--pack`` (``NHA_PACKS``); default: all built-ins.

    Raises ConfigError for an unknown pack name.
    """
    names = [n.strip() for item in (packs or [env_default("packs") or ""]) for n in item.split(",") if n.strip()]
    dirs = [Path(p) for p in plugins_dirs or ()]
    known = builtin_packs()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            [
                ConfigProblem(
                    file="--pack / NHA_PACKS",
                    field="",
                    message=f"unknown built-in pack {unknown[0]!r} (available: {', '.join(known)})",
                )
            ]
        )
    dirs.extend(builtin_plugins_dir() / n for n in names)
    return dirs or [builtin_plugins_dir() / n for n in known]


@dataclass(frozen=True, kw_only=True, slots=True)
class Listen:
    host: str
    port: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    standalone: bool
    config_files: tuple[Path, ...]
    plugins_dirs: tuple[Path, ...]
    kmsg_path: Path
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")  # this boot's id: kmsg replay, finished reboots
    kmsg_relay: Path | None
    listen: Listen | None  # None = HTTP server disabled
    serve_conditions: bool = False  # /conditions: on by default only with --standalone (kernel-log text)
    state_dir: Path
    lookback: float
    stall_timeout: float
    node_name: str | None = None
    kubeconfig: Path | None = None
    aggregate_condition: bool = False
    event_namespace: str = "default"
    heartbeat: float = 300.0
    api_wait_timeout: float = 300.0
    delete_conditions: tuple[str, ...] = ()
    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    instance_type: str | None = None
    check_concurrency: int = 4
    watch_config: bool = True
    enable_recovery: bool = False  # ENABLE_RECOVERY=true: act; otherwise decide and report what would be done
    cluster_name: str = ""  # CloudWatch dimension ClusterName and the scope of the recovery budget
    recovery_startup_delay: float | None = None  # None = the policy's (default 60 s)
    recovery_policy: Path | None = None  # None = the built-in default policy
    cloudwatch: bool = False  # publish unrecoverable problems to CloudWatch (independent of recovery)
    scheduled_maintenance: bool = False  # poll EC2 scheduled events into condition ScheduledMaintenance
    diagnostics_keep: int = 5  # diagnostics bundles kept in the state directory (0 = none written)
    diagnostics_s3: str = ""  # s3://bucket/prefix for diagnostics bundles ("" = state directory only)
    pod_namespace: str = "node-health-agent"  # where the budget Lease lives (POD_NAMESPACE)

    @property
    def rule_paths(self) -> tuple[Path, ...]:
        return (*self.plugins_dirs, *self.config_files)


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


def env_default(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get(f"NHA_{name.upper().replace('-', '_')}", default)


def build_settings(args: argparse.Namespace) -> Settings:
    """Settings from parsed ``run`` arguments. Raises ConfigError naming each bad flag."""
    problems: list[ConfigProblem] = []

    def bad(flag: str, message: str, var: str | None = None) -> None:
        var = var or f"NHA_{flag.upper().replace('-', '_')}"
        problems.append(ConfigProblem(file=f"--{flag} / {var}", field="", message=message))

    def duration(flag: str, value: str, *, default: float, at_least: float = 0.0, why: str = "") -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            bad(flag, str(exc))
            return default
        if seconds < at_least:
            bad(flag, why)
        return seconds

    listen = None
    try:
        listen = parse_listen(args.listen)
    except ValueError as exc:
        bad("listen", str(exc))
    lookback = duration("lookback", args.lookback, default=300.0)
    heartbeat = duration(
        "heartbeat", args.heartbeat, default=300.0, at_least=10.0, why="must be at least 10s (it bounds API writes)"
    )
    api_wait = duration("api-wait-timeout", args.api_wait_timeout, default=30.0)

    def boolean(flag: str, value: object) -> bool:
        try:
            return parse_bool(value)
        except ValueError as exc:
            bad(flag, str(exc))
            return False

    aggregate = boolean("aggregate-condition", args.aggregate_condition)
    standalone = boolean("standalone", args.standalone)
    # Off in Kubernetes mode unless asked for: the messages carry kernel-log text, and the port is on the pod network.
    serve_conditions = (
        standalone
        if getattr(args, "serve_conditions", None) is None
        else boolean("serve-conditions", args.serve_conditions)
    )
    if args.event_namespace != EVENT_NAMESPACE:
        bad(
            "event-namespace",
            f"must be {EVENT_NAMESPACE!r}, got {args.event_namespace!r}: the API server accepts Events about a "
            "Node (a cluster-scoped object) only in the default namespace",
        )
    delete = tuple(t.strip() for item in args.delete_condition or () for t in item.split(",") if t.strip())
    for type_ in delete:
        if (why := reserved_condition(type_)) is not None:
            bad("delete-condition", why, "NHA_DELETE_CONDITIONS")
    stall = duration("stall-timeout", args.stall_timeout, default=60.0, at_least=0.1, why="must be at least 0.1s")
    # NHA_CONFIG adds to the flags instead of yielding to them: a DaemonSet's args carry its own --config
    # files, and a kustomize component or a Helm value adds more through the environment (merged by name).
    extra = [p.strip() for p in (env_default("config") or "").split(",") if p.strip()]
    config_files = tuple(Path(p) for p in [*(args.config or ()), *extra])
    for path in config_files:  # a file, or a directory of them (as --plugins-dir; what check and simulate take)
        if not path.exists():
            bad("config", f"{path}: no such file or directory")
        elif not path.is_dir() and (why := not_a_regular_file(path)) is not None:
            bad("config", f"{path}: {why}")
    plugins_dirs = tuple(rule_dirs(plugins_dirs=args.plugins_dir, packs=args.pack))
    for path in plugins_dirs:
        if not path.exists():
            bad("plugins-dir", f"{path}: no such file or directory")
    relay = args.kmsg_relay
    kubeconfig = args.kubeconfig
    sys_root, dev_root, instance_type, concurrency = check_args(args, bad)
    watch = boolean("watch-config", getattr(args, "watch_config", "true"))
    recovery = recovery_args(args, bad, standalone=standalone)
    if problems:
        raise ConfigError(problems)
    return Settings(
        standalone=standalone,
        config_files=config_files,
        plugins_dirs=plugins_dirs,
        kmsg_path=Path(args.kmsg_path),
        boot_id_file=Path(getattr(args, "boot_id_file", None) or "/proc/sys/kernel/random/boot_id"),
        kmsg_relay=Path(relay) if relay else None,
        listen=listen,
        serve_conditions=serve_conditions,
        state_dir=Path(args.state_dir),
        lookback=lookback,
        stall_timeout=stall,
        node_name=args.node_name or None,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        aggregate_condition=aggregate,
        event_namespace=args.event_namespace,
        heartbeat=heartbeat,
        api_wait_timeout=api_wait,
        delete_conditions=delete,
        sys_root=sys_root,
        dev_root=dev_root,
        instance_type=instance_type,
        check_concurrency=concurrency,
        watch_config=watch,
        **recovery,
    )


RECOVERY_ENV = "ENABLE_RECOVERY"


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


def recovery_args(args: argparse.Namespace, bad: Callable[..., None], *, standalone: bool) -> dict:
    """The recovery and CloudWatch settings of ``run`` (see README "Recovery")."""
    out: dict = {}
    try:
        out["enable_recovery"] = parse_enable_recovery(getattr(args, "enable_recovery", None))
    except ValueError as exc:
        bad("enable-recovery", str(exc), RECOVERY_ENV)
        out["enable_recovery"] = False
    if out["enable_recovery"] and standalone:
        bad(
            "enable-recovery",
            "recovery acts on the cluster (cordon, drain, Auto Scaling): not with --standalone",
            RECOVERY_ENV,
        )
    name = (getattr(args, "cluster_name", None) or "").strip()
    if name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        bad("cluster-name", f"{name!r}: use letters, digits, '.', '_' and '-' (at most 100)", "CLUSTER_NAME")
    out["cluster_name"] = name
    delay = getattr(args, "recovery_startup_delay", None)
    if delay not in (None, ""):
        try:
            out["recovery_startup_delay"] = parse_duration(str(delay))
        except ValueError as exc:
            bad("recovery-startup-delay", f"{exc} (0 = no delay)", "RECOVERY_STARTUP_DELAY")
    policy = getattr(args, "recovery_policy", None)
    if policy:
        out["recovery_policy"] = Path(policy)
        if (why := not_a_regular_file(Path(policy))) is not None:
            bad("recovery-policy", f"{policy}: {why}")
    try:
        out["cloudwatch"] = parse_bool(getattr(args, "cloudwatch", "false") or "false")
    except ValueError as exc:
        bad("cloudwatch", str(exc))
    if out.get("cloudwatch") and not name:
        bad("cloudwatch", "needs --cluster-name (env CLUSTER_NAME): every metric carries the ClusterName dimension")
    try:
        out["scheduled_maintenance"] = parse_bool(getattr(args, "scheduled_maintenance", "false") or "false")
    except ValueError as exc:
        bad("scheduled-maintenance", str(exc))
    keep = str(getattr(args, "diagnostics_keep", "5") or "5").strip()
    if not keep.isdigit() or int(keep) > 100:
        bad("diagnostics-keep", f"must be an integer from 0 to 100, got {keep!r}")
    else:
        out["diagnostics_keep"] = int(keep)
    s3 = (getattr(args, "diagnostics_s3", None) or "").strip()
    if s3:
        try:
            parse_s3_url(s3)
        except ValueError as exc:
            bad("diagnostics-s3", str(exc))
        out["diagnostics_s3"] = s3
    namespace = (getattr(args, "namespace", None) or "node-health-agent").strip()
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
        bad("namespace", f"{namespace!r} is not a valid namespace name", "POD_NAMESPACE")
    out["pod_namespace"] = namespace
    return out


def check_args(args: argparse.Namespace, bad: Callable[[str, str], None]) -> tuple[Path, Path, str | None, int]:
    """The check flags shared by ``run`` and ``check``: host roots, instance type, concurrency."""
    roots = []
    for flag in ("sys-root", "dev-root"):
        path = Path(getattr(args, flag.replace("-", "_")))
        if not path.is_dir():
            bad(flag, f"{path}: not a directory (mount the host's {'/' + flag[:3]} read-only and point here)")
        roots.append(path)
    concurrency = 4
    text = str(args.check_concurrency).strip()
    if not text.isdigit() or not 1 <= int(text) <= 64:
        bad("check-concurrency", f"must be an integer from 1 to 64, got {args.check_concurrency!r}")
    else:
        concurrency = int(text)
    return roots[0], roots[1], (args.instance_type or "").strip() or None, concurrency
