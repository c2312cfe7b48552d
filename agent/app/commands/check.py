"""The ``check`` and ``plugins`` commands: run the configured checks once; list what is loaded."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from agent.app.config import AgentConfig, build_scheduled_checks, load_agent_config
from agent.app.exitcodes import EXIT_OK
from agent.app.settings import check_args, rule_dirs
from agent.checks.model import CheckContext, ScheduledCheck
from agent.checks.scheduler import CheckScheduler
from agent.core.bus import Inbox
from agent.core.durations import format_duration
from agent.core.errors import ConfigError, ConfigProblem


def config_paths(args: argparse.Namespace) -> list[Path]:
    return [*rule_dirs(plugins_dirs=args.plugins_dir, packs=args.pack), *(Path(f) for f in args.config or ())]


def usable_state_dir(path: Path) -> Path:
    """``path`` when we may write there, else a fresh temporary directory (the CLI is often not root)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="node-health-agent-check-"))


def check(args: argparse.Namespace, *, stream: TextIO | None = None) -> int:
    out = stream or sys.stdout
    problems: list[ConfigProblem] = []

    def bad(flag: str, message: str) -> None:
        problems.append(ConfigProblem(file=f"--{flag}", field="", message=message))

    sys_root, dev_root, instance_type, concurrency = check_args(args, bad)
    if problems:
        raise ConfigError(problems)
    config = load_agent_config(config_paths(args))
    context = CheckContext(
        sys_root=sys_root,
        dev_root=dev_root,
        state_dir=usable_state_dir(Path(args.state_dir)),
        instance_type=lambda: instance_type,
    )
    known = [d.name for d in config.check_decls if d.enabled] + [
        c.name for p in config.custom_plugins for c in p.checks
    ]
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise ConfigError(
            [
                ConfigProblem(
                    file="NAME",
                    field="",
                    message=f"no check named {unknown[0]!r} (configured: {', '.join(known) or 'none'})",
                )
            ]
        )
    checks = build_scheduled_checks(config, context=context, names=args.names or None)
    scheduler = CheckScheduler(checks=checks, inbox=Inbox(), concurrency=concurrency)
    rows = [
        {
            "check": report.check,
            "status": result.status.value,
            "condition": result.condition,
            "reason": result.reason or None,  # an OK warning (NPD temporary rule) has none
            "message": result.message,
        }
        for report in scheduler.run_once()
        for result in report.results
    ]
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
    else:
        _table(rows, out)
    return EXIT_OK


def _table(rows: list[dict], out: TextIO) -> None:
    columns = ("check", "status", "condition", "reason", "message")
    cells = [[str(r[c] if r[c] is not None else "-") for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns[:-1])]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=False)) + "  MESSAGE", file=out)
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=False)) + "  " + row[-1], file=out)
    if not rows:
        print("(no checks configured)", file=out)


def plugins(args: argparse.Namespace, *, stream: TextIO | None = None) -> int:
    out = stream or sys.stdout
    config = load_agent_config(config_paths(args))
    for line in describe(config):
        print(line, file=out)
    return EXIT_OK


def describe(config: AgentConfig) -> list[str]:
    """One line per loaded thing: kind, name, origin."""
    lines = []
    by_file: dict[str, int] = {}
    for rule in config.rule_set.rules:
        by_file[rule.file] = by_file.get(rule.file, 0) + 1
    for f in config.files:
        kind = f.kind.value
        extra = ""
        if str(f.path) in by_file:
            extra = f" ({by_file[str(f.path)]} rules)"
        lines.append(f"file        {kind:<30} {f.path}{extra}")
    for monitor in config.log_monitors:
        source = monitor.settings.source
        where = getattr(source, "path", None) or f"journal identifier {getattr(source, 'source', '?')}"
        lines.append(
            f"log monitor {monitor.kind.value:<30} {where}: {len(monitor.rule_set.rules)} rules ({monitor.file.path})"
        )
    for decl in config.check_decls:
        state = "" if decl.enabled else " [disabled]"
        kind = "python" if decl.use else "entry-point"
        every = f" every {format_duration(decl.interval)}" if decl.interval else ""
        factory = decl.use or decl.entry_point
        lines.append(f"check       {kind:<30} {decl.name}{state}{every}: {factory} ({decl.origin})")
    for plugin in config.custom_plugins:
        for c in plugin.checks:
            lines.append(_scheduled_line(c))
    for warning in config.warnings:
        lines.append(f"warning     {warning}")
    return lines


def _scheduled_line(c: ScheduledCheck) -> str:
    return f"check       {c.kind:<30} {c.name} every {format_duration(c.interval)}: {c.origin}"
