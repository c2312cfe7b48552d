"""The shipped alerts, checked and unit-tested by real Prometheus (``promtool``, tests/helpers/promtool.py).

The rules are taken as the users get them: the PrometheusRule that Helm renders (``metrics.prometheusRule``) and
the one kustomize renders (``components/prometheus-operator``), their groups written out as a Prometheus rule
file. ``promtool check rules`` loads each; ``promtool test rules`` runs every unit test file in
tests/deploy/promtool/ against each. Those files compare alert labels only (promtool compares annotations in
full, so they run against the rules without annotations), except annotations.yaml, which runs against the rules
as they are. Every shipped alert has a unit test in which it fires, and one in which it does not.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.k8srender import CHART, DAEMONSET, helm_template, kustomize, one
from helpers.promtool import promtool

TESTS = Path(__file__).parent / "promtool"
WITH_ANNOTATIONS = {"annotations.yaml"}
RULES = DAEMONSET / "components" / "prometheus-operator" / "prometheusrule.yaml"


def _rendered(tool: str) -> list[dict[str, Any]]:
    if tool == "helm":
        return helm_template(sets=("metrics.prometheusRule.enabled=true",))
    return kustomize(DAEMONSET / "overlays" / "eks")  # the overlay with components/prometheus-operator


@pytest.fixture(scope="module", params=["helm", "kustomize"])
def rule_groups(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The rule groups of the PrometheusRule each tool renders."""
    docs = _rendered(request.param)
    groups = one(docs, "PrometheusRule", "node-health-agent")["spec"]["groups"]
    assert groups == yaml.safe_load(RULES.read_text())["spec"]["groups"], f"{request.param} renders other rules"
    return groups


def _write(groups: list[dict[str, Any]], path: Path, *, annotations: bool) -> Path:
    """A Prometheus rule file of the groups (without the rules' annotations unless ``annotations``)."""
    out = [
        {**g, "rules": [{k: v for k, v in r.items() if annotations or k != "annotations"} for r in g["rules"]]}
        for g in groups
    ]
    path.write_text(yaml.safe_dump({"groups": out}, sort_keys=False))
    return path


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool()), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_promtool_loads_the_rendered_rules(rule_groups: list[dict[str, Any]], tmp_path: Path) -> None:
    path = _write(rule_groups, tmp_path / "rules.yaml", annotations=True)
    proc = _promtool("check", "rules", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = {r["alert"] for g in rule_groups for r in g["rules"]}
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups)} rules found" in proc.stdout
    assert len(alerts) == 26


@pytest.mark.parametrize("name", sorted(p.name for p in TESTS.glob("*.yaml")))
def test_promtool_unit_tests_pass(rule_groups: list[dict[str, Any]], name: str, tmp_path: Path) -> None:
    shutil.copy(TESTS / name, tmp_path / name)
    _write(rule_groups, tmp_path / "rules.yaml", annotations=name in WITH_ANNOTATIONS)
    proc = _promtool("test", "rules", name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def _cases() -> list[dict[str, Any]]:
    return [
        case
        for path in sorted(TESTS.glob("*.yaml"))
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]


def test_every_shipped_alert_has_a_case_where_it_fires_and_one_where_it_does_not() -> None:
    shipped = {r["alert"] for g in yaml.safe_load(RULES.read_text())["spec"]["groups"] for r in g["rules"]}
    fires = {c["alertname"] for c in _cases() if c.get("exp_alerts")}
    silent = {c["alertname"] for c in _cases() if not c.get("exp_alerts")}
    assert not shipped - fires, f"alerts with no promtool case where they fire: {sorted(shipped - fires)}"
    assert not shipped - silent, f"alerts with no promtool case where they stay silent: {sorted(shipped - silent)}"
    assert fires | silent <= shipped, f"tests of alerts not shipped: {sorted((fires | silent) - shipped)}"


def test_every_documented_failed_result_raises_the_action_failed_alert() -> None:
    """docs/recovery.md lists a reboot's results; each but ok has a firing case, at a stated severity."""
    from agent.recovery.ladder import FAILURE_KINDS

    fired = {
        (a["exp_labels"]["result"], a["exp_labels"]["severity"])
        for c in _cases()
        if c["alertname"] == "NodeHealthRecoveryActionFailed"
        for a in c.get("exp_alerts") or []
    }
    severity = {"failed": "critical", "denied": "critical", "throttled": "warning", "wrong-state": "warning"}
    assert set(FAILURE_KINDS) == set(severity)
    assert fired >= set(severity.items())
    documented = (DAEMONSET.parent / "docs" / "recovery.md").read_text()
    assert 'result="throttled|denied|wrong-state|failed"' in documented


def test_the_chart_ships_the_component_s_rules() -> None:
    """The chart reads the component's file through its files/ symlink: one source for both tools."""
    assert (CHART / "files" / "components").resolve() == (DAEMONSET / "components").resolve()
