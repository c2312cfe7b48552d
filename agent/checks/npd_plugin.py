"""node-problem-detector ``custom-plugin-monitor`` files (``plugin: "custom"``) as executable checks.

A file in NPD's schema loads unchanged: ``pluginConfig`` (``invoke_interval``, ``timeout``,
``max_output_length``, ``concurrency``, ``enable_message_change_based_condition_update``,
``skip_initial_status``), ``source``, ``metricsReporting``, ``conditions`` (healthy defaults) and
``rules`` (``type``, ``condition``, ``reason``, ``path``, ``args``, ``timeout``,
``invoke_interval``). It is validated as NPD does (a rule timeout above the global one, a permanent
rule without a declared condition), plus what NPD lets through silently (unknown keys, wrong types,
zero intervals); every problem names the file, the field and the line.

Rules that run the same command (program, arguments, timeout and interval) share one execution per
interval: the AKS GPU files call each script from a temporary and a permanent rule, and the
script runs once, feeding both verdicts. See ``docs/checks-exec.md`` for naming and semantics.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from agent.checks.declared import MIN_INTERVAL, MIN_TIMEOUT
from agent.checks.executable import DEFAULT_MAX_OUTPUT_LENGTH, MAX_OUTPUT_LENGTH, ExecutableCheck, Verdict
from agent.checks.model import RunProcess, ScheduledCheck
from agent.core.configdoc import (
    LOG_MONITOR_RULE_KEYS,
    LOG_MONITOR_TOP_KEYS,
    Document,
    Problems,
    windows_path_problem,
)
from agent.core.durations import parse_duration
from agent.core.errors import ConfigProblem
from agent.core.process import DEFAULT_PATH
from agent.core.types import ConditionSpec, RuleType, Severity, reserved_condition

PLUGIN = "custom"
KIND = "custom-plugin-monitor"
DEFAULT_INVOKE_INTERVAL = 30.0
DEFAULT_TIMEOUT = 5.0
DEFAULT_CONCURRENCY = 3

TOP_KEYS = frozenset({"plugin", "pluginConfig", "source", "metricsReporting", "conditions", "rules"})
CONFIG_KEYS = frozenset(
    {
        "invoke_interval",
        "timeout",
        "max_output_length",
        "concurrency",
        "enable_message_change_based_condition_update",
        "skip_initial_status",
    }
)
RULE_KEYS = frozenset({"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"})
CONDITION_KEYS = frozenset({"type", "reason", "message"})
_LOG_MONITOR_KEYS = LOG_MONITOR_TOP_KEYS | LOG_MONITOR_RULE_KEYS

RUNNER_GRACE = 1.0  # seconds the scheduler waits beyond a plugin's timeout


@dataclass(frozen=True, kw_only=True, slots=True)
class CustomPluginMonitor:
    """One loaded custom-plugin-monitor file: its conditions, its checks and its settings.

    ``warnings`` are things that do not stop loading but that ``validate-config`` should show
    (a plugin that does not exist yet, a ``condition`` on a temporary rule that is ignored).
    """

    file: str
    source: str
    conditions: tuple[ConditionSpec, ...]
    checks: tuple[ScheduledCheck, ...]
    invoke_interval: float
    timeout: float
    max_output_length: int
    concurrency: int
    enable_message_change_based_condition_update: bool
    skip_initial_status: bool
    metrics_reporting: bool
    warnings: tuple[ConfigProblem, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class _Settings:
    invoke_interval: float | None  # None: invalid (already reported)
    timeout: float | None
    timeout_text: str  # as written (or the default), for messages
    max_output_length: int
    concurrency: int
    message_change: bool
    skip_initial_status: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class _Rule:
    index: int
    type: RuleType
    condition: str | None
    reason: str
    argv: tuple[str, ...]
    timeout: float
    interval: float


def is_custom_plugin_monitor(doc: Document) -> bool:
    """Whether a parsed file is a custom-plugin-monitor config (``plugin: "custom"``)."""
    return isinstance(doc.data, dict) and doc.data.get("plugin") == PLUGIN


def load_custom_plugin_monitor(
    *,
    doc: Document,
    col: Problems,
    path: Path,
    cwd: Path = Path("/"),
    tool_path: str = DEFAULT_PATH,
    run_process: RunProcess | None = None,
) -> CustomPluginMonitor | None:
    """Validate a custom-plugin-monitor document and build its checks; None if ``col`` got a problem.

    ``path`` is the file (its directory is the fallback for relative plugin paths, its name the
    checks' concurrency group); ``cwd`` is where relative plugin paths are resolved first and where
    plugins run (NPD's working directory, ``/`` in its image); ``tool_path`` the plugins' ``PATH``.
    """
    before = len(col)
    warn = Problems(file=col.file, doc=doc)
    data = doc.data
    if not isinstance(data, dict):
        col.add((), f"expected a mapping ({KIND} schema: plugin, pluginConfig, source, conditions, rules)")
        return None
    _unknown_keys(data, known=TOP_KEYS, path=(), col=col, what=f"a {KIND} file")
    if data.get("plugin") != PLUGIN:
        col.add(("plugin",), f"must be {PLUGIN!r} for a {KIND} file, got {data.get('plugin')!r}")
    source = data.get("source", path.stem)
    if not isinstance(source, str) or not source.strip():
        col.add(("source",), f"must be a non-empty string, got {source!r}")
        source = path.stem
    metrics_reporting = _flag(data, "metricsReporting", default=True, path=(), col=col)
    settings = _plugin_config(data.get("pluginConfig", {}), col=col)
    conditions, declared = _conditions(data.get("conditions", []), col=col, source=source)
    rules = _rules(
        data.get("rules"),
        col=col,
        warn=warn,
        settings=settings,
        declared=declared,
        config_dir=path.parent,
        cwd=cwd,
    )
    if len(col) > before or settings.invoke_interval is None or settings.timeout is None:
        return None
    by_type = {c.type: c for c in conditions}
    checks = _build_checks(
        rules,
        file=col.file,
        source=source,
        by_type=by_type,
        settings=settings,
        group=str(path),
        cwd=cwd,
        tool_path=tool_path,
        run_process=run_process,
    )
    return CustomPluginMonitor(
        file=col.file,
        source=source,
        conditions=conditions,
        checks=checks,
        invoke_interval=settings.invoke_interval,
        timeout=settings.timeout,
        max_output_length=settings.max_output_length,
        concurrency=settings.concurrency,
        enable_message_change_based_condition_update=settings.message_change,
        skip_initial_status=settings.skip_initial_status,
        metrics_reporting=metrics_reporting,
        warnings=tuple(warn.problems),
    )


# --- validation ---------------------------------------------------------------------------------


def _unknown_keys(value: Mapping[str, Any], *, known: frozenset[str], path: tuple, col: Problems, what: str) -> None:
    for key in value:
        if key in known:
            continue
        hint = ""
        if key in _LOG_MONITOR_KEYS:
            hint = f"; {key!r} belongs to a system-log-monitor file, this one runs plugins (plugin {PLUGIN!r})"
        col.add((*path, key), f"unknown key {key!r} in {what} (known: {', '.join(sorted(known))}){hint}")


def _flag(data: Mapping[str, Any], key: str, *, default: bool, path: tuple, col: Problems) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        col.add((*path, key), f"must be true or false, got {value!r}")
        return default
    return value


def _count(
    data: Mapping[str, Any], key: str, *, default: int, path: tuple, col: Problems, maximum: int | None = None
) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        col.add((*path, key), f"must be a whole number of at least 1, got {value!r}")
        return default
    if maximum is not None and value > maximum:
        col.add((*path, key), f"must be at most {maximum}, got {value!r}")
        return default
    return value


def _duration(data: Mapping[str, Any], key: str, *, default: float | None, path: tuple, col: Problems) -> float | None:
    """A Go duration string ("30s", "1m30s", "500ms") of at least the floor of ``key`` (MIN_INTERVAL for
    ``invoke_interval``, MIN_TIMEOUT for ``timeout``: agent.checks.declared); None (reported) if invalid."""
    if key not in data:
        return default
    value = data[key]
    if not isinstance(value, str):
        col.add((*path, key), f"must be a duration string like '30s' or '1m30s', got {value!r}")
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        col.add((*path, key), str(exc))
        return None
    if seconds <= 0:
        col.add((*path, key), f"must be greater than 0, got {value!r}")
        return None
    floor = MIN_INTERVAL if key == "invoke_interval" else MIN_TIMEOUT
    if seconds < floor:
        col.add((*path, key), f"must be at least {floor:g}s, got {value!r}")
        return None
    return seconds


def _plugin_config(raw: Any, *, col: Problems) -> _Settings:
    path = ("pluginConfig",)
    if not isinstance(raw, dict):
        col.add(path, f"must be a mapping ({', '.join(sorted(CONFIG_KEYS))})")
        raw = {}
    _unknown_keys(raw, known=CONFIG_KEYS, path=path, col=col, what=f"a {KIND} pluginConfig")
    return _Settings(
        invoke_interval=_duration(raw, "invoke_interval", default=DEFAULT_INVOKE_INTERVAL, path=path, col=col),
        timeout=_duration(raw, "timeout", default=DEFAULT_TIMEOUT, path=path, col=col),
        timeout_text=str(raw.get("timeout", f"{DEFAULT_TIMEOUT:g}s (default)")),
        max_output_length=_count(
            raw, "max_output_length", default=DEFAULT_MAX_OUTPUT_LENGTH, maximum=MAX_OUTPUT_LENGTH, path=path, col=col
        ),
        concurrency=_count(raw, "concurrency", default=DEFAULT_CONCURRENCY, path=path, col=col),
        message_change=_flag(raw, "enable_message_change_based_condition_update", default=False, path=path, col=col),
        skip_initial_status=_flag(raw, "skip_initial_status", default=False, path=path, col=col),
    )


def _non_empty(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip())


def _conditions(raw: Any, *, col: Problems, source: str) -> tuple[tuple[ConditionSpec, ...], set[str]]:
    """The valid conditions, and every declared type (valid or not, so rules are not blamed twice)."""
    if raw is None:
        return (), set()
    if not isinstance(raw, list):
        col.add(("conditions",), "must be a list of {type, reason, message}")
        return (), set()
    specs: list[ConditionSpec] = []
    declared: dict[str, tuple] = {}
    for i, cond in enumerate(raw):
        path = ("conditions", i)
        if not isinstance(cond, dict):
            col.add(path, "must be a mapping with type, reason and message")
            continue
        _unknown_keys(cond, known=CONDITION_KEYS, path=path, col=col, what=f"a {KIND} condition")
        ok = True
        type_ = cond.get("type")
        for key in ("type", "reason"):
            if not _non_empty(cond.get(key)):
                col.add((*path, key), f"required: a non-empty string, got {cond.get(key)!r}")
                ok = False
        if _non_empty(type_):
            if (why := reserved_condition(type_)) is not None:
                col.add((*path, "type"), why)
                ok = False
            elif type_ in declared:
                col.add((*path, "type"), f"duplicate condition type {type_!r} (also {col.where(declared[type_])})")
                ok = False
            else:
                declared[type_] = (*path, "type")
        message = cond.get("message", "")
        if not isinstance(message, str):
            col.add((*path, "message"), f"must be a string, got {message!r}")
            ok = False
        if ok:
            line = col.doc.line((*path, "type"))
            specs.append(
                ConditionSpec(
                    type=str(type_),
                    reason=cond["reason"],
                    message=message,
                    source=source,
                    declared_in=f"{col.file}:{line}" if line is not None else col.file,
                )
            )
    return tuple(specs), set(declared)


def _rules(
    raw: Any,
    *,
    col: Problems,
    warn: Problems,
    settings: _Settings,
    declared: set[str],
    config_dir: Path,
    cwd: Path,
) -> list[_Rule]:
    if raw is None:
        col.add(("rules",), "required: a list of rules (type, reason, path)")
        return []
    if not isinstance(raw, list):
        col.add(("rules",), "must be a list of rules (type, reason, path)")
        return []
    if not raw:
        warn.add(("rules",), "no rules: this file runs nothing")
    rules: list[_Rule] = []
    owner: dict[str, tuple] = {}  # condition type -> the permanent rule that sets it
    for i, rule in enumerate(raw):
        path = ("rules", i)
        if not isinstance(rule, dict):
            col.add(path, "must be a mapping with type, reason and path")
            continue
        checked = _rule(rule, index=i, col=col, warn=warn, settings=settings, config_dir=config_dir, cwd=cwd)
        condition = rule.get("condition")
        if rule.get("type") == RuleType.PERMANENT and _non_empty(condition):
            if condition not in declared:
                known = ", ".join(sorted(declared)) or "none"
                col.add(
                    (*path, "condition"),
                    f"condition {condition!r} is not declared in 'conditions' (declared: {known}); "
                    "a permanent rule needs the condition's healthy default",
                )
                checked = None
            elif condition in owner:
                col.add(
                    (*path, "condition"),
                    f"condition {condition!r} is already set by {col.where(owner[condition])}; "
                    "one permanent rule per condition (their verdicts would overwrite each other)",
                )
                checked = None
            else:
                owner[condition] = (*path, "condition")
        if checked is not None:
            rules.append(checked)
    return rules


def _rule(
    rule: Mapping[str, Any],
    *,
    index: int,
    col: Problems,
    warn: Problems,
    settings: _Settings,
    config_dir: Path,
    cwd: Path,
) -> _Rule | None:
    path = ("rules", index)
    before = len(col)
    _unknown_keys(rule, known=RULE_KEYS, path=path, col=col, what=f"a {KIND} rule")
    try:
        rtype = RuleType(str(rule.get("type")))
    except ValueError:
        col.add((*path, "type"), f"must be 'temporary' or 'permanent', got {rule.get('type')!r}")
        rtype = None
    condition = rule.get("condition")
    if rtype is RuleType.PERMANENT and not _non_empty(condition):
        col.add((*path, "condition"), "required for a permanent rule: the condition type it sets")
    if rtype is RuleType.TEMPORARY and condition not in (None, ""):
        warn.add((*path, "condition"), "ignored: a temporary rule makes Events; only permanent rules set a condition")
        condition = None
    reason = rule.get("reason")
    if not _non_empty(reason):
        col.add((*path, "reason"), f"required: the CamelCase reason of a problem, got {reason!r}")
    program = rule.get("path")
    if not _non_empty(program):
        col.add((*path, "path"), f"required: the plugin to run, got {program!r}")
    elif (windows := windows_path_problem(program)) is not None:
        col.add((*path, "path"), windows)
    elif (helper := npd_helper_problem(program, rule.get("args"))) is not None:
        col.add((*path, "path"), helper)
    args = rule.get("args", [])
    if args is None:
        args = []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        col.add((*path, "args"), f"must be a list of strings, got {args!r}")
        args = []
    interval = _duration(rule, "invoke_interval", default=settings.invoke_interval, path=path, col=col)
    timeout = _duration(rule, "timeout", default=settings.timeout, path=path, col=col)
    if "timeout" in rule and timeout is not None and settings.timeout is not None and timeout > settings.timeout:
        col.add(
            (*path, "timeout"),
            f"{rule['timeout']!r} is longer than the global pluginConfig.timeout {settings.timeout_text!r}; "
            "node-problem-detector rejects this too",
        )
    if len(col) > before or rtype is None or interval is None or timeout is None:
        return None
    if not isinstance(program, str) or not isinstance(reason, str):  # reported above
        return None
    executable = resolve_plugin_path(program, cwd=cwd, config_dir=config_dir)
    for message in plugin_path_warnings(executable, raw=program):
        warn.add((*path, "path"), message)
    return _Rule(
        index=index,
        type=rtype,
        condition=condition if rtype is RuleType.PERMANENT else None,
        reason=reason,
        argv=(str(executable), *args),
        timeout=timeout,
        interval=interval,
    )


# --- NPD's own helper binaries ---------------------------------------------------------------------

MIGRATING = "docs/migrating-from-npd.md"
_HEALTH_CHECKER_INSTEAD = {
    "kubelet": "the Node's Ready condition (the node lifecycle controller sets it Unknown when the kubelet stops "
    "posting status) and an alert on it",
    "cri": "the Node's Ready condition (the kubelet sets it False, 'container runtime is down' or 'PLEG is not "
    "healthy', when the runtime stops answering)",
    "docker": "the Node's Ready condition (the kubelet sets it False when the runtime stops answering)",
    "kube-proxy": "kube-proxy's own /livez (port 10256) scraped by your monitoring",
}


def npd_helper_problem(program: object, args: object) -> str | None:
    """Why a rule that runs NPD's health-checker or log-counter binary is refused, and what to use instead.

    Those binaries ship only in NPD's image, and the health-checker also restarts the kubelet or runtime
    through the host's systemd, which an unprivileged pod cannot do: a rule calling them would be UNKNOWN
    ('no such file') forever."""
    if not isinstance(program, str):
        return None
    name = Path(program).name
    given = [a for a in args if isinstance(a, str)] if isinstance(args, list) else []
    if name == "log-counter":
        return (
            "node-problem-detector's log-counter is not shipped with node-health-agent; count in a rule instead: "
            "a journald monitor (or, for kernel lines, a rule pack) with a permanent rule carrying "
            "threshold {count: <--count>, window: <--lookback>} and its condition's clearAfter: <--lookback> "
            f"({MIGRATING}#log-counter has each NPD counter file translated)"
        )
    if name == "health-checker":
        component = next((a.split("=", 1)[1] for a in given if a.startswith("--component=")), "kubelet")
        instead = _HEALTH_CHECKER_INSTEAD.get(component, "the Node's Ready condition")
        return (
            f"node-problem-detector's health-checker (--component={component}) is not shipped with node-health-agent "
            "and its repair (restarting the service through the host's systemd) cannot run from the unprivileged "
            f"agent; use {instead} ({MIGRATING}#health-checker)"
        )
    return None


# --- plugin paths -------------------------------------------------------------------------------


def resolve_plugin_path(raw: str, *, cwd: Path, config_dir: Path) -> Path:
    """Where a rule's ``path`` points.

    An absolute path is kept. A relative one is resolved against ``cwd``, the agent's working directory
    (as NPD resolves it against its own: ``/`` in its image, so ``./config/plugin/x.sh`` is
    ``/config/plugin/x.sh``; in a checkout of NPD, the checkout); when that does not exist but the same
    path beside the config file does, that one is taken. Symlinks are never resolved (a mounted
    ConfigMap swaps them on update).
    """
    given = Path(raw)
    if given.is_absolute():
        return given
    in_cwd = Path(cwd, given).absolute()  # absolute: the runner would look a relative one up elsewhere
    beside = Path(config_dir, given).absolute()
    if not in_cwd.exists() and beside.exists():
        return beside
    return in_cwd


def plugin_path_warnings(executable: Path, *, raw: str) -> list[str]:
    """Why ``executable`` would not run right now (each run would be UNKNOWN), for validate-config."""
    where = f"{raw!r} -> {executable}" if raw != str(executable) else repr(raw)
    if not executable.exists():
        return [
            f"{where} does not exist (yet): every run reports UNKNOWN 'no such file' until it does "
            "(node-problem-detector would refuse to start)"
        ]
    if executable.is_dir():
        return [f"{where} is a directory, not a program"]
    if not executable.is_file():  # a FIFO would block the open below (and the agent's start) forever
        return [f"{where} is not a regular file, not a program"]
    if not os.access(executable, os.X_OK):
        return [f"{where} is not executable (chmod +x, or a ConfigMap defaultMode of 0755)"]
    try:
        with executable.open("rb") as f:
            head = f.read(4)
    except OSError as exc:
        return [f"{where} cannot be read: {exc.strerror or exc}"]
    if not head.startswith(b"#!") and head != b"\x7fELF":
        return [f"{where} has no '#!' line: the kernel cannot start it (add e.g. '#!/bin/bash')"]
    return []


# --- checks -------------------------------------------------------------------------------------

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_NAME = re.compile(r"[^a-z0-9]+")


def slug(text: str) -> str:
    """``GpuCountBad`` -> ``gpu-count-bad``; ``check_ntp.sh`` -> ``check-ntp-sh``."""
    return _NOT_NAME.sub("-", _CAMEL.sub("-", text).lower()).strip("-")


def _check_name(rules: list[_Rule], *, source: str, taken: set[str]) -> str:
    """``<source>/<reason>`` (the first permanent rule's reason, else the first rule's), made unique."""
    first = next((r for r in rules if r.type is RuleType.PERMANENT), rules[0])
    program = Path(rules[0].argv[0])
    candidates = [slug(first.reason), slug(program.stem), slug(program.name)]
    prefix = slug(source) or "custom-plugin"
    for candidate in candidates:
        name = f"{prefix}/{candidate}"
        if candidate and name not in taken:
            return name
    n = 2
    while f"{prefix}/{candidates[0]}-{n}" in taken:
        n += 1
    return f"{prefix}/{candidates[0]}-{n}"


def _verdict(rule: _Rule, *, by_type: Mapping[str, ConditionSpec]) -> Verdict:
    if rule.type is RuleType.PERMANENT and rule.condition is not None:
        healthy = by_type[rule.condition]
        return Verdict(
            condition=rule.condition,
            problem_reason=rule.reason,
            ok_reason=healthy.reason,
            ok_message=healthy.message,
            severity=Severity.ERROR,
        )
    return Verdict(
        condition=None,
        problem_reason=rule.reason,
        ok_reason="",  # a temporary rule has no healthy reason: an OK run must not show the problem's
        severity=Severity.WARNING,
        repeat_event=True,  # NPD: an Event on every failing run of a temporary rule
    )


def _build_checks(
    rules: list[_Rule],
    *,
    file: str,
    source: str,
    by_type: Mapping[str, ConditionSpec],
    settings: _Settings,
    group: str,
    cwd: Path,
    tool_path: str,
    run_process: RunProcess | None = None,
) -> tuple[ScheduledCheck, ...]:
    """One check per distinct command (program, args, timeout, interval), feeding each of its rules."""
    commands: dict[tuple, list[_Rule]] = {}
    for rule in rules:
        commands.setdefault((rule.argv, rule.timeout, rule.interval), []).append(rule)
    taken: set[str] = set()
    checks: list[ScheduledCheck] = []
    for (argv, timeout, interval), members in commands.items():
        name = _check_name(members, source=source, taken=taken)
        taken.add(name)
        owned = [by_type[r.condition] for r in members if r.condition is not None]
        check = ExecutableCheck(
            name=name,
            argv=argv,
            interval=interval,
            timeout=timeout,
            verdicts=[_verdict(r, by_type=by_type) for r in members],
            conditions=owned,
            max_output_length=settings.max_output_length,
            cwd=cwd,
            tool_path=tool_path,
            run_process=run_process,
        )
        checks.append(
            ScheduledCheck(
                check=check,
                interval=interval,
                # The runner kills the process group at ``timeout`` and says so; the scheduler's own
                # deadline is only the backstop.
                timeout=timeout + RUNNER_GRACE,
                kind="executable",
                origin=f"{file}: " + ", ".join(f"rules[{r.index}]" for r in members),
                failure_threshold=1,
                success_threshold=1,
                group=group,
                group_limit=settings.concurrency,
            )
        )
    return tuple(checks)
