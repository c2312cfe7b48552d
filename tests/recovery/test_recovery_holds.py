"""Holds on recovery (agent.recovery.holds): the pause Lease, the per-node veto, the per-reason switch,
the agent's own health; ``pause``/``resume``/``status`` through the command line. Real KubeClient
against tests/kubeapi; the recovery loop driven by ``step()`` with an injected clock."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.adapters.kube import KubeClient, KubeError
from agent.app.cli import main
from agent.app.wiring.checks import stale_checks
from agent.checks.model import ScheduledCheck
from agent.checks.scheduler import CheckStats
from agent.core.bus import Inbox, Publication, SnapshotFeed
from agent.core.types import ConditionSpec, Snapshot
from agent.recovery.budget import BUDGET_ANNOTATION, ClusterBudget
from agent.recovery.drain import DrainOutcome, DrainResult
from agent.recovery.flaps import FLAP_ANNOTATION
from agent.recovery.holds import (
    PAUSE_ANNOTATION,
    POOL_LABELS,
    VETO_ANNOTATION,
    CorruptPauses,
    HoldCollector,
    HoldGate,
    HoldKind,
    Pause,
    Pauses,
    PauseStore,
    Scope,
    decode_pauses,
    encode_pauses,
    pause_lease_name,
    pool_labels,
    veto_hold,
    with_pause,
)
from agent.recovery.ladder import HISTORY_ANNOTATION
from agent.recovery.loop import BUDGET_RETRY, BUDGET_RETRY_JITTER, RecoveryLoop
from agent.recovery.model import (
    BUILTIN_CONDITIONS,
    DEFAULT_LEASE,
    INCIDENT_ANNOTATION,
    ZONE_LABEL,
    Action,
    Blocked,
    BudgetSettings,
    GroupBudget,
    PolicyRule,
)
from agent.recovery.policyfile import DEFAULT_POLICY, load_policy

from helpers import wait_for
from helpers.recovery import (
    DMA,
    NODE,
    NS,
    OTHERS,
    T0,
    Clock,
    LoopHarness,
    agent_pod,
    kube_fixture,
    node_object,
    prepare,
    problem,
)
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]
__all__ = ["kube_fixture"]  # fixture: kube

LEASE = pause_lease_name()
POLICY = dataclasses.replace(DEFAULT_POLICY, startup_delay=0.0, budget=BudgetSettings(max_actions=100))
DRAINING = dataclasses.replace(
    POLICY,
    rules=(
        PolicyRule(
            condition="NeuronHealth",
            reasons=("NeuronHasError_*",),
            actions=(Action.CORDON, Action.DRAIN, Action.MARK_UNHEALTHY),
        ),
    ),
)


class Quiet:
    name = "quiet"
    interval = 60.0
    timeout = 10.0
    conditions = (ConditionSpec(type="NeuronDevices", reason="Ok", message="ok"),)

    def run(self, context):  # never called here
        raise AssertionError


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    """The namespace, the node and its agent's pod (``pause`` refuses where it sees no agent to reach)."""
    return prepare(kube_api_server, node_object(), agent_pod())


def put_pauses(api: KubeApiServer, text: str) -> None:
    api.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NS, "annotations": {PAUSE_ANNOTATION: text}},
            "spec": {},
        }
    )


def pause(api: KubeApiServer, *pauses: Pause) -> None:
    put_pauses(api, encode_pauses(Pauses(pauses=pauses)))


class Harness(LoopHarness):
    """The loop with its hold gate: the pause Lease, vetoes, the agent's health (``live``: the supervisor's
    view now; ``stale``: condition type -> the check that went quiet), on ``ticks`` (monotonic seconds)."""

    def __init__(self, api: KubeApiServer, client: KubeClient, *, policy=POLICY, node: dict | None = None) -> None:
        self.ticks = Clock(0.0)  # monotonic seconds, moved by the test
        self.live: dict[str, bool] = {}
        self.stale: dict[str, str] = {}
        self.gate = HoldGate(
            store=PauseStore(client=client, namespace=NS, lease_name=LEASE),
            client=client,
            node_name=NODE,
            recheck=2.0,
            monotonic=self.ticks,
            health=lambda: self.live,
            stale=lambda: self.stale,
            pools=pool_labels(policy.budget),  # as assembly wires it
        )
        super().__init__(api, client, policy=policy, node=node, holds=self.gate)


@pytest.fixture
def harness(api, kube) -> Callable[..., Harness]:
    return lambda **kw: Harness(api, kube(), **kw)


# ---- the pause annotation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"version": 9}', "newer agent"),
        ('{"version": "1"}', "pauses: version: must be a whole number from 1"),
        ('{"pauses": {}}', "pauses: pauses: must be a list"),
        ('{"pauses": [3]}', "pauses: pauses[0]: must be an object"),
        ('{"pauses": [{"scope": "zone", "value": "a"}]}', "pauses: pauses[0].scope: must be one of"),
        ('{"pauses": [{"scope": "node", "value": ""}]}', "a node pause needs a value"),
        ('{"pauses": [{"scope": "cluster", "value": "x"}]}', "a cluster pause needs no value"),
        ('{"pauses": [{"scope": "cluster", "since": "now"}]}', "pauses[0].since: must be a time"),
        ('{"pauses": [{"scope": "cluster", "by": 3}]}', "pauses[0].by: must be a string"),
    ],
)
def test_an_unreadable_pause_annotation_is_named(text, problem):
    with pytest.raises(CorruptPauses, match=problem.replace("[", r"\[").replace("]", r"\]")):
        decode_pauses(text)


