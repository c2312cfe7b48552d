"""Rule packs: load, validate and compile node-problem-detector system-log-monitor configs.

A rule pack is a JSON or YAML file in NPD's ``system-log-monitor`` schema, so an existing
``kernel-monitor.json`` works unchanged. Extensions (all optional) are documented in
``docs/rule-packs.md``: rule ``name``, ``severity``, ``where``, ``threshold``, ``keyValues``,
``fieldTypes``, ``enabled``, ``{field}`` templates in ``reason``; condition ``clearAfter``;
top-level ``lists`` (named value lists that later files may override).

Packs are applied in order: a later rule with the same ``name`` replaces the earlier one in
place (``enabled: false`` removes it), a later condition with the same ``type`` replaces its
defaults, a later list with the same name replaces it. Every problem found is reported with the
file, the field path and the line (YAML) before anything else runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.detectors.regex import PatternError, can_span_lines, compile_anchored, required_literals, required_runs
from agent.durations import parse_duration
from agent.errors import ConfigError, ConfigProblem
from agent.types import ConditionSpec, RuleType, Severity

PACK_SUFFIXES = (".json", ".yaml", ".yml")
DEFAULT_BUFFER_SIZE = 10
MAX_BUFFER_SIZE = 1000

_TOP_KEYS = {
    "plugin",
    "pluginConfig",
    "logPath",
    "lookback",
    "delay",
    "skipList",
    "bufferSize",
    "source",
    "metricsReporting",
    "conditions",
    "rules",
    "lists",
}
_RULE_KEYS = {
    "type",
    "condition",
    "reason",
    "pattern",
    "patternGeneratedMessageSuffix",
    "name",
    "severity",
    "where",
    "threshold",
    "keyValues",
    "fieldTypes",
    "enabled",
}
_CONDITION_KEYS = {"type", "reason", "message", "clearAfter", "accelerator"}
_FIELD_TYPES = {"int", "hex", "str"}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:/-]+$")
_REASON_RE = re.compile(r"^[A-Za-z0-9_.:{}-]+$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Threshold:
    """Fire only once ``count`` matches with the same ``by`` fields happened within ``window`` seconds."""

    count: int
    window: float
    by: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldFilter:
    field: str
    values: frozenset[str]
    negate: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class CompiledRule:
    name: str
    file: str
    index: int
    source: str
    type: RuleType
    condition: str | None
    reason: str  # may contain {field} placeholders
    severity: Severity
    pattern: str
    regex: re.Pattern[str]
    buffer_size: int  # the pack's bufferSize: NPD matches over this many lines
    multiline: bool  # False when the pattern provably cannot match across lines
    window: int  # lines the fast matcher joins: buffer_size if multiline else 1
    literals: tuple[str, ...] | None  # one of these occurs in every match; None = unknown
    requires: tuple[str, ...]  # all of these occur in every match (may be empty)
    suffix: str
    where: tuple[FieldFilter, ...]
    threshold: Threshold | None
    key_values: tuple[str, ...]
    field_types: Mapping[str, str]


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleSet:
    rules: tuple[CompiledRule, ...]
    conditions: tuple[ConditionSpec, ...]
    files: tuple[str, ...]
    max_window: int

    def condition_spec(self, type_: str) -> ConditionSpec | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every literal (template-free) reason, for initialising metrics."""
        return tuple(dict.fromkeys(r.reason for r in self.rules if "{" not in r.reason))


