"""The ``ib-ports`` check: RDMA ports (InfiniBand, RoCE, AWS EFA) present, up, fast enough, not flapping.

It owns the condition ``IbDev`` (healthy reason ``IbDevGood``), the name the Azure AKS NPD plugin
``check_ib.sh`` used; this check replaces that script. It is not an accelerator condition.

How a run judges a port (all times from ``context.clock()``):

- An expected port (``expectedDevices``) that is absent, or fewer ports than ``expectedPorts``, is a
  PROBLEM at once (``IbDeviceMissing``): nothing transient explains a configured port not existing.
- A port that is down (``state`` not ACTIVE or ``phys_state`` not LinkUp) does **not** flip the
  condition at once: links retrain (``Polling``, ``LinkErrorRecovery``), and one sample says little. The
  condition turns on a *drop* (down in every sample for ``dropAfter``, 4m as in GPUd) or a *flap*
  (``flapCount`` down→up cycles within ``flapWindow``), and clears after ``clearAfter`` without any
  down sample or new cycle. Until then a down port is noted in the OK message and in the metrics.
- A cycle is a sample seeing a port up after one seeing it down, or, between two samples that both
  saw it up, each increase of its ``link_downed`` counter (a bounce shorter than the interval).
- A port seen in an earlier run that has vanished counts as down; once that lasts ``dropAfter`` it
  is reported as ``IbDeviceMissing``. (Memory only: configure ``expectedDevices`` to survive restarts.)
- An up port slower than ``minRateGbps`` is ``IbRateLow`` at once (a link trained below its speed
  stays that way).
- Error counters exceeding their thresholds are a warning (``IbCounterErrors``, no condition).
- A port file that cannot be read or parsed makes the verdict UNKNOWN (when nothing else is wrong),
  naming the file and what was in it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.sdk import (
    CheckConfigError,
    CheckContext,
    CheckResult,
    CheckStatus,
    ConditionSpec,
    Severity,
    Value,
    format_duration,
    parse_duration,
)

from . import sysfs

CONDITION = "IbDev"
HEALTHY_REASON = "IbDevGood"
HEALTHY_MESSAGE = "RDMA ports are active"

NOT_APPLICABLE = "NoRdmaDevices"
DEVICE_MISSING = "IbDeviceMissing"
PORT_DROP = "IbPortDrop"
PORT_FLAPPING = "IbPortFlapping"
RATE_LOW = "IbRateLow"
PORT_UNREADABLE = "IbPortUnreadable"
COUNTER_ERRORS = "IbCounterErrors"
COUNTERS_UNREADABLE = "IbCountersUnreadable"

# Reasons in the order they win when several apply at once, with their severities.
PROBLEM_ORDER: tuple[tuple[str, Severity], ...] = (
    (DEVICE_MISSING, Severity.CRITICAL),
    (PORT_DROP, Severity.CRITICAL),
    (PORT_FLAPPING, Severity.ERROR),
    (RATE_LOW, Severity.ERROR),
)

LIST_LIMIT = 4  # items of one kind named in a message before "(+N more)"

DEFAULT_DROP_AFTER = 240.0  # GPUd: a port down for 4 minutes is a drop
DEFAULT_FLAP_COUNT = 3  # GPUd: 3 down→up cycles make a flap
DEFAULT_FLAP_WINDOW = 600.0  # 10m: fits 3 cycles seen at 30 s sampling twice over; GPUd's drop-clear time scale
DEFAULT_CLEAR_AFTER = 600.0  # GPUd: drops clear after 10 minutes healthy


# --------------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpectedPort:
    """``mlx5_0:1`` (that port) or ``mlx5_0`` (that device, with at least one port; all its ports watched)."""

    device: str
    port: int | None = None

    def __str__(self) -> str:
        return self.device if self.port is None else f"{self.device}:{self.port}"


@dataclass(frozen=True, kw_only=True, slots=True)
class CounterRule:
    """More than ``max`` increases of ``counter`` within ``window`` seconds (None: since the last run)."""

    counter: str
    max: float
    window: float | None = None

    def describe(self) -> str:
        if self.max == 0 and self.window is None:
            return "any increase"
        per = "run" if self.window is None else format_duration(self.window)
        return f"more than {self.max:g} per {per}"


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkPolicy:
    drop_after: float = DEFAULT_DROP_AFTER
    flap_count: int = DEFAULT_FLAP_COUNT
    flap_window: float = DEFAULT_FLAP_WINDOW
    clear_after: float = DEFAULT_CLEAR_AFTER


def _rule(counter: str, max_: float, window: float | None = None) -> tuple[str, CounterRule]:
    return counter, CounterRule(counter=counter, max=max_, window=window)


# NVSentinel's NIC thresholds (fatal: any increase of link_downed, excessive_buffer_overrun_errors,
# local_link_integrity_errors, rnr_nak_retry_err; symbol_error above 120/h; non-fatal rates below),
# and for EFA the EKS node monitoring agent's token bucket (burst 100 refilled 1/s, 1,000 for
# retrans_pkts), approximated as "more than burst + 60 in a minute". All are warnings here.
DEFAULT_COUNTER_THRESHOLDS: Mapping[str, CounterRule] = dict(
    (
        _rule("link_downed", 0),
        _rule("excessive_buffer_overrun_errors", 0),
        _rule("local_link_integrity_errors", 0),
        _rule("rnr_nak_retry_err", 0),
        _rule("symbol_error", 120, 3600.0),
        _rule("link_error_recovery", 5, 60.0),
        _rule("port_rcv_errors", 10, 1.0),
        _rule("port_xmit_discards", 100, 1.0),
        _rule("rdma_read_wr_err", 160, 60.0),
        _rule("rdma_write_wr_err", 160, 60.0),
        _rule("retrans_timeout_events", 160, 60.0),
        _rule("unresponsive_remote_events", 160, 60.0),
        _rule("impaired_remote_conn_events", 160, 60.0),
        _rule("retrans_pkts", 1060, 60.0),
    )
)

# Error counters exported as metrics by default: the PMA error counters (Linux sysfs.c) and the
# EFA error counters (AWS EFA monitoring page); every counter with a threshold is exported too.
DEFAULT_EXPORT_COUNTERS: tuple[str, ...] = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "rnr_nak_retry_err",
    "rx_drops",
    "rdma_read_wr_err",
    "rdma_write_wr_err",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)

OPTION_NAMES = frozenset(
    {
        "expectedDevices",
        "expectedPorts",
        "minRateGbps",
        "devices",
        "excludeDevices",
        "dropAfter",
        "flapCount",
        "flapWindow",
        "clearAfter",
        "counterThresholds",
        "exportCounters",
        "rememberPorts",
    }
)

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_EXPECTED = re.compile(r"([A-Za-z0-9_.\-]+)(?::(\d+))?")


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    expected: tuple[ExpectedPort, ...] = ()
    expected_ports: int | None = None
    min_rate_gbps: float | None = None
    devices: tuple[str, ...] = ("*",)
    exclude_devices: tuple[str, ...] = ()
    link: LinkPolicy = LinkPolicy()
    counter_rules: tuple[CounterRule, ...] = tuple(DEFAULT_COUNTER_THRESHOLDS.values())
    export_counters: frozenset[str] = frozenset(DEFAULT_EXPORT_COUNTERS)
    remember_ports: bool = True

    @property
    def expects_something(self) -> bool:
        return bool(self.expected) or bool(self.expected_ports)


def _number(options: Mapping[str, Any], key: str, *, minimum: float, integer: bool = False) -> float | None:
    value = options.get(key)
    if value is None:
        return None
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value < minimum:
        what = "an integer" if integer else "a number"
        raise CheckConfigError(key, f"expected {what} of at least {minimum:g}, got {value!r}")
    return value


def _duration(options: Mapping[str, Any], key: str, default: float) -> float:
    if options.get(key) is None:
        return default
    try:
        seconds = parse_duration(options[key])
    except ValueError as exc:
        raise CheckConfigError(key, str(exc)) from None
    if seconds <= 0:
        raise CheckConfigError(key, f"expected a duration above zero, got {options[key]!r}")
    return seconds


def _strings(options: Mapping[str, Any], key: str, default: Sequence[str]) -> tuple[str, ...]:
    value = options.get(key)
    if value is None:
        return tuple(default)
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) and v for v in value):
        raise CheckConfigError(key, f"expected a list of non-empty strings, got {value!r}")
    return tuple(value)


def _expected(options: Mapping[str, Any]) -> tuple[ExpectedPort, ...]:
    entries = []
    for text in _strings(options, "expectedDevices", ()):
        m = _EXPECTED.fullmatch(text.strip())
        if not m or (m.group(2) is not None and int(m.group(2)) < 1):
            raise CheckConfigError(
                "expectedDevices", f"expected 'device' or 'device:port' (e.g. 'mlx5_0:1'), got {text!r}"
            )
        entries.append(ExpectedPort(device=m.group(1), port=None if m.group(2) is None else int(m.group(2))))
    return tuple(entries)


def _counter_rules(options: Mapping[str, Any]) -> tuple[CounterRule, ...]:
    """Defaults, with ``counterThresholds`` entries replacing them by name (``null`` removes one)."""
    value = options.get("counterThresholds")
    if value is None:
        return tuple(DEFAULT_COUNTER_THRESHOLDS.values())
    if not isinstance(value, Mapping):
        raise CheckConfigError(
            "counterThresholds", f"expected a mapping of counter name to {{max, window}}, got {value!r}"
        )
    rules = dict(DEFAULT_COUNTER_THRESHOLDS)
    for counter, spec in value.items():
        field = f"counterThresholds.{counter}"
        if not isinstance(counter, str) or not _NAME.fullmatch(counter):
            raise CheckConfigError("counterThresholds", f"expected counter names as keys, got {counter!r}")
        if spec is None:
            rules.pop(counter, None)
            continue
        if not isinstance(spec, Mapping) or set(spec) - {"max", "window"} or "max" not in spec:
            raise CheckConfigError(field, f"expected {{max: <number>, window: <duration, optional>}}, got {spec!r}")
        try:
            maximum = _number(spec, "max", minimum=0)
            window = None if spec.get("window") is None else _duration(spec, "window", 0.0)
        except CheckConfigError as exc:
            raise CheckConfigError(f"{field}.{exc.field}", exc.message) from None
        rules[counter] = CounterRule(counter=counter, max=float(maximum or 0), window=window)
    return tuple(rules.values())


def parse_options(options: Mapping[str, Any]) -> Settings:
    """Validated settings; a bad option raises :class:`CheckConfigError` naming it."""
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        raise CheckConfigError(unknown[0], f"unknown option (known: {', '.join(sorted(OPTION_NAMES))})")
    expected_ports = _number(options, "expectedPorts", minimum=0, integer=True)
    flap_count = _number(options, "flapCount", minimum=1, integer=True)
    remember = options.get("rememberPorts", True)
    if not isinstance(remember, bool):
        raise CheckConfigError("rememberPorts", f"expected true or false, got {remember!r}")
    rate = _number(options, "minRateGbps", minimum=0)
    return Settings(
        expected=_expected(options),
        expected_ports=None if expected_ports is None else int(expected_ports),
        min_rate_gbps=None if rate is None else float(rate),
        devices=_strings(options, "devices", ("*",)),
        exclude_devices=_strings(options, "excludeDevices", ()),
        link=LinkPolicy(
            drop_after=_duration(options, "dropAfter", DEFAULT_DROP_AFTER),
            flap_count=DEFAULT_FLAP_COUNT if flap_count is None else int(flap_count),
            flap_window=_duration(options, "flapWindow", DEFAULT_FLAP_WINDOW),
            clear_after=_duration(options, "clearAfter", DEFAULT_CLEAR_AFTER),
        ),
        counter_rules=_counter_rules(options),
        export_counters=frozenset(_strings(options, "exportCounters", DEFAULT_EXPORT_COUNTERS)),
        remember_ports=remember,
    )


def matches(patterns: Sequence[str], device: str, port: int) -> bool:
    """Shell-style patterns: one with ``:`` matches ``device:port``, one without matches the device."""
    key = f"{device}:{port}"
    return any(fnmatch.fnmatchcase(key if ":" in p else device, p) for p in patterns)


# --------------------------------------------------------------------------------------------------
# Link drop / flap state machine (pure)


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkHistory:
    """What one port's samples so far mean. ``up`` is the last observation (None: never observed)."""

    seen_at: float | None = None
    up: bool | None = None
    down_since: float | None = None  # first sample of the current down stretch
    cycles: tuple[float, ...] = ()  # times of down→up cycles within the flap window
    last_bad: float | None = None  # last down sample or cycle
    dropped: bool = False
    flapping: bool = False
    link_downed: int | None = None

    @property
    def troubled(self) -> bool:
        return self.dropped or self.flapping


