"""Active checks: the declaration keys, the gates (one at a time, busy devices, the fleet share against
the test API server's Lease), and the scheduler running on-demand checks only when a request names them."""

from __future__ import annotations

import json
import random
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.adapters.kube import KubeClient
from agent.checks.active import (
    ACTIVE_RUNNING,
    DEVICE_BUSY,
    FLEET_SHARE_FULL,
    FLEET_SLOTS_UNAVAILABLE,
    HOLDERS_UNKNOWN,
    ActiveGates,
    Holders,
    decide,
    records_of,
)
from agent.checks.declared import merge, read_checks
from agent.checks.fleetslots import FULL, GRANTED, SLOTS_ANNOTATION, UNAVAILABLE, FleetSlots, SlotAnswer, lease_name
from agent.checks.loader import build_checks
from agent.checks.model import ActiveSpec, CheckContext, CheckReport, CheckResult, CheckStatus, ScheduledCheck
from agent.checks.scheduler import REQUEST_POLL, CheckScheduler
from agent.core.bus import Inbox
from agent.core.configdoc import Problems, read_pack
from agent.core.types import ConditionSpec
from agent.core.validation import ValidationRequest, Verdict

from helpers import kube_clients
from kubeapi.server import KubeApiServer

pytest_plugins = ["kubeapi.fixtures"]

OK, PROBLEM, UNKNOWN = CheckStatus.OK, CheckStatus.PROBLEM, CheckStatus.UNKNOWN
NS = "node-health-agent"
ZONE = "topology.kubernetes.io/zone"


# ---- declarations ---------------------------------------------------------------------------------------


def declare(tmp: Path, text: str):
    path = tmp / "checks.yaml"
    path.write_text(textwrap.dedent(text))
    doc, _ = read_pack(path)
    col = Problems(file=str(path), doc=doc)
    merged = merge([(col, p, g) for p, g in read_checks(col)])
    return merged, [(p.field, p.line, p.message) for p in col.problems]


def test_an_active_declaration_carries_its_devices_validity_and_on_demand_interval(tmp_path):
    merged, problems = declare(
        tmp_path,
        """
        checks:
          - name: dcgm-diag
            use: nvidia.active:DcgmDiagCheck
            active: true
            devices: gpu
            validFor: 12h
            interval: 0
            timeout: 10m
            enabled: false
        """,
    )
    assert problems == []
    [decl] = merged
    assert (decl.active, decl.devices, decl.valid_for, decl.interval, decl.enabled) == (True, "gpu", 43200, 0, False)


@pytest.mark.parametrize(
    ("keys", "field", "line", "says"),
    [
        ("active: yes-please", "checks[0].active", 4, "must be true or false"),
        ("active: true\n    devices: tpu", "checks[0].devices", 5, "must be one of gpu, neuron, rdma"),
        ("active: true\n    devices: gpu\n    validFor: soon", "checks[0].validFor", 6, "invalid duration"),
        ("active: true\n    devices: gpu\n    validFor: 0s", "checks[0].validFor", 6, "must be more than 0"),
        ("active: true", "checks[0].active", 4, "must say which devices"),
        ("devices: gpu", "checks[0].devices", 4, "applies only to an active check"),
        ("validFor: 1h", "checks[0].validFor", 4, "applies only to an active check"),
        ("interval: 0", "checks[0].interval", 4, "must be more than 0"),
    ],
    ids=["active-not-bool", "bad-kind", "bad-validfor", "zero-validfor", "no-devices", "devices-passive",
         "validfor-passive", "zero-interval-passive"],
)  # fmt: skip
def test_bad_active_keys_name_file_field_and_line(tmp_path, keys, field, line, says):
    _, problems = declare(tmp_path, f"checks:\n  - name: x\n    use: a:b\n    {keys}\n")
    assert [(f, ln) for f, ln, _ in problems] == [(field, line)]
    assert says in problems[0][2]


class Quiet:
    def __init__(self, *, name, context, options):
        self.name = name
        self.conditions = ()

    def run(self):
        return [CheckResult(status=OK, condition=None, reason="Fine", message="fine", devices=("gpu:0",))]


