"""Go reference-time layouts: the layouts of node-problem-detector configs and common syslog formats.

Expected values follow Go's ``time.Parse`` rules (documented in Go's ``time`` package); a layout without
a year takes the year that is latest without being in the future of the read time (plus a day of slack).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent.sources.golayout import FUTURE_SLACK, LayoutError, TimestampError, compile_layout

KERN = "Jan _2 15:04:05"  # NPD config/kernel-monitor-filelog.json timestampFormat


def at(iso: str) -> float:
    """Epoch seconds of an ISO time (UTC unless it says otherwise)."""
    moment = datetime.fromisoformat(iso)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def parse(layout: str, text: str, *, now: str = "2025-06-15T12:00:00") -> float:
    return compile_layout(layout).parse(text, now=at(now), tz=UTC)


@pytest.mark.parametrize(
    ("layout", "text", "now", "expected"),
    [
        pytest.param(KERN, "Jan  2 15:04:05", "2025-06-15T12:00:00", "2025-01-02T15:04:05", id="kern-padded-day"),
        pytest.param(KERN, "Jan 12 15:04:05", "2025-06-15T12:00:00", "2025-01-12T15:04:05", id="kern-two-digit-day"),
        pytest.param(KERN, "Jan 2 15:04:05", "2025-06-15T12:00:00", "2025-01-02T15:04:05", id="kern-unpadded-day"),
        pytest.param(KERN, "jan  2 15:04:05", "2025-06-15T12:00:00", "2025-01-02T15:04:05", id="month-any-case"),
        pytest.param(
            KERN, "Jan  2 15:04:05.123456", "2025-06-15T12:00:00", "2025-01-02T15:04:05.123456", id="kern-fraction"
        ),
        pytest.param(KERN, "Dec 31 23:59:58", "2025-01-01T00:00:05", "2024-12-31T23:59:58", id="new-year-old-line"),
        pytest.param(KERN, "Jan  1 00:00:02", "2025-01-01T00:00:05", "2025-01-01T00:00:02", id="new-year-new-line"),
        pytest.param(
            KERN, "Jan  1 00:10:00", "2024-12-31T23:59:00", "2025-01-01T00:10:00", id="line-ahead-over-new-year"
        ),
        pytest.param(KERN, "Dec 31 23:59:59", "2024-12-31T23:59:59", "2024-12-31T23:59:59", id="read-the-same-second"),
        pytest.param(KERN, "Jun 16 08:00:00", "2025-06-15T12:00:00", "2025-06-16T08:00:00", id="within-a-day-ahead"),
        pytest.param(
            KERN, "Jun 17 08:00:00", "2025-06-15T12:00:00", "2024-06-17T08:00:00", id="days-ahead-is-last-year"
        ),
        pytest.param(
            KERN, "Feb 29 10:00:00", "2025-03-01T00:00:00", "2024-02-29T10:00:00", id="leap-day-last-leap-year"
        ),
        pytest.param(KERN, "Feb 29 10:00:00", "2024-01-10T00:00:00", "2020-02-29T10:00:00", id="leap-day-not-yet"),
        pytest.param(
            "2006-01-02T15:04:05.999999999Z07:00",
            "2024-03-05T10:11:12.123456789+01:00",
            "",
            "2024-03-05T09:11:12.123457",
            id="rfc3339nano",
        ),
        pytest.param("2006-01-02T15:04:05Z07:00", "2024-03-05T10:11:12Z", "", "2024-03-05T10:11:12", id="rfc3339-z"),
        pytest.param(
            "2006-01-02T15:04:05.999999999Z07:00", "2024-03-05T10:11:12Z", "", "2024-03-05T10:11:12", id="no-fraction"
        ),
        pytest.param(
            "2006-01-02 15:04:05,000", "2024-03-05 10:11:12,250", "", "2024-03-05T10:11:12.250", id="comma-millis"
        ),
        pytest.param(
            "2006-01-02 15:04:05 -0700", "2024-03-05 10:11:12 -0700", "", "2024-03-05T17:11:12", id="numeric-zone"
        ),
        pytest.param(
            "2006-01-02 15:04:05 -07:00", "2024-03-05 10:11:12 +05:30", "", "2024-03-05T04:41:12", id="colon-zone"
        ),
        pytest.param("2006-01-02 15:04:05 -07", "2024-03-05 10:11:12 -02", "", "2024-03-05T12:11:12", id="hour-zone"),
        pytest.param(
            "Mon Jan _2 15:04:05 MST 2006", "Tue Mar  5 10:11:12 UTC 2024", "", "2024-03-05T10:11:12", id="unix-date"
        ),
        pytest.param(
            "Mon Jan _2 15:04:05 MST 2006", "Tue Mar  5 10:11:12 XYZ 2024", "", "2024-03-05T10:11:12", id="unknown-zone"
        ),
        pytest.param(
            "Monday, 02-Jan-06 15:04:05 MST",
            "Tuesday, 05-Mar-24 10:11:12 UTC",
            "",
            "2024-03-05T10:11:12",
            id="rfc850-two-digit-year",
        ),
        pytest.param("02-Jan-06", "05-Mar-69", "", "1969-03-05T00:00:00", id="two-digit-year-69-is-1969"),
        pytest.param("02-Jan-06", "05-Mar-68", "", "2068-03-05T00:00:00", id="two-digit-year-68-is-2068"),
        pytest.param(
            "01/02/2006 03:04:05 PM", "03/05/2024 01:11:12 PM", "", "2024-03-05T13:11:12", id="twelve-hour-pm"
        ),
        pytest.param(
            "01/02/2006 03:04:05 PM", "03/05/2024 12:11:12 AM", "", "2024-03-05T00:11:12", id="twelve-hour-midnight"
        ),
        pytest.param("1/2/2006 3:04pm", "3/5/2024 12:11pm", "", "2024-03-05T12:11:00", id="lower-pm-noon"),
        pytest.param("January 2, 2006", "march 5, 2024", "", "2024-03-05T00:00:00", id="long-month"),
        pytest.param("Janitor 2006", "Janitor 2024", "", "2024-01-01T00:00:00", id="Jan-before-lowercase-is-text"),
        pytest.param("2006_01_02", "2024_03_05", "", "2024-03-05T00:00:00", id="underscore-before-year-is-text"),
        pytest.param("2006-01-02  15:04", "2024-03-05 10:11", "", "2024-03-05T10:11:00", id="space-runs"),
    ],
)
def test_parse(layout: str, text: str, now: str, expected: str) -> None:
    assert parse(layout, text, now=now or "2025-06-15T12:00:00") == pytest.approx(at(expected), abs=1e-6)


@pytest.mark.parametrize(
    ("layout", "text", "why"),
    [
        pytest.param(KERN, "Foo  2 15:04:05", "month name", id="bad-month"),
        pytest.param(KERN, "Jan 32 15:04:05", "out of range", id="day-32"),
        pytest.param(KERN, "Apr 31 10:00:00", "out of range", id="april-31-any-year"),
        pytest.param(KERN, "Jan  2 24:00:00", "hour 24", id="hour-24"),
        pytest.param(KERN, "Jan  2 15:60:00", "minute 60", id="minute-60"),
        pytest.param(KERN, "Jan  2 15:04", "expected ':'", id="no-seconds"),
        pytest.param(KERN, "Jan  2 15:04:05 host", "extra text", id="extra-text"),
        pytest.param(KERN, "", "month name", id="empty"),
        pytest.param("2006-01-02", "2024-02-30", "out of range", id="feb-30"),
        pytest.param("2006-01-02", "2024-3-05", "two digits", id="zero-month-needs-two-digits"),
        pytest.param("2006-01-02 15:04:05.000", "2024-03-05 10:11:12.12", "3 digit", id="fixed-fraction-digits"),
        pytest.param("2006-01-02 15:04:05 -0700", "2024-03-05 10:11:12 0700", "zone offset", id="offset-without-sign"),
        pytest.param("03:04 PM", "10:11 XM", "'AM' or 'PM'", id="bad-pm"),
        pytest.param("06", "2x", "digit", id="bad-year"),
    ],
)
def test_parse_refuses(layout: str, text: str, why: str) -> None:
    with pytest.raises(TimestampError, match=why):
        parse(layout, text)


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("2006-002", "day of the year", id="year-day"),
        pytest.param("__2 2006", "day of the year", id="padded-year-day"),
        pytest.param("no elements here", "no date or time element", id="no-elements"),
    ],
)
def test_compile_refuses(layout: str, why: str) -> None:
    with pytest.raises(LayoutError, match=why):
        compile_layout(layout)


@pytest.mark.parametrize(
    ("layout", "has_year", "has_zone"),
    [
        pytest.param(KERN, False, False, id="kern"),
        pytest.param("2006-01-02T15:04:05Z07:00", True, True, id="rfc3339"),
        pytest.param("02 Jan 06 15:04 MST", True, True, id="rfc822"),
    ],
)
def test_compiled_layout_says_what_it_has(layout: str, has_year: bool, has_zone: bool) -> None:
    compiled = compile_layout(layout)
    assert (compiled.has_year, compiled.has_zone) == (has_year, has_zone)


def test_future_slack_is_a_parameter() -> None:
    layout = compile_layout(KERN)
    now = at("2024-12-31T23:59:00")
    assert layout.parse("Jan  1 00:10:00", now=now, tz=UTC) == at("2025-01-01T00:10:00")
    assert layout.parse("Jan  1 00:10:00", now=now, tz=UTC, future_slack=0) == at("2024-01-01T00:10:00")
    assert FUTURE_SLACK == 86400.0


def test_time_without_zone_is_read_in_the_given_zone() -> None:
    zoneinfo = pytest.importorskip("zoneinfo")
    try:
        new_york = zoneinfo.ZoneInfo("America/New_York")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no time zone database here")
    layout = compile_layout(KERN)
    now = at("2025-07-10T00:00:00")
    assert layout.parse("Jul  4 12:00:00", now=now, tz=new_york) == at("2025-07-04T16:00:00")  # EDT
    assert layout.parse("Jan  4 12:00:00", now=now, tz=new_york) == at("2025-01-04T17:00:00")  # EST
    # The zone's own abbreviation means local time; another one reads as offset zero (Go's rule).
    unix = compile_layout("Mon Jan _2 15:04:05 MST 2006")
    assert unix.parse("Sat Jan  4 12:00:00 EST 2025", now=now, tz=new_york) == at("2025-01-04T17:00:00")
    assert unix.parse("Sat Jan  4 12:00:00 JST 2025", now=now, tz=new_york) == at("2025-01-04T12:00:00")
