"""The attempt ledger: a reboot's intent, recorded on the Node before EC2 is called.

One record per Node, in the annotation :data:`ATTEMPT_ANNOTATION` (the latest attempt only):

* ``reserved``: written, and answered, *before* ``RebootInstances`` is called, with the boot id before
  the call, the incident id and a deadline (:data:`DEADLINE` after the request);
* ``sent``: EC2 accepted the call (written together with the incident's ``done``, one PATCH);
* ``finished``: an agent saw a boot id other than the one recorded (``finishedBoot``), or the deadline
  passed where the boot id cannot tell (see :func:`settle`);
* ``failed``: EC2 refused the call (throttled, denied, wrong state), or a ``reserved`` request left the
  boot id unchanged until the deadline: the host did not reboot, so asking again is no second reboot.

A ``reserved`` record under an unchanged boot id is ambiguous (the agent may have stopped before or
after the call, or lost its answer): it is never asked again before the deadline. EC2 hard-reboots an
instance that does not shut down within minutes, so a boot id unchanged at the deadline means the
host did not reboot. A ``sent`` record whose boot id did not change by the deadline, and any record
whose boot id is unknown (before or now), counts as finished at the deadline: the observation window
decides (healthy: uncordon; still failing: climb), and the host is never rebooted a second time on a
guess.

Replace needs no ledger: its ``SetInstanceHealth`` is preceded by ``DescribeAutoScalingInstances``
(an instance already Unhealthy is not marked again) and marking is idempotent (one instance is
replaced once, however often it is marked), while each ``RebootInstances`` reboots again.

The codec reads the record by the rules of :mod:`agent.recovery.fields`, like every other record recovery
reads back: every field of the right type, times finite and plausible, strings bounded, no field it does
not know; and, the ledger's own rules, a deadline within :data:`MAX_DEADLINE` after the request and
``finishedAt`` set exactly when finished. Unlike the other records, a blank annotation is corrupt, not
absent: an absent ledger lets a reboot be requested at once, which a ledger someone blanked must not.
Anything else is a corrupt record (:func:`parse_attempt` says why, as ``attempt: <field>: <problem>``;
nothing raises).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.recovery.fields import FUTURE_SLACK, CorruptRecord, Fields, load, show
from agent.recovery.model import DOMAIN

ATTEMPT_ANNOTATION = f"{DOMAIN}/recovery-attempt"
RECORD = "attempt"  # the record's name in what a corrupt one says (agent.recovery.fields)
RESERVED, SENT, FINISHED, FAILED = "reserved", "sent", "finished", "failed"
STATES = (RESERVED, SENT, FINISHED, FAILED)
REMEDIES = ("reboot",)
DEADLINE = 900.0  # seconds after the request: a reboot not seen by then is settled (settle())
UNKNOWN_BOOT = "unknown"  # what the agent reads when the boot id file cannot be read
MAX_ID = 256  # characters of an incident or boot id
MAX_MESSAGE = 300
MAX_DEADLINE = 86_400.0  # the most a recorded deadline may lie after its request
FIELDS = ("incident", "remedy", "state", "boot", "at", "deadline", "finishedAt", "finishedBoot", "message")


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """One remedy requested from EC2 for one incident, as recorded on the Node."""

    incident: str
    remedy: str  # "reboot"
    state: str  # RESERVED, SENT, FINISHED, FAILED
    boot: str  # boot id before the call (UNKNOWN_BOOT: it could not be read)
    at: float  # reserved at, by the requesting agent's clock
    deadline: float  # see settle()
    finished_at: float | None = None  # by the clock of the agent that settled it
    finished_boot: str = ""  # the new boot id ("" = settled at the deadline)
    message: str = ""

    @property
    def open(self) -> bool:
        """Requested and not settled: no other reboot may be asked for meanwhile."""
        return self.state in (RESERVED, SENT)

    def to_json(self) -> dict[str, Any]:
        return {
            "incident": self.incident,
            "remedy": self.remedy,
            "state": self.state,
            "boot": self.boot,
            "at": self.at,
            "deadline": self.deadline,
            "finishedAt": self.finished_at,
            "finishedBoot": self.finished_boot,
            "message": self.message,
        }


def attempt_text(attempt: Attempt | None) -> str | None:
    """The annotation value (None: remove it)."""
    if attempt is None:
        return None
    return json.dumps(attempt.to_json(), sort_keys=True, separators=(",", ":"))


def decode(data: Any, *, now: float) -> Attempt:
    """The :class:`Attempt` of an annotation body (a JSON object, or its :class:`Fields`); raises
    :class:`~agent.recovery.fields.CorruptRecord` naming the field otherwise."""
    if isinstance(data, Fields):
        fields = data
    elif isinstance(data, Mapping):
        fields = Fields(record=RECORD, data=data)
    else:
        raise CorruptRecord(RECORD, "", f"not a JSON object: {show(data)}")
    fields.only(FIELDS)
    at = fields.time("at", now=now, ahead=FUTURE_SLACK)  # later than that: not a request an agent wrote
    deadline = fields.time("deadline", now=now, ahead=FUTURE_SLACK + MAX_DEADLINE)
    if not at <= deadline <= at + MAX_DEADLINE:
        fields.fail("deadline", f"must lie from 0 to {MAX_DEADLINE:g}s after at, got {deadline - at:g}s")
    finished_at = fields.optional_time("finishedAt", now=now, ahead=FUTURE_SLACK)
    attempt = Attempt(
        incident=fields.text("incident", limit=MAX_ID, nonempty=True),
        remedy=fields.choice("remedy", REMEDIES),
        state=fields.choice("state", STATES),
        boot=fields.text("boot", limit=MAX_ID, nonempty=True),
        at=at,
        deadline=deadline,
        finished_at=finished_at,
        finished_boot=fields.text("finishedBoot", default="", limit=MAX_ID),
        message=fields.text("message", default="", limit=MAX_MESSAGE),
    )
    if (attempt.state == FINISHED) != (finished_at is not None):
        fields.fail("finishedAt", f"must be set exactly when the state is {FINISHED}, got {show(finished_at)}")
    return attempt


def parse_attempt(node: Mapping[str, Any], *, now: float) -> tuple[Attempt | None, str]:
    """The attempt recorded on the Node (None: none, or unreadable) and why it is unreadable ("" if not): the
    rules of :mod:`agent.recovery.fields`. Never raises for what the annotation holds."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION)
    if text is None:
        return None, ""
    try:
        fields = load(text, RECORD)
        if fields is None:  # blank: someone cleared it; a reboot may be in flight all the same
            raise CorruptRecord(RECORD, "", "blank (remove the annotation to clear the ledger)")
        return decode(fields, now=now), ""
    except CorruptRecord as exc:
        return None, f"{exc}: {str(text)[:200]!r}"


def known(boot: str) -> bool:
    return bool(boot) and boot != UNKNOWN_BOOT


def settle(attempt: Attempt, *, boot: str, now: float) -> Attempt:
    """``attempt`` as it stands with this boot id at ``now`` (see the module's text for the rules)."""
    if not attempt.open:
        return attempt
    if known(boot) and known(attempt.boot) and boot != attempt.boot:
        return dataclasses.replace(attempt, state=FINISHED, finished_at=now, finished_boot=boot)
    if now < attempt.deadline:
        return attempt
    if not known(boot) or not known(attempt.boot):
        why = "the boot id is unknown, so the reboot is counted as done at its deadline"
    elif attempt.state == SENT:
        why = f"EC2 accepted the reboot but the boot id is still {boot} at its deadline: counted as done, not repeated"
    else:
        why = (
            f"the boot id is still {boot} at the deadline of a request that may not have reached EC2: the host did "
            "not reboot, so it may be requested again"
        )
        return dataclasses.replace(attempt, state=FAILED, message=why)
    return dataclasses.replace(attempt, state=FINISHED, finished_at=now, message=why)
