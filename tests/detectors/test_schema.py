"""Loading is split in steps with one job each: the schema checks the shape of one file (without
compiling patterns or looking at other files), the compiler checks patterns and references."""

from __future__ import annotations

import textwrap

import yaml

from agent.core.configdoc import Document, Problems, field_path
from agent.core.types import ConditionSpec, RuleType, Severity
from agent.detectors.compiler import compile_rule
from agent.detectors.schema import check_pack

PACK = textwrap.dedent(
    """
    source: mine
    bufferSize: 3
    lists:
      codes: [48, 79]
    conditions:
      - {type: Gpu, reason: GpuIsFine, message: ok, clearAfter: 1h}
    rules:
      - name: mine/xid
        type: permanent
        condition: Gpu
        reason: 'GpuXid{xid}'
        pattern: 'Xid (?P<xid>\\d+)(?!x)'
        where: {xid: {in: codes}}
        threshold: {count: 2, window: 10m, by: [xid]}
      - {name: mine/off, enabled: false}
    """
)


def _problems(data: object) -> Problems:
    return Problems(file="mine.yaml", doc=Document(data=data, lines={}))


def test_schema_checks_shape_only() -> None:
    col = _problems(yaml.safe_load(PACK))
    pack = check_pack(col)
    assert col.problems == []  # the look-ahead is the compiler's business
    assert (pack.source, pack.buffer_size, dict(pack.lists)) == ("mine", 3, {"codes": ("48", "79")})
    assert [(c.type, c.clear_after) for c in pack.conditions] == [("Gpu", 3600.0)]
    xid, off = pack.rules
    assert (xid.name, xid.type, xid.condition, xid.reason_fields, xid.severity) == (
        "mine/xid",
        RuleType.PERMANENT,
        "Gpu",
        ("xid",),
        Severity.ERROR,
    )
    assert [(w.field, w.value, w.negate) for w in xid.where] == [("xid", "codes", False)]
    assert xid.threshold is not None and (xid.threshold.count, xid.threshold.window) == (2, 600.0)
    assert (off.name, off.enabled, off.ok) == ("mine/off", False, True)


def test_compiler_checks_patterns_and_references() -> None:
    col = _problems(yaml.safe_load(PACK))
    spec = check_pack(col).rules[0]
    condition = ConditionSpec(type="Gpu", reason="GpuIsFine", message="ok", clear_after=None, source="mine")
    assert compile_rule(spec, col=col, lists={"codes": ("48",)}, conditions={"Gpu": condition}) is None
    (problem,) = col.problems
    assert (problem.field, "look-around assertions are not supported" in problem.message) == (
        "rules[0].pattern",
        True,
    )


def test_compiler_resolves_lists_from_any_file() -> None:
    data = yaml.safe_load(PACK)
    data["rules"][0]["pattern"] = "Xid (?P<xid>\\d+)"
    col = _problems(data)
    spec = check_pack(col).rules[0]
    condition = ConditionSpec(type="Gpu", reason="GpuIsFine", message="ok", clear_after=None, source="mine")
    rule = compile_rule(spec, col=col, lists={"codes": ("13",)}, conditions={"Gpu": condition})
    assert col.problems == []
    assert rule is not None
    assert [(f.field, f.values) for f in rule.where] == [("xid", frozenset({"13"}))]
    assert (rule.literals, rule.multiline, rule.window) == (("Xid ",), False, 1)


def test_field_path() -> None:
    assert field_path(("rules", 3, "where", "xid")) == "rules[3].where.xid"
    assert field_path(()) == ""
