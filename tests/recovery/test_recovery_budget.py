"""The cluster budget (agent.recovery.budget) against the test API server with the real client:
the limit table, the action window, release, gone nodes, UltraServer domains, conflicts, a corrupt
Lease, and 15 agents of a 50-node cluster asking at once."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from agent.adapters.kube import KubeClient, KubeError
from agent.recovery.budget import (
    BUDGET_ANNOTATION,
    CLOCK_SKEW,
    ClusterBudget,
    budget_lease_name,
    budget_namespace,
    decode_state,
    resolve_limit,
    ultraserver_domain,
)
from agent.recovery.model import DEFAULT_LEASE, ULTRASERVER_LABEL, BudgetSettings, BudgetView

from helpers import kube_clients
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]

NS = "node-health-agent"
LEASE = DEFAULT_LEASE
T0 = 1_767_225_600.0
LEASE_PATH = rf"/namespaces/{NS}/leases"
ROOMY = BudgetSettings(max_actions=100)  # the default limit of places, room for many steps


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    kube_api_server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    return kube_api_server


def add_nodes(server: KubeApiServer, names: list[str], labels: dict[str, str] | None = None) -> None:
    for name in names:
        server.put_object(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})}}
        )


def nodes(n: int, prefix: str = "node") -> list[str]:
    return [f"{prefix}-{i:02d}" for i in range(n)]


@pytest.fixture
def kube(api: KubeApiServer, tmp_path: Path) -> Iterator[Callable[[], KubeClient]]:
    """``kube()``: a new real client (each agent has its own), closed after the test."""
    with kube_clients(api, tmp_path, timeout=10.0) as make:
        yield make


class Agents:
    """One ClusterBudget per node, sharing a clock; ``sleeps`` records the pauses between retries."""

    def __init__(self, make: Callable[[], KubeClient], settings: BudgetSettings, clock: Clock) -> None:
        self.make, self.settings, self.clock = make, settings, clock
        self.sleeps: list[float] = []
        self.shared = make()

    def __call__(self, node: str, *, client: KubeClient | None = None, **kw) -> ClusterBudget:
        kw.setdefault("sleep", self.sleeps.append)
        kw.setdefault("rng", lambda: 0.5)
        return ClusterBudget(
            client=client or self.shared,
            namespace=NS,
            lease_name=LEASE,
            node_name=node,
            settings=kw.pop("settings", self.settings),
            clock=self.clock,
            **kw,
        )


@pytest.fixture
def agents(kube) -> Callable[..., Agents]:
    return lambda settings=ROOMY, clock=None: Agents(kube, settings, clock or Clock())


def state(server: KubeApiServer):
    lease = server.get_object("leases", LEASE, NS)
    assert lease is not None, "no budget Lease"
    return decode_state(lease["metadata"]["annotations"][BUDGET_ANNOTATION])


def holders(server: KubeApiServer) -> dict[str, list[str]]:
    return {d: list(h.nodes) for d, h in state(server).holders.items()}


def writes(server: KubeApiServer) -> int:
    return sum(server.requests.count(method=m, path_regex=LEASE_PATH) for m in ("PUT", "POST"))


# ---- the limit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_unhealthy", "cap", "domains", "limit"),
    [
        ("10%", 10, 2, 1),  # 1 of 2 failing: repaired
        ("10%", 10, 4, 1),
        ("10%", 10, 1, 1),
        ("10%", 10, 10, 1),
        ("10%", 10, 11, 2),  # rounded up
        ("10%", 10, 50, 5),
        ("10%", 10, 99, 10),
        ("10%", 10, 200, 10),  # capped
        ("10%", None, 200, 20),
        ("33%", None, 10, 4),
        ("12.5%", None, 8, 1),
        ("100%", 10, 3, 3),
        ("10%", 10, 0, 0),  # no matching node: nothing to grant
        (3, 10, 50, 3),  # a count: the cap does not apply
        (3, 10, 2, 3),
        (1, None, 0, 0),
    ],
)
def test_resolve_limit(max_unhealthy, cap, domains, limit):
    settings = BudgetSettings(max_unhealthy=max_unhealthy, max_unhealthy_cap=cap)
    assert resolve_limit(settings, domains=domains) == limit


def test_names():
    assert budget_lease_name() == "node-health-agent-recovery-budget"
    assert budget_lease_name("Prod_EU.1") == "node-health-agent-recovery-budget-prod-eu.1"
    assert budget_namespace({"POD_NAMESPACE": "kube-system"}) == "kube-system"
    assert budget_namespace({}) == "node-health-agent"
    assert ultraserver_domain({"metadata": {"name": "n1", "labels": {ULTRASERVER_LABEL: "us-7"}}}) == "us-7"
    assert ultraserver_domain({"metadata": {"name": "n1"}}) == "n1"


@pytest.mark.parametrize(("cluster", "granted"), [(2, 1), (4, 1), (50, 5)])
def test_small_and_large_clusters(api, agents, cluster, granted):
    names = nodes(cluster)
    add_nodes(api, names)
    a = agents()
    views = [a(n).acquire(incident_id=f"i/{n}") for n in names[: granted + 1]]
    assert [v.this_node_holds for v in views] == [True] * granted + [False]
    assert views[-1].limit == granted and not views[-1].can_start
    assert sorted(holders(api)) == names[:granted]
    assert writes(api) == granted + 1  # the first asker's census claim, the grants: the refusal wrote nothing


def test_the_cap_and_control_plane_nodes(api, agents):
    add_nodes(api, nodes(200))
    assert agents()("node-00").view(node_labels={}).limit == 10
    assert agents(BudgetSettings(max_unhealthy_cap=None))("node-00").view(node_labels={}).limit == 20


def test_control_plane_nodes_are_not_counted(api, agents):
    add_nodes(api, nodes(10))
    add_nodes(api, nodes(5, "cp"), {"node-role.kubernetes.io/control-plane": ""})
    assert agents(BudgetSettings(max_unhealthy="20%"))("node-00").view(node_labels={}).limit == 2  # not 3


def test_node_selector_scopes_the_count(api, agents):
    add_nodes(api, nodes(10, "gpu"), {"pool": "gpu"})
    add_nodes(api, nodes(30, "cpu"), {"pool": "cpu"})
    a = agents(BudgetSettings(max_unhealthy="20%", node_selector="pool=gpu"))
    assert a("gpu-00").view(node_labels={"pool": "gpu"}).limit == 2


# ---- writes, the window, release ----------------------------------------------------------------------


def test_acquire_creates_the_lease_and_records_the_writer(api, agents):
    add_nodes(api, nodes(2))
    view = agents()("node-00").acquire(incident_id="NeuronHealth/X/uid/1")
    assert view == BudgetView(
        holders=("node-00",),
        limit=1,
        actions_in_window=1,
        max_actions=100,
        this_node_holds=True,
        granted=True,
        window=600.0,
        frees_at=T0 + 600.0,
        max_device_actions=20,
        skew=CLOCK_SKEW,
    )
    lease = api.get_object("leases", LEASE, NS)
    assert lease["spec"]["holderIdentity"] == "node-00"
    assert lease["spec"]["renewTime"] == "2026-01-01T00:00:00.000001Z"  # never a whole second (see _micro_time)
    s = state(api)
    assert (s.holders["node-00"].incident, s.holders["node-00"].since, s.actions) == ("NeuronHealth/X/uid/1", T0, (T0,))
    assert api.requests.count(method="POST", path_regex=LEASE_PATH) == 1


def test_keeping_a_place_counts_each_step(api, agents):
    add_nodes(api, nodes(2))
    clock = Clock()
    b = agents(clock=clock)("node-00")
    b.acquire(incident_id="i1")
    clock.now += 5
    view = b.acquire(incident_id="i1")
    assert (view.holders, view.actions_in_window) == (("node-00",), 2)
    assert state(api).holders["node-00"].since == T0  # the place was taken at the first step


def test_the_action_window(api, agents):
    add_nodes(api, nodes(10))
    clock = Clock()
    a = agents(BudgetSettings(max_unhealthy=10, max_actions=2, window=600), clock)
    assert a("node-00").acquire(incident_id="i0").this_node_holds
    clock.now += 10
    assert a("node-01").acquire(incident_id="i1").this_node_holds
    clock.now += 10
    before = writes(api)
    refused = a("node-02").acquire(incident_id="i2")
    assert (refused.this_node_holds, refused.can_start, refused.actions_in_window) == (False, False, 2)
    assert writes(api) == before
    clock.now = T0 + 600.5  # node-00's step left the window
    view = a("node-02").acquire(incident_id="i2")
    assert (view.this_node_holds, view.actions_in_window) == (True, 2)
    assert state(api).actions == (T0 + 10, T0 + 600.5)  # expired times are dropped when written


def test_release(api, agents):
    add_nodes(api, nodes(4))
    a = agents()
    a("node-00").acquire(incident_id="i0")
    assert not a("node-01").acquire(incident_id="i1").this_node_holds
    view = a("node-00").release()
    assert (view.holders, view.this_node_holds, view.can_start) == ((), False, True)
    before = writes(api)
    a("node-00").release()  # nothing held: nothing written
    a("node-03").release()
    assert writes(api) == before
    assert a("node-01").acquire(incident_id="i1").this_node_holds


def test_release_without_a_lease_writes_nothing(api, agents):
    add_nodes(api, nodes(2))
    assert agents()("node-00").release().holders == ()
    assert api.get_object("leases", LEASE, NS) is None


# ---- gone nodes ---------------------------------------------------------------------------------------


def test_a_replaced_node_frees_its_place(api, agents):
    add_nodes(api, nodes(4))
    a = agents()
    a("node-00").acquire(incident_id="i0")
    assert not a("node-01").view(node_labels={}).can_start
    api.delete_object("nodes", "node-00")  # the instance was replaced: its Node is gone
    view = a("node-01").view(node_labels={})
    assert (view.holders, view.can_start) == ((), True)
    assert holders(api) == {"node-00": ["node-00"]}  # a view writes nothing
    assert a("node-01").acquire(incident_id="i1").this_node_holds
    assert holders(api) == {"node-01": ["node-01"]}


def test_a_holder_outside_the_node_selector_is_looked_up_before_being_dropped(api, agents):
    add_nodes(api, nodes(4, "gpu"), {"pool": "gpu"})
    add_nodes(api, ["other"], {"pool": "cpu"})
    a = agents(BudgetSettings(max_unhealthy=1, node_selector="pool=gpu"))
    assert a("other").acquire(incident_id="x").this_node_holds  # counted against the budget all the same
    assert a("gpu-00").view(node_labels={"pool": "gpu"}).holders == ("other",)
    api.delete_object("nodes", "other")
    assert a("gpu-00").acquire(incident_id="g").holders == ("gpu-00",)


# ---- UltraServers ---------------------------------------------------------------------------------------


def test_an_ultraserver_is_one_failure_domain(api, agents):
    for us in ("us-a", "us-b"):
        add_nodes(api, nodes(4, us), {ULTRASERVER_LABEL: us})
    add_nodes(api, ["plain-0", "plain-1"])
    a = agents(BudgetSettings(max_unhealthy="50%"))  # 4 domains: 2 places
    first = a("us-a-00").acquire(incident_id="a0")
    assert (first.holders, first.limit) == (("us-a",), 2)
    assert a("us-a-01").acquire(incident_id="a1").holders == ("us-a",)  # the same place
    assert a("plain-0").acquire(incident_id="p0").holders == ("plain-0", "us-a")
    assert not a("us-b-00").acquire(incident_id="b0").this_node_holds
    assert holders(api) == {"us-a": ["us-a-00", "us-a-01"], "plain-0": ["plain-0"]}
    assert a("us-a-00").view(node_labels={ULTRASERVER_LABEL: "us-a"}).this_node_holds
    a("us-a-00").release()
    assert holders(api)["us-a"] == ["us-a-01"]  # still held by its other node
    assert not a("us-b-00").acquire(incident_id="b0").this_node_holds
    a("us-a-01").release()
    assert a("us-b-00").acquire(incident_id="b0").holders == ("plain-0", "us-b")


# ---- conflicts ----------------------------------------------------------------------------------------


def test_a_conflict_is_read_again_and_redone(api, agents):
    add_nodes(api, nodes(4))
    a = agents()
    a("node-00").acquire(incident_id="i0")
    a("node-00").release()
    api.faults.add(method="PUT", path_regex=LEASE_PATH, status=409, count=2)
    view = a("node-01").acquire(incident_id="i1")
    assert view.this_node_holds
    assert api.requests.count(method="PUT", path_regex=LEASE_PATH, status=409) == 2
    assert a.sleeps == [0.5 * 0.1, 0.5 * 0.2]  # rng() * base * 2**attempt


def test_endless_conflicts_give_up_with_a_transient_error(api, agents):
    add_nodes(api, nodes(4))
    a = agents()
    a("node-00").acquire(incident_id="i0")
    api.faults.add(method="PUT", path_regex=LEASE_PATH, status=409, count=None)
    with pytest.raises(KubeError) as info:
        a("node-00", attempts=3).release()
    assert info.value.status == 409 and info.value.transient  # the loop retries later
    assert "still conflicting after 3 attempts" in str(info.value)
    assert len(a.sleeps) == 2
    api.faults.clear()
    assert a("node-00").release().holders == ()


class SlowWrites(KubeClient):
    """A real client whose Lease writes take ``seconds`` on the shared clock (a busy API server)."""

    def __init__(self, inner: KubeClient, clock: Clock, seconds: float) -> None:
        self.__dict__.update(inner.__dict__)
        self._clock, self._seconds = clock, seconds

    def replace_lease(self, namespace: str, name: str, body):
        self._clock.now += self._seconds
        return super().replace_lease(namespace, name, body)


@pytest.mark.parametrize(
    ("answer_s", "sleeps"),
    [
        (0.0, [0.5 * 0.1, 0.5 * 0.2, 0.5 * 0.4]),  # a quick server: the floor, 0.05 s x 2**n
        (2.0, [0.5 * 4.0, 0.5 * 8.0, 0.5 * 10.0]),  # each lost round took 2 s: 2 s x 2**n, capped at 10 s
    ],
)
def test_a_lost_round_waits_in_proportion_to_the_server_then_reads_once(api, agents, answer_s, sleeps):
    """When a rule misfires fleet-wide, each granted place makes every other asker lose its write at the same
    moment: losers that read again within 0.1 s lose together again, round after round (bench/fleetsim.py
    misfire: 44 of 100 agents re-read in one simulated second). The pause scales with the server's answers."""
    add_nodes(api, nodes(4))
    a = agents()
    a("node-03").acquire(incident_id="i3")
    a("node-03").release()
    api.faults.add(method="PUT", path_regex=LEASE_PATH, status=409, count=3)
    api.reset_requests()
    view = a("node-00", client=SlowWrites(a.make(), a.clock, answer_s)).acquire(incident_id="i0")
    assert view.granted
    assert a.sleeps == pytest.approx(sleeps)
    lease = [(r.method, r.status) for r in api.requests if "/leases" in r.path]
    assert lease == [("GET", 200), ("PUT", 409)] * 3 + [("GET", 200), ("PUT", 200)]  # one read after each 409