def test_a_disabled_active_check_is_built_dormant_and_a_disabled_passive_one_is_not(tmp_path, monkeypatch):
    from agent.checks import loader

    monkeypatch.setattr(loader, "_builtin_factory", lambda module, attr: Quiet)
    merged, problems = declare(
        tmp_path,
        """
        checks:
          - {name: diag, use: m:Quiet, active: true, devices: gpu, interval: 0, enabled: false}
          - {name: passive, use: m:Quiet, enabled: false}
          - {name: periodic, use: m:Quiet, active: true, devices: neuron, interval: 1h}
        """,
    )
    assert problems == []
    checks, problems = build_checks(merged, context=CheckContext(), entry_points=lambda: [])
    assert problems == []
    assert {c.name: c.active for c in checks} == {
        "diag": ActiveSpec(devices="gpu", on_demand=True, dormant=True),
        "periodic": ActiveSpec(devices="neuron"),
    }


# ---- the gates: the pure decision and its seams -------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "holders", "slot", "reason"),
    [
        (None, Holders(), SlotAnswer(outcome=GRANTED, detail=""), None),
        ("nccl", Holders(), None, ACTIVE_RUNNING),
        (None, Holders(pods="ml/train-0"), None, DEVICE_BUSY),
        (None, Holders(unknown="no pod-resources API"), None, HOLDERS_UNKNOWN),
        (None, Holders(), SlotAnswer(outcome=FULL, detail="1 of 1"), FLEET_SHARE_FULL),
        (None, Holders(), SlotAnswer(outcome=UNAVAILABLE, detail="503"), FLEET_SLOTS_UNAVAILABLE),
    ],
    ids=["all-clear", "one-at-a-time", "busy", "holders-unknown", "share-full", "api-error"],
)
def test_the_gates_decide_start_or_skip_with_a_reason(running, holders, slot, reason):
    skip = decide(check="diag", devices="gpu", running=running, holders=holders, slot=slot)
    assert (skip.reason if skip else None) == reason
    if skip is not None:
        assert skip.result().status is UNKNOWN  # a skip is never a fail


class FakeSlots:
    def __init__(self, answer: str = GRANTED):
        self.answer, self.taken, self.released = answer, 0, 0

    def acquire(self, *, check, timeout):
        self.taken += 1
        return SlotAnswer(outcome=self.answer, detail="n2 (diag)")

    def release(self):
        self.released += 1


def test_a_busy_device_skips_before_any_slot_is_asked_for():
    slots = FakeSlots()
    gates = ActiveGates(busy=lambda kind: "ml/train-0 (gpu:0000:3b:00.0)", slots=slots)
    skip = gates.admit(check="diag", spec=ActiveSpec(devices="gpu"), timeout=60)
    assert skip is not None and skip.reason == DEVICE_BUSY and "ml/train-0" in skip.message
    assert slots.taken == 0


def test_a_lookup_that_cannot_tell_skips_as_holders_unknown():
    def cannot(kind):
        raise LookupError("no pod-resources API")

    skip = ActiveGates(busy=cannot).admit(check="diag", spec=ActiveSpec(devices="gpu"), timeout=60)
    assert skip is not None and skip.reason == HOLDERS_UNKNOWN


# ---- the fleet share against the test API server ------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1_767_225_600.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(kube_api_server: KubeApiServer) -> KubeApiServer:
    kube_api_server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for i in range(25):
        kube_api_server.put_object(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}", "labels": {ZONE: "z1"}}}
        )
    kube_api_server.put_object(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "far", "labels": {ZONE: "z2"}}}
    )
    return kube_api_server


@pytest.fixture
def kube(api: KubeApiServer, tmp_path: Path) -> Iterator[Callable[[], KubeClient]]:
    with kube_clients(api, tmp_path, timeout=10.0) as make:
        yield make


def slots_of(kube, node: str, clock: Clock, **kw) -> FleetSlots:
    return FleetSlots(
        client=kube(), namespace=NS, node_name=node, clock=clock, sleep=lambda s: None, rng=random.Random(1), **kw
    )


def test_the_share_is_ten_percent_of_the_zone_rounded_up_and_a_full_share_skips(kube):
    clock = Clock()
    answers = [slots_of(kube, f"n{i}", clock).acquire(check="diag", timeout=600).outcome for i in range(5)]
    assert answers == [GRANTED, GRANTED, GRANTED, FULL, FULL]  # ceil(10 % of 25) = 3
    assert slots_of(kube, "far", clock).acquire(check="diag", timeout=600).outcome == GRANTED  # its own zone: 1 slot


