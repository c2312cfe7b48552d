"""CloudWatch sink: a metric per published problem, as the Neuron recovery agent publishes them.

For each condition of the latest snapshot that is True and *selected* (``select(condition)``
returns the namespace to publish it in; None = not published), the sink puts the metric named by
the condition's reason (``NeuronHasError_DMA_ERROR``), value 1, unit Count, with exactly the
dimensions ``ClusterName`` (always) and ``InstanceId`` (when known).

- **Rate**: at most one round of PutMetricData per ``interval`` (60 s): one request per namespace
  (more only past 1000 metrics or 1 MB). The first problem after a quiet period is published at
  once; while it stays True it is published again every interval.
- **Back to healthy**: when a published metric's condition is no longer True (or its reason
  changed), the sink publishes one 0 for it (so alarms return to OK without waiting for missing
  data), then nothing more. A problem seen in any publication the sink took is published at least
  once, even if it healed before the interval was up.
- **Consumer only**: it reads the :class:`~agent.core.bus.SnapshotFeed` and never writes state;
  publishing runs in its own component thread, so a slow or failing AWS never delays detection.
- **Failures**: a failed round (after the publisher's own quick retries) is retried whole at the
  next interval, later on repeated failure (jittered exponential backoff up to ``max_backoff``),
  counted by kind (``transient``/``permanent``) in ``failures``, logged (a refused request once per
  error code) and shown in ``last_error`` (for /healthz details and the metrics below).
- **Any value**: a metric name is the reason made valid for CloudWatch (:func:`metric_name`: ASCII
  without control characters, at most 128 characters, cut as :func:`agent.core.bounds.bounded_reason`
  cuts it everywhere); a reason that leaves nothing to name is not published. A round sends the conditions that
  are True now plus at most ``max_flagged`` problems seen in between (a storm of distinct reasons
  does not become a round of thousands of metrics). Each skipped value is counted in ``skipped``
  and logged once; a datum CloudWatch's shape refuses is dropped alone, never the round.
- **Health**: the component is healthy while its loop runs, however AWS answers, *unless* every
  round has failed for ``unhealthy_after`` seconds (default 1 h; None = never): then the alarms
  have been blind that long and ``/healthz`` says so. Liveness then restarts the agent about once
  an hour while AWS keeps refusing, which keeps the failure visible (restart count) without
  stopping detection for more than a moment.

:class:`CloudWatchCollector` exposes the figures as ``node_health_agent_cloudwatch_*`` metrics.
"""

from __future__ import annotations

import collections
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.adapters.aws import AwsError, MetricDatum
from agent.core.bounds import MAX_REASON, bounded_reason
from agent.core.bus import Publication, SnapshotFeed
from agent.core.types import Condition, Provenance, Snapshot, Status
from agent.sinks.worker import IDLE, STALL, Failure, SinkWorker

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "NeuronHealthCheck"
CLUSTER_DIMENSION = "ClusterName"
INSTANCE_DIMENSION = "InstanceId"
DIMENSIONS = (CLUSTER_DIMENSION, INSTANCE_DIMENSION)  # every dimension the sink ever publishes, in this order
UNIT = "Count"
# The Neuron driver's unrecoverable errors (plugins/neuron/neuron-monitor.yaml: reason NeuronHasError_<TYPE>),
# published by default and alarmed on by daemonset/aws/cloudwatch-alarms.cfn.yaml.
NEURON_ERRORS = (
    "NeuronHasError_DMA_ERROR",
    "NeuronHasError_SRAM_UNCORRECTABLE_ERROR",
    "NeuronHasError_NC_UNCORRECTABLE_ERROR",
    "NeuronHasError_HBM_UNCORRECTABLE_ERROR",
    "NeuronHasError_HANG_ON_COLLECTIVES",
)
INTERVAL = 60.0
MAX_BACKOFF = 900.0
UNHEALTHY_AFTER = 3600.0
MAX_DIMENSION_VALUE = 1024
MAX_FLAGGED = 64  # problems seen between two rounds that are published besides the current ones
PUBLISH_TIME = 90.0  # the longest one round may take (timeouts and the publisher's retries): the loop's stall bound

