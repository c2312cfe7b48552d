"""Holds: what stops recovery from acting, whatever the policy decides.

Three kinds, checked in this order before every step that would act (and again while a drain runs):

Agent health (``unhealthy``)
    Recovery acts only on what a healthy agent saw: while any component in the latest publication
    is unhealthy (:attr:`agent.core.bus.Publication.agent_healthy`: the kmsg reader, the check
    scheduler, the main loop, ...), or is unhealthy now (``health``: the supervisor's view; a reader
    that stopped publishes nothing, so its last publication still says healthy), nothing is done:
    "still True" may be stale. The same while the check that raises the condition acted on has not
    completed a run lately (``stale``: three intervals plus its timeout, from assembly).

Vetoes (``vetoed``)
    Per node, set by an operator with kubectl: the annotation ``VETO_ANNOTATION`` (any non-empty
    value, its text is the why: ``kubectl annotate node N node-health-agent.io/veto="disk swap,
    alice"``) or the older opt-out label ``OPT_OUT_LABEL=disabled``. Read from the Node the step
    reads anyway.

Pauses (``paused``)
    Set and lifted by ``node-health-agent pause`` / ``resume``; kept in a Lease in the agent's
    namespace, as the JSON in the annotation ``PAUSE_ANNOTATION``. Every agent reads the namespace's
    Lease ``DEFAULT_PAUSE_LEASE`` (what ``pause`` writes without ``--cluster-name``: it reaches every
    agent there, whatever cluster name they run with) and, when it has a cluster name, also
    ``DEFAULT_PAUSE_LEASE-<cluster name>`` (``pause --cluster-name NAME``: only the agents of that
    name), :func:`pause_lease_names`; a pause in either holds (:class:`PauseLeases`)::

        {"version": 1, "pauses": [{"scope": "cluster", "value": "", "by": "alice", "why": "bad rule",
                                   "since": 1767225600.0}, ...]}

    A pause covers the whole cluster, one pool (``--pool VALUE``: a node whose pool label has that
    value; the pool labels are those of the policy's ``budget.groups`` other than the zone label,
    :func:`pool_labels`, or ``POOL_LABELS`` when the groups name none: the pause records the value,
    each agent judges its own node with its own configured labels), one node (``--node NAME``) or
    the problems whose reason matches a shell glob (``--condition-reason GLOB``; a glob with ``/``
    matches ``<condition>/<reason>``). Agents only read it (RBAC ``leases get``, which recovery
    already has; the admission policy lets them write only the budget Lease): an agent can never
    lift a pause.

    **Fleet cost.** An agent with an open incident reads the Lease every ``poll`` seconds (5 s,
    jittered ±20 %, backing off up to a minute while the read fails: :meth:`HoldGate.poll`); an idle
    agent every ``idle_poll`` (5 min: it has nothing a pause could stop, and every 5 s on every node
    would be 400 GETs a second for 2,000 nodes; a failed read is retried at that interval too, never
    sooner), which keeps ``node_health_agent_recovery_paused``
    current for dashboards and alerts. Every agent reads it again, fresh, when it is about to act (a
    step whose decision has actions, before it asks the budget; that read counts as the interval's)
    and every ``recheck`` seconds while a drain runs: a pause holds the next action on every agent
    at once and stops a drain before its next pod. Polls ask with ``resourceVersion=0``: served from
    the API server's watch cache, never a read of etcd; the read before acting is a quorum read. A step
    that only waits (blocked by the budget, its next ask not due yet: every refused agent of a fleet-wide
    misfire, every 5 s) reads the cache too. No rollout: the Lease is read, not mounted.

    **Fail safe.** An annotation that cannot be read (not JSON, a wrong shape, a newer version, a field
    that breaks the rules of :mod:`agent.recovery.fields`)
    counts as a cluster-wide pause, named as such in the Event and ``status``, until an operator fixes
    or removes it (``resume`` refuses to write over it and says how).

Nothing here writes the Node; :class:`HoldGate` is what the recovery loop asks.
"""

from __future__ import annotations

