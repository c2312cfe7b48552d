"""Remedies as a ladder (agent.recovery.ladder): reboot first, replace when it did not help.

The loop is driven step by step, with the real KubeClient against tests/kubeapi, a real ClusterBudget,
an injected clock and boot id, a drain that succeeds at once and a recording reboot (our own seams).
The EC2 side (RebootInstances throttled, denied, an instance already stopping) runs against moto's
server through tests/awsfixtures.FaultyFront.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.adapters.aws import AwsClients, AwsError, Ec2Reboot
from agent.adapters.kube import KubeClient
from agent.app.cli import main
from agent.core.errors import ConfigError
from agent.core.types import Condition
from agent.recovery.drain import DrainResult
from agent.recovery.ec2 import Ec2Rebooter
from agent.recovery.ladder import HISTORY_ANNOTATION, Ladder, Rung, read_history, read_opened, step_for
from agent.recovery.model import (
    TAINT_KEY,
    Action,
    BudgetSettings,
    NodeView,
    PolicyRule,
    RecoveryPolicy,
    Remedy,
)
from agent.recovery.policyfile import DEFAULT_POLICY, load_policy

from helpers import recovery
from helpers.aws import ACCESS_DENIED, REGION, THROTTLING, Fault, FaultyFront
from helpers.recovery import INSTANCE, NODE, OTHERS, T0, Clock, LoopHarness, kube_fixture, node_object, prepare
from kubeapi.server import KubeApiServer

pytestmark = pytest.mark.slow  # many scenarios against the test API server and moto's server

pytest_plugins = ["kubeapi.fixtures"]
__all__ = ["kube_fixture"]  # fixture: kube

WINDOW = 1200.0
XID79 = ("GpuXid", "GpuXid79")
POLICY = dataclasses.replace(DEFAULT_POLICY, startup_delay=0.0, budget=BudgetSettings(max_actions=100))
LADDER = (Remedy.REBOOT, Remedy.REPLACE)
INCORRECT_STATE = Fault(
    status=400, code="IncorrectState", message="The instance 'i-...' is not in a state from which it can be rebooted."
)


class Boot:
    """The boot id file as the agent reads it."""

    def __init__(self) -> None:
        self.id = "boot-1"

    def __call__(self) -> str:
        return self.id


class Reboots:
    """A recording reboot (the ``Ladder``'s seam): raises the queued errors first."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[str] = []

    def __call__(self, node: NodeView) -> str:
        self.calls.append(node.name)
        if self.errors:
            raise self.errors.pop(0)
        return INSTANCE


def problem(condition: str = XID79[0], reason: str = XID79[1], *, since: float = T0 - 10) -> Condition:
    return recovery.problem(condition, reason, since=since)


def healthy(condition: str = XID79[0], *, since: float) -> Condition:
    return recovery.healthy(condition, since=since, reason="GpuXidGood")


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    return prepare(kube_api_server, *(node_object(name) for name in (*OTHERS, NODE)))


class Agent(LoopHarness):
    """One agent's recovery loop on NODE (a new one = the agent restarted); state lives on the Node. Its
    ladder reads ``boot`` and reboots through ``reboots`` (or ``reboot``); a drain succeeds at once."""

    def __init__(
        self,
        api: KubeApiServer,
        client: KubeClient,
        *,
        clock: Clock,
        boot: Boot,
        reboots: Reboots | None = None,
        enabled: bool = True,
        policy: RecoveryPolicy = POLICY,
        reboot: Callable[[NodeView], str] | None = None,
    ) -> None:
        self.boot = boot
        self.reboots = reboots if reboots is not None else Reboots()
        self.drains = 0
        self.ladder = Ladder(
            client=client, node_name=NODE, boot_id=boot, reboot=reboot or self.reboots, monotonic=clock
        )
        super().__init__(
            api,
            client,
            policy=policy,
            enabled=enabled,
            put_node=False,  # the Node keeps what an earlier agent wrote
            clock=clock,
            drainer=self._drain,
            ladder=self.ladder,
        )

    def _drain(self, stop: object, report: Callable[[str, str], None]) -> DrainResult:
        self.drains += 1
        return DrainResult(outcome="done")

    def history(self) -> tuple[Rung, ...]:
        return read_history(self.node())


@pytest.fixture
def agent(api, kube) -> Callable[..., Agent]:
    clock, boot = Clock(), Boot()

    def make(**kwargs) -> Agent:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("boot", boot)
        return Agent(api, kube(), **kwargs)

    return make


def rebooted(first: Agent, *, after: float = 120.0, skew: float = 0.0) -> Agent:
    """The host rebooted: a new boot id, the kernel log without the Xid, a new agent process (its clock
    ``skew`` seconds off the first one's)."""
    first.clock.now += after
    first.boot.id = "boot-2"
    second = Agent(
        first.api,
        first.loop._client,
        clock=Clock(first.clock.now + skew),
        boot=first.boot,
        reboots=first.reboots,
    )
    second.publish(healthy(since=second.clock.now))
    return second


# ---- the walkthrough: reboot, watch, uncordon; again within the window: replace ----------------------------


def test_a_fallen_off_gpu_is_drained_and_rebooted_once_then_watched_and_uncordoned(agent):
    a = agent()
    a.publish(problem())
    decision = a.step()
    assert decision.actions == (Action.CORDON, Action.DRAIN, Action.REBOOT)
    assert (a.reboots.calls, a.drains, a.marker.calls) == ([NODE], 1, [])
    assert a.incident()["done"] == ["cordon", "drain", "reboot"]
    (rung,) = a.history()
    assert (rung.remedy, rung.step, rung.boot, rung.outcome, rung.window_end) == (
        Remedy.REBOOT,
        0,
        "boot-1",
        "ok",
        None,
    )
    assert "RecoveryRebootRequested" in a.reasons()

    a.clock.now += 30  # the reboot has not happened yet: nothing more
    a.step()
    assert a.reboots.calls == [NODE] and a.cordoned()

    b = rebooted(a)
    b.step()
    (rung,) = b.history()
    assert (rung.finished_boot, rung.finished_at, rung.window_end) == ("boot-2", b.clock.now, b.clock.now + WINDOW)
    assert b.cordoned(), "watched through the window before it takes work again"
    b.clock.now += WINDOW - 1
    b.step()
    assert b.cordoned()
    b.clock.now += 1
    decision = b.step()
    assert decision.actions == (Action.UNCORDON,)
    node = b.node()
    assert not node["spec"].get("unschedulable") and not any(
        t["key"] == TAINT_KEY for t in node["spec"].get("taints") or []
    )
    assert b.incident() is None and len(b.history()) == 1, "the history outlives the incident"
    assert a.reboots.calls == [NODE] and a.marker.calls == [] and b.marker.calls == []


def test_the_same_xid_again_within_the_window_is_replaced(agent):
    a = agent()
    a.publish(problem())
    a.step()
    b = rebooted(a)
    b.step()
    b.clock.now += WINDOW / 2
    b.publish(problem(since=b.clock.now))
    decision = b.step()
    assert decision.actions == (Action.MARK_UNHEALTHY,)  # cordon is still ours from the first episode
    assert b.marker.calls == [(NODE, 1)] and b.reboots.calls == [NODE], "one reboot, then replace"
    assert "RecoveryLadderClimbed" in b.reasons()
    (climbed,) = [e for e in b.told if e.reason == "RecoveryLadderClimbed"]
    assert "again within the window after the reboot" in climbed.message and "replace" in climbed.message
    assert b.cordoned()
    assert len(read_opened(b.node())) == 2 and len(b.history()) == 1, "the ladder's writes keep both"
    assert b.loop.stats.between.snapshot().count == 1  # the second incident, timed from the first
    b.publish(healthy(since=b.clock.now + 1))
    b.clock.now += 10 * WINDOW
    b.step()
    assert b.cordoned(), "a node marked for replacement is never uncordoned"


def test_a_problem_that_survives_the_reboot_climbs_when_the_window_ends(agent):
    """A check's condition (GpuCount=GpuLost) still True after the reboot, same episode."""
    lost = ("GpuCount", "GpuLost")
    a = agent()
    a.publish(problem(*lost))
    a.step()
    a.clock.now += 120
    a.boot.id = "boot-2"
    a.step()
    a.clock.now += WINDOW - 1
    assert a.step().actions == ()
    a.clock.now += 1
    assert a.step().actions == (Action.MARK_UNHEALTHY,)
    assert a.marker.calls == [(NODE, 1)] and a.reboots.calls == [NODE]


def test_a_restart_mid_ladder_resumes_at_the_same_step(agent):
    a = agent()
    a.publish(problem())
    a.step()
    again = agent(reboots=a.reboots)  # restarted before the reboot took the host down: same boot
    again.publish(problem())
    again.step()
    assert a.reboots.calls == [NODE] and again.drains == 0
    b = rebooted(a)
    b.step()
    end = b.history()[0].window_end
    b.clock.now += WINDOW / 2
    c = Agent(b.api, b.loop._client, clock=b.clock, boot=b.boot, reboots=b.reboots)  # restarted in the window
    c.publish(healthy(since=c.clock.now))
    c.step()
    assert c.history()[0].window_end == end and c.cordoned()
    c.clock.now = end
    assert c.step().actions == (Action.UNCORDON,)


def test_clock_skew_between_agents_does_not_shorten_the_window(agent):
    """The agent that asked for the reboot ran an hour behind: the window is still measured from the new
    boot, by the clock of the agent there."""
    a = agent(clock=Clock(T0 - 3600))
    a.publish(problem(since=T0 - 3700))
    a.step()
    b = rebooted(a, skew=3600)
    b.step()
    b.clock.now += WINDOW - 1
    b.step()
    assert b.cordoned()
    b.clock.now += 1
    assert b.step().actions == (Action.UNCORDON,)


def test_a_node_rebooted_by_someone_else_is_not_mistaken_for_ours(agent):
    """Our RebootInstances was refused; someone reboots the node anyway: no window, no uncordon, no climb."""
    denied = AwsError("ec2:RebootInstances failed: UnauthorizedOperation", code="UnauthorizedOperation", status=403)
    a = agent(reboots=Reboots(denied))
    a.publish(problem())
    a.step()
    assert "reboot" not in a.incident()["done"]
    (rung,) = a.history()
    assert rung.outcome == "failed"
    a.clock.now += 300
    a.boot.id = "boot-2"
    a.publish(healthy(since=a.clock.now))
    a.step()
    assert a.history()[0].finished_at is None, "a failed request is never finished by someone else's reboot"
    a.clock.now += 10 * WINDOW
    a.step()
    assert a.cordoned(), "not our reboot: uncordonAfter (off) decides, not the window"
    a.publish(problem(since=a.clock.now))
    decision = a.step()
    assert Action.MARK_UNHEALTHY not in decision.actions and a.marker.calls == []


def test_the_nth_incident_of_a_reason_within_the_period_climbs(agent):
    rule = PolicyRule(
        condition="GpuXid",
        reasons=("GpuXid79",),
        actions=(Action.CORDON,),
        ladder=LADDER,
        window=60.0,
        repeat_count=3,
        repeat_period=86400.0,
    )
    policy = dataclasses.replace(POLICY, rules=(rule,), uncordon_after=None)
    a = agent(policy=policy)
    for n in range(2):
        a.publish(problem(since=a.clock.now))
        a.step()
        a.boot.id = f"boot-{n + 2}"
        a.clock.now += 10
        a.publish(healthy(since=a.clock.now))
        a.step()
        a.clock.now += 61
        assert a.step().actions == (Action.UNCORDON,)
        a.clock.now += 3600
    a.publish(problem(since=a.clock.now))
    assert a.step().actions == (Action.CORDON, Action.MARK_UNHEALTHY)
    assert len(a.reboots.calls) == 2 and a.marker.calls == [(NODE, 1)]


def test_report_only_says_it_would_reboot_and_touches_nothing(agent, api):
    a = agent(enabled=False)
    a.publish(problem())
    decision = a.step()
    assert decision.actions == (Action.CORDON, Action.DRAIN, Action.REBOOT)
    assert a.reboots.calls == [] and a.history() == () and a.incident() is None
    assert any("would reboot" in e.message for e in a.told)
    assert api.requests.count(method="PATCH", path_regex=rf"/nodes/{NODE}$") == 0


# ---- the rung, as a table -----------------------------------------------------------------------------------


def rung(
    *, incident: str = "old", step: int = 0, at: float = T0, end: float | None = None, outcome: str = "ok"
) -> Rung:
    return Rung(
        incident=incident,
        condition="GpuXid",
        reason="GpuXid79",
        remedy=Remedy.REBOOT,
        step=step,
        at=at,
        boot="b",
        window=WINDOW,
        outcome=outcome,
        finished_at=None if end is None else end - WINDOW,
        window_end=end,
    )


LEMON = PolicyRule(condition="GpuXid", ladder=LADDER, repeat_count=3, repeat_period=86400.0)


@pytest.mark.parametrize(
    ("rungs", "incident", "now", "expected"),
    [
        pytest.param((), "new", T0, 0, id="nothing before: first rung"),
        pytest.param((rung(incident="new"),), "new", T0 + 60, 0, id="this incident's reboot pending: same rung"),
        pytest.param((rung(incident="new", end=T0 + 100),), "new", T0 + 99, 0, id="in its window: same rung"),
        pytest.param((rung(incident="new", end=T0 + 100),), "new", T0 + 100, 1, id="outlived its window: climbs"),
        pytest.param((rung(end=T0 + 100),), "new", T0 + 99, 1, id="again within the window: climbs"),
        pytest.param((rung(end=T0 + 100),), "new", T0 + 100, 0, id="after the window: first rung again"),
        pytest.param((rung(),), "new", T0 + 3600 + WINDOW - 1, 1, id="reboot never seen finished: within grace"),
        pytest.param((rung(),), "new", T0 + 3600 + WINDOW, 0, id="reboot never seen finished: expired"),
        pytest.param((rung(end=T0 + 100, outcome="failed"),), "new", T0 + 99, 0, id="a failed request is no rung"),
        pytest.param((rung(end=T0 + 1), rung(end=T0 + 2)), "new", T0 + 3600, 1, id="third within the period"),
        pytest.param((rung(end=T0 + 1), rung(end=T0 + 2)), "new", T0 + 86401, 0, id="the period passed"),
        pytest.param((rung(end=T0 + 100, step=1),), "new", T0 + 10, 1, id="the last rung is the last"),
    ],
)
def test_the_rung(rungs, incident, now, expected):
    step, why = step_for(LEMON, incident=incident, condition="GpuXid", reason="GpuXid79", rungs=rungs, now=now)
    assert step == expected
    assert bool(why) == (expected > 0 and rungs[-1].step == 0)


# ---- RebootInstances against moto: failures are reported, never a replace -------------------------------------


@pytest.mark.parametrize(
    ("fault", "code", "kind"),
    [
        pytest.param(THROTTLING, "Throttling", "throttled", id="throttled"),
        pytest.param(ACCESS_DENIED, "AccessDenied", "denied", id="denied"),
        pytest.param(INCORRECT_STATE, "IncorrectState", "wrong-state", id="instance already stopping"),
    ],
)
def test_reboot_instances_failures_are_reported_never_a_replace(agent, aws, fault, code, kind, monkeypatch):
    instance = aws.lone_instance()
    with FaultyFront(upstream=aws.endpoint, faults=[fault]) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)
        ec2 = Ec2Rebooter(ec2=Ec2Reboot(clients=AwsClients()))
        a = agent(reboot=ec2)
        a.api.put_object({**node_object(NODE), "spec": {"providerID": f"aws:///{REGION}a/{instance}"}})
        a.publish(problem())
        a.step()
        (failed,) = [e for e in a.told if e.reason == "RecoveryRebootFailed"]
        assert code in failed.message and "no other remedy" in failed.message
        assert "reboot" not in a.incident()["done"] and a.cordoned()
        assert a.marker.calls == []
        assert a.loop.stats.actions[("reboot", kind)] == 1 and a.loop.stats.actions[("reboot", "ok")] == 0
        a.clock.now += 5  # within the retry backoff: not asked again
        a.step()
        assert front.actions == ["RebootInstances"]
        a.clock.now += 60  # then retried, and this time it goes through
        a.step()
    assert front.actions == ["RebootInstances", "RebootInstances"]
    assert a.incident()["done"] == ["cordon", "drain", "reboot"] and a.marker.calls == []
    assert [r.outcome for r in a.history()] == ["ok"]
    assert a.loop.stats.actions[("reboot", "ok")] == 1


