"""Matching log lines against rule packs, with node-problem-detector semantics.

Semantics (the same in both engines here): every line is pushed into a buffer of the pack's
``bufferSize`` lines; a rule matches when its pattern matches up to the end of the newest line,
on the newest line alone or across the buffered lines joined with ``\\n``; the message is the
matched lines (from the one where the match starts to the newest) plus the optional suffix.
Several rules may fire for one line; findings come out in line order, then rule order.

``RuleEngine`` is the fast matcher used by the agent. ``ReferenceEngine`` follows NPD literally
(every rule over the joined buffer, for every line); tests check that both always agree. Rule
regexes are RE2 (``agent.core.patterns``): linear time, so no pattern can stall the loop.

How the fast matcher avoids running every regex on every line: each rule's pattern is analysed
for literal strings that must occur in any match (``regex.required_literals``). All literals go
into one RE2 literal set (``prefilter``), scanned over a whole batch of lines at once in C, with
no per-line Python work. Only lines where a literal occurs are looked at again: the set of literals
found in a line decides its candidate rules through a plan made once per literal set (rules sorted
for evaluation, fallbacks last; the literal runs each rule requires beyond the literals found, checked
once per group of rules that share them), and only those rules' regexes run, once per pattern per
line. Rules that can match across lines stay armed for ``bufferSize`` lines after a line with their
literal; rules without a known literal run on every line (correct, just slower). Lines read from the
kernel's own /dev/kmsg come with the chunk's bytes (``raw_lines``): the prefilter scans those instead
of the lines joined, and a line is cut from its record only when a rule looks at it; a literal found in
a record's prefix only makes the line a candidate (each candidate rule's regex still decides). A
``fallback`` rule is tried on a line only after the line's other rules, and only if none of them matched. Rules that
share a pattern (one per Xid list) and differ by ``where`` filters on its groups are sorted out by
``FindingBuilder.admits`` before a finding is built.
"""

from __future__ import annotations

import collections
import functools
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.bounds import bounded_reason
from agent.core.devices import DeviceRef
from agent.core.patterns import PatternMatch
from agent.core.types import Finding, RuleType, Status
from agent.detectors.model import CompiledRule, DeviceField, FieldFilter, RuleSet
from agent.detectors.prefilter import CACHED_SETS, Prefilter

log = logging.getLogger(__name__)

_KV_KEY_RE = re.compile(r"[A-Za-z0-9_.-]+")
MAX_THRESHOLD_KEYS = 4096
MAX_CONVERSIONS = 4096  # remembered group conversions (bounded: group texts come from the log)
_UNSEEN = object()


class _FindingSlots:
    """``Finding``'s memory layout without its frozen ``__setattr__`` (see ``FindingBuilder.build``; the
    ``__class__`` assignment is allowed between classes with identical ``__slots__``). Every field must be
    stored: ``tests/detectors/test_rules_engine.py`` checks that a built finding equals ``Finding(...)``."""

    __slots__ = Finding.__slots__


