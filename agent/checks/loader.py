"""From declarations to runnable checks: built-in factories, entry points, NPD custom plugins.

Bad options of a configured check are configuration errors (exit 2, naming file, field and
line). A plugin that cannot be imported or whose factory fails is the plugin's trouble, not the
configuration's and not the node's: it becomes a :class:`BrokenCheck`, which reports UNKNOWN with
the error on every run (and the self-health metrics count it), while everything else runs.

Loading is plugin code running in the agent, so it is contained (:mod:`agent.checks.guard`): each
import and each factory call runs in a thread of its own with a timeout (``LOAD_TIMEOUT``); whatever
it raises, ``SystemExit`` from a ``sys.exit()`` included, and a hang past the timeout make a
BrokenCheck naming the plugin, logged once. What the factory returns is read once (``name``,
``interval``, ``timeout``, ``conditions``, ``run``) and kept as a :class:`PluginCheck`, so a property
that raises later cannot reach the scheduler or the watcher.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from agent.checks.declared import MIN_INTERVAL, MIN_TIMEOUT, CheckDecl
from agent.checks.guard import Outcome, call_guarded, describe
from agent.checks.model import (
    DEFAULT_VALID_FOR,
    ENTRY_POINT_GROUP,
    LOAD_FAILED,
    ActiveSpec,
    CheckConfigError,
    CheckContext,
    CheckResult,
    CheckStatus,
    Runnable,
    ScheduledCheck,
)
from agent.core.configdoc import field_path
from agent.core.errors import ConfigProblem
from agent.core.types import ConditionSpec, reserved_condition

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 60.0
DEFAULT_TIMEOUT = 30.0
LOAD_TIMEOUT = 20.0  # seconds an import, or a factory call, may take before the check is a BrokenCheck


@dataclass(frozen=True, kw_only=True)
class BrokenCheck:
    """Stands in for a check that could not be built: UNKNOWN with the reason, on every run."""

    name: str
    error: str
    interval: float = DEFAULT_INTERVAL
    timeout: float = DEFAULT_TIMEOUT
    conditions: Sequence[ConditionSpec] = ()

    def run(self) -> list[CheckResult]:
        return [CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason=LOAD_FAILED, message=self.error)]


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


class _NoSuchBuiltin(LookupError):
    """A ``use:`` that names no built-in module or factory: the configuration's mistake (exit 2)."""


class _NotACheck(Exception):
    """What the factory returned cannot be run as a check (the message says why)."""


_MISSING = object()


def _attr(obj: object, name: str, default: object = _MISSING) -> object:
    """``obj.name`` read once; a property that raises (anything) makes the plugin broken, naming it."""
    try:
        return getattr(obj, name) if default is _MISSING else getattr(obj, name, default)
    except BaseException as exc:  # noqa: BLE001 - runs in the load thread: whatever the plugin raises is its own
        raise _NotACheck(f"reading its {name!r} raised {describe(exc)}") from None