def test_pauses_round_trip_and_keep_keys_of_a_later_version():
    pauses = Pauses(
        pauses=(
            Pause(scope=Scope.CLUSTER, by="alice", why="bad rule", since=T0),
            Pause(scope=Scope.REASON, value="Xid*", by="bob", since=T0 + 1),
        ),
        extra={"note": "kept"},
    )
    assert decode_pauses(encode_pauses(pauses)) == pauses
    assert decode_pauses(None) == decode_pauses("  ") == Pauses()


@pytest.mark.parametrize(
    ("scope", "value", "labels", "subject", "covers"),
    [
        (Scope.CLUSTER, "", {}, DMA, True),
        (Scope.NODE, NODE, {}, DMA, True),
        (Scope.NODE, "ip-10-0-0-2", {}, DMA, False),
        (Scope.POOL, "neuron-ng", {"eks.amazonaws.com/nodegroup": "neuron-ng"}, DMA, True),
        (Scope.POOL, "gpu", {"karpenter.sh/nodepool": "gpu"}, DMA, True),
        (Scope.POOL, "gpu", {"karpenter.sh/nodepool": "cpu"}, DMA, False),
        (Scope.REASON, "NeuronHasError_*", {}, DMA, True),
        (Scope.REASON, "Xid*", {}, DMA, False),
        (Scope.REASON, "NeuronHealth/*DMA*", {}, DMA, True),
        (Scope.REASON, "GpuXid/*", {}, DMA, False),
        (Scope.REASON, "*", {}, ("", ""), False),  # nothing to match (no incident)
    ],
)
def test_what_a_pause_covers(scope, value, labels, subject, covers):
    pause_ = Pause(scope=scope, value=value)
    assert pause_.covers(node=NODE, labels=labels, condition=subject[0], reason=subject[1]) is covers


POOL = "example.com/gpu-pool"  # an operator's own pool label


@pytest.mark.parametrize(
    ("groups", "pools"),
    [
        ((), POOL_LABELS),  # no groups: the well-known pool labels
        ((GroupBudget(label=ZONE_LABEL, max_unhealthy=1),), POOL_LABELS),  # a zone is no pool
        ((GroupBudget(label=ZONE_LABEL, max_unhealthy=1), GroupBudget(label=POOL, max_unhealthy=1)), (POOL,)),
        (
            (GroupBudget(label=POOL, max_unhealthy=1), GroupBudget(label="karpenter.sh/nodepool", max_unhealthy=2)),
            (POOL, "karpenter.sh/nodepool"),
        ),
    ],
)
def test_the_pool_labels_are_those_of_the_budget_groups(groups, pools):
    assert pool_labels(BudgetSettings(groups=groups)) == pools


@pytest.mark.parametrize(
    ("labels", "pools", "covers"),
    [
        ({POOL: "gpu-a"}, (POOL,), True),
        ({POOL: "gpu-b"}, (POOL,), False),
        ({"eks.amazonaws.com/nodegroup": "gpu-a"}, (POOL,), False),  # not a configured pool label
        ({POOL: "gpu-a"}, POOL_LABELS, False),  # the operator's label, not configured
    ],
)
def test_a_pool_pause_matches_the_configured_pool_labels(labels, pools, covers):
    pause_ = Pause(scope=Scope.POOL, value="gpu-a")
    assert pause_.covers(node=NODE, labels=labels, condition=DMA[0], reason=DMA[1], pools=pools) is covers


# ---- the loop honours them ------------------------------------------------------------------------------


def test_a_cluster_pause_stops_new_actions_and_resume_lets_them_go(harness, api):
    h = harness()
    pause(api, Pause(scope=Scope.CLUSTER, by="alice", why="bad rule rollout", since=T0 - 60))
    h.publish(problem())
    for _ in range(3):
        decision = h.step()
        h.clock.now += 5
    assert decision.actions == () and "cluster by alice" in decision.message and "bad rule rollout" in decision.message
    assert not h.cordoned() and h.incident() is None and h.marker.marked == [] and not h.budget_written()
    assert h.reasons() == ["RecoveryPaused"]  # told once, not every step
    assert h.loop.stats.blocked["Paused"] == 3
    metrics = {m.name: m for m in HoldCollector(stats=lambda: h.gate.stats, clock=h.clock).collect()}
    assert {s.labels["kind"]: s.value for s in metrics["node_health_agent_recovery_held"].samples}["Paused"] == 1
    assert metrics["node_health_agent_recovery_paused_seconds"].samples[0].value == pytest.approx(60 + 15)
    put_pauses(api, encode_pauses(Pauses()))
    assert h.step().actions == (Action.CORDON, Action.MARK_UNHEALTHY)
    assert h.cordoned() and h.marker.marked == [NODE]


@pytest.mark.parametrize(
    ("scope", "value", "labels", "held"),
    [
        (Scope.NODE, NODE, {}, True),
        (Scope.NODE, "ip-10-0-0-9", {}, False),
        (Scope.POOL, "neuron-ng", {"eks.amazonaws.com/nodegroup": "neuron-ng"}, True),
        (Scope.POOL, "other-ng", {"eks.amazonaws.com/nodegroup": "neuron-ng"}, False),
        (Scope.REASON, "NeuronHasError_DMA*", {}, True),
        (Scope.REASON, "NeuronHasError_SRAM*", {}, False),
    ],
)
def test_a_narrow_pause_holds_only_what_it_names(harness, api, scope, value, labels, held):
    h = harness(node=node_object(labels=labels))
    pause(api, Pause(scope=scope, value=value, by="bob", since=T0))
    h.publish(problem())
    decision = h.step()
    assert (decision.actions == ()) is held
    assert h.cordoned() is not held
    assert ("RecoveryPaused" in h.reasons()) is held


