"""Every Event recovery tells: its reason, type and message, one constructor each.

A constructor returns a :class:`Told`; the loop sends it (once per incident and ``once`` key when
that is set). The texts live here only, so a reason or a message is changed in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.durations import format_duration
from agent.core.types import Condition
from agent.recovery.model import Action, BudgetView, Incident, PolicyRule, ValidationNote

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True, kw_only=True, slots=True)
class Told:
    """One Event to send: ``once`` non-empty = at most once per incident and key."""

    type: str
    reason: str
    message: str
    once: str = ""


def what(incident: Incident) -> str:
    return f"{incident.condition}={incident.reason}"


# ---- actions ---------------------------------------------------------------------------------------


def cordoned(incident: Incident) -> Told:
    message = f"{what(incident)}: cordoned (no new pods) and tainted"
    return Told(type=WARNING, reason="RecoveryCordoned", message=message)


def already_cordoned(incident: Incident) -> Told:
    return Told(
        type=NORMAL,
        reason="RecoveryAlreadyCordoned",
        message=f"{what(incident)}: the node was already cordoned by someone else; recovery will never uncordon it",
    )


def tainted(incident: Incident) -> Told:
    return Told(type=WARNING, reason="RecoveryTainted", message=f"{what(incident)}: tainted NoSchedule")


def uncordoned(incident: Incident) -> Told:
    return Told(type=NORMAL, reason="RecoveryUncordoned", message=f"{what(incident)}: healthy again; uncordoned")


def drain_skipped() -> Told:
    return Told(type=WARNING, reason="RecoveryDrainSkipped", message="drain is not configured")


def drain_progress(kind: str, message: str) -> Told:
    """A drain's own report (DrainStarted, DrainSucceeded, DrainPodDeadline, ...)."""
    progress = kind in ("DrainStarted", "DrainSucceeded")
    return Told(type=NORMAL if progress else WARNING, reason=f"Recovery{kind}", message=message)


def drain_held(hold_message: str) -> Told:
    return Told(type=WARNING, reason="RecoveryDrainHeld", message=f"drain stopped before the next pod: {hold_message}")


def claimed_elsewhere(incident: Incident, node_name: str) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryClaimedElsewhere",
        message=f"{what(incident)}: another agent with node name {node_name} marks (or "
        "marked) this node's instance: this one stands back (two agents must never be given one node name)",
        once="claimed",
    )


def reboot_skipped(incident: Incident) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryRebootSkipped",
        message=f"{what(incident)}: reboot skipped: AWS is not configured for this agent; the node stays cordoned",
        once="reboot-skipped",
    )


def reboot_requested(incident: Incident, instance_id: str) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryRebootRequested",
        message=f"{what(incident)}: EC2 RebootInstances requested for "
        f"{instance_id}; once it is back (a new boot id) it is watched before it is uncordoned",
    )


def not_ec2(incident: Incident, message: str, *, once: str = "") -> Told:
    return Told(type=NORMAL, reason="RecoveryNotAnEC2Instance", message=f"{what(incident)}: {message}", once=once)


def reboot_failed(incident: Incident, message: str, code: str) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryRebootFailed",
        message=f"{what(incident)}: {message}; the node stays cordoned and the reboot is tried again "
        "later (no other remedy is taken instead)",
        once=f"reboot-failed-{code}",
    )


def reboot_unconfirmed(incident: Incident, message: str, code: str) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryRebootUnconfirmed",
        message=f"{what(incident)}: {message}; the node stays cordoned",
        once=f"reboot-pending-{code}",
    )


def ladder_climbed(climbed: str, *, remedy: str, step: int, rungs: int) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryLadderClimbed",
        message=f"{climbed}: next remedy {remedy} (rung {step + 1} of {rungs})",
        once=f"climb-{step}",
    )


def no_auto_scaling(incident: Incident) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryNoAutoScaling",
        message=f"{what(incident)}: mark-unhealthy skipped: AWS is not configured for this agent",
    )


def mark_failed(incident: Incident, error: Exception, code: str) -> Told:
    kept = "stays cordoned" if Action.CORDON in incident.done else "stays as it is"
    return Told(
        type=WARNING,
        reason="RecoveryMarkUnhealthyFailed",
        message=f"{what(incident)}: the node {kept} but is not replaced: mark-unhealthy failed ({error}); retried "
        "with backoff",
        once=f"mark-failed/{code}",
    )


def no_auto_scaling_group(incident: Incident, instance_id: str) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryNoAutoScalingGroup",
        message=f"{what(incident)}: instance {instance_id} is in no Auto Scaling group (Karpenter or self-managed); "
        "condition AcceleratedHardwareReady=False hands it to node repair",
    )


def marked_unhealthy(incident: Incident, message: str) -> Told:
    return Told(type=WARNING, reason="RecoveryMarkedUnhealthy", message=f"{what(incident)}: {message}")


def dry_run(incident: Incident, action: Action) -> Told:
    return Told(
        type=WARNING if action.disruptive else NORMAL,
        reason="RecoveryDryRun",
        message=f"dry run (ENABLE_RECOVERY is not true): would {action.value} for {what(incident)}",
        once=f"would-{action.value}",
    )


# ---- devices (agent.recovery.devicescope) -----------------------------------------------------------