def observe_link(
    history: LinkHistory, *, now: float, up: bool | None, link_downed: int | None, policy: LinkPolicy
) -> LinkHistory:
    """The history after one sample. ``up=None`` (unreadable this time) changes nothing."""
    if up is None:
        return history
    if history.seen_at is not None and now < history.seen_at:  # the wall clock stepped back: restart timers
        history = replace(
            history,
            down_since=None if history.down_since is None else now,
            cycles=(),
            last_bad=None if history.last_bad is None else now,
        )
    new_cycles = 0
    if up and history.up is False:
        new_cycles = 1
    elif up and history.up and link_downed is not None and history.link_downed is not None:
        new_cycles = max(0, link_downed - history.link_downed)  # bounces between two up samples
    down_since = None if up else (now if history.down_since is None else history.down_since)
    cycles = tuple(t for t in history.cycles + (now,) * new_cycles if t > now - policy.flap_window)
    last_bad = now if (not up or new_cycles) else history.last_bad
    dropped = history.dropped or (down_since is not None and now - down_since >= policy.drop_after)
    flapping = history.flapping or len(cycles) >= policy.flap_count
    if (dropped or flapping) and last_bad is not None and now - last_bad >= policy.clear_after:
        dropped = flapping = False
        cycles = ()
    return LinkHistory(
        seen_at=now,
        up=up,
        down_since=down_since,
        cycles=cycles,
        last_bad=last_bad,
        dropped=dropped,
        flapping=flapping,
        link_downed=history.link_downed if link_downed is None else link_downed,
    )


