"""The check scheduler: one producer component that runs every configured check on its interval.

- Each check runs on its own interval with jitter (``interval × (1 ± jitter)``), first right at
  start; it never overlaps itself; at most ``concurrency`` checks run at once (and at most a
  group's ``group_limit`` of one group: an NPD plugin file's ``concurrency``).
- A run that passes its timeout is reported at once as UNKNOWN ("timed out") and its slot is
  freed; the check itself is not started again until the stuck call returns (a Python thread
  cannot be killed; executables are, with their process group, by the process runner).
- A check that raises, or returns something that is not a list of results, is UNKNOWN with the
  error: never a crash, never a PROBLEM.
- Reports go into the inbox; the main loop judges them (:mod:`agent.checks.judge`). The scheduler
  decides nothing about the node. Its figures (:class:`CheckStats`) feed the metrics.
- :meth:`replace` swaps the whole set atomically (hot reload): checks that stay keep their
  schedule; results of removed checks still running are dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from agent.checks.model import CheckReport, CheckResult, CheckStatus, ScheduledCheck
from agent.runtime import Inbox

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 4
MESSAGE_MAX = 1024  # characters of a result's message
STOP_WAIT = 1.0  # at shutdown, how long running checks get to end (tools are killed at once)


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


@dataclass(slots=True)
class _Slot:
    spec: ScheduledCheck
    due: float  # monotonic
    running_since: float | None = None
    abandoned: bool = False  # timed out: reported, slot freed, waiting for the call to return
    outcome: tuple[Sequence[CheckResult] | None, str | None] | None = None  # (results, error) when done


def _unknown(spec: ScheduledCheck, message: str) -> tuple[CheckResult, ...]:
    conditions = [c.type for c in getattr(spec.check, "conditions", ()) or ()]
    if not conditions:
        return (CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason="CheckFailed", message=message),)
    return tuple(
        CheckResult(status=CheckStatus.UNKNOWN, condition=c, reason="CheckFailed", message=message) for c in conditions
    )


def _declared_only(spec: ScheduledCheck, results: tuple[CheckResult, ...]) -> tuple[CheckResult, ...]:
    """Messages cut to ``MESSAGE_MAX``; a result for a condition the check does not own (the state would
    drop it) becomes UNKNOWN saying so."""
    declared = {c.type for c in getattr(spec.check, "conditions", ()) or ()}
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
                    message=f"check {spec.name} reported condition {r.condition!r}, which it does not declare "
                    f"(declared: {', '.join(sorted(declared)) or 'none'})",
                )
            )
    return tuple(out)


def validate_results(value: object) -> tuple[tuple[CheckResult, ...] | None, str | None]:
    """(results, None) when ``value`` is a sequence of CheckResult, else (None, what is wrong)."""
    if isinstance(value, CheckResult):
        return (value,), None
    if not isinstance(value, list | tuple):
        return None, f"run() returned {type(value).__name__}, not a list of CheckResult"
    bad = [type(r).__name__ for r in value if not isinstance(r, CheckResult)]
    if bad:
        return None, f"run() returned a list with {bad[0]} items, not CheckResult"
    return tuple(value), None


def call_check(spec: ScheduledCheck) -> tuple[tuple[CheckResult, ...] | None, str | None]:
    """Run one check in the current thread; (results, None) or (None, the error)."""
    try:
        value = spec.check.run()
    except Exception as exc:  # a plugin's bug must never reach the agent
        log.warning("check %s raised %s: %s", spec.name, type(exc).__name__, exc, exc_info=True)
        return None, f"raised {type(exc).__name__}: {exc}"
    return validate_results(value)


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
    ) -> None:
        """``cancel`` is set when the scheduler stops: running tools are killed (see ``run_process``)."""
        self._cancel = cancel
        self._inbox = inbox
        self._concurrency = max(1, concurrency)
        self._stall_timeout = stall_timeout
        self._clock = clock
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._start_thread = start_thread or Workers()
        self._wake = threading.Condition()
        self._slots: dict[str, _Slot] = {}
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
                    slots[spec.name] = old
                else:
                    slots[spec.name] = _Slot(spec=spec, due=now)
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

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            reports, wake_at = self.step(self._monotonic())
            for report in reports:
                if not self._inbox.put(report, stop=stop):
                    return
            self._beat = self._monotonic()
            with self._wake:
                delay = max(0.0, min(wake_at - self._monotonic(), 1.0))
                if delay > 0 and not stop.is_set() and not self._finished_waiting():
                    self._wake.wait(timeout=delay)

    def _finished_waiting(self) -> bool:
        return any(s.outcome is not None for s in self._slots.values())

    # ---- one step (public for tests) -----------------------------------------------------------------

    def step(self, now: float) -> tuple[list[CheckReport], float]:
        """Collect finished runs, time out overdue ones, start due ones; (reports, next wake time)."""
        reports: list[CheckReport] = []
        to_start: list[_Slot] = []
        with self._wake:
            for slot in self._slots.values():
                if slot.outcome is not None:
                    results, error = slot.outcome
                    started = slot.running_since if slot.running_since is not None else now
                    slot.outcome = None
                    abandoned = slot.abandoned
                    slot.running_since, slot.abandoned = None, False
                    if abandoned:
                        log.info("check %s returned after its timeout; result dropped", slot.spec.name)
                        continue
                    reports.append(self._finish(slot, results, error, duration=now - started))
                    slot.due = now + self._interval(slot.spec)
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
                    slot.due = now + self._interval(slot.spec)
            running = [s for s in self._slots.values() if s.running_since is not None and not s.abandoned]
            groups: dict[str, int] = {}
            for s in running:
                if s.spec.group is not None:
                    groups[s.spec.group] = groups.get(s.spec.group, 0) + 1
            free = self._concurrency - len(running)
            for slot in sorted(self._slots.values(), key=lambda s: s.due):
                if free <= 0:
                    break
                if slot.running_since is not None or slot.due > now:
                    continue
                group, limit = slot.spec.group, slot.spec.group_limit
                if group is not None and limit is not None and groups.get(group, 0) >= limit:
                    continue
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
                    slot.due = now + self._interval(slot.spec)
            wake_at = self._next_wake(now)
        for slot in to_start:
            self._start_thread(self._runner(slot), f"check:{slot.spec.name}")
        return reports, wake_at

    def _next_wake(self, now: float) -> float:
        times = []
        for slot in self._slots.values():
            if slot.running_since is not None and not slot.abandoned:
                times.append(slot.running_since + slot.spec.timeout)
            else:
                times.append(slot.due)
        return min(times, default=now + 1.0)

    def _interval(self, spec: ScheduledCheck) -> float:
        spread = spec.interval * spec.jitter
        return max(0.0, spec.interval + self._rng.uniform(-spread, spread))

    def _runner(self, slot: _Slot) -> Callable[[], None]:
        spec = slot.spec

        def work() -> None:
            outcome = call_check(spec)
            with self._wake:
                slot.outcome = outcome
                self._wake.notify_all()

        return work

    def _finish(
        self,
        slot: _Slot,
        results: Sequence[CheckResult] | None,
        error: str | None,
        *,
        duration: float,
        counted: bool = True,
    ) -> CheckReport:
        spec = slot.spec
        stats = self.stats[spec.name]
        if results is None:
            if counted:
                stats.errors["invalid" if error and error.startswith("run() returned") else "exception"] += 1
            results = _unknown(spec, f"check {spec.name}: {error}")
        results = _declared_only(spec, tuple(results))
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
            stats.last_success = now
            stats.values = tuple(v for r in results for v in r.values)
        return CheckReport(
            check=spec.name,
            results=results,
            finished_at=now,
            duration=duration,
            failure_threshold=spec.failure_threshold,
            success_threshold=spec.success_threshold,
        )

    # ---- once, for the CLI -------------------------------------------------------------------------

    def run_once(self, *, names: Iterable[str] | None = None) -> list[CheckReport]:
        """Run the (named) checks once, concurrently within the limits; every report, in check order."""
        wanted = set(names) if names is not None else None
        with self._wake:
            for name, slot in self._slots.items():
                slot.due = self._monotonic() if wanted is None or name in wanted else float("inf")
        reports: dict[str, CheckReport] = {}
        pending = {n for n in self._slots if wanted is None or n in wanted}
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
