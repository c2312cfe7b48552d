"""Everything the agent is configured to do, loaded and validated in one pass before anything runs.

Files come from the plugin directories and ``--config`` (see :mod:`agent.configfiles` for the
kinds). Rule packs compile into one :class:`RuleSet` for the kernel log; each filelog/journald
monitor compiles into a rule set of its own; ``checks:`` files merge into check declarations
(installed entry points first); custom-plugin monitors become executable checks. Every problem of
every file is collected and raised together as one ConfigError.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.checks.declared import CheckDecl, merge, read_checks
from agent.checks.loader import build_checks, entry_point_decls
from agent.checks.model import CheckContext, ScheduledCheck
from agent.configfiles import ConfigFile, Kind, of_kind, read_config_files
from agent.detectors.packfile import Problems
from agent.detectors.rulepack import RuleSet, compile_rule_packs
from agent.errors import ConfigError, ConfigProblem
from agent.types import ConditionSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class FileEntry:
    path: Path
    kind: Kind


@dataclass(frozen=True, kw_only=True)
class LogMonitor:
    """A node-problem-detector filelog or journald monitor: where to read, and its own rules."""

    file: ConfigFile
    rule_set: RuleSet
    settings: Any  # agent.logmonitors.MonitorSettings

    @property
    def kind(self) -> Kind:
        return self.file.kind

    @property
    def name(self) -> str:
        return self.settings.name


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    rule_set: RuleSet  # kernel log (kmsg) rules
    log_monitors: tuple[LogMonitor, ...]
    check_decls: tuple[CheckDecl, ...]
    custom_plugins: tuple[Any, ...]  # agent.checks.npd_plugin.CustomPluginMonitor
    files: tuple[FileEntry, ...]  # every file and its kind (not its parsed content: that is let go)
    warnings: tuple[ConfigProblem, ...] = ()

    @property
    def rule_conditions(self) -> tuple[ConditionSpec, ...]:
        """Conditions of the rule packs, log monitors and custom plugins (checks bring their own)."""
        specs: dict[str, ConditionSpec] = {}
        for spec in self.rule_set.conditions:
            specs.setdefault(spec.type, spec)
        for monitor in self.log_monitors:
            for spec in monitor.rule_set.conditions:
                specs.setdefault(spec.type, spec)
        for plugin in self.custom_plugins:
            for spec in plugin.conditions:
                specs.setdefault(spec.type, spec)
        return tuple(specs.values())


def load_agent_config(
    paths: Sequence[Path],
    *,
    entry_points: Callable[[], Sequence[Any]] | None = None,
    run_process: Callable[..., Any] | None = None,
) -> AgentConfig:
    """Read, classify and validate every file under ``paths``. Raises ConfigError with every problem.

    ``run_process`` is the process runner executable checks use (the agent binds its stop signal in)."""
    files, problems = read_config_files(paths)
    if not paths:
        problems.append(ConfigProblem(file="(none)", field="", message="no configuration files found"))
    warnings: list[ConfigProblem] = []
    rule_set: RuleSet | None = None
    try:
        rule_set = compile_rule_packs([(f.path, f.doc) for f in of_kind(files, Kind.RULE_PACK)])
    except ConfigError as exc:
        problems.extend(exc.problems)
    monitors: list[LogMonitor] = []
    log_files = of_kind(files, Kind.LOG_FILE, Kind.JOURNAL)
    if log_files:
        from agent.logmonitors import monitor_settings

        taken: set[str] = set()
        for f in log_files:
            col = Problems(file=str(f.path), doc=f.doc)
            settings = monitor_settings(f, col, taken=taken)
            problems.extend(col.problems)
            try:
                monitor_rules = compile_rule_packs([(f.path, f.doc)])
            except ConfigError as exc:
                problems.extend(exc.problems)
                continue
            if settings is not None:
                monitors.append(LogMonitor(file=f, rule_set=monitor_rules, settings=settings))
    declarations = []
    cols = []
    for f in of_kind(files, Kind.CHECKS):
        col = Problems(file=str(f.path), doc=f.doc)
        cols.append(col)
        declarations.extend((col, path, given) for path, given in read_checks(col))
    decls = merge(declarations, base=entry_point_decls(entry_points=entry_points))
    for col in cols:  # read_checks and merge both report into a file's problems
        problems.extend(col.problems)
    plugins = []
    custom = of_kind(files, Kind.CUSTOM_PLUGIN)
    if custom:
        from agent.checks.npd_plugin import load_custom_plugin_monitor

        for f in custom:
            col = Problems(file=str(f.path), doc=f.doc)
            monitor = load_custom_plugin_monitor(doc=f.doc, col=col, path=f.path, run_process=run_process)
            problems.extend(col.problems)
            if monitor is not None:
                plugins.append(monitor)
                warnings.extend(getattr(monitor, "warnings", ()))
    if problems or rule_set is None:
        raise ConfigError(problems)
    return AgentConfig(
        rule_set=rule_set,
        log_monitors=tuple(monitors),
        check_decls=tuple(decls),
        custom_plugins=tuple(plugins),
        files=tuple(FileEntry(path=f.path, kind=f.kind) for f in files),
        warnings=tuple(warnings),
    )


def build_scheduled_checks(
    config: AgentConfig,
    *,
    context: CheckContext,
    entry_points: Callable[[], Sequence[Any]] | None = None,
    names: Sequence[str] | None = None,
    stop: threading.Event | None = None,
) -> list[ScheduledCheck]:
    """Every check to schedule (declared ones, then custom plugins); ConfigError for bad options.

    ``stop`` set abandons plugin loads still running (see :func:`agent.checks.loader.build_checks`)."""
    decls = [d for d in config.check_decls if names is None or d.name in names]
    checks, problems = build_checks(decls, context=context, entry_points=entry_points, stop=stop)
    if problems:
        raise ConfigError(problems)
    for plugin in config.custom_plugins:
        checks.extend(c for c in plugin.checks if names is None or c.name in names)
    seen: dict[str, str] = {}
    dupes = []
    for c in checks:
        if c.name in seen:
            dupes.append(
                ConfigProblem(file=c.origin, field="", message=f"check name {c.name!r} is also used by {seen[c.name]}")
            )
        seen.setdefault(c.name, c.origin)
    if dupes:
        raise ConfigError(dupes)
    return checks


def check_conditions(checks: Sequence[ScheduledCheck]) -> tuple[ConditionSpec, ...]:
    specs: dict[str, ConditionSpec] = {}
    for c in checks:
        for spec in getattr(c.check, "conditions", ()) or ():
            specs.setdefault(spec.type, spec)
    return tuple(specs.values())
