"""Command line: ``run``, ``kmsg-relay``, ``simulate``, ``check``, ``plugins``, ``validate-config``,
``status``, ``pause``, ``resume`` and ``clear`` (each command lives in :mod:`agent.app.commands`; the flags of
``run`` in the table of :mod:`agent.app.flags`).

Exit codes: 0 success, 2 bad configuration or unusable input (before anything touches the
cluster), 1 an unexpected failure. ``main(argv)`` is callable from tests.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from agent import __version__
from agent.app.commands import run as run_command
from agent.app.commands import simulate as simulate_command
from agent.app.commands import validate as validate_command
from agent.app.commands.simulate import simulate_lines
from agent.app.exitcodes import EXIT_CONFIG, EXIT_OK
from agent.app.flags import CHECK_FLAGS, LOG_LEVEL, RULE_FLAGS, add_flag, add_flags, flag
from agent.app.flagvalues import DEFAULT_STATE_DIR
from agent.app.settings import Settings
from agent.core.errors import ConfigError
from agent.sources import relay_server

log = logging.getLogger("agent")


def _add_relay_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``kmsg-relay`` for ``--help``: the executable runs it through agent.app.entry without this module."""
    relay = sub.add_parser("kmsg-relay", parents=[common], help=relay_server.HELP, description=relay_server.DESCRIPTION)
    relay_server.add_arguments(relay)


def _add_check_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    chk = sub.add_parser(
        "check",
        parents=[common],
        help="run the configured checks once and print their verdicts",
        description="Run the checks (built-in, entry points, NPD custom plugins) once. Exit 0 when they ran, "
        "whatever they found; 2 on a configuration error.",
    )
    add_flags(chk, (*RULE_FLAGS, *CHECK_FLAGS))
    chk.add_argument(
        "--json", action="store_true", help="print a JSON list of {check, status, condition, reason, message}"
    )
    add_flag(
        chk,
        flag("state-dir"),
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
    add_flags(plg, RULE_FLAGS)


def build_parser() -> argparse.ArgumentParser:
    # --log-level is accepted before and after the command: the subcommands' copy only overrides
    # the main one when given (SUPPRESS keeps it out of the namespace otherwise).
    common = argparse.ArgumentParser(add_help=False)
    add_flag(common, LOG_LEVEL, default=argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="node-health-agent",
        description="Per-node health agent for Kubernetes nodes with accelerators (AWS Neuron, NVIDIA GPUs).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_flag(parser, LOG_LEVEL)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_command.add_parser(sub, parents=[common])
    _add_relay_parser(sub, common)
    simulate_command.add_parser(sub, parents=[common])
    _add_check_parsers(sub, common)
    from agent.app.commands.clear import add_parser as add_clear_parser
    from agent.app.commands.pause import add_parsers as add_pause_parsers
    from agent.app.commands.status import add_parser as add_status_parser

    add_status_parser(sub, parents=[common])
    add_pause_parsers(sub, parents=[common])
    add_clear_parser(sub, parents=[common])
    validate_command.add_parser(sub, parents=[common])
    return parser


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
            return simulate_command.simulate(args)
        if args.command == "validate-config":
            return validate_command.validate(args)
        if args.command in ("check", "plugins"):
            from agent.app.commands import check as checkcli

            return checkcli.check(args) if args.command == "check" else checkcli.plugins(args)
        if args.command == "status":
            from agent.app.commands.status import status

            return status(args)
        if args.command in ("pause", "resume"):
            from agent.app.commands.pause import pause

            return pause(args)
        if args.command == "clear":
            from agent.app.commands.clear import clear

            return clear(args)
        if args.command == "kmsg-relay":
            return _kmsg_relay(args)
        return run_command.run(args)
    except ConfigError as exc:
        _print_config_error(exc, sys.stderr)
        return EXIT_CONFIG


def _kmsg_relay(args: argparse.Namespace) -> int:
    """``main(["kmsg-relay", ...])`` from tests; the executable reaches the relay through agent.app.entry."""
    return relay_server.run(args)


def kubectl_plugin() -> int:
    """``kubectl node-health [status|pause|resume|clear] [flags]`` (a ``kubectl-node_health`` executable on PATH)."""
    argv = sys.argv[1:]
    return main(argv if argv[:1] and argv[0] in ("status", "pause", "resume", "clear") else ["status", *argv])


def entry() -> None:
    """Every command but ``kmsg-relay`` of the ``node-health-agent`` executable and ``python -m agent`` (which
    start in :func:`agent.app.entry.entry`): :func:`main`, then exit at once.

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


__all__ = ["Settings", "build_parser", "entry", "main", "simulate_lines"]