def device_fenced(incident: Incident, device: str, outcome: str, message: str) -> Told:
    """The fence is in place: ours (fenced), the vendor driver's (vendor), or the plugin's own (not-dra)."""
    return Told(
        type=WARNING,
        reason="DeviceFenced",
        message=f"{what(incident)}: device {device} fenced ({outcome}): {message}",
        once=f"fenced-{device}",
    )


def device_fence_not_possible(incident: Incident, device: str, why: str) -> Told:
    """Fencing the device is not possible: the rule's node ladder follows (told once per device)."""
    return Told(
        type=WARNING,
        reason="DeviceFenceNotPossible",
        message=f"{what(incident)}: device {device} cannot be fenced ({why}): recovery climbs to the node's ladder",
        once=f"not-possible-{device}",
    )


def device_drained(incident: Incident, device: str, evicted: tuple[str, ...], outcome: str) -> Told:
    moved = ", ".join(evicted) or "no pod"
    return Told(
        type=WARNING if outcome not in ("done", "skipped") else NORMAL,
        reason="DeviceDrained",
        message=f"{what(incident)}: the pods holding device {device} drained ({outcome}; moved: {moved}); "
        "the node stays schedulable",
        once=f"drained-{device}-{outcome}",
    )


def device_holders_unknown(incident: Incident, device: str, why: str) -> Told:
    return Told(
        type=WARNING,
        reason="DeviceHoldersUnknown",
        message=f"{what(incident)}: the pods holding device {device} are not known ({why}): none is moved",
        once=f"holders-{device}",
    )


def device_unfenced(incident: Incident, device: str) -> Told:
    return Told(
        type=NORMAL,
        reason="DeviceUnfenced",
        message=f"{what(incident)}: device {device} healthy again (or cleared): its fence is lifted",
        once=f"unfenced-{device}",
    )


def device_scope_at_node(incident: Incident, why: str) -> Told:
    """A device-scope rule acts at the node (more devices than maxDevices, a repeat, a fence not possible)."""
    message = f"{what(incident)}: acting on the node: {why}"
    return Told(type=WARNING, reason="DeviceScopeClimbed", message=message, once="at-node")


# ---- why a step waits ------------------------------------------------------------------------------


def validation(note: ValidationNote) -> Told:
    """The validation gate's word (agent.recovery.validationgate): requested, passed, failed, timed out, or
    that the node returns on silence (no validation set)."""
    return Told(type=WARNING if note.warning else NORMAL, reason=note.reason, message=note.message, once=note.once)


def held(kind: str, message: str) -> Told:
    """A pause, a veto or the agent's own health (``kind``: the HoldKind's value)."""
    return Told(type=WARNING, reason=f"Recovery{kind}", message=message, once=f"held:{message}")


def flapping(incident: Incident, *, since_uncordon: float, count: int, hold: float, most: float) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryFlapping",
        message=f"{what(incident)}: the problem came back "
        f"{format_duration(since_uncordon)} after recovery uncordoned the node "
        f"({count} uncordons in a row): the node stays cordoned until healthy for "
        f"{format_duration(hold)} (doubling with each flap, at most "
        f"{format_duration(most)}); a flap takes no new step of the cluster budget",
        once="flapping",
    )


def correlated(incident: Incident, budget: BudgetView) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryHeldCorrelated",
        message=f"{what(incident)}: recovery holds: {budget.correlated}; it reports "
        "and waits, and goes on by itself once fewer nodes of the group show the problem",
        once="correlated",
    )


def blocked(incident: Incident, budget: BudgetView | None, *, devices: bool = False) -> Told:
    """The budget refused the step (``devices``: a device step, refused by the device rate)."""
    reason = (budget.why_device_blocked if devices else budget.why_blocked) if budget else ""
    why = f" ({reason})" if reason else ""
    return Told(
        type=WARNING,
        reason="RecoveryBlocked",
        message=f"{what(incident)}: recovery waits for the cluster budget{why}; it goes on "
        "by itself as other nodes recover or leave",
        once="blocked",
    )


def untrusted(condition: Condition, rule: PolicyRule, owner: str) -> Told:
    return Told(
        type=WARNING,
        reason="RecoveryUntrustedSource",
        message=f"{condition.type}={condition.reason} is raised by a {owner}, which the recovery rule ({rule.source}) "
        "does not trust "
        f"(sources: {', '.join(p.value for p in rule.sources)}): reported, not acted on",
    )


# ---- records on the Node that cannot be read -------------------------------------------------------


def corrupt(annotation: str, node_name: str, what_: str) -> Told:
    return Told(
        type=WARNING, reason="RecoveryCorruptRecord", message=f"annotation {annotation} on node {node_name} {what_}"
    )


CORRUPT_INCIDENT = (
    "is not a valid incident record and is ignored ({problem}); recovery decides afresh and its next record replaces it"
)
CORRUPT_FLAPS = "is not a valid flap record and is ignored ({problem}); the next uncordon replaces it"
CORRUPT_HISTORY = (
    "is not a valid recovery history and is ignored ({problem}); the ladder starts "
    "over from its first rung and its next write replaces it"
)
CORRUPT_ATTEMPT = (
    "is not a valid reboot attempt record ({problem}); as a reboot may be in "
    "flight, none is requested until its deadline has passed (or a new boot id shows); the next "
    "request replaces it"
)