import enum
import fnmatch
import json
import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from agent.adapters.kube import KubeError
from agent.core.backoff import Backoff
from agent.core.bus import Publication
from agent.core.leases import write_lease_annotation
from agent.core.timefmt import iso
from agent.recovery.fields import CorruptRecord, check_version, load
from agent.recovery.model import DOMAIN, OPT_OUT_LABEL, ZONE_LABEL, BudgetSettings, Incident

log = logging.getLogger(__name__)

PAUSE_ANNOTATION = f"{DOMAIN}/pauses"
VETO_ANNOTATION = f"{DOMAIN}/veto"  # on a Node: any non-empty value = never act on it (the value says why)
DEFAULT_PAUSE_LEASE = "node-health-agent-recovery-pause"  # + "-<cluster name>" when a cluster name is set
FORMAT_VERSION = 1
RECORD = "pauses"  # the record's name in what a corrupt one says (agent.recovery.fields)
POOL_LABELS = (
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "alpha.eksctl.io/nodegroup-name",
    "node.kubernetes.io/pool",
)
RECHECK = 2.0  # seconds between fresh reads of the pause Lease and the Node while a drain runs
POLL = 5.0  # seconds between reads of the pause Lease on an agent with an open incident
# ... and on an idle one (nothing to act on: it reads the Lease fresh before any action anyway, so a pause
# still takes effect at once; this keeps its paused gauge current). Every 5 s on every node would be 400
# GETs a second against the API server of a 2,000-node fleet.
IDLE_POLL = 300.0
POLL_JITTER = 0.2  # ± this fraction of POLL, so a fleet's reads spread out
POLL_MAX = 60.0  # a failing read is retried after POLL x 2, x 4, ... up to this
ATTEMPTS = 5  # read-modify-write rounds of pause/resume before a conflict is given up
MAX_WHY = 1024  # bytes of an operator's text kept
_DNS_INVALID = re.compile(r"[^a-z0-9.-]+")


class Scope(enum.StrEnum):
    CLUSTER = "cluster"
    POOL = "pool"
    NODE = "node"
    REASON = "condition-reason"


@dataclass(frozen=True, kw_only=True, slots=True)
class Pause:
    """One pause: what it covers, who set it, why and when (wall-clock seconds)."""

    scope: Scope
    value: str = ""  # "" for the cluster; the pool value, the node name or the glob
    by: str = ""
    why: str = ""
    since: float = 0.0

    @property
    def key(self) -> str:
        return self.scope.value if self.scope is Scope.CLUSTER else f"{self.scope.value}={self.value}"

    def covers(
        self,
        *,
        node: str,
        labels: Mapping[str, str],
        condition: str,
        reason: str,
        pools: Collection[str] = POOL_LABELS,
    ) -> bool:
        """Whether this pause holds recovery of ``condition=reason`` on ``node`` (with ``labels``);
        ``pools``: the labels whose value names a node's pool (:func:`pool_labels`)."""
        if self.scope is Scope.CLUSTER:
            return True
        if self.scope is Scope.NODE:
            return self.value == node
        if self.scope is Scope.POOL:
            return any(labels.get(label) == self.value for label in pools)
        subject = f"{condition}/{reason}" if "/" in self.value else reason
        return bool(reason) and fnmatch.fnmatchcase(subject, self.value)

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope.value, "value": self.value, "by": self.by, "why": self.why, "since": self.since}


@dataclass(frozen=True, kw_only=True, slots=True)
class Pauses:
    """The pauses in force; ``problem`` (non-empty) = the annotation is unreadable: paused everywhere."""

    pauses: tuple[Pause, ...] = ()
    problem: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys of a later version, kept on write


def pool_labels(budget: BudgetSettings) -> tuple[str, ...]:
    """The labels ``pause --pool VALUE`` matches: those of the budget's groups (``budget.groups``) other
    than the zone label, in their order; ``POOL_LABELS`` when the groups name none."""
    configured = tuple(dict.fromkeys(g.label for g in budget.groups if g.label != ZONE_LABEL))
    return configured or POOL_LABELS


class CorruptPauses(CorruptRecord):
    """The pause annotation cannot be read safely (:mod:`agent.recovery.fields`: names the field)."""