# --------------------------------------------------------------------------------------------------
# Counter thresholds (pure)


@dataclass(frozen=True, kw_only=True, slots=True)
class CounterSample:
    at: float
    value: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Exceeded:
    increase: float  # within the rule's window (scaled to it when the samples are further apart)
    span: float  # seconds the increase was measured over


def observe_counter(
    samples: tuple[CounterSample, ...], *, now: float, value: int, rule: CounterRule
) -> tuple[tuple[CounterSample, ...], Exceeded | None]:
    """Samples to keep and whether the rule is exceeded now.

    The increase is measured from the oldest kept sample inside the window; when no earlier sample
    lies inside it (a window shorter than the interval) the last sample's increase is scaled to the
    window. A counter that went down (driver reset) or a clock that stepped back starts over.
    """
    current = CounterSample(at=now, value=value)
    if not samples or value < samples[-1].value or now <= samples[-1].at:
        return (current,), None
    if rule.window is None:
        base, scale = samples[-1], 1.0
        kept: tuple[CounterSample, ...] = (current,)
    else:
        inside = tuple(s for s in samples if s.at >= now - rule.window)
        base = inside[0] if inside else samples[-1]
        scale = 1.0 if inside else rule.window / (now - base.at)
        kept = inside + (current,)
    increase = (value - base.value) * scale
    return kept, (Exceeded(increase=increase, span=now - base.at) if increase > rule.max else None)


