"""The fleet benchmark's simulation (bench/fleetsim.py, bench/fleetstep.py, bench/fleetweek.py) kept from
rotting: its measures as tables, the stepper's scheduling, and each scenario end to end with a tiny fleet."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from bench import fleetsim, fleetstep
from bench.fleetweek import simulate_week

from kubeapi.requestlog import RequestRecord

pytestmark = pytest.mark.slow  # runs the fleet simulation with a tiny fleet


def _patch(node: str, unschedulable: bool, *, status: int = 200) -> RequestRecord:
    return RequestRecord("PATCH", f"/api/v1/nodes/{node}", {}, None, status, {"spec": {"unschedulable": unschedulable}})


@pytest.mark.parametrize(
    ("records", "limit", "expected"),
    [
        ([], 2, (0, 0)),
        ([_patch("a", True), _patch("b", True)], 2, (0, 2)),
        ([_patch("a", True), _patch("b", True), _patch("c", True)], 2, (1, 3)),
        ([_patch("a", True), _patch("a", True), _patch("b", True)], 1, (1, 2)),  # a repeated cordon counts once
        ([_patch("a", True), _patch("a", False), _patch("b", True)], 1, (0, 1)),  # an uncordon frees the place
        ([_patch("a", True), _patch("b", True, status=409)], 1, (0, 1)),  # a refused write disrupts nothing
        (
            [_patch("a", True), RequestRecord("PATCH", "/api/v1/nodes/b/status", {}, None, 200, {"spec": {}})],
            1,
            (0, 1),
        ),
    ],
)
def test_cordons_over_the_limit_are_counted_from_the_servers_view(
    records: list[RequestRecord], limit: int, expected: tuple[int, int]
) -> None:
    assert fleetsim.cordoned_over(records, limit) == expected


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/api/v1/nodes", "nodes (list)"),
        ("/api/v1/nodes/n0001", "nodes/NAME"),
        ("/api/v1/nodes/n0001/status", "nodes/status"),
        ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/budget", "leases/NAME"),
        ("/api/v1/namespaces/default/events", "events (list)"),
    ],
)
def test_requests_are_grouped_by_resource_without_names(path: str, kind: str) -> None:
    assert fleetsim._kind(path) == kind


@pytest.mark.parametrize(
    ("times", "width", "expected"),
    [
        ([], 10.0, [0, 0, 0]),
        ([0.0, 9.9, 10.0, 29.9], 10.0, [2, 1, 1]),
        ([-1.0, 30.0], 10.0, [0, 0, 0]),  # outside the span
    ],
)
def test_window_counts(times: list[float], width: float, expected: list[int]) -> None:
    assert fleetsim.window_counts(times, start=0.0, end=30.0, width=width) == expected


def test_simulated_time_runs_scale_times_faster_in_every_wait() -> None:
    class Recorded(threading.Event):
        """The real event, recording each timeout it is asked to wait."""

        def __init__(self) -> None:
            super().__init__()
            self.waits: list[float | None] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            return super().wait(timeout)

    sim = fleetsim.SimTime(origin=time.monotonic(), scale=100.0)
    event = Recorded()
    stop = fleetsim.ScaledStop(event, 100.0)
    before = time.monotonic()
    assert stop.wait(5.0) is False  # 5 simulated seconds: 50 ms
    assert event.waits == [pytest.approx(0.05)]  # the real wait asked (no wall-clock upper bound)
    assert time.monotonic() - before >= 0.04  # a lower bound only: a loaded machine can only add to it
    assert sim.mono() >= 5.0
    assert math.isclose(sim.now() - fleetsim.T0, sim.mono(), abs_tol=1.0)


class RecordedStepper(fleetstep.Stepper):
    """The stepper's scheduling alone: each turn recorded, none run."""

    def __init__(self) -> None:
        super().__init__([], fleetstep.StepClock())
        self.log: list[tuple[float, int, str]] = []

    def _turn(self, i: int, component: str) -> None:
        self.log.append((self.clock.t, i, component))