class Interleaved(KubeClient):
    """A real client that lets another agent act right after its first read of the Lease."""

    def __init__(self, inner: KubeClient, meanwhile: Callable[[], object]) -> None:
        self.__dict__.update(inner.__dict__)
        self._meanwhile: Callable[[], object] | None = meanwhile

    def get_lease(self, namespace: str, name: str):
        try:
            return super().get_lease(namespace, name)
        finally:
            meanwhile, self._meanwhile = self._meanwhile, None
            if meanwhile is not None:
                meanwhile()


@pytest.mark.parametrize("lease_exists", [True, False])
def test_two_agents_never_both_take_the_last_place(api, agents, kube, lease_exists):
    add_nodes(api, nodes(4))
    a = agents()
    if lease_exists:
        a("node-03").acquire(incident_id="i3")
        a("node-03").release()
    other = a("node-01")
    racer = a("node-00", client=Interleaved(kube(), lambda: other.acquire(incident_id="i1")))
    view = racer.acquire(incident_id="i0")  # read (room), other wrote, our write conflicted, read again
    assert (view.holders, view.this_node_holds, view.can_start) == (("node-01",), False, False)
    assert holders(api) == {"node-01": ["node-01"]}
    method = "PUT" if lease_exists else "POST"
    assert api.requests.count(method=method, path_regex=LEASE_PATH, status=409) == 1


