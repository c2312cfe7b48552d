"""Everything the agent is configured to do, loaded and validated in one pass before anything runs.

Files come from the plugin directories and ``--config`` (see :mod:`agent.core.configfiles` for the
kinds). Rule packs compile into one :class:`RuleSet` for the kernel log; each filelog/journald
monitor compiles into a rule set of its own; ``checks:`` files merge into check declarations
(installed entry points first); custom-plugin monitors become executable checks. Every problem of
every file is collected and raised together as one ConfigError.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.checks.declared import CheckDecl, merge, read_checks
from agent.checks.loader import build_checks, entry_point_decls
from agent.checks.model import CheckContext, ScheduledCheck
from agent.core.configdoc import Problems
from agent.core.configfiles import ConfigFile, Kind, of_kind, read_config_files
from agent.core.errors import ConfigError, ConfigProblem
from agent.core.types import ConditionSpec, Provenance
from agent.detectors.catchall import CatchAllConfig, compile_catch_all
from agent.detectors.rulepack import RuleSet, compile_rule_packs

if TYPE_CHECKING:  # imported where a log monitor is configured (most nodes have none)
    from agent.checks.npd_plugin import CustomPluginMonitor
    from agent.sources.logmonitors import MonitorSettings


@dataclass(frozen=True, kw_only=True, slots=True)
class FileEntry:
    path: Path
    kind: Kind


@dataclass(frozen=True, kw_only=True)
class LogMonitor:
    """A node-problem-detector filelog or journald monitor: where to read, and its own rules."""

    file: ConfigFile
    rule_set: RuleSet
    settings: MonitorSettings

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
    custom_plugins: tuple[CustomPluginMonitor, ...]
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
    catch_all = _catch_all(files, problems)
    if rule_set is not None and catch_all is not None:
        rule_set = dataclasses.replace(rule_set, catch_all=catch_all)
    monitors: list[LogMonitor] = []
    log_files = of_kind(files, Kind.LOG_FILE, Kind.JOURNAL)
    if log_files:
        from agent.sources.logmonitors import monitor_settings

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
    declarations: list[tuple[Problems, tuple[str | int, ...], dict[str, Any]]] = []  # (file, field path, given)
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

        # Relative plugin paths mean what they mean to node-problem-detector: relative to the process's working
        # directory (``/`` in both images), where the plugins also run.
        cwd = Path.cwd()
        for f in custom:
            col = Problems(file=str(f.path), doc=f.doc)
            monitor = load_custom_plugin_monitor(doc=f.doc, col=col, path=f.path, cwd=cwd, run_process=run_process)
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
    owned_conditions(config, checks)  # one owner per condition type, or ConfigError naming both
    return checks


@dataclass(frozen=True, kw_only=True)
class Loaded:
    """One generation of configuration, as :func:`load_configuration` returns it at start and on reload."""

    config: AgentConfig
    checks: tuple[ScheduledCheck, ...]  # declared checks, then custom-plugin checks, in declaration order
    conditions: tuple[ConditionSpec, ...]  # every condition type written, stamped with its one owner
    agent_checks: tuple[ScheduledCheck, ...] = ()  # the agent's own checks (ScheduledMaintenance), kept by reloads

    @property
    def warnings(self) -> tuple[ConfigProblem, ...]:
        return self.config.warnings


def load_configuration(
    paths: Sequence[Path],
    *,
    context: CheckContext,
    entry_points: Callable[[], Sequence[Any]] | None = None,
    previous: Loaded | None = None,
    stop: threading.Event | None = None,
    agent_checks: Sequence[ScheduledCheck] | None = None,
) -> Loaded:
    """The one configuration loader, used at start and on every reload: every file read and validated,
    every check built, one owner per condition type. Raises ConfigError with every problem.

    Every check runs its tools through ``context``'s process runner (the one the agent cancels at
    shutdown), custom-plugin checks included. With ``previous`` (a reload), a declaration that did not
    change keeps its running check object and its memory (baselines, flap history); ``stop`` set
    abandons plugin loads still running (see :func:`agent.checks.loader.build_checks`). ``agent_checks``
    are checks the agent itself runs (built in assembly from flags, e.g. ``--scheduled-maintenance``):
    scheduled after the configured ones and owning their conditions like any check (a plugin declaring
    the same type is refused); None keeps ``previous``'s."""
    own = tuple(agent_checks if agent_checks is not None else previous.agent_checks if previous else ())
    config = load_agent_config(paths, entry_points=entry_points, run_process=context.run_process)
    kept: dict[str, ScheduledCheck] = {}
    if previous is not None:
        before = {d.name: d for d in previous.config.check_decls}
        running = {c.name: c for c in previous.checks}
        for decl in config.check_decls:
            if decl.name in running and before.get(decl.name) == decl:
                kept[decl.name] = running[decl.name]
    fresh = dataclasses.replace(config, check_decls=tuple(d for d in config.check_decls if d.name not in kept))
    built = {c.name: c for c in build_scheduled_checks(fresh, context=context, entry_points=entry_points, stop=stop)}
    # an active check declared ``enabled: false`` is dormant, not off: it is scheduled, and runs when a
    # validation request names it (a disabled passive check is not built)
    order = [d.name for d in config.check_decls if d.enabled or d.active]
    order += [c.name for plugin in config.custom_plugins for c in plugin.checks]
    checks = tuple(kept.get(name) or built[name] for name in order if name in kept or name in built)
    taken = {c.name for c in checks}
    clash = [c for c in own if c.name in taken]
    if clash:
        raise ConfigError(
            [
                ConfigProblem(file=c.origin, field="", message=f"check name {c.name!r} is the agent's own check")
                for c in clash
            ]
        )
    checks += own
    return Loaded(config=config, checks=checks, conditions=owned_conditions(config, checks), agent_checks=own)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Owner:
    provenance: Provenance
    name: str  # who, for messages: "the kernel log rule packs", "check gpu-ecc (file: checks[1])", ...
    specs: tuple[ConditionSpec, ...]