Select = Callable[[Condition, Provenance | None], str | None]  # (condition, its owner) -> namespace or None


class Publisher(Protocol):
    def put_metrics(self, namespace: str, datums: Sequence[MetricDatum]) -> int:
        """Publish; the number of requests made. Raises :class:`~agent.adapters.aws.AwsError`."""


def metric_name(text: str, *, limit: int = MAX_REASON) -> str | None:
    """``text`` as a CloudWatch name or dimension value: characters other than printable ASCII become ``_``,
    cut to ``limit`` as :func:`~agent.core.bounds.bounded_reason` cuts; None when nothing but blanks is left.

    Names are cut at 128 (CloudWatch takes 255) so that a reason has the same name here as on the Node,
    in its Events and in Prometheus."""
    if not (text.isascii() and text.isprintable()):
        text = "".join(c if " " <= c <= "~" else "_" for c in text)
    text = bounded_reason(text, limit)
    return text if text.strip() else None


def select_reasons(reasons: Iterable[str] = NEURON_ERRORS, *, namespace: str = DEFAULT_NAMESPACE) -> Select:
    """A ``select``: True conditions whose reason matches one of ``reasons`` (shell globs) go to ``namespace``."""
    patterns = tuple(reasons)

    def select(condition: Condition, _owner: Provenance | None) -> str | None:
        return namespace if any(fnmatchcase(condition.reason, p) for p in patterns) else None

    return select


@dataclass(frozen=True, kw_only=True, slots=True)
class CloudWatchStats:
    requests: int = 0  # PutMetricData requests of successful rounds
    datums: int = 0  # values delivered
    rounds: int = 0  # successful rounds
    failures: Mapping[str, int] = field(default_factory=dict)  # failed rounds by kind (transient, permanent)
    last_error: str | None = None  # the latest failure; None again after a success
    last_success: float | None = None  # wall time of the latest successful round
    problems: int = 0  # metrics currently published as 1
    skipped: Mapping[str, int] = field(default_factory=dict)  # values not published, by why (name, flagged)
    bugs: int = 0  # unexpected errors caught (each skipped a value or a round)


_Key = tuple[str, str, tuple[tuple[str, str], ...]]  # namespace, metric name, dimensions