def test_a_corrupt_pause_lease_is_a_cluster_wide_pause_and_says_so(harness, api):
    h = harness()
    put_pauses(api, "{not json")
    h.publish(problem())
    decision = h.step()
    assert decision.actions == () and not h.cordoned() and h.marker.marked == []
    (event,) = [e for e in h.told if e.reason == "RecoveryPaused"]
    assert "unreadable" in event.message and "treated as a cluster-wide pause" in event.message


@pytest.mark.parametrize(
    "text",
    [
        '{"pauses": [{"scope": "cluster", "since": 1' + "0" * 400 + "}]}",
        '{"pauses": [{"scope": "cluster", "since": -1e308}]}',
    ],
    ids=["since-too-large-for-a-float", "since-minus-1e308"],
)
def test_a_pause_lease_with_an_absurd_time_is_a_cluster_wide_pause_never_a_failed_step(harness, api, text):
    """Issue 33: an integer too large for a float raised OverflowError out of every step (nothing acted, no
    Event said why); now it is an unreadable pause, held and told, and the step does not fail."""
    h = harness()
    put_pauses(api, text)
    h.publish(problem())
    for _ in range(3):
        h.clock.now += 5
        assert h.step().actions == ()
    assert not h.cordoned() and h.marker.marked == [] and h.loop.stats.errors == 0
    (event,) = [e for e in h.told if e.reason == "RecoveryPaused"]
    assert "pauses: pauses[0].since: must be a time" in event.message
    assert "treated as a cluster-wide pause" in event.message


@pytest.mark.parametrize(
    ("value", "vetoed", "says"),
    [
        ("disk swap, alice", True, "disk swap, alice"),
        ("  ", True, "no reason given"),  # issue 33: any non-empty value is a veto, whitespace too
        ("\t\n", True, "no reason given"),
        ("", False, ""),
        (None, False, ""),
    ],
    ids=["why", "spaces", "tab-newline", "empty", "absent"],
)
def test_any_non_empty_veto_annotation_is_a_veto(value, vetoed, says):
    annotations = {} if value is None else {VETO_ANNOTATION: value}
    hold = veto_hold({"metadata": {"name": "n", "annotations": annotations}})
    assert (hold is not None) is vetoed
    if hold is not None:
        assert hold.kind is HoldKind.VETOED and f"({VETO_ANNOTATION}: {says})" in hold.message


def test_a_whitespace_veto_holds_the_node_through_the_loop(harness):
    h = harness(node=node_object(annotations={VETO_ANNOTATION: "   "}))
    h.publish(problem())
    assert h.step().actions == ()
    assert not h.cordoned() and h.reasons() == ["RecoveryVetoed"]


def test_a_veto_annotation_on_the_node_holds_it(harness):
    h = harness(node=node_object(annotations={VETO_ANNOTATION: "disk swap, alice"}))
    h.publish(problem())
    assert h.step().actions == ()
    assert not h.cordoned() and h.reasons() == ["RecoveryVetoed"]
    assert "disk swap, alice" in h.told[0].message


def test_no_action_while_a_producer_is_unhealthy(harness):
    """Issue 14: Publication.agent_healthy is honoured (a stopped kmsg reader may leave a stale problem)."""
    h = harness()
    h.publish(problem(), health={"kmsg_reader": False, "main_loop": True})
    assert h.step().actions == ()
    assert not h.cordoned() and h.marker.marked == [] and not h.budget_written()
    assert h.reasons() == ["RecoveryAgentUnhealthy"] and "kmsg_reader unhealthy" in h.told[0].message
    h.publish(problem(), health={"kmsg_reader": True, "main_loop": True})
    assert h.step().actions == (Action.CORDON, Action.MARK_UNHEALTHY)


def test_no_action_while_a_producer_is_unhealthy_now_though_its_last_publication_was_healthy(harness):
    """A reader that stopped publishes nothing: the last publication still says healthy; live health says not."""
    h = harness()
    h.publish(problem(), health={"kmsg_reader": True})
    h.live = {"kmsg_reader": False, "main_loop": True}
    assert h.step().actions == ()
    assert not h.cordoned() and h.reasons() == ["RecoveryAgentUnhealthy"]
    h.live = {"kmsg_reader": True, "main_loop": True}
    assert h.step().actions == (Action.CORDON, Action.MARK_UNHEALTHY)


@pytest.mark.parametrize(
    ("stale", "held"), [({"NeuronHealth": "neuron-devices"}, True), ({"GpuEcc": "gpu-ecc"}, False)]
)
def test_no_action_on_a_condition_whose_check_went_quiet(harness, stale, held):
    h = harness()
    h.publish(problem())
    h.stale = stale
    assert (h.step().actions == ()) is held
    assert h.cordoned() is not held
    if held:
        assert h.reasons() == ["RecoveryAgentUnhealthy"] and "check neuron-devices" in h.told[0].message


def test_stale_checks_are_those_without_a_completed_run_for_three_intervals():
    clock = Clock()
    spec = ScheduledCheck(check=Quiet(), interval=60.0, timeout=10.0, kind="python", origin="test", jitter=0.0)
    scheduler = SimpleNamespace(checks=(spec,), stats={"quiet": CheckStats(kind="python", origin="test")})
    stale = stale_checks(scheduler, clock=clock)
    clock.now += 190  # 3 * 60 + 10: not yet (counted from the start while it never completed)
    assert stale() == {}
    clock.now += 1
    assert stale() == {"NeuronDevices": "quiet"}
    scheduler.stats["quiet"].last_success = clock.now - 5
    assert stale() == {}


