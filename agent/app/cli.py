"""Command line: ``run``, ``relay``, ``simulate``, ``check``, ``plugins``, ``validate-config`` and
``status`` (the longer commands live in :mod:`agent.app.commands`).

Exit codes: 0 success, 2 bad configuration or unusable input (before anything touches the
cluster), 1 an unexpected failure. ``main(argv)`` is callable from tests.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from agent import __version__
from agent.app.config import load_rule_set
from agent.app.exitcodes import EXIT_CONFIG, EXIT_OK
from agent.app.settings import (
    DEFAULT_KMSG,
    DEFAULT_LISTEN,
    DEFAULT_STATE_DIR,
    Settings,
    build_settings,
    builtin_packs,
    env_default,
    rule_dirs,
)
from agent.core.errors import ConfigError, ConfigProblem
from agent.core.paths import builtin_plugins_dir
from agent.core.types import RuleType
from agent.detectors.pipeline import saved_log_line
from agent.detectors.rulepack import RuleSet
from agent.detectors.rules import RuleEngine

log = logging.getLogger("agent")

SIMULATE_BATCH = 4096


def _add_check_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("checks")
    group.add_argument(
        "--sys-root",
        default=env_default("sys-root", "/sys"),
        metavar="DIR",
        help="the host's /sys as checks see it (a pod mounts it read-only, e.g. at /host/sys; env NHA_SYS_ROOT)",
    )
    group.add_argument(
        "--dev-root",
        default=env_default("dev-root", "/dev"),
        metavar="DIR",
        help="the host's /dev as checks see it (a pod sees only its own devices in /dev; env NHA_DEV_ROOT)",
    )
    group.add_argument(
        "--instance-type",
        default=env_default("instance-type", ""),
        metavar="TYPE",
        help="instance type for the expected device counts (default: the Node's node.kubernetes.io/instance-type "
        "label; env NHA_INSTANCE_TYPE)",
    )
    group.add_argument(
        "--check-concurrency",
        default=env_default("check-concurrency", "4"),
        metavar="N",
        help="checks running at once at most (default 4; env NHA_CHECK_CONCURRENCY)",
    )


def _add_rule_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        action="append",
        default=None,
        metavar="FILE|DIR",
        help="extra configuration file applied after the plugins: a rule pack (node-problem-detector "
        "system-log-monitor JSON/YAML, with extensions), a 'checks:' file or an NPD plugin file; or a directory: "
        "every *.json, *.yaml and *.yml file under it, sorted by path; repeatable, applied in the order given",
    )
    parser.add_argument(
        "--plugins-dir",
        action="append",
        default=None,
        metavar="DIR",
        help=f"directory of rule packs, instead of the built-in ones ({builtin_plugins_dir()}); repeatable",
    )
    parser.add_argument(
        "--pack",
        action="append",
        default=None,
        metavar="NAME",
        help=f"use only these built-in packs ({', '.join(builtin_packs())}); repeatable or comma-separated "
        "(env NHA_PACKS; default: all)",
    )


LOG_LEVELS = ["debug", "info", "warning", "error"]


def build_parser() -> argparse.ArgumentParser:
    # --log-level is accepted before and after the command: the subcommands' copy only overrides
    # the main one when given (SUPPRESS keeps it out of the namespace otherwise).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        choices=LOG_LEVELS,
        help="diagnostic log level on stderr (env NHA_LOG_LEVEL; default info)",
    )
    parser = argparse.ArgumentParser(
        prog="node-health-agent",
        description="Per-node health agent for Kubernetes nodes with accelerators (AWS Neuron, NVIDIA GPUs).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default=env_default("log-level", "info"),
        choices=LOG_LEVELS,
        help="diagnostic log level on stderr (env NHA_LOG_LEVEL; default info)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run", parents=[common], help="run the agent", description="Run the agent (every flag has an NHA_* env var)."
    )
    _add_rule_args(run)
    _add_check_args(run)
    run.add_argument(
        "--watch-config",
        default=env_default("watch-config", "true"),
        metavar="BOOL",
        help="reload plugin and configuration files when they change; an invalid change is rejected and the last "
        "good configuration keeps running (default true; env NHA_WATCH_CONFIG)",
    )
    run.add_argument(
        "--standalone",
        action="store_const",
        const="true",
        default=env_default("standalone", "false"),
        help="no cluster: log each transition as one JSON line on stdout and serve HTTP (env NHA_STANDALONE: "
        "true or false)",
    )
    run.add_argument("--kmsg-path", default=env_default("kmsg-path", str(DEFAULT_KMSG)), help="kernel log device")
    run.add_argument(
        "--boot-id-file",
        default=env_default("boot-id-file", "/proc/sys/kernel/random/boot_id"),
        metavar="FILE",
        help="this boot's id (a new one tells kmsg replay and recovery that the host rebooted)",
    )
    run.add_argument(
        "--kmsg-relay",
        default=env_default("kmsg-relay"),
        metavar="SOCKET",
        help="read raw kmsg records from a kmsg-relay UNIX socket instead of --kmsg-path",
    )
    run.add_argument(
        "--listen",
        default=env_default("listen", DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help=f"HTTP address for /metrics, /healthz, /conditions; 0 disables (default {DEFAULT_LISTEN})",
    )
    run.add_argument(
        "--serve-conditions",
        default=env_default("serve-conditions"),
        metavar="BOOL",
        help="serve /conditions (the current conditions as JSON, with kernel-log text in their messages); default "
        "true with --standalone, false in Kubernetes mode, where `kubectl get node` shows the same (env "
        "NHA_SERVE_CONDITIONS)",
    )
    run.add_argument(
        "--state-dir",
        default=env_default("state-dir", str(DEFAULT_STATE_DIR)),
        help=f"where the kmsg cursor survives restarts (default {DEFAULT_STATE_DIR})",
    )
    run.add_argument(
        "--lookback",
        default=env_default("lookback", "5m"),
        help="with no saved cursor, temporary rules fire for records this recent (default 5m)",
    )
    run.add_argument(
        "--stall-timeout",
        default=env_default("stall-timeout", "60s"),
        help="/healthz fails when the reader or main loop shows no sign of life for this long (default 60s)",
    )
    run.add_argument(
        "--aggregate-condition",
        default=env_default("aggregate-condition", "false"),
        metavar="BOOL",
        help="also maintain condition AcceleratedHardwareReady (False while a critical accelerator problem is "
        "present), the condition EKS node auto repair and Karpenter act on (env NHA_AGGREGATE_CONDITION)",
    )
    k8s = run.add_argument_group("Kubernetes mode (without --standalone)")
    k8s.add_argument(
        "--node-name", default=env_default("node-name") or None, help="node name (default: env NODE_NAME, hostname)"
    )
    k8s.add_argument(
        "--kubeconfig",
        default=env_default("kubeconfig") or None,
        help="kubeconfig file (default: in-cluster service account, else KUBECONFIG)",
    )
    k8s.add_argument(
        "--event-namespace", default=env_default("event-namespace", "default"), help="namespace of our Events"
    )
    k8s.add_argument(
        "--heartbeat",
        default=env_default("heartbeat", "5m"),
        help="re-send all conditions every HEARTBEAT to HEARTBEAT+10%% (default 5m: at most 12 writes per node "
        "per hour)",
    )
    k8s.add_argument(
        "--api-wait-timeout",
        default=env_default("api-wait-timeout", "30s"),
        help="how long to wait for the API server at startup before detecting anyway; conditions are written once "
        "it answers (default 30s)",
    )
    k8s.add_argument(
        "--delete-condition",
        action="append",
        default=[env_default("delete-conditions") or ""],
        metavar="TYPE",
        help="condition type no longer configured: delete it from the Node (repeatable or comma-separated; "
        "env NHA_DELETE_CONDITIONS). Nothing is deleted otherwise.",
    )
    rec = run.add_argument_group('recovery and CloudWatch (README "Recovery")')
    rec.add_argument(
        "--enable-recovery",
        default=os.environ.get("ENABLE_RECOVERY"),
        metavar="BOOL",
        help="true: cordon / drain / mark the instance Unhealthy as the recovery policy says; unset or false: "
        "report what would be done (env ENABLE_RECOVERY; any other value exits 2)",
    )
    rec.add_argument(
        "--cluster-name",
        default=os.environ.get("CLUSTER_NAME") or env_default("cluster-name", ""),
        metavar="NAME",
        help="CloudWatch dimension ClusterName and the scope of the recovery budget (env CLUSTER_NAME)",
    )
    rec.add_argument(
        "--recovery-startup-delay",
        default=os.environ.get("RECOVERY_STARTUP_DELAY") or None,
        metavar="DUR",
        help="no recovery action in the first DUR after start (env RECOVERY_STARTUP_DELAY; default: the policy's, "
        "60s; 0 disables)",
    )
    rec.add_argument(
        "--recovery-policy",
        default=env_default("recovery-policy") or None,
        metavar="FILE",
        help="recovery policy YAML (env NHA_RECOVERY_POLICY; default: the built-in policy, see docs/recovery.md)",
    )
    rec.add_argument(
        "--cloudwatch",
        default=env_default("cloudwatch", "false"),
        metavar="BOOL",
        help="publish unrecoverable problems to CloudWatch namespace NeuronHealthCheck, independent of "
        "--enable-recovery (env NHA_CLOUDWATCH; needs --cluster-name and AWS credentials)",
    )
    rec.add_argument(
        "--scheduled-maintenance",
        default=env_default("scheduled-maintenance", "false"),
        metavar="BOOL",
        help="poll EC2 scheduled events (IMDSv2) every 5 min into condition ScheduledMaintenance (env "
        "NHA_SCHEDULED_MAINTENANCE; docs/recovery.md)",
    )
    rec.add_argument(
        "--diagnostics-keep",
        default=env_default("diagnostics-keep", "5"),
        metavar="N",
        help="diagnostics bundles kept in the state directory, written before a reboot or replace (env "
        "NHA_DIAGNOSTICS_KEEP; 0 = none)",
    )
    rec.add_argument(
        "--diagnostics-s3",
        default=env_default("diagnostics-s3", "") or None,
        metavar="s3://BUCKET/PREFIX",
        help="also put each diagnostics bundle to S3 under this prefix (env NHA_DIAGNOSTICS_S3; s3:PutObject)",
    )
    rec.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE") or "node-health-agent",
        metavar="NS",
        help="the agent's namespace, where the recovery budget Lease lives (env POD_NAMESPACE)",
    )

    relay = sub.add_parser(
        "kmsg-relay",
        parents=[common],
        help="forward raw /dev/kmsg records over a UNIX socket (the DaemonSet's only privileged part)",
        description="Open the kernel log read-only and stream raw records to one agent over a UNIX socket.",
    )
    relay.add_argument("--socket", required=True, metavar="PATH", help="UNIX socket to create")
    relay.add_argument("--kmsg-path", default=str(DEFAULT_KMSG), help="kernel log device (default /dev/kmsg)")

    def numeric_id(text: str) -> int:
        if not (text.isascii() and text.isdigit()):
            raise argparse.ArgumentTypeError(f"not a numeric uid/gid: {text!r}")
        return int(text)

    relay.add_argument(
        "--client-uid",
        type=numeric_id,
        default=None,
        metavar="UID",
        help="the uid that may connect (besides root and --client-gid); the socket is mode 0600 owned by it "
        "(default: the relay's own effective uid)",
    )
    relay.add_argument(
        "--client-gid",
        type=numeric_id,
        default=None,
        metavar="GID",
        help="also let this group connect: the socket becomes mode 0660 with this group (default: none)",
    )

    sim = sub.add_parser(
        "simulate",
        parents=[common],
        help="replay a saved log through the rule packs",
        description="Print one JSON object per finding. Lines may carry kmsg, dmesg, syslog or journal prefixes.",
    )
    _add_rule_args(sim)
    sim.add_argument("logfile", metavar="LOGFILE", help="log file to replay, - for stdin")

    chk = sub.add_parser(
        "check",
        parents=[common],
        help="run the configured checks once and print their verdicts",
        description="Run the checks (built-in, entry points, NPD custom plugins) once. Exit 0 when they ran, "
        "whatever they found; 2 on a configuration error.",
    )
    _add_rule_args(chk)
    _add_check_args(chk)
    chk.add_argument(
        "--json", action="store_true", help="print a JSON list of {check, status, condition, reason, message}"
    )
    chk.add_argument(
        "--state-dir",
        default=env_default("state-dir", str(DEFAULT_STATE_DIR)),
        help="where checks keep what they learned (largest device count seen); default "
        f"{DEFAULT_STATE_DIR}, or a temporary directory when that is not writable",
    )
    chk.add_argument("names", nargs="*", metavar="NAME", help="only these checks (default: all)")

    plg = sub.add_parser(
        "plugins",
        parents=[common],
        help="list the rule packs and checks loaded, their kind and where they came from",
        description="List every configuration file, rule pack, log monitor and check, with its kind and origin.",
    )
    _add_rule_args(plg)

    from agent.app.commands.status import add_parser as add_status_parser

    add_status_parser(sub, parents=[common])
    from agent.app.commands.pause import add_parsers as add_pause_parsers

    add_pause_parsers(sub, parents=[common])

    val = sub.add_parser(
        "validate-config",
        parents=[common],
        help="check rule packs",
        description="Validate the rule packs (the plugins plus FILEs); exit 0 with a summary or 2 with every problem.",
    )
    val.add_argument(
        "--plugins-dir", action="append", default=None, metavar="DIR", help="directory of rule packs; repeatable"
    )
    val.add_argument(
        "--pack",
        action="append",
        default=None,
        metavar="NAME",
        help=f"built-in packs to use ({', '.join(builtin_packs())})",
    )
    val.add_argument(
        "--recovery-policy",
        default=env_default("recovery-policy") or None,
        metavar="FILE",
        help="also validate this recovery policy and print it (env NHA_RECOVERY_POLICY; default: the built-in one)",
    )
    val.add_argument(
        "--print-policy",
        action="store_true",
        help="print only the effective recovery policy, as a policy file (base: none) you can copy",
    )
    val.add_argument("files", nargs="*", metavar="FILE", help="rule pack files to validate")
    return parser


def _rule_paths(args: argparse.Namespace, files: Sequence[str] | None) -> list[Path]:
    return [*rule_dirs(plugins_dirs=args.plugins_dir, packs=args.pack), *(Path(f) for f in files or ())]


def _print_config_error(exc: ConfigError, stream: TextIO) -> None:
    print(f"configuration error ({len(exc.problems)} problem{'s' if len(exc.problems) != 1 else ''}):", file=stream)
    for problem in exc.problems:
        print(f"  {problem}", file=stream)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _dispatch(args)
    except BrokenPipeError:
        # The reader went away (``validate-config | head``): not our failure, and no traceback.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _dispatch(args: argparse.Namespace) -> int:
    try:
        if args.command == "simulate":
            return simulate(args)
        if args.command == "validate-config":
            return validate(args)
        if args.command in ("check", "plugins"):
            from agent.app.commands import check as checkcli

            return checkcli.check(args) if args.command == "check" else checkcli.plugins(args)
        if args.command == "status":
            from agent.app.commands.status import status

            return status(args)
        if args.command in ("pause", "resume"):
            from agent.app.commands.pause import pause

            return pause(args)
        if args.command == "kmsg-relay":
            from agent.sources.relay_server import run_relay

            return run_relay(
                socket_path=Path(args.socket),
                kmsg_path=Path(args.kmsg_path),
                stop=_stop_on_signals(),
                client_uid=args.client_uid,
                client_gid=args.client_gid,
            )
        return run(args)
    except ConfigError as exc:
        _print_config_error(exc, sys.stderr)
        return EXIT_CONFIG


def validate(args: argparse.Namespace) -> int:
    if getattr(args, "print_policy", False):
        from agent.app.commands.policy import print_policy

        return print_policy(args, validate)
    from agent.app.config import load_agent_config

    paths = _rule_paths(args, args.files)
    config = load_agent_config(paths)
    # Build every check too (nothing runs): bad options are configuration errors here as in `run`.
    import tempfile

    from agent.app.config import build_scheduled_checks
    from agent.checks.model import CheckContext

    with tempfile.TemporaryDirectory(prefix="node-health-agent-validate-") as scratch:
        build_scheduled_checks(config, context=CheckContext(state_dir=Path(scratch)))
    rule_set = config.rule_set
    temporary = sum(1 for r in rule_set.rules if r.type is RuleType.TEMPORARY)
    print(
        f"OK: {len(config.files)} file(s), {len(rule_set.rules)} rules ({temporary} temporary, "
        f"{len(rule_set.rules) - temporary} permanent), {len(rule_set.conditions)} conditions, "
        f"{sum(1 for d in config.check_decls if d.enabled)} checks, "
        f"{sum(len(p.checks) for p in config.custom_plugins)} custom plugin checks, "
        f"{len(config.log_monitors)} log monitors"
    )
    for f in config.files:
        print(f"  file: {f.path} ({f.kind.value})")
    for cond in rule_set.conditions:
        print(f"  condition: {cond.type} (healthy reason {cond.reason})")
    slow = [r.name for r in rule_set.rules if r.literals is None]
    if slow:
        print(f"  note: these rules have no required literal and run on every line: {', '.join(slow)}")
    replaced: dict[str, list[str]] = {}
    for name, by in rule_set.replaced:
        replaced.setdefault(by, []).append(name)
    for by, names in replaced.items():
        print(
            f"  note: {by} replaces {len(names)} earlier rule(s) of the same type, condition and reason "
            f"(its rules have no name; name a rule to add it instead): {', '.join(names)}"
        )
    for rule, by in rule_set.covered:
        print(
            f"  note: {rule} is not loaded: the built-in rule {by} already gives its reason (no problem twice); "
            "load the file without that rule's pack (--pack) to use its rule instead"
        )
    for warning in [*config.warnings, *npd_warnings(rule_set)]:
        print(f"  warning: {warning}")
    from agent.app.commands.policy import report

    report(args)  # the recovery policy: summary, built-in rules left out
    return EXIT_OK


def npd_warnings(rule_set: RuleSet) -> list[ConfigProblem]:
    """Patterns of the user's files that node-problem-detector would match differently (docs/rule-packs.md)."""
    from agent.core.configdoc import read_pack
    from agent.core.regex import npd_differences

    builtin = builtin_plugins_dir().resolve()
    docs: dict[str, object] = {}
    found = []
    for rule in rule_set.rules:
        if Path(rule.file).resolve().is_relative_to(builtin):
            continue
        for message in npd_differences(rule.pattern):
            if rule.file not in docs:
                docs[rule.file] = read_pack(Path(rule.file))[0]
            doc = docs[rule.file]
            path = ("rules", rule.index, "pattern")
            line = doc.line(path) if doc is not None else None  # type: ignore[attr-defined]
            found.append(
                ConfigProblem(file=rule.file, field=f"rules[{rule.index}].pattern", message=message, line=line)
            )
    return found


