"""The cluster-wide safety budget: how many failure domains recovery may disrupt at once, and how
many disruptive steps it may take per window, shared by every agent through one Lease.

Where
    A ``coordination.k8s.io/v1`` Lease in the agent's namespace (``POD_NAMESPACE``, else
    ``DEFAULT_NAMESPACE``) named :func:`budget_lease_name` (``DEFAULT_LEASE``, plus ``-<cluster name>``
    when one is set). It is created by the first agent that needs it. The state is the JSON in the
    annotation ``BUDGET_ANNOTATION``::

        {"version": 1,
         "holders": {"<failure domain>": {"nodes": ["ip-10-0-0-1..."], "incident": "<id>", "since": 1767225600.0}},
         "actions": [1767225600.0, ...],
         "deviceActions": [1767225600.0, ...]}

    ``holders`` are the failure domains disrupted by recovery now; ``actions`` the times of the
    disruptive steps taken within the last ``window`` seconds. ``spec.holderIdentity`` names the last
    writer and ``spec.renewTime`` the time of its write (for people reading the Lease; never read back).
    Keys this version does not know are kept as they are on every write.

Failure domains
    ``domain_of(node)`` (default :func:`ultraserver_domain`): the value of ``ULTRASERVER_LABEL`` when the
    node has it (the 4 nodes of a Trn2 UltraServer share one place: they fail and are serviced
    together), else the node's name. The limit counts failure domains too, so a percentage means the
    same share of the fleet whether or not it is made of UltraServers.

The limit
    ``max_unhealthy`` is a count, or a percentage of the failure domains among the nodes matching
    ``node_selector`` (control-plane nodes excluded), rounded **up** and capped by
    ``max_unhealthy_cap``; at least 1 when there is at least one such node (a 2-node cluster with
    one failing node is repaired), 0 when there is none. :func:`resolve_limit` is the table.
    Separately at most ``max_actions`` disruptive steps per ``window`` (one per :meth:`ClusterBudget.acquire`).
    A device step (fence a device, drain its pods: :mod:`agent.recovery.devicescope`) takes no place:
    at most ``max_device_actions`` of them per ``window`` (``deviceActions``, one per
    :meth:`ClusterBudget.acquire_device`); a corrupt Lease and a correlated failure refuse them too.

Nodes outside ``node_selector``
    The selector says which nodes the limit counts, not which may act: a node it does not list still
    takes a place, and is held to its zone and pool budgets and to the correlated-failure hold like any
    other (its Node is read; the holders' Nodes outside the selector, read anyway to see whether they
    are gone, count in their zones and pools too).

Concurrency
    Every change is read → modify → replace with the resourceVersion read, so two agents never both
    take the last place: on 409 Conflict the Lease is read again, once, and the change redone (at most
    ``attempts`` times); a missing Lease is created (AlreadyExists: read again). Only successful writes
    count, so no update is lost. Before each re-read a loser waits a jittered pause (the injected ``sleep``
    and ``rng``) that doubles with each lost round and scales with how long the lost round took: when a
    rule misfires fleet-wide every write of a place makes all the other askers lose at once, and with a
    fixed 0.1 s pause they read again together and lost again together, round after round (one grant per
    round, a 409 for each of the others). Other ``KubeError``s, and a 409 after the last attempt,
    propagate: the recovery loop asks again after its budget backoff.

Gone nodes
    Each write drops from ``holders`` the nodes that are no longer in the cluster (a replaced instance
    frees its place: its Node object is deleted), and holders left without nodes. :meth:`view`
    already leaves them out. Nodes that recovered give their place back through :meth:`release`.

A corrupt annotation (not JSON, a wrong shape, a newer format version, or any field that breaks the
rules of :mod:`agent.recovery.fields`: a time too large for a float, NaN, before 1970, ...)
    Is **not** treated as empty: an empty budget would grant a place to every asking node while the
    domains it forgot are still cordoned (up to twice the limit disrupted), and the next write would
    erase the evidence. Instead the budget refuses: :meth:`view` and :meth:`acquire` answer a
    ``BudgetView`` whose ``problem`` says what is wrong (``can_start`` False: recovery is blocked
    cluster-wide, RecoveryBlocked), nothing is written, and the error is logged once per Lease
    version. :meth:`release` writes nothing either. Uncordon needs no budget, so recovered nodes still
    come back. An operator fixes the annotation, or deletes the Lease: it is recreated empty — which
    forgets the current holders (nodes still cordoned then no longer count until they act again).
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from agent.adapters.kube import KubeClient, KubeError
from agent.core.leases import write_lease_annotation
from agent.recovery import census as fleet_census
from agent.recovery.census import CENSUS_KEY, CENSUS_MAX_AGE, CLAIM_KEY, Census
from agent.recovery.correlation import correlated_hold, labels_of
from agent.recovery.fields import CorruptRecord, check_version, load
from agent.recovery.model import (
    DEFAULT_LEASE,
    DEFAULT_NAMESPACE,
    DOMAIN,
    ULTRASERVER_LABEL,
    BudgetSettings,
    BudgetView,
    GroupBudget,
)

log = logging.getLogger(__name__)

BUDGET_ANNOTATION = f"{DOMAIN}/budget"
RECORD = "budget"  # the record's name in what a corrupt one says (agent.recovery.fields)
MAX_NAME = 253  # characters of a node name or a failure domain (a Kubernetes object name)
FORMAT_VERSION = 1
ATTEMPTS = 8  # read-modify-write rounds before giving up (a lost round means another agent wrote)
# The pause before round n is rng() * min(BACKOFF_CAP, round trip * 2**n): the round trip is how long the last lost
# round took from its read to its 409 (at least BACKOFF_BASE), so the losers of one round spread their re-reads over
# a few of the server's answer times instead of all reading (and writing) again within 0.1 s.
BACKOFF_BASE = 0.05  # seconds
BACKOFF_CAP = 10.0
CLOCK_SKEW = 300.0  # seconds: a step time later than now + this is counted as now + this (a fast clock, a hand edit)
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_DNS_INVALID = re.compile(r"[^a-z0-9.-]+")


# ---- names and the limit ---------------------------------------------------------------------------


def budget_namespace(environ: Mapping[str, str]) -> str:
    """``POD_NAMESPACE`` (the downward API), else ``DEFAULT_NAMESPACE``."""
    return (environ.get("POD_NAMESPACE") or "").strip() or DEFAULT_NAMESPACE


def budget_lease_name(cluster_name: str = "") -> str:
    """``DEFAULT_LEASE``, or ``DEFAULT_LEASE-<cluster name>`` (lower-cased, made a valid object name)."""
    suffix = _DNS_INVALID.sub("-", cluster_name.strip().lower()).strip(".-")
    name = f"{DEFAULT_LEASE}-{suffix}" if suffix else DEFAULT_LEASE
    return name[:253].rstrip(".-")


def ultraserver_domain(node: Mapping[str, Any]) -> str:
    """The failure domain of a Node object: its UltraServer id when labelled, else its name."""
    metadata = node.get("metadata") or {}
    return labels_of(node).get(ULTRASERVER_LABEL) or metadata.get("name") or ""


def parse_max_unhealthy(value: object) -> int | Fraction:
    """``3`` (a count, at least 1) or ``"10%"`` (a percentage above 0, at most 100, as an exact
    fraction). Raises ValueError with the reason."""
    if isinstance(value, bool):
        raise ValueError(f"must be a count like 3 or a percentage like '10%', got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"must be at least 1, got {value}")
        return value
    if isinstance(value, str):
        m = _PERCENT.match(value)
        if m:
            percent = Fraction(m.group(1))
            if not 0 < percent <= 100:
                raise ValueError(f"a percentage must be above 0% and at most 100%, got {value!r}")
            return percent
    raise ValueError(f"must be a count like 3 or a percentage like '10%', got {value!r}")


def resolve_limit(settings: BudgetSettings | GroupBudget, *, domains: int) -> int:
    """How many failure domains may hold a place, out of ``domains`` counted ones (of the cluster, or
    of a zone or pool)."""
    if domains <= 0:
        return 0
    value = parse_max_unhealthy(settings.max_unhealthy)
    if isinstance(value, int):
        return value
    limit = math.ceil(value * domains / 100)
    if settings.max_unhealthy_cap is not None:
        limit = min(limit, settings.max_unhealthy_cap)
    return max(1, limit)


# ---- the state in the annotation ---------------------------------------------------------------------


class CorruptBudget(CorruptRecord):
    """The annotation cannot be read safely (:mod:`agent.recovery.fields`: names the field)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Holder:
    nodes: tuple[str, ...]
    incident: str
    since: float


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetState:
    holders: Mapping[str, Holder] = field(default_factory=dict)
    actions: tuple[float, ...] = ()
    device_actions: tuple[float, ...] = ()  # device steps in the window (their own rate)
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys of a later version, kept as they are
    clamped: int = 0  # step times that lay too far in the future when read (never written)


