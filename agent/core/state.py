"""NodeState: the single source of truth, a fold of findings into conditions, counts and events.

Every transition happens here, including the way back to healthy: a check reporting healthy
again (a ``False`` finding), or ``clearAfter`` seconds without a new match for log-derived
conditions. Sinks (Kubernetes, Prometheus, logs, CloudWatch) only read ``Snapshot``s and the
``Event``s returned by ``apply``/``expire``, so they can never disagree.

Rules for a condition that is already ``True``: a new finding with a different reason replaces
the reason only when it is at least as severe (a critical Xid 79 is not overwritten by a later
warning); ``lastTransitionTime`` changes only when the status changes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from agent.core.bounds import ProblemCounts
from agent.core.clears import ClearRecord, device_matches, merged
from agent.core.devices import DeviceProblem
from agent.core.durations import format_duration
from agent.core.types import (
    Condition,
    ConditionSpec,
    Event,
    Finding,
    Provenance,
    RuleType,
    Severity,
    Snapshot,
    Status,
)
from agent.core.validation import ValidationBook, ValidationRecord

log = logging.getLogger(__name__)


AGGREGATE_TYPE = "AcceleratedHardwareReady"
AGGREGATE_HEALTHY_REASON = "AcceleratedHardwareIsReady"
AGGREGATE_HEALTHY_MESSAGE = "no fatal accelerator problem"
MAX_DEVICES = 64  # devices one condition tracks (a node has at most a few dozen; lines can name any)
MAX_NAMED = 8  # devices a condition's message names (the rest: "and N more")


def event_type(severity: Severity) -> str:
    """Kubernetes Event type for a problem of this severity."""
    return "Normal" if severity is Severity.INFO else "Warning"


class NodeState:
    """Conditions and problem counts of this node. Not thread-safe: one owner (the main loop)."""

    def __init__(
        self,
        *,
        conditions: Sequence[ConditionSpec],
        clock: Callable[[], float],
        reasons: Iterable[str] = (),
        problem_pairs: Iterable[tuple[str, str]] = (),
        aggregate: bool = False,
        seeded: bool = True,
    ) -> None:
        """``seeded=False`` marks the state as not yet reconciled with the Node's existing conditions
        (Kubernetes mode before the Node was read): writers must wait for :meth:`seed`.

        ``aggregate`` adds condition AcceleratedHardwareReady: False (a problem) while any condition
        marked ``accelerator`` is True with a critical problem, True otherwise (the condition EKS node
        auto repair and Karpenter node repair act on). Its polarity is the opposite of ours."""
        self._clock = clock
        self._specs = {c.type: c for c in conditions}
        self._provenance = _provenance(self._specs)
        self._aggregate = aggregate
        self._touched: set[str] = set()  # types changed since start (seeding never overrides them)
        self._restored: set[str] = set()  # types restored from our own state directory (fresher than the Node)
        self._seeded = seeded
        self._node_uid: str | None = None
        self._node_scoped: set[str] = set()  # True types held (also) by a finding that named no device
        self._base_message: dict[str, str] = {}  # type -> its message before the devices were named
        now = clock()
        self._conditions: dict[str, Condition] = {
            c.type: Condition(
                type=c.type,
                status=Status.FALSE,
                reason=c.reason,
                message=c.message,
                last_transition=now,
                last_update=now,
            )
            for c in conditions
        }
        if aggregate:
            self._conditions[AGGREGATE_TYPE] = Condition(
                type=AGGREGATE_TYPE,
                status=Status.TRUE,
                reason=AGGREGATE_HEALTHY_REASON,
                message=AGGREGATE_HEALTHY_MESSAGE,
                last_transition=now,
                last_update=now,
            )
        # problem_counter / problem_gauge figures, at most MAX_REASONS undeclared reasons per owner
        self._problems = ProblemCounts(reasons=reasons, pairs=problem_pairs)
        self._generation = 0
        self._clears: tuple[ClearRecord, ...] = ()  # the operator's clears handled (the boundaries), newest last
        self.validation = ValidationBook()  # the active checks' records and the open requests

    @property
    def clears(self) -> tuple[ClearRecord, ...]:
        return self._clears

    def keep_clears(self, records: tuple[ClearRecord, ...]) -> bool:
        """Adopt clear records (ours first, then the Node's): whether any was new."""
        combined = merged(self._clears, records)
        if combined == self._clears:
            return False
        self._clears = combined
        self._generation += 1
        return True

    def record_clear(self, record: ClearRecord) -> None:
        """A clear just handled (applied or refused): kept with the others, the newest last."""
        self._clears = merged((*self._clears, record), ())
        self._generation += 1

    @property
    def generation(self) -> int:
        """Increases on every change of a condition (status, reason or message)."""
        return self._generation

    @property
    def owned_types(self) -> tuple[str, ...]:
        return tuple(self._conditions)

    def declare(self, conditions: Sequence[ConditionSpec]) -> None:
        """Conditions declared by a reloaded configuration: new types start healthy; known ones keep
        their state with the new defaults. Types no longer declared keep theirs until a restart."""
        now = self._clock()
        for spec in conditions:
            if spec.type not in self._conditions:
                self._conditions[spec.type] = Condition(
                    type=spec.type,
                    status=Status.FALSE,
                    reason=spec.reason,
                    message=spec.message,
                    last_transition=now,
                    last_update=now,
                )
                self._generation += 1
            self._specs[spec.type] = spec
        self._provenance = _provenance(self._specs)  # a new mapping: snapshots already published keep theirs

    def restore(self, conditions: Iterable[Condition]) -> list[Event]:
        """Adopt the conditions our own state directory kept (with their severity, transition times and
        devices: a per-device problem comes back per device, its device clearable and healing alone).

        They are at least as fresh as the Node's copy, so a later :meth:`seed` leaves them alone, and
        the state counts as seeded: a restart needs no API server to stay consistent.
        """
        restored = [c for c in conditions if c.type in self._conditions and c.type not in self._touched]
        events = self._adopt(restored)
        self._restored.update(c.type for c in restored)
        self._seeded = True
        return events

    def seed(self, conditions: Iterable[Condition], *, node_uid: str | None = None) -> list[Event]:
        """Adopt conditions read back from the Node at startup, for the types we own.

        Keeps their status, reason, message and transition time, so a restart neither resets a
        problem to healthy nor moves ``lastTransitionTime``. Types that already changed since
        start, or were restored from the state directory, keep our fresher state. Returns events
        only if the aggregate condition changes. The Node's conditions name no devices (Kubernetes has no
        per-device condition; the message text is not read back): a problem seeded from them is node-scoped.
        """
        if node_uid:
            self._node_uid = node_uid
        fresh = [c for c in conditions if c.type not in self._restored]
        self._seeded = True
        self._generation += 1  # publish the seeded flag even when nothing else changed
        return self._adopt(fresh)

    def restore_validations(self, records: Iterable[ValidationRecord]) -> None:
        """Adopt the validation records read back from the Node at startup (ours, when newer, win). A fault may
        have come while the agent was down, so a restored pass is voided on every device a True condition
        holds now, and everywhere when one holds the node as a whole (a seeded condition names no device)."""
        records = tuple(records)
        if not records:
            return
        mine = {r.key for r in self.validation.records}
        self.validation.record(r for r in records if r.key not in mine)
        for cond in self._conditions.values():
            if cond.status is not Status.TRUE or cond.type == AGGREGATE_TYPE:
                continue
            cause = f"{cond.type}/{cond.reason} (true when the agent started)"
            if cond.type in self._node_scoped or not cond.devices:
                self.validation.void(device=None, cause=cause)
            for problem in cond.devices:
                self.validation.void(device=problem.device.key, cause=cause)

    def _adopt(self, conditions: Iterable[Condition]) -> list[Event]:
        for cond in conditions:
            if cond.type in self._conditions and cond.type not in self._touched:
                self._conditions[cond.type] = cond
                if cond.status is Status.TRUE and not cond.devices:
                    self._node_scoped.add(cond.type)  # a problem read back names no device: the node's
                if cond.status is Status.TRUE and cond.devices:  # restored: the message names them already
                    self._base_message[cond.type] = _unnamed(cond.message, cond.devices)
                if cond.status is Status.TRUE and cond.type in self._specs:
                    self._problems.pair(cond.type, cond.reason)
                self._generation += 1
        return self._update_aggregate(self._clock())

    def apply(self, finding: Finding) -> list[Event]:
        """Fold one finding in; return the events it produces (maybe none)."""
        events = self._apply(finding)
        if events and self._aggregate:
            events.extend(self._update_aggregate(self._clock()))
        return events

    def _apply(self, finding: Finding) -> list[Event]:
        now = self._clock()
        if finding.type is RuleType.TEMPORARY:
            self._problems.count(finding.rule, finding.reason)
            return [
                Event(
                    type=event_type(finding.severity),
                    reason=finding.reason,
                    message=finding.message,
                    timestamp=finding.timestamp,
                    source=finding.source,
                    severity=finding.severity,
                    rule=finding.rule,
                    fields=finding.fields,
                )
            ]
        if finding.condition is None or finding.condition not in self._specs:
            log.warning("finding for undeclared condition %r from rule %s ignored", finding.condition, finding.rule)
            return []
        current = self._conditions[finding.condition]
        if finding.status is Status.TRUE:
            self._void_passes(current, finding)
            return self._set_problem(current, finding, now)
        if finding.device is not None and current.status is Status.TRUE and self._device_healed(current, finding):
            return []
        spec = self._specs[finding.condition]
        reason = spec.reason if finding.status is Status.FALSE else finding.reason
        message = spec.message if finding.status is Status.FALSE else finding.message
        if current.status is finding.status and current.reason == reason:
            self._conditions[current.type] = _replace(current, last_update=now)
            return []
        return [
            self._transition(
                current,
                status=finding.status,
                reason=reason,
                message=message,
                now=now,
                severity=finding.severity,
                source=finding.source,
                rule=finding.rule,
                fields={},
            )
        ]

    def _set_problem(self, current: Condition, finding: Finding, now: float) -> list[Event]:
        devices, opened = _with_device(current.devices if current.status is Status.TRUE else (), finding, now)
        if finding.device is None:
            self._node_scoped.add(current.type)
        if current.status is Status.TRUE:
            same = current.reason == finding.reason
            weaker = finding.severity.rank < current.severity.rank
            if same or weaker:
                if opened:  # another device: the message names it
                    self._set_devices(current, devices, last_update=now)
                else:
                    self._conditions[current.type] = _replace(current, last_update=now, devices=devices)
                return []
        self._problems.count(current.type, finding.reason)
        self._problems.pair(current.type, finding.reason)
        return [
            self._transition(
                current,
                status=Status.TRUE,
                reason=finding.reason,
                message=finding.message,
                now=now,
                severity=finding.severity,
                source=finding.source,
                rule=finding.rule,
                fields=finding.fields,
                # NPD uses the log time as transition time; never in the future of our clock.
                transition_time=min(finding.timestamp, now) if finding.timestamp else now,
                devices=devices,
            )
        ]

    def _void_passes(self, current: Condition, finding: Finding) -> None:
        """A new fault (the condition turns True, or a device it did not hold yet) voids the passes on its
        device at once; a fault that names no device voids every pass."""
        device = finding.device.key if finding.device is not None else None
        new = current.status is not Status.TRUE or (device is not None and not _holds(current.devices, device))
        if new:
            self.validation.void(device=device, cause=f"{current.type}/{finding.reason}")

    def _device_healed(self, current: Condition, finding: Finding) -> bool:
        """A healthy finding about one device of a True condition: that device's problem closes. True when
        the condition stays True (other devices, or a problem that named none, still hold it)."""
        assert finding.device is not None
        left = tuple(d for d in current.devices if d.device.key != finding.device.key)
        if not left and current.type not in self._node_scoped:
            return False  # the last device healed: the condition heals as a whole
        if len(left) != len(current.devices):
            self._set_devices(current, left, last_update=current.last_update)
        return True

    def _set_devices(self, current: Condition, devices: tuple[DeviceProblem, ...], *, last_update: float) -> None:
        """The condition with another set of devices (its status and reason unchanged; its message names them)."""
        base = self._base_message.get(current.type, current.message)
        self._conditions[current.type] = _replace(
            current, devices=devices, message=_named(base, devices), last_update=last_update
        )
        self._generation += 1

    def _transition(
        self,
        current: Condition,
        *,
        status: Status,
        reason: str,
        message: str,
        now: float,
        severity: Severity,
        source: str,
        rule: str | None,
        fields: object,
        transition_time: float | None = None,
        devices: tuple[DeviceProblem, ...] = (),
    ) -> Event:
        changed_status = current.status is not status
        if status is Status.TRUE:
            self._base_message[current.type] = message
        else:
            self._base_message.pop(current.type, None)
            self._node_scoped.discard(current.type)
        updated = Condition(
            type=current.type,
            status=status,
            reason=reason,
            message=_named(message, devices) if status is Status.TRUE else message,
            last_transition=(transition_time if transition_time is not None else now)
            if changed_status
            else current.last_transition,
            last_update=now,
            severity=severity if status is Status.TRUE else Severity.INFO,
            fields=dict(fields) if isinstance(fields, dict) else {},
            devices=devices if status is Status.TRUE else (),
        )
        self._conditions[current.type] = updated
        self._touched.add(current.type)
        self._generation += 1
        return Event(
            type="Warning" if status is not Status.FALSE else "Normal",
            reason=reason,
            message=f"Node condition {current.type} is now: {status.value}, reason: {reason}, message: "
            f"{updated.message!r}",
            timestamp=now,
            source=source or self._specs[current.type].source,
            severity=severity if status is not Status.FALSE else Severity.INFO,
            condition=current.type,
            status=status,
            rule=rule,
            fields=updated.fields,
        )

    def clear(self, condition: str, *, device: str | None, force: bool, note: str) -> tuple[bool, str, list[Event]]:
        """An operator's clear of ``condition`` (only ``device``'s problems when given): ``(applied, what
        happened or why refused, events)``. The condition goes False when no device and no problem that named
        none is left. A device it does not see failing is refused unless ``force``."""
        spec = self._specs.get(condition)
        current = self._conditions.get(condition)
        if spec is None or current is None:
            return False, f"{condition} is not a condition this agent owns", []
        if current.status is not Status.TRUE:
            return True, f"{condition} was not True; the boundary holds back the records before it", []
        now = self._clock()
        if device is not None:
            left = tuple(d for d in current.devices if not device_matches(d.device, device))
            if len(left) == len(current.devices):
                if not force:
                    return False, f"device {device} is not failing in {condition} (--force clears it anyway)", []
                return True, f"device {device} was not failing in {condition}; the boundary holds it back", []
            if left or condition in self._node_scoped:
                self._set_devices(current, left, last_update=now)
                self._touched.add(condition)
                return True, f"device {device} cleared; {condition} stays True (other problems remain)", []
        events = [
            self._transition(
                current,
                status=Status.FALSE,
                reason=spec.reason,
                message=f"{spec.message} (cleared: {note})",
                now=now,
                severity=Severity.INFO,
                source=spec.source,
                rule=None,
                fields={},
            )
        ]
        if self._aggregate:
            events.extend(self._update_aggregate(now))
        return True, f"{condition} is now False", events

    def expire(self) -> list[Event]:
        """Heal conditions whose ``clearAfter`` quiet period has passed."""
        now = self._clock()
        events = []
        for type_, cond in list(self._conditions.items()):
            spec = self._specs.get(type_)
            if spec is None:
                continue
            if cond.status is Status.TRUE and spec.clear_after and now - cond.last_update < spec.clear_after:
                self._expire_devices(cond, spec.clear_after, now)
            elif cond.status is Status.TRUE and spec.clear_after:
                events.append(
                    self._transition(
                        cond,
                        status=Status.FALSE,
                        reason=spec.reason,
                        message=f"{spec.message} (cleared after {format_duration(spec.clear_after)} without "
                        f"a new {cond.reason})",
                        now=now,
                        severity=Severity.INFO,
                        source=spec.source,
                        rule=None,
                        fields={},
                    )
                )
        if events and self._aggregate:
            events.extend(self._update_aggregate(now))
        return events

    def _expire_devices(self, cond: Condition, clear_after: float, now: float) -> None:
        """Devices of a condition still held by others that were quiet for ``clearAfter`` heal alone."""
        left = tuple(d for d in cond.devices if now - d.last_update < clear_after)
        if len(left) == len(cond.devices):
            return
        if not left and cond.type not in self._node_scoped:
            left = cond.devices[-1:]  # never none while True: the condition itself heals when it is quiet
            if len(left) == len(cond.devices):
                return
        self._set_devices(cond, left, last_update=cond.last_update)

    def next_expiry(self) -> float | None:
        """When (this state's clock) the first TRUE condition with a ``clearAfter`` heals if nothing renews
        it: the main loop sleeps until then, not in short ticks. None when none would."""
        due = [
            cond.last_update + spec.clear_after
            for type_, cond in self._conditions.items()
            if cond.status is Status.TRUE and (spec := self._specs.get(type_)) is not None and spec.clear_after
        ]
        due.extend(
            d.last_update + spec.clear_after
            for type_, cond in self._conditions.items()
            if cond.status is Status.TRUE
            and (len(cond.devices) > 1 or type_ in self._node_scoped)
            and (spec := self._specs.get(type_)) is not None
            and spec.clear_after
            for d in cond.devices
        )
        return min(due, default=None)

    def _update_aggregate(self, now: float) -> list[Event]:
        if not self._aggregate:
            return []
        fatal = [
            c
            for c in self._conditions.values()
            if c.type in self._specs
            and self._specs[c.type].accelerator
            and c.status is Status.TRUE
            and c.severity is Severity.CRITICAL
        ]
        current = self._conditions[AGGREGATE_TYPE]
        if fatal:
            status, reason = Status.FALSE, fatal[0].reason
            message = "; ".join(f"{c.type}: {c.message}" for c in fatal)
        else:
            status, reason, message = Status.TRUE, AGGREGATE_HEALTHY_REASON, AGGREGATE_HEALTHY_MESSAGE
        if current.status is status and current.reason == reason:
            return []
        updated = Condition(
            type=AGGREGATE_TYPE,
            status=status,
            reason=reason,
            message=message,
            last_transition=now if current.status is not status else current.last_transition,
            last_update=now,
            severity=Severity.CRITICAL if status is Status.FALSE else Severity.INFO,
        )
        self._conditions[AGGREGATE_TYPE] = updated
        self._touched.add(AGGREGATE_TYPE)
        self._generation += 1
        return [
            Event(
                type="Warning" if status is Status.FALSE else "Normal",
                reason="AcceleratedHardwareNotReady" if status is Status.FALSE else AGGREGATE_HEALTHY_REASON,
                message=f"Node condition {AGGREGATE_TYPE} is now: {status.value}, reason: {reason}, "
                f"message: {message!r}",
                timestamp=now,
                source="node-health-agent",
                severity=updated.severity,
                condition=AGGREGATE_TYPE,
                status=status,
            )
        ]

    def snapshot(self) -> Snapshot:
        return Snapshot(
            conditions=tuple(self._conditions.values()),
            generated_at=self._clock(),
            problem_counts=self._problems.counts,
            problem_pairs=self._problems.pairs,
            reasons_overflowed=self._problems.overflowed,
            generation=self._generation,
            seeded=self._seeded,
            node_uid=self._node_uid,
            provenance=self._provenance,
            clears=self._clears,
            validations=self.validation.records,
            validation_requests=self.validation.requests,
        )


def _provenance(specs: Mapping[str, ConditionSpec]) -> dict[str, Provenance]:
    """Who owns each condition type (never changed after it is handed to a snapshot)."""
    return {type_: spec.provenance for type_, spec in specs.items() if spec.provenance is not None}


def _with_device(
    devices: tuple[DeviceProblem, ...], finding: Finding, now: float
) -> tuple[tuple[DeviceProblem, ...], bool]:
    """``devices`` with the finding's device opened or renewed (a weaker reason never replaces a stronger),
    and whether it was opened (a device the condition did not hold, with room for it)."""
    ref = finding.device
    if ref is None:
        return devices, False
    key = ref.key
    for i, old in enumerate(devices):
        if old.device.key == key:
            stronger = finding.severity.rank >= old.severity.rank
            renewed = DeviceProblem(
                device=ref,
                reason=finding.reason if stronger else old.reason,
                severity=finding.severity if stronger else old.severity,
                since=old.since,
                last_update=now,
            )
            return (*devices[:i], renewed, *devices[i + 1 :]), False
    if len(devices) >= MAX_DEVICES:
        return devices, False
    opened = DeviceProblem(device=ref, reason=finding.reason, severity=finding.severity, since=now, last_update=now)
    return (*devices, opened), True


def _holds(devices: tuple[DeviceProblem, ...], key: str) -> bool:
    return any(d.device.key == key for d in devices)


def _named(message: str, devices: tuple[DeviceProblem, ...]) -> str:
    """A condition's message naming its devices (unchanged where none): Kubernetes has no per-device condition."""
    if not devices:
        return message
    names = [d.device.describe() for d in devices[:MAX_NAMED]]
    more = f" and {len(devices) - MAX_NAMED} more" if len(devices) > MAX_NAMED else ""
    return f"{message} [devices: {'; '.join(names)}{more}]"


def _unnamed(message: str, devices: tuple[DeviceProblem, ...]) -> str:
    """``message`` without the devices :func:`_named` added (unchanged where it does not end so)."""
    suffix = _named("", devices)
    return message[: -len(suffix)] if suffix and message.endswith(suffix) else message


def _replace(cond: Condition, **changes: object) -> Condition:
    return dataclasses.replace(cond, **changes)  # type: ignore[arg-type]