def test_the_default_gate_honours_agent_health_too(api, kube):
    """A loop built without a gate (no pause Lease) still never acts for an unhealthy agent."""
    client = kube()
    api.put_object(node_object())
    feed = SnapshotFeed(initial=Snapshot(conditions=(), generated_at=T0, seeded=False))
    snapshot = Snapshot(conditions=(problem(),), generated_at=T0, seeded=True, provenance=BUILTIN_CONDITIONS)
    feed.publish(snapshot=snapshot, events=[], health={"check_scheduler": False})
    loop = RecoveryLoop(
        feed=feed, inbox=Inbox(), client=client, node_name=NODE, policy=POLICY, enabled=False, clock=Clock()
    )
    assert loop.step().actions == ()
    assert loop.stats.would == {}


# ---- a drain in progress -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["pause", "veto", "unhealthy"])
def test_a_drain_stops_before_the_next_pod(harness, api, how):
    """Pods are 'evicted' one per second of the injected monotonic clock; the hold appears after the
    second pod; the gate re-reads every 2 s: the drain stops within 2 more pods, the mark never comes."""
    h = harness(policy=DRAINING)
    evicted: list[int] = []

    def drainer(stop: threading.Event, report) -> DrainResult:
        for pod in range(20):
            if stop.is_set():
                return DrainResult(outcome=DrainOutcome.STOPPED)
            evicted.append(pod)
            h.ticks.now += 1.0
            if pod == 1:
                if how == "pause":
                    pause(api, Pause(scope=Scope.CLUSTER, by="carol", since=h.clock()))
                elif how == "veto":
                    node = h.node()
                    node["metadata"].setdefault("annotations", {})[VETO_ANNOTATION] = "stop"
                    api.put_object(node)
                else:
                    h.publish(problem(), health={"kmsg_reader": False})
        return DrainResult(outcome=DrainOutcome.DONE)

    h.loop._drainer = drainer
    h.publish(problem())
    h.step()
    assert 2 <= len(evicted) <= 4
    assert h.marker.marked == [] and h.incident()["drain"] == "stopped"
    assert "RecoveryDrainHeld" in h.reasons()


# ---- a pause written while a step acts (found by bench/fleetsim.py pause_mid_wave) ---------------------------


def test_a_pause_written_while_the_budget_is_asked_holds_the_step_and_gives_the_place_back(harness, api, monkeypatch):
    """At fleet scale the budget ask takes seconds (a LIST of every Node, Lease conflicts)."""
    h = harness()
    asked = ClusterBudget.acquire

    def acquire_then_paused(self, **kwargs):
        answer = asked(self, **kwargs)
        pause(api, Pause(scope=Scope.CLUSTER, by="alice", since=h.clock()))
        return answer

    monkeypatch.setattr(ClusterBudget, "acquire", acquire_then_paused)
    h.publish(problem())
    decision = h.step()
    assert decision.actions == () and "cluster by alice" in decision.message
    assert not h.cordoned() and h.marker.marked == [] and h.reasons() == ["RecoveryPaused"]
    assert h.loop.stats.budget.holders == ()  # the place it was given is free again
    monkeypatch.setattr(ClusterBudget, "acquire", asked)
    put_pauses(api, encode_pauses(Pauses()))
    h.clock.now += 5
    assert h.step().actions == (Action.CORDON, Action.MARK_UNHEALTHY)
    assert h.cordoned() and h.marker.marked == [NODE]


@pytest.mark.parametrize("how", ["pause", "veto"])
def test_a_hold_that_comes_after_the_cordon_holds_the_remedy(harness, api, monkeypatch, how):
    """Between the step's hold check and the remedy lie the cordon, the drain and the evidence (up to 30 s)."""
    from agent.recovery import node as node_actions

    h = harness()
    cordon = node_actions.cordon

    def cordon_then_held(*args, **kwargs):
        update = cordon(*args, **kwargs)
        if how == "pause":
            pause(api, Pause(scope=Scope.CLUSTER, by="carol", since=h.clock()))
        else:
            node = h.node()
            node["metadata"].setdefault("annotations", {})[VETO_ANNOTATION] = "stop"
            api.put_object(node)
        return update

    monkeypatch.setattr(node_actions, "cordon", cordon_then_held)
    h.publish(problem())
    h.step()
    assert h.cordoned() and h.marker.marked == [] and h.incident()["done"] == ["cordon"]
    assert h.reasons()[-1] == ("RecoveryPaused" if how == "pause" else "RecoveryVetoed")
    assert h.loop.stats.actions[("mark-unhealthy", "ok")] == 0
    monkeypatch.setattr(node_actions, "cordon", cordon)
    if how == "pause":
        put_pauses(api, encode_pauses(Pauses()))
    else:
        node = h.node()
        del node["metadata"]["annotations"][VETO_ANNOTATION]
        api.put_object(node)
    h.clock.now += 5
    assert h.step().actions == (Action.MARK_UNHEALTHY,)
    assert h.marker.marked == [NODE]


# ---- the commands ------------------------------------------------------------------------------------------


def run_cli(api: KubeApiServer, tmp_path: Path, *argv: str) -> int:
    return main([argv[0], "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")), *argv[1:]])


def lease_pauses(api: KubeApiServer) -> Pauses:
    lease = api.get_object("leases", LEASE, NS)
    assert lease is not None
    return decode_pauses(lease["metadata"]["annotations"][PAUSE_ANNOTATION])


def events(api: KubeApiServer) -> list[dict]:
    return [e for e in api.list_objects("events", NS) if e["involvedObject"]["kind"] == "Lease"]


