"""Every flag of ``run``, declared once: name, environment variables, parser, default, help, the
``Settings`` field it fills and its documentation.

The table generates the argparse flags (with their environment defaults), the reading of parsed
arguments into typed values (:func:`read`, one problem per bad value), and the configuration
reference docs/configuration.md (:func:`reference`; a test keeps the committed file equal to it).
"""

from __future__ import annotations

import argparse
import enum
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.adapters.podresources import DEFAULT_SOCKET as DEFAULT_POD_RESOURCES_SOCKET
from agent.app import flagvalues as v
from agent.core.errors import ConfigProblem
from agent.core.paths import builtin_plugins_dir


class Kind(enum.Enum):
    VALUE = "value"  # --flag VALUE; the environment gives the default
    SWITCH = "switch"  # --flag alone means true; the environment gives the default (true or false)
    LIST = "list"  # repeatable; the variable (comma-separated) applies when the flag is not given
    ADD = "add"  # repeatable; the variable (comma-separated) adds to the flags


@dataclass(frozen=True, kw_only=True, slots=True)
class Group:
    title: str  # the section of docs/configuration.md
    help_title: str | None = None  # the argparse group in --help; None: with the other options


@dataclass(frozen=True, kw_only=True, slots=True)
class Flag:
    name: str  # --name
    field: str | None  # the Settings field it fills; None: read elsewhere (--log-level)
    parse: Callable[[Any], Any]  # the flag's text (a list for LIST and ADD) -> value; ValueError = refused
    help: str  # --help; {packs} and {plugins_dir} are filled in when the parser is built
    doc: str  # the meaning in docs/configuration.md (Markdown)
    group: Group
    env: tuple[str, ...] = ()  # read in this order: the first one set and not empty wins
    default: str | None = None  # neither flag nor environment
    shown_default: str = ""  # the default column of the docs ("" = the default, quoted)
    metavar: str | None = None
    kind: Kind = Kind.VALUE
    choices: tuple[str, ...] | None = None
    label: str = ""  # the variable errors name (default: the first of env, else NHA_<NAME>)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def var(self) -> str:
        return self.label or (self.env[0] if self.env else f"NHA_{self.dest.upper()}")

    def problem(self, message: str) -> ConfigProblem:
        return ConfigProblem(file=f"--{self.name} / {self.var}", field="", message=message)


def from_env(flag: Flag, environ: Mapping[str, str]) -> str | None:
    """The flag's value from its variables, else its default: the first variable set and not empty wins; one
    set but empty gives ""."""
    found = [environ[name] for name in flag.env if name in environ]
    return next((value for value in found if value), "" if found else flag.default)


RULES = Group(title="Rule packs and configuration files")
CHECKS = Group(title="Checks", help_title="checks")
AGENT = Group(title="Kernel log, state and HTTP")
KUBERNETES = Group(title="Kubernetes mode", help_title="Kubernetes mode (without --standalone)")
RECOVERY = Group(title="Recovery and CloudWatch", help_title='recovery and CloudWatch (README "Recovery")')
EVERY_COMMAND = Group(title="Every command")

LOG_LEVEL = Flag(
    name="log-level",
    field=None,
    parse=str,
    env=("NHA_LOG_LEVEL",),
    default="info",
    choices=("debug", "info", "warning", "error"),
    group=EVERY_COMMAND,
    help="diagnostic log level on stderr (env NHA_LOG_LEVEL; default info)",
    doc="diagnostics on stderr; accepted before and after the command",
)