def test_api_errors_propagate(api, agents):
    add_nodes(api, nodes(2))
    b = agents()("node-00")
    with api.outage("refuse"), pytest.raises(KubeError) as info:
        b.acquire(incident_id="i0")
    assert info.value.transient
    api.faults.add(method="GET", path_regex=LEASE_PATH, status=403)
    with pytest.raises(KubeError) as info:
        b.acquire(incident_id="i0")
    assert info.value.status == 403


# ---- a corrupt Lease ------------------------------------------------------------------------------------


def put_lease(server: KubeApiServer, annotation: str) -> None:
    server.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NS, "annotations": {BUDGET_ANNOTATION: annotation}},
            "spec": {},
        }
    )


@pytest.mark.parametrize(
    ("annotation", "why"),
    [
        ("{not json", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"holders": {"n": {"nodes": []}}}', "budget: holders['n'].nodes: must be a non-empty list"),
        (
            '{"holders": {}, "actions": ["yesterday"]}',
            "actions[0]: must be a time (seconds since 1970, before year 10000), got 'yesterday'",
        ),
        ('{"version": 2, "holders": {}}', "written in format version 2 by a newer agent"),
        # Read back from the cluster as strictly as config (issue 13, finding 11):
        (
            '{"holders": {}, "actions": [NaN]}',
            "actions[0]: must be a time (seconds since 1970, before year 10000), got nan",
        ),
        (
            '{"holders": {}, "actions": [1, Infinity]}',
            "actions[1]: must be a time (seconds since 1970, before year 10000), got inf",
        ),
        (
            '{"holders": {}, "actions": [1e400]}',
            "actions[0]: must be a time (seconds since 1970, before year 10000), got inf",
        ),
        (
            '{"holders": {}, "actions": [-5]}',
            "actions[0]: must be a time (seconds since 1970, before year 10000), got -5",
        ),
        (
            '{"holders": {}, "actions": [1e300]}',
            "actions[0]: must be a time (seconds since 1970, before year 10000), got 1e+300",
        ),
        (
            '{"holders": {}, "actions": [true]}',
            "actions[0]: must be a time (seconds since 1970, before year 10000), got True",
        ),
        (
            '{"holders": {"n": {"nodes": ["n"], "since": NaN}}}',
            "holders['n'].since: must be a time (seconds since 1970, before year 10000), got nan",
        ),
        (
            '{"holders": {"n": {"nodes": ["n"], "incident": 7}}}',
            "holders['n'].incident: must be a string of at most 4096 characters, got 7",
        ),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
    ],
)
def test_a_corrupt_lease_refuses_to_grant_and_writes_nothing(api, agents, caplog, annotation, why):
    add_nodes(api, nodes(4))
    put_lease(api, annotation)
    a = agents()
    view = a("node-00").view(node_labels={})
    assert not view.can_start and why in view.problem and "deletes the Lease" in view.problem
    assert not a("node-00").acquire(incident_id="i0").can_start
    assert not a("node-01").release().can_start
    assert writes(api) == 0
    assert why in caplog.text
    api.delete_object("leases", LEASE, NS)  # what the operator does
    assert a("node-00").acquire(incident_id="i0").this_node_holds