class CloudWatchSink(SinkWorker):
    """The ``cloudwatch`` component."""

    name = "cloudwatch"

    def __init__(
        self,
        *,
        feed: SnapshotFeed,
        publisher: Publisher,
        cluster_name: str,
        instance_id: Callable[[], str | None],
        select: Select | None = None,
        interval: float = INTERVAL,
        max_backoff: float = MAX_BACKOFF,
        unhealthy_after: float | None = UNHEALTHY_AFTER,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
        rng: Callable[[], float] = random.random,
        stall: float = STALL,
        max_flagged: int = MAX_FLAGGED,
    ) -> None:
        """``select`` None = :func:`select_reasons` (the Neuron errors, in ``NeuronHealthCheck``)."""
        if not cluster_name or metric_name(cluster_name, limit=MAX_DIMENSION_VALUE) != cluster_name:
            raise ValueError(
                f"the CloudWatch sink needs the cluster's name (the ClusterName dimension of every metric: printable "
                f"ASCII, at most {MAX_DIMENSION_VALUE} characters), not {cluster_name!r}"
            )
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        super().__init__(
            feed=feed,
            clock=clock,
            monotonic=monotonic,
            wait=wait,
            resync=interval,
            max_backoff=max(interval, max_backoff),
            rng=rng,
            stall=stall,
        )
        self._publisher = publisher
        self._cluster = cluster_name
        self._instance_id = instance_id
        self._select = select or select_reasons()
        self._interval = interval
        self._unhealthy_after = unhealthy_after
        self._current: set[tuple[str, str]] = set()  # (namespace, name) selected and True in the latest snapshot
        self._flagged: set[tuple[str, str]] = set()  # ... in any snapshot taken since the last round
        self._active: set[_Key] = set()  # published as 1 by the latest successful round
        self._next_round = float("-inf")  # monotonic time before which no round starts
        self._failing_since: float | None = None  # monotonic start of the current run of failed rounds
        self._requests = 0
        self._datums = 0
        self._last_success: float | None = None
        self._max_flagged = max_flagged
        self.skipped: collections.Counter[str] = collections.Counter()  # values not published, by why
        self._skip_logged: set[str] = set()

    # ---- SinkWorker --------------------------------------------------------------------------

    def take(self, pub: Publication) -> None:
        if pub.snapshot.seeded:
            self._current = self._selected(pub.snapshot)
            new = self._current - self._flagged
            room = max(0, self._max_flagged - len(self._flagged))
            if len(new) > room:  # a storm of distinct reasons: the current ones are still published
                self._skip("flagged", len(new) - room, f"more than {self._max_flagged} problems between two rounds")
                new = set(sorted(new)[:room])
            self._flagged |= new

    def work(self, now: float) -> float:
        if not (self._current or self._flagged or self._active):
            return IDLE  # nothing to say: no calls at all
        if now < self._next_round:
            return self._next_round - now
        self._round(*self._due(), now)
        return max(0.0, self._next_round - now)

    def finish(self, now: float) -> None:
        """At shutdown: one last round only if it tells CloudWatch something new (a new problem or a recovery)."""
        ones, zeros = self._due()
        if (zeros or ones - self._active) and not self.in_backoff(now):
            self._round(ones, zeros, now)

    def healthy(self, now: float) -> bool:
        if not super().healthy(now):
            return False
        failing = self._failing_since
        return self._unhealthy_after is None or failing is None or now - failing < self._unhealthy_after

    # ---- figures -----------------------------------------------------------------------------

    def stats(self) -> CloudWatchStats:
        return CloudWatchStats(
            requests=self._requests,
            datums=self._datums,
            rounds=self.writes,
            failures=dict(self.failures),
            last_error=self.last_error,
            last_success=self._last_success,
            problems=len(self._active),
            skipped=dict(self.skipped),
            bugs=self.bugs,
        )

    # ---- internals ---------------------------------------------------------------------------

    def _selected(self, snapshot: Snapshot) -> set[tuple[str, str]]:
        out = set()
        for cond in snapshot.conditions:
            if cond.status is not Status.TRUE or not cond.reason:
                continue
            namespace = self._select(cond, snapshot.provenance.get(cond.type))
            if not namespace:
                continue
            name = metric_name(cond.reason)
            if name is None:
                self._skip("name", 1, f"condition {cond.type}: reason {cond.reason[:80]!r} leaves no metric name")
            else:
                out.add((namespace, name))
        return out

    def _skip(self, why: str, n: int, text: str) -> None:
        """``n`` values not published because of ``why``: counted, logged once per why."""
        self.skipped[why] += n
        if why not in self._skip_logged:
            self._skip_logged.add(why)
            log.warning("CloudWatch: not published: %s (logged once; counted in the sink's skipped figures)", text)

    def _due(self) -> tuple[set[_Key], set[_Key]]:
        """(metrics to publish as 1, metrics to publish as 0) in the next round."""
        problems = self._current | self._flagged
        dims: list[tuple[str, str]] = [(CLUSTER_DIMENSION, self._cluster)]
        instance = self._instance_id() if problems else None
        if instance and (value := metric_name(instance, limit=MAX_DIMENSION_VALUE)):
            dims.append((INSTANCE_DIMENSION, value))
        ones = {(namespace, name, tuple(dims)) for namespace, name in problems}
        return ones, self._active - ones

    def _round(self, ones: set[_Key], zeros: set[_Key], now: float) -> None:
        timestamp = self._clock()
        by_namespace: dict[str, list[MetricDatum]] = collections.defaultdict(list)
        for value, keys in ((1.0, ones), (0.0, zeros)):
            for namespace, name, dims in sorted(keys):
                try:
                    datum = MetricDatum(name=name, value=value, dimensions=dims, timestamp=timestamp, unit=UNIT)
                except ValueError as exc:  # our names are made valid: a refusal here is a bug, not a round lost
                    self.unexpected(exc, what=f"metric {name[:80]!r}")
                    continue
                by_namespace[namespace].append(datum)
        self.beat(PUBLISH_TIME)
        requests = 0
        try:
            for namespace, datums in sorted(by_namespace.items()):
                requests += self._publisher.put_metrics(namespace, datums)
        except AwsError as exc:
            self._failed(exc, now)
            return
        self.succeeded()
        self._requests += requests
        self._datums += len(ones) + len(zeros)
        self._last_success = timestamp
        self._failing_since = None
        self._active = ones
        self._flagged = set()
        self._next_round = now + self._interval

    def _failed(self, exc: AwsError, now: float) -> None:
        """The sinks' one failure policy; a refused round is retried too (the next round is a new write)."""
        if self._failing_since is None:
            self._failing_since = now
        self.failed(exc, what="publishing to CloudWatch", now=now, retry_refused=True)
        self._next_round = now + self.retry_in(now)


