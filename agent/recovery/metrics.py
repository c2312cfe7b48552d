"""Prometheus metrics of recovery, computed at scrape time from the loop's figures.

- ``node_health_agent_recovery_enabled``: 1 when ENABLE_RECOVERY=true (acting), 0 report-only.
- ``node_health_agent_recovery_actions_total{action,result}``: actions carried out (``ok``, ``failed``;
  a reboot also ``throttled``, ``denied``, ``wrong-state``).
- ``node_health_agent_recovery_would_actions_total{action}``: what report-only would have done.
- ``node_health_agent_recovery_blocked_total{why}``: decisions that could not act now, by why
  (``RecoveryBlocked`` = the cluster budget is spent; ``StartupDelay``; ``WaitingForPersistence``; ...).
- ``node_health_agent_recovery_drains_total{outcome}``: drains by outcome.
- ``node_health_agent_recovery_device_fences_total{outcome}``: device fences by outcome (fenced, vendor,
  no-api, not-dra).
- ``node_health_agent_recovery_errors_total``: steps that failed (API or AWS trouble; retried).
- ``node_health_agent_recovery_incident_open``: 1 while this node has an open incident.
- ``node_health_agent_recovery_budget_holders`` / ``..._budget_limit``: the cluster budget as last read
  (only once it was read: recovery enabled and an incident needed it).
- ``node_health_agent_recovery_detect_to_{cordoned,drained,remedy}_seconds`` (histograms): from the
  problem's own time to the node cordoned, drained, its remedy requested; ``..._incident_open_seconds``:
  from the problem's own time to the incident closed, healed.
- ``node_health_agent_recovery_incidents_total{condition,remedy,outcome}``: incidents by condition type
  (owned types only), remedy (the last disruptive action, or ``none``) and outcome (``remedy-requested``,
  ``healed``): bounded, no message text or device id.
- ``node_health_agent_recovery_time_between_incidents_seconds`` (histogram, no labels): from the previous
  incident opened on this node to the next (the problems' own times, from the history on the Node, so it
  spans agent restarts and reboots), observed when the next one opens.

Every counter series an alert or dashboard reads is there at 0 from the first scrape, for every label
value it can take: each action and result, each ``why``, each drain outcome, and the incidents of each
condition of the loaded policy with each remedy its rules can take. A series that first appears at 1
has no earlier sample, so Prometheus' ``increase()`` would see no increase and the first incident would
raise no alert.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.core.latency import histogram_metric
from agent.recovery.actions import REMEDIES
from agent.recovery.drain import DrainOutcome
from agent.recovery.holds import HoldKind
from agent.recovery.ladder import FAILURE_KINDS, rung_actions
from agent.recovery.model import Action, Blocked, RecoveryPolicy
from agent.recovery.stats import UNTRUSTED, RecoveryStats

FENCE_OUTCOMES = ("fenced", "vendor", "no-api", "not-dra")  # agent.recovery.fence.FenceOutcome values

PREFIX = "node_health_agent_recovery_"
PHASE_KEYS = {
    "detect_to_cordoned": "cordoned",
    "detect_to_drained": "drained",
    "detect_to_remedy": "remedy",
    "incident_open": "closed",
}
PHASE_DOCS = {
    "detect_to_cordoned": "Seconds from a problem's own time to the node cordoned by recovery.",
    "detect_to_drained": "Seconds from a problem's own time to the node drained.",
    "detect_to_remedy": "Seconds from a problem's own time to its remedy requested (instance marked unhealthy).",
    "incident_open": "Seconds from a problem's own time to its incident closed, healed (time to repair).",
}
# The results an action can count: ``ok`` or ``failed``; a reboot's failure by its kind (agent.recovery.ladder).
RESULTS = {action: ("ok", *FAILURE_KINDS) if action is Action.REBOOT else ("ok", "failed") for action in Action}
# Every ``why`` of the blocked counter: the decision's, a hold's, an untrusted source.
WHYS = tuple(
    sorted({*(b.value for b in Blocked if b is not Blocked.NOTHING_LEFT), *(k.value for k in HoldKind), UNTRUSTED})
)
HEALED, REQUESTED = "healed", "remedy-requested"


def incident_labels(policy: RecoveryPolicy) -> frozenset[tuple[str, str, str]]:
    """(condition, remedy, outcome) of every incident the policy's rules can count: a remedy requested
    (reboot, mark-unhealthy) by each rule that can take it; healed after its last disruptive action, or none."""
    labels: set[tuple[str, str, str]] = set()
    for rule in policy.rules:
        actions = {*rule.actions, *(a for remedy in rule.ladder for a in rung_actions(rule, remedy))}
        labels.add((rule.condition, "none", HEALED))
        for action in actions:
            if action.disruptive:
                labels.add((rule.condition, action.value, HEALED))
            if action in REMEDIES:
                labels.add((rule.condition, action.value, REQUESTED))
    return frozenset(labels)


class RecoveryCollector:
    def __init__(self, *, stats: Callable[[], RecoveryStats], policy: RecoveryPolicy) -> None:
        self._stats = stats
        self._incidents = incident_labels(policy)

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield GaugeMetricFamily(
            PREFIX + "enabled", "1 when recovery acts (ENABLE_RECOVERY=true).", value=int(s.enabled)
        )
        actions = CounterMetricFamily(PREFIX + "actions", "Recovery actions carried out.", labels=["action", "result"])
        would = CounterMetricFamily(
            PREFIX + "would_actions", "Actions report-only mode would have taken.", labels=["action"]
        )
        for action in Action:
            for result in sorted({*RESULTS[action], *(r for a, r in s.actions if a == action.value)}):
                actions.add_metric([action.value, result], s.actions.get((action.value, result), 0))
            would.add_metric([action.value], s.would.get(action.value, 0))
        yield actions
        yield would
        blocked = CounterMetricFamily(PREFIX + "blocked", "Decisions that could not act now, by why.", labels=["why"])
        for why in sorted({*WHYS, *s.blocked}):
            blocked.add_metric([why], s.blocked.get(why, 0))
        yield blocked
        drains = CounterMetricFamily(PREFIX + "drains", "Drains by outcome.", labels=["outcome"])
        for outcome in sorted({*(o.value for o in DrainOutcome), *(str(o) for o in s.drains)}):
            drains.add_metric([outcome], s.drains.get(outcome, 0))
        yield drains
        fences = CounterMetricFamily(
            PREFIX + "device_fences", "Device fences by outcome (scope: device rules).", labels=["outcome"]
        )
        for outcome in sorted({*FENCE_OUTCOMES, *(str(o) for o in s.fences)}):
            fences.add_metric([outcome], s.fences.get(outcome, 0))
        yield fences
        yield CounterMetricFamily(PREFIX + "errors", "Recovery steps that failed (retried).", value=s.errors)
        yield GaugeMetricFamily(
            PREFIX + "incident_open", "1 while this node has an open incident.", value=int(s.incident is not None)
        )
        incidents = CounterMetricFamily(
            PREFIX + "incidents",
            "Incidents by condition, remedy and outcome.",
            labels=["condition", "remedy", "outcome"],
        )
        for condition, remedy, outcome in sorted({*self._incidents, *s.incidents}):
            incidents.add_metric([condition, remedy, outcome], s.incidents.get((condition, remedy, outcome), 0))
        yield incidents
        for phase, doc in PHASE_DOCS.items():
            yield histogram_metric(PREFIX + phase + "_seconds", doc, s.phases[PHASE_KEYS[phase]].snapshot())
        yield histogram_metric(
            PREFIX + "time_between_incidents_seconds",
            "Seconds between consecutive incidents opened on this node (their problems' own times), observed "
            "when the later one opens; from the Node's recovery history.",
            s.between.snapshot(),
        )
        if s.budget is not None:
            yield GaugeMetricFamily(
                PREFIX + "budget_holders", "Failure domains holding a budget place.", value=len(s.budget.holders)
            )
            yield GaugeMetricFamily(PREFIX + "budget_limit", "Places the cluster budget allows.", value=s.budget.limit)
