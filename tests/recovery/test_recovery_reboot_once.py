"""One reboot per incident, whatever stops when (issue 33, finding 5): the attempt ledger.

The agent is stopped at each point around ``RebootInstances`` (a fault in the test API server, a fault in
front of moto's server, or the process gone right after the call), then a new agent starts from what the
cluster holds: on a new boot id when the call reached EC2 (the host went down), else on the same one.
RebootInstances is counted where EC2 sees it (moto, behind FaultyFront): exactly once for every point.
The real kubernetes client against tests/kubeapi, real boto3 (Ec2Rebooter) against moto's server, an
injected clock and boot id; the only seam is the reboot callable, wrapped to stop the process after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from agent.adapters.aws import AwsClients, Ec2Reboot
from agent.adapters.kube import KubeError
from agent.recovery import attempt as attempts
from agent.recovery.attempt import ATTEMPT_ANNOTATION, DEADLINE
from agent.recovery.drain import DrainResult
from agent.recovery.ec2 import Ec2Rebooter
from agent.recovery.ladder import HISTORY_ANNOTATION, Ladder
from agent.recovery.model import BudgetSettings, NodeView
from agent.recovery.policyfile import DEFAULT_POLICY

from helpers import recovery
from helpers.aws import REGION, Fault, FaultyFront
from helpers.recovery import NODE, NODE_PATH, OTHERS, T0, Clock, LoopHarness, kube_fixture, node_object, prepare
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]
__all__ = ["kube_fixture"]  # fixture: kube

POLICY = dataclasses.replace(DEFAULT_POLICY, startup_delay=0.0, budget=BudgetSettings(max_actions=100))
XID79 = ("GpuXid", "GpuXid79")
LOST_ANSWER = Fault(status=500, code="InternalError", message="carried out, answer lost", applied=True)


class Killed(BaseException):
    """The agent process ends here (nothing in the agent catches a BaseException)."""


class Boot:
    def __init__(self) -> None:
        self.id = "boot-1"

    def __call__(self) -> str:
        return self.id


class Seam:
    """The ladder's reboot callable: the real Ec2Rebooter (boto3 → FaultyFront → moto), then ``after``."""

    def __init__(self, real: Callable[[NodeView], str]) -> None:
        self.real = real
        self.after: Callable[[], None] | None = None

    def __call__(self, node: NodeView) -> str:
        try:
            return self.real(node)
        finally:
            after, self.after = self.after, None
            if after is not None:
                after()


@dataclass
class World:
    api: KubeApiServer
    front: FaultyFront
    seam: Seam
    boot: Boot
    clock: Clock
    make: Callable[[], LoopHarness]

    def reboots(self) -> int:
        return self.front.actions.count("RebootInstances")

    def step(self, h: LoopHarness) -> None:
        """One step; an API error is the step failing (retried by run()), Killed the process ending."""
        with contextlib.suppress(KubeError):
            h.step()

    def ledger(self) -> dict | None:
        text = (self.api.get_object("nodes", NODE)["metadata"].get("annotations") or {}).get(ATTEMPT_ANNOTATION)
        return None if text is None else json.loads(text)


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    return prepare(kube_api_server, *(node_object(name) for name in OTHERS))


@pytest.fixture
def world(api, kube, aws, monkeypatch) -> Iterator[World]:
    instance = aws.lone_instance()
    api.put_object({**node_object(NODE), "spec": {"providerID": f"aws:///{REGION}a/{instance}"}})
    clock, boot = Clock(), Boot()
    with FaultyFront(upstream=aws.endpoint, faults=[]) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint)
        seam = Seam(Ec2Rebooter(ec2=Ec2Reboot(clients=AwsClients())))

        def make() -> LoopHarness:
            client = kube()
            ladder = Ladder(client=client, node_name=NODE, boot_id=boot, reboot=seam, monotonic=clock)
            h = LoopHarness(api, client, policy=POLICY, put_node=False, clock=clock, ladder=ladder, drainer=_drained)
            h.publish(recovery.problem(*XID79, since=T0 - 10))  # the same incident, as seeded from the Node
            return h

        yield World(api=api, front=front, seam=seam, boot=boot, clock=clock, make=make)