class FindingBuilder:
    """Turns a rule match into a Finding: fields, filters, thresholds, reason templates.

    Holds the count-in-window state of threshold rules (bounded: at most ``MAX_THRESHOLD_KEYS``
    keys per rule, each remembering at most ``count`` timestamps).
    """

    def __init__(self) -> None:
        self._windows: dict[str, collections.OrderedDict[tuple, collections.deque[float]]] = {}
        # Every match of a threshold rule, by its `by` values (e.g. corrected errors per device), quiet
        # ones included: what the per-device counter metric reports. Bounded like the windows.
        self.counts: dict[str, collections.OrderedDict[str, int]] = {}
        # rule name -> the filters decidable on the groups, each with its field's type ("" = text)
        self._early: dict[str, tuple[tuple[FieldFilter, str], ...]] = {}
        self._conversions: dict[tuple[str, str], str | None] = {}  # (group text, type) -> as compared
        self._devices: dict[tuple[DeviceField, tuple], DeviceRef | None] = {}  # (rule's field, values) -> device

    def admits(self, rule: CompiledRule, groups: Mapping[str, str | None]) -> bool:
        """Whether the ``where`` filters that the pattern's groups decide alone let the match through.

        Rules that share a pattern (one per Xid list, ...) mostly differ by these filters: the matchers
        ask before ``build``, which checks every filter again on the finished fields."""
        early = self._early.get(rule.name)
        if early is None:
            early = self._early[rule.name] = _early_filters(rule)
        for flt, kind in early:
            value = groups.get(flt.field)
            if value is not None and kind:
                value = self._as_compared(value, kind)
            if (value is not None and value in flt.values) == flt.negate:
                return False
        return True

    def build(
        self, rule: CompiledRule, *, match: PatternMatch, message: str, timestamp: float, line: int | None
    ) -> Finding | None:
        """The finding of a match (None where a ``where`` filter or the threshold holds it back)."""
        groups = match.named_groups()
        fields: dict[str, Any] = {k: v for k, v in groups.items() if v is not None}
        if rule.key_values:
            for key, value in key_values(message, wanted=rule.key_values):
                fields.setdefault(key.replace("-", "_"), value)
        if rule.field_types:
            for name, kind in rule.field_types.items():
                if name in fields:
                    typed = _typed(fields[name], kind)
                    if typed is None:
                        log.debug("rule %s: field %s=%r is not %s", rule.name, name, fields[name], kind)
                        del fields[name]
                    else:
                        fields[name] = typed
        for flt in rule.where:
            present = flt.field in fields and str(fields[flt.field]) in flt.values
            if present == flt.negate:
                return None
        if rule.threshold is not None and not self._count(rule, fields, timestamp):
            return None
        reason = bounded_reason(rule.reason.format_map(_Fields(fields))) if "{" in rule.reason else rule.reason
        if rule.suffix:
            message = f"{message}; {rule.suffix}"
        # Filled as its slot twin, then made a real, frozen Finding (docs/benchmarks.md, "The kmsg fast path").
        finding: Any = object.__new__(_FindingSlots)
        finding.rule = rule.name
        finding.type = rule.type
        finding.condition = rule.condition
        finding.reason = reason
        finding.severity = rule.severity
        finding.message = message
        finding.timestamp = timestamp
        finding.source = rule.source
        finding.fields = fields
        finding.line = line
        finding.status = Status.TRUE
        finding.device = None if rule.device is None else self._device(rule.device, fields)
        finding.__class__ = Finding
        return finding

    def _device(self, spec: DeviceField, fields: Mapping[str, Any]) -> DeviceRef | None:
        """The device the fields name, remembered (a storm names the same few devices again and again)."""
        key = (spec, tuple(fields.get(name) for name in spec.fields))
        found = self._devices.get(key, _UNSEEN)
        if found is _UNSEEN:
            if len(self._devices) >= MAX_CONVERSIONS:
                self._devices.clear()
            found = self._devices[key] = spec.device(fields)
        return found  # type: ignore[return-value]

    def _as_compared(self, value: str, kind: str) -> str | None:
        """A group's text as ``build`` compares it after ``fieldTypes`` (None where the conversion fails),
        remembered: the rules of one pattern convert the same group once per line each."""
        key = (value, kind)
        if key in self._conversions:
            return self._conversions[key]
        if len(self._conversions) >= MAX_CONVERSIONS:
            self._conversions.clear()
        typed = _typed(value, kind)
        converted = self._conversions[key] = None if typed is None else str(typed)
        return converted

    def _count(self, rule: CompiledRule, fields: dict[str, Any], timestamp: float) -> bool:
        threshold = rule.threshold
        assert threshold is not None
        per_rule = self._windows.setdefault(rule.name, collections.OrderedDict())
        key = tuple(str(fields.get(b, "")) for b in threshold.by)
        counts = self.counts.setdefault(rule.name, collections.OrderedDict())
        label = ",".join(f"{b}={v}" for b, v in zip(threshold.by, key, strict=True))
        counts[label] = counts.get(label, 0) + 1
        counts.move_to_end(label)
        if len(counts) > MAX_THRESHOLD_KEYS:
            counts.popitem(last=False)
        times = per_rule.get(key)
        if times is None:
            times = per_rule[key] = collections.deque(maxlen=threshold.count)
            if len(per_rule) > MAX_THRESHOLD_KEYS:
                per_rule.popitem(last=False)
        else:
            per_rule.move_to_end(key)
        times.append(timestamp)
        while times and times[0] < timestamp - threshold.window:
            times.popleft()
        return len(times) >= threshold.count