# --------------------------------------------------------------------------------------------------
# The check


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:LIST_LIMIT])
    return shown + (f" (+{len(items) - LIST_LIMIT} more)" if len(items) > LIST_LIMIT else "")


def _lasting(seconds: float) -> str:
    """`` for 1m30s`` after a word like "down"; nothing on the first sample that saw it."""
    return f" for {format_duration(seconds)}" if seconds > 0 else ""


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _port_labels(device: str, port: int) -> dict[str, str]:
    return {"device": device, "port": str(port)}


@dataclass(kw_only=True, slots=True)
class _Verdicts:
    """What one run found, gathered before one result is made of it."""

    problems: dict[str, list[str]]
    unknown: list[str]
    notes: list[str]
    active: list[str]
    watched: int = 0

    @classmethod
    def empty(cls) -> _Verdicts:
        return cls(problems={reason: [] for reason, _ in PROBLEM_ORDER}, unknown=[], notes=[], active=[])


class IbPortsCheck:
    """RDMA port presence, link state (drop/flap), rate and error counters. See the module docstring."""

    interval = 30.0  # GPUd samples ports every 30 s; 8 samples make a 4m drop
    timeout = 10.0

    def __init__(self, *, name: str, context: CheckContext, options: Mapping[str, Any]) -> None:
        self.name = name
        self._context = context
        self._settings = parse_options(options)
        self.conditions = (
            ConditionSpec(
                type=CONDITION, reason=HEALTHY_REASON, message=HEALTHY_MESSAGE, accelerator=False, source=name
            ),
        )
        self._rules = {rule.counter: rule for rule in self._settings.counter_rules}
        self._counter_names = frozenset(self._rules) | self._settings.export_counters | {"link_downed"}
        self._links: dict[str, LinkHistory] = {}
        self._samples: dict[tuple[str, str], tuple[CounterSample, ...]] = {}
        self._seen: set[str] = set()  # keys of the ports watched in earlier runs (rememberPorts)

    # -- which ports

    def _expected_here(self, device: str, port: int) -> bool:
        return any(e.device == device and e.port in (None, port) for e in self._settings.expected)

    def _selected(self, device: str, port: int) -> bool:
        s = self._settings
        if self._expected_here(device, port) or f"{device}:{port}" in self._seen:
            return True
        return matches(s.devices, device, port) and not matches(s.exclude_devices, device, port)

    def _watch(self, reading: sysfs.PortReading) -> bool:
        """Ports administratively Disabled are skipped unless expected or watched before."""
        if self._expected_here(reading.device, reading.port) or reading.key in self._seen:
            return True
        phys = reading.phys_state
        return isinstance(phys, sysfs.ReadError) or phys.code != sysfs.PHYS_DISABLED

    # -- the run

    def run(self) -> Sequence[CheckResult]:
        now = self._context.clock()
        scan = sysfs.scan(self._context.sys_root, select=self._selected, counter_names=self._counter_names)
        if scan.error is not None:
            return [self._result(CheckStatus.UNKNOWN, PORT_UNREADABLE, f"cannot list {scan.error}", Severity.ERROR)]
        readings = [r for r in scan.ports if self._watch(r)]
        verdicts = _Verdicts.empty()
        verdicts.watched = len(readings)
        verdicts.problems[DEVICE_MISSING].extend(self._missing_configured(scan, readings))
        verdicts.unknown.extend(f"cannot judge the ports of {e.path.parent.name}: {e}" for e in scan.device_errors)
        verdicts.notes.extend(f"{r.key} disabled, not watched" for r in scan.ports if not self._watch(r))
        values: list[Value] = []
        exceeded: list[str] = []
        counter_errors: list[str] = []
        present = {r.key for r in readings}
        for reading in readings:
            self._judge_port(reading, now, verdicts, values)
            exceeded.extend(self._judge_counters(reading, now, values))
            counter_errors.extend(str(e) for e in reading.counter_errors)
        for key in sorted(self._seen - present, key=sysfs.natural_key):
            self._judge_vanished(key, now, verdicts)
        if self._settings.remember_ports:
            self._seen.update(present)
        results = [self._condition_result(scan, verdicts, values)]
        if exceeded:
            results.append(
                CheckResult(
                    status=CheckStatus.PROBLEM,
                    condition=None,
                    reason=COUNTER_ERRORS,
                    message=f"RDMA error counters above their thresholds: {_listed(exceeded)}",
                    severity=Severity.WARNING,
                )
            )
        if counter_errors:
            results.append(
                CheckResult(
                    status=CheckStatus.UNKNOWN,
                    condition=None,
                    reason=COUNTERS_UNREADABLE,
                    message=f"cannot read RDMA counters: {_listed(counter_errors)}",
                    severity=Severity.WARNING,
                )
            )
        return results

    def _missing_configured(self, scan: sysfs.Scan, readings: Sequence[sysfs.PortReading]) -> list[str]:
        s = self._settings
        present_keys = {r.key for r in scan.ports}
        present_devices = {r.device for r in scan.ports}
        missing = [
            str(e)
            for e in s.expected
            if (e.device not in present_devices if e.port is None else f"{e.device}:{e.port}" not in present_keys)
        ]
        if not scan.present and s.expects_something:
            what = _listed(missing) if missing else f"at least {s.expected_ports} ports"
            return [f"{scan.class_dir} does not exist (RDMA driver not loaded?); expected {what}"]
        found = [f"missing {_listed(missing)}"] if missing else []
        if s.expected_ports and len(readings) < s.expected_ports:
            found.append(f"{len(readings)} RDMA ports present, expected at least {s.expected_ports}")
        return found

    def _judge_port(self, reading: sysfs.PortReading, now: float, verdicts: _Verdicts, values: list[Value]) -> None:
        labels = _port_labels(reading.device, reading.port)
        up = reading.link_up
        previous = self._links.get(reading.key, LinkHistory())
        history = observe_link(
            previous,
            now=now,
            up=up,
            link_downed=reading.counters.get("link_downed"),
            policy=self._settings.link,
        )
        self._links[reading.key] = history
        if up is None:
            verdicts.unknown.append(f"cannot judge {reading.key}: {'; '.join(map(str, reading.link_errors))}")
        else:
            values.append(Value(name="rdma_port_active", value=1.0 if up else 0.0, labels=labels))
        if isinstance(reading.rate, sysfs.Rate):
            values.append(Value(name="rdma_port_rate_gbps", value=reading.rate.gbps, labels=labels))
        self._judge_link(reading, history, now, verdicts)
        if up and self._settings.min_rate_gbps is not None:
            if isinstance(reading.rate, sysfs.ReadError):
                verdicts.unknown.append(f"cannot judge the rate of {reading.key}: {reading.rate}")
            elif reading.rate.gbps < self._settings.min_rate_gbps:
                verdicts.problems[RATE_LOW].append(
                    f"{reading.key} at {reading.rate}, below {self._settings.min_rate_gbps:g} Gb/s"
                )
        if up and isinstance(reading.rate, sysfs.Rate):
            verdicts.active.append(f"{reading.key} {reading.rate.gbps:g} Gb/s")
        elif up:
            verdicts.active.append(reading.key)

    def _judge_link(self, reading: sysfs.PortReading, history: LinkHistory, now: float, verdicts: _Verdicts) -> None:
        policy = self._settings.link
        state = f"state {reading.state}, phys_state {reading.phys_state}"
        down_for = None if history.down_since is None else _lasting(now - history.down_since)
        if history.dropped:
            if down_for is not None:
                verdicts.problems[PORT_DROP].append(f"{reading.key} down{down_for} ({state})")
            else:
                verdicts.problems[PORT_DROP].append(
                    f"{reading.key} was down for {format_duration(policy.drop_after)} or more, up again; "
                    f"clears after {format_duration(policy.clear_after)} without trouble"
                )
        window = format_duration(policy.flap_window)
        if history.flapping:
            seen = len(history.cycles)
            what = (
                f"went down and up {_times(seen)} within {window} (limit {policy.flap_count})"
                if seen >= policy.flap_count
                else f"was flapping ({policy.flap_count} or more down/up cycles within {window})"
            )
            verdicts.problems[PORT_FLAPPING].append(
                f"{reading.key} {what}; clears after {format_duration(policy.clear_after)} without trouble"
            )
        if not history.troubled and down_for is not None:
            verdicts.notes.append(
                f"{reading.key} down{down_for} ({state}; a drop after {format_duration(policy.drop_after)})"
            )
        elif not history.troubled and history.cycles:
            verdicts.notes.append(f"{reading.key} went down and up {_times(len(history.cycles))} within {window}")

    def _judge_vanished(self, key: str, now: float, verdicts: _Verdicts) -> None:
        """A port watched before that is gone counts as down; gone for ``dropAfter`` it is missing."""
        policy = self._settings.link
        history = observe_link(self._links.get(key, LinkHistory()), now=now, up=False, link_downed=None, policy=policy)
        self._links[key] = history
        gone_for = _lasting(now - (history.down_since or now))
        if history.dropped:
            verdicts.problems[DEVICE_MISSING].append(f"{key} gone{gone_for} (present earlier)")
        else:
            verdicts.notes.append(
                f"{key} gone{gone_for} (present earlier; missing after {format_duration(policy.drop_after)})"
            )

    def _judge_counters(self, reading: sysfs.PortReading, now: float, values: list[Value]) -> list[str]:
        found = []
        for counter, value in sorted(reading.counters.items()):
            if counter in self._settings.export_counters or counter in self._rules:
                labels = {**_port_labels(reading.device, reading.port), "counter": counter}
                values.append(Value(name="rdma_port_counter", value=float(value), labels=labels))
            rule = self._rules.get(counter)
            if rule is None:
                continue
            key = (reading.key, counter)
            self._samples[key], exceeded = observe_counter(self._samples.get(key, ()), now=now, value=value, rule=rule)
            if exceeded is not None:
                found.append(
                    f"{reading.key} {counter} +{exceeded.increase:g} in {format_duration(exceeded.span)} "
                    f"({rule.describe()})"
                )
        return found

    # -- results

    def _result(
        self, status: CheckStatus, reason: str, message: str, severity: Severity, values: Sequence[Value] = ()
    ) -> CheckResult:
        return CheckResult(
            status=status, condition=CONDITION, reason=reason, message=message, severity=severity, values=tuple(values)
        )

    def _condition_result(self, scan: sysfs.Scan, verdicts: _Verdicts, values: list[Value]) -> CheckResult:
        problems = [(reason, severity) for reason, severity in PROBLEM_ORDER if verdicts.problems[reason]]
        if problems:
            reason, severity = problems[0]
            parts = [_listed(verdicts.problems[r]) for r, _ in problems]
            if verdicts.unknown:
                parts.append(_listed(verdicts.unknown))
            return self._result(CheckStatus.PROBLEM, reason, "; ".join(parts), severity, values)
        if verdicts.unknown:
            parts = [_listed(verdicts.unknown), *verdicts.notes]
            return self._result(CheckStatus.UNKNOWN, PORT_UNREADABLE, "; ".join(parts), Severity.ERROR, values)
        if not verdicts.watched and not self._seen and not self._settings.expects_something:
            return self._result(CheckStatus.OK, NOT_APPLICABLE, self._not_applicable(scan, verdicts), Severity.INFO)
        summary = f"{len(verdicts.active)} of {verdicts.watched} RDMA ports active"
        if verdicts.active:
            summary += f": {_listed(verdicts.active)}"
        return self._result(
            CheckStatus.OK, HEALTHY_REASON, "; ".join([summary, *verdicts.notes]), Severity.INFO, values
        )

    def _not_applicable(self, scan: sysfs.Scan, verdicts: _Verdicts) -> str:
        if not scan.present:
            return f"no RDMA devices on this node ({scan.class_dir} does not exist) and none expected"
        if verdicts.notes:
            return f"no RDMA port in use and none expected: {_listed(verdicts.notes)}"
        return f"no RDMA ports on this node match devices {list(self._settings.devices)} and none expected"
