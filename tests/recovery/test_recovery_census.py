"""The fleet census (agent.recovery.census) through the budget, against the test API server with the real
client: one LIST per census age for the whole fleet, the claim that keeps the others from counting, the
census counted again when stale, and a watch cache behind etcd never letting two agents past the limit."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.adapters.kube import KubeClient
from agent.recovery.budget import BUDGET_ANNOTATION, ClusterBudget, decode_state
from agent.recovery.census import CENSUS_KEY, CENSUS_MAX_AGE, CLAIM_KEY, CLAIM_TTL, decode
from agent.recovery.model import DEFAULT_LEASE, BudgetSettings

from helpers import kube_clients
from helpers.recovery import T0, Clock
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]

NS = "node-health-agent"
LISTS = r"^/api/v1/nodes$"
TWO = BudgetSettings(max_unhealthy=2)


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    kube_api_server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for i in range(20):
        kube_api_server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i:02d}"}})
    return kube_api_server


@pytest.fixture
def client(api: KubeApiServer, tmp_path: Path) -> Iterator[KubeClient]:
    with kube_clients(api, tmp_path, timeout=10.0) as make:
        yield make()


@pytest.fixture
def budget(client: KubeClient) -> Callable[..., ClusterBudget]:
    def make(node: str, clock: Clock, settings: BudgetSettings = TWO) -> ClusterBudget:
        return ClusterBudget(
            client=client,
            namespace=NS,
            lease_name=DEFAULT_LEASE,
            node_name=node,
            settings=settings,
            clock=clock,
            sleep=lambda s: None,
            rng=lambda: 0.5,
        )

    return make


def stored(api: KubeApiServer) -> dict:
    lease = api.get_object("leases", DEFAULT_LEASE, NS)
    assert lease is not None
    return dict(decode_state(lease["metadata"]["annotations"][BUDGET_ANNOTATION]).extra)


@pytest.mark.parametrize(
    ("ask_at", "lists"),
    [
        ([0.0] * 20, 1),  # a fleet-wide misfire: 20 asks, one LIST of the fleet
        ([0.0, 10.0, CENSUS_MAX_AGE - 1], 1),  # within the census's age: counted once
        ([0.0, CENSUS_MAX_AGE + 1], 2),  # stale: counted again, by the next asker
        ([0.0, CENSUS_MAX_AGE + 1, CENSUS_MAX_AGE + 2], 2),
    ],
)
def test_the_fleet_is_listed_once_per_census_age_whoever_asks(api, budget, ask_at, lists):
    clock = Clock()
    api.reset_requests()
    for i, at in enumerate(ask_at):
        clock.now = T0 + at
        budget(f"n{i:02d}", clock).acquire(incident_id=f"i{i}")
    calls = api.requests.filter(method="GET", path_regex=LISTS)
    assert len(calls) == lists
    assert all(r.query.get("resourceVersion") == "0" for r in calls)  # from the watch cache
    census = decode(stored(api)[CENSUS_KEY])
    assert census is not None and census.domains == 20 and CLAIM_KEY not in stored(api)


@pytest.mark.parametrize(
    ("claim_age", "counts"),
    [(1.0, False), (CLAIM_TTL + 1, True)],  # another agent counts now / its claim is void (it died)
)
def test_a_claim_keeps_others_from_counting_until_it_expires(api, budget, client, claim_age, counts):
    clock = Clock()
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": DEFAULT_LEASE, "namespace": NS, "annotations": {BUDGET_ANNOTATION: ""}},
        "spec": {},
    }
    text = '{"version": 1, "holders": {}, "actions": [], "censusClaim": {"by": "n19", "at": %f}}' % (T0 - claim_age)
    lease["metadata"]["annotations"][BUDGET_ANNOTATION] = text
    api.put_object(lease)
    api.reset_requests()
    view = budget("n00", clock).acquire(incident_id="i0")
    assert len(api.requests.filter(method="GET", path_regex=LISTS)) == (1 if counts else 0)
    assert view.granted is counts
    if not counts:  # no census yet: no place, and why
        assert view.limit == 0 and "being counted by n19" in view.why_blocked


def test_a_watch_cache_behind_never_lets_two_agents_past_the_limit(api, budget):
    """The holders live in the Lease, written only with the resourceVersion read: however stale the Nodes
    and the census read from the cache, the last place goes to one agent."""
    clock = Clock()
    api.set_watch_cache_lag(10)  # half the fleet's Nodes not in the cache yet
    granted = [budget(f"n{i:02d}", clock).acquire(incident_id=f"i{i}").granted for i in range(20)]
    assert sum(granted) == 2
    assert (
        len(
            decode_state(
                api.get_object("leases", DEFAULT_LEASE, NS)["metadata"]["annotations"][BUDGET_ANNOTATION]
            ).holders
        )
        == 2
    )


def test_a_holder_is_dropped_only_when_gone_from_the_cache_and_from_etcd(api, budget):
    clock = Clock()
    assert budget("n00", clock).acquire(incident_id="i0").granted
    assert budget("n01", clock).acquire(incident_id="i1").granted
    assert not budget("n02", clock).acquire(incident_id="i2").granted  # 2 of 2
    api.delete_object("nodes", "n00")  # replaced: its place frees
    clock.now += CENSUS_MAX_AGE + 1
    api.set_watch_cache_lag(2)  # the cache (behind the claim's write too) still shows n00: it keeps its place
    assert not budget("n02", clock).acquire(incident_id="i2").granted
    assert "n00" in decode(stored(api)[CENSUS_KEY]).holders  # counted from the cache: found there
    clock.now += CENSUS_MAX_AGE + 1
    api.set_watch_cache_lag(0)  # caught up: n00 is gone
    assert budget("n02", clock).acquire(incident_id="i2").granted
    api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n30"}})
    assert budget("n01", clock).release().holders == ("n02",)
    assert budget("n30", clock).acquire(incident_id="i30").granted
    api.set_watch_cache_lag(2)  # n30 not in the cache yet: read again from etcd, present: it keeps its place
    assert not budget("n03", clock).acquire(incident_id="i3").granted


def _lease_with(census: object) -> dict:
    text = json.dumps({"version": 1, "holders": {}, "actions": [], CENSUS_KEY: census})
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": DEFAULT_LEASE, "namespace": NS, "annotations": {BUDGET_ANNOTATION: text}},
        "spec": {},
    }


GOOD = {"at": T0, "by": "n19", "domains": 20, "groups": {}}


@pytest.mark.parametrize(
    "census",
    [
        "not an object",
        [1, 2],
        {**GOOD, "at": "yesterday"},
        {**GOOD, "at": True},
        {**GOOD, "domains": -1},
        {**GOOD, "domains": 1.5},
        {**GOOD, "domains": 2**40},
        {key: value for key, value in GOOD.items() if key != "domains"},
        {**GOOD, "groups": ["zone=a"]},
        {**GOOD, "groups": {"zone=a": "many"}},
        {**GOOD, "groups": {"zone=a": {"nodes": "3"}}},
        {**GOOD, "groups": {"zone=a": {"nodes": 2, "domains": 3}}},  # more domains than nodes
        {**GOOD, "groups": {"zone=a": {"nodes": 2, "domains": 2, "showing": {"NeuronHealth": 5}}}},
        {**GOOD, "groups": {"zone=a": {"nodes": 2, "domains": 2, "showing": {}, "young": {"NeuronHealth": 1}}}},
        {**GOOD, "key": "of other settings", "at": T0 - 10 * CENSUS_MAX_AGE},
        {**GOOD, "at": T0 + 10 * CENSUS_MAX_AGE},  # from the future
    ],
)
def test_a_hand_edited_or_corrupt_census_is_counted_again_never_refused(api, budget, census):
    api.put_object(_lease_with(census))
    api.reset_requests()
    view = budget("n00", Clock()).acquire(incident_id="i0")
    assert view.granted and view.limit == 2
    assert len(api.requests.filter(method="GET", path_regex=LISTS)) == 1  # counted again
    recounted = decode(stored(api)[CENSUS_KEY])
    assert recounted is not None and recounted.domains == 20 and recounted.by == "n00"


def test_the_holders_found_by_the_count_are_not_read_again_by_each_asker(api, budget):
    """The census keeps the holders' group labels: a fleet asking reads the Lease and its own Node, not every
    holder's Node on every ask (limit x askers reads)."""
    clock = Clock()
    for i in range(2):
        assert budget(f"n{i:02d}", clock).acquire(incident_id=f"i{i}").granted
    clock.now += CENSUS_MAX_AGE + 1
    assert not budget("n02", clock).acquire(incident_id="i2").granted  # counts again: finds both holders
    assert set(decode(stored(api)[CENSUS_KEY]).holders) == {"n00", "n01"}
    api.reset_requests()
    for i in range(3, 20):
        assert not budget(f"n{i:02d}", clock).acquire(incident_id=f"i{i}").granted
    reads = [r.path.rsplit("/", 1)[-1] for r in api.requests.filter(method="GET", path_regex=r"^/api/v1/nodes/")]
    assert reads == [f"n{i:02d}" for i in range(3, 20)]  # each asker's own Node only