RULE_FLAGS = (
    Flag(
        name="config",
        field="config_files",
        parse=v.config_files,
        env=("NHA_CONFIG",),
        kind=Kind.ADD,
        metavar="FILE|DIR",
        group=RULES,
        shown_default="–",
        help="extra configuration file applied after the plugins: a rule pack (node-problem-detector "
        "system-log-monitor JSON/YAML, with extensions), a 'checks:' file or an NPD plugin file; or a directory: "
        "every *.json, *.yaml and *.yml file under it, sorted by path; repeatable, applied in the order given",
        doc="extra file applied after the plugins: a rule pack, a `checks:` file, an NPD plugin file; or a directory "
        "of them (every `*.json`, `*.yaml`, `*.yml` under it, sorted by path: a whole ConfigMap, or NPD's "
        "`config/`); overrides by name (repeatable, in the order given). The variable (comma-separated) adds "
        "more after the flags: that is how a kustomize component or a Helm value adds files without rewriting "
        "the container's args",
    ),
    Flag(
        name="plugins-dir",
        field="plugins_dirs",
        parse=v.plugins_dirs,
        kind=Kind.LIST,
        metavar="DIR",
        group=RULES,
        shown_default="built-in packs",
        help="directory of rule packs, instead of the built-in ones ({plugins_dir}); repeatable",
        doc="directories of plugins (rule packs, check declarations, NPD plugin files) instead of the built-ins "
        "(repeatable)",
    ),
    Flag(
        name="pack",
        field="plugins_dirs",
        parse=v.packs,
        env=("NHA_PACKS",),
        kind=Kind.LIST,
        metavar="NAME",
        group=RULES,
        shown_default="all",
        help="use only these built-in packs ({packs}); repeatable or comma-separated (env NHA_PACKS; default: all)",
        doc="built-in packs (rules and checks) to load: `kernel`, `neuron`, `nvidia`, `rdma` (comma-separated or "
        "repeated)",
    ),
)

CHECK_FLAGS = (
    Flag(
        name="sys-root",
        field="sys_root",
        parse=v.host_root("/sys"),
        env=("NHA_SYS_ROOT",),
        default="/sys",
        metavar="DIR",
        group=CHECKS,
        help="the host's /sys as checks see it (a pod mounts it read-only, e.g. at /host/sys; env NHA_SYS_ROOT)",
        doc="the host's `/sys` as the checks see it (the DaemonSet mounts it read-only at `/host/sys`)",
    ),
    Flag(
        name="dev-root",
        field="dev_root",
        parse=v.host_root("/dev"),
        env=("NHA_DEV_ROOT",),
        default="/dev",
        metavar="DIR",
        group=CHECKS,
        help="the host's /dev as checks see it (a pod sees only its own devices in /dev; env NHA_DEV_ROOT)",
        doc="the host's `/dev` (a pod's own `/dev` shows only the devices given to it)",
    ),
    Flag(
        name="instance-type",
        field="instance_type",
        parse=v.optional_text,
        env=("NHA_INSTANCE_TYPE",),
        default="",
        metavar="TYPE",
        group=CHECKS,
        shown_default="the Node's `node.kubernetes.io/instance-type` label",
        help="instance type for the expected device counts (default: the Node's node.kubernetes.io/instance-type "
        "label; env NHA_INSTANCE_TYPE)",
        doc="instance type for the checks' expected device counts",
    ),
    Flag(
        name="check-concurrency",
        field="check_concurrency",
        parse=v.concurrency,
        env=("NHA_CHECK_CONCURRENCY",),
        default="4",
        metavar="N",
        group=CHECKS,
        help="checks running at once at most (default 4; env NHA_CHECK_CONCURRENCY)",
        doc="checks running at once at most (1 to 64)",
    ),
    Flag(
        name="active-check-share",
        field="active_check_share",
        parse=v.share,
        env=("NHA_ACTIVE_CHECK_SHARE",),
        default="10%",
        metavar="PERCENT",
        group=CHECKS,
        help="at most this share of a pool's or zone's nodes run an active check at once (default 10%%, rounded "
        "up, at least 1; env NHA_ACTIVE_CHECK_SHARE)",
        doc="at most this share of a pool's or zone's nodes run an active check at once (`1%` to `100%`, rounded "
        "up, at least 1 node; [docs/checks-active.md](checks-active.md#the-gates))",
    ),
)

