"""The ``simulate`` command: replay a saved log through the rule packs, one JSON object per finding."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from agent.app.config import load_rule_set
from agent.app.exitcodes import EXIT_CONFIG, EXIT_OK
from agent.app.flags import RULE_FLAGS, add_flags
from agent.app.settings import rule_paths
from agent.detectors.catchall import CatchAll, Leveled
from agent.detectors.pipeline import saved_log_line
from agent.detectors.prefix import saved_level
from agent.detectors.rulepack import RuleSet
from agent.detectors.rules import RuleEngine

SIMULATE_BATCH = 4096


def add_parser(sub: argparse._SubParsersAction, *, parents: Sequence[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser(
        "simulate",
        parents=list(parents),
        help="replay a saved log through the rule packs",
        description="Print one JSON object per finding. Lines may carry kmsg, dmesg, syslog or journal prefixes.",
    )
    add_flags(sim, RULE_FLAGS)
    sim.add_argument("logfile", metavar="LOGFILE", help="log file to replay, - for stdin")


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
    rule_set = load_rule_set(rule_paths(args, args.config))
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

    Lines are treated as simultaneous (time 0), so count-in-window thresholds count every match, and the
    catch-all's window holds them all. A line holding several messages (embedded newlines) is not possible
    here: one input line is one kernel message. A line that kept its level (a kmsg header, ``dmesg -r``,
    ``dmesg -x``) at error level or worse that no rule matched gets the catch-all's verdict: a finding of
    rule ``kernel/catch-all`` where the agent would send a ``KernelError_*`` Event (``fields.records``: how
    many records it stands for), nothing for a benign or held-back one.
    """
    engine = RuleEngine(rule_set=rule_set)
    config = rule_set.catch_all
    catch_all = CatchAll(config=config) if config is not None and config.enabled else None
    batch: list[str] = []
    numbers: list[int] = []
    levels: list[int | None] = []

    def flush() -> Iterator[dict]:
        matched: list[int] | None = [] if catch_all is not None else None
        found = engine.feed(batch, times=0.0, line_numbers=numbers, matched=matched)
        if catch_all is not None and matched is not None:
            known = set(matched)
            unknown = [
                Leveled(message=batch[i], level=level, timestamp=0.0, line=numbers[i])
                for i, level in enumerate(levels)
                if level is not None and i not in known
            ]
            found.extend(catch_all.findings(unknown))
            found.sort(key=lambda f: f.line or 0)
        for f in found:
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
        levels.clear()

    for number, line in enumerate(lines, start=1):
        batch.append(saved_log_line(line))
        numbers.append(number)
        levels.append(saved_level(line))
        if len(batch) >= SIMULATE_BATCH:
            yield from flush()
    if batch:
        yield from flush()