def pause_lease_name(cluster_name: str = "") -> str:
    """``DEFAULT_PAUSE_LEASE``, or ``DEFAULT_PAUSE_LEASE-<cluster name>`` (a valid object name)."""
    suffix = _DNS_INVALID.sub("-", cluster_name.strip().lower()).strip(".-")
    name = f"{DEFAULT_PAUSE_LEASE}-{suffix}" if suffix else DEFAULT_PAUSE_LEASE
    return name[:253].rstrip(".-")


def pause_lease_names(cluster_name: str = "") -> tuple[str, ...]:
    """The pause Leases an agent with ``cluster_name`` reads: the namespace's (every agent), then its
    cluster's own when it has a name."""
    own = pause_lease_name(cluster_name)
    return (DEFAULT_PAUSE_LEASE,) if own == DEFAULT_PAUSE_LEASE else (DEFAULT_PAUSE_LEASE, own)


def decode_pauses(text: str | None) -> Pauses:
    """The pauses in the annotation (absent or empty = none). Raises CorruptPauses (only)."""
    fields = load(text, RECORD, error=CorruptPauses)
    if fields is None:
        return Pauses()
    check_version(fields, FORMAT_VERSION)
    pauses: list[Pause] = []
    for entry in fields.objects("pauses", default=[]):
        scope = Scope(entry.choice("scope", [s.value for s in Scope]))
        pause = Pause(
            scope=scope,
            value=entry.text("value", default=""),
            by=entry.text("by", default=""),
            why=entry.text("why", default=""),
            since=entry.time("since", default=0.0),
        )
        if (scope is Scope.CLUSTER) != (pause.value == ""):
            entry.fail("value", f"a {scope.value} pause needs {'no' if scope is Scope.CLUSTER else 'a'} value")
        pauses.append(pause)
    extra = {k: v for k, v in fields.data.items() if k not in ("version", "pauses")}
    return Pauses(pauses=tuple(pauses), extra=extra)


def encode_pauses(pauses: Pauses) -> str:
    data: dict[str, Any] = dict(pauses.extra)
    data["version"] = FORMAT_VERSION
    data["pauses"] = [p.to_json() for p in sorted(pauses.pauses, key=lambda p: (p.since, p.key))]
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _annotation(lease: Mapping[str, Any] | None) -> str | None:
    if lease is None:
        return None
    return ((lease.get("metadata") or {}).get("annotations") or {}).get(PAUSE_ANNOTATION)


class LeaseClient(Protocol):
    """The part of :class:`agent.adapters.kube.KubeClient` the pause store uses."""

    def get_lease(self, namespace: str, name: str, *, cached: bool = False) -> dict[str, Any]: ...

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