AGENT_FLAGS = (
    Flag(
        name="watch-config",
        field="watch_config",
        parse=v.parse_bool,
        env=("NHA_WATCH_CONFIG",),
        default="true",
        metavar="BOOL",
        group=AGENT,
        help="reload plugin and configuration files when they change; an invalid change is rejected and the last "
        "good configuration keeps running (default true; env NHA_WATCH_CONFIG)",
        doc="reload plugin directories and config files when they change; an invalid change is rejected (logged, "
        "`/healthz` details, metric) and the last good configuration keeps running",
    ),
    Flag(
        name="standalone",
        field="standalone",
        parse=v.parse_bool,
        env=("NHA_STANDALONE",),
        default="false",
        kind=Kind.SWITCH,
        group=AGENT,
        shown_default="off",
        help="no cluster: log each transition as one JSON line on stdout and serve HTTP (env NHA_STANDALONE: "
        "true or false)",
        doc="no cluster: transitions are logged as JSON lines on stdout (the variable: `true` or `false`; anything "
        "else exits 2)",
    ),
    Flag(
        name="kmsg-path",
        field="kmsg_path",
        parse=v.path,
        env=("NHA_KMSG_PATH",),
        default=str(v.DEFAULT_KMSG),
        group=AGENT,
        help="kernel log device",
        doc="kernel log to read (a kmsg-format file works too: "
        "[its format](rule-packs.md#a-kmsg-format-file---kmsg-path-file))",
    ),
    Flag(
        name="boot-id-file",
        field="boot_id_file",
        parse=lambda value: v.DEFAULT_BOOT_ID if not value else v.path(value),
        env=("NHA_BOOT_ID_FILE",),
        default=str(v.DEFAULT_BOOT_ID),
        metavar="FILE",
        group=AGENT,
        help="this boot's id (a new one tells kmsg replay and recovery that the host rebooted)",
        doc="this boot's id: a new one tells kmsg replay that the host rebooted, and recovery that a reboot it "
        "requested is finished ([the ladder](recovery.md#the-ladder-reboot-first-then-replace))",
    ),
    Flag(
        name="kmsg-relay",
        field="kmsg_relay",
        parse=v.optional_path,
        env=("NHA_KMSG_RELAY",),
        metavar="SOCKET",
        group=AGENT,
        shown_default="–",
        help="read raw kmsg records from a kmsg-relay UNIX socket instead of --kmsg-path",
        doc="read records from a `kmsg-relay` socket instead (how the DaemonSet runs)",
    ),
    Flag(
        name="listen",
        field="listen",
        parse=v.parse_listen,
        env=("NHA_LISTEN",),
        default=v.DEFAULT_LISTEN,
        metavar="HOST:PORT",
        group=AGENT,
        help=f"HTTP address for /metrics, /healthz, /conditions; 0 disables (default {v.DEFAULT_LISTEN})",
        doc="HTTP for `/metrics`, `/healthz`, `/conditions`; `HOST:0` picks any free port (logged); a bare `0` "
        "disables",
    ),
    Flag(
        name="serve-conditions",
        field="serve_conditions",
        parse=v.optional_bool,
        env=("NHA_SERVE_CONDITIONS",),
        metavar="BOOL",
        group=AGENT,
        shown_default="`true` with `--standalone`, else `false`",
        help="serve /conditions (the current conditions as JSON, with kernel-log text in their messages); default "
        "true with --standalone, false in Kubernetes mode, where `kubectl get node` shows the same (env "
        "NHA_SERVE_CONDITIONS)",
        doc="serve `/conditions` (our conditions as JSON; their messages quote kernel-log lines). Off in Kubernetes "
        "mode, where the port is on the pod network and `kubectl get node` shows the same; off, it answers 404",
    ),
    Flag(
        name="state-dir",
        field="state_dir",
        parse=v.path,
        env=("NHA_STATE_DIR",),
        default=str(v.DEFAULT_STATE_DIR),
        group=AGENT,
        help=f"where the kmsg cursor survives restarts (default {v.DEFAULT_STATE_DIR})",
        doc="keeps the kmsg cursor `(boot_id, last_seq)`, our conditions (`conditions.json`) and undelivered "
        "Events (`events-outbox.json`), so restarts neither lose nor repeat anything, even with the API server "
        "down",
    ),
    Flag(
        name="lookback",
        field="lookback",
        parse=v.duration(),
        env=("NHA_LOOKBACK",),
        default="5m",
        group=AGENT,
        help="with no saved cursor, temporary rules fire for records this recent (default 5m)",
        doc="with no saved state, temporary rules fire only for records this recent (permanent rules see "
        "everything since boot)",
    ),
    Flag(
        name="stall-timeout",
        field="stall_timeout",
        parse=v.duration(at_least=0.1, why="must be at least 0.1s"),
        env=("NHA_STALL_TIMEOUT",),
        default="60s",
        group=AGENT,
        help="/healthz fails when the reader or main loop shows no sign of life for this long (default 60s)",
        doc="`/healthz` fails when the reader or main loop shows no sign of life this long (at least 0.1s)",
    ),
    Flag(
        name="aggregate-condition",
        field="aggregate_condition",
        parse=v.parse_bool,
        env=("NHA_AGGREGATE_CONDITION",),
        default="false",
        metavar="BOOL",
        group=AGENT,
        help="also maintain condition AcceleratedHardwareReady (False while a critical accelerator problem is "
        "present), the condition EKS node auto repair and Karpenter act on (env NHA_AGGREGATE_CONDITION)",
        doc="also maintain condition `AcceleratedHardwareReady` (`False` while a critical accelerator problem is "
        "present), the condition EKS node auto repair and Karpenter act on "
        "([conditions.md](conditions.md#conditions-and-events))",
    ),
)

