"""Zones and pools: group budgets and correlated-failure holds (agent.recovery.budget,
agent.recovery.correlation), against the test API server with the real client."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.adapters.kube import KubeClient
from agent.core.types import Condition, Provenance, Severity, Snapshot, Status
from agent.recovery.budget import ClusterBudget, ultraserver_domain
from agent.recovery.census import Census, take
from agent.recovery.correlation import correlated_hold
from agent.recovery.model import (
    DEFAULT_LEASE,
    ULTRASERVER_LABEL,
    ZONE_LABEL,
    Blocked,
    BudgetSettings,
    CorrelationSettings,
    GroupBudget,
    NodeView,
)
from agent.recovery.policy import decide
from agent.recovery.policyfile import DEFAULT_POLICY

from helpers import kube_clients
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]

NS = "node-health-agent"
T0 = 1_767_225_600.0
POOL = "eks.amazonaws.com/nodegroup"
NO_HOLDS = BudgetSettings(max_unhealthy="100%", max_unhealthy_cap=None, max_actions=100, correlation=None)


def node(name: str, *, labels: dict[str, str] | None = None, problem: str | None = None, created: float = T0 - 86_400):
    conditions = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    if problem is not None:
        conditions.append({"type": problem, "status": "True", "reason": f"{problem}Problem"})
    stamp = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {}), "creationTimestamp": stamp},
        "status": {"conditions": conditions},
    }


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    kube_api_server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    return kube_api_server


@pytest.fixture
def client(api: KubeApiServer, tmp_path: Path) -> Iterator[KubeClient]:
    with kube_clients(api, tmp_path, timeout=10.0) as make:
        yield make()


def budget_for(client: KubeClient, name: str, settings: BudgetSettings) -> ClusterBudget:
    return ClusterBudget(
        client=client,
        namespace=NS,
        lease_name=DEFAULT_LEASE,
        node_name=name,
        settings=settings,
        clock=lambda: T0,
        sleep=lambda _: None,
        problem_types=("GpuHealth", "NeuronHealth"),
    )


# ---- group budgets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("groups", "asking", "granted"),
    [
        # 2 zones of 4 nodes; the cluster allows every node: the zone budget decides
        ((), ["a0", "a1", "a2", "b0"], ["a0", "a1", "a2", "b0"]),
        ((GroupBudget(label=ZONE_LABEL, max_unhealthy=1),), ["a0", "a1", "b0", "b1"], ["a0", "b0"]),
        ((GroupBudget(label=ZONE_LABEL, max_unhealthy="50%"),), ["a0", "a1", "a2", "b0"], ["a0", "a1", "b0"]),
        # a percentage is of the group's failure domains, rounded up, capped
        ((GroupBudget(label=ZONE_LABEL, max_unhealthy="50%", max_unhealthy_cap=1),), ["a0", "a1"], ["a0"]),
        # the pool budget applies across zones: p1 holds a0 and b0
        ((GroupBudget(label=POOL, max_unhealthy=1),), ["a0", "b0", "a1"], ["a0", "a1"]),
        # both: each must have room
        (
            (GroupBudget(label=ZONE_LABEL, max_unhealthy=2), GroupBudget(label=POOL, max_unhealthy=1)),
            ["a0", "b0", "a1", "a3"],
            ["a0", "a1"],
        ),
    ],
    ids=["no-groups", "zone-count", "zone-percent", "zone-capped", "pool", "zone-and-pool"],
)
def test_a_zone_or_pool_budget_limits_the_places_among_its_nodes(api, client, groups, asking, granted):
    for zone in "ab":
        for i in range(4):
            pool = "p1" if i % 2 == 0 else "p2"
            api.put_object(node(f"{zone}{i}", labels={ZONE_LABEL: f"us-west-2{zone}", POOL: pool}))
    settings = BudgetSettings(max_unhealthy="100%", max_unhealthy_cap=None, max_actions=100, groups=groups)
    answers = {name: budget_for(client, name, settings).acquire(incident_id=name) for name in asking}
    assert [n for n, a in answers.items() if a.granted] == granted
    for name, answer in answers.items():
        if not answer.granted:
            assert answer.group_full and not answer.can_start, name
    assert budget_for(client, granted[0], settings).acquire(incident_id="again").granted, "a holder keeps its place"


def test_a_group_counts_failure_domains_and_a_node_without_the_label_is_in_no_group(api, client):
    for i in range(4):  # one UltraServer in zone a: one domain
        api.put_object(node(f"us{i}", labels={ZONE_LABEL: "a", ULTRASERVER_LABEL: "us-1"}))
    api.put_object(node("a-plain", labels={ZONE_LABEL: "a"}))
    api.put_object(node("nowhere"))
    settings = BudgetSettings(
        max_unhealthy="100%",
        max_unhealthy_cap=None,
        max_actions=100,
        groups=(GroupBudget(label=ZONE_LABEL, max_unhealthy=1),),
    )
    assert budget_for(client, "us0", settings).acquire(incident_id="u0").granted
    assert budget_for(client, "us1", settings).acquire(incident_id="u1").granted  # the same domain's place
    refused = budget_for(client, "a-plain", settings).acquire(incident_id="p")
    assert not refused.granted and refused.group_full.startswith(f"{ZONE_LABEL}=a: 1 of 1 places held (us-1)")
    assert budget_for(client, "nowhere", settings).acquire(incident_id="n").granted


# ---- correlated failure ----------------------------------------------------------------------------------

SETTINGS = CorrelationSettings(labels=(ZONE_LABEL, POOL), share=0.3, min_nodes=3)


def cluster(problems: dict[str, str], *, size: int = 10, zone_of=lambda i: "a", created=None) -> dict[str, dict]:
    out = {}
    for i in range(size):
        name = f"n{i}"
        labels = {ZONE_LABEL: zone_of(i), POOL: "gpu"}
        out[name] = node(
            name, labels=labels, problem=problems.get(name), created=(created or {}).get(name, T0 - 86_400)
        )
    return out


def census_of(nodes: dict, types: set[str]) -> Census:
    """The census one agent would count of ``nodes`` (agent.recovery.census)."""
    return take(
        nodes.values(),
        now=T0,
        by="n9",
        key="k",
        labels=SETTINGS.labels,
        types=types,
        new_node_window=SETTINGS.new_node_window,
        domain_of=ultraserver_domain,
    )


@pytest.mark.parametrize(
    ("problems", "created", "held"),
    [
        ({"n0": "GpuHealth"}, {}, ""),  # one node: its own fault
        ({f"n{i}": "GpuHealth" for i in range(3)}, {}, ""),  # 3 of 10 is not more than 30 %
        ({f"n{i}": "GpuHealth" for i in range(4)}, {}, "4 of its 10 nodes show GpuHealth problems"),
        (
            {"n0": "GpuHealth", "n1": "NeuronHealth", "n2": "NeuronHealth", "n3": "NeuronHealth"},
            {},
            "",
        ),  # not n0's type
        ({"n0": "GpuHealth", "n1": "GpuHealth"}, {"n0": T0 - 600, "n1": T0 - 1200}, "created in the last 1 h"),
        ({"n0": "GpuHealth", "n1": "GpuHealth"}, {"n0": T0 - 600, "n1": T0 - 7200}, ""),  # one young only
        ({"n0": "Ready"}, {}, ""),  # not a problem type of the agent
    ],
    ids=["one", "at-share", "above-share", "other-type", "young-repeats", "one-young", "not-ours"],
)
def test_a_group_that_fails_together_holds(problems, created, held):
    nodes = cluster(problems, created=created)
    types = {"GpuHealth", "NeuronHealth"}
    answer = correlated_hold(SETTINGS, own_node=nodes["n0"], census=census_of(nodes, types), types=types, now=T0)
    assert (held in answer) if held else answer == "", answer


@pytest.mark.parametrize(
    "junk",
    [
        {"status": {"conditions": "True"}},
        {"status": {"conditions": [{"type": ["GpuHealth"], "status": "True"}, 7, None]}},
        {"metadata": {"labels": ["zone"]}},
        {"metadata": {"creationTimestamp": "yesterday", "labels": {ZONE_LABEL: "a"}}},
    ],
)
def test_junk_in_other_nodes_is_no_problem_and_no_crash(junk):
    nodes = cluster({"n0": "GpuHealth", "n1": "GpuHealth", "n2": "GpuHealth"}, size=4)
    nodes["n3"] = {**nodes["n3"], **junk}
    held = correlated_hold(
        SETTINGS, own_node=nodes["n0"], census=census_of(nodes, {"GpuHealth"}), types={"GpuHealth"}, now=T0
    )
    assert re.search(r"3 of its [34] nodes show GpuHealth problems", held), held


def test_a_held_zone_blocks_acquire_and_the_decision_says_held(api, client):
    for spec in cluster({f"n{i}": "NeuronHealth" for i in range(5)}).values():
        api.put_object(spec)
    settings = BudgetSettings(max_unhealthy="100%", max_unhealthy_cap=None, max_actions=100, correlation=SETTINGS)
    answer = budget_for(client, "n0", settings).acquire(incident_id="n0")
    assert not answer.granted and not answer.can_start and "5 of its 10 nodes" in answer.correlated
    assert "places held" not in answer.correlated
    problem = Condition(
        type="NeuronHealth",
        status=Status.TRUE,
        reason="NeuronHasError_DMA_ERROR",
        message="DMA error",
        last_transition=T0 - 3600,
        last_update=T0,
        severity=Severity.CRITICAL,
    )
    decision = decide(
        snapshot=Snapshot(
            conditions=(problem,),
            generated_at=T0,
            seeded=True,
            node_uid="u",
            provenance={"NeuronHealth": Provenance.KERNEL_LOG},
        ),
        node=NodeView(name="n0", unschedulable=False, labels={}, provider_id=""),
        incident=None,
        policy=DEFAULT_POLICY,
        now=T0,
        started_at=T0 - 7200,
        budget=answer,
        enabled=True,
    )
    assert decision.blocked is Blocked.CORRELATED and not decision.actions
    assert "held for a correlated failure: topology.kubernetes.io/zone=a: 5 of its 10 nodes" in decision.message


def test_correlation_off_never_holds(api, client):
    for spec in cluster({f"n{i}": "GpuHealth" for i in range(10)}).values():
        api.put_object(spec)
    assert budget_for(client, "n0", NO_HOLDS).acquire(incident_id="n0").granted


# ---- a node outside budget.nodeSelector ---------------------------------------------------------------------

ROLE = "example.com/role"


def test_a_node_outside_the_node_selector_is_held_to_its_zone_budget(api, client):
    """Issue 33: the group budget looked for this node among the nodes the selector lists only: a node outside
    it was in no zone and took a place its zone did not have. Holders outside the selector count in their zone."""
    for i in range(4):
        api.put_object(node(f"gpu{i}", labels={ZONE_LABEL: "a", ROLE: "gpu"}))
    for i in range(2):
        api.put_object(node(f"cpu{i}", labels={ZONE_LABEL: "a"}))
    api.put_object(node("cpu-b", labels={ZONE_LABEL: "b"}))
    settings = BudgetSettings(
        max_unhealthy="100%",
        max_unhealthy_cap=None,
        max_actions=100,
        node_selector=f"{ROLE}=gpu",
        groups=(GroupBudget(label=ZONE_LABEL, max_unhealthy=1),),
        correlation=None,
    )
    assert budget_for(client, "gpu0", settings).acquire(incident_id="g0").granted
    refused = budget_for(client, "cpu0", settings).acquire(incident_id="c0")
    assert not refused.granted and refused.group_full.startswith(f"{ZONE_LABEL}=a: 1 of 1 places held (gpu0)")
    assert budget_for(client, "cpu-b", settings).acquire(incident_id="cb").granted, "zone b has room"
    assert budget_for(client, "gpu0", settings).release().holders == ("cpu-b",)
    assert budget_for(client, "cpu0", settings).acquire(incident_id="c0").granted
    refused = budget_for(client, "gpu1", settings).acquire(incident_id="g1")
    assert not refused.granted and refused.group_full.startswith(f"{ZONE_LABEL}=a: 1 of 1 places held (cpu0)"), (
        "a holder outside the selector counts in its zone too"
    )


def test_a_node_outside_the_node_selector_is_held_when_its_zone_fails_together(api, client):
    for i in range(4):
        api.put_object(node(f"gpu{i}", labels={ZONE_LABEL: "a", ROLE: "gpu"}, problem="GpuHealth"))
    api.put_object(node("cpu0", labels={ZONE_LABEL: "a"}, problem="GpuHealth"))
    settings = BudgetSettings(
        max_unhealthy="100%", max_unhealthy_cap=None, max_actions=100, node_selector=f"{ROLE}=gpu", correlation=SETTINGS
    )
    answer = budget_for(client, "cpu0", settings).acquire(incident_id="c0", problem="GpuHealth")
    # the census counts the nodes the selector lists: cpu0 is held by its zone's 4 of 4 all the same
    assert not answer.granted and "4 of its 4 nodes show GpuHealth problems" in answer.correlated
