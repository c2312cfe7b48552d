"""From declarations to runnable checks: built-in factories, entry points, NPD custom plugins.

Bad options of a configured check are configuration errors (exit 2, naming file, field and
line). A plugin that cannot be imported or whose factory fails is the plugin's trouble, not the
configuration's and not the node's: it becomes a :class:`BrokenCheck`, which reports UNKNOWN with
the error on every run (and the self-health metrics count it), while everything else runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from agent.checks.declared import MIN_INTERVAL, MIN_TIMEOUT, CheckDecl
from agent.checks.model import (
    ENTRY_POINT_GROUP,
    CheckConfigError,
    CheckContext,
    CheckResult,
    CheckStatus,
    ScheduledCheck,
)
from agent.detectors.packfile import field_path
from agent.errors import ConfigProblem
from agent.types import ConditionSpec

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 60.0
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True, kw_only=True)
class BrokenCheck:
    """Stands in for a check that could not be built: UNKNOWN with the reason, on every run."""

    name: str
    error: str
    interval: float = DEFAULT_INTERVAL
    timeout: float = DEFAULT_TIMEOUT
    conditions: Sequence[ConditionSpec] = ()

    def run(self) -> list[CheckResult]:
        return [CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason="CheckLoadFailed", message=self.error)]


def entry_point_decls(*, entry_points: Callable[[], Sequence[Any]] | None = None) -> list[CheckDecl]:
    """One declaration per installed entry point of group ``node_health_agent.checks``."""
    found = entry_points() if entry_points is not None else metadata.entry_points(group=ENTRY_POINT_GROUP)
    decls = []
    for ep in sorted(found, key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        where = f"{dist.name} {dist.version}" if dist is not None else "unknown package"
        decls.append(
            CheckDecl(name=ep.name, entry_point=ep.name, origin=f"entry point {ep.name} = {ep.value} ({where})")
        )
    return decls


def _load_factory(decl: CheckDecl, *, entry_points: Mapping[str, Any]) -> Callable[..., Any]:
    if decl.use is not None:
        from agent.checks.builtin import import_builtin

        module, _, attr = decl.use.partition(":")
        return getattr(import_builtin(module), attr)
    ep = entry_points.get(decl.entry_point or "")
    if ep is None:
        raise LookupError(f"no entry point named {decl.entry_point!r} in group {ENTRY_POINT_GROUP} is installed")
    return ep.load()


def _missing_builtin(use: str) -> str | None:
    """Why ``use`` names no built-in factory (a typo in the configuration), or None."""
    from agent.checks.builtin import PACKAGE, import_builtin

    module, _, attr = use.partition(":")
    try:
        found = import_builtin(module)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == f"{PACKAGE}.{module}" or f"{PACKAGE}.{module}".startswith(exc.name + ".")):
            return f"no built-in check module {module!r} (plugins/{module.replace('.', '/')}.py)"
        return None  # the module exists but fails to import: the plugin's trouble, reported at run time
    except Exception:
        return None
    if not hasattr(found, attr):
        return f"built-in module {module!r} has no factory {attr!r}"
    return None


def _problem(decl: CheckDecl, exc: CheckConfigError) -> ConfigProblem:
    """Where the bad option was given (the declaration that set it), else the declaration itself."""
    if exc.field in decl.option_sources:
        file, path, line = decl.option_sources[exc.field]
        return ConfigProblem(file=file, field=field_path(path), message=exc.message, line=line)
    option = f".{exc.field}" if exc.field else ""
    return ConfigProblem(
        file=decl.file or decl.origin,
        field=f"{field_path(decl.path)}.options{option}" if decl.path else f"options{option}",
        message=exc.message,
        line=decl.line,
    )


def build_checks(
    decls: Sequence[CheckDecl],
    *,
    context: CheckContext,
    entry_points: Callable[[], Sequence[Any]] | None = None,
) -> tuple[list[ScheduledCheck], list[ConfigProblem]]:
    """Instantiate every enabled declaration; (checks, configuration problems)."""
    found = entry_points() if entry_points is not None else metadata.entry_points(group=ENTRY_POINT_GROUP)
    by_name = {ep.name: ep for ep in found}
    checks: list[ScheduledCheck] = []
    problems: list[ConfigProblem] = []
    for decl in decls:
        if not decl.enabled:
            continue
        kind = "python" if decl.use is not None else "entry-point"
        if decl.use is not None:
            missing = _missing_builtin(decl.use)
            if missing is not None:
                problems.append(
                    ConfigProblem(
                        file=decl.file or decl.origin,
                        field=f"{field_path(decl.path)}.use" if decl.path else "use",
                        message=missing,
                        line=decl.line,
                    )
                )
                continue
        try:
            factory = _load_factory(decl, entry_points=by_name)
            check = factory(name=decl.name, context=context, options=dict(decl.options))
        except CheckConfigError as exc:
            problems.append(_problem(decl, exc))
            continue
        except Exception as exc:  # the plugin's own failure: report it, run everything else
            log.error("check %s (%s) cannot be loaded: %s: %s", decl.name, decl.origin, type(exc).__name__, exc)
            check = BrokenCheck(name=decl.name, error=f"cannot load check {decl.name}: {type(exc).__name__}: {exc}")
        else:
            why = _not_a_check(check)
            if why is not None:
                log.error("check %s (%s): %s", decl.name, decl.origin, why)
                check = BrokenCheck(name=decl.name, error=f"cannot load check {decl.name}: {why}")
        checks.append(
            ScheduledCheck(
                check=check,
                interval=decl.interval or _own(check, "interval", default=DEFAULT_INTERVAL, floor=MIN_INTERVAL),
                timeout=decl.timeout or _own(check, "timeout", default=DEFAULT_TIMEOUT, floor=MIN_TIMEOUT),
                kind=kind,
                origin=decl.origin,
                failure_threshold=decl.failure_threshold,
                success_threshold=decl.success_threshold,
            )
        )
    return checks, problems


def _own(check: object, attribute: str, *, default: float, floor: float) -> float:
    """A check's own ``interval`` or ``timeout``: a positive finite number of seconds, else ``default``;
    one below ``floor`` is raised to it, with a warning naming the check (the plugin's choice, not the
    operator's: a ``checks:`` declaration of the same name overrides it)."""
    try:
        value = getattr(check, attribute, None)
    except Exception:  # a property that raises: the plugin's trouble
        value = None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        return default
    if value < floor:
        name = getattr(check, "name", "?")
        log.warning("check %s asks for %s %gs, less than %gs: it runs with %gs", name, attribute, value, floor, floor)
        return floor
    return float(value)


def _not_a_check(obj: object) -> str | None:
    if not callable(getattr(obj, "run", None)):
        return f"the factory returned {type(obj).__name__}, which has no run() method"
    if not isinstance(getattr(obj, "name", None), str):
        return f"the factory returned {type(obj).__name__} without a 'name'"
    conditions = getattr(obj, "conditions", ())
    if not isinstance(conditions, list | tuple) or not all(isinstance(c, ConditionSpec) for c in conditions):
        return "its 'conditions' must be a list of agent.types.ConditionSpec"
    return None