def test_pause_and_resume_record_who_why_when_and_leave_events(api, tmp_path, capsys):
    assert run_cli(api, tmp_path, "pause", "--reason", "bad rule", "--by", "alice") == 0
    assert run_cli(api, tmp_path, "pause", "--condition-reason", "GpuXid*", "--by", "bob") == 0
    (cluster, xid) = sorted(lease_pauses(api).pauses, key=lambda p: p.key)
    assert (cluster.scope, cluster.by, cluster.why) == (Scope.CLUSTER, "alice", "bad rule") and cluster.since > 0
    assert (xid.scope, xid.value, xid.by) == (Scope.REASON, "GpuXid*", "bob")
    capsys.readouterr()
    assert run_cli(api, tmp_path, "status") == 0
    out = capsys.readouterr().out
    assert "cluster by alice" in out and "bad rule" in out and "condition-reason=GpuXid* by bob" in out
    assert run_cli(api, tmp_path, "resume", "--by", "alice") == 0
    assert [p.key for p in lease_pauses(api).pauses] == ["condition-reason=GpuXid*"]
    assert run_cli(api, tmp_path, "resume", "--all") == 0
    assert lease_pauses(api).pauses == ()
    reasons = [e["reason"] for e in sorted(events(api), key=lambda e: e["metadata"]["creationTimestamp"])]
    assert sorted(reasons) == ["RecoveryPaused", "RecoveryPaused", "RecoveryResumed", "RecoveryResumed"]
    assert any("alice" in e["message"] and "bad rule" in e["message"] for e in events(api))


def test_resume_with_nothing_paused_changes_nothing(api, tmp_path, capsys):
    assert run_cli(api, tmp_path, "resume", "--node", NODE) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert api.get_object("leases", LEASE, NS) is None and events(api) == []


def test_a_corrupt_pause_lease_is_not_written_over_and_status_says_paused_everywhere(api, tmp_path, capsys):
    put_pauses(api, "{")
    assert run_cli(api, tmp_path, "resume") == 1
    err = capsys.readouterr().err
    assert "unreadable" in err and f"kubectl annotate lease -n {NS} {LEASE} {PAUSE_ANNOTATION}-" in err
    assert api.get_object("leases", LEASE, NS)["metadata"]["annotations"][PAUSE_ANNOTATION] == "{"
    assert run_cli(api, tmp_path, "status", "--json") == 0
    view = json.loads(capsys.readouterr().out)
    assert "unreadable" in view["pauses"]["problem"]


def test_the_cli_never_crashes_on_records_with_times_too_large_for_a_float(api, tmp_path, capsys):
    """Issue 33: an integer too large for a float in the pause Lease, the budget Lease or a Node's records made
    ``status``, ``pause`` and ``resume`` crash with OverflowError: the off switch was unusable from the CLI."""
    big = "1" + "0" * 400
    put_pauses(api, '{"pauses": [{"scope": "cluster", "since": ' + big + "}]}")
    api.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": DEFAULT_LEASE,
                "namespace": NS,
                "annotations": {BUDGET_ANNOTATION: '{"actions": [' + big + "]}"},
            },
            "spec": {},
        }
    )
    record = '{"id": "x", "condition": "NeuronHealth", "reason": "r", "since": ' + big + ', "opened": 1}'
    api.put_object(
        node_object(
            "hostile",
            annotations={
                INCIDENT_ANNOTATION: record,
                HISTORY_ANNOTATION: '{"rungs": [{"step": -5, "at": ' + big + "}]}",
                FLAP_ANNOTATION: '{"count": 2, "lastUncordon": ' + big + "}",
            },
        )
    )
    assert run_cli(api, tmp_path, "status", "--json") == 0
    view = json.loads(capsys.readouterr().out)
    assert "pauses: pauses[0].since: must be a time" in view["pauses"]["problem"]
    assert view["budget"]["state"].startswith("corrupt: budget: actions[0]: must be a time")
    assert run_cli(api, tmp_path, "pause", "--node", "hostile") == 1
    err = capsys.readouterr().err
    assert "pauses: pauses[0].since: must be a time" in err and "Traceback" not in err
    assert run_cli(api, tmp_path, "resume", "--all") == 0  # lifts every pause, also from an unreadable record
    out, err = capsys.readouterr()
    assert "pauses: pauses[0].since: must be a time" in out and "Traceback" not in err


@pytest.mark.parametrize("argv", [["pause", "--node", ""], ["pause", "--pool", " "]])
def test_an_empty_selector_is_refused(api, tmp_path, argv, capsys):
    assert run_cli(api, tmp_path, *argv) == 2
    assert "needs a non-empty value" in capsys.readouterr().err


def test_two_pausers_at_once_both_land(api, kube):
    """Read-modify-write with the resourceVersion: concurrent pauses never lose one another."""
    stores = [PauseStore(client=kube(), namespace=NS, lease_name=LEASE) for _ in range(4)]
    threads = [
        threading.Thread(
            target=s.change, args=(lambda p, i=i: with_pause(p, Pause(scope=Scope.NODE, value=f"n{i}", since=T0)),)
        )
        for i, s in enumerate(stores)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.value for p in lease_pauses(api).pauses) == ["n0", "n1", "n2", "n3"]


def test_hold_kinds_are_the_event_reasons():
    assert {f"Recovery{k.value}" for k in HoldKind} == {"RecoveryAgentUnhealthy", "RecoveryVetoed", "RecoveryPaused"}


def test_a_publication_without_health_counts_as_healthy():
    assert Publication(number=1, snapshot=Snapshot(conditions=(), generated_at=T0)).agent_healthy


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_kubectl_node_health_pause_and_resume(api, tmp_path, command):
    """``kubectl node-health pause|resume`` reach the commands (anything else stays ``status``)."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    if command == "resume":
        pause(api, Pause(scope=Scope.NODE, value=NODE, by="alice", since=T0))
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from agent.app.cli import kubectl_plugin; sys.exit(kubectl_plugin())"]
        + [command, "--kubeconfig", str(kubeconfig), "--node", NODE, "--by", "bob"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert [p.key for p in lease_pauses(api).pauses] == ([f"node={NODE}"] if command == "pause" else [])
    assert f"recovery {'paused' if command == 'pause' else 'resumed'}" in proc.stdout


# ---- the pause Lease read periodically, and pools as the policy names them ---------------------------------

POOL_POLICY = f"""\
startupDelay: 0s
budget:
  maxActions: 100
  groups:
    - label: {ZONE_LABEL}
      maxUnhealthy: 1
    - label: {POOL}
      maxUnhealthy: 1