KUBERNETES_FLAGS = (
    Flag(
        name="node-name",
        field="node_name",
        parse=lambda value: value or None,
        env=("NHA_NODE_NAME",),
        group=KUBERNETES,
        shown_default="env `NODE_NAME`, then the hostname",
        help="node name (default: env NODE_NAME, hostname)",
        doc="the Node to report on",
    ),
    Flag(
        name="kubeconfig",
        field="kubeconfig",
        parse=v.optional_path,
        env=("NHA_KUBECONFIG",),
        group=KUBERNETES,
        shown_default="in-cluster, then `KUBECONFIG`",
        help="kubeconfig file (default: in-cluster service account, else KUBECONFIG)",
        doc="API credentials",
    ),
    Flag(
        name="service-account-dir",
        field="service_account_dir",
        parse=v.optional_path,
        env=("NHA_SERVICE_ACCOUNT_DIR",),
        group=KUBERNETES,
        shown_default="`/var/run/secrets/kubernetes.io/serviceaccount`",
        help="in a pod: the directory of the service account's token and ca.crt (default: the pod's own)",
        doc="in-cluster credentials (`token`, `ca.crt`), used when `KUBERNETES_SERVICE_HOST` is set and no "
        "kubeconfig is given: a token projected to another path",
    ),
    Flag(
        name="event-namespace",
        field="event_namespace",
        parse=v.event_namespace,
        env=("NHA_EVENT_NAMESPACE",),
        default=v.EVENT_NAMESPACE,
        group=KUBERNETES,
        help="namespace of our Events",
        doc="namespace of our Events; the API server only accepts Events about a Node in `default`, so anything "
        "else exits 2",
    ),
    Flag(
        name="heartbeat",
        field="heartbeat",
        parse=v.duration(at_least=10.0, why="must be at least 10s (it bounds API writes)"),
        env=("NHA_HEARTBEAT",),
        default="5m",
        group=KUBERNETES,
        help="re-send all conditions every HEARTBEAT to HEARTBEAT+10%% (default 5m: at most 12 writes per node "
        "per hour)",
        doc="re-send all conditions at the node's own phase of a 5.5 min cycle, never sooner than 5 min after the "
        "last write (≤ 11 writes per node per hour); a fleet's nodes beat at spread phases, also after a "
        "fleet-wide change or an outage (at least 10s)",
    ),
    Flag(
        name="clear-poll",
        field="clear_poll",
        parse=v.duration(at_least=1.0, why="must be at least 1s (it bounds API reads)"),
        env=("NHA_CLEAR_POLL",),
        default="60s",
        group=KUBERNETES,
        help="read the Node for an operator's clear request every CLEAR_POLL (default 60s)",
        doc="read the agent's own Node for a `clear` request this often (one GET per node per interval)",
    ),
    Flag(
        name="api-wait-timeout",
        field="api_wait_timeout",
        parse=v.duration(),
        env=("NHA_API_WAIT_TIMEOUT",),
        default="30s",
        group=KUBERNETES,
        help="how long to wait for the API server at startup before detecting anyway; conditions are written once "
        "it answers (default 30s)",
        doc="wait this long for the API at startup, then detect anyway (conditions are written once it answers)",
    ),
    Flag(
        name="delete-condition",
        field="delete_conditions",
        parse=v.condition_types,
        env=("NHA_DELETE_CONDITIONS",),
        kind=Kind.ADD,
        metavar="TYPE",
        group=KUBERNETES,
        shown_default="–",
        help="condition type no longer configured: delete it from the Node (repeatable or comma-separated; "
        "env NHA_DELETE_CONDITIONS). Nothing is deleted otherwise.",
        doc="condition types removed from the configuration: delete them from the Node (repeatable or "
        "comma-separated; the variable adds to the flags); nothing else is ever deleted",
    ),
)

