"""Prometheus metrics, computed at scrape time from the state snapshot and the agent's own stats.

node-problem-detector compatible series (so existing dashboards and alerts keep working):

- ``problem_counter{reason}``: occurrences of each problem (temporary match or condition
  transition to True). Exposed untyped under NPD's exact name; the same numbers are also the
  proper counter ``node_health_agent_problems_total{reason}``.
- ``problem_gauge{type,reason}``: 1 while condition ``type`` is True with ``reason``, else 0;
  unlike NPD it returns to 0 when the condition clears.

Label values are bounded (:mod:`agent.core.bounds`): a reason is at most 128 bytes, and a condition or
temporary rule counts at most 64 distinct reasons beyond the configuration's literal ones; further
reasons are counted under ``reason="Other"`` and in
``node_health_agent_problems_overflowed_total{owner}``, so a storm of distinct values cannot grow
the number of series.

Per device: ``node_health_agent_device_problem{device,condition,reason}``, the open problems of each device a
finding named (``gpu:0000:3b:00.0``, ``neuron:neuron3``, ``rdma:efa_0``). A device this node does not show (a
line may name any address) is counted under ``device="Other"``, and so is any beyond
:data:`MAX_DEVICE_LABELS`: the series are bounded by the node's devices plus one. The existing series keep
their labels.

The agent's own health: ``node_health_agent_*`` (records read/lost, reader restarts, rule
matches, last record time, config generation, component health, condition status).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample

from agent.core.bounds import MAX_REASONS, OVERFLOW_REASON, bounded_reason, counted_reason
from agent.core.latency import HistogramSnapshot, histogram_metric
from agent.core.memo import Memo
from agent.core.types import Condition, Snapshot, Status

NPD_COUNTER_HELP = "Number of times a specific type of problem have occurred."
NPD_GAUGE_HELP = "Whether a specific type of problem is affecting the node or not."
MAX_DEVICE_LABELS = 64  # distinct device label values (a node has at most a few dozen devices)


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentStats:
    """The agent's own figures at one instant (built by the app at scrape time)."""

    records_read: int
    records_lost: int
    reader_restarts: int
    read_errors: int
    parse_errors: int
    last_record_time: float | None
    lines_matched: int
    rule_matches: Mapping[str, int]
    config_generation: int
    rules_loaded: int
    components: Mapping[str, bool]  # component -> healthy
    state_dir_ok: bool = True  # the state directory takes our writes
    records_processed: int = 0  # records the main loop has matched and folded
    malformed_lines: int = 0  # kmsg dictionary lines dropped as malformed (their records were kept)
    config_reload_failures: int = 0  # configuration changes rejected by the watcher
    device_matches: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (rule, device) -> matches
    kmsg_overruns: int = 0  # reads the kernel answered with EPIPE (records overwritten before read)
    decode_errors: int = 0  # record batches a source failed to decode (a bug)
    events_dropped: int = 0  # Event series dropped undelivered because the outbox was full
    monitor_counts: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (monitor, counter) -> count
    detection: HistogramSnapshot | None = None  # a problem's transition time to its first Node write (Kubernetes mode)
    # The catch-all (agent/detectors/catchall.py): error-level kernel records no rule knew, by subsystem (every
    # one, Event or held back by the window's bounds); those the platform-noise list silenced, by entry.
    unmatched_errors: Mapping[str, int] = field(default_factory=dict)
    platform_noise: Mapping[str, int] = field(default_factory=dict)


class AgentCollector:
    """A prometheus_client collector; ``snapshot`` and ``stats`` are called on every scrape."""

    def __init__(self, *, snapshot: Callable[[], Snapshot], stats: Callable[[], AgentStats]) -> None:
        self._snapshot = snapshot
        self._stats = stats
        # The same families (objects) while their figures stand: the renderer reuses their text.
        self._counts = _CountFamilies()
        self._conditions: Memo[_Conditions, tuple[Metric, ...]] = Memo(_condition_families)
        self._devices: Memo[_Conditions, tuple[Metric, ...]] = Memo(_device_families)
        self._overflowed: Memo[Mapping[str, int], tuple[Metric, ...]] = Memo(_overflow_families)
        self._own = _OwnFamilies()

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield from self._counts.families(snap.problem_counts)
        yield from self._conditions((snap.problem_pairs, snap.conditions))
        yield from self._devices((snap.problem_pairs, snap.conditions))
        yield from self._overflowed(snap.reasons_overflowed)
        yield from self._own.families(self._stats())


