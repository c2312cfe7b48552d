"""Compilation of a shape-checked rule: its pattern (RE2), the fields it refers to, the lists and
conditions it names (from any loaded file), and the literals the fast matcher needs."""

from __future__ import annotations

import re
from collections.abc import Mapping

from agent.core.bounds import MAX_REASON
from agent.core.configdoc import Problems
from agent.core.patterns import compile_anchored
from agent.core.regex import PatternError, can_span_lines, required_literals, required_runs
from agent.core.types import ConditionSpec, RuleType
from agent.detectors.model import CompiledRule, FieldFilter
from agent.detectors.schema import RuleSpec, WhereSpec, as_values

_LIST_NAME_RE = re.compile(r"^[A-Za-z][\w-]*(?:\.[\w-]+)+$")  # e.g. nvidia.xid.node


def compile_rule(
    spec: RuleSpec,
    *,
    col: Problems,
    lists: Mapping[str, tuple[str, ...]],
    conditions: Mapping[str, ConditionSpec],
) -> CompiledRule | None:
    """The compiled rule, or None when it (or its shape, ``spec.ok``) has a problem, reported to ``col``."""
    before = len(col)
    path = spec.path
    _check_reason_length(spec, col=col)
    if spec.type is RuleType.PERMANENT and spec.condition is not None and spec.condition not in conditions:
        col.add(
            (*path, "condition"),
            f"condition {spec.condition!r} is not declared in any 'conditions' list "
            f"(declared: {', '.join(sorted(conditions)) or 'none'})",
        )

    regex = None
    if spec.pattern is not None:
        try:
            regex = compile_anchored(spec.pattern)
        except PatternError as exc:
            col.add((*path, "pattern"), str(exc))

    where: list[FieldFilter] = []
    if regex is not None:  # field names come from the pattern: without one, nothing to check them against
        fields = set(regex.groupindex) | {k.replace("-", "_") for k in spec.key_values}
        for fname in spec.field_types:
            if fname not in fields:
                col.add((*path, "fieldTypes", fname), _unknown_field(fname, fields))
        for ref in dict.fromkeys(spec.reason_fields):
            if ref not in fields:
                col.add((*path, "reason"), _unknown_field(ref, fields))
        for entry in spec.where:
            if entry.field not in fields:
                col.add(entry.path, _unknown_field(entry.field, fields))
                continue
            values = _resolve_values(entry, lists=lists, col=col)
            if values is not None:
                where.append(FieldFilter(field=entry.field, values=frozenset(values), negate=entry.negate))
        if spec.threshold is not None:
            for b in spec.threshold.by:
                if b not in fields:
                    col.add((*path, "threshold", "by"), _unknown_field(b, fields))
        _check_device_fields(spec, fields, col=col)

    multiline = _check_multiline(spec, col=col)
    if len(col) > before or not spec.ok or regex is None or spec.reason is None or spec.pattern is None:
        return None
    return CompiledRule(
        name=spec.name,
        file=spec.file,
        index=spec.index,
        source=spec.source,
        type=spec.type,
        condition=spec.condition,
        reason=spec.reason,
        severity=spec.severity,
        pattern=spec.pattern,
        regex=regex,
        buffer_size=spec.buffer_size,
        multiline=multiline,
        window=spec.buffer_size if multiline else 1,
        literals=required_literals(spec.pattern),
        requires=required_runs(spec.pattern),
        suffix=spec.suffix,
        where=tuple(where),
        threshold=spec.threshold,
        key_values=spec.key_values,
        field_types=dict(spec.field_types),
        provenance=spec.provenance,
        fallback=spec.fallback,
        device=spec.device,
        max_level=spec.max_level,
    )


def _check_reason_length(spec: RuleSpec, *, col: Problems) -> None:
    if spec.reason is not None and len(spec.reason) > MAX_REASON:
        col.add(
            (*spec.path, "reason"),
            f"{len(spec.reason)} characters; a reason is at most {MAX_REASON} "
            "(the Kubernetes limit on an Event's reason)",
        )


def _check_multiline(spec: RuleSpec, *, col: Problems) -> bool:
    """Whether the rule can match across lines; a ``maxLevel`` is only for a rule that cannot."""
    multiline = spec.pattern is not None and spec.buffer_size > 1 and can_span_lines(spec.pattern)
    if spec.max_level is not None and multiline:
        col.add(
            (*spec.path, "maxLevel"),
            "applies to a rule that matches one line: this pattern can match across the pack's "
            f"bufferSize ({spec.buffer_size}) lines, whose records may have different levels",
        )
    return multiline


def _check_device_fields(spec: RuleSpec, fields: set[str], *, col: Problems) -> None:
    for name in spec.device.fields if spec.device is not None else ():
        if name not in fields:
            col.add((*spec.path, "device", "field"), _unknown_field(name, fields))


def _unknown_field(name: str, known: set[str]) -> str:
    return (
        f"unknown field {name!r}: fields are the pattern's named groups (?P<name>...) and keyValues "
        f"(known: {', '.join(sorted(known)) or 'none'})"
    )


def _resolve_values(entry: WhereSpec, *, lists: Mapping[str, tuple[str, ...]], col: Problems) -> list[str] | None:
    """Values of a ``where`` entry: list names (``'nvidia.xid.node'`` or a list of names) or literal values.

    A list mixing known list names with other strings, or a dotted name that is not defined, is
    reported as an unknown list rather than silently treated as literal values.
    """
    value = entry.value
    if isinstance(value, str):
        names: tuple[str, ...] = (value,)
    elif value and all(isinstance(v, str) for v in value) and _names_lists(value, lists):
        names = tuple(str(v) for v in value)
    else:
        return list(as_values(list(value)) or ())
    missing = [n for n in names if n not in lists]
    if missing:
        col.add(entry.path, f"unknown list {missing[0]!r} (defined lists: {', '.join(sorted(lists)) or 'none'})")
        return None
    return [v for n in names for v in lists[n]]


def _names_lists(values: tuple[str | int, ...], lists: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether strings are meant as list names: one of them is a list, or all look like list names."""
    return any(v in lists for v in values) or all(_LIST_NAME_RE.match(str(v)) for v in values)
