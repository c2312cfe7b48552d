"""The prefilter's RE2 budget grows with its literal text (agent.core.patterns.literal_set_memory): a literal
set whose DFA outgrows its budget falls back, silently, to a matcher about 100x slower."""

from __future__ import annotations

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.core.patterns import (
    LITERAL_SET_MEMORY,
    LITERAL_SET_MEMORY_MAX,
    LITERAL_SET_MEMORY_PER_BYTE,
    literal_set_memory,
)
from agent.detectors.rules import RuleEngine


@pytest.mark.parametrize(
    ("literals", "budget"),
    [
        ([b"NVRM: Xid"], LITERAL_SET_MEMORY),  # small sets: the floor
        ([b"x" * 10_000, b"y" * 14_295], 24_295 * LITERAL_SET_MEMORY_PER_BYTE),  # the size the packs reached
        ([b"a" * 10_000, b"a" * 10_000], 10_000 * LITERAL_SET_MEMORY_PER_BYTE),  # the same literal twice: once
        ([bytes([i % 250 + 1]) * 1000 + str(i).encode() for i in range(1000)], LITERAL_SET_MEMORY_MAX),  # a cap
    ],
)
def test_the_budget_follows_the_literal_text(literals: list[bytes], budget: int) -> None:
    assert literal_set_memory(literals) == budget


def test_the_built_in_packs_get_at_least_the_budget_measured_fast() -> None:
    # 889 literals of 24,295 bytes ran at 7,000 lines/s under 12 MiB and 600,000 from 16 MiB on (2026-12-03).
    engine = RuleEngine(rule_set=load_rule_set([builtin_plugins_dir()]))
    text = [lit.encode() for lit in engine._every().by_literal]
    assert literal_set_memory(text) >= 16 << 20 or sum(len(t) for t in text) < 20_000