def decode_state(text: str | None) -> BudgetState:
    """The state in the annotation (absent or empty = no holders, no actions). Raises CorruptBudget (only)."""
    fields = load(text, RECORD, error=CorruptBudget)
    if fields is None:
        return BudgetState()
    check_version(fields, FORMAT_VERSION)
    holders = {
        domain: Holder(
            nodes=entry.texts("nodes", limit=MAX_NAME, nonempty=True),
            incident=entry.text("incident", default=""),
            since=entry.time("since", default=0.0),
        )
        for domain, entry in fields.entries("holders", default={}, limit=MAX_NAME)
    }
    actions = fields.times("actions", default=[])
    device_actions = fields.times("deviceActions", default=[])
    extra = {k: v for k, v in fields.data.items() if k not in ("version", "holders", "actions", "deviceActions")}
    return BudgetState(holders=holders, actions=actions, device_actions=device_actions, extra=extra)


def encode_state(state: BudgetState) -> str:
    data: dict[str, Any] = dict(state.extra)
    data["version"] = FORMAT_VERSION
    data["holders"] = {
        domain: {"nodes": list(h.nodes), "incident": h.incident, "since": h.since}
        for domain, h in sorted(state.holders.items())
    }
    data["actions"] = list(state.actions)
    if state.device_actions:
        data["deviceActions"] = list(state.device_actions)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _micro_time(seconds: float) -> str:
    """A MicroTime (RFC 3339, exactly 6 fractional digits). Never a whole second: the pydantic-based
    kubernetes client (37.x) turns the string into a datetime and prints it with ``isoformat()``, which
    drops a zero fraction, and the API server refuses a MicroTime without one."""
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    if moment.microsecond == 0:
        moment = moment.replace(microsecond=1)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---- the budget --------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class _Cluster:
    """What one call knows of the cluster: this Node, the holders' Nodes it looked up, and the census."""

    own: Mapping[str, Any] | None = None  # this Node (None: gone)
    holders: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # holders' Nodes read (their labels)
    census: Census | None = None  # the fleet's counts (None: none yet)
    counting: str = ""  # without a census: the node counting the fleet now

    @property
    def domains(self) -> int:
        return self.census.domains if self.census is not None else 0