RECOVERY_FLAGS = (
    Flag(
        name="enable-recovery",
        field="enable_recovery",
        parse=v.parse_enable_recovery,
        env=("ENABLE_RECOVERY",),
        metavar="BOOL",
        group=RECOVERY,
        shown_default="unset",
        help="true: cordon / drain / mark the instance Unhealthy as the recovery policy says; unset or false: "
        "report what would be done (env ENABLE_RECOVERY; any other value exits 2)",
        doc="`true`: act (cordon, drain, mark the instance Unhealthy) as the recovery policy says; unset or "
        "`false`: report what would be done; anything else exits 2, and so does `true` with `--standalone`",
    ),
    Flag(
        name="cluster-name",
        field="cluster_name",
        parse=v.cluster_name,
        env=("CLUSTER_NAME", "NHA_CLUSTER_NAME"),
        default="",
        metavar="NAME",
        group=RECOVERY,
        shown_default="–",
        help="CloudWatch dimension ClusterName and the scope of the recovery budget (env CLUSTER_NAME)",
        doc="CloudWatch dimension `ClusterName` and the scope of the recovery budget (letters, digits, `.`, `_`, "
        "`-`; at most 100)",
    ),
    Flag(
        name="recovery-startup-delay",
        field="recovery_startup_delay",
        parse=v.startup_delay,
        env=("RECOVERY_STARTUP_DELAY",),
        metavar="DUR",
        group=RECOVERY,
        shown_default="the policy's, `60s`",
        help="no recovery action in the first DUR after start (env RECOVERY_STARTUP_DELAY; default: the policy's, "
        "60s; 0 disables)",
        doc="no recovery action in the first DUR after start; `0` disables",
    ),
    Flag(
        name="recovery-policy",
        field="recovery_policy",
        parse=v.recovery_policy,
        env=("NHA_RECOVERY_POLICY",),
        metavar="FILE",
        group=RECOVERY,
        shown_default="built-in",
        help="recovery policy YAML (env NHA_RECOVERY_POLICY; default: the built-in policy, see docs/recovery.md)",
        doc="recovery policy: its rules extend the built-in ones (`base: none` for only yours; `validate-config "
        "--print-policy` prints the result) ([docs/recovery.md](recovery.md#the-policy))",
    ),
    Flag(
        name="cloudwatch",
        field="cloudwatch",
        parse=v.boolean,
        env=("NHA_CLOUDWATCH",),
        default="false",
        metavar="BOOL",
        group=RECOVERY,
        help="publish unrecoverable problems to CloudWatch namespace NeuronHealthCheck, independent of "
        "--enable-recovery (env NHA_CLOUDWATCH; needs --cluster-name and AWS credentials)",
        doc="publish unrecoverable problems to CloudWatch `NeuronHealthCheck` (needs `--cluster-name`), recovery "
        "on or off",
    ),
    Flag(
        name="scheduled-maintenance",
        field="scheduled_maintenance",
        parse=v.boolean,
        env=("NHA_SCHEDULED_MAINTENANCE",),
        default="false",
        metavar="BOOL",
        group=RECOVERY,
        help="poll EC2 scheduled events (IMDSv2) every 5 min into condition ScheduledMaintenance (env "
        "NHA_SCHEDULED_MAINTENANCE; docs/recovery.md)",
        doc="poll EC2 scheduled events (IMDSv2, every 5 min) into condition `ScheduledMaintenance`; no IAM "
        "([docs/recovery.md](recovery.md#scheduled-maintenance))",
    ),
    Flag(
        name="diagnostics-keep",
        field="diagnostics_keep",
        parse=v.bundles_kept,
        env=("NHA_DIAGNOSTICS_KEEP",),
        default="5",
        metavar="N",
        group=RECOVERY,
        help="diagnostics bundles kept in the state directory, written before a reboot or replace (env "
        "NHA_DIAGNOSTICS_KEEP; 0 = none)",
        doc="diagnostics bundles kept in `<state-dir>/diagnostics/`, one taken before each reboot or replace when "
        "recovery acts (0 to 100; `0` = none) ([docs/recovery.md](recovery.md#diagnostics-bundle))",
    ),
    Flag(
        name="diagnostics-s3",
        field="diagnostics_s3",
        parse=v.s3_prefix,
        env=("NHA_DIAGNOSTICS_S3",),
        metavar="s3://BUCKET/PREFIX",
        group=RECOVERY,
        shown_default="–",
        help="also put each diagnostics bundle to S3 under this prefix (env NHA_DIAGNOSTICS_S3; s3:PutObject)",
        doc="also put each bundle to S3 under that prefix (`s3:PutObject` there only)",
    ),
    Flag(
        name="namespace",
        field="pod_namespace",
        parse=v.namespace,
        env=("POD_NAMESPACE",),
        default=v.DEFAULT_NAMESPACE,
        metavar="NS",
        group=RECOVERY,
        help="the agent's namespace, where the recovery budget Lease lives (env POD_NAMESPACE)",
        doc="the agent's namespace, where the recovery budget Lease lives (the downward API sets it)",
    ),
    Flag(
        name="device-holders",
        field="device_holders",
        parse=v.boolean,
        env=("DEVICE_HOLDERS",),
        default="false",
        metavar="BOOL",
        group=RECOVERY,
        help="find the pods holding a failing device through the kubelet's pod-resources socket and tell each "
        "in a DeviceFault Event (env DEVICE_HOLDERS; docs/devices.md)",
        doc="find the pods on this node that hold a failing device (the kubelet's pod-resources API; grpc is "
        "loaded at the first lookup) and tell each in a `DeviceFault` Event "
        "([docs/devices.md](devices.md#telling-the-pods))",
    ),
    Flag(
        name="pod-resources-socket",
        field="pod_resources_socket",
        parse=v.socket_path,
        env=("POD_RESOURCES_SOCKET",),
        default=DEFAULT_POD_RESOURCES_SOCKET,
        metavar="PATH",
        group=RECOVERY,
        help="the kubelet's pod-resources socket, or the kmsg relay's forward of it (env POD_RESOURCES_SOCKET)",
        doc="the kubelet's pod-resources socket, or the `kmsg-relay` container's forward of it (the DaemonSet: "
        "`/run/node-health-agent/pod-resources.sock`, "
        "[docs/devices.md](devices.md#where-the-agent-reaches-the-socket)); used with `--device-holders`",
    ),
)

