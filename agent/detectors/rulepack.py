"""Rule packs: load node-problem-detector system-log-monitor configs into a ``RuleSet``.

A rule pack is a JSON or YAML file in NPD's ``system-log-monitor`` schema, so an existing
``kernel-monitor.json`` works unchanged. Extensions (all optional) are documented in
``docs/rule-packs.md``: rule ``name``, ``severity``, ``where``, ``threshold``, ``keyValues``,
``fieldTypes``, ``enabled``, ``{field}`` templates in ``reason``; condition ``clearAfter``;
top-level ``lists`` (named value lists that later files may override).

Packs are applied in order: a later rule with the same ``name`` replaces the earlier one in
place (``enabled: false`` removes it), a later condition with the same ``type`` replaces its
defaults, a later list with the same name replaces it. Every problem found is reported with the
file, the field path and the line before anything else runs.

The steps live in their own modules: ``packfile`` (finding and reading files), ``schema`` (the
shape of one file), ``compiler`` (patterns and references), ``model`` (the result).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from agent.core.configdoc import PACK_SUFFIXES, Document, Problems
from agent.core.errors import ConfigError, ConfigProblem
from agent.core.types import ConditionSpec
from agent.detectors.compiler import compile_rule
from agent.detectors.model import CompiledRule, FieldFilter, RuleSet, Threshold
from agent.detectors.schema import DEFAULT_BUFFER_SIZE, MAX_BUFFER_SIZE, PackSpec, RuleSpec, check_pack

__all__ = [
    "DEFAULT_BUFFER_SIZE",
    "MAX_BUFFER_SIZE",
    "PACK_SUFFIXES",
    "CompiledRule",
    "FieldFilter",
    "RuleSet",
    "Threshold",
    "compile_rule_packs",
]


def compile_rule_packs(packs: Sequence[tuple[Path, Document]], *, problems: Sequence[ConfigProblem] = ()) -> RuleSet:
    """Validate and compile parsed rule packs in order. Raises ConfigError listing every problem
    (``problems`` found earlier included)."""
    problems = list(problems)
    checked: list[tuple[Problems, PackSpec]] = []
    conditions: dict[str, ConditionSpec] = {}
    lists: dict[str, tuple[str, ...]] = {}
    for path, doc in packs:
        col = Problems(file=str(path), doc=doc)
        pack = check_pack(col)
        for cond in pack.conditions:
            conditions[cond.type] = cond
        lists.update(pack.lists)
        checked.append((col, pack))

    # Conditions and lists of every file are known before any rule refers to them.
    ordered: dict[str, CompiledRule | None] = {}
    replaced: list[tuple[str, str]] = []
    covered: list[tuple[str, str]] = []
    for col, pack in checked:
        claimed: set[tuple] = set()  # (type, condition, reason) of this file's unnamed rules
        for spec in pack.rules:
            if not spec.enabled:
                ordered[spec.name] = None
                continue
            if not spec.explicit_name:
                if spec.name in ordered:
                    # An unnamed rule never replaces another file's rule by name...
                    spec = dataclasses.replace(spec, name=f"{spec.file}:{spec.index}")
                key = (spec.type, spec.condition, spec.reason)
                if (by := _covered_by(ordered, spec)) is not None:
                    # One rule of an earlier file already gives this reason from a template (neuron/hw-error:
                    # NeuronHasError_{error}): loading this one too would raise the problem twice per line.
                    covered.append((f"{spec.file}:{spec.index}", by))
                    continue
                if key not in claimed:
                    # ...but by reason: node-problem-detector's files (no names) given after the built-in packs
                    # take the place of the earlier rules of the same type, condition and reason, so one kernel
                    # line never raises the same problem twice (docs/rule-packs.md).
                    claimed.add(key)
                    for name, rule in ordered.items():
                        if rule is not None and rule.file != spec.file and _key(rule) == key:
                            ordered[name] = None
                            replaced.append((name, spec.file))
            compiled = compile_rule(spec, col=col, lists=lists, conditions=conditions)
            if compiled is not None:
                ordered[spec.name] = compiled
        problems.extend(col.problems)
    if problems:
        raise ConfigError(problems)
    rules = tuple(r for r in ordered.values() if r is not None)
    return RuleSet(
        rules=rules,
        conditions=tuple(conditions.values()),
        files=tuple(str(path) for path, _ in packs),
        max_window=max((r.window for r in rules), default=1),
        replaced=tuple(replaced),
        covered=tuple(covered),
    )


def _covered_by(ordered: dict[str, CompiledRule | None], spec: RuleSpec) -> str | None:
    """The earlier rule (of another file) whose reason *template* gives ``spec``'s literal reason on the same
    type and condition, if any."""
    if not isinstance(spec.reason, str) or "{" in spec.reason:
        return None
    for name, rule in ordered.items():
        if rule is None or rule.file == spec.file or "{" not in str(rule.reason):
            continue
        if (rule.type, rule.condition) != (spec.type, spec.condition):
            continue
        pattern = "".join(
            ".+" if part.startswith("{") else re.escape(part) for part in re.split(r"(\{[^}]*\})", rule.reason) if part
        )
        if re.fullmatch(pattern, spec.reason):
            return name
    return None


def _key(rule: CompiledRule) -> tuple:
    return (rule.type, rule.condition, rule.reason)
