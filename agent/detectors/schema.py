"""Shape validation of one rule pack: keys, types, names, durations, lists.

Everything that can be checked within a file without compiling a pattern is checked here; the
result is a ``PackSpec`` of typed values. What needs the compiled pattern (field names) or other
files (declared conditions, lists) is checked by ``agent.detectors.compiler``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.configdoc import LOG_MONITOR_RULE_KEYS, LOG_MONITOR_TOP_KEYS, Problems
from agent.core.devices import DeviceKind
from agent.core.durations import parse_duration
from agent.core.types import ConditionSpec, RuleType, Severity, reserved_condition
from agent.detectors.model import DeviceField, Threshold

DEFAULT_BUFFER_SIZE = 10
MAX_BUFFER_SIZE = 1000

TOP_KEYS = LOG_MONITOR_TOP_KEYS
# CloudWatch namespaces: 1-255 of these characters, and not AWS's own ("AWS/...").
CLOUDWATCH_NAMESPACE_RE = re.compile(r"^[0-9A-Za-z.\-_/#:]{1,255}$")
RULE_KEYS = LOG_MONITOR_RULE_KEYS
CONDITION_KEYS = frozenset({"type", "reason", "message", "clearAfter", "accelerator"})
FIELD_TYPES = frozenset({"int", "hex", "str"})
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:/-]+$")
_REASON_RE = re.compile(r"^[A-Za-z0-9_.:{}-]+$")


@dataclass(frozen=True, kw_only=True, slots=True)
class WhereSpec:
    """One ``where`` entry: a field and the values (or list names, resolved later) it must (not) have."""

    field: str
    path: tuple
    value: str | tuple[str | int, ...]  # a list name, or list names / literal values (strings, integers)
    negate: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleSpec:
    """A rule whose shape is valid where the fields are not None; ``ok`` is False if any was not."""

    name: str
    explicit_name: bool
    enabled: bool
    file: str
    index: int
    path: tuple
    source: str
    buffer_size: int
    ok: bool
    type: RuleType
    condition: str | None  # set (and non-empty) for a permanent rule
    pattern: str | None
    reason: str | None
    reason_fields: tuple[str, ...]  # {field} placeholders of the reason
    severity: Severity
    suffix: str
    where: tuple[WhereSpec, ...]
    threshold: Threshold | None
    key_values: tuple[str, ...]
    field_types: Mapping[str, str]
    provenance: tuple[str, ...] = ()  # where the message is printed: "repo:path: format string"
    fallback: bool = False  # fires only for lines no other rule matched (a fault family's catch-all)
    device: DeviceField | None = None  # which field names the device a finding is about
    max_level: int | None = None  # looks only at kernel records printed at this level or worse (or of no known level)


@dataclass(frozen=True, kw_only=True, slots=True)
class PackSpec:
    source: str
    buffer_size: int
    conditions: tuple[ConditionSpec, ...]
    lists: Mapping[str, tuple[str, ...]]
    rules: tuple[RuleSpec, ...]


def _known(keys: frozenset[str]) -> str:
    return ", ".join(sorted(keys))


def _unknown_keys(value: Mapping[str, Any], *, known: frozenset[str], path: tuple, col: Problems) -> None:
    for key in value:
        if key not in known:
            col.add((*path, key), f"unknown key {key!r} (known: {_known(known)})")


def as_values(value: Any) -> tuple[str, ...] | None:
    """A list of strings or integers as strings; None if ``value`` is not one."""
    if isinstance(value, list) and all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
        return tuple(str(v) for v in value)
    return None


def check_pack(col: Problems) -> PackSpec:
    """Validate the shape of ``col.doc``; every problem goes to ``col``."""
    data = col.doc.data
    stem = Path(col.file).stem
    if not isinstance(data, dict):
        col.add((), "expected a mapping with 'rules' (node-problem-detector system-log-monitor schema)")
        return PackSpec(source=stem, buffer_size=DEFAULT_BUFFER_SIZE, conditions=(), lists={}, rules=())
    _unknown_keys(data, known=TOP_KEYS, path=(), col=col)
    # ``plugin`` was read by agent.core.configfiles.classify, which sends each kind to its own loader.
    source = data.get("source", stem)
    if not isinstance(source, str) or not source:
        col.add(("source",), "must be a non-empty string")
        source = stem
    buffer_size = data.get("bufferSize", DEFAULT_BUFFER_SIZE)
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or not 1 <= buffer_size <= MAX_BUFFER_SIZE:
        col.add(("bufferSize",), f"must be an integer between 1 and {MAX_BUFFER_SIZE}, got {buffer_size!r}")
        buffer_size = DEFAULT_BUFFER_SIZE
    for key in ("lookback", "delay"):
        if key in data:
            try:
                parse_duration(data[key])
            except ValueError as exc:
                col.add((key,), str(exc))
    if "metricsReporting" in data and not isinstance(data["metricsReporting"], bool):
        col.add(("metricsReporting",), "must be true or false")
    return PackSpec(
        source=source,
        buffer_size=buffer_size,
        conditions=_check_conditions(
            data.get("conditions", []), col=col, source=source, namespace=_cloudwatch_namespace(data, col=col)
        ),
        lists=_check_lists(data.get("lists", {}), col=col),
        rules=_check_rules(data.get("rules"), col=col, source=source, buffer_size=buffer_size),
    )


def _check_lists(raw: Any, *, col: Problems) -> dict[str, tuple[str, ...]]:
    lists: dict[str, tuple[str, ...]] = {}
    if not isinstance(raw, dict):
        col.add(("lists",), "must be a mapping of list name to a list of values")
        return lists
    for name, values in raw.items():
        parsed = as_values(values)
        if not isinstance(name, str) or parsed is None:
            col.add(("lists", name), "must be a list of strings or integers")
        else:
            lists[name] = parsed
    return lists


def _cloudwatch_namespace(data: dict, *, col: Problems) -> str | None:
    """The pack's ``cloudwatchNamespace``: where its conditions' problems go in CloudWatch (None = the default)."""
    value = data.get("cloudwatchNamespace")
    if value is None:
        return None
    if not isinstance(value, str) or not CLOUDWATCH_NAMESPACE_RE.match(value) or value.startswith("AWS/"):
        col.add(
            ("cloudwatchNamespace",),
            f"must be a CloudWatch namespace (1-255 of letters, digits and . - _ / # :, not starting with AWS/), "
            f"got {value!r}",
        )
        return None
    return value


def _where(col: Problems, path: tuple) -> str:
    line = col.doc.line(path)
    return f"{col.file}:{line}" if line is not None else col.file


def _check_conditions(
    raw: Any, *, col: Problems, source: str, namespace: str | None = None
) -> tuple[ConditionSpec, ...]:
    if not isinstance(raw, list):
        col.add(("conditions",), "must be a list of {type, reason, message}")
        return ()
    conditions: list[ConditionSpec] = []
    first_path: dict[str, tuple] = {}
    for i, cond in enumerate(raw):
        path = ("conditions", i)
        if not isinstance(cond, dict):
            col.add(path, "must be a mapping with type, reason and message")
            continue
        _unknown_keys(cond, known=CONDITION_KEYS, path=path, col=col)
        ok = True
        for key in ("type", "reason"):
            if not isinstance(cond.get(key), str) or not _NAME_RE.match(cond.get(key) or ""):
                col.add((*path, key), "required: a non-empty name of letters, digits and _.:/-")
                ok = False
        type_ = cond.get("type")
        if isinstance(type_, str) and (why := reserved_condition(type_)) is not None:
            col.add((*path, "type"), why)
            ok = False
        elif isinstance(type_, str) and type_ in first_path:
            col.add((*path, "type"), f"duplicate condition type {type_!r} (also {col.where(first_path[type_])})")
            ok = False
        elif isinstance(type_, str):
            first_path[type_] = (*path, "type")
        message = cond.get("message", "")
        if not isinstance(message, str):
            col.add((*path, "message"), "must be a string")
            ok = False
        clear_after = None
        if "clearAfter" in cond:
            try:
                clear_after = parse_duration(cond["clearAfter"])
                if clear_after <= 0:
                    col.add(
                        (*path, "clearAfter"), "must be greater than 0 (omit it to keep the condition until reboot)"
                    )
                    ok = False
            except ValueError as exc:
                col.add((*path, "clearAfter"), str(exc))
                ok = False
        accelerator = cond.get("accelerator", False)
        if not isinstance(accelerator, bool):
            col.add((*path, "accelerator"), "must be true or false")
            ok = False
        if ok:
            conditions.append(
                ConditionSpec(
                    accelerator=accelerator,
                    type=cond["type"],
                    reason=cond["reason"],
                    message=message,
                    clear_after=clear_after,
                    source=source,
                    cloudwatch_namespace=namespace,
                    declared_in=_where(col, (*path, "type")),
                )
            )
    return tuple(conditions)


def _check_rules(raw: Any, *, col: Problems, source: str, buffer_size: int) -> tuple[RuleSpec, ...]:
    if raw is None:
        col.add(("rules",), "required: a list of rules")
        return ()
    if not isinstance(raw, list):
        col.add(("rules",), "must be a list of rules")
        return ()
    rules: list[RuleSpec] = []
    first_index: dict[str, int] = {}
    for i, rule in enumerate(raw):
        path = ("rules", i)
        if not isinstance(rule, dict):
            col.add(path, "must be a mapping with type, reason and pattern")
            continue
        name = rule.get("name", f"{source}:{i}")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            col.add((*path, "name"), "must be a name of letters, digits and _.:/-")
            continue
        if name in first_index:
            col.add((*path, "name"), f"duplicate rule name {name!r} (also rules[{first_index[name]}])")
        first_index[name] = i
        rules.append(_check_rule(rule, col=col, path=path, name=name, source=source, buffer_size=buffer_size))
    return tuple(rules)


def _check_rule(
    rule: Mapping[str, Any], *, col: Problems, path: tuple, name: str, source: str, buffer_size: int
) -> RuleSpec:
    before = len(col)
    _unknown_keys(rule, known=RULE_KEYS, path=path, col=col)
    enabled = rule.get("enabled", True)
    if not isinstance(enabled, bool):
        col.add((*path, "enabled"), "must be true or false")
        enabled = True
    explicit = "name" in rule
    if not enabled:
        # {name: X, enabled: false} switches off rule X loaded earlier; nothing else is required.
        if not explicit:
            col.add((*path, "enabled"), "a disabled rule needs the 'name' of the rule it switches off")
        return _disabled(name=name, explicit=explicit, file=col.file, path=path, ok=len(col) == before)
    return _enabled_rule(
        rule, col=col, path=path, name=name, explicit=explicit, source=source, buffer_size=buffer_size, before=before
    )


def _enabled_rule(
    rule: Mapping[str, Any],
    *,
    col: Problems,
    path: tuple,
    name: str,
    explicit: bool,
    source: str,
    buffer_size: int,
    before: int,
) -> RuleSpec:
    """The spec of an enabled rule; its keys are checked in this order (problems come out in it)."""
    rtype = _rule_type(rule, col=col, path=path)
    condition = _rule_condition(rule, rtype, col=col, path=path)
    pattern = _rule_pattern(rule, col=col, path=path)
    key_values = _rule_key_values(rule, col=col, path=path)
    field_types = _rule_field_types(rule, col=col, path=path)
    reason, reason_fields = _check_reason(rule.get("reason"), col=col, path=(*path, "reason"))
    severity = _rule_severity(rule, rtype, col=col, path=path)
    suffix = _rule_suffix(rule, col=col, path=path)
    provenance = _rule_provenance(rule, col=col, path=path)
    fallback = _rule_fallback(rule, col=col, path=path)
    max_level = _rule_max_level(rule, col=col, path=path)
    where = _check_where(rule["where"], col=col, path=(*path, "where")) if "where" in rule else ()
    threshold = _check_threshold(rule["threshold"], col=col, path=(*path, "threshold")) if "threshold" in rule else None
    device = check_device(rule["device"], col=col, path=(*path, "device")) if "device" in rule else None
    return RuleSpec(
        name=name,
        explicit_name=explicit,
        enabled=True,
        file=col.file,
        index=path[1],
        path=path,
        source=source,
        buffer_size=buffer_size,
        ok=len(col) == before,
        type=rtype,
        condition=condition,
        pattern=pattern,
        reason=reason,
        reason_fields=reason_fields,
        severity=severity,
        suffix=suffix,
        where=where,
        threshold=threshold,
        key_values=key_values,
        field_types=field_types,
        provenance=provenance,
        fallback=fallback,
        device=device,
        max_level=max_level,
    )


def _rule_type(rule: Mapping[str, Any], *, col: Problems, path: tuple) -> RuleType:
    try:
        return RuleType(str(rule.get("type")))
    except ValueError:
        col.add((*path, "type"), f"must be 'temporary' or 'permanent', got {rule.get('type')!r}")
        return RuleType.TEMPORARY


def _rule_condition(rule: Mapping[str, Any], rtype: RuleType, *, col: Problems, path: tuple) -> str | None:
    """The condition a permanent rule sets (required there, refused on a temporary rule)."""
    condition = rule.get("condition")
    if rtype is RuleType.PERMANENT:
        if not isinstance(condition, str) or not condition:
            col.add((*path, "condition"), "required for a permanent rule")
            return None
        return condition
    if condition not in (None, ""):
        col.add((*path, "condition"), "only permanent rules set a condition; remove it or use type: permanent")
    return None


def _rule_pattern(rule: Mapping[str, Any], *, col: Problems, path: tuple) -> str | None:
    pattern = rule.get("pattern")
    if pattern == "":
        col.add(
            (*path, "pattern"),
            "must not be empty: node-problem-detector accepts an empty pattern and fires it on every line",
        )
        return None
    if not isinstance(pattern, str):
        col.add((*path, "pattern"), "required: a regular expression")
        return None
    return pattern


def _rule_key_values(rule: Mapping[str, Any], *, col: Problems, path: tuple) -> tuple[str, ...]:
    if "keyValues" not in rule:
        return ()
    kv = rule["keyValues"]
    if not isinstance(kv, list) or not all(isinstance(k, str) and k for k in kv):
        col.add((*path, "keyValues"), "must be a list of key names, e.g. ['nd-id', 'nc-id']")
        return ()
    return tuple(kv)


def _rule_field_types(rule: Mapping[str, Any], *, col: Problems, path: tuple) -> dict[str, str]:
    field_types: dict[str, str] = {}
    if "fieldTypes" not in rule:
        return field_types
    ft = rule["fieldTypes"]
    if not isinstance(ft, dict):
        col.add((*path, "fieldTypes"), "must be a mapping of field name to int, hex or str")
        return field_types
    for fname, ftype in ft.items():
        if not isinstance(ftype, str) or ftype not in FIELD_TYPES:
            col.add((*path, "fieldTypes", fname), f"must be one of int, hex, str, got {ftype!r}")
        else:
            field_types[str(fname)] = ftype
    return field_types


def _rule_severity(rule: Mapping[str, Any], rtype: RuleType, *, col: Problems, path: tuple) -> Severity:
    default = Severity.ERROR if rtype is RuleType.PERMANENT else Severity.WARNING
    try:
        return Severity(rule.get("severity", default.value))
    except ValueError:
        col.add((*path, "severity"), f"must be one of {', '.join(s.value for s in Severity)}")
        return default


def _rule_suffix(rule: Mapping[str, Any], *, col: Problems, path: tuple) -> str:
    suffix = rule.get("patternGeneratedMessageSuffix", "")
    if not isinstance(suffix, str):
        col.add((*path, "patternGeneratedMessageSuffix"), "must be a string")
        return ""
    return suffix


def _rule_provenance(rule: Mapping[str, Any], *, col: Problems, path: tuple) -> tuple[str, ...]:
    if "provenance" not in rule:
        return ()
    raw = rule["provenance"]
    raw = [raw] if isinstance(raw, str) else raw
    if not isinstance(raw, list) or not raw or not all(isinstance(s, str) and s.strip() for s in raw):
        col.add(
            (*path, "provenance"),
            "must name where the message is printed: 'repository:path: format string' (or a list of them)",
        )
        return ()
    return tuple(raw)


def _rule_fallback(rule: Mapping[str, Any], *, col: Problems, path: tuple) -> bool:
    fallback = rule.get("fallback", False)
    if not isinstance(fallback, bool):
        col.add((*path, "fallback"), "must be true or false")
        return False
    return fallback


# The kernel's levels (include/linux/kern_levels.h): a rule's maxLevel is a number 0-7 or one of these names.
KERNEL_LEVELS = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")


def _rule_max_level(rule: Mapping[str, Any], *, col: Problems, path: tuple) -> int | None:
    if "maxLevel" not in rule:
        return None
    level = rule["maxLevel"]
    if isinstance(level, str) and level in KERNEL_LEVELS:
        return KERNEL_LEVELS.index(level)
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 7:
        col.add(
            (*path, "maxLevel"),
            f"must be a kernel level: 0-7 or one of {', '.join(KERNEL_LEVELS)} (0 = emerg, 3 = err), got {level!r}",
        )
        return None
    return level


def _disabled(*, name: str, explicit: bool, file: str, path: tuple, ok: bool) -> RuleSpec:
    """The spec of ``{name: X, enabled: false}``: only its identity matters."""
    return RuleSpec(
        name=name,
        explicit_name=explicit,
        enabled=False,
        file=file,
        index=path[1],
        path=path,
        source="",
        buffer_size=DEFAULT_BUFFER_SIZE,
        ok=ok,
        type=RuleType.TEMPORARY,
        condition=None,
        pattern=None,
        reason=None,
        reason_fields=(),
        severity=Severity.WARNING,
        suffix="",
        where=(),
        threshold=None,
        key_values=(),
        field_types={},
    )


DEVICE_FORMAT = "{kind: gpu|neuron|rdma, field: <field name> or [<field names>]}"


def check_device(raw: Any, *, col: Problems, path: tuple) -> DeviceField | None:
    """A rule's ``device``: ``{kind, field}``, the kind of device and the field(s) that name it."""
    if not isinstance(raw, dict):
        col.add(path, f"must be a mapping {DEVICE_FORMAT}")
        return None
    _unknown_keys(raw, known=frozenset({"kind", "field"}), path=path, col=col)
    kinds = ", ".join(k.value for k in DeviceKind)
    try:
        kind: DeviceKind | None = DeviceKind(str(raw.get("kind")))
    except ValueError:
        col.add((*path, "kind"), f"required: one of {kinds}, got {raw.get('kind')!r}")
        kind = None
    names = raw.get("field")
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        col.add((*path, "field"), "required: the field (or a list of fields, first present wins) naming the device")
        return None
    return DeviceField(kind=kind, fields=tuple(names)) if kind is not None else None


