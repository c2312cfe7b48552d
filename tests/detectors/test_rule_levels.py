"""A rule's ``maxLevel``: it looks only at kernel records printed at that level or worse, and at lines whose
level is not known (a saved log without one). The print-site packs carry ``maxLevel: err``; this is what lets
their thousands of literals be scanned over a batch's few error-level lines only (docs/rule-packs.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.app.config import load_rule_set
from agent.core.errors import ConfigError
from agent.core.types import LogRecord
from agent.detectors.pipeline import Batch, DetectionPipeline
from agent.detectors.rulepack import RuleSet
from agent.detectors.rules import ReferenceEngine, RuleEngine
from agent.sources.kmsg.decoder import Mode, decode

ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
ERR, WARNING, INFO = 3, 4, 6


def pack(tmp_path: Path, rules: list[dict[str, Any]], **top: Any) -> RuleSet:
    path = tmp_path / "pack.json"
    path.write_text(json.dumps({"source": "test", **top, "rules": rules}), encoding="utf-8")
    return load_rule_set([path])


def rule(name: str, pattern: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "temporary", "reason": name.title(), "pattern": pattern, **extra}


def fired(engine_cls: type, rules: RuleSet, lines: list[str], levels: list[int | None] | None) -> list[tuple[int, str]]:
    """(line index, rule) of each finding, each line at its level (None: not known)."""
    engine = engine_cls(rule_set=rules)
    at = None
    if levels is not None:
        at = {gate: [i for i, lv in enumerate(levels) if lv is None or lv <= gate] for gate in engine.gate_levels}
    return [(f.line, f.rule) for f in engine.feed(lines, line_numbers=0, levels=at)]


# (id, rules, lines with their levels, findings as (line index, rule))
CASES = [
    ("an error-level line", [rule("g", "disk failed.*", maxLevel="err")], [("disk failed", ERR)], [(0, "g")]),
    ("a worse level", [rule("g", "disk failed.*", maxLevel="err")], [("disk failed", 0)], [(0, "g")]),
    ("an info-level look-alike", [rule("g", "disk failed.*", maxLevel="err")], [("disk failed", INFO)], []),
    ("a line of no known level", [rule("g", "disk failed.*", maxLevel="err")], [("disk failed", None)], [(0, "g")]),
    ("a rule without a gate", [rule("o", "disk failed.*")], [("disk failed", INFO)], [(0, "o")]),
    (
        "gates of two levels in one pack",
        [rule("crit", "disk failed.*", maxLevel="crit"), rule("warn", "disk failed.*", maxLevel=4)],
        [("disk failed", 2), ("disk failed", ERR), ("disk failed", WARNING), ("disk failed", INFO)],
        [(0, "crit"), (0, "warn"), (1, "warn"), (2, "warn")],
    ),
    (
        "a gated fallback stays quiet where an open rule matched",
        [rule("open", "disk failed: sda.*"), rule("gated", "disk failed.*", maxLevel="err", fallback=True)],
        [("disk failed: sda", ERR), ("disk failed: sdb", ERR), ("disk failed: sdb", INFO)],
        [(0, "open"), (1, "gated")],
    ),
    (
        "an open fallback after a gated rule that did not look",
        [rule("gated", "disk failed: sda.*", maxLevel="err"), rule("fb", "disk failed.*", fallback=True)],
        [("disk failed: sda", INFO), ("disk failed: sda", ERR)],
        [(0, "fb"), (1, "gated")],
    ),
    ("a gated rule without a literal", [rule("any", ".*x", maxLevel="err")], [("x", ERR), ("x", INFO)], [(0, "any")]),
]


@ENGINES
@pytest.mark.parametrize(("rules", "lines", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_gated_rule_looks_only_at_its_levels(
    tmp_path: Path, engine_cls: type, rules: list[dict[str, Any]], lines: list[tuple[str, int | None]], expected: list
) -> None:
    got = fired(engine_cls, pack(tmp_path, rules), [t for t, _ in lines], [lv for _, lv in lines])
    assert got == expected


@ENGINES
def test_without_levels_every_rule_looks_at_every_line(tmp_path: Path, engine_cls: type) -> None:
    rules = pack(tmp_path, [rule("g", "disk failed.*", maxLevel="err"), rule("o", "link down.*")])
    assert fired(engine_cls, rules, ["disk failed", "link down"], None) == [(0, "g"), (1, "o")]


WORDS = ["disk failed", "disk failed: sda", "link down", "x", "benign words", "failed"]


@st.composite
def _stream(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[str], list[int | None] | None]:
    patterns = ["disk failed.*", "disk failed: sda.*", "link down.*", ".*x", ".*failed"]
    rules = []
    for i, pattern in enumerate(draw(st.lists(st.sampled_from(patterns), min_size=1, max_size=5))):
        extra: dict[str, Any] = {}
        if draw(st.booleans()):
            extra["maxLevel"] = draw(st.integers(0, 7))
        if draw(st.booleans()):
            extra["fallback"] = True
        rules.append(rule(f"r{i}", pattern, **extra))
    lines = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12))
    levels = None if draw(st.booleans()) else [draw(st.none() | st.integers(0, 7)) for _ in lines]
    return rules, lines, levels


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=_stream())
def test_the_fast_engine_agrees_with_the_reference_on_levels(tmp_path: Path, stream: tuple) -> None:
    rules_spec, lines, levels = stream
    rules = pack(tmp_path, rules_spec)
    assert fired(RuleEngine, rules, lines, levels) == fired(ReferenceEngine, rules, lines, levels)


# (value, the problem's message) for maxLevel values a pack may not give
BAD = [
    ("fatal", "must be a kernel level: 0-7 or one of emerg, alert, crit, err"),
    (8, "must be a kernel level"),
    (-1, "must be a kernel level"),
    (True, "must be a kernel level"),
    ("3", "must be a kernel level"),
]


@pytest.mark.parametrize(("value", "message"), BAD, ids=[repr(v) for v, _ in BAD])
def test_a_bad_max_level_names_its_field(tmp_path: Path, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        pack(tmp_path, [rule("g", "disk failed.*", maxLevel=value)])
    [problem] = exc.value.problems
    assert problem.field == "rules[0].maxLevel" and message in problem.message


def test_a_rule_matching_across_lines_cannot_be_gated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        pack(tmp_path, [rule("g", r"header\ndetail", maxLevel="err")], bufferSize=2)
    [problem] = exc.value.problems
    assert problem.field == "rules[0].maxLevel" and "applies to a rule that matches one line" in problem.message


# --- through the pipeline: the records' own levels decide ---------------------------------------------------


def _kmsg(*records: tuple[int, str]) -> Batch:
    """Records as the kernel's device gives them (priority, seq, usec, flags; message)."""
    data = b"".join(
        b"%d,%d,%d,-;%s\n" % (prio, i + 1, 1000 * (i + 1), text.encode()) for i, (prio, text) in enumerate(records)
    )
    return Batch(records=decode(data, mode=Mode.KERNEL_DEVICE, boot_time=0.0).records)