# ---- the policy file ---------------------------------------------------------------------------------------


def problems_of(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    return [str(p).replace(str(path), "policy.yaml") for p in info.value.problems]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        pytest.param(
            "ladder: [reboot, reimage]",
            "policy.yaml:3: rules[0].ladder[1]: unknown remedy 'reimage' (known: reboot, replace)",
            id="unknown remedy",
        ),
        pytest.param(
            "ladder: [reboot, reboot]",
            "policy.yaml:3: rules[0].ladder[1]: the ladder loops: reboot is already rung 1 (each remedy once, "
            "climbing only up)",
            id="loop",
        ),
        pytest.param(
            "ladder: [replace, reboot]",
            "policy.yaml:3: rules[0].ladder[1]: nothing can follow replace (the instance is gone), got 'reboot'",
            id="after replace",
        ),
        pytest.param(
            "ladder: [reboot, replace]\n    window: 0s",
            "policy.yaml:4: rules[0].window: must be longer than 0, got '0s'",
            id="window zero",
        ),
        pytest.param(
            "ladder: [reboot, replace]\n    window: -5m",
            "policy.yaml:4: rules[0].window: ",
            id="window negative",
        ),
        pytest.param(
            "ladder: [reboot, replace]\n    repeat: {count: 1, within: 1h}",
            "policy.yaml:4: rules[0].repeat.count: must be an integer of at least 2, got 1",
            id="repeat once",
        ),
        pytest.param(
            "actions: [cordon]\n    window: 10m",
            "policy.yaml:4: rules[0].window: the observation window follows a reboot: it needs ladder with reboot",
            id="window without a reboot",
        ),
        pytest.param(
            "ladder: []",
            "policy.yaml:3: rules[0].ladder: must be a non-empty list of remedies, e.g. [reboot, replace] (known: "
            "reboot, replace)",
            id="empty ladder",
        ),
    ],
)
def test_bad_ladders_name_file_and_line(tmp_path, rule, expected):
    found = problems_of(tmp_path, f"rules:\n  - condition: GpuXid\n    {rule}\n")
    assert any(f.startswith(expected) for f in found), found