def _drained(stop: object, report: Callable[[str, str], None]) -> DrainResult:
    return DrainResult(outcome="done")


# ---- the kill points -----------------------------------------------------------------------------------------


def before_reserve(w: World) -> None:
    w.api.faults.add(method="PATCH", path_regex=NODE_PATH, body_regex="recovery-attempt", kind="drop", count=None)


def after_reserve(w: World) -> None:  # the reservation is stored, its answer lost: the agent stops there
    w.api.faults.add(method="PATCH", path_regex=NODE_PATH, body_regex="reserved", kind="applied", status=503)


def dies_after_the_call(w: World) -> None:
    def die() -> None:
        raise Killed

    w.seam.after = die


def api_down_after_the_call(w: World) -> None:  # every Node write fails from the call on (a 4 s outage)
    w.seam.after = lambda: w.api.faults.add(method="PATCH", path_regex=NODE_PATH, kind="drop", count=None) and None


def answer_lost(w: World) -> None:  # EC2 carried it out; its answer never came (a 500 after the fact)
    w.front.faults.append(LOST_ANSWER)


def after_sent(w: World) -> None:
    pass


KILL_POINTS = [
    pytest.param(before_reserve, False, id="before reserve"),
    pytest.param(after_reserve, False, id="after reserve"),
    pytest.param(dies_after_the_call, True, id="after the call, before sent is recorded (process gone)"),
    pytest.param(api_down_after_the_call, True, id="after the call, API down for the sent record"),
    pytest.param(answer_lost, True, id="after the call, RebootInstances answer lost (moto)"),
    pytest.param(after_sent, True, id="after sent"),
]


def first_agent_stops(w: World, kill: Callable[[World], None]) -> None:
    """An agent cordons, drains and gets to the reboot, and stops at ``kill``; its loop object is dropped."""
    h = w.make()
    kill(w)
    with contextlib.suppress(Killed):
        w.step(h)
    w.api.faults.clear()


@pytest.mark.slow  # moto's server
@pytest.mark.parametrize(("kill", "reached_ec2"), KILL_POINTS)
def test_one_reboot_per_incident_whatever_stops_when(world: World, kill, reached_ec2):
    w = world
    first_agent_stops(w, kill)
    assert w.reboots() == (1 if reached_ec2 else 0)
    if not reached_ec2:  # nothing rebooted the host: a new agent on the same boot
        again = w.make()
        w.clock.now += 60
        w.step(again)
        if kill is after_reserve:  # the call may have gone out: nothing until the deadline, then once
            assert w.reboots() == 0 and w.ledger()["state"] == attempts.RESERVED
            assert again.events("RecoveryRebootUnconfirmed"), "told why it waits"
            w.clock.now = w.ledger()["deadline"]
            w.step(again)
        assert w.reboots() == 1
    w.boot.id = "boot-2"  # the host went down at the call and came back
    w.clock.now += 120
    after = w.make()
    for _ in range(3):
        w.step(after)
        w.clock.now += 30
    assert w.reboots() == 1, "the new boot's agent never asks again"
    ledger = w.ledger()
    assert ledger["state"] == attempts.FINISHED and ledger["finishedBoot"] == "boot-2"
    assert "reboot" in after.incident()["done"] and after.cordoned()
    rungs = json.loads(after.node()["metadata"]["annotations"][HISTORY_ANNOTATION])["rungs"]
    assert [(r["outcome"], r["finishedBoot"]) for r in rungs][-1][1] == "boot-2"
    assert after.marker.calls == [], "within the window: observed, not replaced"


@pytest.mark.slow  # moto's server
def test_an_agent_stopped_after_the_finish_record_does_not_ask_again(world: World):
    w = world
    first_agent_stops(w, after_sent)
    w.boot.id, w.clock.now = "boot-2", w.clock.now + 120
    w.api.faults.add(method="PATCH", path_regex=NODE_PATH, body_regex="finished", kind="applied", status=503)
    w.step(w.make())  # the finish is stored, its answer lost; the agent stops
    w.api.faults.clear()
    assert w.ledger()["state"] == attempts.FINISHED
    last = w.make()
    for _ in range(3):
        w.step(last)
        w.clock.now += 30
    assert w.reboots() == 1 and "reboot" in last.incident()["done"]


