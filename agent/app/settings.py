"""Frozen, validated settings for the ``run`` command (flags, with environment-variable defaults).

The flags themselves are declared once, in :mod:`agent.app.flags` (name, variables, parser,
default, help, the field of :class:`Settings` each fills); their values in
:mod:`agent.app.flagvalues`. Errors name the flag and the variable so a DaemonSet author knows what
to fix; they make the CLI exit 2 before anything touches the cluster.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.app.flags import CHECK_FLAGS, RUN_FLAGS, Flag, read
from agent.app.flagvalues import (
    DEFAULT_KMSG,
    DEFAULT_LISTEN,
    DEFAULT_STATE_DIR,
    EVENT_NAMESPACE,
    Listen,
    builtin_packs,
    env_default,
    parse_bool,
    parse_enable_recovery,
    parse_listen,
    rule_dirs,
)
from agent.core.errors import ConfigError

RECOVERY_ENV = "ENABLE_RECOVERY"


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
    service_account_dir: Path | None = None
    aggregate_condition: bool = False
    event_namespace: str = "default"
    heartbeat: float = 300.0
    clear_poll: float = 60.0  # how often the agent reads its Node for an operator's clear request
    api_wait_timeout: float = 300.0
    delete_conditions: tuple[str, ...] = ()
    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    instance_type: str | None = None
    check_concurrency: int = 4
    active_check_share: float = 0.10  # of a pool's or zone's nodes running an active check at once
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
    device_holders: bool = False  # look up and tell the pods holding a failing device (pod-resources API)
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's, as mounted

    @property
    def rule_paths(self) -> tuple[Path, ...]:
        return (*self.plugins_dirs, *self.config_files)


def cross_problems(values: dict[str, Any]) -> list[tuple[str, str]]:
    """The rules between flags, on the values that parsed: (flag name, message) for each broken one."""
    found = []
    if values.get("enable-recovery") and values.get("standalone"):
        found.append(
            ("enable-recovery", "recovery acts on the cluster (cordon, drain, Auto Scaling): not with --standalone")
        )
    if values.get("cloudwatch") and values.get("cluster-name") == "":
        found.append(
            ("cloudwatch", "needs --cluster-name (env CLUSTER_NAME): every metric carries the ClusterName dimension")
        )
    return found


def build_settings(args: argparse.Namespace) -> Settings:
    """Settings from parsed ``run`` arguments. Raises ConfigError naming each bad flag and its variable."""
    values, refused = read(args, RUN_FLAGS)
    by_name = {flag.name: flag for flag in RUN_FLAGS}
    refused += [(by_name[name], message) for name, message in cross_problems(values)]
    if refused:
        raise ConfigError([flag.problem(message) for flag, message in refused])
    fields: dict[str, Any] = {f.field: values[f.name] for f in RUN_FLAGS if f.field is not None}
    # --plugins-dir and --pack both fill plugins_dirs: the directories given, then the packs named.
    fields["plugins_dirs"] = tuple(rule_dirs(plugins_dirs=values["plugins-dir"], packs=values["pack"]))
    if fields["serve_conditions"] is None:
        # Off in Kubernetes mode unless asked for: the messages quote the kernel log, the port is on the pod network.
        fields["serve_conditions"] = fields["standalone"]
    return Settings(**fields)


def check_args(args: argparse.Namespace, bad: Callable[[str, str], None]) -> tuple[Path, Path, str | None, int]:
    """The check flags shared by ``run`` and ``check``: host roots, instance type, concurrency."""
    values, refused = read(args, CHECK_FLAGS)
    for flag, message in refused:
        bad(flag.name, message)
    return (
        values.get("sys-root", Path(args.sys_root)),
        values.get("dev-root", Path(args.dev_root)),
        values.get("instance-type"),
        values.get("check-concurrency", 4),
    )


def rule_paths(args: argparse.Namespace, files: Sequence[str] | None) -> list[Path]:
    """``--plugins-dir`` and ``--pack`` directories, then ``files`` (``--config`` or positional FILEs)."""
    return [*rule_dirs(plugins_dirs=args.plugins_dir, packs=args.pack), *(Path(f) for f in files or ())]


__all__ = [
    "DEFAULT_KMSG",
    "DEFAULT_LISTEN",
    "DEFAULT_STATE_DIR",
    "EVENT_NAMESPACE",
    "RECOVERY_ENV",
    "Flag",
    "Listen",
    "Settings",
    "build_settings",
    "builtin_packs",
    "check_args",
    "env_default",
    "parse_bool",
    "parse_enable_recovery",
    "parse_listen",
    "rule_dirs",
    "rule_paths",
]