def test_keys_of_a_later_version_are_kept(api, agents):
    add_nodes(api, nodes(4))
    put_lease(api, '{"version": 1, "holders": {}, "actions": [], "cooldown": {"until": 5}}')
    agents()("node-00").acquire(incident_id="i0")
    assert {k: v for k, v in state(api).extra.items() if k != "census"} == {"cooldown": {"until": 5}}


# ---- the scenario: 15 of 50 nodes fail at once ----------------------------------------------------------


def lease_history(server: KubeApiServer, since: int) -> list[dict]:
    """Every version of the budget Lease written after resourceVersion ``since`` (a watch replays them)."""
    api_client = server.api_client()
    try:
        stream = watch.Watch().stream(
            k8s.CoordinationV1Api(api_client).list_namespaced_lease,
            NS,
            resource_version=str(since),
            timeout_seconds=1,
            _preload_content=False,
        )
        versions = []
        for event in stream:
            obj = event["raw_object"]
            if obj["metadata"]["name"] == LEASE:
                versions.append(obj)
        return versions
    finally:
        api_client.close()


@pytest.mark.slow  # over 2 s: the full suite runs it, the fast lane does not
def test_fifteen_of_fifty_nodes_ask_at_once(api, kube):
    names = nodes(50)
    add_nodes(api, names)
    failing = names[::3][:15]
    settings = BudgetSettings(max_unhealthy="10%", max_unhealthy_cap=10, max_actions=100)
    start = api.resource_version

    def agent(i: int, name: str) -> ClusterBudget:
        rng = random.Random(i)
        return ClusterBudget(
            client=kube(),  # each agent its own client and connection
            namespace=NS,
            lease_name=LEASE,
            node_name=name,
            settings=settings,
            clock=Clock(T0 + i),
            sleep=lambda s: threading.Event().wait(s),
            rng=rng.random,
        )

    budgets = {name: agent(i, name) for i, name in enumerate(failing)}

    def all_at_once(asking: list[str]) -> dict[str, BudgetView]:
        barrier = threading.Barrier(len(asking))

        def ask(name: str) -> BudgetView:
            barrier.wait()
            return budgets[name].acquire(incident_id=f"NeuronHealth/NeuronHasError_DMA_ERROR/{name}/1")

        with ThreadPoolExecutor(max_workers=len(asking)) as pool:
            return dict(zip(asking, pool.map(ask, asking), strict=True))

    # Every first read of the Lease is answered 0.5 s late, as it stood when it arrived: all 15 find no Lease
    # and try to create it, so they race whatever the machine's load (threads alone may run one by one).
    api.faults.add(method="GET", path_regex=LEASE_PATH, kind="slow", delay=0.5, count=len(failing))
    views = all_at_once(failing)
    granted = [n for n, v in views.items() if v.this_node_holds]
    assert len(granted) == 5 == views[failing[0]].limit
    assert all(not v.can_start for n, v in views.items() if n not in granted)
    assert sorted(holders(api)) == sorted(granted)
    assert len(state(api).actions) == 5  # no lost update: one step per grant
    lost_races = sum(api.requests.count(method=m, path_regex=LEASE_PATH, status=409) for m in ("PUT", "POST"))
    assert lost_races >= len(failing) - 1  # they really raced: the 14 creates that found the Lease made

    # Then each release lets exactly one more through.
    served, waiting = list(granted), [n for n in failing if n not in granted]
    while waiting:
        budgets[served.pop(0)].release()
        views = all_at_once(waiting)
        newly = [n for n, v in views.items() if v.this_node_holds]
        assert len(newly) == 1, views
        waiting.remove(newly[0])
        served.append(newly[0])
        assert len(holders(api)) == 5
    assert sorted(holders(api)) == sorted(served[-5:])
    assert len(state(api).actions) == 15

    # Every version ever written: never more than 5 holders, each grant/release one write, none lost.
    history = [decode_state(v["metadata"]["annotations"][BUDGET_ANNOTATION]) for v in lease_history(api, start)]
    assert "censusClaim" in history[0].extra and history[0].holders == {}  # the first asker claimed the count
    history = history[1:]
    assert len(history) == 15 + 10  # 15 grants and 10 releases: refusals and lost races wrote nothing
    assert max(len(s.holders) for s in history) == 5
    for before, after in zip(history, history[1:], strict=False):
        added, removed = set(after.holders) - set(before.holders), set(before.holders) - set(after.holders)
        assert len(added) + len(removed) == 1  # each write changed exactly one place: nothing overwritten
        assert len(after.actions) == len(before.actions) + len(added)


