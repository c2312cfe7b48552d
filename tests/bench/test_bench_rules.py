"""The rules benchmark's own parts: the synthetic corpus (deterministic, independent placeholder
values, near misses that stay silent) and the per-rule baseline, which must find exactly what the
fast matcher finds."""

from __future__ import annotations

import random
import re

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rulepack import RuleSet
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers import REPO

ROOT = REPO


@pytest.fixture(scope="module")
def builtin_rules() -> RuleSet:
    return load_rule_set([builtin_plugins_dir()])


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import corpus, rules_bench

    return corpus, rules_bench


def _found(findings: list) -> list[tuple]:
    return [(f.line, f.rule, f.reason, f.message, dict(f.fields)) for f in findings]


def test_corpus_is_deterministic_and_sized(bench) -> None:
    corpus, _ = bench
    lines = corpus.kernel_lines(5000, fault_rate=0.05, seed=3)
    assert len(lines) == 5000
    assert lines == corpus.kernel_lines(5000, fault_rate=0.05, seed=3)
    assert lines != corpus.kernel_lines(5000, fault_rate=0.05, seed=4)


def test_every_placeholder_gets_its_own_value(bench) -> None:
    corpus, _ = bench
    line = corpus._fill("{hex8} {hex8} {hex8} {num} {num}", random.Random(1))
    first, second, third, n1, n2 = line.split()
    assert len({first, second, third}) == 3 and n1 != n2
    assert corpus._fill("{1}[Hardware Error]", random.Random(1)) == "{1}[Hardware Error]"


def test_corpus_has_traces_and_continuation_lines(bench) -> None:
    corpus, _ = bench
    lines = corpus.kernel_lines(20_000, fault_rate=0.01)
    assert any(line == "Call Trace:" for line in lines)
    assert sum(line.startswith(" ") for line in lines) > 100
    assert not any("{" in line and re.search(r"\{[a-z0-9]+\}", line) for line in lines)


def test_near_misses_and_benign_blocks_stay_silent(bench, builtin_rules: RuleSet) -> None:
    corpus, _ = bench
    rng = random.Random(5)
    quiet = [corpus._fill(t, rng) for t in corpus.NEAR_MISSES + corpus.BENIGN for _ in range(3)]
    quiet += [corpus._fill(line, rng) for block in corpus.BENIGN_BLOCKS for line in block]
    assert RuleEngine(rule_set=builtin_rules).feed(quiet) == []
    # ... while each of them does contain (part of) a rule literal, so the matcher has to look
    literals = {lit for r in builtin_rules.rules for lit in r.literals or ()}
    for template in corpus.NEAR_MISSES:
        line = corpus._fill(template, rng)
        assert any(lit[:8] in line for lit in literals), line


def test_every_fault_fires(bench, builtin_rules: RuleSet) -> None:
    corpus, _ = bench
    rng = random.Random(6)
    for template in corpus.FAULTS:
        assert RuleEngine(rule_set=builtin_rules).feed([corpus._fill(template, rng)]), template
    for block in corpus.FAULT_BLOCKS:
        assert RuleEngine(rule_set=builtin_rules).feed([corpus._fill(line, rng) for line in block]), block[0]


def test_baseline_and_reference_agree_with_the_fast_matcher(bench, builtin_rules: RuleSet) -> None:
    corpus, rules_bench = bench
    lines = corpus.kernel_lines(1500, fault_rate=0.05, seed=11)
    fast = rules_bench._fast_feed(builtin_rules)(lines)
    assert len(fast) > 50
    assert _found(rules_bench.PerRuleMatcher(rule_set=builtin_rules).feed(lines)) == _found(fast)
    assert _found(ReferenceEngine(rule_set=builtin_rules).feed(lines, line_numbers=0)) == _found(fast)


def test_disagreement_stops_the_benchmark(bench, builtin_rules: RuleSet) -> None:
    corpus, rules_bench = bench
    findings = RuleEngine(rule_set=builtin_rules).feed(corpus.kernel_lines(500, fault_rate=0.1))
    with pytest.raises(SystemExit, match="disagree"):
        rules_bench._require_agreement("the per-rule baseline", findings, findings[1:])


def test_hostile_figure_is_measured(bench) -> None:
    _, rules_bench = bench
    assert rules_bench._hostile_ms() >= 0.0
