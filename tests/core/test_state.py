"""NodeState: findings in, conditions/events/counts out (injected clock)."""

from __future__ import annotations

import pytest

from agent.core.state import NodeState
from agent.core.types import ConditionSpec, Finding, RuleType, Severity, Status


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


SPECS = (
    ConditionSpec(type="NeuronHealth", reason="NeuronHasNoError", message="Neuron has no error", source="neuron"),
    ConditionSpec(type="GpuXid", reason="GpuXidGood", message="GPU XID is ok", clear_after=600.0, source="nvidia"),
)


def finding(
    reason: str,
    *,
    condition: str | None = None,
    severity: Severity = Severity.ERROR,
    ts: float = 990.0,
    status: Status = Status.TRUE,
    message: str = "msg",
) -> Finding:
    return Finding(
        rule=f"test/{reason}",
        type=RuleType.PERMANENT if condition else RuleType.TEMPORARY,
        condition=condition,
        reason=reason,
        severity=severity,
        message=message,
        timestamp=ts,
        source="test",
        status=status,
    )


def make(clock: Clock) -> NodeState:
    return NodeState(conditions=SPECS, clock=clock, reasons=["OOMKilling"], problem_pairs=[("GpuXid", "GpuXid79")])


def test_initial_conditions_are_healthy_defaults():
    state = make(Clock())
    snap = state.snapshot()
    assert [(c.type, c.status, c.reason) for c in snap.conditions] == [
        ("NeuronHealth", Status.FALSE, "NeuronHasNoError"),
        ("GpuXid", Status.FALSE, "GpuXidGood"),
    ]
    assert snap.problem_counts == {"OOMKilling": 0}


@pytest.mark.parametrize(
    ("findings", "expected_status", "expected_reason", "n_events"),
    [
        pytest.param(
            [finding("NeuronHasError_DMA_ERROR", condition="NeuronHealth")],
            Status.TRUE,
            "NeuronHasError_DMA_ERROR",
            1,
            id="problem-sets-condition",
        ),
        pytest.param(
            [finding("NeuronHasError_DMA_ERROR", condition="NeuronHealth")] * 3,
            Status.TRUE,
            "NeuronHasError_DMA_ERROR",
            1,
            id="repeats-do-not-transition",
        ),
        pytest.param(
            [
                finding("NeuronHasError_DMA_ERROR", condition="NeuronHealth", severity=Severity.CRITICAL),
                finding("NeuronHasError_X", condition="NeuronHealth", severity=Severity.WARNING),
            ],
            Status.TRUE,
            "NeuronHasError_DMA_ERROR",
            1,
            id="weaker-reason-does-not-replace",
        ),
        pytest.param(
            [
                finding("NeuronHasError_A", condition="NeuronHealth", severity=Severity.ERROR),
                finding("NeuronHasError_B", condition="NeuronHealth", severity=Severity.CRITICAL),
            ],
            Status.TRUE,
            "NeuronHasError_B",
            2,
            id="stronger-reason-replaces",
        ),
        pytest.param(
            [
                finding("NeuronHasError_A", condition="NeuronHealth"),
                finding("Healthy", condition="NeuronHealth", status=Status.FALSE),
            ],
            Status.FALSE,
            "NeuronHasNoError",
            2,
            id="false-finding-heals-with-default-reason",
        ),
        pytest.param(
            [finding("CheckFailed", condition="NeuronHealth", status=Status.UNKNOWN)],
            Status.UNKNOWN,
            "CheckFailed",
            1,
            id="unknown",
        ),
    ],
)
def test_fold(findings, expected_status, expected_reason, n_events):
    state = make(Clock())
    events = [e for f in findings for e in state.apply(f)]
    cond = state.snapshot().condition("NeuronHealth")
    assert (cond.status, cond.reason) == (expected_status, expected_reason)
    assert len(events) == n_events


def test_transition_time_is_log_time_and_stable_while_unchanged():
    clock = Clock(1000.0)
    state = make(clock)
    state.apply(finding("NeuronHasError_A", condition="NeuronHealth", ts=900.0))
    first = state.snapshot().condition("NeuronHealth")
    assert first.last_transition == 900.0
    clock.now = 1500.0
    state.apply(finding("NeuronHasError_B", condition="NeuronHealth", ts=1490.0, severity=Severity.CRITICAL))
    second = state.snapshot().condition("NeuronHealth")
    assert second.reason == "NeuronHasError_B"
    assert second.last_transition == 900.0, "a reason change keeps lastTransitionTime (status unchanged)"


def test_future_log_time_is_clamped_to_now():
    state = make(Clock(1000.0))
    state.apply(finding("NeuronHasError_A", condition="NeuronHealth", ts=5000.0))
    assert state.snapshot().condition("NeuronHealth").last_transition == 1000.0


def test_temporary_finding_is_an_event_and_counts():
    state = make(Clock())
    events = state.apply(finding("OOMKilling", severity=Severity.WARNING))
    assert [(e.type, e.reason, e.condition) for e in events] == [("Warning", "OOMKilling", None)]
    assert state.snapshot().problem_counts["OOMKilling"] == 1
    info = state.apply(finding("OOMReaper", severity=Severity.INFO))
    assert info[0].type == "Normal"


def test_problem_counter_counts_transitions_only():
    state = make(Clock())
    for _ in range(5):
        state.apply(finding("GpuXid79", condition="GpuXid"))
    assert state.snapshot().problem_counts["GpuXid79"] == 1


def test_clear_after_heals_after_quiet_period_and_not_before():
    clock = Clock(1000.0)
    state = make(clock)
    state.apply(finding("GpuXid79", condition="GpuXid", ts=1000.0))
    clock.now = 1000.0 + 599
    assert state.expire() == []
    state.apply(finding("GpuXid79", condition="GpuXid", ts=clock.now))  # a repeat restarts the quiet period
    clock.now += 599
    assert state.expire() == []
    clock.now += 1
    events = state.expire()
    assert [(e.condition, e.status, e.type) for e in events] == [("GpuXid", Status.FALSE, "Normal")]
    cond = state.snapshot().condition("GpuXid")
    assert (cond.status, cond.reason, cond.last_transition) == (Status.FALSE, "GpuXidGood", clock.now)
    assert "cleared after 10m" in cond.message


def test_conditions_without_clear_after_never_expire():
    clock = Clock(1000.0)
    state = make(clock)
    state.apply(finding("NeuronHasError_A", condition="NeuronHealth"))
    clock.now += 10 * 365 * 86400
    assert state.expire() == []


def test_seed_adopts_existing_conditions_without_events():
    clock = Clock(1000.0)
    source = make(clock)
    source.apply(finding("NeuronHasError_A", condition="NeuronHealth", ts=100.0))
    restarted = make(Clock(5000.0))
    restarted.seed(source.snapshot().conditions)
    cond = restarted.snapshot().condition("NeuronHealth")
    assert (cond.status, cond.reason, cond.last_transition) == (Status.TRUE, "NeuronHasError_A", 100.0)
    assert restarted.apply(finding("NeuronHasError_A", condition="NeuronHealth")) == []


def test_undeclared_condition_is_ignored():
    state = make(Clock())
    assert state.apply(finding("X", condition="Nope")) == []