def _early_filters(rule: CompiledRule) -> tuple[tuple[FieldFilter, str], ...]:
    """The rule's ``where`` filters whose outcome the pattern's groups decide alone (the field cannot
    come from ``keyValues`` instead), each with the field's type."""
    from_key_values = {k.replace("-", "_") for k in rule.key_values}
    return tuple((f, rule.field_types.get(f.field, "")) for f in rule.where if f.field not in from_key_values)


def _typed(value: str, kind: str) -> str | int | None:
    """A field's text as ``fieldTypes`` makes it: a number for ``int``/``hex`` (None where it is not one),
    the text for any other type."""
    try:
        if kind == "int":
            return int(value)
        if kind == "hex":
            return int(value, 16)
    except ValueError:
        return None
    return value


def key_values(message: str, *, wanted: Sequence[str]) -> list[tuple[str, str]]:
    """The ``key=value`` tokens of ``message`` whose key is wanted, in order.

    A token starts the message or follows whitespace; the key is ``[A-Za-z0-9_.-]+`` and the
    value runs to the next whitespace (it may contain ``=``).
    """
    found: list[tuple[str, str]] = []
    for token in message.split():
        key, eq, value = token.partition("=")
        if eq and value and key in wanted and _KV_KEY_RE.fullmatch(key):
            found.append((key, value))
    return found


class _Fields(dict):
    def __missing__(self, key: str) -> str:
        return "Unknown"


def _line_meta(values: Sequence[float] | float, index: int) -> float:
    return values if isinstance(values, int | float) else values[index]


def split_lines(lines: Iterable[str]) -> list[str]:
    """Split multi-line messages into the single lines the engines expect."""
    out: list[str] = []
    for line in lines:
        if "\n" in line:
            out.extend(line.split("\n"))
        else:
            out.append(line)
    return out


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a set of literals found in one line makes of it: the rules to try, in evaluation order."""

    arms: tuple[int, ...]  # multi-line rules the literals arm (tried on their window from this line on)
    checks: tuple[tuple[int, str], ...]  # (group, a run the line must contain for it) still to look for
    ordered: tuple[tuple[int, int], ...]  # (rule index, its group), evaluation order
    rules: tuple[int, ...]  # the rule indexes of ``ordered``: every group passed


MAX_PLANS = 4096  # distinct literal sets remembered (a hostile stream cannot grow the cache without bound)


@dataclass(frozen=True, slots=True)
class _Index:
    """A literal set's rules by literal and its scanner: what engines built from the same rules share."""

    by_literal: Mapping[str, tuple[int, ...]]
    prefilter: Prefilter | None
    in_place: bool  # raw lines can be scanned in place of the lines joined: no literal spans lines


@functools.lru_cache(maxsize=CACHED_SETS)
def _index(literals: tuple[tuple[int, tuple[str, ...]], ...]) -> _Index:
    """The index of (rule index, its literals) pairs: one build per rule set in a process (a test suite, a
    ``simulate`` run or a reload builds engines for the same rules many times; the print-site packs' ~2,300
    literals took a few milliseconds to index per engine)."""
    by_literal: dict[str, list[int]] = {}
    for i, lits in literals:
        for lit in lits:
            by_literal.setdefault(lit, []).append(i)
    return _Index(
        by_literal={lit: tuple(ks) for lit, ks in by_literal.items()},
        prefilter=Prefilter.build(by_literal) if by_literal else None,
        in_place=not any("\n" in lit for lit in by_literal),
    )