@pytest.mark.parametrize(
    ("schedules", "expected"),
    [
        ([(0, "main", 5.0)], [(5.0, 0, "main")]),
        ([(0, "main", 5.0), (0, "main", 3.0)], [(3.0, 0, "main")]),  # an earlier turn replaces the later one
        ([(0, "main", 3.0), (0, "main", 5.0)], [(3.0, 0, "main")]),  # ... a later one never the earlier
        ([(0, "main", 3.0), (0, "main", 3.0)], [(3.0, 0, "main")]),  # the same turn is one turn
        (
            [(1, "events", 2.0), (0, "events", 2.0), (0, "main", 1.0)],
            [(1.0, 0, "main"), (2.0, 1, "events"), (2.0, 0, "events")],
        ),
        ([(0, "main", 11.0)], []),  # not due by the end
    ],
)
def test_the_stepper_turns_each_component_once_at_its_earliest_due_time(schedules, expected) -> None:
    stepper = RecordedStepper()
    for i, component, due in schedules:
        stepper.schedule(i, component, due)
    stepper.run_until(10.0)
    assert stepper.log == expected
    assert stepper.clock.mono() == 10.0  # the clock ends where it was asked to, turns or not


def test_a_stepped_clock_dates_requests_by_the_turn_they_came_in() -> None:
    clock = fleetstep.StepClock()
    clock.advance(5.0)
    clock.advance(3.0)  # never backwards
    clock.sleep(2.0)  # a budget retry inside a turn moves it on
    assert clock.mono() == 7.0 and clock.slept == 2.0
    assert [t for _, t in clock.breakpoints] == [0.0, 5.0, 7.0]
    reals = [real for real, _ in clock.breakpoints]
    assert reals == sorted(reals)


@pytest.fixture(scope="module", params=[False, True], ids=["threads", "stepped"])
def steady(request: pytest.FixtureRequest) -> Any:
    return fleetsim.steady_state(agents=6, processes=2, scale=120.0, hours=0.25, stepped=request.param)


def test_a_tiny_steady_fleet_writes_heartbeats_only(steady: Any) -> None:
    # 15 simulated minutes after every node's first write: the first heartbeat 300-630 s after it (at the
    # node's phase), then one every 330 s: 1 or 2 writes a node (3 if its first write came over a minute
    # before the last node's). A healthy node's recovery loop reads its Node once, at its first step, and
    # never again (that one read may land just inside the quarter hour measured), and polls the pause Lease
    # every 5 min ±20 % when idle: at most 1 + 4 reads a node in the quarter hour.
    assert 4.0 <= steady.figures["fleet.writes_per_node_hour"] <= 12.0
    assert steady.figures["fleet.reads_per_node_hour"] * 0.25 <= 5.0
    assert steady.figures["fleet.max_writes_10s_over_mean"] >= 1.0
    assert steady.figures["fleet.max_writes_10s_over_mean_unpulsed"] >= 1.0


@pytest.mark.parametrize("light", [False, True])  # full agents; the main loops and seeders stepped by a Pump
def test_a_tiny_misfire_never_disrupts_more_than_the_budget(light: bool) -> None:
    measured = fleetsim.misfire(agents=12, processes=2, scale=20.0, settle=600.0, light=light)
    assert measured.figures["fleet.actions_over_budget"] == 0
    assert measured.figures["fleet.misfire_objects_per_s_per_agent"] > 0
    assert measured.figures["fleet.converge_blocked_s"] < 600.0
    assert measured.figures["fleet.lease_requests_per_grant"] >= 2  # a read and a write at least


def test_a_pause_mid_wave_stops_every_remedy_in_a_tiny_misfire() -> None:
    measured = fleetsim.pause_mid_wave(agents=12, processes=2, scale=5.0, after=30.0)
    assert 0.0 <= measured.figures["fleet.pause_effective_s"] <= 10.0
    # a check-then-act race of milliseconds: an agent that read the Lease just before the pause write may go on
    assert measured.figures["fleet.pause_remedies_after"] <= 2


@pytest.mark.parametrize("stepped", [False, True], ids=["threads", "stepped"])
def test_a_tiny_outage_loses_no_event_and_converges(stepped: bool) -> None:
    measured = fleetsim.outage(agents=6, processes=2, scale=60.0, down=300.0, settle=600.0, stepped=stepped)
    assert measured.figures["fleet.events_lost"] == 0
    assert measured.figures["fleet.conditions_wrong"] == 0
    assert measured.figures["fleet.converge_s"] < 600.0
    assert measured.figures["fleet.outage_requests_per_node_min"] > 0  # the agents kept trying, with backoff


def test_a_week_of_steady_faults_is_never_blocked_and_the_burst_is_held() -> None:
    result = simulate_week(nodes=40, rate=100.0, burst=8, seed=3)
    assert result.limit == 4  # 10% of 40
    assert (result.over, result.steady_blocked) == (0, 0)
    assert result.burst_held >= result.burst - result.limit
    assert result.max_disrupted <= result.limit