SAME_BOOT = [  # (kill point, reboots once the deadline passed with the boot id unchanged)
    pytest.param(dies_after_the_call, 2, id="process gone after the call: reserved, no new boot: asked again"),
    pytest.param(api_down_after_the_call, 2, id="API down after the call: reserved, no new boot: asked again"),
    pytest.param(answer_lost, 2, id="answer lost: reserved, no new boot: asked again"),
    pytest.param(after_sent, 1, id="sent, no new boot: counted as done, never asked again"),
]


@pytest.mark.slow  # moto's server
@pytest.mark.parametrize(("kill", "after_deadline"), SAME_BOOT)
def test_the_same_boot_id_waits_for_the_deadline(world: World, kill, after_deadline):
    """The host did not go down (yet): no second request before the deadline. After it, an unchanged boot id
    shows that the host did not reboot: a request that may not have reached EC2 is made again; one EC2
    accepted counts as done (the window then decides)."""
    w = world
    first_agent_stops(w, kill)
    again = w.make()
    start = w.clock.now
    while w.clock.now < start + DEADLINE - 60:
        w.clock.now += 120
        w.step(again)
        assert w.reboots() == 1, f"{w.clock.now - start:.0f}s after the request"
    w.clock.now = start + DEADLINE
    w.step(again)
    w.step(again)
    assert w.reboots() == after_deadline
    state = w.ledger()["state"]
    assert state == (attempts.SENT if after_deadline == 2 else attempts.FINISHED), w.ledger()


@pytest.mark.slow  # moto's server
def test_the_same_agent_records_the_sent_reboot_once_the_api_is_back(world: World):
    """The Node write after the call fails (an outage); the agent lives on: after the outage it records the
    reboot as sent, from what it knows, and never calls again."""
    w = world
    h = w.make()
    api_down_after_the_call(w)
    w.step(h)
    assert w.reboots() == 1 and w.ledger()["state"] == attempts.RESERVED
    w.api.faults.clear()
    for _ in range(3):
        w.clock.now += 5
        w.step(h)
    assert w.reboots() == 1 and w.ledger()["state"] == attempts.SENT
    assert "reboot" in h.incident()["done"]
    w.clock.now += DEADLINE
    w.step(h)
    assert w.reboots() == 1 and w.ledger()["state"] == attempts.FINISHED


# ---- the ledger's rules and codec (pure) ------------------------------------------------------------------------

AT = T0


def attempt(state: str = attempts.RESERVED, boot: str = "boot-1") -> attempts.Attempt:
    return attempts.Attempt(incident="i1", remedy="reboot", state=state, boot=boot, at=AT, deadline=AT + DEADLINE)


@pytest.mark.parametrize(
    ("record", "boot", "now", "state", "finished_boot"),
    [
        pytest.param(attempt(), "boot-2", AT + 60, attempts.FINISHED, "boot-2", id="reserved, new boot: done"),
        pytest.param(attempt(attempts.SENT), "boot-2", AT + 60, attempts.FINISHED, "boot-2", id="sent, new boot"),
        pytest.param(attempt(), "boot-1", AT + DEADLINE - 1, attempts.RESERVED, "", id="reserved, same boot: waits"),
        pytest.param(attempt(), "boot-1", AT + DEADLINE, attempts.FAILED, "", id="reserved, same boot at deadline"),
        pytest.param(attempt(attempts.SENT), "boot-1", AT + DEADLINE, attempts.FINISHED, "", id="sent, same boot"),
        pytest.param(attempt(boot="unknown"), "boot-2", AT + 60, attempts.RESERVED, "", id="unknown before: waits"),
        pytest.param(attempt(boot="unknown"), "boot-2", AT + DEADLINE, attempts.FINISHED, "", id="unknown: deadline"),
        pytest.param(attempt(), "unknown", AT + DEADLINE, attempts.FINISHED, "", id="unknown now: deadline"),
        pytest.param(attempt(attempts.FAILED), "boot-2", AT + 60, attempts.FAILED, "", id="failed stays failed"),
    ],
)
def test_settle(record, boot, now, state, finished_boot):
    settled = attempts.settle(record, boot=boot, now=now)
    assert (settled.state, settled.finished_boot) == (state, finished_boot)
    assert (settled.finished_at is not None) == (state == attempts.FINISHED)


