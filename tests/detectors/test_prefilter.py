"""The fast matcher's prefilter: every literal that occurs in a line of a batch is reported for that line,
and only those, including literals whose needle is a prefix of another's or contains another."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.detectors.prefilter import Prefilter

LITERALS = ["alpha", "alphabet", "EDAC ", "EDAC MC", " timeout, ", "NVRM: Xid (PCI:", "Xid (", "fallen off the bus"]


def _reported(prefilter: Prefilter, data: bytes) -> set[tuple[int, str]]:
    """(line, literal) pairs the prefilter reports, as the engine takes them (unconfirmed)."""
    return {(line, lit) for line, lits in prefilter.by_line(data)[0].items() for lit in lits}


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
def test_lines_in_order_only_with_literals_all_newlines_counted(literals: list[str], lines: list[str]) -> None:
    """The engine relies on all three: lines ascending (findings in line order), none reported empty, and the
    newline count (its check that no line held a newline)."""
    prefilter = Prefilter.build(literals)
    found, newlines = prefilter.by_line("\n".join(lines).encode())
    assert list(found) == sorted(found)
    assert all(found.values())
    assert newlines == len(lines) - 1


def test_a_literal_shared_by_a_longer_one_is_reported_only_where_the_longer_one_occurs() -> None:
    prefilter = Prefilter.build(["error", "error: should not happen", "errors"])
    data = b"an error here\nerror: should not happen\nerrors"
    assert {line: sorted(lits) for line, lits in prefilter.by_line(data)[0].items()} == {
        0: ["error"],
        1: ["error", "error: should not happen"],
        2: ["error", "errors"],
    }


def test_a_literal_found_twice_in_a_line_is_listed_twice() -> None:
    prefilter = Prefilter.build(["fail", "Xid ("])
    assert prefilter.by_line(b"ok\nfail, fail again\nXid (") == ({1: ["fail", "fail"], 2: ["Xid ("]}, 2)