# ---- times from the future (issue 13, finding 9) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("ahead", "future", "free_after"),
    [
        (86_400.0, 10, 600 + 300),  # a day ahead: counted as 5 min ahead, gone a window after that
        (3_600.0, 10, 600 + 300),
        (300.0, 0, 600 + 300),  # within the skew: as written
        (60.0, 0, 600 + 60),
        (0.0, 0, 600),
    ],
)
def test_step_times_in_the_future_count_as_at_most_the_skew_ahead(api, agents, caplog, ahead, future, free_after):
    """A node with a fast clock (or a hand edit) writing step times ahead must not block recovery everywhere
    until that time: they are clamped to now + CLOCK_SKEW when read, and written back clamped."""
    add_nodes(api, nodes(4))
    put_lease(api, json.dumps({"version": 1, "holders": {}, "actions": [T0 + ahead] * 10}))
    clock = Clock()
    a = agents(BudgetSettings(max_unhealthy=4, max_actions=10, window=600), clock)
    view = a("node-00").acquire(incident_id="i0")  # refused; the clamped times are written back
    assert (view.can_start, view.actions_in_window, view.future_actions) == (False, 10, future)
    assert ("in the future" in view.why_blocked) == bool(future)
    assert "10 of 10 disruptive steps in the last 10m used" in view.why_blocked
    assert ("lie more than 300s in the future" in caplog.text) == bool(future)
    clock.now = T0 + free_after - 0.5
    assert not a("node-00").acquire(incident_id="i0").granted
    clock.now = T0 + free_after + 0.5
    granted = a("node-00").acquire(incident_id="i0")
    assert granted.granted and granted.actions_in_window == 1
    assert state(api).actions == (clock.now,)


