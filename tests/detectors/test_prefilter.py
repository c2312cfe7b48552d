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
@given(literals=st.lists(st.text(alphabet="aäb€ :", min_size=1, max_size=5), min_size=1, max_size=40))
def test_each_found_literal_stands_for_exactly_the_literals_that_begin_with_it(literals: list[str]) -> None:
    covers = Prefilter.build(literals).covers
    unique = sorted(set(literals))
    assert set(covers) == {lit.encode() for lit in unique}
    for raw, standing in covers.items():
        assert standing == tuple(lit for lit in unique if lit.encode().startswith(raw)), raw


def test_many_literals_sharing_prefixes_each_cover_their_own_extensions() -> None:
    """1,350 literals sharing prefixes, as the generated packs' do ("error 1" covers "error 10".."error 199")."""
    literals = [f"NVRM: {word} {i}" for word in ("failed", "timeout", "error") for i in range(450)]
    covers = Prefilter.build(literals).covers
    assert covers[b"NVRM: error 1"] == tuple(sorted(lit for lit in literals if lit.startswith("NVRM: error 1")))
    assert len(covers) == len(literals)
