"""Rule patterns compiled with RE2 for matching: time linear in the text, whatever the pattern.

node-problem-detector's patterns are Go regular expressions, which are RE2 syntax; they are compiled
here with RE2 (google-re2). RE2 never backtracks, so no pattern can stall the agent the way
``(a+)+$`` stalls a backtracking engine on ``aaaa…a!``. What RE2 (and Go, hence NPD) rejects is
refused with a clear message: look-around assertions, backreferences, possessive quantifiers.

RE2's default options are Go's semantics: UTF-8 text, leftmost-first matching, ``\\d \\w \\s \\b``
ASCII-only (``\\s`` is ``[\\t\\n\\f\\r ]``, no ``\\v``), ``.`` not matching ``\\n``, and Go's syntax
(``(?i)``, ``\\z``, ``[[:alpha:]]``, ``\\Q..\\E``, ``\\pL``, ``(?P<name>..)``). Only three options are set:

- ``max_mem``: a memory budget per pattern (compiled program plus the lazily built DFA cache);
- ``log_errors`` off: problems are reported to the user by the loader, not logged by RE2;
- ``never_capture`` for patterns without named groups: nothing needs the submatches, and RE2 then
  finds matches with its DFA alone.

Matching costs O(text length x program size) in the worst case (when the DFA runs out of its
budget RE2 falls back to its NFA), so the program size is capped as well: a pattern whose program
exceeds ``MAX_PROGRAM_SIZE`` instructions is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import re2

from agent.core.regex import PatternError

# The largest built-in pattern compiles to about 170 instructions; 2000 leaves room for large
# alternations while bounding the worst case (NFA fallback) to ~20 ms per KiB of text.
MAX_PROGRAM_SIZE = 2000
MAX_MEMORY = 2 << 20  # bytes per pattern: RE2's program and DFA cache stay within this
_ENCODING = "utf-8"
_ERRORS = "surrogatepass"  # a lone surrogate cannot crash matching: RE2 sees invalid UTF-8 there

_NAMED_GROUP = re.compile(r"\(\?P?<([^>=!][^>]*)>")
_LOOKAROUND = ("(?=", "(?!", "(?<=", "(?<!")


class PatternMatch:
    """A match of a ``RulePattern``: the parts of ``re.Match`` the matchers use."""

    __slots__ = ("_text", "_data", "_spans", "_names", "_ascii", "_groups")

    def __init__(self, *, text: str, data: bytes, spans: Sequence[tuple[int, int]], names: Mapping[str, int]) -> None:
        self._text = text
        self._data = data  # RE2 reports byte offsets into the UTF-8 text
        self._spans = spans
        self._names = names
        self._ascii = len(data) == len(text)  # byte offsets are character offsets
        self._groups: dict[str, str | None] | None = None

    def _slice(self, start: int, end: int) -> str:
        return self._text[start:end] if self._ascii else self._data[start:end].decode(_ENCODING, _ERRORS)

    def group(self) -> str:
        return self._slice(*self._spans[0])

    def start(self) -> int:
        """Offset (in characters) where the match starts."""
        start = self._spans[0][0]
        return start if self._ascii else len(self._slice(0, start))

    def groupdict(self) -> dict[str, str | None]:
        """Named groups (None for a group that did not take part); a new dict each call."""
        return dict(self.named_groups())

    def named_groups(self) -> Mapping[str, str | None]:
        """Named groups as ``groupdict``, but one mapping shared by every call: read it, never change it."""
        if self._groups is None:
            self._groups = {}
            for name, index in self._names.items():
                start, end = self._spans[index]
                self._groups[name] = None if start < 0 else self._slice(start, end)
        return self._groups


Spans = Callable[[bytes], "Sequence[tuple[int, int]] | None"]


def spans_function(compiled: Any) -> Spans:
    """``data -> spans of every group, or None``: RE2's C++ ``Match`` when the binding exposes it.

    The Python wrapper of google-re2 (``re2._Regexp.search``) spends about 2 µs per call in a
    generator, offset bookkeeping and a match object; the candidate lines of a batch call it tens
    of thousands of times. Its C++ object (``_regexp``) is used directly where present, the public
    API otherwise (same results: ``tests/core/test_regex_analysis.py`` checks both).
    """
    raw = getattr(compiled, "_regexp", None)
    unanchored = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)
    if raw is not None and unanchored is not None and callable(getattr(raw, "Match", None)):
        match = raw.Match

        def spans(data: bytes) -> Sequence[tuple[int, int]] | None:
            found = match(unanchored, data, 0, len(data))
            return None if found[0][0] < 0 else found

        return spans
    return _public_spans_function(compiled)


def _public_spans_function(compiled: Any) -> Spans:
    groups = range(compiled.groups + 1)

    def spans(data: bytes) -> Sequence[tuple[int, int]] | None:
        found = compiled.search(data)
        return None if found is None else [found.span(i) for i in groups]

    return spans


# Bytes for the prefilter's literal set: at least 8 MiB, and 1 KiB per byte of literal text. RE2's DFA is
# given a share of this budget; a set whose DFA outgrows it falls back, without a word, to a matcher about
# 100x slower (measured: 889 literals, 24,295 bytes, ran at 7,000 lines/s under 12 MiB and at 600,000 from
# 16 MiB on). The DFA's states are made as lines visit them: the budget is a bound, not an allocation.
LITERAL_SET_MEMORY = 8 << 20
LITERAL_SET_MEMORY_PER_BYTE = 1 << 10
LITERAL_SET_MEMORY_MAX = 256 << 20


def literal_set_memory(literals: Sequence[bytes]) -> int:
    """The RE2 memory budget for a literal set (see LITERAL_SET_MEMORY)."""
    wanted = LITERAL_SET_MEMORY_PER_BYTE * sum(len(lit) for lit in set(literals))
    return min(LITERAL_SET_MEMORY_MAX, max(LITERAL_SET_MEMORY, wanted))


def literal_finder(literals: Sequence[bytes]) -> Callable[[bytes], list[tuple[int, int]]]:
    """``data -> (start, end)`` of every position where one of ``literals`` begins (overlaps too).

    One RE2 alternation, shortest literals first (leftmost-first semantics: at one position the
    shortest literal that occurs there is reported); after each hit the search resumes one byte
    after its start. Uses RE2's C++ ``Match`` where the binding exposes it (see :func:`spans_function`).
    """
    if not literals:
        return lambda data: []
    ordered = sorted(set(literals), key=lambda lit: (len(lit), lit))
    compiled = re2.compile(
        b"|".join(re2.escape(lit) for lit in ordered), _options(capture=False, max_memory=literal_set_memory(ordered))
    )
    raw = getattr(compiled, "_regexp", None)
    unanchored = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)
    if raw is not None and unanchored is not None and callable(getattr(raw, "Match", None)):
        match = raw.Match

        def find(data: bytes) -> list[tuple[int, int]]:
            found: list[tuple[int, int]] = []
            end = len(data)
            pos = 0
            while pos < end:
                span = match(unanchored, data, pos, end)[0]
                if span[0] < 0:
                    break
                found.append(span)
                pos = span[0] + 1
            return found

        return find

    def find_public(data: bytes) -> list[tuple[int, int]]:
        found: list[tuple[int, int]] = []
        pos = 0
        while True:
            m = compiled.search(data, pos)
            if m is None:
                return found
            found.append(m.span())
            pos = m.start() + 1

    return find_public


class _Program:
    """An RE2 program compiled at its first search. The built-in packs' 356 patterns (the print-site rules'
    alternations of hundreds of messages) hold about 6.5 MiB as RE2 programs, and on a healthy node most
    never see a candidate line: each is compiled once when loaded, to check it, and kept as text until a line
    needs it. Two threads may both compile it once; either result is the same program."""

    __slots__ = ("_body", "_capture", "_compiled", "_spans")

    def __init__(self, body: str, *, capture: bool) -> None:
        self._body = body
        self._capture = capture
        self._compiled: Any = None
        self._spans: Spans | None = None

    @property
    def compiled(self) -> Any:
        if self._compiled is None:
            self._compiled = re2.compile(self._body, _options(capture=self._capture, max_memory=MAX_MEMORY))
        return self._compiled

    def spans(self, data: bytes) -> Sequence[tuple[int, int]] | None:
        if self._spans is None:
            self._spans = spans_function(self.compiled)
        return self._spans(data)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class RulePattern:
    """A rule pattern compiled with NPD's anchoring: it must match up to the end of the text."""

    pattern: str  # as written in the rule pack
    program_size: int
    groupindex: Mapping[str, int]  # named groups -> group number
    program: _Program  # the RE2 program, compiled at its first search

    @property
    def compiled(self) -> Any:
        """The RE2 object."""
        return self.program.compiled

    def search(self, text: str) -> PatternMatch | None:
        data = text.encode(_ENCODING, _ERRORS)
        spans = self.program.spans(data)
        return None if spans is None else PatternMatch(text=text, data=data, spans=spans, names=self.groupindex)


