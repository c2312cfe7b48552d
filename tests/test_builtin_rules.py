"""Every built-in rule fires on its recorded example (tests/fixtures/rules/builtin-examples.yaml),
with the expected reason and fields, through both the fast and the reference matcher; benign
lines that mention the same words stay silent."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.detectors.rulepack import load_rule_set
from agent.detectors.rules import ReferenceEngine, RuleEngine
from agent.settings import builtin_plugins_dir

FIXTURE = yaml.safe_load((Path(__file__).parent / "fixtures" / "rules" / "builtin-examples.yaml").read_text())
RULE_SET = load_rule_set([builtin_plugins_dir()])
CASES = [(rule, i, ex) for rule, exs in FIXTURE["examples"].items() for i, ex in enumerate(exs)]


def test_every_builtin_rule_has_an_example():
    missing = sorted({r.name for r in RULE_SET.rules} - set(FIXTURE["examples"]))
    assert missing == [], f"built-in rules without a recorded example: {missing}"
    unknown = sorted(set(FIXTURE["examples"]) - {r.name for r in RULE_SET.rules})
    assert unknown == [], f"examples for rules that do not exist: {unknown}"


@pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
@pytest.mark.parametrize(("rule", "index", "example"), CASES, ids=[f"{r}#{i}" for r, i, _ in CASES])
def test_rule_fires_on_its_example(engine_cls, rule, index, example):
    lines = example["lines"]
    findings = engine_cls(rule_set=RULE_SET).feed(lines, times=0.0, line_numbers=1)
    mine = [f for f in findings if f.rule == rule]
    assert mine, f"{rule} did not fire; findings: {[(f.rule, f.reason) for f in findings]}"
    last = mine[-1]
    assert last.line == len(lines), "the finding belongs to the line that completed the match"
    assert last.reason == example["reason"]
    for name, value in (example.get("fields") or {}).items():
        assert last.fields.get(name) == value, (name, dict(last.fields))


@pytest.mark.parametrize("line", FIXTURE["benign"])
def test_benign_lines_stay_silent(line):
    assert RuleEngine(rule_set=RULE_SET).feed([line]) == []