class PauseStore:
    """The pause Lease: read (agents, ``status``) and changed (``pause``/``resume``, operators only)."""

    def __init__(self, *, client: LeaseClient, namespace: str, lease_name: str) -> None:
        self._client = client
        self._namespace = namespace
        self._lease_name = lease_name

    @property
    def where(self) -> str:
        return f"{self._namespace}/{self._lease_name}"

    @property
    def lease_name(self) -> str:
        return self._lease_name

    def read(self, *, cached: bool = False) -> Pauses:
        """The pauses now; an unreadable annotation gives ``problem`` (never raises for it). ``cached``: from
        the API server's watch cache (a poll), not a quorum read (before acting)."""
        lease = self._get(cached=cached)
        try:
            return _decode(lease)
        except CorruptPauses as exc:
            return Pauses(problem=corrupt_message(self.where, str(exc)))

    def change(self, edit: Callable[[Pauses], Pauses]) -> tuple[Pauses, Pauses]:
        """Read → ``edit`` → conditional write (409: read again and redo). (before, after).
        Raises CorruptPauses when the annotation is unreadable: nothing is written over it."""
        for _ in range(ATTEMPTS):
            lease = self._get()
            before = _decode(lease)
            after = edit(before)
            if after == before:
                return before, after
            try:
                self._write(lease, after)
            except KubeError as exc:
                if exc.status == 409:
                    continue
                raise
            return before, after
        raise KubeError(f"pause Lease {self.where}: still conflicting after {ATTEMPTS} attempts", status=409)

    def reset(self) -> str:
        """Replace an unreadable annotation with no pause (``resume --all``: the operator lifts every pause,
        whatever the record held). The problem replaced; "" when the record was readable (nothing written)."""
        for _ in range(ATTEMPTS):
            lease = self._get()
            try:
                _decode(lease)
                return ""
            except CorruptPauses as exc:
                problem = str(exc)
            try:
                self._write(lease, Pauses())
            except KubeError as exc:
                if exc.status == 409:
                    continue
                raise
            return problem
        raise KubeError(f"pause Lease {self.where}: still conflicting after {ATTEMPTS} attempts", status=409)

    def _get(self, *, cached: bool = False) -> dict[str, Any] | None:
        try:
            if cached:
                return self._client.get_lease(self._namespace, self._lease_name, cached=True)
            return self._client.get_lease(self._namespace, self._lease_name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def _write(self, lease: dict[str, Any] | None, pauses: Pauses) -> None:
        write_lease_annotation(
            self._client,
            lease,
            namespace=self._namespace,
            name=self._lease_name,
            annotation=PAUSE_ANNOTATION,
            value=encode_pauses(pauses),
        )


class PauseLeases:
    """What an agent reads: every pause Lease of :func:`pause_lease_names`, one read each, as one set of
    pauses (an unreadable one: ``problem``, a pause of everything). Read only."""

    def __init__(self, *, client: LeaseClient, namespace: str, cluster_name: str = "") -> None:
        self.stores = tuple(
            PauseStore(client=client, namespace=namespace, lease_name=name) for name in pause_lease_names(cluster_name)
        )

    @property
    def where(self) -> str:
        return " and ".join(store.where for store in self.stores)

    def read(self, *, cached: bool = False) -> Pauses:
        found = [store.read(cached=cached) for store in self.stores]
        problem = "; ".join(p.problem for p in found if p.problem)
        return Pauses(pauses=tuple(p for pauses in found for p in pauses.pauses), problem=problem)


def _decode(lease: Mapping[str, Any] | None) -> Pauses:
    """The pauses of a Lease read from the cluster: anything its content makes the decoder raise (a number
    too large for a float, nesting too deep) is CorruptPauses, never an exception out of the CLI or a poll."""
    try:
        return decode_pauses(_annotation(lease))
    except CorruptPauses:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError, AttributeError) as exc:
        raise CorruptPauses(RECORD, "", f"{type(exc).__name__}: {exc}"[:200]) from None


def corrupt_message(where: str, problem: str) -> str:
    return (
        f"the pause Lease {where} has an unreadable {PAUSE_ANNOTATION} annotation ({problem}): treated as a "
        f"cluster-wide pause until an operator fixes it or removes it "
        f"(kubectl annotate lease -n {where.replace('/', ' ', 1)} {PAUSE_ANNOTATION}-)"
    )


def with_pause(pauses: Pauses, pause: Pause) -> Pauses:
    """``pauses`` with ``pause`` added (replacing one of the same scope and value)."""
    kept = tuple(p for p in pauses.pauses if p.key != pause.key)
    return replace(pauses, pauses=(*kept, pause))


def without_pause(pauses: Pauses, key: str) -> Pauses:
    return replace(pauses, pauses=tuple(p for p in pauses.pauses if p.key != key))


# ---- holds -----------------------------------------------------------------------------------------


class HoldKind(enum.StrEnum):
    UNHEALTHY = "AgentUnhealthy"
    VETOED = "Vetoed"
    PAUSED = "Paused"


@dataclass(frozen=True, kw_only=True, slots=True)
class Hold:
    """Why recovery does nothing now. ``since``: when the pause was set (None for the others)."""

    kind: HoldKind
    message: str
    since: float | None = None


def unhealthy_hold(publication: Publication, live: Mapping[str, bool] | None = None) -> Hold | None:
    """Held while the publication the decision rests on was made by an unhealthy agent, or while a
    component is unhealthy now (``live``: a reader that stopped publishes nothing, so its last
    publication still says healthy)."""
    bad = sorted(
        {name for name, ok in publication.health.items() if not ok} | {n for n, ok in (live or {}).items() if not ok}
    )
    if not bad:
        return None
    return Hold(
        kind=HoldKind.UNHEALTHY,
        message=f"the agent is not healthy ({', '.join(bad)} unhealthy): what it saw may be stale; no action",
    )


