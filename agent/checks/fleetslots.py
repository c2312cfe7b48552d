"""The fleet share of active checks: at most ``share`` of a pool's (or zone's) nodes run one at once.

Where
    One ``coordination.k8s.io/v1`` Lease per group in the agent's namespace, named
    ``node-health-agent-active-<hash of the group>``. A node's group is the first of ``group_labels``
    it has (``label=value``: the Karpenter NodePool, the EKS node group, the zone), else the whole
    cluster. The state is the JSON of the annotation :data:`SLOTS_ANNOTATION`::

        {"version": 1, "group": "karpenter.sh/nodepool=gpu",
         "holders": {"<node>": {"check": "dcgm-diag", "since": 1767225600.0, "expires": 1767226260.0}}}

The limit
    ``ceil(share × the group's nodes)``, at least 1 (the nodes are listed with the group's label).

Stale slots
    A slot expires at ``since + the check's timeout + grace``: an agent killed mid-check never holds
    its slot for ever; every write drops the expired ones.

Concurrency and errors
    read → modify → replace with the resourceVersion read (409 on a race): the loser waits a jittered
    pause (the injected ``sleep`` and ``rng``) and reads again, at most ``attempts`` rounds. Any other
    API error, a corrupt annotation or the rounds used up answer :data:`UNAVAILABLE`: the caller skips
    the check (``FleetSlotsUnavailable``), it never runs unguarded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

SLOTS_ANNOTATION = "node-health-agent.io/active-slots"
LEASE_PREFIX = "node-health-agent-active-"
DEFAULT_SHARE = 0.10
DEFAULT_GRACE = 60.0  # seconds past a check's timeout before its slot counts as stale
DEFAULT_GROUP_LABELS = ("karpenter.sh/nodepool", "eks.amazonaws.com/nodegroup", "topology.kubernetes.io/zone")
ATTEMPTS = 5
BACKOFF = 0.2  # seconds: the pause before round n is rng() * BACKOFF * 2**n
FORMAT_VERSION = 1

GRANTED = "granted"
FULL = "full"
UNAVAILABLE = "unavailable"


class SlotClient(Protocol):
    """What the slots need of :class:`agent.adapters.kube.KubeClient` (its errors carry ``status``)."""

    def get_node(self, name: str) -> dict[str, Any]: ...

    def list_nodes(self, *, label_selector: str = "") -> list[dict[str, Any]]: ...

    def get_lease(self, namespace: str, name: str, *, cached: bool = False) -> dict[str, Any]: ...

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class SlotAnswer:
    outcome: str  # GRANTED | FULL | UNAVAILABLE
    detail: str  # who holds the slots, or what went wrong


def limit_of(share: float, nodes: int) -> int:
    """The slots of a group of ``nodes``: ``ceil(share × nodes)``, at least 1."""
    return max(1, math.ceil(share * nodes - 1e-9))


def lease_name(group: str) -> str:
    return LEASE_PREFIX + hashlib.sha256(group.encode()).hexdigest()[:12]


def _status(exc: Exception) -> int | None:
    return getattr(exc, "status", None)


class FleetSlots:
    """A node's place in its group's share of active checks (acquire before, release after)."""

    def __init__(
        self,
        *,
        client: SlotClient,
        namespace: str,
        node_name: str,
        share: float = DEFAULT_SHARE,
        grace: float = DEFAULT_GRACE,
        group_labels: Sequence[str] = DEFAULT_GROUP_LABELS,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        attempts: int = ATTEMPTS,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._node = node_name
        self._share = share
        self._grace = grace
        self._group_labels = tuple(group_labels)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._attempts = max(1, attempts)

    def acquire(self, *, check: str, timeout: float) -> SlotAnswer:
        """Take a slot for ``check`` (expiring after ``timeout`` + grace): GRANTED, FULL (who holds them) or
        UNAVAILABLE (why: the caller skips, never runs unguarded)."""
        try:
            group = self._group()
            limit = limit_of(self._share, len(self._client.list_nodes(label_selector=group)))
            return self._change(group, lambda holders, now: self._take(holders, now, check, timeout, limit))
        except Exception as exc:  # an API error, a corrupt Lease: skip, never run unguarded
            log.warning("active check %s: fleet slots unavailable: %s", check, exc)
            return SlotAnswer(outcome=UNAVAILABLE, detail=str(exc)[:300])

    def release(self) -> None:
        """Give the slot back (an error is logged: the slot expires anyway)."""
        try:
            self._change(self._group(), self._drop)
        except Exception as exc:
            log.warning("cannot give back the active-check fleet slot (it expires by itself): %s", exc)

    # ---- the read-modify-write -------------------------------------------------------------------

    def _group(self) -> str:
        labels = (self._client.get_node(self._node).get("metadata") or {}).get("labels") or {}
        for key in self._group_labels:
            if labels.get(key):
                return f"{key}={labels[key]}"
        return ""  # the whole cluster (an empty selector lists every node)

    def _take(
        self, holders: dict[str, Any], now: float, check: str, timeout: float, limit: int
    ) -> tuple[dict[str, Any] | None, SlotAnswer]:
        others = sorted(n for n in holders if n != self._node)
        if len(others) >= limit:
            shown = ", ".join(f"{n} ({holders[n].get('check', '?')})" for n in others[:5])
            return None, SlotAnswer(outcome=FULL, detail=f"{len(others)} of {limit} slots held: {shown}")
        holders[self._node] = {"check": check, "since": now, "expires": now + timeout + self._grace}
        return holders, SlotAnswer(outcome=GRANTED, detail=f"slot {len(others) + 1} of {limit}")

    def _drop(self, holders: dict[str, Any], now: float) -> tuple[dict[str, Any] | None, SlotAnswer]:
        if self._node not in holders:
            return None, SlotAnswer(outcome=GRANTED, detail="no slot held")
        del holders[self._node]
        return holders, SlotAnswer(outcome=GRANTED, detail="released")

    def _change(
        self, group: str, change: Callable[[dict[str, Any], float], tuple[dict[str, Any] | None, SlotAnswer]]
    ) -> SlotAnswer:
        name = lease_name(group)
        for attempt in range(self._attempts):
            lease = self._read(name)
            now = self._clock()
            holders = {n: h for n, h in _holders(lease).items() if float(h.get("expires", 0)) > now}
            new, answer = change(holders, now)
            if new is None and len(holders) == len(_holders(lease)):
                return answer  # nothing to write
            try:
                self._write(lease, name, group, holders if new is None else new)
                return answer
            except Exception as exc:
                if _status(exc) != 409:
                    raise
            self._sleep(self._rng.random() * BACKOFF * 2**attempt)
        raise RuntimeError(f"lease {self._namespace}/{name}: lost {self._attempts} write races in a row")

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return self._client.get_lease(self._namespace, name)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise

    def _write(self, lease: dict[str, Any] | None, name: str, group: str, holders: dict[str, Any]) -> None:
        from agent.core.leases import write_lease_annotation

        value = json.dumps({"version": FORMAT_VERSION, "group": group, "holders": holders}, sort_keys=True)
        write_lease_annotation(
            self._client,
            lease,
            namespace=self._namespace,
            name=name,
            annotation=SLOTS_ANNOTATION,
            value=value,
            spec={"holderIdentity": self._node},
        )


class CorruptSlots(ValueError):
    """The Lease's annotation is not what this version writes: refused (skip), never taken as empty."""


def _holders(lease: dict[str, Any] | None) -> dict[str, Any]:
    if lease is None:
        return {}
    text = ((lease.get("metadata") or {}).get("annotations") or {}).get(SLOTS_ANNOTATION)
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        raise CorruptSlots(f"{SLOTS_ANNOTATION}: not JSON") from None
    holders = data.get("holders") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION or not isinstance(holders, dict):
        raise CorruptSlots(f"{SLOTS_ANNOTATION}: not a version {FORMAT_VERSION} slots record")
    for node, held in holders.items():
        expires = held.get("expires") if isinstance(held, dict) else None
        if isinstance(expires, bool) or not isinstance(expires, int | float) or not math.isfinite(expires):
            raise CorruptSlots(f"{SLOTS_ANNOTATION}: holders[{node!r}].expires must be a number")
    return dict(holders)
