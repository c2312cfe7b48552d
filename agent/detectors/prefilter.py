"""The prefilter of the fast matcher: where in a batch of lines one of the rules' literals occurs.

All literals go into one RE2 alternation, shortest first, scanned over the whole batch in C. RE2
matches a set of literals with a DFA, so the scan costs about the same for ten literals or a few
hundred (the kernel, Neuron and NVIDIA packs together have about 280). After each hit the scan
resumes one byte after its start, so overlapping literals are all found. At one position the
shortest literal that occurs there is reported, standing for every literal that begins with it;
callers check those literals against the line afterwards, so a hit is a candidate, never a
verdict. The literals are escaped: no user syntax reaches this regex.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent.core.patterns import literal_finder


@dataclass(frozen=True, kw_only=True, slots=True)
class Prefilter:
    """Finds where in a batch of lines a rule literal may occur, without per-line Python work."""

    find: Callable[[bytes], list[tuple[int, int]]]  # data -> (start, end) of each literal occurrence
    covers: Mapping[bytes, tuple[str, ...]]  # a literal as found -> every literal that begins with it

    @classmethod
    def build(cls, literals: Iterable[str]) -> Prefilter:
        # In byte order, the literals that begin with ``raw`` follow it without a gap: each literal
        # looks only at its own run (a quadratic scan took 0.1 s for the built-in packs' 1,300).
        by_bytes = sorted((lit.encode(), lit) for lit in set(literals))
        covers: dict[bytes, tuple[str, ...]] = {}
        for i, (raw, _) in enumerate(by_bytes):
            if raw in covers:
                continue
            end = i
            while end < len(by_bytes) and by_bytes[end][0].startswith(raw):
                end += 1
            covers[raw] = tuple(sorted(text for _, text in by_bytes[i:end]))
        return cls(find=literal_finder(list(covers)), covers=covers)

    def hits(self, data: bytes) -> list[tuple[int, tuple[str, ...]]]:
        """(byte offset, literals that may occur there) for every literal occurrence in ``data``."""
        covers = self.covers
        return [(start, covers[data[start:end]]) for start, end in self.find(data)]
