"""docs/deploy.md's alert table says what the shipped rules do: every alert, its severities, how long it must
hold (``for``) and how long it is kept firing (``keep_firing_for``). Issue 33: the table listed 23 of 26 alerts
with wrong durations."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "daemonset" / "components" / "prometheus-operator" / "prometheusrule.yaml"
DEPLOY = REPO / "docs" / "deploy.md"
HEADER = "| alert | severity | for | kept | fires when |"


def table() -> dict[str, tuple[set[str], str, str]]:
    """alert -> (severities, for, kept) as the table states them."""
    text = DEPLOY.read_text()
    assert text.count(HEADER) == 1, "the alert table's header"
    rows = {}
    for line in text[text.index(HEADER) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 5, line
        name = cells[0].strip("`")
        assert name not in rows, f"{name} twice in the table"
        rows[name] = ({s.strip() for s in cells[1].split(",")}, cells[2], cells[3])
    return rows


def shipped() -> dict[str, tuple[set[str], str, str]]:
    rules: dict[str, tuple[set[str], str, str]] = {}
    for group in yaml.safe_load(RULES.read_text())["spec"]["groups"]:
        for rule in group["rules"]:
            severities, hold, kept = rules.get(
                rule["alert"], (set(), rule.get("for", ""), rule.get("keep_firing_for", ""))
            )
            assert (hold, kept) == (rule.get("for", ""), rule.get("keep_firing_for", "")), rule["alert"]
            rules[rule["alert"]] = (severities | {rule["labels"]["severity"]}, hold, kept)
    return rules


def test_the_alert_table_lists_every_shipped_alert_and_no_other() -> None:
    documented, rules = table(), shipped()
    assert len(rules) == 26
    assert sorted(documented) == sorted(rules)


def test_the_alert_table_states_each_alert_s_severity_and_durations() -> None:
    documented, rules = table(), shipped()
    wrong = {name: (documented[name], rule) for name, rule in rules.items() if documented.get(name) != rule}
    assert not wrong, f"table (severities, for, kept) != rules: {wrong}"


def test_the_docs_do_not_deny_the_detection_latency_histogram() -> None:
    """The agent exports node_health_agent_detection_seconds; the fleet dashboard shows it."""
    text = DEPLOY.read_text()
    assert "no detection-latency histogram" not in text
    assert "`node_health_agent_detection_seconds`" in text