GOOD = attempt().to_json()


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        pytest.param({"at": 10**400}, "at", "must be a time", id="an integer too large for a float"),
        pytest.param({"at": float("nan")}, "at", "must be a time", id="NaN"),
        pytest.param({"deadline": -1e308}, "deadline", "must be a time", id="a deadline before 1970"),
        pytest.param({"deadline": AT + 10 * 86_400}, "deadline", "after now", id="a deadline days after the request"),
        pytest.param({"deadline": AT + 1.5 * 86_400}, "deadline", "after at", id="a deadline a day and more after it"),
        pytest.param({"deadline": AT - 1}, "deadline", "after at", id="a deadline before the request"),
        pytest.param(
            {"at": AT + 30 * 86_400, "deadline": AT + 30 * 86_400}, "at", "after now", id="a request in the future"
        ),
        pytest.param({"at": True}, "at", "must be a time", id="a boolean time"),
        pytest.param({"state": "done"}, "state", "must be one of", id="an unknown state"),
        pytest.param({"remedy": "replace"}, "remedy", "must be one of", id="an unknown remedy"),
        pytest.param({"incident": ""}, "incident", "non-empty string", id="no incident"),
        pytest.param({"boot": "x" * 300}, "boot", "at most 256 characters", id="a boot id too long"),
        pytest.param({"state": "finished"}, "finishedAt", "exactly when", id="finished without a time"),
        pytest.param({"finishedAt": AT}, "finishedAt", "exactly when", id="a time without finished"),
        pytest.param({"extra": 1}, "extra", "is not a field", id="an unknown field"),
    ],
)
def test_a_corrupt_ledger_names_its_field_and_never_raises(change, field, says):
    node = {"metadata": {"annotations": {ATTEMPT_ANNOTATION: json.dumps({**GOOD, **change})}}}
    record, problem = attempts.parse_attempt(node, now=AT)
    assert record is None and problem.startswith(f"attempt: {field}: ") and says in problem, problem


@pytest.mark.parametrize("text", ["", "   "], ids=["empty", "blank"])
def test_a_blank_ledger_is_corrupt_not_absent(text):
    """Absent would let a reboot be requested at once; a ledger someone blanked may hide one in flight."""
    record, problem = attempts.parse_attempt({"metadata": {"annotations": {ATTEMPT_ANNOTATION: text}}}, now=AT)
    assert record is None and problem.startswith("attempt: blank"), problem


def test_the_ledger_round_trips():
    node = {"metadata": {"annotations": {ATTEMPT_ANNOTATION: attempts.attempt_text(attempt())}}}
    assert attempts.parse_attempt(node, now=AT) == (attempt(), "")


@pytest.mark.slow  # moto's server
def test_a_corrupt_ledger_is_told_and_holds_the_reboot_until_its_deadline(world: World):
    """Unreadable, it may hide a reboot in flight: no request before a deadline from when it was first seen."""
    w = world
    w.api.faults.add(method="PATCH", path_regex=NODE_PATH, body_regex="reserved", kind="applied", status=503)
    first_agent_stops(w, lambda w: None)  # reserved, then the agent stops
    node = w.api.get_object("nodes", NODE)
    node["metadata"]["annotations"][ATTEMPT_ANNOTATION] = '{"at": 1e999}'
    w.api.put_object(node)
    h = w.make()
    for _ in range(3):
        w.step(h)
        w.clock.now += 120
    assert w.reboots() == 0
    (told,) = h.events("RecoveryCorruptRecord")
    assert ATTEMPT_ANNOTATION in told.message
    w.clock.now += DEADLINE
    w.step(h)
    assert w.reboots() == 1 and w.ledger()["state"] == attempts.SENT
