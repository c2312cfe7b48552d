"""The ``run`` command: its flags come from the table in :mod:`agent.app.flags`; settings, then every
configuration file and check (bad ones exit 2 here, before the cluster), then the agent."""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import threading
from collections.abc import Sequence

from agent.app.flags import RUN_FLAGS, add_flags
from agent.app.settings import build_settings

log = logging.getLogger("agent")


def add_parser(sub: argparse._SubParsersAction, *, parents: Sequence[argparse.ArgumentParser]) -> None:
    run_parser = sub.add_parser(
        "run",
        parents=list(parents),
        help="run the agent",
        description="Run the agent (every flag has an NHA_* env var).",
    )
    add_flags(run_parser, RUN_FLAGS)


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
        stop=stop_on_signals(),
    )


def stop_on_signals() -> threading.Event:
    """An event set on SIGTERM or SIGINT."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