def test_future_step_times_are_written_back_clamped(api, agents):
    add_nodes(api, nodes(4))
    put_lease(api, json.dumps({"version": 1, "holders": {}, "actions": [T0 + 86_400.0]}))
    a = agents(BudgetSettings(max_unhealthy=4, max_actions=10, window=600))
    assert a("node-00").acquire(incident_id="i0").granted
    assert state(api).actions == (T0 + CLOCK_SKEW, T0)


@pytest.mark.parametrize(("method", "exists"), [("PUT", True), ("POST", False)])
def test_a_write_answered_500_but_applied_is_granted_and_counted_once(api, agents, method, exists):
    add_nodes(api, nodes(4))
    a = agents()
    if exists:
        a("node-03").acquire(incident_id="i3")
        a("node-03").release()
    before = len(state(api).actions) if exists else 0
    api.faults.add(method=method, path_regex=LEASE_PATH, status=500, kind="applied")
    view = a("node-00").acquire(incident_id="i0")
    assert view.granted and view.this_node_holds
    assert len(state(api).actions) == before + 1 and holders(api) == {"node-00": ["node-00"]}


def test_a_write_answered_500_and_not_applied_fails(api, agents):
    add_nodes(api, nodes(4))
    api.faults.add(method="POST", path_regex=LEASE_PATH, status=500)
    with pytest.raises(KubeError) as info:
        agents()("node-00").acquire(incident_id="i0")
    assert info.value.status == 500 and api.get_object("leases", LEASE, NS) is None


# ---- device steps: their own rate, no place ----------------------------------------------------------------


def test_device_steps_take_no_place_and_have_their_own_rate(api, agents):
    add_nodes(api, nodes(2))
    clock = Clock()
    b = agents(dataclasses.replace(ROOMY, max_device_actions=2), clock)("node-00")
    first = b.acquire_device(incident_id="GpuXid/GpuXid119/uid/1", problem="GpuXid")
    second = b.acquire_device(incident_id="GpuXid/GpuXid119/uid/1", problem="GpuXid")
    third = b.acquire_device(incident_id="GpuXid/GpuXid119/uid/1", problem="GpuXid")
    assert (first.granted, second.granted, third.granted) == (True, True, False)
    assert third.why_device_blocked == "2 of 2 device steps in the last 10m used"
    assert state(api).holders == {} and state(api).actions == () and state(api).device_actions == (T0, T0)
    assert b.acquire(incident_id="NeuronHealth/X/uid/2").granted  # node steps are not counted against them
    clock.now += 601
    assert b.acquire_device(incident_id="GpuXid/GpuXid119/uid/1", problem="GpuXid").granted  # the window passed