def _seconds(value: object) -> float | None:
    """A finite number of seconds above 0, else None (the declaration's or the default applies)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def _condition(spec: object, index: int) -> ConditionSpec:
    """A plugin's ConditionSpec, checked field by field and copied (nothing of the plugin's object is kept)."""
    where = f"its conditions[{index}]"
    if not isinstance(spec, ConditionSpec):
        raise _NotACheck("its 'conditions' must be a list of agent.core.types.ConditionSpec")
    texts = {key: _attr(spec, key) for key in ("type", "reason", "message", "source")}
    for key, value in texts.items():
        if not isinstance(value, str) or (key == "type" and not value):
            raise _NotACheck(f"{where}.{key} must be a string{' (not empty)' if key == 'type' else ''}")
    clear_after, accelerator, namespace = (
        _attr(spec, "clear_after"),
        _attr(spec, "accelerator"),
        _attr(spec, "cloudwatch_namespace"),
    )
    if clear_after is not None and _seconds(clear_after) is None:
        raise _NotACheck(f"{where}.clear_after must be None or a number of seconds above 0")
    if not isinstance(accelerator, bool) or not (namespace is None or isinstance(namespace, str)):
        raise _NotACheck(f"{where}: accelerator must be a bool and cloudwatch_namespace None or a string")
    return ConditionSpec(
        **{key: str.__str__(value) for key, value in texts.items()},  # type: ignore[arg-type]
        clear_after=_seconds(clear_after),
        accelerator=bool(accelerator),
        cloudwatch_namespace=None if namespace is None else str.__str__(namespace),
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class PluginCheck:
    """A Python check as the agent holds it. ``name``, ``interval``, ``timeout`` and ``conditions`` were
    read once, when it was loaded, and checked: a property that raises, hangs or changes its answer
    later never reaches the scheduler, the main loop or the watcher. :meth:`run` calls the plugin's
    ``run`` (from a worker thread; the scheduler validates what it returns). ``plugin`` is the object
    the factory returned."""

    name: str
    interval: float | None  # None: the plugin gave no usable default (the declaration's, or 60 s)
    timeout: float | None
    conditions: tuple[ConditionSpec, ...]
    plugin: object = field(repr=False)
    run_plugin: Callable[[], object] = field(repr=False)

    def run(self) -> object:
        return self.run_plugin()


def _adopt(obj: object) -> PluginCheck:
    """Read and check what a factory returned, once (in the load thread); _NotACheck says what is wrong."""
    run = _attr(obj, "run", None)
    if not callable(run):
        raise _NotACheck(f"the factory returned {type(obj).__name__}, which has no run() method")
    name = _attr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise _NotACheck(f"the factory returned {type(obj).__name__} without a 'name'")
    conditions = _attr(obj, "conditions", ())
    if not isinstance(conditions, list | tuple):
        raise _NotACheck("its 'conditions' must be a list of agent.core.types.ConditionSpec")
    return PluginCheck(
        name=str.__str__(name),
        interval=_seconds(_attr(obj, "interval", None)),
        timeout=_seconds(_attr(obj, "timeout", None)),
        conditions=tuple(_condition(c, i) for i, c in enumerate(conditions)),
        plugin=obj,
        run_plugin=run,
    )


def _builtin_factory(module: str, attr: str) -> object:
    """Import ``plugins/<module>.py`` and return its factory ``attr`` (runs in the load thread)."""
    from agent.checks.builtin import PACKAGE, import_builtin

    full = f"{PACKAGE}.{module}"
    try:
        found = import_builtin(module)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == full or full.startswith(exc.name + ".")):
            raise _NoSuchBuiltin(
                f"no built-in check module {module!r} (plugins/{module.replace('.', '/')}.py)"
            ) from None
        raise  # the module exists but imports something missing: the plugin's trouble
    if not hasattr(found, attr):
        raise _NoSuchBuiltin(f"built-in module {module!r} has no factory {attr!r}")
    return getattr(found, attr)


def _make(factory: object, decl: CheckDecl, context: CheckContext) -> PluginCheck:
    """Call the factory and adopt its check (runs in the load thread)."""
    if not callable(factory):
        raise _NotACheck(f"its factory is a {type(factory).__name__}, which cannot be called")
    try:
        made = factory(name=decl.name, context=context, options=dict(decl.options))
    except CheckConfigError as exc:  # copied: only plain strings leave the load thread
        field_, message = getattr(exc, "field", ""), getattr(exc, "message", "")
        raise CheckConfigError(
            str.__str__(field_) if isinstance(field_, str) else "",
            str.__str__(message) if isinstance(message, str) else "invalid options",
        ) from None
    return _adopt(made)


def _broken(decl: CheckDecl, why: str) -> BrokenCheck:
    log.error("check %s (%s) cannot be loaded: %s", decl.name, decl.origin, why)
    return BrokenCheck(name=decl.name, error=f"cannot load check {decl.name}: {why}")


def _hung_import(module: str, hung: Mapping[str, str]) -> str | None:
    """The module (``module`` or a package above it) whose import hung earlier in this build, if any."""
    for stuck in hung:
        if module == stuck or module.startswith(stuck + "."):
            return stuck
    return None


def _load(
    decl: CheckDecl,
    *,
    context: CheckContext,
    entry_points: Mapping[str, Any],
    timeout: float,
    stop: threading.Event | None,
    hung: dict[str, str],
) -> Runnable | ConfigProblem:
    """Import a declaration's factory, then build and adopt its check: each step in a thread of its own,
    given ``timeout`` seconds (see :mod:`agent.checks.guard`). A configuration mistake is a ConfigProblem;
    anything the plugin does wrong (raises anything, hangs, returns no check) is a BrokenCheck naming it.
    ``hung`` collects the modules whose import timed out: a second import would wait on its lock."""
    if decl.use is not None:
        from agent.checks.builtin import PACKAGE

        module, _, attr = decl.use.partition(":")
        target = f"{PACKAGE}.{module}"
        load: Callable[[], object] = functools.partial(_builtin_factory, module, attr)
    else:
        ep = entry_points.get(decl.entry_point or "")
        if ep is None:
            return _broken(decl, f"no entry point named {decl.entry_point!r} in group {ENTRY_POINT_GROUP} is installed")
        target = str(ep.value).partition(":")[0].strip()
        load = ep.load
    stuck = _hung_import(target, hung)
    if stuck is not None:
        return _broken(decl, f"the import of {stuck} hung (loading check {hung[stuck]}); not tried again")
    imported = call_guarded(load, timeout=timeout, name=f"load:{decl.name}", stop=stop)
    if imported.timed_out:
        hung[target] = decl.name
        return _broken(decl, f"importing {target} did not finish within {timeout:g}s (abandoned; it may still hang)")
    if isinstance(imported.error, _NoSuchBuiltin):
        return ConfigProblem(
            file=decl.file or decl.origin,
            field=f"{field_path(decl.path)}.use" if decl.path else "use",
            message=str(imported.error),
            line=decl.line,
        )
    if not imported.ok:
        return _broken(decl, _failure(imported, step="import", timeout=timeout))
    factory = imported.value
    built = call_guarded(lambda: _make(factory, decl, context), timeout=timeout, name=f"load:{decl.name}", stop=stop)
    if isinstance(built.error, CheckConfigError):
        return _problem(decl, built.error)
    if isinstance(built.error, _NotACheck):
        return _broken(decl, str(built.error))
    if not built.ok or built.value is None:
        return _broken(decl, _failure(built, step="factory", timeout=timeout))
    return built.value


def _failure(outcome: Outcome[Any], *, step: str, timeout: float) -> str:
    if outcome.cancelled:
        return f"interrupted: the agent is stopping (during its {step})"
    if outcome.timed_out:
        return f"its {step} did not return within {timeout:g}s (abandoned; it may still hang)"
    assert outcome.error is not None
    return describe(outcome.error)


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
    load_timeout: float = LOAD_TIMEOUT,
    stop: threading.Event | None = None,
) -> tuple[list[ScheduledCheck], list[ConfigProblem]]:
    """Instantiate every enabled declaration; (checks, configuration problems).

    Each import and each factory call gets ``load_timeout`` seconds (a hung one becomes a BrokenCheck);
    ``stop`` set abandons a load at once (a reload while the agent shuts down)."""
    found = entry_points() if entry_points is not None else metadata.entry_points(group=ENTRY_POINT_GROUP)
    by_name = {ep.name: ep for ep in found}
    checks: list[ScheduledCheck] = []
    problems: list[ConfigProblem] = []
    hung: dict[str, str] = {}
    for decl in decls:
        if not decl.enabled and not decl.active:
            continue  # a disabled active check stays loaded, dormant: a validation request may name it
        kind = "python" if decl.use is not None else "entry-point"
        loaded = _load(decl, context=context, entry_points=by_name, timeout=load_timeout, stop=stop, hung=hung)
        if isinstance(loaded, ConfigProblem):
            problems.append(loaded)
            continue
        check = loaded
        reserved = [why for spec in check.conditions if (why := reserved_condition(spec.type)) is not None]
        if reserved:
            problems.extend(
                ConfigProblem(
                    file=decl.file or decl.origin,
                    field=f"{field_path(decl.path)}.use" if decl.path else "use",
                    message=f"check {decl.name} ({decl.origin}) declares a condition it may not own: {why}",
                    line=decl.line,
                )
                for why in reserved
            )
            continue
        checks.append(
            ScheduledCheck(
                check=check,
                interval=decl.interval or _own(check, "interval", default=DEFAULT_INTERVAL, floor=MIN_INTERVAL),
                timeout=decl.timeout or _own(check, "timeout", default=DEFAULT_TIMEOUT, floor=MIN_TIMEOUT),
                kind=kind,
                origin=decl.origin,
                failure_threshold=decl.failure_threshold,
                success_threshold=decl.success_threshold,
                active=_active(decl),
            )
        )
    return checks, problems


def _active(decl: CheckDecl) -> ActiveSpec | None:
    """What an ``active: true`` declaration adds (None for any other check)."""
    if not decl.active or decl.devices is None:
        return None
    return ActiveSpec(
        devices=decl.devices,
        valid_for=decl.valid_for or DEFAULT_VALID_FOR,
        on_demand=decl.interval == 0,
        dormant=not decl.enabled,
    )


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