"""


def test_pause_by_pool_pauses_exactly_the_nodes_of_that_pool_by_the_configured_label(api, kube, tmp_path):
    """``pause --pool gpu-a`` with ``budget.groups`` on the operator's own label: every agent judges its own
    node with that label; a node of another pool, or with gpu-a under a label not configured, goes on."""
    (tmp_path / "policy.yaml").write_text(POOL_POLICY)
    policy = load_policy(tmp_path / "policy.yaml")
    nodes = {
        "n-a1": {POOL: "gpu-a", ZONE_LABEL: "us-west-2a"},
        "n-a2": {POOL: "gpu-a", ZONE_LABEL: "us-west-2b"},
        "n-b1": {POOL: "gpu-b", ZONE_LABEL: "us-west-2a"},
        "n-ng": {"eks.amazonaws.com/nodegroup": "gpu-a", ZONE_LABEL: "us-west-2a"},
        "n-zone": {ZONE_LABEL: "gpu-a"},
    }
    ticks = Clock(0.0)
    gates = {
        name: HoldGate(
            store=PauseStore(client=kube(), namespace=NS, lease_name=LEASE),
            client=None,
            node_name=name,
            monotonic=ticks,
            pools=pool_labels(policy.budget),
            node=node_object(name, labels=labels),
        )
        for name, labels in nodes.items()
    }
    for name, labels in nodes.items():
        api.put_object(node_object(name, labels=labels))
    policy_file = str(tmp_path / "policy.yaml")
    argv = ["pause", "--pool", "gpu-a", "--by", "alice", "--reason", "driver rollout", "--recovery-policy", policy_file]
    assert run_cli(api, tmp_path, *argv) == 0
    for gate in gates.values():
        gate.poll()
    paused = {name for name, gate in gates.items() if gate.stats.paused is not None}
    assert paused == {"n-a1", "n-a2"}
    assert "pool=gpu-a by alice" in gates["n-a1"].stats.paused.message


def test_the_loop_holds_a_node_of_a_paused_pool_by_the_configured_label(harness, api, tmp_path):
    (tmp_path / "policy.yaml").write_text(POOL_POLICY)
    policy = load_policy(tmp_path / "policy.yaml")
    h = harness(policy=policy, node=node_object(labels={POOL: "gpu-a"}))
    pause(api, Pause(scope=Scope.POOL, value="gpu-a", by="bob", since=T0))
    h.publish(problem())
    assert h.step().actions == ()
    assert not h.cordoned() and h.reasons() == ["RecoveryPaused"]


def lease_reads(api: KubeApiServer) -> int:
    return api.requests.count(method="GET", path_regex=rf"/leases/{LEASE}$")


def idle_gate(
    api: KubeApiServer,
    client: KubeClient,
    *,
    rng: Callable[[], float] = lambda: 0.5,
    idle_poll: float = 5.0,  # as often as with an incident open (5 min by default): the poll's own rules below
    **kw,
) -> HoldGate:
    return HoldGate(
        store=PauseStore(client=client, namespace=NS, lease_name=LEASE),
        client=client,
        node_name=NODE,
        node=node_object(),
        rng=rng,
        idle_poll=idle_poll,
        **kw,
    )


def test_an_agent_polls_every_5_s_with_an_incident_open_and_every_5_min_idle(api, kube):
    """400 GETs a second for 2,000 idle nodes polling every 5 s: idle ones poll every 5 min (±20 %)."""
    ticks = Clock(0.0)
    gate = idle_gate(api, kube(), monotonic=ticks, idle_poll=300.0)
    gate.poll()
    assert lease_reads(api) == 1 and gate.due_in() == pytest.approx(300.0)
    ticks.now += 299.0
    gate.poll()
    assert lease_reads(api) == 1
    ticks.now += 1.0
    gate.poll()
    assert lease_reads(api) == 2
    incident = SimpleNamespace(condition=DMA[0], reason=DMA[1])  # the open incident's condition and reason
    ticks.now += 5.0
    gate.poll(incident)
    assert lease_reads(api) == 3 and gate.due_in() == pytest.approx(5.0), "an open incident: every 5 s"
    ticks.now += 5.0
    gate.poll(incident)
    assert lease_reads(api) == 4
    ticks.now += 5.0
    gate.poll()  # closed: back to the idle interval, counted from the last read
    assert lease_reads(api) == 4 and gate.due_in() == pytest.approx(295.0)


def test_an_idle_agent_reads_the_pause_lease_once_per_interval_and_exports_the_pause(api, kube):
    ticks = Clock(0.0)
    clock = Clock()
    gate = idle_gate(api, kube(), monotonic=ticks)
    collector = HoldCollector(stats=lambda: gate.stats, clock=clock)

    def exported() -> tuple[float, float]:
        metrics = {m.name: m.samples[0].value for m in collector.collect()}
        return metrics["node_health_agent_recovery_paused"], metrics["node_health_agent_recovery_paused_seconds"]

    gate.poll()
    assert lease_reads(api) == 1 and exported() == (0, 0)
    pause(api, Pause(scope=Scope.CLUSTER, by="alice", since=T0 - 30))
    for _ in range(4):  # before the interval is over: nothing read
        ticks.now += 1.0
        gate.poll()
    assert lease_reads(api) == 1 and gate.due_in() == pytest.approx(1.0)
    ticks.now += 1.0
    gate.poll()
    assert lease_reads(api) == 2 and exported() == (1, 30)
    put_pauses(api, encode_pauses(Pauses()))
    ticks.now += 5.0
    gate.poll()
    assert lease_reads(api) == 3 and exported() == (0, 0)


@pytest.mark.parametrize(("rng", "interval"), [(0.0, 4.0), (0.5, 5.0), (1.0, 6.0)])
def test_the_interval_is_jittered_within_a_fifth(api, kube, rng, interval):
    ticks = Clock(0.0)
    gate = idle_gate(api, kube(), monotonic=ticks, rng=lambda: rng)
    gate.poll()
    assert gate.due_in() == pytest.approx(interval)


OPEN = SimpleNamespace(condition=DMA[0], reason=DMA[1])  # an open incident's condition and reason


@pytest.mark.parametrize(
    ("incident", "rng", "interval", "retries"),
    [
        pytest.param(OPEN, 0.5, 5.0, [10.0, 20.0, 40.0, 60.0, 60.0, 60.0], id="incident open: x2 up to 60 s"),
        pytest.param(OPEN, 1.0, 6.0, [12.0, 24.0, 48.0, 72.0, 72.0, 72.0], id="incident open, jittered +20 %"),
        pytest.param(None, 0.5, 300.0, [300.0] * 6, id="idle: never sooner than its 5 min"),
        pytest.param(None, 0.0, 240.0, [240.0] * 6, id="idle, jittered -20 %"),
    ],
)
def test_a_failing_read_backs_off_resets_on_success_and_keeps_what_was_last_read(
    api, kube, incident, rng, interval, retries
):
    """An API outage: 2,000 idle agents retrying every 5-60 s would read 60 times as often as when all is
    well; the pause read before the outage still holds while the reads fail; one good read resets."""
    ticks = Clock(0.0)
    gate = idle_gate(api, kube(), monotonic=ticks, rng=lambda: rng, idle_poll=300.0)
    pause(api, Pause(scope=Scope.NODE, value=NODE, by="alice", since=T0))
    gate.poll(incident)
    assert gate.due_in() == pytest.approx(interval) and gate.stats.paused is not None
    api.faults.add(method="GET", path_regex=rf"/leases/{LEASE}$", status=503, count=None)
    delays = []
    for _ in retries:
        ticks.now += gate.due_in()
        gate.poll(incident)
        delays.append(gate.due_in())
    assert delays == pytest.approx(retries)
    assert lease_reads(api) == 1 + len(retries) and gate.stats.pause_read_failures == len(retries)
    assert gate.stats.paused is not None and "node=" + NODE in gate.stats.paused.message  # as last read
    api.faults.clear()
    ticks.now += gate.due_in()
    gate.poll(incident)
    assert gate.due_in() == pytest.approx(interval) and gate.stats.paused is not None  # reset
    ticks.now += gate.due_in()
    gate.poll(incident)
    assert gate.due_in() == pytest.approx(interval) and lease_reads(api) == 3 + len(retries)


class DownStore:
    """A pause store (the gate's seam) whose reads fail while ``down``; counts the failed ones."""

    where = f"{NS}/{LEASE}"

    def __init__(self) -> None:
        self.down = False
        self.failed = 0

    def read(self, *, cached: bool = False) -> Pauses:
        if self.down:
            self.failed += 1
            raise KubeError("connection reset", status=None)
        return Pauses()


def test_a_10_minute_outage_costs_an_idle_fleet_its_idle_reads_only():
    """bench/run.py fleet's outage, on a stepped clock: 200 idle agents, reads at random phases, the API
    server down from 300 s to 900 s. Retrying every 5-60 s they made 1,913 reads (0.96 a node-minute, of a
    2 a node-minute target for every request); at the idle interval, about 2 each."""
    rng = random.Random(0)
    failed = 0
    for _ in range(200):
        ticks = Clock(rng.uniform(0.0, 300.0))
        store = DownStore()
        gate = HoldGate(store=store, client=None, node_name=NODE, monotonic=ticks, rng=rng.random)
        gate.poll()
        while ticks.now + gate.due_in() < 900.0:
            ticks.now += gate.due_in()  # the loop wakes when the poll is due
            store.down = ticks.now >= 300.0
            gate.poll()
        failed += store.failed
    assert failed / 200 / 10 < 0.25  # reads per node-minute while down


def test_an_agent_that_never_read_the_pause_lease_does_not_act(harness, api):
    """Fail safe: the poll's failure leaves "not paused as far as known", but acting needs its own read of
    the Lease in the same step: one that fails fails the step (retried with the loop's backoff)."""
    h = harness()
    pause(api, Pause(scope=Scope.CLUSTER, by="alice", since=T0))
    api.faults.add(method="GET", path_regex=rf"/leases/{LEASE}$", status=503, count=None)
    h.gate.poll()
    assert h.gate.stats.pause_read_failures == 1 and h.gate.stats.paused is None
    h.publish(problem())
    for _ in range(3):
        with pytest.raises(KubeError):
            h.step()
        h.clock.now += 5
    assert not h.cordoned() and h.marker.marked == [] and not h.budget_written()
    api.faults.clear()
    assert h.step().actions == () and h.reasons() == ["RecoveryPaused"]  # read at last: paused


def test_a_corrupt_pause_lease_reads_as_paused_on_an_idle_agent_and_is_logged_once(api, kube, caplog):
    ticks = Clock(0.0)
    gate = idle_gate(api, kube(), monotonic=ticks)
    put_pauses(api, "{not json")
    for _ in range(3):
        gate.poll()
        ticks.now += 5.0
    assert gate.stats.paused is not None and "treated as a cluster-wide pause" in gate.stats.paused.message
    metrics = {m.name: m.samples[0].value for m in HoldCollector(stats=lambda: gate.stats).collect()}
    assert metrics["node_health_agent_recovery_paused"] == 1
    assert sum("unreadable" in r.getMessage() for r in caplog.records) == 1


def test_a_per_reason_pause_shows_on_an_idle_agent_only_for_its_open_incident(api, kube):
    ticks = Clock(0.0)
    gate = idle_gate(api, kube(), monotonic=ticks)
    pause(api, Pause(scope=Scope.REASON, value="NeuronHasError_*", by="alice", since=T0))
    gate.poll()
    assert gate.stats.paused is None
    ticks.now += 5.0
    gate.poll(SimpleNamespace(condition=DMA[0], reason=DMA[1]))  # the open incident's condition and reason
    assert gate.stats.paused is not None


def test_a_step_that_reads_the_pause_lease_counts_as_the_intervals_read(harness, api):
    h = harness()
    h.publish(problem())
    h.step()  # about to act: reads the Lease
    reads = lease_reads(api)
    h.loop.holds.poll()
    assert lease_reads(api) == reads  # not due again yet


def test_the_poll_reads_from_the_api_server_cache_and_the_read_before_acting_does_not(harness, api):
    """resourceVersion=0: the poll (every agent, every 5 s) never reaches etcd; acting reads it fresh."""
    h = harness()
    h.loop.holds.poll()
    h.publish(problem())
    h.step()
    queries = [r.query for r in api.requests.filter(method="GET", path_regex=rf"/leases/{LEASE}$")]
    # the poll from the cache; every read on the way to an action (before acting, after the budget's
    # grant, before the remedy) fresh
    assert queries[0] == {"resourceVersion": "0"} and len(queries) >= 2, queries
    assert all(q == {} for q in queries[1:]), queries


def test_a_step_waiting_out_the_budget_reads_the_pause_from_the_cache(harness, kube, api):
    """A fleet-wide misfire: every refused agent steps every 5 s until its budget backoff ends. Only a step
    that asks the budget (or acts) reads the pause Lease from etcd; those in between read the cache."""
    one = dataclasses.replace(POLICY, budget=BudgetSettings(max_unhealthy=1, max_actions=100))
    h = harness(policy=one)
    api.put_object(node_object(OTHERS[0]))
    ClusterBudget(
        client=kube(), namespace=NS, lease_name=DEFAULT_LEASE, node_name=OTHERS[0], settings=one.budget, clock=h.clock
    ).acquire(incident_id="x")  # the one place is taken
    h.publish(problem())
    api.reset_requests()
    assert h.step().blocked is Blocked.BUDGET  # asked, refused: backing off
    assert [r.query for r in api.requests.filter(method="GET", path_regex=rf"/leases/{LEASE}$")] == [{}]
    api.reset_requests()
    waits = int(BUDGET_RETRY * (1 - BUDGET_RETRY_JITTER)) // 5 - 1  # steps within the shortest backoff
    for _ in range(waits):
        h.clock.now += 5
        assert h.step().blocked is Blocked.BUDGET
    queries = [r.query for r in api.requests.filter(method="GET", path_regex=rf"/leases/{LEASE}$")]
    assert queries == [{"resourceVersion": "0"}] * waits
    assert api.requests.count(path_regex=rf"/leases/{DEFAULT_LEASE}$") == 0  # nor asked the budget
    pause(api, Pause(scope=Scope.CLUSTER, by="alice", since=T0))
    h.clock.now += 5
    h.step()
    assert h.gate.stats.paused is not None  # the cached read still sees a pause


def test_the_running_loop_polls_while_idle(api, kube):
    """``run`` with no problem at all (nothing to step for): the pause still shows within the poll interval."""
    client = kube()
    api.put_object(node_object())
    feed = SnapshotFeed(initial=Snapshot(conditions=(), generated_at=T0, seeded=True, provenance=BUILTIN_CONDITIONS))
    gate = idle_gate(api, client, poll=0.05, idle_poll=0.05)
    budget = ClusterBudget(
        client=client, namespace=NS, lease_name=DEFAULT_LEASE, node_name=NODE, settings=POLICY.budget, clock=Clock()
    )
    loop = RecoveryLoop(
        feed=feed, inbox=Inbox(), client=client, node_name=NODE, policy=POLICY, enabled=True, budget=budget, holds=gate
    )
    stop = threading.Event()
    runner = threading.Thread(target=loop.run, args=(stop,))
    runner.start()
    try:
        wait_for(lambda: lease_reads(api) >= 1, timeout=30)
        pause(api, Pause(scope=Scope.CLUSTER, by="alice", since=T0))
        wait_for(lambda: gate.stats.paused is not None, timeout=30)
    finally:
        stop.set()
        runner.join(timeout=30)
    assert api.get_object("leases", DEFAULT_LEASE, NS) is None  # idle: the budget was never asked


def test_status_names_the_pool_labels_and_the_nodes_a_pool_pause_covers(api, tmp_path, capsys):
    (tmp_path / "policy.yaml").write_text(POOL_POLICY)
    for name, pool in (("n-a1", "gpu-a"), ("n-a2", "gpu-a"), ("n-b1", "gpu-b")):
        api.put_object(node_object(name, {POOL: pool}))
    policy_file = str(tmp_path / "policy.yaml")
    assert run_cli(api, tmp_path, "pause", "--pool", "gpu-a", "--by", "alice", "--recovery-policy", policy_file) == 0
    capsys.readouterr()
    assert run_cli(api, tmp_path, "status", "--recovery-policy", policy_file) == 0
    assert f"pool=gpu-a ({POOL}: 2 nodes) by alice" in capsys.readouterr().out
