"""How a policy file's rules combine with the built-in rules (docs/recovery.md, "The policy").

A policy file extends the built-in policy unless it says ``base: none``. Its rules and the built-in
ones are merged by a rule's **key**: its condition type and its set of reason globs (order and
repeats ignored; no reasons = any reason).

- A file rule with the key of a built-in rule **replaces** it, in the built-in rule's place.
- Every other file rule is **added** ahead of all the built-in rules, in file order (a rule you add for
  one reason, ``GpuXid`` / ``[GpuXid79]``, governs that reason before the built-in rule listing it).
- A built-in rule an earlier rule now takes entirely (every reason it can match) could never match: it
  is **left out**, and said so.

The first rule matching a condition governs it (agent.recovery.policy.rule_for), so the merged order is
the precedence. :func:`not_in_force` names each built-in rule a policy leaves out, and why, for
``validate-config`` and the agent's log at start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fnmatch import fnmatchcase

from agent.recovery.model import PolicyRule, RecoveryPolicy

__all__ = ["covers", "describe_rule", "merge_rules", "not_in_force", "rule_key"]


def rule_key(rule: PolicyRule) -> tuple[str, frozenset[str]]:
    """What makes a file rule replace a built-in one: the condition type and the set of reason globs."""
    return rule.condition, frozenset(rule.reasons)


def covers(earlier: PolicyRule, later: PolicyRule) -> bool:
    """Whether every reason ``later`` can match is taken by ``earlier`` (simple, certain cases only)."""
    if earlier.condition != later.condition:
        return False
    if not earlier.reasons:
        return True
    if not later.reasons:
        return False
    return all(any(g == e or (not _is_glob(g) and fnmatchcase(g, e)) for e in earlier.reasons) for g in later.reasons)


def _is_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def merge_rules(builtin: Sequence[PolicyRule], added: Sequence[PolicyRule]) -> tuple[PolicyRule, ...]:
    """The rules in force: ``added`` merged into ``builtin`` as the module docstring says."""
    by_key: dict[tuple[str, frozenset[str]], PolicyRule] = {}
    for rule in added:
        by_key.setdefault(rule_key(rule), rule)  # a second rule of one key never matches (refused by the loader)
    builtin_keys = {rule_key(rule) for rule in builtin}
    merged = [rule for rule in added if rule_key(rule) not in builtin_keys]
    for rule in builtin:
        mine = by_key.get(rule_key(rule))
        if mine is not None:
            merged.append(mine)
        elif not any(covers(earlier, rule) for earlier in merged):
            merged.append(rule)
    return tuple(merged)


def describe_rule(rule: PolicyRule) -> str:
    """``GpuXid [GpuXid79, GpuXid119]`` / ``GpuEcc [any reason]``."""
    return f"{rule.condition} [{', '.join(rule.reasons) if rule.reasons else 'any reason'}]"


def _same(a: PolicyRule, b: PolicyRule) -> bool:
    return dataclasses.replace(a, source="") == dataclasses.replace(b, source="")


def not_in_force(policy: RecoveryPolicy, builtin: Sequence[PolicyRule]) -> list[str]:
    """One line per rule of ``builtin`` that ``policy`` does not apply as it is, saying what took its place:
    a rule of the same key (replaced), an earlier rule taking all its reasons, or nothing (``base: none``)."""
    lines = []
    for rule in builtin:
        if any(_same(rule, mine) for mine in policy.rules):
            continue  # in force (perhaps as a copy: a printed policy loaded back)
        same_key = next((mine for mine in policy.rules if rule_key(mine) == rule_key(rule)), None)
        taking = next((mine for mine in policy.rules if covers(mine, rule)), None)
        if same_key is not None:
            why = f"replaced by {same_key.source}"
        elif taking is not None:
            why = f"left out: {taking.source} ({describe_rule(taking)}) takes all its reasons"
        else:
            why = "left out: the policy starts from no rule (base: none)"
        lines.append(f"{describe_rule(rule)}: {why}")
    return lines
