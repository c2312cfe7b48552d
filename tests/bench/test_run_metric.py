"""bench/run.py's ``_metric``: the value of one sample line of an exposition, found by name."""

from __future__ import annotations

import pytest

from bench.run import _metric

BODY = (
    "# HELP problem_counter Number of times a specific type of problem have occurred.\n"
    "# TYPE problem_counter counter\n"
    'problem_counter{reason="OOMKilling"} 3\n'
    'problem_counter{reason="OOMKilling2"} 7\n'
    "records_total 12 1700000000000\n"
    "records 4\n"
    "last 5.5"
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ('problem_counter{reason="OOMKilling"}', 3.0),  # not the longer label value after it
        ('problem_counter{reason="OOMKilling2"}', 7.0),
        ("records_total", 12.0),  # a timestamp after the value is not the value
        ("records", 4.0),  # not records_total, the line before it
        ("last", 5.5),  # the last line, without a newline
        ("problem_counter", None),  # named on HELP and TYPE lines only
        ("absent", None),
    ],
)
def test_the_value_on_the_line_of_that_name(name: str, expected: float | None) -> None:
    assert _metric(BODY, name) == expected


def test_the_first_line_of_a_body() -> None:
    assert _metric("up 1\nother 2\n", "up") == 1.0