def _check_reason(reason: Any, *, col: Problems, path: tuple) -> tuple[str | None, tuple[str, ...]]:
    if not isinstance(reason, str) or not reason or not _REASON_RE.match(reason):
        col.add(path, "required: a CamelCase reason (letters, digits, _.:- and {field} templates)")
        return None, ()
    try:
        parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(reason) if f is not None]
    except ValueError as exc:
        col.add(path, f"invalid template: {exc}")
        return None, ()
    if any(spec or conv for _, spec, conv in parsed):
        col.add(path, "templates take plain field names only, e.g. GpuXid{xid} (no :format or !conversion)")
        return None, ()
    return reason, tuple(f for f, _, _ in parsed)


def _check_where(raw: Any, *, col: Problems, path: tuple) -> tuple[WhereSpec, ...]:
    if not isinstance(raw, dict) or not raw:
        col.add(path, "must map field names to a list, a list name, or {in: ..} / {notIn: ..}")
        return ()
    out: list[WhereSpec] = []
    for fname, cond in raw.items():
        wpath = (*path, fname)
        negate = False
        if isinstance(cond, dict):
            if set(cond) == {"in"}:
                cond = cond["in"]
            elif set(cond) == {"notIn"}:
                cond, negate = cond["notIn"], True
            else:
                col.add(wpath, "use exactly one of 'in' or 'notIn'")
                continue
        if not isinstance(cond, str) and as_values(cond) is None:
            col.add(wpath, "must be a list of values or the name of a list from 'lists'")
            continue
        value = cond if isinstance(cond, str) else tuple(cond)
        out.append(WhereSpec(field=str(fname), path=wpath, value=value, negate=negate))
    return tuple(out)


def _check_threshold(value: Any, *, col: Problems, path: tuple) -> Threshold | None:
    if not isinstance(value, dict):
        col.add(path, "must be a mapping {count, window, by}")
        return None
    ok = True
    for key in value:
        if key not in {"count", "window", "by"}:
            col.add((*path, key), "unknown key (known: count, window, by)")
            ok = False
    count = value.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        col.add((*path, "count"), "required: an integer >= 1")
        ok = False
    window = 0.0
    try:
        window = parse_duration(value.get("window"))
        if window <= 0:
            raise ValueError("must be greater than 0")
    except ValueError as exc:
        col.add((*path, "window"), str(exc))
        ok = False
    by = value.get("by", [])
    if isinstance(by, str):
        by = [by]
    if not isinstance(by, list) or not all(isinstance(b, str) for b in by):
        col.add((*path, "by"), "must be a list of field names")
        ok = False
    return Threshold(count=count, window=window, by=tuple(by)) if ok and isinstance(count, int) else None