def veto_hold(node: Mapping[str, Any]) -> Hold | None:
    """Vetoed: the annotation ``VETO_ANNOTATION`` with any non-empty value (whitespace too: an operator who
    typed only spaces meant a veto), or the opt-out label. A Node's metadata is hostile input: a map that
    is not one counts as empty."""
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    annotations = annotations if isinstance(annotations, Mapping) else {}
    labels = labels if isinstance(labels, Mapping) else {}
    value = annotations.get(VETO_ANNOTATION)
    if value is not None and str(value) != "":
        why = str(value)[:MAX_WHY].strip() or "no reason given"
        return Hold(kind=HoldKind.VETOED, message=f"vetoed on this node ({VETO_ANNOTATION}: {why})")
    if str(labels.get(OPT_OUT_LABEL, "")).lower() in ("disabled", "false", "off"):
        return Hold(kind=HoldKind.VETOED, message=f"vetoed on this node ({OPT_OUT_LABEL}={labels[OPT_OUT_LABEL]})")
    return None


def pause_hold(
    pauses: Pauses,
    *,
    node: Mapping[str, Any],
    condition: str,
    reason: str,
    pools: Collection[str] = POOL_LABELS,
) -> Hold | None:
    if pauses.problem:
        return Hold(kind=HoldKind.PAUSED, message=pauses.problem)
    metadata = node.get("metadata") or {}
    name = str(metadata.get("name", ""))
    labels = metadata.get("labels") or {}
    if not isinstance(labels, Mapping):  # a Node's labels are hostile input: not a map = no labels
        labels = {}
    covering = [
        p for p in pauses.pauses if p.covers(node=name, labels=labels, condition=condition, reason=reason, pools=pools)
    ]
    if not covering:
        return None
    first = min(covering, key=lambda p: p.since)
    return Hold(
        kind=HoldKind.PAUSED,
        message="paused: " + "; ".join(describe(p) for p in covering),
        since=first.since,
    )


def describe(pause: Pause) -> str:
    when = iso(pause.since)  # clamped: a Lease's absurd time (year 10^300) prints, never raises
    return f"{pause.key} by {pause.by or 'unknown'} at {when}" + (f" ({pause.why})" if pause.why else "")


class _Halt(threading.Event):
    """The stop a drain is given: set when the agent stops, or when a hold applies (probed at most
    every ``recheck`` seconds, so a drain stops before its next pod). ``hold`` says which."""

    def __init__(
        self,
        *,
        stop: threading.Event,
        probe: Callable[[], Hold | None],
        recheck: float,
        monotonic: Callable[[], float],
    ) -> None:
        super().__init__()
        self._stop = stop
        self._probe = probe
        self._recheck = recheck
        self._monotonic = monotonic
        self._next = monotonic() + recheck
        self.hold: Hold | None = None

    def is_set(self) -> bool:
        if super().is_set():
            return True
        if self._stop.is_set():
            self.set()
            return True
        now = self._monotonic()
        if now < self._next:
            return False
        self._next = now + self._recheck
        try:
            hold = self._probe()
        except Exception as exc:  # the drain meets the same API trouble and reports it: no new information
            log.warning("recovery: cannot check for a pause or veto during the drain: %s", exc)
            return False
        if hold is not None:
            self.hold = hold
            self.set()
            return True
        return False

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else self._monotonic() + timeout
        while not self.is_set():
            left = self._recheck if end is None else min(self._recheck, end - self._monotonic())
            if left <= 0:
                return False
            self._stop.wait(min(left, 0.5))
        return True


@dataclass
class HoldStats:
    """What the collector exports: the hold found by the last check (None = free to act), and the pause
    covering this node as last read (``paused``: by the poll or a check; None = not paused)."""

    current: Hold | None = None
    paused: Hold | None = None
    checks: int = 0
    pause_reads: int = 0
    pause_read_failures: int = 0