@dataclass(slots=True)
class _Literals:
    """One literal set of the prefilter phase: its scanner, the rules each literal makes candidates, and the
    plans made of the literal sets lines held (a cache, bounded by ``MAX_PLANS``)."""

    by_literal: Mapping[str, tuple[int, ...]]
    prefilter: Prefilter | None
    in_place: bool  # raw lines can be scanned in place of the lines joined: no literal spans lines
    plans: dict[frozenset[str], _Plan]

    @classmethod
    def build(cls, rules: Sequence[CompiledRule], indexes: Iterable[int]) -> _Literals:
        index = _index(tuple((i, tuple(rules[i].literals or ())) for i in indexes))
        return cls(by_literal=index.by_literal, prefilter=index.prefilter, in_place=index.in_place, plans={})


class RuleEngine:
    """The fast matcher (see the module docstring). Not thread-safe: one engine per stream."""

    def __init__(self, *, rule_set: RuleSet) -> None:
        self.rule_set = rule_set
        self._builder = FindingBuilder()
        rules = rule_set.rules
        # Evaluation order within a line: a line's fallback rules after its other rules, otherwise rule order.
        self._rank = tuple(i + (len(rules) if r.fallback else 0) for i, r in enumerate(rules))
        # Rules that share a pattern and window match it once per line.
        self._memo_key = tuple((r.pattern, r.window) for r in rules)
        self._filtered = tuple(bool(r.where) for r in rules)  # ask ``admits`` before ``build``
        multiline = [r.name for r in rules if r.literals is not None and r.multiline]
        if multiline:
            log.debug(
                "rules that can match across lines are tried on their window after each literal: %s",
                ", ".join(multiline),
            )
        self._always = tuple(i for i, r in enumerate(rules) if r.literals is None and r.max_level is None)
        # Rules without a literal that look only at records of a level or worse: (rule index, level).
        self._always_gated = tuple(
            (i, r.max_level) for i, r in enumerate(rules) if r.literals is None and r.max_level is not None
        )
        if self._always or self._always_gated:
            log.info(
                "rules without a required literal run on every line (slower): %s",
                ", ".join(r.name for r in rules if r.literals is None),
            )
        gated = {i for i, r in enumerate(rules) if r.max_level is not None}
        # The levels gated rules ask for (a batch's ``levels`` gives the lines at each), strictest last.
        self.gate_levels: tuple[int, ...] = tuple(sorted({rules[i].max_level for i in gated}, reverse=True))  # type: ignore[misc]
        # With levels known, the rules open to every line scan every line, and the gated rules (most of the
        # print-site packs' literals) only the few lines of their level: one scan of the batch stays small.
        self._open = _Literals.build(rules, [i for i in range(len(rules)) if i not in gated])
        self._gated = _Literals.build(rules, sorted(gated)) if gated else None
        # Every rule's literals, for the batches whose lines' levels are not known (a saved log, a test's
        # lines): built at the first such batch. Its scanner holds every literal again (about 9 MiB with the
        # print-site packs), which an agent reading /dev/kmsg, where every record has its level, never needs.
        self._every_stage: _Literals | None = None if gated else self._open
        self._history: collections.deque[str] = collections.deque(maxlen=max(rule_set.max_window - 1, 0))
        self._armed: dict[int, int] = {}  # multiline rule index -> last absolute line index it stays armed
        self._seen = 0  # absolute index of the next line

    def _every(self) -> _Literals:
        if self._every_stage is None:
            self._every_stage = _Literals.build(self.rule_set.rules, range(len(self.rule_set.rules)))
        return self._every_stage

    def _plan(self, stage: _Literals, literals: frozenset[str]) -> _Plan:
        """The rules a line containing ``literals`` may match: multi-line rules to arm, single-line rules
        grouped by the runs they require beyond the literals found (rules sharing a pattern check them
        once)."""
        rules = self.rule_set.rules
        by_literal = stage.by_literal
        indexes = sorted({k for lit in literals for k in by_literal.get(lit, ())}, key=self._rank.__getitem__)
        groups: dict[tuple[str, ...], int] = {}
        ordered: list[tuple[int, int]] = []
        for k in indexes:
            if rules[k].multiline:
                continue
            # A run inside a literal found in the line is in the line: no need to look for it.
            runs = tuple(run for run in rules[k].requires if not any(run in lit for lit in literals))
            ordered.append((k, groups.setdefault(runs, len(groups))))
        plan = _Plan(
            arms=tuple(k for k in indexes if rules[k].multiline),
            checks=tuple((g, run) for runs, g in groups.items() for run in runs),
            ordered=tuple(ordered),
            rules=tuple(k for k, _g in ordered),
        )
        if len(stage.plans) >= MAX_PLANS:
            stage.plans.clear()
        stage.plans[literals] = plan
        return plan

    def threshold_counts(self) -> dict[tuple[str, str], int]:
        """(rule, ``by`` values) -> matches so far, for threshold rules (per-device counters)."""
        return {
            (rule, key): n for rule, counts in list(self._builder.counts.items()) for key, n in dict(counts).items()
        }

    def feed(
        self,
        lines: Sequence[str],
        *,
        times: Sequence[float] | float = 0.0,
        line_numbers: Sequence[int] | int | None = None,
        permanent_only: bool = False,
        raw_lines: bytes | None = None,
        matched: list[int] | None = None,
        levels: Mapping[int, Sequence[int]] | None = None,
    ) -> list[Finding]:
        """Match a batch of lines (no newlines inside) and return the findings in order.

        ``times``/``line_numbers`` give each line's timestamp and number (a scalar applies to all
        lines; an int line number is the first line's number). With ``permanent_only`` temporary
        findings are dropped (replaying records that were already processed before a restart).
        ``raw_lines``: the lines as read, one ``\n``-ended line each holding its line of ``lines`` verbatim
        (``RecordColumns.raw_lines``): the prefilter scans these instead of ``lines`` joined, where no
        literal spans lines; ``lines`` is then indexed only for the lines a rule looks at.
        ``matched``: where given, the index of every line some rule's pattern matched (a finding or not: a
        ``where`` filter or a threshold held it back) is appended, and every line a multi-line match spans:
        the lines the rules know, which the catch-all leaves alone.
        ``levels``: for each of :attr:`gate_levels`, the indexes (ascending) of the lines whose record the
        kernel printed at that level or worse, or whose level is not known: the only lines a rule with that
        ``maxLevel`` looks at. None: no line's level is known, and every rule looks at every line.
        """
        n = len(lines)
        base = self._seen
        work = self._candidates(lines, raw_lines, base, levels if self._gated is not None else None)
        findings = self._match(
            work, lines, times=times, line_numbers=line_numbers, permanent_only=permanent_only, matched=matched
        )
        if self._history.maxlen:
            self._history.extend(lines[-self._history.maxlen :])
        self._seen = base + n
        return findings

    def _candidates(
        self,
        lines: Sequence[str],
        raw_lines: bytes | None,
        base: int,
        levels: Mapping[int, Sequence[int]] | None,
    ) -> dict[int, Sequence[int]]:
        """Line index -> candidate rule indexes in evaluation order, for the lines of the batch that have any.

        Updates the armed multi-line rules: armed by this batch's lines, dropped once their window ends.
        """
        n = len(lines)
        extra: dict[int, list[int]] = {}  # line -> armed multi-line rules (may repeat), rules without literals
        # Multi-line rules armed by earlier batches stay candidates for the first lines of this one.
        for k, until in self._armed.items():
            for i in range(min(n, until - base + 1)):
                extra.setdefault(i, []).append(k)
        stage = self._every() if levels is None else self._open
        work: dict[int, Sequence[int]] = {}
        if stage.prefilter is not None and n:
            work = self._scan(stage, lines, raw_lines, base, extra)
        if levels is not None and n:
            self._scan_gated(lines, levels, extra)
        for k in [k for k, until in self._armed.items() if until < base + n]:
            del self._armed[k]
        always = self._always + tuple(k for k, _ in self._always_gated) if levels is None else self._always
        if always:
            for i in range(n):
                extra.setdefault(i, []).extend(always)
        if extra:
            for i, more in extra.items():
                work[i] = sorted({*work.get(i, ()), *more}, key=self._rank.__getitem__)
            work = dict(sorted(work.items()))
        return work

    def _scan_gated(
        self, lines: Sequence[str], levels: Mapping[int, Sequence[int]], extra: dict[int, list[int]]
    ) -> None:
        """The gated rules' candidates, into ``extra``: their literals scanned over the lines of their levels only
        (a kernel log's error-level records are a few in a hundred), each rule kept to the lines of its own."""
        stage = self._gated
        assert stage is not None
        widest = levels[self.gate_levels[0]]  # the most lenient gate's lines hold every stricter gate's
        if not widest:
            return
        strict: dict[int, frozenset[int]] = {}  # level -> its lines, for gates stricter than the widest
        rules = self.rule_set.rules
        if stage.prefilter is not None:
            picked = [lines[i] for i in widest]
            hits, _ = stage.prefilter.by_line("\n".join(picked).encode("utf-8", "surrogatepass"))
            for j, present in hits.items():
                literals = frozenset(present)
                plan = stage.plans.get(literals) or self._plan(stage, literals)
                line = picked[j]
                failed = {g for g, run in plan.checks if run not in line} if plan.checks else ()
                i = widest[j]
                for k, g in plan.ordered:
                    if g in failed or not self._admits_level(rules[k], i, levels, strict):
                        continue
                    extra.setdefault(i, []).append(k)
        for k, level in self._always_gated:
            for i in levels[level]:
                extra.setdefault(i, []).append(k)

    def _admits_level(
        self, rule: CompiledRule, i: int, levels: Mapping[int, Sequence[int]], strict: dict[int, frozenset[int]]
    ) -> bool:
        level = rule.max_level
        if level is None or level == self.gate_levels[0]:
            return True
        lines = strict.get(level)
        if lines is None:
            lines = strict[level] = frozenset(levels[level])
        return i in lines

    def _scan(
        self,
        stage: _Literals,
        lines: Sequence[str],
        raw_lines: bytes | None,
        base: int,
        extra: dict[int, list[int]],
    ) -> dict[int, Sequence[int]]:
        """The prefilter phase: line index -> the rules its literals make candidates (its plan's rules whose
        required runs the line contains). Arms the multi-line rules of each plan, into ``extra`` and
        ``_armed``."""
        n = len(lines)
        prefilter = stage.prefilter
        assert prefilter is not None
        if raw_lines is not None and stage.in_place:
            hit_lines, newlines = prefilter.by_line(raw_lines)
            newlines -= 1  # the last line's end
        else:
            hit_lines, newlines = prefilter.by_line("\n".join(lines).encode("utf-8", "surrogatepass"))
        if newlines != n - 1:
            raise ValueError("lines must not contain newlines; split records first (split_lines)")
        work: dict[int, Sequence[int]] = {}
        plans = stage.plans
        for i, present in hit_lines.items():
            literals = frozenset(present)
            plan = plans.get(literals) or self._plan(stage, literals)
            for k in plan.arms:
                window = self.rule_set.rules[k].window
                for j in range(i, min(n, i + window)):
                    extra.setdefault(j, []).append(k)
                self._armed[k] = max(self._armed.get(k, -1), base + i + window - 1)
            if not plan.checks:
                work[i] = plan.rules
                continue
            line = lines[i]
            failed = {g for g, run in plan.checks if run not in line}
            work[i] = [k for k, g in plan.ordered if g not in failed] if failed else plan.rules
        return work

    def _match(
        self,
        work: Mapping[int, Sequence[int]],
        lines: Sequence[str],
        *,
        times: Sequence[float] | float,
        line_numbers: Sequence[int] | int | None,
        permanent_only: bool,
        matched: list[int] | None = None,
    ) -> list[Finding]:
        """The matching phase: each line's candidate rules in order, each pattern evaluated once per line."""
        findings: list[Finding] = []
        rules = self.rule_set.rules
        memo_keys = self._memo_key
        build = self._builder.build
        admits = self._builder.admits
        filtered = self._filtered
        memo: dict[tuple[str, int], tuple[PatternMatch, str] | None] = {}
        for i, ks in work.items():
            if not ks:
                continue
            memo.clear()
            specific = False  # a non-fallback rule matched the line
            timestamp = _line_meta(times, i)
            number = _line_number(line_numbers, i)
            for k in ks:
                rule = rules[k]
                if rule.fallback and specific:
                    break  # fallbacks come last: none speaks for a line a specific rule matched
                key = memo_keys[k]
                found = memo[key] if key in memo else memo.setdefault(key, self._evaluate(rule, lines, i))
                if found is None:
                    continue
                if matched is not None:
                    _mark(matched, i, found[1])
                if not rule.fallback:
                    specific = True
                if permanent_only and rule.type is RuleType.TEMPORARY:
                    continue
                if filtered[k] and not admits(rule, found[0].named_groups()):
                    continue
                finding = build(rule, match=found[0], message=found[1], timestamp=timestamp, line=number)
                if finding is not None:
                    findings.append(finding)
        return findings

    def _evaluate(self, rule: CompiledRule, lines: Sequence[str], i: int) -> tuple[PatternMatch, str] | None:
        if not rule.multiline:
            line = lines[i]
            match = rule.regex.search(line)
            return (match, line) if match else None
        start = i - rule.window + 1
        if start >= 0:
            window = lines[start : i + 1]
        else:
            older = list(self._history)[max(0, len(self._history) + start) :] if self._history.maxlen else []
            window = [*older, *lines[: i + 1]]
        text = "\n".join(window)
        match = rule.regex.search(text)
        if match is None:
            return None
        return match, text[text.rfind("\n", 0, match.start()) + 1 :]