@pytest.fixture
def gated(tmp_path: Path) -> RuleSet:
    return pack(tmp_path, [rule("g", "disk failed.*", maxLevel="err"), rule("o", "link down.*")])


def reasons(pipeline: DetectionPipeline, batch: Batch) -> list[tuple[int | None, str]]:
    return [(f.line, f.reason) for f in pipeline.process(batch)]


@pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
def test_records_from_the_kernel_device_are_gated_by_their_level(gated: RuleSet, engine_cls: type) -> None:
    pipeline = DetectionPipeline(rule_set=gated, engine_factory=engine_cls)
    batch = _kmsg((6, "disk failed"), (3, "disk failed"), (6, "link down"), (11, "disk failed"))
    # seq 4: priority 11 is facility 1 (a user process writing to /dev/kmsg) at level 3: not the kernel's print
    assert reasons(pipeline, batch) == [(2, "G"), (3, "O")]


def test_records_without_a_level_are_looked_at(gated: RuleSet) -> None:
    pipeline = DetectionPipeline(rule_set=gated)
    records = [
        LogRecord(message="disk failed", timestamp=0.0, seq=1),
        LogRecord(message="link down", timestamp=0.0, seq=2),
    ]
    assert reasons(pipeline, Batch(records=records)) == [(1, "G"), (2, "O")]


def test_a_multi_line_record_keeps_its_level_on_every_line(gated: RuleSet) -> None:
    pipeline = DetectionPipeline(rule_set=gated)
    records = [
        LogRecord(message="intro\ndisk failed", timestamp=0.0, seq=1, priority=6, facility=0),
        LogRecord(message="intro\ndisk failed", timestamp=0.0, seq=2, priority=3, facility=0),
    ]
    assert reasons(pipeline, Batch(records=records)) == [(2, "G")]
