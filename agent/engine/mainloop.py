"""The main loop: the only writer of NodeState.

It takes inputs from the inbox (record batches, check reports, seeded conditions), matches
records, judges check reports (failure/success thresholds), folds findings into the state and
publishes a snapshot with the step's events.

What it keeps in the state directory follows what every durable consumer has acknowledged (see
:mod:`agent.core.bus`): the kmsg cursor and our conditions are saved as of the newest acknowledged
publication. So after a SIGKILL the records whose Events might not be stored yet are replayed in
full against the conditions as they were, and every transition Event comes again; nothing newer
than what was reported is ever restored.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from agent.checks.active import records_of
from agent.checks.judge import CheckJudge
from agent.checks.model import CheckReport
from agent.core.bus import (
    Inbox,
    Input,
    Notice,
    RecordBatch,
    SeedConditions,
    SnapshotFeed,
    iter_inputs,
)
from agent.core.clears import APPLIED, REFUSED, ClearRecord, ClearRequest, NodeClears, device_matches
from agent.core.columns import RecordColumns
from agent.core.deviceresolver import DeviceResolver
from agent.core.ring import LineRing
from agent.core.state import NodeState
from agent.core.statedir import ClearStore, ConditionStore, StateDirHealth
from agent.core.types import Event, Finding, Snapshot
from agent.core.validation import ValidationRequest, ValidationWithdrawn
from agent.detectors.pipeline import Batch, DetectionPipeline
from agent.engine.inputs import Reconfigure
from agent.sources.replay import Cursor, CursorStore, ReplayPolicy, held_back

log = logging.getLogger(__name__)

CURSOR_TICK = 1.0  # while publications await their acknowledgement or a save, the loop looks this often
STEP_ITEMS = 16  # inbox items folded into one publication at most
# The state directory (conditions and cursor) is written at most this often: each write is an fsync'd
# file that holds the main loop (4-15 ms here), and in a storm the conditions changed every step.
CURSOR_INTERVAL = 1.0
FINAL_ACK_WAIT = 1.0  # at shutdown, how long to wait for consumers to acknowledge before the last cursor save
MAX_PENDING = 100_000  # publications awaiting acknowledgement (a stalled consumer only delays the cursor)
# A flood: the steps begun in the last FLOOD_STEP seconds folded FLOOD_RECORDS records or more (a burst in one
# step, or a steady stream read a tick at a time). Then the next step waits until FLOOD_STEP after the last
# one began and folds what came in meanwhile together: one publication, one look at expiry and the state
# directory for many of the reader's chunks, matched back to back while the matcher's tables are still in the
# CPU's caches (issue 16: at 20k records/s in bursts of 400, the main loop's CPU per 1M records 2.0-2.2 s
# stepping at most every 50 ms, 1.5-2.0 every 100 ms, 1.3-1.6 every 200 ms). A line after a quiet spell is
# folded at once; in a flood a finding waits up to FLOOD_STEP more. The wait ends early once the inbox is
# half full (``Inbox.gather``), so the reader never waits on it.
FLOOD_RECORDS = 256
FLOOD_STEP = 0.2


class MainLoop:
    name = "main_loop"

    def __init__(
        self,
        *,
        inbox: Inbox,
        feed: SnapshotFeed,
        state: NodeState,
        pipeline: DetectionPipeline,
        replay: ReplayPolicy,
        health: Callable[[], Mapping[str, bool]],
        stall_timeout: float,
        cursor_store: CursorStore | None = None,
        condition_store: ConditionStore | None = None,
        clear_store: ClearStore | None = None,  # where the operator's clears (their boundaries) are kept
        state_dir: StateDirHealth | None = None,
        acks: Sequence[Callable[[], int]] = (),
        judge: CheckJudge | None = None,
        monitors: Mapping[str, DetectionPipeline] | None = None,
        kernel_log: LineRing | None = None,  # keeps the kernel log lines read (the diagnostics bundle's copy)
        devices: DeviceResolver | None = None,  # what the node knows of a device a finding names (None: nothing)
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        tick: float | None = None,
    ) -> None:
        """``tick``: the longest the loop sleeps (None: until the next thing it has to do; see
        :meth:`idle_timeout`)."""
        self._inbox = inbox
        self._feed = feed
        self.state = state
        self.pipeline = pipeline
        self._replay = replay
        self._health = health
        self._stall_timeout = stall_timeout
        self._cursor_store = cursor_store
        self._condition_store = condition_store
        self._clear_store = clear_store
        self._state_dir = state_dir
        self._acks = list(acks)
        self.judge = judge or CheckJudge()
        self.monitors = dict(monitors or {})  # log monitor name -> its own rules
        self._kernel_log = kernel_log
        self._devices = devices
        self._clock = clock
        self._monotonic = monotonic
        self._tick = tick
        self._beat = monotonic()
        self.records_processed = 0  # records matched and folded
        self.decode_errors = 0  # record batches a source failed to decode (a bug; logged with its traceback)
        # (publication number, its last kmsg seq or None, its snapshot when the conditions changed, else None)
        self._pending: collections.deque[tuple[int, int | None, Snapshot | None]] = collections.deque(
            maxlen=MAX_PENDING
        )
        self._published_generation = state.snapshot().generation
        self._acked_seq: int | None = None
        self._saved_seq: int | None = replay.cursor.last_seq if replay.cursor else None
        # the last kernel record sequence number folded (this boot): the boundary of a clear applied now
        same_boot = replay.cursor is not None and replay.cursor.boot_id == replay.boot_id
        self._folded_seq: int | None = replay.cursor.last_seq if same_boot and replay.cursor else None
        self.held_back = 0  # findings a clear's boundary held back (records before it raise nothing cleared)
        self._unsaved: Snapshot | None = None  # the newest acknowledged conditions, not yet written
        self._last_save = float("-inf")
        # (when it began folding, records it folded) of the recent steps that folded any (see _flooding)
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    # ---- component -----------------------------------------------------------------------------

    def healthy(self, now: float) -> bool:
        """Stalled = ``stall_timeout`` late: asleep, the beat is when the loop will look next."""
        return now - self._beat < self._stall_timeout

    def wake(self) -> None:
        """Stop was set: end the wait for the inbox now (the supervisor calls this; any thread)."""
        self._inbox.wake()

    def run(self, stop: threading.Event) -> None:
        self._publish([], last_seq=None)
        while not stop.is_set():
            self.step(timeout=self.idle_timeout(), pause=self._gather)
        self._shutdown()

    def idle_timeout(self) -> float | None:
        """How long the loop may wait for the inbox: until the next ``clearAfter`` expiry, a tick while
        publications await acknowledgement or what they acknowledged awaits its write (the state directory
        follows them), else until an item comes (None). Not a tick at all times: each wakeup is idle CPU
        (issue 16)."""
        waits = (
            [self._tick] if self._tick is not None else [CURSOR_TICK] if self._pending or self._unsaved_state() else []
        )
        expiry = self.state.next_expiry()
        if expiry is not None:
            waits.append(max(0.0, expiry - self._clock()))
        return min(waits, default=None)

    # ---- one step --------------------------------------------------------------------------------

    def step(self, *, timeout: float | None, pause: Callable[[float], object] | None = None) -> int:
        """Fold whatever the inbox holds (waiting up to ``timeout`` for the first item, None: until one
        comes or :meth:`wake`); publish. ``pause``: how the loop waits in a flood until FLOOD_STEP has passed
        since the last step began (``run`` gathers on the inbox; None: it does not wait)."""
        self._beat = math.inf if timeout is None else self._monotonic() + timeout  # asleep: not stalled
        first = self._inbox.get(timeout=timeout)
        now = self._monotonic()
        if first is not None and self._flooding(now) and pause is not None:
            left = self._recent[-1][0] + FLOOD_STEP - now
            if left > 0:
                self._beat = now + left
                pause(left)
                now = self._monotonic()
        self._beat = now
        events: list[Event] = []
        records = 0
        last_seq: int | None = None
        if first is not None:
            for item in iter_inputs(self._inbox, first=first, limit=STEP_ITEMS):
                n, seq = self._fold(item, events)
                records += n
                last_seq = seq if seq is not None else last_seq
        if records:
            self._recent.append((now, records))
        events.extend(self.state.expire())
        if first is not None or events:
            self._publish(events, last_seq=last_seq)
        self._beat = self._monotonic()
        self._save_cursor(force=False)
        return records

    def _flooding(self, now: float) -> bool:
        """Whether the steps begun in the last FLOOD_STEP seconds folded FLOOD_RECORDS records or more. Forgets
        the older ones: asked before each step that folds, the deque holds one FLOOD_STEP of steps at most."""
        recent = self._recent
        while recent and recent[0][0] <= now - FLOOD_STEP:
            recent.popleft()
        return sum(records for _, records in recent) >= FLOOD_RECORDS

    def _gather(self, seconds: float) -> None:
        """A flood's wait: until the inbox is half full, :meth:`wake` (stop) or ``seconds`` have passed."""
        self._inbox.gather(timeout=seconds)

    def _fold(self, item: Input, events: list[Event]) -> tuple[int, int | None]:
        if isinstance(item, RecordBatch):
            try:
                records = item.resolve()
            except Exception:  # a source's decoding bug must not kill the one writer
                log.exception("cannot decode a batch of kernel log records; skipping it")
                self.decode_errors += 1
                return 0, None
            if not records:
                return 0, None
            if item.monitor is not None:
                pipeline = self.monitors.get(item.monitor)
                if pipeline is None:
                    log.error("records of unknown log monitor %r dropped", item.monitor)
                    return 0, None
                for finding in pipeline.process(Batch(records=records)):
                    events.extend(self._apply(finding))
                self.records_processed += len(records)
                return len(records), None  # not kernel log records: no kmsg cursor
            columns = RecordColumns.of(records)  # the kernel log reader's are: no record is built here
            if self._kernel_log is not None:
                self._kernel_log.extend(columns)
            for run, replayed in self._replay.split(columns, now=self._clock()):
                for part, held in held_back(run, self.state.clears, boot_id=self._replay.boot_id):
                    for finding in self.pipeline.process(Batch(records=part, permanent_only=replayed)):
                        events.extend(self._apply(finding, held=held))
            self.records_processed += len(columns)
            last = columns.seqs[-1]
            if last is not None:
                self._folded_seq = last if self._folded_seq is None else max(self._folded_seq, last)
            return len(columns), last
        if isinstance(item, CheckReport):
            # a gate's skip (busy device, fleet share full) is no verdict: the judge never sees it
            for finding in () if item.skipped else self.judge.judge(item):
                events.extend(self._apply(finding))
            self.state.validation.record(records_of(item))  # after its findings: a fail's own fault voids no newer pass
        elif isinstance(item, ValidationRequest):
            if self.state.validation.request(item):
                log.info("validation request %s: %s (%s)", item.id, ", ".join(item.checks), item.reason or "no reason")
        elif isinstance(item, ValidationWithdrawn):
            if self.state.validation.withdraw(item.id):
                log.info("validation request %s withdrawn", item.id)
        elif isinstance(item, SeedConditions):
            events.extend(self.state.seed(item.conditions, node_uid=item.node_uid))
            self.state.restore_validations(item.validations)
        elif isinstance(item, NodeClears):
            events.extend(self._clears(item))
        elif isinstance(item, Notice):
            events.extend(item.events)
        elif isinstance(item, Reconfigure):
            self.pipeline = DetectionPipeline(rule_set=item.rule_set)
            self.state.declare(item.conditions)
            self.judge.forget(item.removed_checks)
            log.info("configuration %d in effect: %d kernel log rules", item.generation, len(item.rule_set.rules))
        else:  # a producer bug must not kill the one writer
            log.error("ignoring an unknown inbox item %r", type(item).__name__)
        return 0, None

    def _apply(self, finding: Finding, *, held: tuple[ClearRecord, ...] = ()) -> list[Event]:
        """Fold one finding; a device it names is first joined to what the node knows of it (index, UUID).
        ``held``: the clears whose boundary is after the finding's record: what they cleared it raises not."""
        if finding.device is not None and self._devices is not None:
            finding = dataclasses.replace(finding, device=self._devices.resolve(finding.device))
        if held and any(_clears_finding(c.request, finding) for c in held):
            self.held_back += 1
            return []
        return self.state.apply(finding)

    def _clears(self, item: NodeClears) -> list[Event]:
        """What the Node says of clears: its records adopted (a fresh state directory), a pending request applied
        or refused once, with its boundary (this boot, the last kernel record folded), kept at once."""
        changed = self.state.keep_clears(item.records)
        request, events = item.request, list[Event]()
        if request is not None and all(r.request.id != request.id for r in self.state.clears):
            applied, detail, events = self.state.clear(
                request.condition, device=request.device, force=request.force, note=request.describe()
            )
            record = ClearRecord(
                request=request,
                outcome=APPLIED if applied else REFUSED,
                detail=detail,
                applied_at=self._clock(),
                boot_id=self._replay.boot_id,
                seq=self._folded_seq,
            )
            self.state.record_clear(record)
            log.warning("clear %s %s: %s (%s)", request.id, record.outcome, detail, request.describe())
            changed = True
        if changed and self._clear_store is not None:
            self._clear_store.save(self.state.clears)
        return events

    def _publish(self, events: list[Event], *, last_seq: int | None) -> None:
        snapshot = self.state.snapshot()
        pub = self._feed.publish(snapshot=snapshot, events=events, health=self._health(), inputs=self._inbox.taken)
        changed = snapshot.generation != self._published_generation
        self._published_generation = snapshot.generation
        if last_seq is not None or changed:
            self._pending.append((pub.number, last_seq, snapshot if changed else None))

    # ---- what the state directory keeps ----------------------------------------------------------

    def _acked(self) -> int:
        latest = self._feed.latest().number
        return min((ack() for ack in self._acks), default=latest)

    def _unsaved_state(self) -> bool:
        """Whether acknowledged conditions or an acknowledged cursor are still to be written."""
        seq = self._acked_seq
        cursor = self._cursor_store is not None and seq is not None and seq != self._saved_seq
        return cursor or (self._unsaved is not None and self._condition_store is not None)

    def _save_cursor(self, *, force: bool) -> None:
        """Keep conditions and cursor as of the newest publication every durable consumer acknowledged,
        written at most every ``CURSOR_INTERVAL`` (unless ``force``)."""
        acked = self._acked()
        while self._pending and self._pending[0][0] <= acked:
            _, seq, snapshot = self._pending.popleft()
            self._acked_seq = seq if seq is not None else self._acked_seq
            self._unsaved = snapshot or self._unsaved
        if not self._unsaved_state():
            return
        now = self._monotonic()
        if not force and now - self._last_save < CURSOR_INTERVAL:
            return
        self._last_save = now
        if self._unsaved is not None and self._condition_store is not None:
            self._condition_store.save(self._unsaved.conditions)
            self._unsaved = None
        seq = self._acked_seq
        if self._cursor_store is None or seq is None or seq == self._saved_seq:
            return
        try:
            self._cursor_store.save(Cursor(boot_id=self._replay.boot_id, last_seq=seq))
        except OSError as exc:
            if self._state_dir is not None:
                self._state_dir.report("cursor", f"cannot save {self._cursor_store.path}: {exc.strerror or exc}")
            else:
                log.error("cannot save the kmsg cursor: %s", exc)
            return
        self._saved_seq = seq
        if self._state_dir is not None:
            self._state_dir.report("cursor", None)

    def _shutdown(self) -> None:
        """Publish the last state, give durable consumers a moment to acknowledge, save the cursor."""
        events = self.state.expire()
        if events:
            self._publish(events, last_seq=None)
        deadline = self._monotonic() + FINAL_ACK_WAIT
        while self._pending and self._acked() < self._pending[-1][0] and self._monotonic() < deadline:
            time.sleep(0.02)
        self._save_cursor(force=True)


def _clears_finding(request: ClearRequest, finding: Finding) -> bool:
    """Whether ``request`` cleared what ``finding`` raises: its condition (only its device's, when it names one)."""
    if finding.condition != request.condition:
        return False
    return request.device is None or (finding.device is not None and device_matches(finding.device, request.device))
