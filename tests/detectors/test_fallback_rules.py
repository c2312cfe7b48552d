"""Family fallbacks and provenance: a fallback rule speaks only for lines no specific rule matched,
in both engines; provenance names where a message is printed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.errors import ConfigError
from agent.detectors.rules import ReferenceEngine, RuleEngine

PACK = """
conditions:
  - {type: GpuXid, reason: GpuXidGood, message: ok}
rules:
  - name: xid.fallback
    type: temporary
    reason: GpuXid{xid}
    fallback: true
    provenance: "NVIDIA/open-gpu-kernel-modules:src/nvidia/src/kernel/rmapi/event.c: NVRM: Xid (%s): %d, ..."
    pattern: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-fA-F:.]+)\\): (?P<xid>\\d+),.*'
  - name: xid.79
    type: permanent
    condition: GpuXid
    reason: GpuFallenOffBus
    severity: critical
    provenance: ["NVIDIA/open-gpu-kernel-modules:src/nvidia/...: GPU has fallen off the bus"]
    pattern: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-fA-F:.]+)\\): 79,.*'
  - name: xid.13.temporary
    type: temporary
    reason: GpuXid13
    pattern: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-fA-F:.]+)\\): 13,.*'
    threshold: {count: 3, window: 1h, by: [pci]}
"""


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("fallback") / "pack.yaml"
    path.write_text(textwrap.dedent(PACK))
    return load_rule_set([path])


LINES = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", ["GpuFallenOffBus"]),
    ("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2", ["GpuXid154"]),
    # A specific rule matched, its threshold kept it quiet: the fallback does not speak for it either.
    ("NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)", []),
    ("NVRM: GPU at PCI:0000:3b:00: GPU-1234 is fine", []),
]


@pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
@pytest.mark.parametrize(("line", "reasons"), LINES, ids=["specific", "fallback", "specific-quiet", "other"])
def test_a_fallback_speaks_only_where_no_specific_rule_matched(rules, engine_cls, line, reasons):
    assert [f.reason for f in engine_cls(rule_set=rules).feed([line])] == reasons


@pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
def test_findings_stay_in_line_order_with_fallbacks(rules, engine_cls):
    lines = [LINES[1][0], LINES[0][0], LINES[1][0]]
    got = [(f.line, f.reason) for f in engine_cls(rule_set=rules).feed(lines, line_numbers=1)]
    assert got == [(1, "GpuXid154"), (2, "GpuFallenOffBus"), (3, "GpuXid154")]


def test_provenance_is_kept_with_the_rule(rules):
    by_name = {r.name: r for r in rules.rules}
    assert by_name["xid.fallback"].provenance[0].startswith("NVIDIA/open-gpu-kernel-modules:")
    assert by_name["xid.fallback"].fallback and not by_name["xid.79"].fallback


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ("provenance: []", "rules[0].provenance", "must name where the message is printed"),
        ("provenance: [3]", "rules[0].provenance", "must name where the message is printed"),
        ("fallback: maybe", "rules[0].fallback", "must be true or false"),
    ],
)
def test_bad_provenance_or_fallback_is_refused(tmp_path: Path, extra, field, message):
    path = tmp_path / "p.yaml"
    path.write_text(f"rules:\n  - type: temporary\n    reason: R\n    pattern: 'x y'\n    {extra}\n")
    with pytest.raises(ConfigError) as exc:
        load_rule_set([path])
    [problem] = exc.value.problems
    assert (problem.field, problem.line) == (field, 5) and message in problem.message


def test_quiet_matches_of_a_threshold_rule_are_counted_per_device(rules):
    engine = RuleEngine(rule_set=rules)
    line = "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)"
    other = "NVRM: Xid (PCI:0000:86:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)"
    assert engine.feed([line, line, other]) == []  # below the threshold: no Event
    assert engine.threshold_counts() == {
        ("xid.13.temporary", "pci=0000:3b:00"): 2,
        ("xid.13.temporary", "pci=0000:86:00"): 1,
    }
