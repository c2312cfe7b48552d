"""The recovery vocabulary: policy as data, the incident recorded on the Node, the decision.

Everything here is a frozen value. ``policy.decide`` turns (snapshot, node view, incident, clock,
budget view, policy) into a :class:`Decision`; ``loop`` carries it out through ``actions`` (the
Kubernetes side), ``budget`` (the cluster-wide Lease) and ``agent.adapters.aws`` (Auto Scaling), and records
what was done in the :class:`Incident` annotation so a restarted agent never repeats it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.core.durations import format_duration
from agent.core.timefmt import iso
from agent.core.types import Provenance
from agent.core.validation import ValidationRequest

# Names others rely on (annotations, taint, labels, Lease). One prefix for all of them.
DOMAIN = "node-health-agent.io"
INCIDENT_ANNOTATION = f"{DOMAIN}/incident"  # JSON of Incident.to_json(); absent = no open incident
TAINT_KEY = f"{DOMAIN}/unhealthy"  # NoSchedule taint we add on cordon (value = the reason)
UNVALIDATED_TAINT_KEY = f"{DOMAIN}/unvalidated"  # NoSchedule on a new node until its first pass (startupValidation)
OPT_OUT_LABEL = f"{DOMAIN}/recovery"  # label value "disabled" (or "false") = never act on this node
CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
ULTRASERVER_LABEL = "neuron.amazonaws.com/ultraserver-server-id-4"  # one failure domain per value
DEFAULT_NAMESPACE = "node-health-agent"  # the agent's namespace (POD_NAMESPACE) when not told
DEFAULT_LEASE = "node-health-agent-recovery-budget"  # + "-<cluster name>" when a cluster name is set
SAFE_TO_EVICT_ANNOTATION = "cluster-autoscaler.kubernetes.io/safe-to-evict"
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


# The condition types of the built-in rule packs and checks, with their owners there. A policy rule on
# one of them trusts these owners only unless it says otherwise (``sources``): a third-party plugin
# that raises NeuronHealth where the Neuron pack is not loaded is reported, never acted on.
BUILTIN_CONDITIONS: Mapping[str, Provenance] = {
    **dict.fromkeys(
        (
            "KernelDeadlock",
            "XfsShutdown",
            "CperHardwareErrorFatal",
            "ReadonlyFilesystem",
            "PCIeUncorrectableError",
            "MemoryUncorrectableError",
            "RDMADeviceFailure",
            "StorageDeviceFailure",
            "NeuronHealth",
            "GpuXid",
            "GpuDriverError",
            "NVSwitchSXid",
        ),
        Provenance.KERNEL_LOG,
    ),
    **dict.fromkeys(
        ("NeuronDevices", "NeuronUltraServer", "IbDev", "GpuCount", "GpuEcc", "GpuNvlink"), Provenance.BUILTIN_CHECK
    ),
    "ScheduledMaintenance": Provenance.BUILTIN_CHECK,  # the agent's own (--scheduled-maintenance)
}
TRUSTED_FOR_BUILTIN = (Provenance.KERNEL_LOG, Provenance.BUILTIN_CHECK)
SCHEDULED_CONDITION = "ScheduledMaintenance"  # its message names when the event begins (leadTime reads it)
DEFAULT_LEAD_TIME = 3600.0  # cordon and drain this long before an EC2 scheduled event


class Action(enum.StrEnum):
    """What recovery may do to a node. ``cordon``, ``taint``, ``drain`` and ``mark-unhealthy`` are
    disruptive (they take budget); ``uncordon`` gives a recovered node back and never needs budget.
    The device actions (a rule with ``scope: device``, :mod:`agent.recovery.devicescope`) act on one
    device: ``fence-device`` and ``drain-device`` are disruptive (the budget's device rate),
    ``unfence-device`` gives a healed device back (never needs budget)."""

    FENCE_DEVICE = "fence-device"  # a DeviceTaintRule NoSchedule on the device (agent.recovery.fence)
    DRAIN_DEVICE = "drain-device"  # evict only the pods holding the device; the node stays schedulable
    CORDON = "cordon"  # spec.unschedulable=true + the incident annotation
    TAINT = "taint"  # NoSchedule taint TAINT_KEY
    DRAIN = "drain"  # evict the node's pods through the Eviction API
    REBOOT = "reboot"  # EC2 RebootInstances (a ladder's reboot remedy: agent.recovery.ladder)
    MARK_UNHEALTHY = "mark-unhealthy"  # Auto Scaling SetInstanceHealth(Unhealthy)
    UNCORDON = "uncordon"  # only a node we cordoned, after the problem healed for uncordon_after
    UNFENCE_DEVICE = "unfence-device"  # a fenced device whose problem healed or was cleared

    @property
    def disruptive(self) -> bool:
        return self not in (Action.UNCORDON, Action.UNFENCE_DEVICE)

    @property
    def on_device(self) -> bool:
        return self in (Action.FENCE_DEVICE, Action.DRAIN_DEVICE, Action.UNFENCE_DEVICE)


# Order in which a rule's actions run (whatever order the policy file lists them in): a device first.
ACTION_ORDER = (
    Action.FENCE_DEVICE,
    Action.DRAIN_DEVICE,
    Action.CORDON,
    Action.TAINT,
    Action.DRAIN,
    Action.REBOOT,
    Action.MARK_UNHEALTHY,
)
DEVICE_ACTIONS = (Action.FENCE_DEVICE, Action.DRAIN_DEVICE)  # a device rung's actions, in order


class Scope(enum.StrEnum):
    """Where a rule acts first: the node (every rule before devices), or the device its finding names."""

    NODE = "node"
    DEVICE = "device"


DEFAULT_MAX_DEVICES = 2  # more devices failing at once than this: the node's ladder


class Remedy(enum.StrEnum):
    """A rung of a rule's ladder (agent.recovery.ladder): what is tried, in the ladder's order."""

    REBOOT = "reboot"  # cordon, drain, EC2 RebootInstances; then an observation window
    REPLACE = "replace"  # cordon, mark-unhealthy (Auto Scaling replaces the instance)


DEFAULT_WINDOW = 1200.0  # seconds a node is watched after a reboot (Karpenter's 20 min)


class OnDeadline(enum.StrEnum):
    """What a drain does with a pod still there at its per-pod deadline."""

    REPORT = "report"  # leave it, stay cordoned, report (Event + metric)
    DELETE = "delete"  # DELETE the pod (bypasses its PodDisruptionBudget)


class OnFail(enum.StrEnum):
    """What a failed or timed-out validation does (agent.recovery.validationgate)."""

    CLIMB = "climb"  # the ladder's next rung (a device: the node's ladder; reboot: replace)
    HOLD = "hold"  # stay out of service, with a report (an Event), until an operator acts


DEFAULT_VALIDATION_TIMEOUT = 1800.0
DEFAULT_VALIDATION_ATTEMPTS = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationSettings:
    """The checks that must pass after a remedy before the node or device goes back into service."""

    checks: tuple[str, ...]
    timeout: float = DEFAULT_VALIDATION_TIMEOUT  # from the remedy's first request to a pass of every check
    on_fail: OnFail = OnFail.CLIMB
    max_attempts: int = DEFAULT_VALIDATION_ATTEMPTS  # requests per remedy (an inconclusive one asks again)


@dataclass(frozen=True, kw_only=True, slots=True)
class StartupValidation:
    """A new node proves itself once before it takes work (taint: the agent removes UNVALIDATED_TAINT_KEY)."""

    checks: tuple[str, ...]
    taint: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyRule:
    """When condition ``condition`` is True with a reason matching one of ``reasons`` (shell globs,
    ``()`` = any reason) for at least ``persist`` seconds, take ``actions`` (in ACTION_ORDER)."""

    condition: str
    reasons: tuple[str, ...] = ()
    actions: tuple[Action, ...] = (Action.CORDON, Action.MARK_UNHEALTHY)
    persist: float = 0.0
    source: str = ""  # file:line of the rule (for messages)
    sources: tuple[Provenance, ...] = ()  # whose problems it acts on (the condition's owner); () = anyone's
    # act this long before the time the condition's message names (``notBefore=...``: ScheduledMaintenance)
    # instead of as soon as it is True; None = not scheduled
    lead_time: float | None = None
    ladder: tuple[Remedy, ...] = ()  # remedies tried in turn (agent.recovery.ladder); () = ``actions`` only
    window: float = DEFAULT_WINDOW  # observation after a reboot: healthy through it = uncordoned; again = climb
    repeat_count: int = 0  # this many incidents of one reason within repeat_period climb too (0 = off)
    repeat_period: float = 0.0
    # scope device: act on the devices the finding names first (agent.recovery.devicescope), climbing to
    # the node's actions and ladder when more than max_devices fail at once, a device fails again within
    # repeat_period (DEVICE_REPEAT_PERIOD when 0), or fencing is not possible
    scope: Scope = Scope.NODE
    max_devices: int = DEFAULT_MAX_DEVICES
    validation: ValidationSettings | None = None  # None: the policy's default (RecoveryPolicy.validation)

    @property
    def node_actions(self) -> tuple[Action, ...]:
        """The rule's actions on the node (a device rule's climb: cordon when it names none)."""
        own = tuple(a for a in self.actions if not a.on_device)
        return own or (Action.CORDON,)

    @property
    def device_actions(self) -> tuple[Action, ...]:
        """A device rule's actions on the device (both when it names none)."""
        own = tuple(a for a in DEVICE_ACTIONS if a in self.actions)
        return own or DEVICE_ACTIONS


