"""The fast matcher's prefilter: every occurrence of a literal in a batch is reported with (at
least) that literal, including literals whose needle is a prefix of another's or contains another."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.detectors.prefilter import Prefilter

LITERALS = ["alpha", "alphabet", "EDAC ", "EDAC MC", " timeout, ", "NVRM: Xid (PCI:", "Xid (", "fallen off the bus"]


def _reported(prefilter: Prefilter, data: bytes) -> set[tuple[int, str]]:
    """(line, literal) pairs the prefilter points at, confirmed against the line like the engine does."""
    lines = data.split(b"\n")
    found = set()
    for offset, lits in prefilter.hits(data):
        line = data.count(b"\n", 0, offset)
        found.update((line, lit) for lit in lits if lit.encode() in lines[line])
    return found


def _expected(data: bytes, literals: list[str]) -> set[tuple[int, str]]:
    return {(i, lit) for i, line in enumerate(data.split(b"\n")) for lit in literals if lit.encode() in line}


def test_overlapping_literals_are_all_reported() -> None:
    prefilter = Prefilter.build(LITERALS)
    data = "\n".join(
        [
            "the alphabet",
            "EDAC MC0: 1 CE",
            "nvme0: I/O 3 QID 2 timeout, aborting",
            "NVRM: Xid (PCI:0000:3b:00): 79",
            "x",
        ]
    ).encode()
    assert _reported(prefilter, data) == _expected(data, LITERALS)


@settings(max_examples=200, deadline=None)
@given(
    literals=st.lists(st.text(alphabet="abcXid (:E ", min_size=1, max_size=8), min_size=1, max_size=6, unique=True),
    lines=st.lists(st.text(alphabet="abcXid (:E x", max_size=30), min_size=1, max_size=8),
)
def test_no_occurrence_is_missed(literals: list[str], lines: list[str]) -> None:
    prefilter = Prefilter.build(literals)
    data = "\n".join(lines).encode()
    assert _reported(prefilter, data) == _expected(data, literals)


@settings(max_examples=200, deadline=None)
@given(
    literals=st.lists(st.text(alphabet="abcXid (:E ", min_size=1, max_size=8), min_size=1, max_size=6, unique=True),
    lines=st.lists(st.text(alphabet="abcXid (:E x", max_size=30), min_size=1, max_size=8),
)
def test_every_reported_literal_occurs_at_its_offset(literals: list[str], lines: list[str]) -> None:
    """Hits are exact, so the engine need not search the line for a reported literal again."""
    prefilter = Prefilter.build(literals)
    data = "\n".join(lines).encode()
    for offset, lits in prefilter.hits(data):
        assert lits, offset
        assert all(data.startswith(lit.encode(), offset) for lit in lits), (offset, lits)


def test_a_literal_shared_by_a_longer_one_is_reported_only_where_the_longer_one_occurs() -> None:
    prefilter = Prefilter.build(["error", "error: should not happen", "errors"])
    data = b"an error here\nerror: should not happen\nerrors"
    assert [(offset, sorted(lits)) for offset, lits in prefilter.hits(data)] == [
        (3, ["error"]),
        (14, ["error", "error: should not happen"]),
        (39, ["error", "errors"]),
    ]
