"""Explicit wiring of the running agent: source → pipeline → NodeState → sinks, plus HTTP.

Threads: one reads the kernel log into a bounded queue; the main loop (the caller's thread)
matches batches, folds findings into the state and hands events and snapshots to the sinks;
the HTTP server answers scrapes and probes. Everything stops when ``stop`` is set (SIGTERM or
SIGINT in the CLI), well within 5 s.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from agent.detectors.rulepack import RuleSet
from agent.pipeline import Batch, DetectionPipeline
from agent.sinks.log import snapshot_json
from agent.sinks.metrics import AgentCollector, AgentStats, build_registry
from agent.sources.kmsg import KmsgStats
from agent.sources.replay import Cursor, CursorStore, ReplayMode, replay_mode
from agent.state import NodeState
from agent.types import Condition, Event, LogRecord, Snapshot

log = logging.getLogger(__name__)

QUEUE_SIZE = 10_000  # records; when full the reader waits and the kernel ring buffer absorbs bursts
BATCH_SIZE = 4096
LOOP_TICK = 0.5
CURSOR_SAVE_INTERVAL = 1.0


class Source(Protocol):
    stats: KmsgStats

    def records(self, *, stop: threading.Event) -> Iterator[LogRecord]: ...


class Sink(Protocol):
    def publish(self, *, events: Sequence[Event], snapshot: Snapshot) -> None: ...

    def close(self) -> None: ...


class Agent:
    def __init__(
        self,
        *,
        rule_set: RuleSet,
        source: Source,
        sinks: Sequence[Sink],
        cursor_store: CursorStore | None,
        boot_id: str,
        lookback: float,
        stall_timeout: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        state: NodeState | None = None,
        aggregate: bool = False,
        config_generation: int = 1,
    ) -> None:
        self.rule_set = rule_set
        self.source = source
        self.sinks = list(sinks)
        self.cursor_store = cursor_store
        self.boot_id = boot_id
        self.lookback = lookback
        self.stall_timeout = stall_timeout
        self._clock = clock
        self._monotonic = monotonic
        self.pipeline = DetectionPipeline(rule_set=rule_set)
        self.state = state or NodeState(
            conditions=rule_set.conditions,
            clock=clock,
            reasons=rule_set.reasons,
            problem_pairs=[(r.condition, r.reason) for r in rule_set.rules if r.condition and "{" not in r.reason],
            aggregate=aggregate,
        )
        self._seeds: queue.Queue[tuple[list[Condition], threading.Event]] = queue.Queue()
        self.config_generation = config_generation
        self._queue: queue.Queue[LogRecord] = queue.Queue(maxsize=QUEUE_SIZE)
        self._snapshot = self.state.snapshot()
        self._snapshot_lock = threading.Lock()
        self._loop_beat = monotonic()
        self._reader: threading.Thread | None = None
        self._cursor = cursor_store.load() if cursor_store else None
        self._last_seq: int | None = None
        self._saved_seq: int | None = None
        self._last_save = 0.0
        self._save_failed = False
        self.collector = AgentCollector(snapshot=self.snapshot, stats=self.stats)
        self.registry = build_registry(self.collector)

    # ---- read side (HTTP, metrics) -------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._snapshot_lock:
            return self._snapshot

    def health(self) -> dict[str, bool]:
        now = self._monotonic()
        stats = self.source.stats
        reader_alive = self._reader is not None and self._reader.is_alive()
        reader_fresh = stats.last_activity is not None and now - stats.last_activity < self.stall_timeout
        return {
            "kmsg_reader": reader_alive and reader_fresh,
            "main_loop": now - self._loop_beat < self.stall_timeout,
        }

    def stats(self) -> AgentStats:
        s = self.source.stats
        return AgentStats(
            records_read=s.records_read,
            records_lost=s.records_lost,
            reader_restarts=s.reader_restarts,
            read_errors=s.read_errors,
            parse_errors=s.parse_errors,
            last_record_time=s.last_record_time,
            lines_matched=self.pipeline.lines_matched,
            rule_matches=dict(self.pipeline.rule_matches),
            config_generation=self.config_generation,
            rules_loaded=len(self.rule_set.rules),
            components=self.health(),
        )

    def seed(self, conditions: list[Condition]) -> threading.Event:
        """Thread-safe: have the main loop adopt conditions read from the Node (see NodeState.seed).

        The returned event is set once a snapshot containing them has been published.
        """
        done = threading.Event()
        self._seeds.put((conditions, done))
        return done

    def conditions_document(self) -> dict:
        doc = snapshot_json(self.snapshot())
        doc["health"] = self.health()
        return doc

    # ---- run --------------------------------------------------------------------------------

    def _read(self, stop: threading.Event) -> None:
        try:
            for record in self.source.records(stop=stop):
                while not stop.is_set():
                    try:
                        self._queue.put(record, timeout=LOOP_TICK)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except Exception:  # the source promises not to raise; if it does, /healthz turns red
            log.exception("kernel log reader died")

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set. Publishes the initial snapshot first."""
        self._reader = threading.Thread(target=self._read, args=(stop,), name="kmsg-reader", daemon=True)
        self._reader.start()
        self._publish([])
        try:
            while not stop.is_set():
                self.step(timeout=LOOP_TICK)
        finally:
            self._save_cursor(force=True)
            self._reader.join(timeout=3)
            for sink in self.sinks:
                try:
                    sink.close()
                except Exception:
                    log.exception("sink %s failed to close", type(sink).__name__)

    def step(self, *, timeout: float) -> int:
        """One iteration of the main loop: take what the reader queued, match, fold, publish."""
        records: list[LogRecord] = []
        try:
            records.append(self._queue.get(timeout=timeout))
            while len(records) < BATCH_SIZE:
                records.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        events: list[Event] = []
        seeded: list[threading.Event] = []
        while True:
            try:
                conditions, done = self._seeds.get_nowait()
            except queue.Empty:
                break
            events.extend(self.state.seed(conditions))
            seeded.append(done)
        for batch in self._batches(records):
            for finding in self.pipeline.process(batch):
                events.extend(self.state.apply(finding))
        events.extend(self.state.expire())
        if records and records[-1].seq is not None:
            self._last_seq = records[-1].seq
        self._publish(events)
        for done in seeded:
            done.set()
        self._loop_beat = self._monotonic()
        self._save_cursor(force=False)
        return len(records)

    def _batches(self, records: list[LogRecord]) -> Iterator[Batch]:
        """Split into runs of records with the same replay mode (see sources.kmsg.replay_mode)."""
        now = self._clock()
        run: list[LogRecord] = []
        run_mode: ReplayMode | None = None
        for record in records:
            mode = replay_mode(
                record=record, cursor=self._cursor, boot_id=self.boot_id, now=now, lookback=self.lookback
            )
            if run and mode is not run_mode:
                yield Batch(records=run, permanent_only=run_mode is ReplayMode.PERMANENT_ONLY)
                run = []
            run_mode = mode
            run.append(record)
        if run:
            yield Batch(records=run, permanent_only=run_mode is ReplayMode.PERMANENT_ONLY)

    def _publish(self, events: list[Event]) -> None:
        snapshot = self.state.snapshot()
        with self._snapshot_lock:
            self._snapshot = snapshot
        for sink in self.sinks:
            try:
                sink.publish(events=events, snapshot=snapshot)
            except Exception:  # one failing sink never blocks detection or the others
                log.exception("sink %s failed", type(sink).__name__)

    def _save_cursor(self, *, force: bool) -> None:
        if self.cursor_store is None or self._last_seq is None or self._last_seq == self._saved_seq:
            return
        now = self._monotonic()
        if not force and now - self._last_save < CURSOR_SAVE_INTERVAL:
            return
        self._last_save = now
        try:
            self.cursor_store.save(Cursor(boot_id=self.boot_id, last_seq=self._last_seq))
            self._saved_seq = self._last_seq
            self._save_failed = False
        except OSError as exc:
            if not self._save_failed:
                log.error("cannot save the kmsg cursor (restarts will replay more): %s", exc)
            self._save_failed = True
