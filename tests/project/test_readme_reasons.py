"""docs/conditions.md's "Conditions and Events" section documents every reason the built-in rule packs can give.

A permanent rule's reason must be in its condition's row of the condition table, a temporary rule's
reason in the section (the Event reasons table), a condition's healthy reason in its row. Templated
reasons are documented by their template: ``GpuXid{xid}`` as ``GpuXid<code>``,
``NeuronHasError_{error}`` as ``NeuronHasError_<TYPE>`` (any ``<name>`` stands for a field). And the
Event reasons table names no reason that no built-in rule gives. The README's quick start writes a line
that flags nothing that outlives it.
"""

from __future__ import annotations

import re

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.core.types import RuleType
from agent.detectors import catchall

from helpers import REPO

README = REPO / "README.md"
CONDITIONS = REPO / "docs" / "conditions.md"
RULE_SET = load_rule_set([builtin_plugins_dir()])
EVENT_TABLE_HEADER = "| pack (file) | Event reasons |"


def _section() -> str:
    text = CONDITIONS.read_text(encoding="utf-8")
    start = text.index("\n## Conditions and Events\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _documented(reason: str) -> re.Pattern[str]:
    """A backquoted token in docs/conditions.md that documents ``reason`` (placeholders as ``<...>``)."""
    parts = re.split(r"\{\w+\}", reason)
    return re.compile("`" + "<[^<>`]+>".join(re.escape(p) for p in parts) + "`")


def _condition_rows() -> dict[str, str]:
    rows = {}
    for line in _section().splitlines():
        m = re.match(r"\| `(\w+)` \|", line)
        if m:
            rows[m[1]] = line
    return rows


def _event_table() -> list[str]:
    lines = _section().splitlines()
    start = lines.index(EVENT_TABLE_HEADER)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


PERMANENT = sorted({(r.condition, r.reason) for r in RULE_SET.rules if r.type is RuleType.PERMANENT})
TEMPORARY = sorted({r.reason for r in RULE_SET.rules if r.type is RuleType.TEMPORARY})


def test_the_section_and_its_tables_are_there():
    assert _condition_rows()
    assert _event_table()


@pytest.mark.parametrize(("condition", "reason"), PERMANENT, ids=[f"{c}/{r}" for c, r in PERMANENT])
def test_a_permanent_reason_is_in_its_condition_row(condition, reason):
    rows = _condition_rows()
    assert condition in rows, f"condition {condition} has no row in docs/conditions.md's condition table"
    assert _documented(reason).search(rows[condition]), f"{reason} is missing from the {condition} row"


@pytest.mark.parametrize("reason", TEMPORARY)
def test_an_event_reason_is_in_the_event_reasons_table(reason):
    assert any(_documented(reason).search(row) for row in _event_table()), (
        f"Event reason {reason} is missing from docs/conditions.md's Event reasons table"
    )


@pytest.mark.parametrize("condition", RULE_SET.conditions, ids=[c.type for c in RULE_SET.conditions])
def test_a_condition_and_its_healthy_reason_are_documented(condition):
    rows = _condition_rows()
    assert condition.type in rows, f"condition {condition.type} has no row in docs/conditions.md's condition table"
    assert f"`{condition.reason}`" in rows[condition.type]


def test_the_event_reasons_table_names_only_reasons_rules_give():
    known = [_documented(reason) for reason in (*TEMPORARY, *catchall.reasons())]
    for row in _event_table():
        cells = row.split("|")
        for token in re.findall(r"`[^`]+`", cells[2]):
            assert any(p.fullmatch(token) for p in known), (
                f"{token} in the Event reasons table: no built-in rule gives it"
            )


def test_the_quick_starts_try_it_line_flags_nothing_that_outlives_it():
    """The line the README has users write to a real /dev/kmsg raises an Event only: no condition that a
    permanent rule would keep True until reboot (or AcceleratedHardwareReady False on a cluster node)."""
    from agent.app.cli import simulate_lines

    text = README.read_text(encoding="utf-8")
    try_it = text[text.index("Try it:") : text.index("\n## ", text.index("Try it:"))]
    written = re.findall(r"`echo '([^']+)' > /dev/kmsg`", try_it)
    assert written, "the Try it paragraph writes a line to /dev/kmsg"
    for line in written:
        findings = list(simulate_lines(rule_set=RULE_SET, lines=iter([line])))
        assert findings, f"{line!r} matches no built-in rule: the try-it shows nothing"
        assert {f["type"] for f in findings} == {RuleType.TEMPORARY.value}, findings


def test_the_neuron_example_is_a_driver_line_the_pack_reads_as_documented():
    """docs/conditions.md shows the driver's own tokens (nd-id=, nc-id=, ...) on a line the neuron rule matches,
    and the fields it names are the fields that line yields."""
    from agent.app.cli import simulate_lines

    text = CONDITIONS.read_text(encoding="utf-8")
    packs = text[text.index("\n## Rule packs\n") : text.index("\n## ", text.index("\n## Rule packs\n") + 1)]
    (line,) = re.findall(r"`(NEURON_HW_ERR=[A-Z_]+ [^`]+)`", packs)
    for token in ("nd-id=", "nc-id=", "serial-num=", "action=", "instance-id="):
        assert f" {token}" in line, f"the example lacks the driver's {token} token"
    (finding,) = simulate_lines(rule_set=RULE_SET, lines=iter([line]))
    assert (finding["rule"], finding["condition"], finding["reason"]) == (
        "neuron/hw-error",
        "NeuronHealth",
        "NeuronHasError_DMA_ERROR",
    )
    assert finding["fields"] == {
        "error": "DMA_ERROR",
        "instance_id": "i-0123456789abcdef0",
        "nd_id": 3,
        "nc_id": 1,
        "serial_num": "51a2b3c4d5e6f708",
        "action": "TERMINATE_INSTANCE",
    }
    documented = re.search(r"tokens become fields (.+?); Neuron runtime", packs, re.S)
    assert documented, "docs/conditions.md names the fields the tokens become"
    named = set(re.findall(r"`(\w+)`", documented[1]))
    assert named == set(finding["fields"]), named ^ set(finding["fields"])


@pytest.mark.parametrize("reason", catchall.reasons())
def test_a_catch_all_reason_is_in_the_event_reasons_table(reason):
    assert any(_documented(reason).search(row) for row in _event_table()), (
        f"catch-all reason {reason} is missing from docs/conditions.md's Event reasons table"
    )
