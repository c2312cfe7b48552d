"""Flap damping (agent.recovery.flaps) as tables: the hold a flap earns, the record left by an uncordon, and
the record read back from the Node as strictly as config."""

from __future__ import annotations

import json

import pytest

from agent.recovery.flaps import (
    FLAP_ANNOTATION,
    FLAP_MEMORY,
    MAX_HOLD,
    FlapRecord,
    after_uncordon,
    flap_text,
    hold,
    is_flap,
    parse_flaps,
)
from agent.recovery.model import Incident

T0 = 1_767_225_600.0


def opened(at: float) -> Incident:
    return Incident(id="c/r/n/1", condition="c", reason="r", since=at, opened=at)


def record(count: int, last: float = T0) -> FlapRecord:
    return FlapRecord(count=count, last_uncordon=last)


@pytest.mark.parametrize(
    ("base", "rec", "at", "expected"),
    [
        (300.0, None, T0 + 5, 300.0),  # never uncordoned: not a flap
        (300.0, record(1), T0 + 5, 600.0),
        (300.0, record(2), T0 + 5, 1200.0),
        (300.0, record(5), T0 + 5, 9600.0),
        (300.0, record(9), T0 + 5, MAX_HOLD),  # capped
        (300.0, record(64), T0 + 5, MAX_HOLD),
        (2 * MAX_HOLD, record(3), T0 + 5, 2 * MAX_HOLD),  # a base above the cap stays
        (300.0, record(3), T0 + FLAP_MEMORY - 1, 2400.0),
        (300.0, record(3), T0 + FLAP_MEMORY, 300.0),  # healthy an hour after the uncordon: forgiven
        (300.0, record(3), T0 - 1, 300.0),  # opened before the uncordon (another episode): not a flap
        (0.0, record(3), T0 + 5, 0.0),
    ],
)
def test_the_hold_a_flap_earns(base, rec, at, expected):
    assert hold(base, rec, opened(at)) == expected
    assert is_flap(rec, opened(at)) == (rec is not None and 0 <= at - T0 < FLAP_MEMORY)


@pytest.mark.parametrize(
    ("rec", "at", "count"),
    [
        (None, T0, 1),
        (record(1), T0 + 5, 2),
        (record(4), T0 + 5, 5),
        (record(64), T0 + 5, 64),
        (record(4), T0 + 7200, 1),
    ],
)
def test_the_record_an_uncordon_leaves(rec, at, count):
    assert after_uncordon(rec, opened(at), at + 600) == FlapRecord(count=count, last_uncordon=at + 600)


def node(text: str | None) -> dict:
    return {"metadata": {"name": "n", "annotations": {} if text is None else {FLAP_ANNOTATION: text}}}


@pytest.mark.parametrize(
    ("text", "expected", "says"),
    [
        (None, None, ""),
        (flap_text(record(3)), record(3), ""),
        ("{not json", None, "Expecting property name"),
        ("[]", None, "flaps: not a JSON object"),
        ('{"count": 0, "lastUncordon": 1767225600}', None, "flaps: count: must be a whole number from 1 to 64"),
        ('{"count": 1e3, "lastUncordon": 1767225600}', None, "count: must be a whole number"),
        ('{"count": true, "lastUncordon": 1767225600}', None, "count: must be a whole number"),
        ('{"count": 2, "lastUncordon": NaN}', None, "lastUncordon: must be a time"),
        ('{"count": 2, "lastUncordon": 1e400}', None, "lastUncordon: must be a time"),
        (
            '{"count": 2, "lastUncordon": "now"}',
            None,
            "lastUncordon: must be a time (seconds since 1970, before year 10000), got 'now'",
        ),
        (json.dumps({"count": 2, "lastUncordon": T0 + 2 * 86_400}), None, "more than 86400s after now"),
        ("[" * 100_000 + "]" * 100_000, None, "recursion"),
        # issue 33: an integer too large for a float raised OverflowError out of the parse
        ('{"count": 2, "lastUncordon": 1' + "0" * 400 + "}", None, "flaps: lastUncordon: must be a time"),
        ('{"count": 1' + "0" * 400 + ', "lastUncordon": 1767225600}', None, "flaps: count: must be a whole number"),
        ('{"count": 2, "lastUncordon": -1e308}', None, "flaps: lastUncordon: must be a time"),
    ],
)
def test_the_record_is_read_as_strictly_as_config(text, expected, says):
    got, problem = parse_flaps(node(text), now=T0)
    assert got == expected
    assert says in problem
    assert bool(problem) == (expected is None and text is not None)