def _read_lines(stream: BinaryIO) -> Iterator[str]:
    for raw in stream:
        yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


def _open_log(name: str) -> BinaryIO:
    """The log to replay; OSError with the reason (no standard input, a directory, permission, ...)."""
    if name == "-":
        stdin = sys.stdin.buffer if sys.stdin is not None else None
        if stdin is None or stdin.closed:
            raise OSError("there is no standard input to read (it is closed)")
        return stdin
    path = Path(name)
    if path.is_dir():
        raise OSError("is a directory; give a log file (or - for standard input)")
    try:
        return open(path, "rb")  # noqa: SIM115 - closed by the caller
    except FileNotFoundError:
        raise OSError("no such file") from None
    except OSError as exc:
        raise OSError(exc.strerror or str(exc)) from None


def simulate(args: argparse.Namespace) -> int:
    rule_set = load_rule_set(_rule_paths(args, args.config))
    try:
        stream = _open_log(args.logfile)
    except OSError as exc:
        print(f"cannot read {args.logfile}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        for finding in simulate_lines(rule_set=rule_set, lines=_read_lines(stream)):
            print(json.dumps(finding, sort_keys=False))
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        print(f"cannot read {args.logfile}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    finally:
        if stream is not getattr(sys.stdin, "buffer", None):
            stream.close()
    return EXIT_OK


def simulate_lines(*, rule_set: RuleSet, lines: Iterator[str]) -> Iterator[dict]:
    """Findings for input lines as the JSON-able objects ``simulate`` prints.

    Lines are treated as simultaneous (time 0), so count-in-window thresholds count every match.
    A line holding several messages (embedded newlines) is not possible here: one input line is
    one kernel message.
    """
    engine = RuleEngine(rule_set=rule_set)
    batch: list[str] = []
    numbers: list[int] = []

    def flush() -> Iterator[dict]:
        for f in engine.feed(batch, times=0.0, line_numbers=numbers):
            yield {
                "line": f.line,
                "rule": f.rule,
                "type": f.type.value,
                "condition": f.condition,
                "reason": f.reason,
                "severity": f.severity.value,
                "message": f.message,
                "fields": dict(f.fields),
            }
        batch.clear()
        numbers.clear()

    for number, line in enumerate(lines, start=1):
        batch.append(saved_log_line(line))
        numbers.append(number)
        if len(batch) >= SIMULATE_BATCH:
            yield from flush()
    if batch:
        yield from flush()


def run(args: argparse.Namespace) -> int:
    """Settings, then every configuration file and check (bad ones exit 2 here, before the cluster)."""
    settings = build_settings(args)
    from agent.core.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before any thread starts
    from agent.app.assembly import NodeLabels, agent_checks, check_context
    from agent.app.assembly import run as run_agent
    from agent.app.config import load_configuration
    from agent.app.reload import fingerprint
    from agent.core.process import run_process

    files = fingerprint(list(settings.rule_paths))  # before loading: a change after it is reloaded
    cancel = threading.Event()  # set when the checks stop: tools still running are killed
    labels = NodeLabels()
    context = check_context(settings, labels=labels, run_process=functools.partial(run_process, cancel=cancel))
    loaded = load_configuration(  # as every reload does
        list(settings.rule_paths), context=context, agent_checks=agent_checks(settings)
    )
    from agent.app.commands.policy import load, log_left_out

    policy = load(settings.recovery_policy)
    log_left_out(policy, settings.recovery_policy)  # a file that drops built-in rules says so at start
    return run_agent(
        settings=settings,
        loaded=loaded,
        labels=labels,
        context=context,
        files=files,
        cancel=cancel,
        policy=policy,
        stop=_stop_on_signals(),
    )


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def kubectl_plugin() -> int:
    """``kubectl node-health [status|pause|resume] [flags]`` (a ``kubectl-node_health`` executable on PATH)."""
    argv = sys.argv[1:]
    return main(argv if argv[:1] and argv[0] in ("status", "pause", "resume") else ["status", *argv])


def entry() -> None:
    """The ``node-health-agent`` executable and ``python -m agent``: :func:`main`, then exit at once.

    Once ``main`` returns, every component has stopped or passed the shared shutdown deadline; what
    is left are daemon threads (check workers, file watchers, a hung tool's reader). Interpreter
    finalization would still run alongside them and can wait on a lock one of them holds, so the
    process flushes its output and ends here: SIGTERM always ends the agent within its deadline.
    (Tests call :func:`main` in-process; only the executable takes this exit.)"""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    logging.shutdown()
    os._exit(code)


__all__ = ["Settings", "entry", "main"]