def discover(paths: Iterable[Path]) -> list[Path]:
    """Expand directories (recursively, sorted) into rule pack files; files are kept as given."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(p for p in sorted(path.rglob("*")) if p.suffix in PACK_SUFFIXES and p.is_file())
        else:
            found.append(path)
    return found


# --------------------------------------------------------------------------------------------
# Reading files (with line numbers for YAML)


class _Doc:
    """Parsed document plus a map from field path to line number."""

    def __init__(self, *, data: Any, lines: Mapping[tuple, int]) -> None:
        self.data = data
        self.lines = lines

    def line(self, path: tuple) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)


def _collect_lines(node: yaml.Node, path: tuple, lines: dict[tuple, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, getattr(key_node, "value", None))
            _collect_lines(value_node, child, lines)
            lines[child] = key_node.start_mark.line + 1  # a problem with a field points at its key
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_lines(item, (*path, i), lines)


def _line_map(text: str) -> dict[tuple, int]:
    lines: dict[tuple, int] = {}
    try:
        # Tabs are whitespace in JSON but not YAML indentation; expanding them keeps every line.
        node = yaml.compose(text.expandtabs(), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines
    if node is not None:
        _collect_lines(node, (), lines)
    return lines


def _read(path: Path) -> tuple[_Doc | None, list[ConfigProblem]]:
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [ConfigProblem(file=name, field="", message=f"cannot read file: {exc}")]
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, [ConfigProblem(file=name, field="", message=f"invalid JSON: {exc.msg}", line=exc.lineno)]
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            return None, [
                ConfigProblem(
                    file=name, field="", message=f"invalid YAML: {problem}", line=mark.line + 1 if mark else None
                )
            ]
    # JSON is (almost always) YAML too, so one composer gives line numbers for both.
    return _Doc(data={} if data is None else data, lines=_line_map(text)), []


# --------------------------------------------------------------------------------------------
# Validation


def _fmt_path(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Collector:
    def __init__(self, *, file: str, doc: _Doc) -> None:
        self.file = file
        self.doc = doc
        self.problems: list[ConfigProblem] = []

    def add(self, path: tuple, message: str) -> None:
        self.problems.append(
            ConfigProblem(file=self.file, field=_fmt_path(path), message=message, line=self.doc.line(path))
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class _RawRule:
    """A validated rule before cross-file resolution (lists, conditions, overrides)."""

    name: str
    file: str
    index: int
    source: str
    buffer_size: int
    spec: Mapping[str, Any]
    path: tuple
    line: int | None
    explicit_name: bool


def _as_list_values(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
        return [str(v) for v in value]
    return None


def _check_pack(col: _Collector) -> tuple[list[_RawRule], list[ConditionSpec], dict[str, list[str]]]:
    data = col.doc.data
    rules: list[_RawRule] = []
    conditions: list[ConditionSpec] = []
    lists: dict[str, list[str]] = {}
    if not isinstance(data, dict):
        col.add((), "expected a mapping with 'rules' (node-problem-detector system-log-monitor schema)")
        return rules, conditions, lists
    for key in data:
        if key not in _TOP_KEYS:
            col.add((key,), f"unknown key {key!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    plugin = data.get("plugin", "kmsg")
    if plugin != "kmsg":
        col.add(("plugin",), f"plugin {plugin!r} is not supported: rule packs read the kernel log ('kmsg')")
    source = data.get("source", Path(col.file).stem)
    if not isinstance(source, str) or not source:
        col.add(("source",), "must be a non-empty string")
        source = Path(col.file).stem
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

    raw_lists = data.get("lists", {})
    if not isinstance(raw_lists, dict):
        col.add(("lists",), "must be a mapping of list name to a list of values")
    else:
        for lname, values in raw_lists.items():
            parsed = _as_list_values(values)
            if not isinstance(lname, str) or parsed is None:
                col.add(("lists", lname), "must be a list of strings or integers")
            else:
                lists[lname] = parsed

    raw_conditions = data.get("conditions", [])
    if not isinstance(raw_conditions, list):
        col.add(("conditions",), "must be a list of {type, reason, message}")
        raw_conditions = []
    for i, cond in enumerate(raw_conditions):
        path = ("conditions", i)
        if not isinstance(cond, dict):
            col.add(path, "must be a mapping with type, reason and message")
            continue
        for key in cond:
            if key not in _CONDITION_KEYS:
                col.add((*path, key), f"unknown key {key!r} (known: {', '.join(sorted(_CONDITION_KEYS))})")
        ok = True
        for key in ("type", "reason"):
            if not isinstance(cond.get(key), str) or not _NAME_RE.match(cond.get(key) or ""):
                col.add((*path, key), "required: a non-empty name of letters, digits and _.:/-")
                ok = False
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
                )
            )

    raw_rules = data.get("rules")
    if raw_rules is None:
        col.add(("rules",), "required: a list of rules")
        raw_rules = []
    elif not isinstance(raw_rules, list):
        col.add(("rules",), "must be a list of rules")
        raw_rules = []
    for i, rule in enumerate(raw_rules):
        path = ("rules", i)
        if not isinstance(rule, dict):
            col.add(path, "must be a mapping with type, reason and pattern")
            continue
        explicit = "name" in rule
        name = rule.get("name", f"{source}:{i}")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            col.add((*path, "name"), "must be a name of letters, digits and _.:/-")
            continue
        rules.append(
            _RawRule(
                name=name,
                file=col.file,
                index=i,
                source=source,
                buffer_size=buffer_size,
                spec=rule,
                path=path,
                line=col.doc.line(path),
                explicit_name=explicit,
            )
        )
    return rules, conditions, lists


def _compile_rule(
    raw: _RawRule, *, col: _Collector, lists: Mapping[str, list[str]], conditions: Mapping[str, ConditionSpec]
) -> CompiledRule | None:
    spec, path = raw.spec, raw.path
    errors_before = len(col.problems)
    for key in spec:
        if key not in _RULE_KEYS:
            col.add((*path, key), f"unknown key {key!r} (known: {', '.join(sorted(_RULE_KEYS))})")

    try:
        rtype = RuleType(spec.get("type"))
    except ValueError:
        col.add((*path, "type"), f"must be 'temporary' or 'permanent', got {spec.get('type')!r}")
        rtype = RuleType.TEMPORARY

    condition = spec.get("condition")
    if rtype is RuleType.PERMANENT:
        if not isinstance(condition, str) or not condition:
            col.add((*path, "condition"), "required for a permanent rule")
        elif condition not in conditions:
            col.add(
                (*path, "condition"),
                f"condition {condition!r} is not declared in any 'conditions' list "
                f"(declared: {', '.join(sorted(conditions)) or 'none'})",
            )
    elif condition not in (None, ""):
        col.add((*path, "condition"), "only permanent rules set a condition; remove it or use type: permanent")
    condition = condition if rtype is RuleType.PERMANENT else None

    pattern = spec.get("pattern")
    regex = None
    if not isinstance(pattern, str) or not pattern:
        col.add((*path, "pattern"), "required: a regular expression")
        pattern = ""
    else:
        try:
            regex = compile_anchored(pattern)
        except PatternError as exc:
            col.add((*path, "pattern"), f"invalid regular expression: {exc}")

    groups = set(regex.groupindex) if regex is not None else set()

    key_values: tuple[str, ...] = ()
    if "keyValues" in spec:
        kv = spec["keyValues"]
        if not isinstance(kv, list) or not all(isinstance(k, str) and k for k in kv):
            col.add((*path, "keyValues"), "must be a list of key names, e.g. ['nd-id', 'nc-id']")
        else:
            key_values = tuple(kv)
    fields_known = groups | {k.replace("-", "_") for k in key_values}

    field_types: dict[str, str] = {}
    if "fieldTypes" in spec:
        ft = spec["fieldTypes"]
        if not isinstance(ft, dict):
            col.add((*path, "fieldTypes"), "must be a mapping of field name to int, hex or str")
        else:
            for fname, ftype in ft.items():
                if ftype not in _FIELD_TYPES:
                    col.add((*path, "fieldTypes", fname), f"must be one of int, hex, str, got {ftype!r}")
                elif fname not in fields_known:
                    col.add((*path, "fieldTypes", fname), _unknown_field(fname, fields_known))
                else:
                    field_types[fname] = ftype

    reason = spec.get("reason")
    if not isinstance(reason, str) or not reason or not _REASON_RE.match(reason):
        col.add((*path, "reason"), "required: a CamelCase reason (letters, digits, _.:- and {field} templates)")
        reason = ""
    else:
        try:
            parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(reason) if f is not None]
        except ValueError as exc:
            col.add((*path, "reason"), f"invalid template: {exc}")
            parsed = []
        if any(spec or conv for _, spec, conv in parsed):
            col.add(
                (*path, "reason"), "templates take plain field names only, e.g. GpuXid{xid} (no :format or !conversion)"
            )
        refs = [f for f, _, _ in parsed]
        for ref in refs:
            if ref not in fields_known:
                col.add((*path, "reason"), _unknown_field(ref, fields_known))

    default_severity = Severity.ERROR if rtype is RuleType.PERMANENT else Severity.WARNING
    try:
        severity = Severity(spec.get("severity", default_severity.value))
    except ValueError:
        col.add((*path, "severity"), f"must be one of {', '.join(s.value for s in Severity)}")
        severity = default_severity

    suffix = spec.get("patternGeneratedMessageSuffix", "")
    if not isinstance(suffix, str):
        col.add((*path, "patternGeneratedMessageSuffix"), "must be a string")
        suffix = ""

    where: list[FieldFilter] = []
    if "where" in spec:
        raw_where = spec["where"]
        if not isinstance(raw_where, dict) or not raw_where:
            col.add((*path, "where"), "must map field names to a list, a list name, or {in: ..} / {notIn: ..}")
        else:
            for fname, cond in raw_where.items():
                wpath = (*path, "where", fname)
                if fname not in fields_known:
                    col.add(wpath, _unknown_field(fname, fields_known))
                    continue
                negate = False
                if isinstance(cond, dict):
                    if set(cond) == {"in"}:
                        cond = cond["in"]
                    elif set(cond) == {"notIn"}:
                        cond, negate = cond["notIn"], True
                    else:
                        col.add(wpath, "use exactly one of 'in' or 'notIn'")
                        continue
                values = _resolve_values(cond, lists=lists, col=col, path=wpath)
                if values is not None:
                    where.append(FieldFilter(field=fname, values=frozenset(values), negate=negate))

    threshold = None
    if "threshold" in spec:
        threshold = _threshold(spec["threshold"], col=col, path=(*path, "threshold"), fields=fields_known)

    if "enabled" in spec and not isinstance(spec["enabled"], bool):
        col.add((*path, "enabled"), "must be true or false")

    if len(col.problems) > errors_before or regex is None:
        return None
    multiline = raw.buffer_size > 1 and can_span_lines(pattern)
    return CompiledRule(
        name=raw.name,
        file=raw.file,
        index=raw.index,
        source=raw.source,
        type=rtype,
        condition=condition,
        reason=reason,
        severity=severity,
        pattern=pattern,
        regex=regex,
        buffer_size=raw.buffer_size,
        multiline=multiline,
        window=raw.buffer_size if multiline else 1,
        literals=required_literals(pattern),
        requires=required_runs(pattern),
        suffix=suffix,
        where=tuple(where),
        threshold=threshold,
        key_values=key_values,
        field_types=field_types,
    )


def _unknown_field(name: str, known: set[str]) -> str:
    return (
        f"unknown field {name!r}: fields are the pattern's named groups (?P<name>...) and keyValues "
        f"(known: {', '.join(sorted(known)) or 'none'})"
    )


_LIST_NAME_RE = re.compile(r"^[A-Za-z][\w-]*(?:\.[\w-]+)+$")  # e.g. nvidia.xid.node


def _resolve_values(value: Any, *, lists: Mapping[str, list[str]], col: _Collector, path: tuple) -> list[str] | None:
    """Values of a ``where`` entry: list names (``'nvidia.xid.node'`` or a list of names) or literal values.

    A list mixing known list names with other strings, or a dotted name that is not defined, is
    reported as an unknown list rather than silently treated as literal values.
    """
    names = [value] if isinstance(value, str) else None
    strings = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    if strings and (any(v in lists for v in value) or all(_LIST_NAME_RE.match(v) for v in value)):
        names = value
    if names is not None:
        missing = [n for n in names if n not in lists]
        if missing:
            col.add(path, f"unknown list {missing[0]!r} (defined lists: {', '.join(sorted(lists)) or 'none'})")
            return None
        return [v for n in names for v in lists[n]]
    values = _as_list_values(value)
    if values is None:
        col.add(path, "must be a list of values or the name of a list from 'lists'")
    return values


def _threshold(value: Any, *, col: _Collector, path: tuple, fields: set[str]) -> Threshold | None:
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
    else:
        for b in by:
            if b not in fields:
                col.add((*path, "by"), _unknown_field(b, fields))
                ok = False
    return Threshold(count=count, window=window, by=tuple(by)) if ok else None


def _disable(raw: _RawRule, *, col: _Collector, ordered: dict[str, CompiledRule | None]) -> None:
    """``{name: X, enabled: false}`` switches off rule X loaded earlier; nothing else is required."""
    if not raw.explicit_name:
        col.add((*raw.path, "enabled"), "a disabled rule needs the 'name' of the rule it switches off")
        return
    for key in raw.spec:
        if key not in _RULE_KEYS:
            col.add((*raw.path, key), f"unknown key {key!r} (known: {', '.join(sorted(_RULE_KEYS))})")
    ordered[raw.name] = None


def load_rule_set(paths: Sequence[Path]) -> RuleSet:
    """Load, validate and compile rule packs in order. Raises ConfigError listing every problem."""
    problems: list[ConfigProblem] = []
    files = discover(paths)
    if not files:
        problems.append(
            ConfigProblem(file=", ".join(map(str, paths)) or "(none)", field="", message="no rule pack files found")
        )
    collected: list[tuple[_Collector, list[_RawRule]]] = []
    conditions: dict[str, ConditionSpec] = {}
    lists: dict[str, list[str]] = {}
    for path in files:
        doc, read_problems = _read(path)
        problems.extend(read_problems)
        if doc is None:
            continue
        col = _Collector(file=str(path), doc=doc)
        raw_rules, conds, file_lists = _check_pack(col)
        names_here: dict[str, int] = {}
        for raw in raw_rules:
            if raw.name in names_here:
                col.add((*raw.path, "name"), f"duplicate rule name {raw.name!r} (also rules[{names_here[raw.name]}])")
            names_here[raw.name] = raw.index
        for cond in conds:
            conditions[cond.type] = cond
        lists.update(file_lists)
        collected.append((col, raw_rules))

    ordered: dict[str, CompiledRule | None] = {}
    for col, raw_rules in collected:
        for raw in raw_rules:
            if raw.spec.get("enabled", True) is False:
                _disable(raw, col=col, ordered=ordered)
                continue
            if not raw.explicit_name and raw.name in ordered:
                # Only explicit names override: an unnamed rule never replaces another file's rule.
                raw = dataclasses.replace(raw, name=f"{raw.file}:{raw.index}")
            compiled = _compile_rule(raw, col=col, lists=lists, conditions=conditions)
            if compiled is not None:
                ordered[raw.name] = compiled
        problems.extend(col.problems)
    if problems:
        raise ConfigError(problems)
    rules = tuple(r for r in ordered.values() if r is not None)
    return RuleSet(
        rules=rules,
        conditions=tuple(conditions.values()),
        files=tuple(str(f) for f in files),
        max_window=max((r.window for r in rules), default=1),
    )
