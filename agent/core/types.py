"""Small internal types shared by sources, detectors, state and sinks.

They are deliberately independent of the Kubernetes API objects: sinks translate them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload


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


class RecordColumns(Sequence[LogRecord]):
    """Records in read order as columns: each one's message, time and sequence number, and its
    ``LogRecord`` built only when asked for (indexing, iterating).

    The kernel log reader hands the main loop these: matching, the replay policy, the cursor and the
    diagnostics ring read only the columns, so a busy node does not build an object per record, which
    was the largest part of the agent's CPU per record (issue 16). ``rows[i]`` is what ``make`` builds
    record ``i`` from (for :meth:`of`, the record itself). Equal to any sequence of the same records.

    ``raw_lines``: where the reader has them, the records' bytes as the kernel printed them, one ``\n``-ended
    line a record holding its message verbatim (no escapes, no dictionary lines): the rule prefilter scans
    these in place of the messages joined (issue 16: cutting out every message cost more than scanning the
    headers too). A literal a message holds is in its line; one found in a header only makes the line a
    candidate the rules' regexes then turn down. None otherwise, and for a slice.
    """

    __slots__ = ("messages", "timestamps", "seqs", "_rows", "_make", "raw_lines")

    def __init__(
        self,
        *,
        messages: Sequence[str],
        timestamps: Sequence[float],
        seqs: Sequence[int | None],
        rows: Sequence[Any],
        make: Callable[[Any], LogRecord],
        raw_lines: bytes | None = None,
    ) -> None:
        self.messages = messages
        self.timestamps = timestamps
        self.seqs = seqs
        self._rows = rows
        self._make = make
        self.raw_lines = raw_lines

    @classmethod
    def of(cls, records: Sequence[LogRecord]) -> RecordColumns:
        """``records`` as columns (themselves when they are)."""
        if isinstance(records, RecordColumns):
            return records
        return cls(
            messages=[r.message for r in records],
            timestamps=[r.timestamp for r in records],
            seqs=[r.seq for r in records],
            rows=records,
            make=_itself,
        )

    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, index: int) -> LogRecord: ...

    @overload
    def __getitem__(self, index: slice) -> RecordColumns: ...

    def __getitem__(self, index: int | slice) -> LogRecord | RecordColumns:
        if isinstance(index, slice):
            return RecordColumns(
                messages=self.messages[index],
                timestamps=self.timestamps[index],
                seqs=self.seqs[index],
                rows=self._rows[index],
                make=self._make,
            )
        return self._make(self._rows[index])

    def __eq__(self, other: object) -> bool:
        equal = _items_equal(self, other)
        return NotImplemented if equal is None else equal

    __hash__ = None  # type: ignore[assignment]  # a sequence of records, compared by content

    def __repr__(self) -> str:
        return f"RecordColumns({list(self)!r})"


def _items_equal(mine: Sequence[Any], other: object) -> bool | None:
    """Whether ``other`` is a sequence (not text) of items equal to ``mine``'s, in order; None when it is no
    sequence (``__eq__`` then answers NotImplemented): the ``==`` of the lazily built sequences here."""
    if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
        return len(mine) == len(other) and all(a == b for a, b in zip(mine, other, strict=True))
    return None


def _itself(record: LogRecord) -> LogRecord:
    return record


_T = TypeVar("_T")
_S = TypeVar("_S")


class Mapped(Sequence[_T]):
    """``read`` of each of ``items``, worked out when asked for (an index, a slice, iterating): the columns'
    per-record fields that matching reads for a few lines of a chunk only (issue 16)."""

    __slots__ = ("_items", "_read")

    def __init__(self, items: Sequence[_S], read: Callable[[_S], _T]) -> None:
        self._items = items
        self._read = read

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> Mapped[_T]: ...

    def __getitem__(self, index: int | slice) -> _T | Mapped[_T]:
        if isinstance(index, slice):
            return Mapped(self._items[index], self._read)
        return self._read(self._items[index])

    def __iter__(self) -> Iterator[_T]:
        return map(self._read, self._items)


# How much earlier than the first of a run of kernel log records (in the order the kernel logged them) a
# later one's time can be: the CPUs' clocks differ by microseconds, a printk preempted between taking its
# time and taking its place in the log waits milliseconds at most (see ``MicrosecondTimes.at_least``).
KERNEL_ORDER_SLACK = 1.0


class MicrosecondTimes(Sequence[float]):
    """Times given as microseconds (decimal text, as the kernel prints them) after ``base`` seconds, each
    one's ``base + micros / 1e6`` worked out only when read: matching reads the times of the lines a
    rule looks at, not of every record (issue 16). Equal to any sequence of the same floats.

    ``logged_order``: the times are of kernel log records read in the order the kernel logged them (one read
    of its device), none earlier than the first by more than ``KERNEL_ORDER_SLACK``."""

    __slots__ = ("_micros", "_base", "_logged_order")

    def __init__(self, *, micros: Sequence[str], base: float, logged_order: bool = False) -> None:
        self._micros = micros
        self._base = base
        self._logged_order = logged_order

    def __len__(self) -> int:
        return len(self._micros)

    @overload
    def __getitem__(self, index: int) -> float: ...

    @overload
    def __getitem__(self, index: slice) -> MicrosecondTimes: ...

    def __getitem__(self, index: int | slice) -> float | MicrosecondTimes:
        if isinstance(index, slice):
            in_order = self._logged_order and index.step in (None, 1)
            return MicrosecondTimes(micros=self._micros[index], base=self._base, logged_order=in_order)
        return self._base + int(self._micros[index]) / 1e6

    def at_least(self, oldest: float) -> bool:
        """Whether no time is before ``oldest``. In logged order, a first time ``KERNEL_ORDER_SLACK`` or more
        after ``oldest`` answers it without reading the others (the replay policy asks for every batch read,
        and every one read live is that new)."""
        if self._logged_order and self._micros and self[0] - KERNEL_ORDER_SLACK >= oldest:
            return True
        return not self._micros or self.earliest() >= oldest

    def __iter__(self) -> Iterator[float]:
        base = self._base
        return iter([base + micros / 1e6 for micros in map(int, self._micros)])

    def earliest(self) -> float:
        """``min(self)`` without working out every time (the sum is monotonic in the microseconds)."""
        return self._base + min(map(int, self._micros)) / 1e6

    def __eq__(self, other: object) -> bool:
        equal = _items_equal(self, other)
        return NotImplemented if equal is None else equal

    __hash__ = None  # type: ignore[assignment]  # a sequence, compared by content

    def __repr__(self) -> str:
        return f"MicrosecondTimes({list(self)!r})"


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


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """Something to tell the world once: a temporary problem or a condition transition."""

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

    def condition(self, type_: str) -> Condition | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None