def _options(*, capture: bool, max_memory: int) -> re2.Options:
    options = re2.Options()
    options.max_mem = max_memory
    options.log_errors = False
    options.never_capture = not capture
    return options


@dataclass(frozen=True, kw_only=True, slots=True)
class _Scan:
    group_names: tuple[str, ...]
    any_byte: bool  # uses \C
    open_quote: bool  # ends inside \Q... without \E


def _class_end(pattern: str, i: int) -> int:
    """Index just after the character class starting at ``pattern[i] == '['``."""
    j = i + 1
    if pattern.startswith("^", j):
        j += 1
    if pattern.startswith("]", j):
        j += 1
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
        elif pattern.startswith("[:", j) and (end := pattern.find(":]", j + 2)) != -1:
            j = end + 2
        elif pattern[j] == "]":
            return j + 1
        else:
            j += 1
    return len(pattern)


def _scan(pattern: str) -> _Scan:
    """What RE2 does not tell: the group names in order, ``\\C``, an unterminated ``\\Q``."""
    names: list[str] = []
    any_byte = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt == "Q":
                end = pattern.find("\\E", i + 2)
                if end == -1:
                    return _Scan(group_names=tuple(names), any_byte=any_byte, open_quote=True)
                i = end + 2
                continue
            any_byte = any_byte or nxt == "C"
            i += 2
        elif ch == "[":
            i = _class_end(pattern, i)
        elif ch == "(" and (m := _NAMED_GROUP.match(pattern, i)):
            names.append(m.group(1))
            i = m.end()
        else:
            i += 1
    return _Scan(group_names=tuple(names), any_byte=any_byte, open_quote=False)


def _explain(error: re2.error, pattern: str) -> str:
    detail = error.args[0] if error.args else str(error)
    if isinstance(detail, bytes):
        detail = detail.decode(_ENCODING, "replace")
    if "pattern too large" in detail:
        return _too_large()
    if any(detail.endswith(op) for op in _LOOKAROUND):
        why = "look-around assertions are not supported"
    elif re.search(r"invalid escape sequence: \\[1-9]$", detail) or (detail.endswith("(?P") and "(?P=" in pattern):
        why = "backreferences are not supported"
    elif re.search(r"bad repetition operator: [*+?}]\+$", detail):
        why = "possessive quantifiers are not supported"
    else:
        return f"invalid regular expression: {detail} (rule patterns are RE2/Go syntax, as in node-problem-detector)"
    return (
        f"invalid regular expression: {detail}: {why}: rule patterns are RE2/Go syntax "
        "(node-problem-detector would reject this pattern too)"
    )


def _too_large() -> str:
    return (
        f"pattern is too large: RE2 refuses programs over {MAX_PROGRAM_SIZE} instructions or "
        f"{MAX_MEMORY >> 20} MiB (large counted repetitions such as {{1000}} and Unicode classes grow it); "
        "simplify the pattern"
    )


def compile_anchored(pattern: str) -> RulePattern:
    """Compile an NPD pattern with NPD semantics: it must match up to the end of the text.

    NPD appends ``\\z``; here the pattern is grouped first, so ``foo|bar`` means ``(?:foo|bar)\\z``.
    The pattern is compiled alone before it is wrapped, so an unbalanced one (``a)|(b``) cannot
    escape the group. Raises PatternError with a message for the user.
    """
    scan = _scan(pattern)
    if scan.any_byte:
        raise PatternError(
            "invalid regular expression: \\C (any byte) is not supported: it can split a character; use ."
        )
    try:
        alone = re2.compile(pattern, _options(capture=True, max_memory=MAX_MEMORY))
    except re2.error as exc:
        raise PatternError(_explain(exc, pattern)) from exc
    seen: set[str] = set()
    for name in scan.group_names:
        if name in seen:
            raise PatternError(
                f"invalid regular expression: duplicate group name {name!r} (each field needs exactly one group)"
            )
        seen.add(name)
    groupindex = dict(alone.groupindex)
    del alone
    body = "(?:" + pattern + ("\\E" if scan.open_quote else "") + ")\\z"
    try:
        compiled = re2.compile(body, _options(capture=bool(groupindex), max_memory=MAX_MEMORY))
    except re2.error as exc:
        raise PatternError(_explain(exc, pattern)) from exc
    sizes = (compiled.programsize, compiled.reverseprogramsize)
    del compiled  # checked; compiled again at its first search (_Program)
    if max(sizes) > MAX_PROGRAM_SIZE or min(sizes) < 0:  # a reverse program over budget reads -1
        raise PatternError(_too_large())
    return RulePattern(
        pattern=pattern,
        program_size=sizes[0],
        groupindex=groupindex,
        program=_Program(body, capture=bool(groupindex)),
    )
