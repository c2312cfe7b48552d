"""Matching log lines against rule packs, with node-problem-detector semantics.

Semantics (the same in both engines here): every line is pushed into a buffer of the pack's
``bufferSize`` lines; a rule matches when its pattern matches up to the end of the newest line,
on the newest line alone or across the buffered lines joined with ``\\n``; the message is the
matched lines (from the one where the match starts to the newest) plus the optional suffix.
Several rules may fire for one line; findings come out in line order, then rule order.

``RuleEngine`` is the fast matcher used by the agent. ``ReferenceEngine`` is the straightforward
per-rule implementation of the same semantics; tests check that both always agree and the
benchmark compares their speed.

How the fast matcher avoids running every regex on every line: each rule's pattern is analysed
for literal strings that must occur in any match (``regex.required_literals``). One short
"needle" per literal, chosen to start at an uncommon character, goes into a single prefilter
regex that is run over a whole batch of lines at once (in C, no per-line Python work). Only lines
where a needle occurs are looked at again: the exact literals decide which rules are candidates,
and only those rules' regexes run. Rules that can match across lines stay armed for
``bufferSize`` lines after a line with their literal; rules without a known literal run on every
line (correct, just slower).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from agent.detectors.rulepack import CompiledRule, RuleSet
from agent.types import Finding

log = logging.getLogger(__name__)

_KV_RE = re.compile(r"(?:^|(?<=\s))([A-Za-z0-9_.-]+)=(\S+)")
MAX_THRESHOLD_KEYS = 4096


class FindingBuilder:
    """Turns a rule match into a Finding: fields, filters, thresholds, reason templates.

    Holds the count-in-window state of threshold rules (bounded: at most ``MAX_THRESHOLD_KEYS``
    keys per rule, each remembering at most ``count`` timestamps).
    """

    def __init__(self) -> None:
        self._windows: dict[str, collections.OrderedDict[tuple, collections.deque[float]]] = {}

    def build(
        self, rule: CompiledRule, *, match: re.Match[str], message: str, timestamp: float, line: int | None
    ) -> Finding | None:
        fields: dict[str, Any] = {k: v for k, v in match.groupdict().items() if v is not None}
        if rule.key_values:
            wanted = set(rule.key_values)
            for key, value in _KV_RE.findall(message):
                if key in wanted:
                    fields.setdefault(key.replace("-", "_"), value)
        for name, kind in rule.field_types.items():
            if name in fields:
                try:
                    if kind == "int":
                        fields[name] = int(fields[name])
                    elif kind == "hex":
                        fields[name] = int(fields[name], 16)
                except ValueError:
                    log.debug("rule %s: field %s=%r is not %s", rule.name, name, fields[name], kind)
                    del fields[name]
        for flt in rule.where:
            present = flt.field in fields and str(fields[flt.field]) in flt.values
            if present == flt.negate:
                return None
        if rule.threshold is not None and not self._count(rule, fields, timestamp):
            return None
        reason = rule.reason.format_map(_Fields(fields)) if "{" in rule.reason else rule.reason
        if rule.suffix:
            message = f"{message}; {rule.suffix}"
        return Finding(
            rule=rule.name,
            type=rule.type,
            condition=rule.condition,
            reason=reason,
            severity=rule.severity,
            message=message,
            timestamp=timestamp,
            source=rule.source,
            fields=fields,
            line=line,
        )

    def _count(self, rule: CompiledRule, fields: dict[str, Any], timestamp: float) -> bool:
        threshold = rule.threshold
        assert threshold is not None
        per_rule = self._windows.setdefault(rule.name, collections.OrderedDict())
        key = tuple(str(fields.get(b, "")) for b in threshold.by)
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


# Rough character frequencies in kernel logs: needles start at an uncommon character so the
# prefilter regex (whose first-character set the re engine scans for in C) attempts few matches.
def _char_cost(ch: str) -> int:
    if ch == " ":
        return 100
    if ch in "etaoinsrlcd":
        return 80
    if ch.islower():
        return 60
    if ch.isdigit():
        return 50
    if ch in ":.,-_/()":
        return 35
    if ch in "=[]<>'\"":
        return 20
    if ch in "XQZJKVWYH":
        return 3
    if ch.isupper():
        return 10
    return 8


NEEDLE_MIN = 4


def _needle(literal: str) -> str:
    if len(literal) <= NEEDLE_MIN:
        return literal
    best = min(range(len(literal) - NEEDLE_MIN + 1), key=lambda i: (_char_cost(literal[i]), i))
    return literal[best:]


class RuleEngine:
    """The fast matcher (see the module docstring). Not thread-safe: one engine per stream."""

    def __init__(self, *, rule_set: RuleSet) -> None:
        self.rule_set = rule_set
        self._builder = FindingBuilder()
        rules = rule_set.rules
        self._order = {r.name: i for i, r in enumerate(rules)}
        self._literal_rules = [r for r in rules if r.literals is not None]
        self._multiline_rules = [r for r in self._literal_rules if r.multiline]
        self._always = [r for r in rules if r.literals is None]
        if self._always:
            log.info(
                "rules without a required literal run on every line (slower): %s",
                ", ".join(r.name for r in self._always),
            )
        needles = sorted({_needle(lit) for r in self._literal_rules for lit in r.literals or ()})
        # A needle containing another needle is redundant: the shorter one finds the line anyway.
        needles = [n for n in needles if not any(o != n and o in n for o in needles)]
        self.needles = tuple(needles)
        self._prefilter = re.compile("|".join(re.escape(n) for n in needles)) if needles else None
        self._history: collections.deque[str] = collections.deque(maxlen=max(rule_set.max_window - 1, 0))
        self._armed: dict[str, int] = {}  # multiline rule name -> last absolute line index it stays armed
        self._seen = 0  # absolute index of the next line

    def feed(
        self,
        lines: Sequence[str],
        *,
        times: Sequence[float] | float = 0.0,
        line_numbers: Sequence[int] | int | None = None,
        permanent_only: bool = False,
    ) -> list[Finding]:
        """Match a batch of lines (no newlines inside) and return the findings in order.

        ``times``/``line_numbers`` give each line's timestamp and number (a scalar applies to all
        lines; an int line number is the first line's number). With ``permanent_only`` temporary
        findings are dropped (replaying records that were already processed before a restart).
        """
        if any("\n" in line for line in lines):
            raise ValueError("lines must not contain newlines; split records first")
        n = len(lines)
        base = self._seen
        candidates: set[tuple[int, int]] = set()  # (line index, rule index)
        # Multi-line rules armed by earlier batches stay candidates for the first lines of this one.
        for rule in self._multiline_rules:
            until = self._armed.get(rule.name, -1) - base
            candidates.update((i, self._order[rule.name]) for i in range(min(n, until + 1)))
        if self._prefilter is not None and n:
            text = "\n".join(lines)
            positions = [m.start() for m in self._prefilter.finditer(text)]
            if positions:
                starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))
                for i in sorted({bisect.bisect_right(starts, p) - 1 for p in positions}):
                    line = lines[i]
                    for rule in self._literal_rules:
                        if not any(lit in line for lit in rule.literals or ()):
                            continue
                        if rule.multiline:
                            candidates.update((j, self._order[rule.name]) for j in range(i, min(n, i + rule.window)))
                            self._armed[rule.name] = max(self._armed.get(rule.name, -1), base + i + rule.window - 1)
                        else:
                            candidates.add((i, self._order[rule.name]))
        for name in [k for k, until in self._armed.items() if until < base + n]:
            del self._armed[name]
        for rule in self._always:
            candidates.update((i, self._order[rule.name]) for i in range(n))

        findings: list[Finding] = []
        if candidates:
            rules = self.rule_set.rules
            for i, k in sorted(candidates):
                rule = rules[k]
                found = self._evaluate(rule, lines, i)
                if found is None:
                    continue
                match, message = found
                if permanent_only and rule.type.value == "temporary":
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
        if self._history.maxlen:
            self._history.extend(lines[-self._history.maxlen :])
        self._seen = base + n
        return findings

    def _evaluate(self, rule: CompiledRule, lines: Sequence[str], i: int) -> tuple[re.Match[str], str] | None:
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
        self._buffer: collections.deque[str] = collections.deque(maxlen=size)

    def feed(
        self,
        lines: Sequence[str],
        *,
        times: Sequence[float] | float = 0.0,
        line_numbers: Sequence[int] | int | None = None,
        permanent_only: bool = False,
    ) -> list[Finding]:
        findings: list[Finding] = []
        for i, line in enumerate(lines):
            self._buffer.append(line)
            buffered = list(self._buffer)
            for rule in self.rule_set.rules:
                text = "\n".join(buffered[-rule.buffer_size :])
                match = rule.regex.search(text)
                if match is None or (permanent_only and rule.type.value == "temporary"):
                    continue
                message = text[text.rfind("\n", 0, match.start()) + 1 :]
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