class HoldGate:
    """What the recovery loop asks before acting, and the stop it gives a drain.

    ``store`` None: no pause Lease is read (pauses cannot be set: report-only, tests and standalone use).
    ``pools``: the labels naming a node's pool (:func:`pool_labels`); ``node``: this Node as read at
    startup (its name and labels; every later read of the Node replaces it), for :meth:`poll`."""

    def __init__(
        self,
        *,
        store: PauseStore | PauseLeases | None,
        client: Any,  # NodeClient: get_node, for the veto while a drain runs
        node_name: str,
        recheck: float = RECHECK,
        monotonic: Callable[[], float] = time.monotonic,
        health: Callable[[], Mapping[str, bool]] | None = None,  # every component's health now (supervisor)
        stale: Callable[[], Mapping[str, str]] | None = None,  # condition type -> its check, gone quiet
        pools: Collection[str] = POOL_LABELS,
        node: Mapping[str, Any] | None = None,
        poll: float = POLL,
        idle_poll: float = IDLE_POLL,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._store = store
        self._health = health
        self._stale = stale
        self._client = client
        self._node_name = node_name
        self._recheck = recheck
        self._monotonic = monotonic
        self._pools = tuple(pools)
        self._node: Mapping[str, Any] = node or {"metadata": {"name": node_name}}
        self._poll = Backoff(initial=poll, maximum=max(poll, POLL_MAX), jitter=POLL_JITTER, rng=rng)
        self._poll_at = float("-inf")  # monotonic time of the next read by poll() with an open incident
        self._idle_poll = Backoff(initial=idle_poll, maximum=idle_poll, jitter=POLL_JITTER, rng=rng)  # never grows
        self._idle_at = float("-inf")  # ... and without one
        self._busy = True  # whether the last poll() had an open incident (due_in follows it)
        self._told = ""  # the last unreadable-annotation problem logged (logged once until it changes)
        self.stats = HoldStats()

    def check(
        self, *, publication: Publication, node: Mapping[str, Any], incident: Incident | None, fresh: bool = True
    ) -> Hold | None:
        """The hold in force for acting on ``incident`` now, or None. ``fresh``: the pause Lease read from
        etcd (about to act or to ask the budget); otherwise from the API server's watch cache (a step that
        only waits, e.g. for the budget's backoff: at fleet scale every waiting agent steps every 5 s)."""
        self.stats.checks += 1
        self._node = node
        hold = (
            unhealthy_hold(publication, self._live())
            or self._stale_hold(incident)
            or veto_hold(node)
            or self._paused(node, incident, fresh=fresh)
        )
        self.stats.current = hold
        return hold

    def clear(self) -> None:
        """No action was due this step: nothing is held now."""
        self.stats.current = None

    def due_in(self) -> float:
        """Seconds until :meth:`poll` reads the pause Lease again (inf: it never does)."""
        if self._store is None:
            return math.inf
        return max(0.0, self._due() - self._monotonic())

    def _due(self) -> float:
        return self._poll_at if self._busy else max(self._poll_at, self._idle_at)

    def poll(self, incident: Incident | None = None) -> None:
        """Read the pause Lease when due (every ``poll`` seconds, jittered; a failed read backs off), so
        an agent with nothing to do knows, and exports, the pause covering its node. ``incident``: the
        open one, for a per-reason pause; without one the agent is idle and reads every ``idle_poll``
        seconds. Never raises: a failed read keeps what was last read."""
        self._busy = incident is not None
        if self._store is None or self._monotonic() < self._due():
            return
        try:
            self._read(self._node, incident, cached=True)
        except Exception as exc:  # API trouble: told in the log and counted, retried with backoff
            self.stats.pause_read_failures += 1
            self._schedule(failed=True)  # stats.paused stays as last read: a pause read before holds
            log.warning(
                "recovery: cannot read the pause Lease %s (retrying in %.0f s): %s",
                self._store.where,
                self.due_in(),
                exc,
            )

    def _schedule(self, *, failed: bool) -> None:
        """The next polls after a read. With an incident open: ``poll`` seconds after a good read; after a
        failed one the delay doubles (jittered) up to ``POLL_MAX``, back to ``poll`` on the next good read.
        Idle: ``idle_poll`` seconds after any read, good or failed: an API outage never makes an idle agent
        read sooner than it does when all is well (retrying every 5-60 s, 2,000 idle agents would make a
        failing API server answer 60 times the reads of a healthy one)."""
        if not failed:
            self._poll.reset()
        now = self._monotonic()
        self._poll_at = now + self._poll.next_delay()
        self._idle_at = now + self._idle_poll.next_delay()

    def halt(
        self, stop: threading.Event, *, publication: Callable[[], Publication], incident: Incident | None
    ) -> _Halt:
        """A stop for a drain: set by ``stop`` or by a hold (health, veto, pause) found while it runs."""

        def probe() -> Hold | None:
            hold = unhealthy_hold(publication(), self._live()) or self._stale_hold(incident)
            if hold is None:
                node = self._client.get_node(self._node_name)
                self._node = node
                hold = veto_hold(node) or self._paused(node, incident, fresh=True)
            if hold is not None:
                self.stats.current = hold
            return hold

        return _Halt(stop=stop, probe=probe, recheck=self._recheck, monotonic=self._monotonic)

    def _stale_hold(self, incident: Incident | None) -> Hold | None:
        if self._stale is None or incident is None:
            return None
        check = self._stale().get(incident.condition)
        if check is None:
            return None
        return Hold(
            kind=HoldKind.UNHEALTHY,
            message=f"check {check}, which raises {incident.condition}, has not completed a run lately: what it "
            "said may be stale; no action",
        )

    def _live(self) -> Mapping[str, bool] | None:
        return self._health() if self._health is not None else None

    def _paused(self, node: Mapping[str, Any], incident: Incident | None, *, fresh: bool) -> Hold | None:
        if self._store is None:
            return None
        return self._read(node, incident, cached=not fresh)

    def _read(self, node: Mapping[str, Any], incident: Incident | None, *, cached: bool = False) -> Hold | None:
        """One read of the pause Lease (it counts as the poll's for this interval): the pause covering
        ``node`` for ``incident`` (None: none). ``cached``: a poll, from the API server's watch cache."""
        assert self._store is not None
        self.stats.pause_reads += 1
        pauses = self._store.read(cached=cached)
        self._schedule(failed=False)
        if pauses.problem and pauses.problem != self._told:
            log.error("recovery: %s", pauses.problem)
        self._told = pauses.problem
        condition, reason = (incident.condition, incident.reason) if incident is not None else ("", "")
        hold = pause_hold(pauses, node=node, condition=condition, reason=reason, pools=self._pools)
        self.stats.paused = hold
        return hold


class HoldCollector:
    """``node_health_agent_recovery_held{kind}`` (1 while recovery on this node is held, by kind),
    ``node_health_agent_recovery_paused`` (1 while a pause covers this node, as last read: every agent
    reads the pause Lease every 5 s with an incident open, every 5 min idle; an unreadable one counts) and
    ``node_health_agent_recovery_paused_seconds`` (how long that pause has been in force)."""

    def __init__(self, *, stats: Callable[[], HoldStats], clock: Callable[[], float] = time.time) -> None:
        self._stats = stats
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        current = stats.current
        held = GaugeMetricFamily(
            "node_health_agent_recovery_held",
            "1 while recovery on this node is held (paused, vetoed, agent unhealthy), by kind.",
            labels=["kind"],
        )
        for kind in HoldKind:
            held.add_metric([kind.value], int(current is not None and current.kind is kind))
        yield held
        pause = current if current is not None and current.kind is HoldKind.PAUSED else stats.paused
        yield GaugeMetricFamily(
            "node_health_agent_recovery_paused",
            "1 while a pause covers recovery on this node (as last read; an unreadable pause Lease counts).",
            value=int(pause is not None),
        )
        since = pause.since if pause is not None else None
        yield GaugeMetricFamily(
            "node_health_agent_recovery_paused_seconds",
            "Seconds since the pause that holds recovery on this node was set (0: not paused).",
            value=max(0.0, self._clock() - since) if since is not None else 0.0,
        )