def test_a_bad_ladder_exits_2_with_file_and_line(tmp_path, capsys):
    path = tmp_path / "policy.yaml"
    path.write_text("rules:\n  - condition: GpuXid\n    ladder: [reboot, reboot]\n")
    assert main(["validate-config", "--recovery-policy", str(path)]) == 2
    assert f"{path}:3: rules[0].ladder[1]: the ladder loops" in capsys.readouterr().err


def test_a_ladder_in_a_file(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(
        "rules:\n  - condition: GpuXid\n    reasons: [GpuXid79]\n    ladder: [reboot, replace]\n    window: 5m\n"
        "    repeat: {count: 4, within: 7d}\nbase: none\n"  # only this rule (else merged into the built-in ones)
    )
    (rule,) = load_policy(path).rules
    assert (rule.actions, rule.ladder, rule.window, rule.repeat_count, rule.repeat_period) == (
        (Action.CORDON,),
        LADDER,
        300.0,
        4,
        7 * 86400.0,
    )


# ---- memory: the EC2 client only with a reboot ------------------------------------------------------------


def test_the_ec2_client_is_built_by_the_first_reboot_only(aws):
    """An agent that can reboot but has not holds no EC2 client (its service model is ~20 MiB)."""
    code = (
        "import sys; from agent.adapters.aws import AwsClients, Ec2Reboot; from agent.recovery.ec2 import Ec2Rebooter; "
        "from agent.recovery.model import NodeView; clients = AwsClients(); "
        "rebooter = Ec2Rebooter(ec2=Ec2Reboot(clients=clients)); print('boto3' in sys.modules); "
        "clients.client('autoscaling'); print(sorted(clients._clients)); "
        f"print(rebooter(NodeView(name='n', unschedulable=True, provider_id='aws:///{REGION}a/' + sys.argv[1]))); "
        "print(sorted(clients._clients))"
    )
    instance = aws.lone_instance()
    out = subprocess.run([sys.executable, "-c", code, instance], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:4] == ["False", "['autoscaling']", instance, "['autoscaling', 'ec2']"]


# ---- a hand-edited history (issue 33) -----------------------------------------------------------------------


def edit_history(a: Agent, **rung: object) -> None:
    """Change the first rung of the history on the Node, as a hand edit would (any JSON, hostile values too)."""
    node = a.node()
    data = json.loads(node["metadata"]["annotations"][HISTORY_ANNOTATION])
    data["rungs"][0].update(rung)
    node["metadata"]["annotations"][HISTORY_ANNOTATION] = json.dumps(data)
    a.api.put_object(node)


def told_corrupt(a: Agent, field: str) -> None:
    (told,) = a.events("RecoveryCorruptRecord")
    assert HISTORY_ANNOTATION in told.message and f"history: rungs[0].{field}: " in told.message, told.message
    assert "the ladder starts over from its first rung" in told.message
    assert a.loop.stats.errors == 0


@pytest.mark.parametrize("step", [-5, 10**400, 7])
def test_a_history_with_a_step_off_the_ladder_is_ignored_and_told_once_never_a_failed_step(agent, step):
    """``step: -5`` raised IndexError at every step; it is ignored, told once, and nothing is done twice."""
    a = agent()
    a.publish(problem())
    a.step()
    edit_history(a, step=step)
    again = agent(reboots=a.reboots)  # restarted on the same boot
    again.publish(problem())
    for _ in range(3):
        again.clock.now += 5
        again.step()
    told_corrupt(again, "step")
    assert a.reboots.calls == [NODE] and again.marker.calls == [] and again.cordoned()


@pytest.mark.parametrize("end", [float("nan"), -1e308, 10**400])
def test_a_history_whose_window_end_is_not_a_time_never_uncordons_at_once(agent, end):
    """``windowEnd: NaN`` uncordoned the node at once, claiming the window had passed."""
    a = agent()
    a.publish(problem())
    a.step()
    b = rebooted(a)
    b.step()
    edit_history(b, windowEnd=end)
    b.clock.now += 5
    assert b.step().actions == ()
    assert b.cordoned(), "healthy for 5 s after the reboot: not through its window"
    told_corrupt(b, "windowEnd")


@pytest.mark.parametrize("end", [-1e308, float("-inf")])
def test_a_history_whose_window_end_is_far_past_does_not_climb_to_replace(agent, end):
    """``windowEnd: -1e308`` with the problem still there climbed straight to replace."""
    a = agent()
    a.publish(problem())
    a.step()
    a.clock.now += 120
    a.boot.id = "boot-2"
    a.step()  # the reboot finished; the problem is still there, within its window
    edit_history(a, windowEnd=end)
    a.clock.now += 5
    decision = a.step()
    assert Action.MARK_UNHEALTHY not in decision.actions and a.marker.calls == []
    told_corrupt(a, "windowEnd")
