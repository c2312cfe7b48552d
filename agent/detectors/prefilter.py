"""The prefilter of the fast matcher: which of the rules' literals occur in which line of a batch.

All literals go into one RE2 alternation, shortest first, scanned over the whole batch in C. RE2
matches a set of literals with a DFA: the built-in packs' ~590 literals scan at about 250-300 MB/s on
a 2-core VM (20 literals: ~700 MB/s; the larger DFA misses the CPU cache more), still the cheapest part
of a line that no rule wants. After each hit the scan resumes one byte after its start, so overlapping
literals are all found. At one position the shortest literal that occurs there is reported; a longer
literal that begins with it is checked at the same offset (a byte comparison), so every literal
reported for an offset occurs there: a hit is exact, and callers need not look for the literal in the
line again. The literals are escaped: no user syntax reaches this regex.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent.core.patterns import literal_finder


@dataclass(frozen=True, kw_only=True, slots=True)
class Prefilter:
    """Finds which rule literals occur in which lines of a batch, with Python work only at the hits."""

    find: Callable[[bytes], list[tuple[int, int]]]  # data -> (start, end) of each literal occurrence
    # a literal as found -> (that literal, the longer literals that begin with it, each with its bytes)
    covers: Mapping[bytes, tuple[str, tuple[tuple[str, bytes], ...]]]

    @classmethod
    def build(cls, literals: Iterable[str]) -> Prefilter:
        """The prefilter of a literal set. Built once per set in a process (a bounded cache of immutable
        values: the built-in packs' few thousand literals take about 30 ms to sort and compile, and every
        engine of the same rules, one per stream and one per test, shares them)."""
        return _build(tuple(sorted(set(literals))))

    @classmethod
    def _make(cls, literals: tuple[str, ...]) -> Prefilter:
        # Sorted as bytes, the literals that begin with one follow it directly: one pass finds them.
        encoded = sorted({lit.encode(): lit for lit in literals}.items())
        covers: dict[bytes, tuple[str, tuple[tuple[str, bytes], ...]]] = {}
        for i, (raw, text) in enumerate(encoded):
            longer: list[tuple[str, bytes]] = []
            for other_raw, other in encoded[i + 1 :]:
                if not other_raw.startswith(raw):
                    break
                longer.append((other, other_raw))
            covers[raw] = (text, tuple(longer))
        return cls(find=literal_finder(list(covers)), covers=covers)

    def by_line(self, data: bytes) -> tuple[dict[int, list[str]], int]:
        """Line index (lines separated by ``\\n``) -> the literals that occur in that line, in offset
        order (a literal found twice is listed twice), for the lines where any occurs, in line order;
        and the number of newlines in ``data`` (counted on the way, between the hits)."""
        covers = self.covers
        count = data.count
        lines: dict[int, list[str]] = {}
        line, previous = 0, 0
        # Hits come in offset order; newline counting between them maps offsets to lines in C.
        for start, end in self.find(data):
            line += count(b"\n", previous, start)
            previous = start
            text, longer = covers[data[start:end]]
            found = lines.get(line)
            if found is None:
                found = lines[line] = []
            found.append(text)
            if longer:
                found.extend(other for other, raw in longer if data.startswith(raw, start))
        return lines, line + count(b"\n", previous)


# A running agent uses two or three literal sets per rule set (rules.py); a reload that changed the rules
# keeps the last ones' until they drop out: a few, not a history of every configuration the agent held.
CACHED_SETS = 6


@functools.lru_cache(maxsize=CACHED_SETS)
def _build(literals: tuple[str, ...]) -> Prefilter:
    return Prefilter._make(literals)
