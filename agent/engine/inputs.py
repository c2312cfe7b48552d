"""Inputs of the main loop that carry a feature's types (the bus in core carries them unseen)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.types import ConditionSpec
from agent.detectors.model import RuleSet


@dataclass(frozen=True, kw_only=True, slots=True)
class Reconfigure:
    """A reloaded configuration for the main loop: new kernel log rules, the conditions now declared,
    and the checks that no longer exist (their counters are dropped)."""

    rule_set: RuleSet
    conditions: Sequence[ConditionSpec]
    removed_checks: Sequence[str] = ()
    generation: int = 0