_Conditions = tuple[tuple[tuple[str, str], ...], tuple[Condition, ...]]  # a snapshot's problem pairs, conditions


class _CountFamilies:
    """problem_counter and node_health_agent_problems_total: the same numbers, NPD's name and ours.

    Built again when a count moves; a reason whose count stands keeps its sample objects, so the renderer
    writes only the moved reason's lines (there may be hundreds of reasons, a scrape after a kernel line
    should cost little: issue 16). When only counts moved (the same reasons), the moved ones are found by
    comparing the two mappings' items as sets, not by a walk through every reason.
    """

    def __init__(self) -> None:
        # What the last families were built from and their samples: (counts, reason -> place, NPD's, ours),
        # read and replaced as one (two scrapes at once each build from one consistent last).
        self._last: tuple[Mapping[str, int], Mapping[str, int], list[Sample], list[Sample]] = ({}, {}, [], [])
        self.families: Memo[Mapping[str, int], tuple[Metric, ...]] = Memo(self._build)

    def _build(self, counts: Mapping[str, int]) -> tuple[Metric, ...]:
        kept, place, kept_npd, kept_ours = self._last
        if counts.keys() == kept.keys():
            index = place
            npd, ours = list(kept_npd), list(kept_ours)  # the kept lists are never changed: other scrapes hold them
            for reason, count in counts.items() - kept.items():
                npd[index[reason]], ours[index[reason]] = _count_samples(reason, count)
        else:
            index, npd, ours = {}, [], []
            for at, (reason, count) in enumerate(sorted(counts.items())):
                was = place.get(reason)
                pair = (
                    (kept_npd[was], kept_ours[was])
                    if was is not None and kept[reason] == count
                    else _count_samples(reason, count)
                )
                index[reason] = at
                npd.append(pair[0])
                ours.append(pair[1])
        self._last = (counts, index, npd, ours)  # counts is a Memo key: a value, never changed in place
        npd_counter = Metric("problem_counter", NPD_COUNTER_HELP, "unknown")
        npd_counter.samples = npd
        problems = CounterMetricFamily(
            "node_health_agent_problems", "Problems detected, by reason (NPD problem_counter).", labels=["reason"]
        )
        problems.samples = ours
        return (npd_counter, problems)


def _count_samples(reason: str, count: int) -> tuple[Sample, Sample]:
    labels = {"reason": reason}
    return Sample("problem_counter", labels, count), Sample("node_health_agent_problems_total", labels, count)


def _condition_families(conditions: _Conditions) -> tuple[Metric, ...]:
    """problem_gauge (1 while a pair's condition is True with its reason) and each condition's status."""
    pairs, conds = set(conditions[0]), conditions[1]
    gauge = GaugeMetricFamily("problem_gauge", NPD_GAUGE_HELP, labels=["type", "reason"])
    status = GaugeMetricFamily(
        "node_health_agent_condition_status",
        "1 for the current status of each owned node condition (True = problem present).",
        labels=["condition", "status", "reason"],
    )
    active = {(c.type, counted_reason(c.type, c.reason, pairs=pairs)) for c in conds if c.status is Status.TRUE}
    for type_, reason in sorted(pairs):
        gauge.add_metric([type_, reason], 1.0 if (type_, reason) in active else 0.0)
    for cond in conds:
        status.add_metric([cond.type, cond.status.value, bounded_reason(cond.reason)], 1.0)
    return (gauge, status)


def _device_families(conditions: _Conditions) -> tuple[Metric, ...]:
    """node_health_agent_device_problem: open problems per (device, condition, reason)."""
    pairs, conds = set(conditions[0]), conditions[1]
    family = GaugeMetricFamily(
        "node_health_agent_device_problem",
        "Open problems of each device a finding named, by condition and reason (devices this node does not "
        "show, and any beyond the bound, count as Other).",
        labels=["device", "condition", "reason"],
    )
    named: set[str] = set()
    values: dict[tuple[str, str, str], int] = {}
    for cond in conds:
        if cond.status is not Status.TRUE:
            continue
        for problem in cond.devices:
            key = problem.device.key
            if problem.device.present and (key in named or len(named) < MAX_DEVICE_LABELS):
                named.add(key)
                device = key
            else:
                device = OVERFLOW_REASON
            reason = counted_reason(cond.type, problem.reason, pairs=pairs)
            reason = reason if (cond.type, reason) in pairs else OVERFLOW_REASON
            values[(device, cond.type, reason)] = values.get((device, cond.type, reason), 0) + 1
    for labels, value in sorted(values.items()):
        family.add_metric(list(labels), float(value))
    return (family,)


