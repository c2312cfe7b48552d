"""The gates between the plan's stages: the holds, then the cluster budget when the plan needs it.

Only a step about to act or to ask the budget reads the pause Lease from etcd; a node the budget refused
asks again only after a jittered backoff (every ask reads the Lease and LISTs every Node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.core.backoff import Backoff
from agent.core.bus import Publication
from agent.recovery import flaps
from agent.recovery.holds import Hold, HoldGate
from agent.recovery.model import BudgetView
from agent.recovery.plan import Planning
from agent.recovery.stats import RecoveryStats

if TYPE_CHECKING:
    from agent.recovery.budget import ClusterBudget

# A node the budget refused asks again only after a jittered backoff growing up to the budget's default
# window: every ask reads the Lease and LISTs every Node, so N blocked nodes asking every step would make
# N/5 LISTs of N Nodes a second (a fleet-wide misfire at 2,000 nodes: 400 a second).
BUDGET_RETRY = 30.0
BUDGET_RETRY_MAX = 600.0
BUDGET_RETRY_JITTER = 0.5


class Gates:
    """The holds and the budget, asked in that order; the budget's backoff is kept here."""

    def __init__(
        self, *, holds: HoldGate, budget: ClusterBudget | None, stats: RecoveryStats, retry: float = BUDGET_RETRY
    ) -> None:
        self._holds = holds
        self._budget = budget
        self._stats = stats
        self._backoff = Backoff(
            initial=retry, maximum=retry * BUDGET_RETRY_MAX / BUDGET_RETRY, jitter=BUDGET_RETRY_JITTER
        )
        self._retry_at = float("-inf")  # clock time before which a refused node does not ask again

    def retry_in(self, now: float) -> float:
        """Seconds until a node the budget refused asks again (0: it is not waiting for the budget)."""
        return max(0.0, self._retry_at - now)

    def check(self, p: Planning, publication: Publication, node: Mapping[str, Any]) -> Hold | BudgetView | None:
        """A hold, or the budget's answer for the plan's stages after the gates (None: not read, or refused)."""
        asks = p.needs_budget and p.now >= self._retry_at
        if p.acts or p.needs_budget:  # about to act: a hold comes first
            # One waiting out the budget's backoff reads the API server's cache (a fleet-wide misfire).
            hold = self._holds.check(publication=publication, node=node, incident=p.pending, fresh=p.acts or asks)
            if hold is not None:
                return hold
        else:
            self._holds.clear()
        if asks:
            return self._ask(p, publication, node)
        if p.needs_budget:
            return self._stats.budget  # backing off: the last refusal still says why
        self._backoff.reset()  # no longer waiting: a later incident asks at once
        self._retry_at = float("-inf")
        return None

    def _ask(self, p: Planning, publication: Publication, node: Mapping[str, Any]) -> Hold | BudgetView | None:
        from agent.adapters.kube import KubeError

        pending = p.pending
        assert pending is not None and self._budget is not None  # enabled: required by the loop
        try:
            if p.on_devices:  # a device step: its own rate, no node place (agent.recovery.devicescope)
                answer = self._budget.acquire_device(incident_id=pending.id, problem=pending.condition)
            else:
                answer = self._budget.acquire(
                    incident_id=pending.id, counts=not flaps.is_flap(p.flaps, pending), problem=pending.condition
                )
        except KubeError as exc:  # every round lost to other askers: back off as refused, not 5 s and again
            if exc.status == 409:
                self._retry_at = p.now + self._backoff.next_delay()
            raise
        self._stats.budget = answer
        if not answer.granted:  # refused (or held for a correlated failure): not asking again on every step
            self._retry_at = p.now + self._backoff.next_delay()
            return answer if answer.correlated or p.on_devices else None  # a device refusal says why
        self._backoff.reset()
        self._retry_at = float("-inf")
        # Asking takes seconds at fleet scale (a LIST, Lease conflicts): a pause written meanwhile holds
        # this step too, and a place this step took is given back (bench/fleetsim.py pause_mid_wave).
        hold = self._holds.check(publication=publication, node=node, incident=pending)
        if hold is not None and not p.on_devices and not (p.stored is not None and p.stored.budget_held):
            self._stats.budget = self._budget.release()
        return hold or answer