def test_a_released_slot_is_free_again_and_the_holder_may_renew(kube):
    clock = Clock()
    first = slots_of(kube, "n0", clock, share=0.01)
    assert first.acquire(check="diag", timeout=600).outcome == GRANTED
    assert first.acquire(check="diag", timeout=600).outcome == GRANTED  # its own slot
    assert slots_of(kube, "n1", clock, share=0.01).acquire(check="diag", timeout=600).outcome == FULL
    first.release()
    assert slots_of(kube, "n1", clock, share=0.01).acquire(check="diag", timeout=600).outcome == GRANTED


def test_a_stale_slot_expires_after_the_timeout_plus_grace(kube):
    clock = Clock()
    assert slots_of(kube, "n0", clock, share=0.01, grace=60).acquire(check="diag", timeout=600).outcome == GRANTED
    clock.now += 659  # the holder was killed mid-check: it never gives the slot back
    assert slots_of(kube, "n1", clock, share=0.01).acquire(check="diag", timeout=600).outcome == FULL
    clock.now += 1
    assert slots_of(kube, "n1", clock, share=0.01).acquire(check="diag", timeout=600).outcome == GRANTED


def test_an_api_error_or_a_corrupt_lease_is_unavailable_never_granted(kube, api):
    clock = Clock()
    api.faults.add(method="GET", path_regex=r"/leases/", status=500)
    assert slots_of(kube, "n0", clock).acquire(check="diag", timeout=600).outcome == UNAVAILABLE
    api.faults.clear()
    group = f"{ZONE}=z1"
    api.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease_name(group), "namespace": NS, "annotations": {SLOTS_ANNOTATION: "{oops"}},
            "spec": {},
        }
    )
    assert slots_of(kube, "n0", clock).acquire(check="diag", timeout=600).outcome == UNAVAILABLE


def test_racing_agents_never_take_more_than_the_share(kube):
    from concurrent.futures import ThreadPoolExecutor

    clock = Clock()
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda i: slots_of(kube, f"n{i}", clock, attempts=30).acquire(check="d", timeout=60), range(8))
        )
    granted = [a for a in answers if a.outcome == GRANTED]
    assert len(granted) == 3
    lease = kube().get_lease(NS, lease_name(f"{ZONE}=z1"))
    assert len(json.loads(lease["metadata"]["annotations"][SLOTS_ANNOTATION])["holders"]) == 3


# ---- the scheduler ------------------------------------------------------------------------------------------


class Diag:
    def __init__(self, name: str, results=None):
        self.name = name
        self.conditions = (ConditionSpec(type="GpuDiag", reason="GpuDiagOk", message="fine", source=name),)
        self.calls = 0
        self._results = results or [
            CheckResult(status=OK, condition="GpuDiag", reason="GpuDiagOk", message="passed", devices=("gpu:0",))
        ]

    def run(self):
        self.calls += 1
        return self._results


class Manual:
    def __init__(self):
        self.pending: list[Callable[[], None]] = []

    def __call__(self, target, name):
        self.pending.append(target)

    def finish_all(self):
        while self.pending:
            self.pending.pop(0)()


def active(check, *, on_demand=False, dormant=False, interval=3600.0) -> ScheduledCheck:
    return ScheduledCheck(
        check=check,
        interval=interval,
        timeout=600.0,
        kind="python",
        origin="test",
        jitter=0,
        active=ActiveSpec(devices="gpu", on_demand=on_demand, dormant=dormant),
    )


def make(*specs, busy=lambda kind: None, requests=None, slots=None):
    manual = Manual()
    s = CheckScheduler(
        checks=list(specs),
        inbox=Inbox(),
        clock=lambda: 1000.0,
        monotonic=lambda: 0.0,
        start_thread=manual,
        rng=random.Random(0),
        gates=ActiveGates(busy=busy, slots=slots),
        requests=requests,
    )
    return s, manual


def request(id_: str, *checks: str) -> ValidationRequest:
    return ValidationRequest(id=id_, checks=checks, requested_at=900.0)