# ---- Prometheus ----------------------------------------------------------------------------------

PREFIX = "node_health_agent_cloudwatch_"


class CloudWatchCollector:
    """``node_health_agent_cloudwatch_*``, computed at scrape time from :meth:`CloudWatchSink.stats`.

    - ``requests_total``: PutMetricData requests of successful rounds;
    - ``datums_total``: metric values delivered;
    - ``failures_total{kind}``: failed rounds, ``transient`` (throttling, 5xx, network) or
      ``permanent`` (refused: access denied, invalid);
    - ``last_success_timestamp_seconds``: when a round last succeeded;
    - ``failing``: 1 while the latest round failed;
    - ``problem_metrics``: metrics currently published as 1;
    - ``skipped_total{why}``: problems not published: ``name`` (a reason that leaves no valid metric
      name), ``flagged`` (past ``max_flagged`` problems between two rounds);
    - ``errors_total``: unexpected errors caught (a bug: see ``/healthz`` details).
    """

    def __init__(self, *, stats: Callable[[], CloudWatchStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield CounterMetricFamily(PREFIX + "requests", "PutMetricData requests of successful rounds.", value=s.requests)
        yield CounterMetricFamily(PREFIX + "datums", "Metric values delivered to CloudWatch.", value=s.datums)
        failures = CounterMetricFamily(
            PREFIX + "failures",
            "Failed publishing rounds by kind (transient: throttling, 5xx, network; permanent: refused).",
            labels=["kind"],
        )
        for kind in Failure:
            if kind is not Failure.GONE:
                failures.add_metric([kind.value], s.failures.get(kind, 0))
        yield failures
        if s.last_success is not None:
            yield GaugeMetricFamily(
                PREFIX + "last_success_timestamp_seconds",
                "When a publishing round last succeeded.",
                value=s.last_success,
            )
        yield GaugeMetricFamily(
            PREFIX + "failing", "1 while the latest publishing round failed.", value=float(bool(s.last_error))
        )
        yield GaugeMetricFamily(PREFIX + "problem_metrics", "Metrics currently published as 1.", value=s.problems)
        skipped = CounterMetricFamily(
            PREFIX + "skipped",
            "Problems not published: name (the reason leaves no valid metric name), flagged (too many between rounds).",
            labels=["why"],
        )
        for why in ("name", "flagged"):
            skipped.add_metric([why], s.skipped.get(why, 0))
        yield skipped
        yield CounterMetricFamily(
            PREFIX + "errors", "Unexpected errors caught in the CloudWatch sink (a bug).", value=s.bugs
        )