class ClusterBudget:
    """This node's view of, and changes to, the cluster budget Lease (see the module docstring).

    ``clock`` gives wall-clock seconds (the times in the Lease are compared across nodes);
    ``sleep`` and ``rng`` pace the retries after a conflict.
    """

    def __init__(
        self,
        *,
        client: KubeClient,
        namespace: str,
        lease_name: str,
        node_name: str,
        settings: BudgetSettings,
        clock: Callable[[], float],
        domain_of: Callable[[Mapping[str, Any]], str] = ultraserver_domain,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        problem_types: Collection[str] = (),
        attempts: int = ATTEMPTS,
        census_max_age: float = CENSUS_MAX_AGE,
    ) -> None:
        parse_max_unhealthy(settings.max_unhealthy)  # a bad value fails here, not at the first incident
        self._client = client
        self._namespace = namespace
        self._lease_name = lease_name
        self._node = node_name
        self._settings = settings
        self._clock = clock
        self._domain_of = domain_of
        self._sleep = sleep
        self._rng = rng
        self._attempts = max(1, attempts)
        self._reported_corrupt: str | None = None  # resourceVersion whose corruption was logged
        self._problem_types = frozenset(problem_types)  # condition types whose True is a problem (correlation)
        self._reported_future: str | None = None  # resourceVersion whose future step times were logged
        self._last_version = ""  # resourceVersion of the Lease last read
        self._census_max_age = census_max_age
        self._census_key = fleet_census.census_key(
            selector=settings.node_selector,
            labels=self._census_labels(),
            types=self._problem_types,
            new_node_window=settings.correlation.new_node_window if settings.correlation else 0.0,
        )
        self._local: Census | None = None  # the census this agent counted last (kept in memory)
        # Holders' Nodes read lately (when, the Node): a holder seen within the census's age is not read again
        # on every ask; a replaced one frees its place that much later at most (never sooner: never a guess).
        self._holder_nodes: dict[str, tuple[float, Mapping[str, Any]]] = {}

    @property
    def where(self) -> str:
        return f"{self._namespace}/{self._lease_name}"

    # ---- public -----------------------------------------------------------------------------------

    def view(self, *, node_labels: Mapping[str, str] | None = None) -> BudgetView:
        """The budget now, as this node sees it (nothing written). ``node_labels`` (the Node's labels)
        name this node's failure domain; without them the Node is looked up."""
        cluster = self._cluster(own_labels=node_labels)
        own = self._own_domain(cluster)
        lease = self._get()
        try:
            state = decode_state(self._annotation(lease))
        except CorruptBudget as exc:
            return self._refuse(lease, exc, cluster, own)
        now = self._clock()
        cluster.census = self._usable(state, now) or self._count(now, state)  # a view counts for itself: no write
        return self._view(self._effective(state, cluster, now=now), cluster, own)

    def acquire(self, *, incident_id: str, counts: bool = True, problem: str = "") -> BudgetView:
        """Take (or keep) this node's place and count one disruptive step. Returns the view after, with
        ``granted`` True; when the view before says ``can_start`` False, nothing is written and that view
        is returned (``granted`` False: the step is refused, even for a node that holds its place).

        ``counts`` False (a flap of a node already counted, :mod:`agent.recovery.flaps`): a place is still
        needed, but the step is not counted in the window, and a spent window does not refuse it.
        ``problem``: the condition type the step is for (a zone or pool failing with it holds)."""
        cluster = self._cluster()
        own = self._own_domain(cluster)

        def take(state: BudgetState, now: float) -> BudgetState | None:
            view = self._view(state, cluster, own, problem)
            room = not (view.problem or view.correlated) and (
                view.this_node_holds or (len(view.holders) < view.limit and not view.group_full)
            )
            if not (view.can_start if counts else room):
                return None
            holder = state.holders.get(own)
            nodes = tuple(sorted({*(holder.nodes if holder else ()), self._node}))
            since = holder.since if holder else now
            holders = {**state.holders, own: Holder(nodes=nodes, incident=incident_id, since=since)}
            return replace(state, holders=holders, actions=(*state.actions, now) if counts else state.actions)

        view, wrote = self._transact(take, cluster, own, problem=problem)
        return replace(view, granted=True) if wrote else view

    def acquire_device(self, *, incident_id: str, problem: str = "") -> BudgetView:
        """Count one device step (no place taken) when the device rate allows it; ``granted`` as :meth:`acquire`."""
        cluster = self._cluster()
        own = self._own_domain(cluster)

        def take(state: BudgetState, now: float) -> BudgetState | None:
            view = self._view(state, cluster, own, problem)
            if view.problem or view.correlated or view.device_actions_in_window >= view.max_device_actions:
                return None
            return replace(state, device_actions=(*state.device_actions, now))

        view, wrote = self._transact(take, cluster, own, problem=problem)
        return replace(view, granted=True) if wrote else view

    def release(self) -> BudgetView:
        """Give this node's place back (its domain's place once none of its nodes holds it). Always
        allowed; nothing is written when the node holds no place (or the Lease is corrupt)."""
        cluster = self._cluster()
        own = self._own_domain(cluster)

        def give_back(state: BudgetState, now: float) -> BudgetState | None:
            holders: dict[str, Holder] = {}
            for domain, holder in state.holders.items():
                nodes = tuple(n for n in holder.nodes if n != self._node)
                if nodes:
                    holders[domain] = replace(holder, nodes=nodes)
            return None if holders == dict(state.holders) else replace(state, holders=holders)

        return self._transact(give_back, cluster, own, count=False)[0]

    # ---- the read-modify-write round ------------------------------------------------------------------

    def _transact(
        self,
        change: Callable[[BudgetState, float], BudgetState | None],
        cluster: _Cluster,
        own: str,
        *,
        problem: str = "",
        count: bool = True,
    ) -> tuple[BudgetView, bool]:
        """The view after ``change`` (None = nothing to change) and whether the Lease was written. ``count``:
        the change needs the census (a stale one is counted again, by one agent: agent.recovery.census)."""
        round_trip = BACKOFF_BASE
        for attempt in range(self._attempts):
            if attempt:
                self._sleep(self._rng() * min(BACKOFF_CAP, round_trip * 2**attempt))
            began = self._clock()
            lease = self._get()
            try:
                state = decode_state(self._annotation(lease))
            except CorruptBudget as exc:
                return self._refuse(lease, exc, cluster, own), False
            now = self._clock()
            try:
                lease, publish = self._census_round(lease, state, cluster, now, count=count)
            except KubeError as exc:
                if exc.status in (404, 409):  # another agent claimed the count, or wrote: redo
                    round_trip = max(BACKOFF_BASE, min(BACKOFF_CAP, self._clock() - began))
                    continue
                raise
            current = self._effective(state, cluster, now=now)
            changed = change(current, now)
            # Times clamped from the future are written back clamped even when nothing else changes (a
            # refusal): else each read would clamp them anew to its own now, and they would never age.
            target = changed if changed is not None else current if current.clamped or publish else None
            if target is not None and publish and cluster.census is not None:
                extra = {k: v for k, v in target.extra.items() if k != CLAIM_KEY}
                target = replace(target, extra={**extra, CENSUS_KEY: fleet_census.encode(cluster.census)})
            if target is None:
                return self._view(current, cluster, own, problem), False
            try:
                self._write(lease, target, now=now)
            except KubeError as exc:
                if exc.status in (404, 409):  # another agent wrote (or created, or deleted) it: redo
                    log.debug("budget Lease %s: %s; reading it again", self.where, exc)
                    round_trip = max(BACKOFF_BASE, min(BACKOFF_CAP, self._clock() - began))
                    continue
                if not self._applied(exc, target):
                    raise
            return self._view(target, cluster, own, problem), changed is not None
        raise KubeError(
            f"budget Lease {self.where}: still conflicting after {self._attempts} attempts",
            status=409,
            reason="Conflict",
        )

    def _applied(self, exc: KubeError, state: BudgetState) -> bool:
        """After a write answered with no answer, a timeout or a 5xx: whether the Lease holds ``state`` (the
        write was applied all the same). A step whose write was applied counts once, not again on retry."""
        return self._applied_lease(exc, state) is not None

    def _applied_lease(self, exc: KubeError, state: BudgetState) -> dict[str, Any] | None:
        """:meth:`_applied`, with the Lease read back (None: not applied, or not known to be)."""
        if exc.status is not None and exc.status < 500:
            return None
        try:
            lease = self._get()
        except KubeError:
            return None
        if lease is None or self._annotation(lease) != encode_state(state):
            return None
        log.info("budget Lease %s: the write answered %s, but it was applied (read back)", self.where, exc)
        return lease

    # ---- the census ------------------------------------------------------------------------------------

    def _census_labels(self) -> tuple[str, ...]:
        correlation = self._settings.correlation.labels if self._settings.correlation else ()
        return tuple(dict.fromkeys([*(g.label for g in self._settings.groups), *correlation]))

    def _usable(self, state: BudgetState, now: float) -> Census | None:
        """A fresh census of this agent's settings: the Lease's, else the one this agent counted."""
        stored = fleet_census.decode(state.extra.get(CENSUS_KEY))
        for census in (stored, self._local):
            if census is not None and census.fresh(now, self._census_key, self._census_max_age):
                return census
        return None

    def _count(self, now: float, state: BudgetState | None = None) -> Census:
        """Count the fleet: one LIST of the Nodes the selector lists, from the watch cache (and the holders of
        ``state`` found in it)."""
        nodes = self._client.list_nodes(label_selector=self._settings.node_selector, cached=True)
        holders = {n for holder in state.holders.values() for n in holder.nodes} if state is not None else set()
        self._local = fleet_census.take(
            nodes,
            now=now,
            by=self._node,
            key=self._census_key,
            labels=self._census_labels(),
            types=self._problem_types,
            new_node_window=self._settings.correlation.new_node_window if self._settings.correlation else 0.0,
            domain_of=self._domain_of,
            holders=holders,
        )
        return self._local

    def _census_round(
        self, lease: dict[str, Any] | None, state: BudgetState, cluster: _Cluster, now: float, *, count: bool
    ) -> tuple[dict[str, Any] | None, bool]:
        """Put the census into ``cluster``: the Lease's when fresh; else, when ``count``, one agent claims the
        count (a conditional write: 409 to the others, raised) and counts, and the others go on with the stale
        one. Returns the Lease as now written and whether the census is to be written with the next write."""
        stored = fleet_census.decode(state.extra.get(CENSUS_KEY))
        fresh = self._usable(state, now)
        others = (
            stored is not None
            and stored.key != self._census_key
            and stored.fresh(now, stored.key, self._census_max_age)
        )
        if fresh is not None:
            cluster.census = fresh
            stored_fresh = stored is not None and stored.fresh(now, self._census_key, self._census_max_age)
            return lease, not (stored_fresh or others)  # counted here, not yet in the Lease: write it
        stale = stored if stored is not None and stored.key == self._census_key else self._local
        if not count:
            cluster.census = stale
            return lease, False
        if others:  # a fresh census of other settings (a mixed fleet): count for this agent only
            cluster.census = self._count(now, state)
            return lease, False
        claimer = fleet_census.claim_holder(state.extra.get(CLAIM_KEY), now)
        if claimer and claimer != self._node:  # another agent counts now: go on with what there is
            cluster.census = stale
            cluster.counting = claimer if stale is None else ""
            return lease, False
        if not claimer:
            claim = {**state.extra, CLAIM_KEY: {"by": self._node, "at": now}}
            try:
                lease = self._write(lease, replace(state, extra=claim), now=now)
            except KubeError as exc:
                lease = None if exc.status in (404, 409) else self._applied_lease(exc, replace(state, extra=claim))
                if lease is None:
                    raise
        cluster.census = self._count(now, state)
        return lease, True

    def _get(self) -> dict[str, Any] | None:
        try:
            lease = self._client.get_lease(self._namespace, self._lease_name)
        except KubeError as exc:
            if exc.status == 404:
                self._last_version = ""
                return None
            raise
        self._last_version = str((lease.get("metadata") or {}).get("resourceVersion", ""))
        return lease

    @staticmethod
    def _annotation(lease: Mapping[str, Any] | None) -> str | None:
        if lease is None:
            return None
        return ((lease.get("metadata") or {}).get("annotations") or {}).get(BUDGET_ANNOTATION)

    def _write(self, lease: dict[str, Any] | None, state: BudgetState, *, now: float) -> dict[str, Any] | None:
        """Write ``state``; the Lease as written."""
        written = write_lease_annotation(
            self._client,
            lease,
            namespace=self._namespace,
            name=self._lease_name,
            annotation=BUDGET_ANNOTATION,
            value=encode_state(state),
            spec={"holderIdentity": self._node, "renewTime": _micro_time(now)},
        )
        return written if isinstance(written, dict) else None

    # ---- reading the cluster -------------------------------------------------------------------------

    def _cluster(self, *, own_labels: Mapping[str, str] | None = None) -> _Cluster:
        """This Node (from the watch cache, or made of ``own_labels``); the census comes with the Lease."""
        if own_labels is not None:
            return _Cluster(own={"metadata": {"name": self._node, "labels": dict(own_labels)}})
        try:
            return _Cluster(own=self._client.get_node(self._node, cached=True))
        except KubeError as exc:
            if exc.status != 404:
                raise
        return _Cluster(own=None)

    def _own_domain(self, cluster: _Cluster) -> str:
        node = cluster.own
        return (self._domain_of(node) or self._node) if node is not None else self._node

    def _present(self, name: str, cluster: _Cluster, seen: dict[str, bool]) -> bool:
        """Whether node ``name`` still exists: read from the watch cache, and a 404 there read again from etcd
        (a cache a moment behind never drops a place), at most once per census age per holder; when a read
        fails for another reason than 404 it counts as present: never drop a place on a guess."""
        if name == self._node and cluster.own is not None:
            return True
        if name not in seen and cluster.census is not None and name in cluster.census.holders:
            # found by the census's count: there then, in these groups (gone since: freed at the next count)
            cluster.holders[name] = {"metadata": {"name": name, "labels": dict(cluster.census.holders[name])}}
            seen[name] = True
        if name not in seen:
            now = self._clock()
            cached = self._holder_nodes.get(name)
            if cached is not None and 0 <= now - cached[0] < self._census_max_age:  # seen lately: still there
                cluster.holders[name] = cached[1]
                seen[name] = True
                return True
            try:
                cluster.holders[name] = self._read_node(name)  # its labels count in its zone and pool
                self._holder_nodes[name] = (now, cluster.holders[name])
                seen[name] = True
            except KubeError as exc:
                self._holder_nodes.pop(name, None)
                seen[name] = exc.status != 404
        return seen[name]

    def _read_node(self, name: str) -> Mapping[str, Any]:
        try:
            return self._client.get_node(name, cached=True)
        except KubeError as exc:
            if exc.status != 404:
                raise
        return self._client.get_node(name)

    def _effective(self, state: BudgetState, cluster: _Cluster, *, now: float | None = None) -> BudgetState:
        """``state`` without actions older than the window and without nodes gone from the cluster."""
        now = self._clock() if now is None else now
        horizon = now - self._settings.window
        seen: dict[str, bool] = {}
        holders: dict[str, Holder] = {}
        for domain, holder in state.holders.items():
            nodes = tuple(n for n in holder.nodes if self._present(n, cluster, seen))
            if nodes:
                holders[domain] = replace(holder, nodes=nodes)
        # A time in the future would never leave the window (a holder with a fast clock, or a hand edit):
        # it counts as made at most CLOCK_SKEW from now, and is written back so.
        ceiling = now + CLOCK_SKEW
        actions = tuple(min(t, ceiling) for t in state.actions if t > horizon)
        device_actions = tuple(min(t, ceiling) for t in state.device_actions if t > horizon)
        clamped = sum(1 for t in state.actions if t > ceiling)
        if clamped and not state.clamped:
            self._report_future(clamped)
        return replace(
            state, holders=holders, actions=actions, device_actions=device_actions, clamped=state.clamped or clamped
        )

    def _report_future(self, count: int) -> None:
        """Log once per Lease version that step times lay in the future."""
        version = self._last_version
        if self._reported_future == version:
            return
        self._reported_future = version
        log.warning(
            "budget Lease %s: %d step times in %s (field actions) lie more than %gs in the future (a node with a "
            "fast clock, or a hand edit): each counts as made %gs from now, and leaves the window after that",
            self.where,
            count,
            BUDGET_ANNOTATION,
            CLOCK_SKEW,
            CLOCK_SKEW,
        )

    def _view(self, state: BudgetState, cluster: _Cluster, own: str, problem: str = "") -> BudgetView:
        own_node = cluster.own
        window = self._settings.window
        return BudgetView(
            holders=tuple(sorted(state.holders)),
            limit=resolve_limit(self._settings, domains=cluster.domains),
            counting=cluster.counting,
            actions_in_window=len(state.actions),
            device_actions_in_window=len(state.device_actions),
            max_device_actions=self._settings.max_device_actions,
            max_actions=self._settings.max_actions,
            this_node_holds=own in state.holders,
            window=window,
            frees_at=min(state.actions) + window if state.actions else None,
            future_actions=state.clamped,
            skew=CLOCK_SKEW,
            group_full=self._group_refusal(state, cluster, own, own_node),
            correlated=correlated_hold(
                self._settings.correlation,
                own_node=own_node,
                census=cluster.census,
                types=self._problem_types,
                now=self._clock(),
                problem=problem,
            ),
        )

    def _group_refusal(
        self, state: BudgetState, cluster: _Cluster, own: str, own_node: Mapping[str, Any] | None
    ) -> str:
        """Why a zone or pool budget refuses this node a new place ("" = none does)."""
        if own_node is None or own in state.holders:
            return ""
        nodes = {**cluster.holders, self._node: own_node}  # the holders' Nodes were read to see they are there
        for group in self._settings.groups:
            value = labels_of(own_node).get(group.label)
            if value is None:
                continue
            domains = cluster.census.group(group.label, value).domains if cluster.census is not None else 0
            held = sorted(
                d
                for d, holder in state.holders.items()
                if any(n in nodes and labels_of(nodes[n]).get(group.label) == value for n in holder.nodes)
            )
            limit = resolve_limit(group, domains=max(domains, 1))  # this node is one, counted or not yet
            if len(held) >= limit:
                return (
                    f"{group.label}={value}: {len(held)} of {limit} places held ({', '.join(held)}), its budget "
                    f"{group.max_unhealthy} of {domains} failure domains"
                )
        return ""

    def _refuse(self, lease: Mapping[str, Any] | None, exc: CorruptBudget, cluster: _Cluster, own: str) -> BudgetView:
        version = str(((lease or {}).get("metadata") or {}).get("resourceVersion", ""))
        problem = (
            f"the budget Lease {self.where} has an unreadable {BUDGET_ANNOTATION} annotation ({exc}): no new "
            "disruptive action anywhere until an operator fixes the annotation or deletes the Lease"
        )
        if self._reported_corrupt != version:
            self._reported_corrupt = version
            log.error("%s", problem)
        return BudgetView(
            holders=(),
            limit=resolve_limit(self._settings, domains=cluster.domains),
            actions_in_window=0,
            max_actions=self._settings.max_actions,
            this_node_holds=False,
            problem=problem,
        )