def test_an_on_demand_check_runs_once_per_request_naming_it_and_never_otherwise():
    diag = Diag("diag")
    open_: list[ValidationRequest] = []
    s, manual = make(active(diag, on_demand=True), requests=lambda: tuple(open_))
    s.step(0.0)
    manual.finish_all()
    assert diag.calls == 0  # no request: never runs
    open_.append(request("inc-1/1", "diag"))
    s.step(REQUEST_POLL)
    manual.finish_all()
    reports, _ = s.step(REQUEST_POLL + 1)
    assert diag.calls == 1 and [(r.check, r.skipped, r.active is not None) for r in reports] == [("diag", False, True)]
    s.step(3 * REQUEST_POLL)  # still open (the main loop has not closed it): it does not run again
    manual.finish_all()
    assert diag.calls == 1
    open_[:] = [request("inc-1/2", "diag")]  # a new request: a new run
    s.step(4 * REQUEST_POLL)
    manual.finish_all()
    assert diag.calls == 2


def test_a_dormant_check_runs_only_when_requested():
    diag = Diag("diag")
    s, manual = make(active(diag, dormant=True), requests=lambda: ())
    for t in (0.0, 3600.0, 7300.0):
        s.step(t)
        manual.finish_all()
    assert diag.calls == 0


def test_a_busy_device_skips_as_unknown_and_retries_later_with_the_request_still_open():
    diag = Diag("diag")
    holders: list[str | None] = ["ml/train-0"]
    s, manual = make(
        active(diag, on_demand=True), busy=lambda kind: holders[0], requests=lambda: (request("r", "diag"),)
    )
    s.step(0.0)
    manual.finish_all()
    reports, wake = s.step(1.0)
    assert diag.calls == 0
    [report] = reports
    assert report.skipped and [(r.status, r.reason) for r in report.results] == [(UNKNOWN, DEVICE_BUSY)]
    assert records_of(report) == ()  # a skip leaves no validation record
    holders[0] = None
    s.step(wake)  # the poll: not yet due again (the retry is jittered, 30-90 s)
    manual.finish_all()
    assert diag.calls == 0
    s.step(91.0)
    manual.finish_all()
    assert diag.calls == 1


def test_never_two_active_checks_at_once():
    a, b = Diag("a"), Diag("b")
    s, manual = make(active(a), active(b))
    s.step(0.0)
    assert len(manual.pending) == 1
    manual.finish_all()
    s.step(1.0)
    assert len(manual.pending) == 1  # b starts once a is done
    manual.finish_all()
    assert (a.calls, b.calls) == (1, 1)


def test_a_full_fleet_share_skips_and_the_slot_is_given_back_after_a_run():
    slots = FakeSlots(FULL)
    diag = Diag("diag")
    s, manual = make(active(diag), slots=slots)
    s.step(0.0)
    manual.finish_all()
    [report] = s.step(1.0)[0]
    assert [r.reason for r in report.results] == [FLEET_SHARE_FULL] and diag.calls == 0
    slots.answer = GRANTED
    s.step(200.0)
    manual.finish_all()
    assert diag.calls == 1 and slots.released == 1


# ---- the records of a run -------------------------------------------------------------------------------------


def test_a_run_leaves_one_record_per_device_the_worst_verdict_and_a_pass_valid_for_its_window():
    report = CheckReport(
        check="diag",
        results=(
            CheckResult(status=OK, condition=None, reason="Passed", message="", devices=("gpu:0", "gpu:1")),
            CheckResult(status=PROBLEM, condition=None, reason="MemoryTestFailed", message="", devices=("gpu:1",)),
            CheckResult(status=UNKNOWN, condition=None, reason="Unparsable", message="", devices=("gpu:2",)),
        ),
        finished_at=1000.0,
        duration=120.0,
        active=ActiveSpec(devices="gpu", valid_for=3600.0),
    )
    got = {r.devices: (r.verdict, r.reason, r.valid_until) for r in records_of(report)}
    assert got == {
        ("gpu:0",): (Verdict.PASS, "Passed", 4600.0),
        ("gpu:1",): (Verdict.FAIL, "MemoryTestFailed", None),
        ("gpu:2",): (Verdict.UNKNOWN, "Unparsable", None),
    }
