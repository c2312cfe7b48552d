"""The ``/metrics`` body: the Prometheus text format (0.0.4) of a registry, as ``generate_latest`` writes it.

prometheus-client's ``generate_latest`` checks and escapes every metric and label name of every sample
on every scrape (since 0.22, for UTF-8 names): about 10 µs a sample, 5 ms of the agent's CPU for its ~470
samples, all of it holding the interpreter lock that the main loop needs to fold a kernel line. The
names are the agent's own and do not change between scrapes, so this renderer checks and escapes each
name once (the library's own escaping, so a name outside the legacy character set comes out exactly as
the library writes it) and remembers it; label values and floats are written as the library writes
them. The output is byte-for-byte ``generate_latest``'s with its default escaping
(``tests/app/test_exposition.py`` holds the two to that on every metric type).

Nor is a family written again when it has not changed since the last scrape: the collectors keep
the same family objects while their figures stand (:mod:`agent.core.memo`), and the renderer reuses
the text of a family made of the very samples it wrote last time. Of a family that changed, only the
samples that differ from the last scrape's at the same place are written. Between two kernel lines
almost nothing changes, so a scrape holds the interpreter lock a fraction of a millisecond instead of
the 3-4 ms that the kernel log reader and the main loop waited out (issue 16: kmsg -> /metrics).
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from agent.core.memo import written_alike

# OpenMetrics samples that the text format puts in a gauge of their own after the family
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")
# How the text format names OpenMetrics types (and which suffix a counter's family name takes)
_TYPES = {
    "counter": "counter",
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}
_SUFFIXES = {"counter": "_total", "info": "_info"}
MAX_NAMES = 8192  # remembered escaped names (bounded: a collector may make up names)
MAX_FAMILIES = 4096  # families whose text is remembered (bounded likewise)
_NAME = operator.attrgetter("name")


@dataclass(frozen=True, slots=True)
class _Written:
    """A family as last written: what it was written from, and the text."""

    type: str
    documentation: str
    samples: tuple[Sample, ...]
    lines: tuple[str, ...]  # each sample's line, in the order of samples
    text: str

    def same(self, type_: str, documentation: str, samples: tuple[Sample, ...]) -> bool:
        """Whether this is the family as written: the very sample objects (a collector's memo, see
        :mod:`agent.core.memo`), the same type and help."""
        return (
            len(samples) == len(self.samples)
            and all(map(operator.is_, samples, self.samples))
            and self.type == type_
            and self.documentation == documentation
        )


class TextRenderer:
    """Renders a registry for one HTTP server; not thread-safe (the server renders in its loop thread)."""

    def __init__(self) -> None:
        self._metric_names: dict[str, str] = {}
        self._label_names: dict[str, str] = {}
        self._written: dict[str, _Written] = {}

    def render(self, registry: Collector) -> bytes:
        output: list[str] = []
        written = self._written
        for metric in registry.collect():
            samples = tuple(metric.samples)
            last = written.get(metric.name)
            if last is not None and last.same(metric.type, metric.documentation, samples):
                output.append(last.text)
                continue
            try:
                lines = self._lines(samples, last)
                text = self._family(metric.name, metric.type, metric.documentation, samples, lines)
            except Exception as exception:  # as generate_latest: name the family that failed
                exception.args = (exception.args or ("",)) + (metric,)
                raise
            if len(written) >= MAX_FAMILIES and metric.name not in written:
                written.clear()
            written[metric.name] = _Written(
                type=metric.type,
                documentation=metric.documentation,
                samples=samples,
                lines=lines,
                text=text,
            )
            output.append(text)
        return "".join(output).encode("utf-8")

    def _lines(self, samples: tuple[Sample, ...], last: _Written | None) -> tuple[str, ...]:
        """Each sample's line: the last scrape's where the sample at that place is alike (one count moved:
        one line written), a new one elsewhere."""
        if last is None:
            return tuple(map(self._sample, samples))
        before = last.samples
        if len(samples) != len(before):
            return tuple(
                last.lines[i] if i < len(before) and written_alike(sample, before[i]) else self._sample(sample)
                for i, sample in enumerate(samples)
            )
        lines = list(last.lines)
        # The very sample objects of last time are found at C speed; only the others are looked at.
        for i in itertools.compress(itertools.count(), map(operator.is_not, samples, before)):
            if not written_alike(samples[i], before[i]):
                lines[i] = self._sample(samples[i])
        return tuple(lines)

    def _family(
        self, name: str, type_: str, documentation: str, samples: tuple[Sample, ...], lines: tuple[str, ...]
    ) -> str:
        shown = self._metric_name(name + _SUFFIXES.get(type_, ""))
        doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
        output = [f"# HELP {shown} {doc}\n# TYPE {shown} {_TYPES.get(type_, type_)}\n"]
        apart = {name + suffix: suffix for suffix in _OPENMETRICS_SUFFIXES}
        if apart.keys().isdisjoint(map(_NAME, samples)):  # the usual family: its lines in order
            output.extend(lines)
            return "".join(output)
        openmetrics: dict[str, list[str]] = {}
        for sample, line in zip(samples, lines, strict=True):
            suffix = apart.get(sample.name)
            if suffix is None:
                output.append(line)
            else:
                openmetrics.setdefault(suffix, []).append(line)
        for suffix, grouped in sorted(openmetrics.items()):
            shown = self._metric_name(name + suffix)
            output.append(f"# HELP {shown} {doc}\n# TYPE {shown} gauge\n")
            output.extend(grouped)
        return "".join(output)

    def _sample(self, sample: Sample) -> str:
        labels = ""
        if sample.labels:
            label_name = self._label_name
            labels = ",".join(f'{label_name(k)}="{_label_value(v)}"' for k, v in sorted(sample.labels.items()))
            labels = f"{{{labels}}}"
        timestamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
        return f"{self._metric_name(sample.name)}{labels} {floatToGoString(sample.value)}{timestamp}\n"

    def _metric_name(self, name: str) -> str:
        shown = self._metric_names.get(name)
        return shown if shown is not None else _remember(self._metric_names, name, escape_metric_name(name))

    def _label_name(self, name: str) -> str:
        shown = self._label_names.get(name)
        return shown if shown is not None else _remember(self._label_names, name, escape_label_name(name))


def _remember(names: dict[str, str], name: str, shown: str) -> str:
    """``shown`` for ``name`` from now on (at most ``MAX_NAMES`` remembered: then forget them all)."""
    if len(names) >= MAX_NAMES:
        names.clear()
    names[name] = shown
    return shown


def _label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value