def _mark(matched: list[int], i: int, message: str) -> None:
    """Line ``i`` matched, and the lines before it that its match's ``message`` spans."""
    span = message.count("\n")
    matched.extend(range(i - span, i + 1) if span else (i,))


def _line_number(line_numbers: Sequence[int] | int | None, i: int) -> int | None:
    if line_numbers is None:
        return None
    if isinstance(line_numbers, int):
        return line_numbers + i
    return line_numbers[i]


class ReferenceEngine:
    """The straightforward per-rule matcher: every rule's regex on every line's buffer.

    This is the specification the fast engine is tested against (and the baseline of the
    benchmark): it follows node-problem-detector literally, joining the pack's whole buffer for
    every rule on every line.
    """

    def __init__(self, *, rule_set: RuleSet) -> None:
        self.rule_set = rule_set
        self._builder = FindingBuilder()
        size = max((r.buffer_size for r in rule_set.rules), default=1)
        self.gate_levels = tuple(sorted({r.max_level for r in rule_set.rules if r.max_level is not None}, reverse=True))
        self._buffer: collections.deque[str] = collections.deque(maxlen=size)

    def feed(
        self,
        lines: Sequence[str],
        *,
        times: Sequence[float] | float = 0.0,
        line_numbers: Sequence[int] | int | None = None,
        permanent_only: bool = False,
        raw_lines: bytes | None = None,  # the fast engine's prefilter input: NPD's way needs none
        matched: list[int] | None = None,
        levels: Mapping[int, Sequence[int]] | None = None,
    ) -> list[Finding]:
        findings: list[Finding] = []
        ordered = sorted(self.rule_set.rules, key=lambda r: r.fallback)  # fallbacks after the rest
        gates = {level: frozenset(at) for level, at in levels.items()} if levels is not None else None
        for i, line in enumerate(lines):
            self._buffer.append(line)
            buffered = list(self._buffer)
            specific = False
            for rule in ordered:
                if rule.fallback and specific:
                    break
                if gates is not None and rule.max_level is not None and i not in gates[rule.max_level]:
                    continue  # the record was printed at a lower level than the rule looks at
                text = "\n".join(buffered[-rule.buffer_size :])
                match = rule.regex.search(text)
                if match is None:
                    continue
                specific = specific or not rule.fallback
                message = text[text.rfind("\n", 0, match.start()) + 1 :]
                if matched is not None:
                    _mark(matched, i, message)
                if permanent_only and rule.type is RuleType.TEMPORARY:
                    continue
                if rule.where and not self._builder.admits(rule, match.named_groups()):
                    continue
                finding = self._builder.build(
                    rule,
                    match=match,
                    message=message,
                    timestamp=_line_meta(times, i),
                    line=_line_number(line_numbers, i),
                )
                if finding is not None:
                    findings.append(finding)
        return findings
