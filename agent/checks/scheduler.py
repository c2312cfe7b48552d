"""The check scheduler: one producer component that runs every configured check on its interval.

- Each check runs on its own interval with jitter (``interval × (1 ± jitter)``), first right at
  start; a check that falls due takes along the others already inside their jitter window (one
  wakeup for several runs; an idle agent's CPU is its wakeups); it never overlaps itself; at most
  ``concurrency`` checks run at once (and at most a group's ``group_limit`` of one group: an NPD
  plugin file's ``concurrency``).
- A run that passes its timeout is reported at once as UNKNOWN ("timed out") and its slot is
  freed; the check itself is not started again until the stuck call returns (a Python thread
  cannot be killed; executables are, with their process group, by the process runner).
- A check that raises (anything: ``sys.exit()`` in ``run()`` is a SystemExit in a worker thread),
  or returns something that is not a list of well-formed results (:func:`validate_results`: every
  field of every result is checked and copied), is UNKNOWN with the error: never a crash, never a
  PROBLEM. Nothing a plugin returns or raises reaches the scheduler thread, the main loop or a sink;
  the scheduler reads a check's ``conditions`` once, when it is given the check.
- Reports go into the inbox; the main loop judges them (:mod:`agent.checks.judge`). The scheduler
  decides nothing about the node. Its figures (:class:`CheckStats`) feed the metrics.
- Active checks (``active: true``) pass the gates of :mod:`agent.checks.active` in their worker before
  they start; never two at once; a skip (busy device, fleet share full) is retried after a jittered
  ``SKIP_RETRY``. An on-demand one (``interval: 0``) or a dormant one (``enabled: false``) runs only
  when an open validation request names it: ``requests()`` (the feed's latest snapshot) is polled at
  most every ``REQUEST_POLL`` seconds while any active check is configured; each (request, check) runs
  once (a skip is retried until it runs).
- :meth:`replace` swaps the whole set atomically (hot reload): checks that stay keep their
  schedule; results of removed checks still running are dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.checks.active import FLEET_SLOTS_UNAVAILABLE, ActiveGates, Skip, holders_unknown
from agent.checks.guard import describe
from agent.checks.model import (
    CANNOT_RUN_REASONS,
    LOAD_FAILED,
    CheckReport,
    CheckResult,
    CheckStatus,
    ScheduledCheck,
    Value,
)
from agent.core.bus import Inbox
from agent.core.types import ConditionSpec, Severity
from agent.core.validation import ValidationRequest

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 4
MESSAGE_MAX = 1024  # characters of a result's message
MAX_RESULTS = 256  # results of one run
MAX_VALUES = 1024  # values of one result
MAX_LABELS = 16  # labels of one value
DETAIL_CHECKS = 10  # checks named in /healthz details
_METRIC_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
STOP_WAIT = 1.0  # at shutdown, how long running checks get to end (tools are killed at once)
REQUEST_POLL = 5.0  # seconds between looks at the open validation requests (while active checks are configured)
SKIP_RETRY = 60.0  # seconds (x 0.5-1.5) before a skipped active check tries its gates again


@dataclass(slots=True)
class CheckStats:
    """What the metrics say about one check (read at scrape time; written by the scheduler thread)."""

    kind: str
    origin: str
    last_status: CheckStatus | None = None
    last_duration: float | None = None
    last_success: float | None = None  # wall time of the last run that completed (OK or PROBLEM)
    last_message: str = ""
    runs: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in CheckStatus})
    errors: dict[str, int] = field(default_factory=lambda: {"timeout": 0, "exception": 0, "invalid": 0})
    values: tuple = ()  # the last run's Values
    cannot_run: str | None = None  # why the check cannot run at all (plugin missing, not loadable), else None


@dataclass(slots=True)
class _Slot:
    spec: ScheduledCheck
    due: float  # monotonic
    earliest: float = -math.inf  # the soonest it may run: a check due anyway takes it along from then on
    declared: tuple[str, ...] = ()  # the condition types the check declares, read once
    running_since: float | None = None
    abandoned: bool = False  # timed out: reported, slot freed, waiting for the call to return
    outcome: tuple[Sequence[CheckResult] | None, str | None] | None = None  # (results, error) when done
    skipped: bool = False  # the outcome is a gate's skip (no run)
    requested: str | None = None  # the validation request this run answers

    @property
    def requestable(self) -> bool:
        """Runs only when a validation request names it (an on-demand or dormant active check)."""
        active = self.spec.active
        return active is not None and (active.on_demand or active.dormant)


def _unknown(declared: Sequence[str], message: str) -> tuple[CheckResult, ...]:
    if not declared:
        return (CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason="CheckFailed", message=message),)
    return tuple(
        CheckResult(status=CheckStatus.UNKNOWN, condition=c, reason="CheckFailed", message=message) for c in declared
    )


def _declared_only(name: str, declared: Sequence[str], results: tuple[CheckResult, ...]) -> tuple[CheckResult, ...]:
    """Messages cut to ``MESSAGE_MAX``; a result for a condition the check does not own (the state would
    drop it) becomes UNKNOWN saying so."""
    out = []
    for r in results:
        if len(r.message) > MESSAGE_MAX:  # it becomes a condition message and an Event: keep them small
            r = dataclasses.replace(r, message=r.message[: MESSAGE_MAX - 1] + "…")
        if r.condition is None or r.condition in declared:
            out.append(r)
        else:
            out.append(
                CheckResult(
                    status=CheckStatus.UNKNOWN,
                    condition=None,
                    reason="CheckResultInvalid",
                    message=f"check {name} reported condition {r.condition!r}, which it does not declare "
                    f"(declared: {', '.join(sorted(declared)) or 'none'})",
                )
            )
    return tuple(out)


def declared_conditions(check: object) -> tuple[str, ...]:
    """The condition types ``check`` declares, read once (the loader already checked a plugin's; this
    guards checks built elsewhere): an attribute that raises or holds garbage declares nothing."""
    try:
        conditions = getattr(check, "conditions", ()) or ()
        return tuple(c.type for c in conditions if isinstance(c, ConditionSpec) and isinstance(c.type, str))
    except Exception as exc:  # never let a check's attribute take the scheduler down (no plugin code in the message)
        log.error("a %s's conditions cannot be read (%s); it declares none", type(check).__name__, type(exc).__name__)
        return ()


def _show(value: object) -> str:
    """A short description of a value a plugin returned, without calling the plugin's own code."""
    if value is None or type(value) in (bool, int, float):
        return repr(value)
    if type(value) is str:
        return repr(value[:40]) + ("…" if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def _text(value: object, what: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise ValueError(f"{what} must be a {'non-empty ' if not empty else ''}str, not {_show(value)}")
    return str.__str__(value)


def _value(v: object, where: str) -> Value:
    if not isinstance(v, Value):
        raise ValueError(f"{where} must be a Value, not {_show(v)}")
    name, number, labels = v.name, v.value, v.labels
    if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
        raise ValueError(f"{where}.name must match [a-z_][a-z0-9_]*, not {_show(name)}")
    if not isinstance(number, int | float) or isinstance(number, bool) or not math.isfinite(number):
        raise ValueError(f"{where}.value must be a finite number, not {_show(number)}")
    if not isinstance(labels, Mapping) or len(labels) > MAX_LABELS:
        raise ValueError(f"{where}.labels must be a mapping of at most {MAX_LABELS} labels")
    clean: dict[str, str] = {}
    for key, text in labels.items():
        if not isinstance(key, str) or not _LABEL_NAME.fullmatch(key) or key == "check":
            raise ValueError(f"{where}.labels: label name {_show(key)} is not a Prometheus label name (or is 'check')")
        clean[str.__str__(key)] = _text(text, f"{where}.labels[{key!r}]")
    return Value(name=str.__str__(name), value=float(number), labels=clean)


def _result(r: CheckResult, where: str) -> CheckResult:
    """A copy of ``r`` made of checked plain values (ValueError naming the bad field)."""
    status, condition, severity, values, repeat = r.status, r.condition, r.severity, r.values, r.repeat_event
    devices = r.devices
    if not isinstance(devices, tuple | list) or len(devices) > MAX_VALUES:
        raise ValueError(f"{where}.devices must be a tuple of device keys")
    if not isinstance(status, CheckStatus):
        raise ValueError(f"{where}.status must be a CheckStatus, not {_show(status)}")
    if not isinstance(severity, Severity):
        raise ValueError(f"{where}.severity must be a Severity, not {_show(severity)}")
    if not isinstance(repeat, bool):
        raise ValueError(f"{where}.repeat_event must be a bool, not {_show(repeat)}")
    if not isinstance(values, list | tuple) or len(values) > MAX_VALUES:
        raise ValueError(f"{where}.values must be a tuple of at most {MAX_VALUES} Value")
    return CheckResult(
        status=status,
        condition=None if condition is None else _text(condition, f"{where}.condition", empty=False),
        # An OK warning may have no reason (an NPD temporary rule has no healthy reason); anything else needs one.
        reason=_text(r.reason, f"{where}.reason", empty=status is CheckStatus.OK and condition is None),
        message=_text(r.message, f"{where}.message"),
        severity=severity,
        values=tuple(_value(v, f"{where}.values[{i}]") for i, v in enumerate(values)),
        repeat_event=repeat,
        devices=tuple(_text(d, f"{where}.devices[{i}]", empty=False) for i, d in enumerate(devices)),
    )


def validate_results(value: object) -> tuple[tuple[CheckResult, ...] | None, str | None]:
    """(results, None) when ``value`` is a sequence of well-formed CheckResults, else (None, what is wrong).

    Every field is checked and the results copied, so only plain values of the right types reach the
    main loop and the sinks: ``message=None``, a status that is not a CheckStatus, a NaN value or a
    label that is not a string make the whole run UNKNOWN ("invalid"), naming the field."""
    if isinstance(value, CheckResult):
        value = (value,)
    if not isinstance(value, list | tuple):
        return None, f"run() returned {type(value).__name__}, not a list of CheckResult"
    if len(value) > MAX_RESULTS:
        return None, f"run() returned {len(value)} results (at most {MAX_RESULTS})"
    bad = [type(r).__name__ for r in value if not isinstance(r, CheckResult)]
    if bad:
        return None, f"run() returned a list with {bad[0]} items, not CheckResult"
    try:
        return tuple(_result(r, f"result[{i}]") for i, r in enumerate(value)), None
    except ValueError as exc:
        return None, f"run() returned an invalid result: {exc}"


def call_check(spec: ScheduledCheck) -> tuple[tuple[CheckResult, ...] | None, str | None]:
    """Run one check in the current (worker) thread; (results, None) or (None, the error).

    Whatever the plugin raises is caught, ``BaseException`` included: a ``sys.exit()`` in ``run()``
    raises SystemExit in this worker thread, which would otherwise end the thread silently and leave
    the check "running" for ever."""
    try:
        return validate_results(spec.check.run())
    except BaseException as exc:  # noqa: BLE001 - a plugin's bug (SystemExit included) must never reach the agent
        error = describe(exc)
        log.warning("check %s raised %s", spec.name, error, exc_info=isinstance(exc, Exception))
        return None, f"raised {error}"


class CheckScheduler:
    """Component ``check_scheduler``: runs the checks, hands reports to the main loop."""

    name = "check_scheduler"

    def __init__(
        self,
        *,
        checks: Sequence[ScheduledCheck],
        inbox: Inbox,
        concurrency: int = DEFAULT_CONCURRENCY,
        stall_timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        start_thread: Callable[[Callable[[], None], str], None] | None = None,
        cancel: threading.Event | None = None,
        wait: Callable[[threading.Condition, float | None], object] | None = None,
        gates: ActiveGates | None = None,
        requests: Callable[[], Sequence[ValidationRequest]] | None = None,
    ) -> None:
        """``cancel`` is set when the scheduler stops: running tools are killed (see ``run_process``).
        ``wait(condition, timeout)`` sleeps between steps, the condition held (default ``condition.wait``)."""
        self._cancel = cancel
        self._inbox = inbox
        self._concurrency = max(1, concurrency)
        self._stall_timeout = stall_timeout
        self._clock = clock
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._start_thread = start_thread or Workers()
        self._wake = threading.Condition()
        self._wait = wait or (lambda condition, timeout: condition.wait(timeout))
        self._slots: dict[str, _Slot] = {}
        # no gates given: an active check cannot prove its devices idle, so it is skipped (HoldersUnknown)
        self._gates = gates or ActiveGates(busy=holders_unknown)
        self._requests = requests
        self._next_poll = -math.inf
        self._served: set[tuple[str, str]] = set()  # (request id, check) runs done
        self.stats: dict[str, CheckStats] = {}
        self._beat = monotonic()
        self.replace(checks)

    # ---- configuration ---------------------------------------------------------------------------

    def replace(self, checks: Sequence[ScheduledCheck]) -> None:
        """Swap in a new set of checks atomically; unchanged names keep their schedule."""
        now = self._monotonic()
        with self._wake:
            slots: dict[str, _Slot] = {}
            for spec in checks:
                old = self._slots.get(spec.name)
                if old is not None:
                    old.spec = spec
                    old.declared = declared_conditions(spec.check)
                    slots[spec.name] = old
                else:
                    slots[spec.name] = _Slot(spec=spec, due=now, declared=declared_conditions(spec.check))
                slot = slots[spec.name]
                if slot.requestable and slot.requested is None and slot.running_since is None:
                    slot.due = slot.earliest = math.inf
            self._slots = slots
            self.stats = {s.name: self.stats.get(s.name) or CheckStats(kind=s.kind, origin=s.origin) for s in checks}
            for s in checks:
                self.stats[s.name].kind, self.stats[s.name].origin = s.kind, s.origin
            self._wake.notify_all()

    @property
    def checks(self) -> tuple[ScheduledCheck, ...]:
        with self._wake:
            return tuple(s.spec for s in self._slots.values())

    # ---- component -------------------------------------------------------------------------------

    def healthy(self, now: float) -> bool:
        return now - self._beat < self._stall_timeout

    def run(self, stop: threading.Event) -> None:
        try:
            self._run(stop)
        finally:
            if self._cancel is not None:
                self._cancel.set()
                self._wait_for_runs(timeout=STOP_WAIT)

    def _wait_for_runs(self, *, timeout: float) -> None:
        """Give cancelled runs a moment to kill their tools (a stuck Python check is not waited for)."""
        deadline = self._monotonic() + timeout
        with self._wake:
            while any(s.running_since is not None and s.outcome is None for s in self._slots.values()):
                left = deadline - self._monotonic()
                if left <= 0:
                    return
                self._wake.wait(timeout=min(left, 0.05))

    def wake(self) -> None:
        """Stop was set: make the loop look now (the supervisor calls this; any thread)."""
        with self._wake:
            self._wake.notify_all()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            reports, wake_at = self.step(self._monotonic())
            for report in reports:
                if not self._inbox.put(report, stop=stop):
                    return
            with self._wake:
                # Sleep until the next check is due (or a run's timeout), not a second at most: each wakeup
                # is idle CPU (issue 16). A finished run, replace() and wake() (stop) notify at once. The beat
                # is the time of the next look: stalled means late by stall_timeout, however long the sleep.
                now = self._monotonic()
                self._beat = max(now, wake_at)
                if wake_at > now and not stop.is_set() and not self._finished_waiting():
                    self._wait(self._wake, None if wake_at == math.inf else wake_at - now)
                self._beat = self._monotonic()  # awake: from now on, working must show progress again

    def _finished_waiting(self) -> bool:
        return any(s.outcome is not None for s in self._slots.values())

    # ---- one step (public for tests) -----------------------------------------------------------------

    def step(self, now: float) -> tuple[list[CheckReport], float]:
        """Collect finished runs, time out overdue ones, start due ones; (reports, next wake time)."""
        reports: list[CheckReport] = []
        to_start: list[_Slot] = []
        wanted = self._poll_requests(now)
        with self._wake:
            self._take_requests(wanted, now)
            self._collect(reports, now)
            for slot in self._slots.values():
                if (
                    slot.running_since is not None
                    and not slot.abandoned
                    and now - slot.running_since >= slot.spec.timeout
                ):
                    slot.abandoned = True
                    self.stats[slot.spec.name].errors["timeout"] += 1
                    reports.append(
                        self._finish(
                            slot,
                            None,
                            f"timed out after {slot.spec.timeout:g}s",
                            duration=now - slot.running_since,
                            counted=False,
                        )
                    )
                    self._after_run(slot, now, skipped=False)
            running = [s for s in self._slots.values() if s.running_since is not None and not s.abandoned]
            groups: dict[str, int] = {}
            for s in running:
                if s.spec.group is not None:
                    groups[s.spec.group] = groups.get(s.spec.group, 0) + 1
            free = self._concurrency - len(running)
            # one active check at a time: one that timed out may still be loading its devices
            active_running = any(
                s.spec.active is not None and s.running_since is not None for s in self._slots.values()
            )
            # Awake for a due check, it takes along the checks already inside their jitter window: their
            # runs share one wakeup of every thread they pass through (issue 16), and each check's interval
            # stays within interval x (1 +- jitter).
            waking = any(s.running_since is None and s.due <= now for s in self._slots.values())
            for slot in sorted(self._slots.values(), key=lambda s: s.due):
                if free <= 0:
                    break
                if slot.running_since is not None or (slot.due > now and not (waking and slot.earliest <= now)):
                    continue
                group, limit = slot.spec.group, slot.spec.group_limit
                if group is not None and limit is not None and groups.get(group, 0) >= limit:
                    continue
                if slot.spec.active is not None:
                    if active_running or (slot.requestable and slot.requested is None):
                        continue
                    active_running = True
                slot.running_since = now
                to_start.append(slot)
                free -= 1
                if group is not None:
                    groups[group] = groups.get(group, 0) + 1
            for slot in self._slots.values():
                if slot.abandoned and slot.due <= now:
                    # Still stuck: say so on its schedule, without starting a second copy.
                    reports.append(
                        self._finish(
                            slot,
                            None,
                            f"still running {now - (slot.running_since or now):.0f}s after it started "
                            f"(timeout {slot.spec.timeout:g}s)",
                            duration=0.0,
                            counted=False,
                        )
                    )
                    self._schedule(slot, now)
            wake_at = self._next_wake(now)
        for slot in to_start:
            self._start_thread(self._runner(slot), f"check:{slot.spec.name}")
        return reports, wake_at

    def _collect(self, reports: list[CheckReport], now: float) -> None:
        """The finished runs' reports (the lock held); a run that returned after its timeout is dropped."""
        for slot in self._slots.values():
            if slot.outcome is None:
                continue
            results, error = slot.outcome
            started = slot.running_since if slot.running_since is not None else now
            slot.outcome = None
            abandoned, skipped = slot.abandoned, slot.skipped
            slot.running_since, slot.abandoned, slot.skipped = None, False, False
            if abandoned:
                log.info("check %s returned after its timeout; result dropped", slot.spec.name)
                continue
            reports.append(self._finish(slot, results, error, duration=now - started, skipped=skipped))
            self._after_run(slot, now, skipped=skipped)

    def _next_wake(self, now: float) -> float:
        times = []
        for slot in self._slots.values():
            if slot.running_since is not None and not slot.abandoned:
                times.append(slot.running_since + slot.spec.timeout)
            else:
                times.append(slot.due)
        if self._requests is not None and any(s.spec.active is not None for s in self._slots.values()):
            times.append(self._next_poll)
        return min(times, default=math.inf)  # no checks: sleep until replace() or wake()

    # ---- validation requests -----------------------------------------------------------------------

    def _poll_requests(self, now: float) -> Sequence[ValidationRequest] | None:
        """The open requests, at most every REQUEST_POLL seconds while active checks are configured (None:
        not looked at this step). Called without the lock (it reads the feed)."""
        if self._requests is None or now < self._next_poll:
            return None
        if not any(s.spec.active is not None for s in self._slots.values()):
            return None
        self._next_poll = now + REQUEST_POLL
        try:
            return tuple(self._requests())
        except Exception:  # the feed's reader must never take the scheduler down
            log.exception("cannot read the open validation requests")
            return None

    def _take_requests(self, wanted: Sequence[ValidationRequest] | None, now: float) -> None:
        """Make the checks the open requests name due (each (request, check) once; not while it runs: a run
        that began before the request answers nothing)."""
        if wanted is None:
            return
        self._served = {key for key in self._served if key[0] in {r.id for r in wanted}}
        for request in wanted:
            for name in request.checks:
                slot = self._slots.get(name)
                if slot is None or slot.spec.active is None:  # a passive check leaves no record: not run for it
                    continue
                if slot.requested is not None or slot.running_since is not None:
                    continue
                if (request.id, name) in self._served:
                    continue
                slot.requested = request.id
                slot.due = slot.earliest = min(slot.due, now)

    def _after_run(self, slot: _Slot, now: float, *, skipped: bool) -> None:
        """A skipped run tries again after a jittered SKIP_RETRY (its request stays); a run that happened
        answers its request and is scheduled as usual."""
        if skipped:
            retry = SKIP_RETRY * self._rng.uniform(0.5, 1.5)
            if not slot.requestable:
                retry = min(retry, self._interval(slot.spec))
            slot.due = slot.earliest = now + retry
            return
        if slot.requested is not None:
            self._served.add((slot.requested, slot.spec.name))
            slot.requested = None
        self._schedule(slot, now)

    def _schedule(self, slot: _Slot, now: float) -> None:
        """The next run: due after a jittered interval, and allowed from the shortest the jitter gives (a
        requestable check: when a request names it)."""
        if slot.requestable:
            slot.due = slot.earliest = math.inf
            return
        slot.due = now + self._interval(slot.spec)
        slot.earliest = now + max(0.0, slot.spec.interval * (1 - slot.spec.jitter))

    def _interval(self, spec: ScheduledCheck) -> float:
        spread = spec.interval * spec.jitter
        return max(0.0, spec.interval + self._rng.uniform(-spread, spread))

    def _runner(self, slot: _Slot) -> Callable[[], None]:
        spec = slot.spec

        def work() -> None:
            outcome: tuple[Sequence[CheckResult] | None, str | None] = (None, "the run ended without an outcome")
            skip: Skip | None = None
            try:
                if spec.active is None:
                    outcome = call_check(spec)
                else:
                    skip, outcome = self._run_active(spec)
            finally:  # whatever happens, the slot hears of it: a run is never "running" for ever
                with self._wake:
                    slot.outcome = outcome
                    slot.skipped = skip is not None
                    self._wake.notify_all()

        return work

    def _run_active(
        self, spec: ScheduledCheck
    ) -> tuple[Skip | None, tuple[tuple[CheckResult, ...] | None, str | None]]:
        """The gates (in this worker: the fleet slot is an API call), then the run; the slot given back."""
        assert spec.active is not None
        try:
            skip = self._gates.admit(check=spec.name, spec=spec.active, timeout=spec.timeout)
        except Exception as exc:  # a gate's bug: not proven safe, so not run
            log.exception("active check %s: the gates failed", spec.name)
            skip = Skip(reason=FLEET_SLOTS_UNAVAILABLE, message=f"the gates failed: {describe(exc)}")
        if skip is not None:
            log.info("active check %s skipped: %s (%s)", spec.name, skip.reason, skip.message)
            return skip, ((skip.result(),), None)
        try:
            return None, call_check(spec)
        finally:
            self._gates.done()

    def _finish(
        self,
        slot: _Slot,
        results: Sequence[CheckResult] | None,
        error: str | None,
        *,
        duration: float,
        counted: bool = True,
        skipped: bool = False,
    ) -> CheckReport:
        spec = slot.spec
        stats = self.stats[spec.name]
        if results is None:
            if counted:
                stats.errors["invalid" if error and error.startswith("run() returned") else "exception"] += 1
            results = _unknown(slot.declared, f"check {spec.name}: {error}")
        results = _declared_only(spec.name, slot.declared, tuple(results))
        statuses = {r.status for r in results}
        status = (
            CheckStatus.PROBLEM
            if CheckStatus.PROBLEM in statuses
            else CheckStatus.UNKNOWN
            if CheckStatus.UNKNOWN in statuses or not results
            else CheckStatus.OK
        )
        now = self._clock()
        stats.last_status = status
        stats.last_duration = duration
        stats.runs[status.value] += 1
        stats.last_message = "; ".join(r.message for r in results if r.status is status)[:300]
        if error is None:
            if status is not CheckStatus.UNKNOWN:
                stats.last_success = now
            stats.values = tuple(v for r in results for v in r.values)
        self._note_cannot_run(spec.name, stats, results)
        return CheckReport(
            check=spec.name,
            results=results,
            finished_at=now,
            duration=duration,
            failure_threshold=spec.failure_threshold,
            success_threshold=spec.success_threshold,
            active=spec.active,
            skipped=skipped,
        )

    @staticmethod
    def _note_cannot_run(name: str, stats: CheckStats, results: Sequence[CheckResult]) -> None:
        """Track whether the check can run at all; log when that changes, not on every run."""
        why = None
        if results and all(r.status is CheckStatus.UNKNOWN and r.reason in CANNOT_RUN_REASONS for r in results):
            why = results[0].message[:300]
        if why == stats.cannot_run:
            return
        if why is None:
            log.info("check %s runs again", name)
        elif results[0].reason != LOAD_FAILED:  # a plugin that failed to load was logged by the loader
            log.warning("check %s cannot run: %s (logged once; /healthz details show it until it runs)", name, why)
        stats.cannot_run = why

    def detail(self) -> str | None:
        """For ``/healthz`` details: the checks that cannot run at all (a missing plugin, a broken import)."""
        broken = sorted((name, s.cannot_run) for name, s in self.stats.items() if s.cannot_run)
        if not broken:
            return None
        shown = "; ".join(f"{name}: {why}" for name, why in broken[:DETAIL_CHECKS])
        more = f"; and {len(broken) - DETAIL_CHECKS} more" if len(broken) > DETAIL_CHECKS else ""
        return f"{len(broken)} check{'s' if len(broken) != 1 else ''} cannot run: {shown}{more}"

    # ---- once, for the CLI -------------------------------------------------------------------------

    def run_once(self, *, names: Iterable[str] | None = None) -> list[CheckReport]:
        """Run the (named) checks once, concurrently within the limits; every report, in check order."""
        wanted = set(names) if names is not None else {n for n, s in self._slots.items() if not s.requestable}
        with self._wake:
            for name, slot in self._slots.items():
                slot.due = slot.earliest = self._monotonic() if name in wanted else math.inf
                if name in wanted and slot.requestable:
                    slot.requested = "run-once"  # named by hand: it runs (the gates still apply)
        reports: dict[str, CheckReport] = {}
        pending = {n for n in self._slots if n in wanted}
        while pending:
            got, wake_at = self.step(self._monotonic())
            for report in got:
                if report.check in pending:
                    reports[report.check] = report
                    pending.discard(report.check)
                    self._slots[report.check].due = float("inf")
            if pending:
                with self._wake:
                    delay = max(0.0, min(wake_at - self._monotonic(), 0.5))
                    if delay > 0 and not self._finished_waiting():
                        self._wake.wait(timeout=delay)
        return [reports[n] for n in self._slots if n in reports]


class Workers:
    """Threads for check runs, reused: a run goes to an idle worker, or to a new one when none is idle
    (a hung check keeps its worker, so it never blocks the others). Idle workers end after
    ``idle_timeout``. Reuse keeps the thread count, and the memory each new thread costs, flat."""

    def __init__(self, *, idle_timeout: float = 300.0) -> None:
        self._idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0

    def __call__(self, target: Callable[[], None], name: str) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._jobs.put(target)
                return
        threading.Thread(target=self._work, args=(target,), name="check-worker", daemon=True).start()

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self._idle_timeout)
            except queue.Empty:
                with self._lock:
                    try:
                        job = self._jobs.get_nowait()  # handed over just as we timed out
                    except queue.Empty:
                        self._idle -= 1
                        return