RUN_FLAGS = (*RULE_FLAGS, *CHECK_FLAGS, *AGENT_FLAGS, *KUBERNETES_FLAGS, *RECOVERY_FLAGS)


def help_text(flag: Flag) -> str:
    text = flag.help
    if "{packs}" in text:
        text = text.replace("{packs}", ", ".join(v.builtin_packs()))
    return text.replace("{plugins_dir}", str(builtin_plugins_dir()))


def add_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: Flag,
    *,
    environ: Mapping[str, str] | None = None,
    help: str | None = None,
    default: object = None,
) -> None:
    """``--name`` on ``parser``: its default from the environment (``environ``, default os.environ) unless
    ``default`` is given; ``help`` replaces the flag's own (a command that reads the flag differently)."""
    options: dict[str, Any] = {"help": help_text(flag) if help is None else help}
    if flag.kind in (Kind.LIST, Kind.ADD):
        options.update(action="append", default=None)  # the variable is read with the flags (read())
    else:
        found = from_env(flag, os.environ if environ is None else environ) if default is None else default
        options["default"] = found
        if flag.kind is Kind.SWITCH:
            options.update(action="store_const", const="true")
    if flag.metavar is not None:
        options["metavar"] = flag.metavar
    if flag.choices is not None:
        options["choices"] = list(flag.choices)
    parser.add_argument(f"--{flag.name}", **options)


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """Every flag of ``flags`` on ``parser``, each group's under its --help title."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in flags:
        title = flag.group.help_title
        if title is None:
            add_flag(parser, flag)
            continue
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        add_flag(groups[title], flag)


def raw_value(flag: Flag, args: argparse.Namespace, environ: Mapping[str, str]) -> Any:
    """What was given for ``flag``: the parsed argument, with a repeatable flag's variable as :class:`Kind` says."""
    given = getattr(args, flag.dest, None if flag.kind in (Kind.LIST, Kind.ADD) else from_env(flag, environ))
    if flag.kind not in (Kind.LIST, Kind.ADD):
        return given
    text = from_env(flag, environ) or ""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if flag.kind is Kind.LIST:
        return given or items or None
    return [*(given or ()), *items]


