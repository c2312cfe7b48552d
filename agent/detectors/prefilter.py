"""The prefilter of the fast matcher: which of the rules' literals occur where in a batch of lines.

All literals go into one RE2 alternation, shortest first, scanned over the whole batch in C. RE2
matches a set of literals with a DFA, so the scan costs about the same for ten literals or a few
hundred (the kernel, Neuron and NVIDIA packs together have about 550). After each hit the scan
resumes one byte after its start, so overlapping literals are all found. At one position the
shortest literal that occurs there is reported; a longer literal that begins with it is checked at
the same offset (a byte comparison), so every literal reported for an offset occurs there: a hit
is exact, and callers need not look for the literal in the line again. The literals are escaped:
no user syntax reaches this regex.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent.core.patterns import literal_finder


@dataclass(frozen=True, kw_only=True, slots=True)
class Prefilter:
    """Finds where in a batch of lines the rule literals occur, without per-line Python work."""

    find: Callable[[bytes], list[tuple[int, int]]]  # data -> (start, end) of each literal occurrence
    # a literal as found -> (that literal, the longer literals that begin with it, each with its bytes)
    covers: Mapping[bytes, tuple[str, tuple[tuple[str, bytes], ...]]]

    @classmethod
    def build(cls, literals: Iterable[str]) -> Prefilter:
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

    def hits(self, data: bytes) -> list[tuple[int, list[str]]]:
        """(byte offset, the literals that occur at that offset) for every literal occurrence in ``data``,
        in offset order."""
        covers = self.covers
        found: list[tuple[int, list[str]]] = []
        for start, end in self.find(data):
            text, longer = covers[data[start:end]]
            if longer:
                found.append((start, [text, *(other for other, raw in longer if data.startswith(raw, start))]))
            else:
                found.append((start, [text]))
        return found
