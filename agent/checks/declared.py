"""Check declarations: the ``checks:`` files (built-in ``plugins/<domain>/checks.yaml`` and the user's).

::

    checks:
      - name: gpu-count                   # unique; the metric label and the CLI's NAME
        use: nvidia.checks:GpuCountCheck  # built-in: <module under plugins/>:<factory>
        # entryPoint: my-check            # or: an entry point of group node_health_agent.checks
        interval: 60s                     # 0: on demand only (an active check run by validation requests)
        timeout: 20s
        failureThreshold: 1
        successThreshold: 3
        enabled: true
        options: {expectedCount: 8}
        # active: true                    # exclusive, may load its devices: the gates of agent.checks.active
        # devices: gpu                    # with active: the kind it exercises (gpu | neuron | rdma)
        # validFor: 24h                   # with active: how long a pass is valid (default 24h)

Declarations apply in order: a later one with the same ``name`` changes only the keys it gives
(``options`` key by key), so a user's file can retune or disable a built-in check without
repeating it. Installed entry points come first, each as ``{name: <entry point>, entryPoint: …}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent.checks.model import DEVICE_KINDS
from agent.core.configdoc import Problems
from agent.core.durations import parse_duration

CHECK_KEYS = frozenset(
    {
        "name",
        "use",
        "entryPoint",
        "interval",
        "timeout",
        "failureThreshold",
        "successThreshold",
        "enabled",
        "options",
        "active",
        "devices",
        "validFor",
    }
)
ACTIVE_ONLY_KEYS = ("devices", "validFor")  # meaningful only with active: true
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._/-]*$")
_USE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
MAX_THRESHOLD = 1000
# The fastest a check may run, and its shortest timeout, however they are given (a ``checks:``
# declaration, an NPD plugin file, a check class's own attributes): a check on a nanosecond
# interval runs back to back on a core, and a timeout under 100 ms fails runs that load only slows.
MIN_INTERVAL = 1.0
MIN_TIMEOUT = 0.1


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckDecl:
    """One check as declared (after merging every declaration with its name)."""

    name: str
    use: str | None = None  # "nvidia.checks:GpuCountCheck"
    entry_point: str | None = None
    interval: float | None = None
    timeout: float | None = None
    failure_threshold: int = 1
    success_threshold: int = 3
    enabled: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)
    active: bool = False
    devices: str | None = None  # with active: gpu | neuron | rdma
    valid_for: float | None = None  # with active: seconds a pass is valid (None: DEFAULT_VALID_FOR)
    origin: str = ""  # "<file>: checks[i]" of the declaration that named the factory
    file: str = ""
    path: tuple = ()  # field path of that declaration
    line: int | None = None
    # option -> (file, field path, line) of the declaration that gave it, for problems about it
    option_sources: Mapping[str, tuple[str, tuple, int | None]] = field(default_factory=dict)


def read_checks(col: Problems) -> list[tuple[tuple, dict[str, Any]]]:
    """The valid declarations of one file as (field path, given keys); problems go to ``col``."""
    data = col.doc.data
    raw = data.get("checks")
    extra = sorted(set(data) - {"checks"})
    for key in extra:
        col.add((key,), f"unknown key {key!r} in a checks file (known: checks)")
    if not isinstance(raw, list):
        col.add(("checks",), "must be a list of check declarations")
        return []
    out = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        path = ("checks", i)
        if not isinstance(item, dict):
            col.add(path, "must be a mapping with at least 'name'")
            continue
        given = _check_one(item, path=path, col=col)
        if given is None:
            continue
        name = given["name"]
        if name in seen:
            col.add((*path, "name"), f"duplicate check name {name!r} in this file (also checks[{seen[name]}])")
            continue
        seen[name] = i
        out.append((path, given))
    return out


def _check_one(item: Mapping[str, Any], *, path: tuple, col: Problems) -> dict[str, Any] | None:
    before = len(col)
    for key in item:
        if key not in CHECK_KEYS:
            col.add((*path, key), f"unknown key {key!r} (known: {', '.join(sorted(CHECK_KEYS))})")
    given: dict[str, Any] = {}
    name = item.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        col.add((*path, "name"), f"required: a lowercase name of letters, digits and ._/- (got {name!r})")
    else:
        given["name"] = name
    if "use" in item and "entryPoint" in item:
        col.add((*path, "use"), "give either 'use' (a built-in) or 'entryPoint', not both")
    if "use" in item:
        if not isinstance(item["use"], str) or not _USE_RE.match(item["use"]):
            col.add(
                (*path, "use"),
                f"expected '<module>:<factory>' such as 'nvidia.checks:GpuCountCheck', got {item['use']!r}",
            )
        else:
            given["use"] = item["use"]
    if "entryPoint" in item:
        if not isinstance(item["entryPoint"], str) or not item["entryPoint"].strip():
            col.add((*path, "entryPoint"), "must be the name of an entry point in group node_health_agent.checks")
        else:
            given["entry_point"] = item["entryPoint"]
    for key, floor in (("interval", MIN_INTERVAL), ("timeout", MIN_TIMEOUT)):
        if key in item:
            try:
                seconds = parse_duration(item[key])
            except ValueError as exc:
                col.add((*path, key), str(exc))
                continue
            if key == "interval" and seconds == 0:
                given[key] = 0.0  # on demand only (active checks: validation requests)
                continue
            if seconds <= 0:
                col.add((*path, key), f"must be more than 0, got {item[key]!r}")
                continue
            if seconds < floor:
                col.add((*path, key), f"must be at least {floor:g}s, got {item[key]!r}")
                continue
            given[key] = seconds
    for key, attr in (("failureThreshold", "failure_threshold"), ("successThreshold", "success_threshold")):
        if key in item:
            value = item[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THRESHOLD:
                col.add((*path, key), f"must be an integer from 1 to {MAX_THRESHOLD}, got {value!r}")
            else:
                given[attr] = value
    if "enabled" in item:
        if not isinstance(item["enabled"], bool):
            col.add((*path, "enabled"), f"must be true or false, got {item['enabled']!r}")
        else:
            given["enabled"] = item["enabled"]
    _active_keys(item, path=path, col=col, given=given)
    if "options" in item:
        if not isinstance(item["options"], dict):
            col.add((*path, "options"), "must be a mapping of option name to value")
        else:
            given["options"] = dict(item["options"])
    return given if len(col) == before else None


def _active_keys(item: Mapping[str, Any], *, path: tuple, col: Problems, given: dict[str, Any]) -> None:
    """``active``, ``devices`` and ``validFor`` (the last two only with ``active: true`` in this declaration,
    or a later declaration retuning an active check: the merge checks the combination)."""
    if "active" in item:
        if not isinstance(item["active"], bool):
            col.add((*path, "active"), f"must be true or false, got {item['active']!r}")
        else:
            given["active"] = item["active"]
    if "devices" in item:
        if item["devices"] not in DEVICE_KINDS:
            col.add((*path, "devices"), f"must be one of {', '.join(DEVICE_KINDS)}, got {item['devices']!r}")
        else:
            given["devices"] = item["devices"]
    if "validFor" in item:
        try:
            seconds = parse_duration(item["validFor"])
        except ValueError as exc:
            col.add((*path, "validFor"), str(exc))
        else:
            if seconds <= 0:
                col.add((*path, "validFor"), f"must be more than 0, got {item['validFor']!r}")
            else:
                given["valid_for"] = seconds


def merge(
    declarations: Sequence[tuple[Problems, tuple, dict[str, Any]]], *, base: Sequence[CheckDecl] = ()
) -> list[CheckDecl]:
    """Apply declarations in order onto ``base`` (entry points); problems (no factory) go to each file."""
    merged: dict[str, CheckDecl] = {d.name: d for d in base}
    last: dict[str, tuple[Problems, tuple]] = {}  # name -> the declaration that changed it last
    for col, path, given in declarations:
        name = given["name"]
        last[name] = (col, path)
        old = merged.get(name)
        changes: dict[str, Any] = {k: v for k, v in given.items() if k != "options"}
        given_sources = {
            key: (col.file, (*path, "options", key), col.doc.line((*path, "options", key)))
            for key in given.get("options", {})
        }
        if "use" in given or "entry_point" in given:
            changes.update(origin=f"{col.file}: {_field(path)}", file=col.file, path=path, line=col.doc.line(path))
            if "use" in given:
                changes["entry_point"] = None
            else:
                changes["use"] = None
        if old is None:
            if "use" not in given and "entry_point" not in given:
                col.add(
                    (*path, "name"),
                    f"no check named {name!r} to change: give 'use' (a built-in factory) or 'entryPoint' to add one",
                )
                continue
            merged[name] = CheckDecl(options=given.get("options", {}), option_sources=given_sources, **changes)
        else:
            options = {**old.options, **given.get("options", {})}
            sources = {**old.option_sources, **given_sources}
            merged[name] = replace(old, options=options, option_sources=sources, **changes)
    for name, (col, path) in last.items():
        if name in merged:
            for key, message in active_problems(merged[name]):
                col.add((*path, key), message)
    return list(merged.values())


def active_problems(decl: CheckDecl) -> list[tuple[str, str]]:
    """(key, what is wrong) with the merged declaration's active keys: an active check names its device
    kind; ``devices``, ``validFor`` and ``interval: 0`` belong to active checks only."""
    if decl.active:
        return (
            []
            if decl.devices is not None
            else [
                ("active", f"an active check must say which devices it exercises (devices: {' | '.join(DEVICE_KINDS)})")
            ]
        )
    out = [
        (key, f"{key!r} applies only to an active check (active: true)")
        for key, value in (("devices", decl.devices), ("validFor", decl.valid_for))
        if value is not None
    ]
    if decl.interval == 0:
        out.append(
            (
                "interval",
                "must be more than 0 (0, on demand only, applies only to an active check: active: true); "
                f"otherwise at least {MIN_INTERVAL:g}s",
            )
        )
    return out


def _field(path: tuple) -> str:
    return f"checks[{path[1]}]" if len(path) > 1 else "checks"