def _overflow_families(overflowed: Mapping[str, int]) -> tuple[Metric, ...]:
    family = CounterMetricFamily(
        "node_health_agent_problems_overflowed",
        f"Problems counted under reason {OVERFLOW_REASON!r} because their condition type or temporary rule "
        f"(owner) already had {MAX_REASONS} distinct reasons besides the configured ones.",
        labels=["owner"],
    )
    for owner, n in sorted(overflowed.items()):
        family.add_metric([owner], n)
    return (family,)


class _OwnFamilies:
    """The families drawn from the agent's own figures, each built again only when its own figure moves.

    After a kernel line four or five of these figures move (records read and processed, lines matched, the
    rule's matches, the newest record's time) and the other ~17 stand: building every family again and
    comparing each with the last (as before) was about half of a render after a kernel line, on the path from
    the line to ``/metrics`` (issue 16). Each family here has a key (the figure it shows) and a
    :class:`~agent.core.memo.Memo`: a figure that stands hands back the very family object of the last
    scrape, which the renderer recognises.
    """

    def __init__(self) -> None:
        self._memos = tuple((key, Memo(build)) for key, build in _OWN)

    def families(self, stats: AgentStats) -> Iterator[Metric]:
        for key, memo in self._memos:
            family = memo(key(stats))
            if family is not None:
                yield family


def _counter(name: str, doc: str) -> Callable[[float], Metric]:
    def build(value: float) -> Metric:
        family = CounterMetricFamily(f"node_health_agent_{name}", doc)
        family.add_metric([], value)
        return family

    return build


def _gauge(name: str, doc: str) -> Callable[[float], Metric]:
    def build(value: float) -> Metric:
        family = GaugeMetricFamily(f"node_health_agent_{name}", doc)
        family.add_metric([], value)
        return family

    return build


def _labelled(
    family: Callable[[], CounterMetricFamily | GaugeMetricFamily], value: Callable[[Any], float] = float
) -> Callable[[Mapping[Any, Any]], Metric]:
    """A family with one sample per item of a mapping (labels: the key, or the key's parts), sorted by key."""

    def build(items: Mapping[Any, Any]) -> Metric:
        made = family()
        for key, n in sorted(items.items()):
            made.add_metric(list(key) if isinstance(key, tuple) else [key], value(n))
        return made

    return build


def _last_record(time: tuple[float, float] | None) -> Metric:
    family = GaugeMetricFamily(
        "node_health_agent_last_record_timestamp_seconds", "Wall-clock time of the newest kernel log record."
    )
    if time is not None:
        family.add_metric([], time[0])
    return family


def _signed(value: float | None) -> tuple[float, float] | None:
    """A float as a memo key: 0.0 and -0.0 are equal but written differently."""
    return None if value is None else (value, math.copysign(1.0, value))


def _detection(value: HistogramSnapshot | None) -> Metric | None:
    if value is None:
        return None
    return histogram_metric(
        "node_health_agent_detection_seconds",
        "Seconds from a problem's transition time (a kernel line's own time, a check's run) to the Node "
        "showing it: time to detect.",
        value,
    )


