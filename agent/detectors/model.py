"""The compiled rule set the matchers consume: what ``load_rule_set`` returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.core.devices import DeviceKind, DeviceRef, device_from
from agent.core.patterns import RulePattern
from agent.core.types import ConditionSpec, RuleType, Severity
from agent.detectors.catchall import CatchAllConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class Threshold:
    """Fire only once ``count`` matches with the same ``by`` fields happened within ``window`` seconds."""

    count: int
    window: float
    by: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceField:
    """A rule's ``device``: which of its fields names the device, and of what kind. ``fields`` are tried
    in order (an EFA line prints the RDMA device name and its PCI address; the name wins)."""

    kind: DeviceKind
    fields: tuple[str, ...]

    def device(self, fields: Mapping[str, object]) -> DeviceRef | None:
        """The device a finding's fields name, or None (the finding is then node-scoped)."""
        for name in self.fields:
            value = fields.get(name)
            if value is not None and (ref := device_from(self.kind, value)) is not None:
                return ref
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldFilter:
    field: str
    values: frozenset[str]
    negate: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class CompiledRule:
    name: str
    file: str
    index: int
    source: str
    type: RuleType
    condition: str | None
    reason: str  # may contain {field} placeholders
    severity: Severity
    pattern: str
    regex: RulePattern  # RE2, anchored at the end of the text as NPD does
    buffer_size: int  # the pack's bufferSize: NPD matches over this many lines
    multiline: bool  # False when the pattern provably cannot match across lines
    window: int  # lines the fast matcher joins: buffer_size if multiline else 1
    literals: tuple[str, ...] | None  # one of these occurs in every match; None = unknown
    requires: tuple[str, ...]  # all of these occur in every match (may be empty)
    suffix: str
    where: tuple[FieldFilter, ...]
    threshold: Threshold | None
    key_values: tuple[str, ...]
    field_types: Mapping[str, str]
    provenance: tuple[str, ...] = ()
    fallback: bool = False  # yields a finding only for a line that no non-fallback rule matched
    device: DeviceField | None = None  # which field names the device (None: the rule's findings name none)
    # Looks only at kernel records printed at this level or worse (0 = emerg ... 3 = err), and at lines whose
    # level is not known (a saved log without one): a rule written from error-level print sites.
    max_level: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleSet:
    rules: tuple[CompiledRule, ...]
    conditions: tuple[ConditionSpec, ...]
    files: tuple[str, ...]
    max_window: int
    # (replaced rule, the file whose unnamed rule of the same type, condition and reason took its place)
    replaced: tuple[tuple[str, str], ...] = ()
    # (unnamed rule not loaded, the earlier rule whose reason template already gives its reason on its
    # type and condition: a built-in rule such as neuron/hw-error's NeuronHasError_{error})
    covered: tuple[tuple[str, str], ...] = ()
    # The catch-all for error-level records no rule knows (``catchAll:`` files; None: none loaded, off).
    catch_all: CatchAllConfig | None = None

    def condition_spec(self, type_: str) -> ConditionSpec | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every literal (template-free) reason, for initialising metrics."""
        return tuple(dict.fromkeys(r.reason for r in self.rules if "{" not in r.reason))
