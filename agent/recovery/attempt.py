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

The codec is strict: every field of the right type, times finite and plausible, strings bounded;
anything else is a corrupt record (:func:`parse_attempt` says why; nothing raises).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.timefmt import MAX_TIME
from agent.recovery.model import DOMAIN

ATTEMPT_ANNOTATION = f"{DOMAIN}/recovery-attempt"
RESERVED, SENT, FINISHED, FAILED = "reserved", "sent", "finished", "failed"
STATES = (RESERVED, SENT, FINISHED, FAILED)
REMEDIES = ("reboot",)
DEADLINE = 900.0  # seconds after the request: a reboot not seen by then is settled (settle())
UNKNOWN_BOOT = "unknown"  # what the agent reads when the boot id file cannot be read
MAX_ID = 256  # characters of an incident or boot id
MAX_MESSAGE = 300
MAX_DEADLINE = 86_400.0  # the most a recorded deadline may lie after its request
FUTURE_SLACK = 86_400.0  # a request recorded later than now + this is not one an agent wrote


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
    """The :class:`Attempt` of an annotation body; ValueError naming the field otherwise."""
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    unknown = set(data) - {
        "incident",
        "remedy",
        "state",
        "boot",
        "at",
        "deadline",
        "finishedAt",
        "finishedBoot",
        "message",
    }
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    at = _time(data, "at", now=now)
    deadline = _time(data, "deadline", now=now + MAX_DEADLINE)
    if not at <= deadline <= at + MAX_DEADLINE:
        raise ValueError(f"'deadline' must lie within {MAX_DEADLINE:g}s after 'at', got {deadline - at!r}s")
    finished_at = None if data.get("finishedAt") is None else _time(data, "finishedAt", now=now)
    attempt = Attempt(
        incident=_text(data, "incident", MAX_ID, required=True),
        remedy=_choice(data, "remedy", REMEDIES),
        state=_choice(data, "state", STATES),
        boot=_text(data, "boot", MAX_ID, required=True),
        at=at,
        deadline=deadline,
        finished_at=finished_at,
        finished_boot=_text(data, "finishedBoot", MAX_ID),
        message=_text(data, "message", MAX_MESSAGE),
    )
    if (attempt.state == FINISHED) != (finished_at is not None):
        raise ValueError(f"'finishedAt' must be set exactly when the state is {FINISHED!r}")
    return attempt


def parse_attempt(node: Mapping[str, Any], *, now: float) -> tuple[Attempt | None, str]:
    """The attempt recorded on the Node (None: none, or unreadable) and why it is unreadable ("" if not)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION)
    if text is None:
        return None, ""
    try:
        return decode(json.loads(text), now=now), ""
    except (ValueError, RecursionError) as exc:  # a JSONDecodeError is a ValueError
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


def _time(data: Mapping[str, Any], key: str, *, now: float) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key!r} must be a number, got {value!r:.60}")
    if isinstance(value, int) and not 0 <= value <= MAX_TIME:  # before float(): 10**400 would overflow
        raise ValueError(f"{key!r} must be a time (seconds since 1970, before year 10000), got {value!r:.60}")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0.0 <= seconds <= MAX_TIME:
        raise ValueError(f"{key!r} must be a time (seconds since 1970, before year 10000), got {seconds!r}")
    if seconds > now + FUTURE_SLACK:
        raise ValueError(f"{key!r} is {seconds - now:.0f}s in the future")
    return seconds


def _text(data: Mapping[str, Any], key: str, limit: int, *, required: bool = False) -> str:
    value = data.get(key, None if required else "")
    if not isinstance(value, str) or (required and not value) or len(value) > limit:
        raise ValueError(f"{key!r} must be a string of {'1' if required else '0'} to {limit} characters")
    return value


def _choice(data: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = data.get(key)
    if value not in allowed:
        raise ValueError(f"{key!r} must be one of {', '.join(allowed)}, got {value!r:.60}")
    return str(value)