def read(
    args: argparse.Namespace, flags: Iterable[Flag], *, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], list[tuple[Flag, str]]]:
    """Each flag's parsed value by name, and (flag, message) for each value refused."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    problems: list[tuple[Flag, str]] = []
    for flag in flags:
        try:
            values[flag.name] = flag.parse(raw_value(flag, args, env))
        except v.Refused as exc:
            problems.extend((flag, message) for message in exc.messages)
        except ValueError as exc:
            problems.append((flag, str(exc)))
    return values, problems


REFERENCE_INTRO = """\
# Configuration reference (`run`)

<!-- Generated from agent/app/flags.py by agent.app.flags.reference(); tests/app/test_flags.py keeps it in step. -->

Every flag of `node-health-agent run` can also be set through its environment variable; the flag
wins. Most variables are `NHA_<FLAG>` (dashes become underscores). A few keep the names the
DaemonSet has always used: `ENABLE_RECOVERY`, `CLUSTER_NAME`, `RECOVERY_STARTUP_DELAY` and
`POD_NAMESPACE`; the device-holder flags read `DEVICE_HOLDERS` and `POD_RESOURCES_SOCKET`. Where a
flag has two variables, the first one set and not empty wins.

A repeatable flag's variable holds a comma-separated list. For `--config` and `--delete-condition`
the variable adds to the flags; for `--pack` it applies when no `--pack` is given.

Durations are Go-style: `30s`, `5m`, `1h30m`. A bad value exits 2 before anything touches the
cluster, naming the flag and its variable, for example `--heartbeat / NHA_HEARTBEAT: must be at
least 10s (it bounds API writes)`.
"""


def _row(flag: Flag) -> str:
    value = flag.metavar or "|".join(flag.choices or ()) or flag.dest.upper()
    name = (f"--{flag.name}" + ("" if flag.kind is Kind.SWITCH else f" {value}")).replace("|", "\\|")
    env = ", ".join(f"`{var}`" for var in flag.env) or "–"
    default = flag.shown_default or (f"`{flag.default}`" if flag.default else "–")
    return f"| `{name}` | {env} | {default} | {flag.doc} |"


def reference(flags: Iterable[Flag] = (*RUN_FLAGS, LOG_LEVEL)) -> str:
    """docs/configuration.md: one table per group, in the table's order."""
    groups: dict[str, list[Flag]] = {}
    for flag in flags:
        groups.setdefault(flag.group.title, []).append(flag)
    parts = [REFERENCE_INTRO]
    for title, members in groups.items():
        rows = "\n".join(_row(flag) for flag in members)
        parts.append(f"## {title}\n\n| flag | environment | default | meaning |\n|---|---|---|---|\n{rows}\n")
    return "\n".join(parts)


def flag(name: str) -> Flag:
    """The flag ``--name`` of the table (KeyError for a name it does not declare)."""
    return {f.name: f for f in (*RUN_FLAGS, LOG_LEVEL)}[name]
