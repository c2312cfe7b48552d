"""The recovery counters exist at 0 from the first scrape, for every label value an alert or dashboard reads.

A counter series that first appears at 1 has no earlier sample: Prometheus' ``increase()`` sees no rise and
the first incident raises no alert (issue 33, finding 2). tests/deploy/test_promtool.py proves the alerts
fire on series that start at 0; these tests prove the agent exports them so.
"""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.adapters.aws import AwsError
from agent.recovery.drain import DrainOutcome
from agent.recovery.ladder import FAILURE_KINDS, failure_kind
from agent.recovery.loop import RecoveryStats
from agent.recovery.metrics import RecoveryCollector, incident_labels
from agent.recovery.model import Action, PolicyRule, RecoveryPolicy, Remedy
from agent.recovery.policyfile import DEFAULT_POLICY
from agent.sinks.metrics import build_registry


def samples(collector: RecoveryCollector) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(build_registry(collector)).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def value(scraped: dict, name: str, **labels: str) -> float | None:
    return scraped.get((name, frozenset(labels.items())))


P = "node_health_agent_recovery_"


def fresh(policy: RecoveryPolicy = DEFAULT_POLICY) -> tuple[RecoveryStats, dict]:
    stats = RecoveryStats()
    return stats, samples(RecoveryCollector(stats=lambda: stats, policy=policy))


def test_before_any_incident_every_replace_of_the_default_policy_is_a_zero_series() -> None:
    """The series NodeHealthRecoveryReplaceRequested reads, for every condition the built-in policy replaces on."""
    _, scraped = fresh()
    replacing = {
        r.condition for r in DEFAULT_POLICY.rules if Action.MARK_UNHEALTHY in r.actions or Remedy.REPLACE in r.ladder
    }
    assert replacing, "the built-in policy replaces on some condition"
    for condition in sorted(replacing):
        labels = {"condition": condition, "remedy": "mark-unhealthy", "outcome": "remedy-requested"}
        assert value(scraped, P + "incidents_total", **labels) == 0.0, condition


@pytest.mark.parametrize("outcome", [o.value for o in DrainOutcome])
def test_before_any_drain_every_drain_outcome_is_a_zero_series(outcome: str) -> None:
    _, scraped = fresh()
    assert value(scraped, P + "drains_total", outcome=outcome) == 0.0


@pytest.mark.parametrize(
    ("action", "result"),
    [*((a.value, r) for a in Action for r in ("ok", "failed")), *(("reboot", k) for k in FAILURE_KINDS)],
)
def test_before_any_action_every_documented_result_is_a_zero_series(action: str, result: str) -> None:
    _, scraped = fresh()
    assert value(scraped, P + "actions_total", action=action, result=result) == 0.0


@pytest.mark.parametrize(
    "why",
    [
        *("RecoveryBlocked", "RecoveryHeldCorrelated", "StartupDelay", "WaitingForPersistence", "OptedOut"),
        *("Paused", "Vetoed", "AgentUnhealthy", "UntrustedSource"),
    ],
)
def test_before_any_hold_every_documented_why_is_a_zero_series(why: str) -> None:
    _, scraped = fresh()
    assert value(scraped, P + "blocked_total", why=why) == 0.0


def test_counts_keep_their_series_and_values() -> None:
    """Counting changes the value of the zero series, not the set of series."""
    stats, before = fresh()
    stats.actions[("reboot", "denied")] += 2
    stats.drains[DrainOutcome.DEADLINE] += 1
    stats.blocked["RecoveryBlocked"] += 3
    stats.incidents[("NeuronHealth", "mark-unhealthy", "remedy-requested")] += 1
    after = samples(RecoveryCollector(stats=lambda: stats, policy=DEFAULT_POLICY))
    assert set(after) == set(before)
    assert value(after, P + "actions_total", action="reboot", result="denied") == 2.0
    assert value(after, P + "drains_total", outcome="deadline") == 1.0
    assert value(after, P + "blocked_total", why="RecoveryBlocked") == 3.0
    labels = {"condition": "NeuronHealth", "remedy": "mark-unhealthy", "outcome": "remedy-requested"}
    assert value(after, P + "incidents_total", **labels) == 1.0


def test_a_count_outside_the_known_labels_is_still_exported() -> None:
    stats = RecoveryStats()
    stats.incidents[("Other", "none", "healed")] += 1
    scraped = samples(RecoveryCollector(stats=lambda: stats, policy=RecoveryPolicy(rules=())))
    assert value(scraped, P + "incidents_total", condition="Other", remedy="none", outcome="healed") == 1.0


RULE = PolicyRule(condition="C", actions=(Action.CORDON,))


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (RULE, {("C", "none", "healed"), ("C", "cordon", "healed")}),
        (
            dataclasses.replace(RULE, actions=(Action.CORDON, Action.DRAIN, Action.MARK_UNHEALTHY)),
            {
                ("C", "none", "healed"),
                ("C", "cordon", "healed"),
                ("C", "drain", "healed"),
                ("C", "mark-unhealthy", "healed"),
                ("C", "mark-unhealthy", "remedy-requested"),
            },
        ),
        (
            dataclasses.replace(RULE, ladder=(Remedy.REBOOT, Remedy.REPLACE)),
            {
                ("C", "none", "healed"),
                ("C", "cordon", "healed"),
                ("C", "drain", "healed"),
                ("C", "reboot", "healed"),
                ("C", "mark-unhealthy", "healed"),
                ("C", "reboot", "remedy-requested"),
                ("C", "mark-unhealthy", "remedy-requested"),
            },
        ),
    ],
    ids=["cordon-only", "replace-at-once", "ladder"],
)
def test_incident_labels_are_the_conditions_and_remedies_of_the_policy(rule: PolicyRule, expected: set) -> None:
    assert incident_labels(RecoveryPolicy(rules=(rule,))) == expected


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (AwsError("x", code="Throttling", transient=True), "throttled"),
        (AwsError("x", code="UnauthorizedOperation", status=403), "denied"),
        (AwsError("x", code="Other", status=403), "denied"),
        (AwsError("x", code="IncorrectState", status=400), "wrong-state"),
        (AwsError("x", code="ValidationError", status=400), "failed"),
    ],
)
def test_every_reboot_failure_kind_is_one_the_collector_exports_at_zero(error: AwsError, kind: str) -> None:
    assert failure_kind(error) == kind
    assert kind in FAILURE_KINDS
