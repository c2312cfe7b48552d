"""Flap damping: a node whose problem keeps coming back soon after we uncordon it is held longer.

A condition that flaps (True, healed, True again...) under a policy with ``uncordon_after`` would
cordon and uncordon the node every few seconds, and each cordon would spend one of the cluster's
disruptive steps: one flapping node could starve every other. So:

* Each uncordon by recovery leaves a :class:`FlapRecord` on the Node (annotation ``FLAP_ANNOTATION``,
  written in the uncordon's own patch): how many uncordons in a row were followed by a flap, and
  when the last one was.
* An incident that opens within ``FLAP_MEMORY`` of that uncordon is a **flap**. Its hold (how long
  the node must stay healthy before it is uncordoned) is ``uncordon_after * 2**count``, at most
  ``MAX_HOLD`` (or ``uncordon_after`` when that is longer): 2×, 4×, 8×... A new episode while the
  node is still held cordoned needs no new cordon and so no budget at all.
* A flap's cordon takes a place in the cluster budget (the limit of nodes disrupted at once holds)
  but is not counted again in the window's steps: a flapping series counts once.
* A node that stays healthy for ``FLAP_MEMORY`` after its uncordon is forgiven: its next incident is
  not a flap, and the count starts over.

Everything read back is validated by the rules of :mod:`agent.recovery.fields`: a record that is not one
is ignored (no damping) and told once by the loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.recovery.fields import FUTURE_SLACK, CorruptRecord, load
from agent.recovery.model import DOMAIN, Incident, RecoveryPolicy

FLAP_ANNOTATION = f"{DOMAIN}/flaps"
RECORD = "flaps"  # the record's name in what a corrupt one says (agent.recovery.fields)
FLAP_MEMORY = 3600.0  # seconds after an uncordon within which a new incident is a flap
MAX_HOLD = 86_400.0  # the longest hold a flap earns (unless uncordon_after itself is longer)
MAX_COUNT = 64  # a count beyond this changes nothing (the hold is capped long before)


@dataclass(frozen=True, kw_only=True, slots=True)
class FlapRecord:
    """``count`` uncordons in a row, each but the first after a flap; the last one at ``last_uncordon``."""

    count: int
    last_uncordon: float

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "lastUncordon": self.last_uncordon}


def flap_text(record: FlapRecord) -> str:
    return json.dumps(record.to_json(), sort_keys=True, separators=(",", ":"))


def parse_flaps(node: Mapping[str, Any], *, now: float | None = None) -> tuple[FlapRecord | None, str]:
    """The record on the Node (None: none, or unreadable) and why it is unreadable ("" otherwise): the rules of
    :mod:`agent.recovery.fields`, a time more than ``FUTURE_SLACK`` after ``now`` refused too. Never raises
    for what the annotation holds."""
    text = (((node.get("metadata") or {}).get("annotations")) or {}).get(FLAP_ANNOTATION)
    try:
        fields = load(text, RECORD)
        if fields is None:
            return None, ""
        count = fields.integer("count", low=1, high=MAX_COUNT)
        return FlapRecord(count=count, last_uncordon=fields.time("lastUncordon", now=now, ahead=FUTURE_SLACK)), ""
    except CorruptRecord as exc:
        return None, f"{exc}: {str(text)[:200]!r}"


def is_flap(record: FlapRecord | None, incident: Incident | None) -> bool:
    """Whether ``incident`` opened within FLAP_MEMORY after the last uncordon of ``record``."""
    if record is None or incident is None:
        return False
    return 0.0 <= incident.opened - record.last_uncordon < FLAP_MEMORY


def hold(uncordon_after: float, record: FlapRecord | None, incident: Incident | None) -> float:
    """How long ``incident``'s node must be healthy before it is uncordoned."""
    if not is_flap(record, incident):
        return uncordon_after
    assert record is not None
    return min(uncordon_after * 2 ** min(record.count, MAX_COUNT), max(uncordon_after, MAX_HOLD))


def after_uncordon(record: FlapRecord | None, incident: Incident, now: float) -> FlapRecord:
    """The record to leave on the Node when ``incident``'s node is uncordoned at ``now``."""
    count = min(record.count + 1, MAX_COUNT) if record is not None and is_flap(record, incident) else 1
    return FlapRecord(count=count, last_uncordon=now)


def damped(policy: RecoveryPolicy, record: FlapRecord | None, incident: Incident | None) -> RecoveryPolicy:
    """``policy`` with the hold ``incident`` earned as its ``uncordon_after`` (unchanged when never uncordoning)."""
    if policy.uncordon_after is None:
        return policy
    earned = hold(policy.uncordon_after, record, incident)
    return policy if earned == policy.uncordon_after else replace(policy, uncordon_after=earned)
