"""Alerts and dashboards name only metrics the agent exports, and every failure metric has an alert.

The exported names come from scraping running agents, not from a list: a standalone agent (the built-in
NVIDIA pack's checks) and a Kubernetes-mode agent with recovery acting and CloudWatch publishing (tests/
kubeapi and moto's server) that detects a Neuron error, cordons, marks its instance Unhealthy and takes
the budget, so the recovery, budget and CloudWatch families are there too. Every metric named by an alert
(daemonset/components/prometheus-operator/prometheusrule.yaml) or a dashboard panel or variable
(daemonset/components/grafana-dashboards/*.json) must be one of them, or one of the few that other
exporters provide (``up``, kube-state-metrics).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.core.paths import builtin_plugins_dir

from helpers import free_port, http_get, start_standalone_agent, wait_for
from helpers.agents import NODE, Agent, condition, node
from helpers.aws import REGION, AwsTestEnv
from helpers.k8srender import DAEMONSET
from kubeapi import KubeApiServer

pytestmark = pytest.mark.slow  # scrapes running agents and runs promtool

RULES = DAEMONSET / "components" / "prometheus-operator" / "prometheusrule.yaml"
DASHBOARDS = sorted((DAEMONSET / "components" / "grafana-dashboards").glob("*.json"))
EXTERNAL = {"up", "kube_daemonset_status_number_unavailable"}  # Prometheus itself, kube-state-metrics
# What says the agent (or what it watches on the agent's behalf) is failing: each needs an alert.
FAILURE = re.compile(
    r"_(lost|restarts|read_errors|parse_errors|malformed_lines|failures|failing|errors)_total$|_ok$|_healthy$|_failing$"
)
# Names that look like failures but count what the node's kernel said, not a failure of the agent: findings,
# reported as Events (and dashboards), not alerts on the agent.
NOT_THE_AGENTS_FAILURE = {
    "node_health_agent_kernel_unmatched_errors_total",  # error-level kernel records no rule knows (the catch-all)
}

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless",
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "stddev", "stdvar", "count_values", "group",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (or a Grafana label_values() query)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, regexes)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\blabel_values\s*\(\s*([a-zA-Z_:][\w:]*)\s*,[^)]*\)", r"\1", text)
    text = re.sub(r"\$\w+|\$\{\w+\}", "", text)  # Grafana variables
    names = set()
    text = re.sub(r"\boffset\s+\w+", " ", text)
    for match in re.finditer(r"(?<![\w:.])[a-zA-Z_:][\w:]*", text):
        word, rest = match.group(), text[match.end() :].lstrip()
        if rest.startswith("(") or word in PROMQL_WORDS or re.fullmatch(r"\d+\w*", word):
            continue  # a function call, an operator or aggregation keyword, a number or duration
        names.add(word)
    return names


def alert_exprs() -> dict[str, str]:
    """alert -> its expressions (an alert with one rule per severity has several, one a line)."""
    rule = yaml.safe_load(RULES.read_text())
    exprs: dict[str, str] = {}
    for r in (r for g in rule["spec"]["groups"] for r in g["rules"]):
        exprs[r["alert"]] = f"{exprs[r['alert']]}\n{r['expr']}" if r["alert"] in exprs else r["expr"]
    return exprs


def _walk_exprs(node: Any, where: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                out.append((where, value))
            elif key == "query" and isinstance(value, dict | str) and "label_values" in json.dumps(value):
                out.append((where, value["query"] if isinstance(value, dict) else value))
            else:
                out.extend(_walk_exprs(value, f"{where} / {node.get('title', key)}"))
    elif isinstance(node, list):
        for item in node:
            out.extend(_walk_exprs(item, where))
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    return [e for path in DASHBOARDS for e in _walk_exprs(json.loads(path.read_text()), path.name)]


# ---- what running agents export -------------------------------------------------------------------------------


def exported(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name + ("_total" if family.type == "counter" else ""))
        names.update(s.name for s in family.samples if not s.name.endswith("_created"))
    return names


@pytest.fixture(scope="module")
def standalone_metrics(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    proc, base = start_standalone_agent(tmp_path_factory.mktemp("standalone"), plugins=builtin_plugins_dir() / "nvidia")
    try:
        _, body = wait_for(lambda: (r := http_get(f"{base}/metrics"))[0] == 200 and "check_runs" in r[1] and r)
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
    return exported(body)


def test_alerts_and_dashboards_name_only_exported_metrics(
    standalone_metrics: set[str], api: KubeApiServer, aws: AwsTestEnv, tmp_path: Path
) -> None:
    group = aws.node_group(size=1)
    (instance_id,) = group.instance_ids
    api.put_object(node(NODE, provider_id=f"aws:///{REGION}a/{instance_id}"))
    port = free_port()
    agent = Agent(tmp_path, api, enable="true", endpoint=aws.endpoint, listen=f"127.0.0.1:{port}")
    try:
        wait_for(lambda: (c := condition(api, "NeuronHealth")) and c["status"] == "False", timeout=30)
        agent.fault()

        def scraped() -> str | None:
            status, body = http_get(f"http://127.0.0.1:{port}/metrics")
            ready = ("budget_limit", "cloudwatch_last_success", 'recovery_actions_total{action="cordon",result="ok"} 1')
            return body if status == 200 and all(part in body for part in ready) else None

        body = wait_for(scraped, timeout=60)
    finally:
        agent.stop()
    names = exported(body) | standalone_metrics
    unknown = {
        where: sorted(metric_names(expr) - names - EXTERNAL)
        for where, expr in [*alert_exprs().items(), *dashboard_exprs()]
        if metric_names(expr) - names - EXTERNAL
    }
    assert not unknown, f"not exported by the agent: {unknown}"
    # Every way the agent reports its own failure has an alert.
    alerted = {name for expr in alert_exprs().values() for name in metric_names(expr)}
    failures = {n for n in names if FAILURE.search(n)} - NOT_THE_AGENTS_FAILURE
    assert failures >= {
        "node_health_agent_kmsg_records_lost_total",
        "node_health_agent_config_reload_failures_total",
        "node_health_agent_state_dir_ok",
        "node_health_agent_recovery_errors_total",
        "node_health_agent_cloudwatch_failing",
        "node_health_agent_check_errors_total",
    }, "the scrape saw the failure families"
    assert not failures - alerted, f"failure metrics without an alert: {sorted(failures - alerted)}"
    # Recovery that fails to act, a spent budget and checks stuck UNKNOWN have alerts of their own.
    exprs = "\n".join(alert_exprs().values())
    for part in (
        'recovery_actions_total{result=~"failed|denied"}',  # every failed result: tests/deploy/test_promtool.py
        'recovery_actions_total{result=~"throttled|wrong-state"}',
        'why="RecoveryBlocked"',
        'check_status{status="UNKNOWN"}',
        "recovery_paused_seconds",  # a forgotten pause (issue 15)
    ):
        assert part in exprs, part


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("problem_gauge == 1", {"problem_gauge"}),
        (
            'sum by (reason) (increase(node_health_agent_problems_total{node=~"$node"}[1h]))',
            {"node_health_agent_problems_total"},
        ),
        ('up{job="node-health-agent"} == 0', {"up"}),
        ("sum_over_time((max by (node) (a_b))[24h:5m]) * 300 > 0", {"a_b"}),
        ("x - y unless on (namespace, node) z offset 10m", {"x", "y", "z"}),
        ("label_values(node_health_agent_component_healthy, node)", {"node_health_agent_component_healthy"}),
        ("count(max by (node) (g) == 1) or vector(0)", {"g"}),
    ],
)
def test_metric_names_are_read_from_expressions(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_dashboards_are_grafana_dashboards() -> None:
    """Both dashboards: unique uids, a Prometheus datasource variable, panels within the 24-column grid."""
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        uids.add(board["uid"])
        assert board["title"].startswith("node-health-agent /")
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
                assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"]), panel["title"]
    assert len(uids) == len(DASHBOARDS) == 2
    fleet = json.dumps(
        json.loads((DAEMONSET / "components" / "grafana-dashboards" / "node-health-fleet.json").read_text())
    )
    for subject in ("problem_gauge", "recovery_actions_total", "recovery_blocked_total", "budget_holders", "Time to"):
        assert subject in fleet, subject


def test_alerts_and_dashboards_find_the_agents_in_both_scrape_modes() -> None:
    """`up` carries target labels only: the PodMonitor's job, or the pod's app.kubernetes.io/name label mapped by
    an annotations-based job (docs/deploy.md, section 9). No expression relies on one mode's job label alone,
    and the dashboards' node picker reads the `node` label both modes set (issue 33)."""
    exprs = [*alert_exprs().values(), *(e for _, e in dashboard_exprs())]
    ups = [e for e in exprs if re.search(r"\bup\{", e)]
    assert ups, "the scrape alert and the fleet panels read up"
    for expr in ups:
        assert 'up{job="node-health-agent"}' in expr and 'up{app_kubernetes_io_name="node-health-agent"}' in expr, expr
    assert not [e for e in exprs if "job=" in e and not re.search(r"\bup\{", e)], "job selects nothing else"
    for path in DASHBOARDS:
        variables = {v["name"]: v for v in json.loads(path.read_text())["templating"]["list"]}
        assert variables["node"]["query"]["query"].endswith(", node)"), path.name