def _owners(config: AgentConfig, checks: Sequence[ScheduledCheck]) -> list[_Owner]:
    """Every source that declares conditions. The kmsg rule packs are one source (they merge into one
    rule set, later packs overriding earlier ones); so is one NPD custom-plugin file (its rules share
    its conditions, as in node-problem-detector)."""
    owners = [
        _Owner(provenance=Provenance.KERNEL_LOG, name="the kernel log rule packs", specs=config.rule_set.conditions)
    ]
    owners.extend(
        _Owner(provenance=Provenance.LOG_MONITOR, name=f"{m.kind.value} {m.file.path}", specs=m.rule_set.conditions)
        for m in config.log_monitors
    )
    owners.extend(
        _Owner(provenance=Provenance.CUSTOM_PLUGIN, name=f"custom plugin file {p.file}", specs=p.conditions)
        for p in config.custom_plugins
    )
    for c in checks:
        if c.kind == "executable":  # a custom plugin file's rule: the file owns its conditions (above)
            continue
        specs = tuple(getattr(c.check, "conditions", ()) or ())
        owners.append(_Owner(provenance=provenance_of(c), name=f"check {c.name} ({c.origin})", specs=specs))
    return owners


def provenance_of(check: ScheduledCheck) -> Provenance:
    """The kind of source a check is: built-in (``use:`` names a module shipped under plugins/), a
    third-party entry point, or an executable of a custom-plugin file."""
    if check.kind == "executable":
        return Provenance.CUSTOM_PLUGIN
    return Provenance.BUILTIN_CHECK if check.kind == "python" else Provenance.CHECK


def owned_conditions(config: AgentConfig, checks: Sequence[ScheduledCheck]) -> tuple[ConditionSpec, ...]:
    """Every condition type the agent writes, each stamped with the provenance of its one owner.

    A condition type has exactly one owner: two sources declaring it (a plugin declaring
    ``NeuronHealth`` beside the Neuron rule pack) could clear each other's problems or raise one the
    recovery policy acts on, so it is a configuration error naming both. Raises ConfigError."""
    first: dict[str, tuple[_Owner, ConditionSpec]] = {}
    problems: list[ConfigProblem] = []
    for owner in _owners(config, checks):
        for spec in owner.specs:
            earlier = first.get(spec.type)
            if earlier is None:
                first[spec.type] = (owner, spec)
            elif earlier[0] is not owner:
                problems.append(_clash(spec, owner=owner, earlier=earlier))
    if problems:
        raise ConfigError(problems)
    return tuple(dataclasses.replace(spec, provenance=owner.provenance) for owner, spec in first.values())


def _clash(spec: ConditionSpec, *, owner: _Owner, earlier: tuple[_Owner, ConditionSpec]) -> ConfigProblem:
    file, _, line = spec.declared_in.rpartition(":") if spec.declared_in else ("", "", "")
    if not line.isdigit():
        file, line = spec.declared_in, ""
    where = f" ({earlier[1].declared_in})" if earlier[1].declared_in else ""
    return ConfigProblem(
        file=file or owner.name,
        field="conditions.type" if file else "",
        message=f"condition type {spec.type!r} is declared by {owner.name} and by {earlier[0].name}{where}: "
        "a condition has one owner (two could clear each other's problems); rename one of them",
        line=int(line) if line else None,
    )


def load_rule_set(paths: Sequence[Path]) -> RuleSet:
    """Load, validate and compile the rule packs under ``paths`` in order (other kinds of file are left
    to their own loaders). Raises ConfigError listing every problem."""
    files, problems = read_config_files(paths)
    if not paths:
        problems.append(ConfigProblem(file="(none)", field="", message="no rule pack files found"))
    packs = [(f.path, f.doc) for f in of_kind(files, Kind.RULE_PACK)]
    catch_all = _catch_all(files, problems)
    rule_set = compile_rule_packs(packs, problems=problems)
    return rule_set if catch_all is None else dataclasses.replace(rule_set, catch_all=catch_all)


def _catch_all(files: Sequence[ConfigFile], problems: list[ConfigProblem]) -> CatchAllConfig | None:
    """The catch-all of the ``catchAll:`` files (None where there is none; their problems into ``problems``)."""
    found = of_kind(files, Kind.CATCH_ALL)
    if not found:
        return None
    try:
        return compile_catch_all([(f.path, f.doc) for f in found])
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None
