"""Small internal types shared by sources, detectors, state and sinks.

They are deliberately independent of the Kubernetes API objects: sinks translate them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.core.clears import ClearRecord
    from agent.core.devices import DeviceProblem, DeviceRef
    from agent.core.validation import ValidationRecord, ValidationRequest


class RuleType(enum.StrEnum):
    """NPD rule type: a temporary problem is an Event, a permanent one sets a condition."""

    TEMPORARY = "temporary"
    PERMANENT = "permanent"


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """Order of seriousness: info < warning < error < critical."""
        return list(Severity).index(self)


class Provenance(enum.StrEnum):
    """What kind of source owns a condition type (recovery policy rules say which they trust)."""

    KERNEL_LOG = "kernel-log"  # the kmsg rule packs, built-in or not: the line came from the kernel
    LOG_MONITOR = "log-monitor"  # a filelog or journald monitor (files and journals others can write)
    BUILTIN_CHECK = "builtin-check"  # a check shipped with the agent (plugins/<domain>/)
    CHECK = "check"  # a third-party Python check (entry point)
    CUSTOM_PLUGIN = "custom-plugin"  # an executable of a node-problem-detector custom-plugin file


class Status(enum.StrEnum):
    """Node condition status. For our problem conditions ``True`` means the problem is present."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, kw_only=True, slots=True)
class LogRecord:
    """One kernel/log line as read by a source. A source never decides anything about it.

    ``timestamp`` is wall-clock seconds since the epoch; ``seq`` the kmsg sequence number (or the
    1-based input line number for file sources); ``priority``/``facility`` are syslog values when known.
    """

    message: str
    timestamp: float
    seq: int | None = None
    priority: int | None = None
    facility: int | None = None
    monotonic_usec: int | None = None
    continuation: bool = False
    fields: Mapping[str, str] = field(default_factory=dict)  # kmsg dictionary (" KEY=value") lines
    source: str = "kmsg"


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """What a detector concluded from input: a rule match or a check result.

    ``status`` is the condition status a permanent finding asks for (``True`` = problem present;
    check plugins may also report ``False`` = healthy again, or ``Unknown``).
    """

    rule: str
    type: RuleType
    condition: str | None
    reason: str
    severity: Severity
    message: str
    timestamp: float
    source: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    line: int | None = None
    status: Status = Status.TRUE
    device: DeviceRef | None = None  # the device the line names (the rule's ``device`` field); None: the node


# Condition types that others own and act on. Ours are True while a problem is present; these mean
# the opposite (True = healthy), so writing one would invert it: a node whose Ready is False loses
# every pod to the node lifecycle controller, and EKS / Karpenter node auto repair replaces a node
# whose *Ready condition is False. No configuration, plugin or check may declare them.
RESERVED_CONDITION_TYPES: Mapping[str, str] = {
    "Ready": "kubelet",
    "MemoryPressure": "kubelet",
    "DiskPressure": "kubelet",
    "PIDPressure": "kubelet",
    "NetworkUnavailable": "kubelet and the network plugin",
    "ContainerRuntimeReady": "the EKS node monitoring agent (node auto repair acts on it)",
    "KernelReady": "the EKS node monitoring agent (node auto repair acts on it)",
    "NetworkingReady": "the EKS node monitoring agent (node auto repair acts on it)",
    "StorageReady": "the EKS node monitoring agent (node auto repair acts on it)",
    "AcceleratedHardwareReady": "the agent's own aggregate condition (--aggregate-condition; EKS and Karpenter "
    "node auto repair act on it)",
}


def reserved_condition(type_: str) -> str | None:
    """Why ``type_`` may not be declared (it belongs to someone else), or None when it may."""
    owner = RESERVED_CONDITION_TYPES.get(type_)
    if owner is None:
        return None
    return (
        f"condition type {type_!r} is reserved: it belongs to {owner}, where True means healthy; "
        "node-health-agent conditions are True while a problem is present, so it never writes this type. "
        "Choose a type name of your own"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ConditionSpec:
    """A condition type a rule pack owns, with its healthy default."""

    type: str
    reason: str
    message: str
    clear_after: float | None = None  # seconds of quiet after which a True condition heals; None = never
    source: str = ""
    accelerator: bool = False  # a critical problem here makes AcceleratedHardwareReady False
    cloudwatch_namespace: str | None = None  # the pack's cloudwatchNamespace (None = NeuronHealthCheck)
    declared_in: str = field(default="", compare=False)  # file:line of the declaration, for messages only
    provenance: Provenance | None = None  # who owns it, set when the configuration is assembled


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition:
    type: str
    status: Status
    reason: str
    message: str
    last_transition: float
    last_update: float  # last time a finding confirmed this status (drives clear_after)
    severity: Severity = Severity.INFO
    fields: Mapping[str, Any] = field(default_factory=dict)
    devices: tuple[DeviceProblem, ...] = ()  # the devices whose problems hold this condition (may be empty)


@dataclass(frozen=True, kw_only=True, slots=True)
class PodRef:
    """A Pod on this node that an Event is about (the Event's involvedObject; the Node is its ``related``)."""

    namespace: str
    name: str
    uid: str | None = None  # the Pod's uid where known (the kubelet's pod-resources answer carries none)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """Something to tell the world once: a temporary problem or a condition transition (about this Node),
    or a device fault told to a Pod that holds the device (``pod``)."""

    type: str  # "Warning" | "Normal" (Kubernetes Event types)
    reason: str
    message: str
    timestamp: float
    source: str
    severity: Severity
    condition: str | None = None  # set for condition transitions
    status: Status | None = None  # new status for condition transitions
    rule: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    pod: PodRef | None = None  # None: the Event is about this Node (as every Event was before pod Events)


@dataclass(frozen=True, kw_only=True, slots=True)
class Snapshot:
    """An immutable view of NodeState that sinks read."""

    conditions: tuple[Condition, ...]
    generated_at: float
    problem_counts: Mapping[str, int] = field(default_factory=dict)  # reason -> occurrences (NPD problem_counter)
    problem_pairs: tuple[tuple[str, str], ...] = ()  # (condition type, reason) seen, for problem_gauge zeros
    reasons_overflowed: Mapping[str, int] = field(default_factory=dict)  # owner -> problems counted as "Other"
    generation: int = 0  # increases whenever a condition changes
    seeded: bool = True  # the Node's (or the state directory's) conditions were adopted: safe to write
    node_uid: str | None = None  # the Node's uid once read (for Events' involvedObject)
    provenance: Mapping[str, Provenance] = field(default_factory=dict)  # condition type -> who owns it
    clears: tuple[ClearRecord, ...] = ()  # the operator's clears handled, newest last (agent.core.clears)
    validations: tuple[ValidationRecord, ...] = ()  # newest per (check, device) (agent.core.validation)
    validation_requests: tuple[ValidationRequest, ...] = ()  # the open ones

    def condition(self, type_: str) -> Condition | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None