DEVICE_REPEAT_PERIOD = 86_400.0  # a device failing again this soon climbs to the node (a rule without repeat)


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainSettings:
    pod_deadline: float = 300.0  # seconds a single pod may take to leave (evictions retried meanwhile)
    on_deadline: OnDeadline = OnDeadline.REPORT
    evictions_per_second: float = 5.0  # rate cap over the whole drain
    timeout: float = 1800.0  # the whole drain
    wait_for_deletion: float = 120.0  # after eviction, how long to wait for a pod to be gone (deletionTimestamp)


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupBudget:
    """At most ``max_unhealthy`` failure domains disrupted at once among the nodes that share this
    node's value of ``label`` (a zone, a node group or pool): a count or a percentage of the group's
    failure domains (rounded up, at least 1), ``max_unhealthy_cap`` capping a percentage."""

    label: str
    max_unhealthy: int | str
    max_unhealthy_cap: int | None = None


ZONE_LABEL = "topology.kubernetes.io/zone"
POOL_LABELS = (
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "cloud.google.com/gke-nodepool",
    "kubernetes.azure.com/agentpool",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CorrelationSettings:
    """When more than ``share`` (0..1) of a group's nodes, and at least ``min_nodes``, show a problem
    of one condition type at once, or ``new_node_repeats`` of its nodes created within
    ``new_node_window`` seconds do, recovery of that type in the group holds (reports, never acts).
    Groups are the values of ``labels`` (zone, pools)."""

    labels: tuple[str, ...] = (ZONE_LABEL, *POOL_LABELS)
    share: float = 0.3
    min_nodes: int = 3
    new_node_window: float = 3600.0
    new_node_repeats: int = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetSettings:
    """At most ``max_unhealthy`` nodes disrupted by the agent at once and ``max_actions`` disruptive
    actions per ``window`` seconds, across the nodes matching ``node_selector`` (a label selector;
    empty = every node). ``max_unhealthy`` is an int count or a percentage string ("10%", rounded up);
    ``max_unhealthy_cap`` caps a percentage (None = no cap). Both limits apply."""

    max_unhealthy: int | str = "10%"
    max_unhealthy_cap: int | None = 10
    max_actions: int = 10
    window: float = 600.0
    max_device_actions: int = 20  # device steps (fence, drain a device's pods) per window, cluster-wide
    node_selector: str = ""
    groups: tuple[GroupBudget, ...] = ()  # limits per zone / pool, besides the cluster's
    correlation: CorrelationSettings | None = field(default_factory=CorrelationSettings)  # None = never hold


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryPolicy:
    rules: tuple[PolicyRule, ...]
    startup_delay: float = 60.0  # no action in the first seconds after the agent starts (0 = none)
    uncordon_after: float | None = None  # seconds healthy before we uncordon a node we cordoned; None = never
    respect_grace_period: bool = True  # SetInstanceHealth(ShouldRespectGracePeriod=...)
    drain: DrainSettings = field(default_factory=DrainSettings)
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    validation: ValidationSettings | None = None  # the rules' default; None: back into service on silence
    startup_validation: StartupValidation | None = None

    def validation_of(self, rule: PolicyRule | None) -> ValidationSettings | None:
        """The validation set that applies to ``rule``'s remedies (its own, else the policy's)."""
        own = rule.validation if rule is not None else None
        return own if own is not None else self.validation


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeView:
    """What the decision needs to know about the Node object (read fresh before every decision)."""

    name: str
    unschedulable: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    has_our_taint: bool = False
    provider_id: str = ""
    uid: str = ""

    @property
    def control_plane(self) -> bool:
        return any(k in self.labels for k in CONTROL_PLANE_LABELS)

    @property
    def opted_out(self) -> bool:
        return self.labels.get(OPT_OUT_LABEL, "").lower() in ("disabled", "false", "off")


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceFence:
    """What recovery did to one device of an incident (JSON key ``fences`` of the incident record).

    ``device`` is the device's key (``kind:id``, :attr:`agent.core.devices.DeviceRef.key`); ``fence`` the
    fence's outcome (:class:`agent.recovery.fence.FenceOutcome` value; "" before it was tried); ``rule``
    the DeviceTaintRule's name; ``holders`` the pods holding it when looked up, ``evicted`` those the
    device drain moved; ``steps`` the device actions done for it (never repeated)."""

    device: str
    fence: str = ""
    rule: str = ""
    holders: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    steps: tuple[Action, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device,
            "fence": self.fence,
            "rule": self.rule,
            "holders": list(self.holders),
            "evicted": list(self.evicted),
            "steps": [a.value for a in self.steps],
        }


VALIDATION_OUTCOMES = ("", "succeeded", "transient", "permanent")  # "" = open


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationAttempt:
    """One validation request recovery made for an incident (JSON key ``validations`` of the incident).

    ``id`` is the request's (``<incident id>#<number>``); ``remedy`` what it validates (``reboot`` or
    ``unfence-device``) and ``after`` that remedy's time: only results newer count. ``outcome``: ""
    while open, ``succeeded`` (every check passed), ``transient`` (inconclusive, or lost with a restart:
    asked again while attempts are left), ``permanent`` (a fail, or the timeout: never asked again)."""

    number: int
    id: str
    remedy: str
    checks: tuple[str, ...]
    devices: tuple[str, ...]
    after: float
    requested_at: float
    outcome: str = ""
    reason: str = ""  # ValidationPassed, ValidationFailed, ValidationTimedOut, ValidationInconclusive, ValidationLost
    message: str = ""
    settled_at: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "number": self.number,
            "id": self.id,
            "remedy": self.remedy,
            "checks": list(self.checks),
            "devices": list(self.devices),
            "after": self.after,
            "requestedAt": self.requested_at,
            "outcome": self.outcome,
            "reason": self.reason,
            "message": self.message,
            "settledAt": self.settled_at,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Incident:
    """One problem episode and what recovery did about it, stored on the Node (INCIDENT_ANNOTATION).

    ``id`` is stable for the episode: ``<condition>/<reason>/<node uid or name>/<since as int>``.
    ``done`` lists the actions completed (never repeated); ``cordoned_by_us`` is False when the node
    was already unschedulable before we looked (then we never uncordon it). ``healthy_since`` is set
    while the triggering condition is no longer True (drives uncordon_after and clean-up).
    """

    id: str
    condition: str
    reason: str
    since: float  # when the condition became True (its lastTransitionTime)
    opened: float  # when recovery first saw it
    done: tuple[Action, ...] = ()
    cordoned_by_us: bool = False
    drain: str = ""  # "" | "running" | "done" | "deadline" | "timeout" | "failed"
    budget_held: bool = False  # this node holds a place in the cluster budget for this incident
    healthy_since: float | None = None
    dry_run: bool = False  # decided while ENABLE_RECOVERY was off: "done" lists what would have been done
    # The agent (a token per process) that is about to mark the instance, and since when: another agent
    # claiming the same node name stands back (agent.recovery.node.claim_mark).
    claim: str = ""
    claimed_at: float | None = None
    evidence: tuple[str, ...] = ()  # where the diagnostics bundles taken before a remedy are (agent.recovery.bundle)
    fences: tuple[DeviceFence, ...] = ()  # a device-scope incident's devices (agent.recovery.devicescope)
    validations: tuple[ValidationAttempt, ...] = ()  # the validation gate's requests (agent.recovery.validationgate)

    def fence_of(self, device: str) -> DeviceFence | None:
        return next((f for f in self.fences if f.device == device), None)

    def to_json(self) -> dict:
        """The annotation body (a JSON object; ``agent.recovery.incident`` reads and writes it)."""
        claim = {"claim": self.claim, "claimedAt": self.claimed_at} if self.claim else {}
        extra: dict[str, object] = {"evidence": list(self.evidence)} if self.evidence else {}
        if self.fences:  # "fences" sorts after "done": the admission policy's cordon regex is unaffected
            extra["fences"] = [f.to_json() for f in self.fences]
        if self.validations:  # sorts after "since": the cordon regex is unaffected
            extra["validations"] = [v.to_json() for v in self.validations]
        return (
            claim
            | extra
            | {
                "id": self.id,
                "condition": self.condition,
                "reason": self.reason,
                "since": self.since,
                "opened": self.opened,
                "done": [a.value for a in self.done],
                "cordonedByUs": self.cordoned_by_us,
                "drain": self.drain,
                "budgetHeld": self.budget_held,
                "healthySince": self.healthy_since,
                "dryRun": self.dry_run,
            }
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetView:
    """The cluster budget as last read: whether this node may take one more disruptive step now."""

    holders: tuple[str, ...]  # failure domains (node name or UltraServer id) holding a place
    limit: int  # max_unhealthy resolved against the matching node count
    actions_in_window: int
    max_actions: int
    this_node_holds: bool  # this node's failure domain already holds a place
    problem: str = ""  # why the budget cannot be used at all (e.g. a corrupt Lease); non-empty = can_start False
    group_full: str = ""  # which zone/pool budget has no place for this node ("" = none refuses)
    correlated: str = ""  # why this node's group holds for a correlated failure ("" = it does not)
    granted: bool = False  # returned by an acquire that took this step for this node (it wrote the Lease)
    window: float = 0.0  # the action window (seconds), for messages
    frees_at: float | None = None  # when the oldest step in the window leaves it (None: no step in it)
    device_actions_in_window: int = 0  # device steps in the window (their own rate: max_device_actions)
    max_device_actions: int = 0
    future_actions: int = 0  # step times found later than now + the allowed clock skew (counted as that)
    skew: float = 0.0  # the allowed clock skew they were clamped to
    counting: str = ""  # no census of the fleet yet: the node counting it (agent.recovery.census)

    @property
    def why_blocked(self) -> str:
        """What keeps a new disruptive step from starting, in words ("" when nothing does)."""
        if self.problem:
            return self.problem
        if self.can_start:
            return ""
        causes = []
        if not (self.this_node_holds or len(self.holders) < self.limit):
            if self.limit == 0 and self.counting:
                causes.append(f"the fleet is being counted by {self.counting} (no census yet: 0 places)")
            elif self.limit == 0:
                causes.append("no node matches the budget's node selector (0 places)")
            else:
                causes.append(f"{len(self.holders)} of {self.limit} places held: {', '.join(self.holders)}")
        if self.actions_in_window >= self.max_actions:
            frees = f"; one frees at {iso(self.frees_at)}" if self.frees_at is not None else ""
            causes.append(
                f"{self.actions_in_window} of {self.max_actions} disruptive steps in the last "
                f"{format_duration(self.window)} used{frees}"
            )
        if self.future_actions:
            causes.append(
                f"{self.future_actions} step times in the budget Lease lie more than {format_duration(self.skew)} "
                "in the future (a node with a fast clock, or a hand edit): each counts as made "
                f"{format_duration(self.skew)} from now"
            )
        return "; ".join(causes)

    @property
    def why_device_blocked(self) -> str:
        """What keeps a new device step from starting, in words ("" when nothing does): its own rate."""
        if self.problem or self.correlated:
            return self.problem or self.correlated
        if self.max_device_actions and self.device_actions_in_window >= self.max_device_actions:
            return (
                f"{self.device_actions_in_window} of {self.max_device_actions} device steps in the last "
                f"{format_duration(self.window)} used"
            )
        return ""

    @property
    def can_start(self) -> bool:
        """A new disruptive step is allowed (holding a place already counts as allowed for the place).

        A granted view allows the step it was granted for, although counting it may have filled the window."""
        if self.problem or self.correlated:
            return False
        if self.granted:
            return True
        room = self.this_node_holds or (len(self.holders) < self.limit and not self.group_full)
        return room and self.actions_in_window < self.max_actions


class Blocked(enum.StrEnum):
    """Why a decision takes no (further) action now."""

    STARTUP_DELAY = "StartupDelay"
    PERSIST = "WaitingForPersistence"
    BUDGET = "RecoveryBlocked"  # the cluster budget is spent (Event reason RecoveryBlocked)
    CORRELATED = "RecoveryHeldCorrelated"  # the node's zone or pool fails together: report and wait
    CONTROL_PLANE = "ControlPlaneNode"
    OPTED_OUT = "OptedOut"
    NOTHING_LEFT = "NothingLeft"  # every action of the rule is done
    DISABLED = "RecoveryDisabled"  # report only, but the open incident was acted on for real: kept as recorded


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """What to do now. ``actions`` run in order; ``incident`` is the record to store *before* the
    first action (None = remove the annotation: no open incident); ``release_budget`` gives this
    node's place back; ``blocked`` says why nothing (more) happens now."""

    actions: tuple[Action, ...] = ()
    incident: Incident | None = None
    release_budget: bool = False
    blocked: Blocked | None = None
    rule: PolicyRule | None = None
    message: str = ""
    validation: ValidationNote | None = None  # the validation gate's request to put and Event to tell


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationNote:
    """What the validation gate asks of the loop this step: put ``request`` into the inbox (after the
    incident that records it is stored), and tell ``reason``/``message`` (once per incident and ``once``)."""

    request: ValidationRequest | None = None
    reason: str = ""
    message: str = ""
    warning: bool = False
    once: str = ""
