"""What the recovery loop counts and times (exported by agent.recovery.metrics)."""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

from agent.core.latency import RECOVERY_BOUNDS, Histogram
from agent.recovery.model import BudgetView, Incident

UNTRUSTED = "UntrustedSource"  # blocked-counter key: a problem whose owner the rule does not trust

# The phases recovery times, each from the problem's own time (Incident.since): the node cordoned, drained,
# its remedy requested (the instance marked unhealthy or rebooted), and the incident closed (healed).
PHASES = ("cordoned", "drained", "remedy", "closed")
# Seconds between incidents on one node: a flap within minutes up to a month of quiet.
BETWEEN_BOUNDS = (60.0, 300.0, 900.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 86400.0, 3 * 86400.0, 7 * 86400.0, 30 * 86400.0)


@dataclass
class RecoveryStats:
    """What the collector exports (``node_health_agent_recovery_*``)."""

    actions: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (action, result)
    would: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # action
    blocked: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # Blocked value
    drains: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # outcome
    fences: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # a device fence's outcome
    errors: int = 0
    steps: int = 0
    last_error: str | None = None
    incident: Incident | None = None
    budget: BudgetView | None = None
    enabled: bool = False
    # Seconds from the problem's own time (the incident's since) to each phase, and how long incidents stay open.
    phases: dict[str, Histogram] = dataclasses.field(
        default_factory=lambda: {phase: Histogram(bounds=RECOVERY_BOUNDS) for phase in PHASES}
    )
    # (condition, remedy, outcome) -> incidents
    incidents: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # Seconds between consecutive incidents opened on this node (their problems' own times), from its history.
    between: Histogram = dataclasses.field(default_factory=lambda: Histogram(bounds=BETWEEN_BOUNDS))
