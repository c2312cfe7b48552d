"""The ``/metrics`` body: the Prometheus text format (0.0.4) of a registry, as ``generate_latest`` writes it.

prometheus-client's ``generate_latest`` checks and escapes every metric and label name of every sample
on every scrape (since 0.22, for UTF-8 names): about 10 µs a sample, 5 ms of the agent's CPU for its ~470
samples, all of it holding the interpreter lock that the main loop needs to fold a kernel line. The
names are the agent's own and do not change between scrapes, so this renderer checks and escapes each
name once (the library's own escaping, so a name outside the legacy character set comes out exactly as
the library writes it) and remembers it; label values and floats are written as the library writes
them, every scrape. The output is byte-for-byte ``generate_latest``'s with its default escaping
(``tests/app/test_exposition.py`` holds the two to that on every metric type).
"""

from __future__ import annotations

from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

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


class TextRenderer:
    """Renders a registry for one HTTP server; not thread-safe (the server renders in its loop thread)."""

    def __init__(self) -> None:
        self._metric_names: dict[str, str] = {}
        self._label_names: dict[str, str] = {}

    def render(self, registry: Collector) -> bytes:
        output: list[str] = []
        for metric in registry.collect():
            try:
                self._family(metric.name, metric.type, metric.documentation, metric.samples, output)
            except Exception as exception:  # as generate_latest: name the family that failed
                exception.args = (exception.args or ("",)) + (metric,)
                raise
        return "".join(output).encode("utf-8")

    def _family(self, name: str, type_: str, documentation: str, samples: list[Sample], output: list[str]) -> None:
        shown = self._metric_name(name + _SUFFIXES.get(type_, ""))
        doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
        output.append(f"# HELP {shown} {doc}\n# TYPE {shown} {_TYPES.get(type_, type_)}\n")
        openmetrics: dict[str, list[str]] = {}
        for sample in samples:
            for suffix in _OPENMETRICS_SUFFIXES:
                if sample.name == name + suffix:
                    openmetrics.setdefault(suffix, []).append(self._sample(sample))
                    break
            else:
                output.append(self._sample(sample))
        for suffix, lines in sorted(openmetrics.items()):
            shown = self._metric_name(name + suffix)
            output.append(f"# HELP {shown} {doc}\n# TYPE {shown} gauge\n")
            output.extend(lines)

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