# (the figure a family shows, as a memo key; the family built from it), in the order of /metrics
_OWN: tuple[tuple[Callable[[AgentStats], Any], Callable[[Any], Metric | None]], ...] = (
    (operator.attrgetter("records_read"), _counter("kmsg_records_read", "Kernel log records read.")),
    (
        operator.attrgetter("records_lost"),
        _counter("kmsg_records_lost", "Kernel log records lost (ring buffer overwrote them before reading)."),
    ),
    (
        operator.attrgetter("reader_restarts"),
        _counter("kmsg_reader_restarts", "Times the kernel log reader reopened its source."),
    ),
    (operator.attrgetter("read_errors"), _counter("kmsg_read_errors", "Errors reading the kernel log.")),
    (
        operator.attrgetter("parse_errors"),
        _counter("kmsg_parse_errors", "Kernel log records that could not be parsed."),
    ),
    (
        operator.attrgetter("malformed_lines"),
        _counter(
            "kmsg_malformed_lines", "Malformed kmsg dictionary lines dropped (the record they followed was kept)."
        ),
    ),
    (
        operator.attrgetter("kmsg_overruns"),
        _counter(
            "kmsg_overruns",
            "Reads the kernel answered with EPIPE: records overwritten before they were read (counted lost too).",
        ),
    ),
    (
        operator.attrgetter("decode_errors"),
        _counter(
            "decode_errors", "Record batches a source failed to decode (a bug: the agent's log has the traceback)."
        ),
    ),
    (
        operator.attrgetter("events_dropped"),
        _counter("events_dropped", "Event series dropped undelivered because the Event outbox was full."),
    ),
    (
        operator.attrgetter("monitor_counts"),
        _labelled(
            lambda: CounterMetricFamily(
                "node_health_agent_log_monitor",
                "Counts of each filelog/journald monitor's reader (records_read, read_errors, rotations, "
                "lines_cut, ...).",
                labels=["monitor", "count"],
            )
        ),
    ),
    (
        operator.attrgetter("records_processed"),
        _counter(
            "records_processed",
            "Kernel log records matched and folded by the main loop (records read minus this is the backlog).",
        ),
    ),
    (operator.attrgetter("lines_matched"), _counter("lines_matched", "Log lines run through the rule packs.")),
    (
        operator.attrgetter("rule_matches"),
        _labelled(
            lambda: CounterMetricFamily(
                "node_health_agent_rule_matches", "Findings produced, by rule.", labels=["rule"]
            )
        ),
    ),
    (lambda stats: _signed(stats.last_record_time), _last_record),
    (
        operator.attrgetter("config_generation"),
        _gauge("config_generation", "Generation of the loaded configuration."),
    ),
    (
        operator.attrgetter("config_reload_failures"),
        _counter(
            "config_reload_failures",
            "Configuration changes rejected (invalid); the last good configuration keeps running.",
        ),
    ),
    (
        operator.attrgetter("device_matches"),
        _labelled(
            lambda: CounterMetricFamily(
                "node_health_agent_rule_device_matches",
                "Matches of count-in-window rules (corrected errors, ...) by device, including those below the "
                "threshold that raised no Event.",
                labels=["rule", "device"],
            )
        ),
    ),
    (operator.attrgetter("rules_loaded"), _gauge("rules_loaded", "Rules loaded from all rule packs.")),
    (
        operator.attrgetter("unmatched_errors"),
        _labelled(
            lambda: CounterMetricFamily(
                "node_health_agent_kernel_unmatched_errors",
                "Kernel records at error level or worse that no rule matched and no platform-noise entry silenced, "
                "by subsystem (the catch-all; each subsystem's first in a window is a KernelError_<subsystem> "
                "Event).",
                labels=["subsystem"],
            )
        ),
    ),
    (
        operator.attrgetter("platform_noise"),
        _labelled(
            lambda: CounterMetricFamily(
                "node_health_agent_kernel_platform_noise",
                "Error-level kernel records the catch-all's platform-noise list silenced, by entry.",
                labels=["entry"],
            )
        ),
    ),
    (
        operator.attrgetter("components"),
        _labelled(
            lambda: GaugeMetricFamily(
                "node_health_agent_component_healthy",
                "1 while an agent component (kmsg reader, main loop, ...) is healthy; 0 means the agent, not the "
                "hardware, has a problem.",
                labels=["component"],
            ),
            lambda ok: 1.0 if ok else 0.0,
        ),
    ),
    (
        lambda stats: 1.0 if stats.state_dir_ok else 0.0,
        _gauge(
            "state_dir_ok",
            "1 while the state directory takes the cursor, conditions and Event outbox; 0 means restarts "
            "replay more and undelivered Events do not survive them (see /healthz details).",
        ),
    ),
    (operator.attrgetter("detection"), _detection),
)


def build_registry(*collectors: Collector) -> CollectorRegistry:
    """A fresh registry (never the process-global one) holding only our collectors."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry
