"""The prefilter of the fast matcher: which lines of a batch may contain one of the rules' literals.

One short "needle" per literal, chosen to start at an uncommon character, goes into a single
regex run over a whole batch of lines at once (in C, no per-line Python work). This regex is
built by the agent from literals (escaped), never from user syntax, so Python's ``re`` is safe here.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.detectors.regex import char_frequency

NEEDLE_MIN = 5  # characters from the start character to the end of a needle, at least
NEEDLE_MAX = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class Prefilter:
    """Finds where in a batch of lines a rule literal may occur, without per-line Python work.

    The batch is encoded and translated so that every "start character" (a small set of rare
    characters) becomes \\x01; one regex then looks for \\x01 followed by the rest of any
    needle (a trie, so each attempt is cheap). The regex has a literal first character, which the
    re engine scans for with a tight loop. Literals without a rare character are searched with
    ``bytes.find`` (fast for long strings). Each hit names the literals its needle stands for;
    hits are only candidates: callers check those literals afterwards, so false positives of the
    translation cost time, never correctness.
    """

    table: bytes
    regex: re.Pattern[bytes] | None
    translated: Mapping[bytes, tuple[str, ...]]  # needle after its start character -> its literals
    plain: Mapping[bytes, tuple[str, ...]]  # needle searched with bytes.find -> its literals

    @classmethod
    def build(cls, literals: Iterable[str]) -> Prefilter:
        literals = sorted(set(literals))
        starts = _choose_start_chars(literals)
        table = bytes(1 if chr(b) in starts else b for b in range(256))
        needles: dict[str, bytes] = {}  # literal -> translated needle (from its start character on)
        plain: set[bytes] = set()
        for lit in literals:
            positions = [i for i, c in enumerate(lit) if c in starts and (len(lit) - i >= NEEDLE_MIN or i == 0)]
            if not positions:
                plain.add(lit.encode())
                continue
            i = min(positions, key=lambda i: (char_frequency(lit[i]), i))
            needles[lit] = lit[i : i + NEEDLE_MAX].encode().translate(table)
        # A needle that starts with another one is never reported (the trie stops at the shorter),
        # nor is a plain literal containing another: the shorter one stands for both.
        words = _shortest(sorted(set(needles.values())), lambda word, other: word.startswith(other))
        translated = {w[1:]: tuple(lit for lit, n in needles.items() if n.startswith(w)) for w in words}
        kept = _shortest(sorted(plain), lambda word, other: other in word)
        plain_map = {k: tuple(lit for lit in literals if k.decode() in lit and lit.encode() in plain) for k in kept}
        # The rest of the needle is matched in a look-ahead: only the start character is consumed,
        # so a needle overlapping a needle found just before it is found too.
        regex = re.compile(b"\\x01(?=(" + _trie([w[1:] for w in words]) + b"))") if words else None
        return cls(table=table, regex=regex, translated=translated, plain=plain_map)

    def hits(self, data: bytes) -> list[tuple[int, tuple[str, ...]]]:
        """(byte offset, literals that may occur there) for every needle found in ``data``, unsorted."""
        found: list[tuple[int, tuple[str, ...]]] = []
        if self.regex is not None:
            translated = self.translated
            found.extend((m.start(), translated[m.group(1)]) for m in self.regex.finditer(data.translate(self.table)))
        for needle, lits in self.plain.items():
            i = data.find(needle)
            while i != -1:
                found.append((i, lits))
                i = data.find(needle, i + 1)
        return found


def _shortest(words: Sequence[bytes], covers: Callable[[bytes, bytes], bool]) -> list[bytes]:
    """The words not covered by another (shorter) word."""
    return [w for w in words if not any(o != w and covers(w, o) for o in words)]


# Cost model for choosing start characters (nanoseconds, measured on CPython 3.11): each
# occurrence of a start character costs a regex attempt; each literal left out of the translated
# scan costs a separate bytes.find pass over the batch.
_AVG_LINE = 70
_ATTEMPT_NS = 120.0
_FIND_NS = 30.0


def _choose_start_chars(literals: Sequence[str]) -> frozenset[str]:
    """Rare characters to anchor needles on: greedily add the one that saves the most time."""

    def usable(lit: str) -> set[str]:
        # ASCII only: the translation table maps single bytes, and a non-ASCII character is
        # several bytes in the UTF-8 batch. Literals without one are searched as plain bytes.
        return {c for i, c in enumerate(lit) if c.isascii() and (len(lit) - i >= NEEDLE_MIN or i == 0)}

    chosen: set[str] = set()
    remaining = {lit: usable(lit) for lit in literals}
    while remaining:
        counts = collections.Counter(c for chars in remaining.values() for c in chars)
        gains = {c: n * _FIND_NS - char_frequency(c) / 1000 * _AVG_LINE * _ATTEMPT_NS for c, n in counts.items()}
        best = max(gains, key=lambda c: (gains[c], c), default=None)
        if best is None or gains[best] <= 0:
            break  # the rest is cheaper to search as plain literals
        chosen.add(best)
        remaining = {lit: chars for lit, chars in remaining.items() if best not in chars}
    return frozenset(chosen)


def _trie(words: Sequence[bytes]) -> bytes:
    """A regex alternation of ``words`` factored by common prefixes (cheap failed attempts)."""
    if any(w == b"" for w in words):
        return b""
    groups: dict[bytes, list[bytes]] = {}
    for w in words:
        groups.setdefault(w[:1], []).append(w[1:])
    parts = []
    for head, rests in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        tail = _trie(rests)
        parts.append(re.escape(head) + (b"(?:" + tail + b")" if b"|" in tail else tail))
    return b"|".join(parts)
