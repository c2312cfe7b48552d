"""Go-style duration strings as used in rule packs (lookback, delay, clearAfter, threshold.window)."""

from __future__ import annotations

import pytest

from agent.core.durations import format_duration, parse_duration

PARSE_OK = [
    # (input, seconds)
    ("0", 0.0),
    ("0s", 0.0),
    ("30s", 30.0),
    ("5m", 300.0),
    ("1h", 3600.0),
    ("1h30m", 5400.0),
    ("1h30m15s", 5415.0),
    ("2d", 172800.0),
    ("300ms", 0.3),
    ("10us", 10e-6),
    ("10µs", 10e-6),
    ("1500ns", 1.5e-6),
    ("1.5h", 5400.0),
    (".5s", 0.5),
    ("1m0.25s", 60.25),
    ("  5m  ", 300.0),
    (0, 0.0),
    (30, 30.0),
    (2.5, 2.5),
]

PARSE_ERRORS = [
    # (input, text the error message must contain)
    (True, "expected a duration"),
    (False, "expected a duration"),
    (None, "expected a duration"),
    ("", "expected a duration"),
    ("   ", "expected a duration"),
    ([], "expected a duration"),
    ({"m": 5}, "expected a duration"),
    (float("nan"), "must be a finite number"),
    (float("inf"), "must be a finite number"),
    (float("-inf"), "must be a finite number"),
    ("9" * 400 + "h", "is too long"),
    (-1, "must not be negative"),
    (-0.5, "must not be negative"),
    ("5", "invalid duration"),
    ("abc", "invalid duration"),
    ("m", "invalid duration"),
    ("5 m", "invalid duration"),
    ("5m3", "invalid duration"),
    ("-5m", "invalid duration"),
    ("1h-30m", "invalid duration"),
    ("5y", "invalid duration"),
    ("5M", "invalid duration"),
    ("1e3s", "invalid duration"),
]

FORMAT = [
    (0, "0s"),
    (0.4, "0s"),
    (1, "1s"),
    (59.6, "1m"),
    (90, "1m30s"),
    (3600, "1h"),
    (3661, "1h1m1s"),
    (86400, "24h"),
]


@pytest.mark.parametrize(("text", "seconds"), PARSE_OK, ids=[repr(t) for t, _ in PARSE_OK])
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "message"), PARSE_ERRORS, ids=[repr(t)[:40] for t, _ in PARSE_ERRORS])
def test_parse_duration_rejects(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), FORMAT, ids=[repr(s) for s, _ in FORMAT])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0, 1, 59, 60, 61, 3599, 3600, 5415, 86399])
def test_format_then_parse_round_trips(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
