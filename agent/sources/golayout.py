"""Go reference-time layouts (``"Jan _2 15:04:05"``) as timestamp parsers.

node-problem-detector's ``filelog`` plugin reads each line's timestamp with Go's
``time.ParseInLocation(timestampFormat, text, time.Local)``, so a ``timestampFormat`` is a Go layout:
the reference time ``Mon Jan 2 15:04:05 MST 2006`` (offset ``-0700``) written the way the log writes
times. :func:`compile_layout` reads such a layout once; :meth:`Layout.parse` then turns texts into
seconds since the epoch, following Go's parsing rules:

- numbers: ``2006`` four digits, ``06`` two (69-99 mean 19xx, 00-68 mean 20xx); ``01 02 03 04 05`` exactly
  two digits; ``1 2 3 4 5 15`` one or two; ``_2`` a day padded with a space (``" 2"``, ``"2"`` or ``"12"``);
- names: ``Jan``/``January`` and ``Mon``/``Monday`` in any letter case (the weekday is read and ignored);
  ``PM`` takes ``AM``/``PM``, ``pm`` takes ``am``/``pm``;
- zones: ``MST`` an abbreviation (``UTC`` is UTC; the local zone's own abbreviations mean local time; any
  other is read as offset zero, as Go does); ``-0700 -07:00 -07 -070000 -07:00:00`` a numeric offset;
  the same with ``Z`` instead of ``-`` also take ``Z`` for UTC;
- fractions: ``.000`` exactly that many digits, ``.999`` optional and any number of digits (``,`` works like
  ``.``); after a seconds element a fraction the layout does not mention is read anyway;
- a run of spaces in the layout matches a run of one or more spaces in the text (or the end of it);
  any other character must appear as is; text left over after the layout is an error.

Differences from Go, on purpose: a layout without a year takes its year from the ``now`` it is given (see
:meth:`Layout.parse`); day-of-year elements (``002``, ``__2``) are refused when the layout is compiled.
"""

from __future__ import annotations

import calendar
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, tzinfo

# A time without a year may be this far ahead of "now" and still count as this year: log writers and the
# agent can disagree about the zone by up to 14 hours (a container without /etc/localtime), which must
# not move a line a whole year back.
FUTURE_SLACK = 86400.0
_SHORTEST_YEAR = 365 * 86400.0 - 3600.0  # a daylight-saving hour less

_SHORT_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_LONG_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_SHORT_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_ABBREVIATION_INDEX: dict[tuple[str, ...], dict[str, int]] = {
    names: {name: index for index, name in enumerate(names)} for names in (_SHORT_MONTHS, _SHORT_DAYS)
}
_LONG_DAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")


class LayoutError(ValueError):
    """The layout cannot be used (an element this parser does not support)."""


class TimestampError(ValueError):
    """A text does not match the layout, or names an impossible time."""


class _Kind(enum.Enum):
    LONG_MONTH = "January"
    MONTH = "Jan"
    NUM_MONTH = "1"
    ZERO_MONTH = "01"
    LONG_WEEKDAY = "Monday"
    WEEKDAY = "Mon"
    DAY = "2"
    UNDER_DAY = "_2"
    ZERO_DAY = "02"
    HOUR = "15"
    HOUR12 = "3"
    ZERO_HOUR12 = "03"
    MINUTE = "4"
    ZERO_MINUTE = "04"
    SECOND = "5"
    ZERO_SECOND = "05"
    LONG_YEAR = "2006"
    YEAR = "06"
    PM = "PM"
    LOWER_PM = "pm"
    ZONE_NAME = "MST"
    NUM_ZONE = "-0700"  # the offset forms differ only in their shape, kept in _Element.zone_shape
    ISO_ZONE = "Z0700"
    FRACTION = ".000"  # exactly `digits` digits
    OPTIONAL_FRACTION = ".999"  # any number of digits, or none


# Layout elements, longest first within each leading character (the first that fits wins).
_ELEMENTS: tuple[tuple[str, _Kind, str], ...] = (
    ("January", _Kind.LONG_MONTH, ""),
    ("Jan", _Kind.MONTH, ""),
    ("Monday", _Kind.LONG_WEEKDAY, ""),
    ("Mon", _Kind.WEEKDAY, ""),
    ("MST", _Kind.ZONE_NAME, ""),
    ("01", _Kind.ZERO_MONTH, ""),
    ("02", _Kind.ZERO_DAY, ""),
    ("03", _Kind.ZERO_HOUR12, ""),
    ("04", _Kind.ZERO_MINUTE, ""),
    ("05", _Kind.ZERO_SECOND, ""),
    ("06", _Kind.YEAR, ""),
    ("15", _Kind.HOUR, ""),
    ("1", _Kind.NUM_MONTH, ""),
    ("2006", _Kind.LONG_YEAR, ""),
    ("2", _Kind.DAY, ""),
    ("_2", _Kind.UNDER_DAY, ""),
    ("3", _Kind.HOUR12, ""),
    ("4", _Kind.MINUTE, ""),
    ("5", _Kind.SECOND, ""),
    ("PM", _Kind.PM, ""),
    ("pm", _Kind.LOWER_PM, ""),
    ("-07:00:00", _Kind.NUM_ZONE, "hh:mm:ss"),
    ("-070000", _Kind.NUM_ZONE, "hhmmss"),
    ("-07:00", _Kind.NUM_ZONE, "hh:mm"),
    ("-0700", _Kind.NUM_ZONE, "hhmm"),
    ("-07", _Kind.NUM_ZONE, "hh"),
    ("Z07:00:00", _Kind.ISO_ZONE, "hh:mm:ss"),
    ("Z070000", _Kind.ISO_ZONE, "hhmmss"),
    ("Z07:00", _Kind.ISO_ZONE, "hh:mm"),
    ("Z0700", _Kind.ISO_ZONE, "hhmm"),
    ("Z07", _Kind.ISO_ZONE, "hh"),
)
# Names that are elements only when no lower-case letter follows ("Month" is text, not "Mon" + "th").
_NAME_ELEMENTS = frozenset({"Jan", "Mon"})
_UNSUPPORTED = (("002", "day of the year (002)"), ("__2", "day of the year (__2)"))
_FRACTION_SEPARATORS = ".,"
_FRACTIONS = frozenset({_Kind.FRACTION, _Kind.OPTIONAL_FRACTION})


@dataclass(frozen=True, slots=True)
class _Element:
    kind: _Kind
    digits: int = 0  # fractions: how many digits the layout shows
    zone_shape: str = ""  # numeric offsets: "hh", "hhmm", "hh:mm", "hhmmss", "hh:mm:ss"
    fraction_next: bool = False  # seconds: the next element is a fraction (do not read one here)


_Item = str | _Element  # a literal or an element


def _tokenize(layout: str) -> tuple[_Item, ...]:
    items: list[_Item] = []
    literal: list[str] = []
    i = 0
    while i < len(layout):
        element, width = _element_at(layout, i)
        if element is None:
            literal.append(layout[i])
            i += 1
            continue
        if literal:
            items.append("".join(literal))
            literal.clear()
        items.append(element)
        i += width
    if literal:
        items.append("".join(literal))
    positions = [index for index, item in enumerate(items) if isinstance(item, _Element)]
    for here, after in zip(positions, positions[1:], strict=False):
        current, following = items[here], items[after]
        assert isinstance(current, _Element) and isinstance(following, _Element)
        if current.kind in (_Kind.SECOND, _Kind.ZERO_SECOND) and following.kind in _FRACTIONS:
            items[here] = replace(current, fraction_next=True)
    return tuple(items)


def _element_at(layout: str, i: int) -> tuple[_Element | None, int]:
    """The element that starts at ``layout[i]`` and its width, or (None, 1) for a literal character."""
    for text, why in _UNSUPPORTED:
        if layout.startswith(text, i):
            raise LayoutError(f"layout {layout!r}: the {why} element is not supported")
    if layout.startswith("_2006", i):
        return None, 1  # a literal "_" before a four-digit year
    ch = layout[i]
    if ch in _FRACTION_SEPARATORS and i + 1 < len(layout) and layout[i + 1] in "09":
        digit = layout[i + 1]
        end = i + 1
        while end < len(layout) and layout[end] == digit:
            end += 1
        if end == len(layout) or not layout[end].isdigit():
            kind = _Kind.FRACTION if digit == "0" else _Kind.OPTIONAL_FRACTION
            return _Element(kind, digits=end - i - 1), end - i
    for text, kind, shape in _ELEMENTS:
        if not layout.startswith(text, i):
            continue
        after = layout[i + len(text) : i + len(text) + 1]
        if text in _NAME_ELEMENTS and after.islower():
            continue
        return _Element(kind, zone_shape=shape), len(text)
    return None, 1


# --------------------------------------------------------------------------------------------------
# Parsing


@dataclass(slots=True)
class _Fields:
    year: int | None = None
    month: int = 1
    day: int = 1
    hour: int = 0
    minute: int = 0
    second: int = 0
    fraction: float = 0.0
    pm: bool | None = None  # None: no AM/PM element
    offset: int | None = None  # seconds east of UTC, when the text says
    zone_name: str | None = None  # an abbreviation that is neither UTC nor numeric


def _digits(text: str, pos: int, count: int) -> int:
    end = pos + count
    chunk = text[pos:end]
    if len(chunk) != count or not chunk.isascii() or not chunk.isdigit():
        raise TimestampError(f"expected {count} digit(s) at {text[pos:]!r}")
    return int(chunk)


def _number(text: str, pos: int, *, fixed: bool) -> tuple[int, int]:
    """Two digits, or (unless ``fixed``) one digit when no second follows."""
    if pos >= len(text) or not ("0" <= text[pos] <= "9"):
        raise TimestampError(f"expected a number at {text[pos:]!r}")
    if pos + 1 < len(text) and "0" <= text[pos + 1] <= "9":
        return int(text[pos : pos + 2]), pos + 2
    if fixed:
        raise TimestampError(f"expected two digits at {text[pos:]!r}")
    return int(text[pos]), pos + 1


def _name(text: str, pos: int, names: tuple[str, ...], what: str) -> tuple[int, int]:
    """Index of the name (any letter case) that ``text`` continues with at ``pos``."""
    if len(names[0]) == 3:  # abbreviations: one lookup
        index = _ABBREVIATION_INDEX[names].get(text[pos : pos + 3].lower())
        if index is not None:
            return index, pos + 3
        raise TimestampError(f"expected a {what} name at {text[pos:]!r}")
    for index, name in enumerate(names):
        if text[pos : pos + len(name)].lower() == name:
            return index, pos + len(name)
    raise TimestampError(f"expected a {what} name at {text[pos:]!r}")


def _fraction_digits(text: str, pos: int) -> tuple[float, int]:
    """A separator followed by any number of digits (at least one); at most 9 count (nanoseconds)."""
    end = pos + 1
    while end < len(text) and "0" <= text[end] <= "9":
        end += 1
    if end == pos + 1:
        raise TimestampError(f"expected a fraction at {text[pos:]!r}")
    return float("0." + text[pos + 1 : min(end, pos + 10)]), end


def _ranged(value: int, low: int, high: int, what: str) -> int:
    if not low <= value <= high:
        raise TimestampError(f"{what} {value} out of range")
    return value


def _zone_abbreviation(text: str, pos: int) -> tuple[str, int]:
    """An abbreviation like ``MST``/``CEST``: 3 to 5 capital letters (4 or 5 ending in T), or ChST/MeST."""
    if text.startswith(("ChST", "MeST"), pos):
        return text[pos : pos + 4], pos + 4
    end = pos
    while end < len(text) and end - pos < 6 and "A" <= text[end] <= "Z":
        end += 1
    name = text[pos:end]
    if len(name) == 3 or (len(name) in (4, 5) and (name.endswith("T") or name == "WITA")):
        return name, end
    raise TimestampError(f"expected a time zone abbreviation at {text[pos:]!r}")


def _numeric_offset(text: str, pos: int, shape: str) -> tuple[int, int]:
    if pos >= len(text) or text[pos] not in "+-":
        raise TimestampError(f"expected a zone offset like {shape!r} at {text[pos:]!r}")
    sign = -1 if text[pos] == "-" else 1
    pos += 1
    parts = [0, 0, 0]
    for index, group in enumerate(shape.split(":") if ":" in shape else [shape]):
        if index:
            if text[pos : pos + 1] != ":":
                raise TimestampError(f"expected ':' in the zone offset at {text[pos:]!r}")
            pos += 1
        for sub in range(len(group) // 2):
            parts[index + sub] = _digits(text, pos, 2)
            pos += 2
    hours, minutes, seconds = parts
    if hours > 24 or minutes > 60 or seconds > 60:
        raise TimestampError("zone offset out of range")
    return sign * (hours * 3600 + minutes * 60 + seconds), pos


def _skip_literal(text: str, pos: int, literal: str) -> int:
    i = 0
    while i < len(literal):
        if literal[i] == " ":
            if pos < len(text) and text[pos] != " ":
                raise TimestampError(f"expected a space at {text[pos:]!r}")
            while i < len(literal) and literal[i] == " ":
                i += 1
            while pos < len(text) and text[pos] == " ":
                pos += 1
            continue
        if pos >= len(text) or text[pos] != literal[i]:
            raise TimestampError(f"expected {literal[i:]!r} at {text[pos:]!r}")
        i += 1
        pos += 1
    return pos


def _read_month_name(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    index, pos = _name(text, pos, _SHORT_MONTHS if element.kind is _Kind.MONTH else _LONG_MONTHS, "month")
    fields.month = index + 1
    return pos


def _read_weekday_name(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    return _name(text, pos, _SHORT_DAYS if element.kind is _Kind.WEEKDAY else _LONG_DAYS, "weekday")[1]


def _read_month(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    value, pos = _number(text, pos, fixed=element.kind is _Kind.ZERO_MONTH)
    fields.month = _ranged(value, 1, 12, "month")
    return pos


def _read_day(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    if element.kind is _Kind.UNDER_DAY and text[pos : pos + 1] == " ":
        pos += 1
    fields.day, pos = _number(text, pos, fixed=element.kind is _Kind.ZERO_DAY)
    return pos


def _read_hour(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    value, pos = _number(text, pos, fixed=element.kind is _Kind.ZERO_HOUR12)
    fields.hour = _ranged(value, 0, 23 if element.kind is _Kind.HOUR else 12, "hour")
    return pos


def _read_minute(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    value, pos = _number(text, pos, fixed=element.kind is _Kind.ZERO_MINUTE)
    fields.minute = _ranged(value, 0, 59, "minute")
    return pos


def _read_second(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    value, pos = _number(text, pos, fixed=element.kind is _Kind.ZERO_SECOND)
    fields.second = _ranged(value, 0, 59, "second")
    if not element.fraction_next and text[pos : pos + 1] in (".", ",") and text[pos + 1 : pos + 2].isdigit():
        fields.fraction, pos = _fraction_digits(text, pos)  # a fraction the layout does not mention
    return pos


def _read_year(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    if element.kind is _Kind.LONG_YEAR:
        fields.year = _digits(text, pos, 4)
        return pos + 4
    value = _digits(text, pos, 2)
    fields.year = value + (1900 if value >= 69 else 2000)
    return pos + 2


def _read_pm(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    am, pm = ("AM", "PM") if element.kind is _Kind.PM else ("am", "pm")
    marker = text[pos : pos + 2]
    if marker not in (am, pm):
        raise TimestampError(f"expected {am!r} or {pm!r} at {text[pos:]!r}")
    fields.pm = marker == pm
    return pos + 2


def _read_zone_name(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    if text.startswith("UTC", pos):
        fields.offset = 0
        return pos + 3
    fields.zone_name, pos = _zone_abbreviation(text, pos)
    return pos


def _read_offset(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    if element.kind is _Kind.ISO_ZONE and text[pos : pos + 1] == "Z":
        fields.offset = 0
        return pos + 1
    fields.offset, pos = _numeric_offset(text, pos, element.zone_shape)
    return pos


def _read_fraction(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    if text[pos : pos + 1] not in (".", ","):
        raise TimestampError(f"expected a fraction at {text[pos:]!r}")
    fields.fraction = _digits(text, pos + 1, element.digits) / 10**element.digits
    return pos + 1 + element.digits


def _read_optional_fraction(element: _Element, text: str, pos: int, fields: _Fields) -> int:
    if text[pos : pos + 1] in (".", ",") and text[pos + 1 : pos + 2].isdigit():
        fields.fraction, pos = _fraction_digits(text, pos)
    return pos


_Reader = Callable[[_Element, str, int, _Fields], int]  # reads one element at pos; returns the position after it
_READERS: dict[_Kind, _Reader] = {
    _Kind.LONG_MONTH: _read_month_name,
    _Kind.MONTH: _read_month_name,
    _Kind.LONG_WEEKDAY: _read_weekday_name,
    _Kind.WEEKDAY: _read_weekday_name,
    _Kind.NUM_MONTH: _read_month,
    _Kind.ZERO_MONTH: _read_month,
    _Kind.DAY: _read_day,
    _Kind.UNDER_DAY: _read_day,
    _Kind.ZERO_DAY: _read_day,
    _Kind.HOUR: _read_hour,
    _Kind.HOUR12: _read_hour,
    _Kind.ZERO_HOUR12: _read_hour,
    _Kind.MINUTE: _read_minute,
    _Kind.ZERO_MINUTE: _read_minute,
    _Kind.SECOND: _read_second,
    _Kind.ZERO_SECOND: _read_second,
    _Kind.LONG_YEAR: _read_year,
    _Kind.YEAR: _read_year,
    _Kind.PM: _read_pm,
    _Kind.LOWER_PM: _read_pm,
    _Kind.ZONE_NAME: _read_zone_name,
    _Kind.NUM_ZONE: _read_offset,
    _Kind.ISO_ZONE: _read_offset,
    _Kind.FRACTION: _read_fraction,
    _Kind.OPTIONAL_FRACTION: _read_optional_fraction,
}


@dataclass(frozen=True, slots=True)
class Layout:
    """A compiled Go layout; :meth:`parse` reads texts written that way."""

    layout: str
    items: tuple[_Item, ...]
    has_year: bool
    has_zone: bool

    def parse(self, text: str, *, now: float, tz: tzinfo | None = None, future_slack: float = FUTURE_SLACK) -> float:
        """Seconds since the epoch for ``text``; raises TimestampError when it does not match the layout.

        A text without a zone is read in ``tz`` (None: the local time zone, like Go's ``time.Local``).
        A layout without a year takes the year that puts the time latest without being more than
        ``future_slack`` seconds after ``now`` (the time the line was read): the current year, the previous
        one when that would be in the future (``Dec 31 23:59:59`` read just after New Year), the next one only
        for a line that is at most ``future_slack`` ahead across New Year. February 29 takes the latest leap
        year allowed.
        """
        fields = self._fields(text)
        if fields.year is not None:
            return self._epoch(fields, fields.year, tz)
        return self._infer_year(fields, now=now, tz=tz, future_slack=future_slack)

    def _infer_year(self, fields: _Fields, *, now: float, tz: tzinfo | None, future_slack: float) -> float:
        latest = now + future_slack
        current = _year_of(now, tz)
        try:
            seconds = self._epoch(fields, current, tz)
        except TimestampError:
            seconds = None  # February 29 in a year without one
        if seconds is not None and seconds <= latest:
            if seconds > latest - _SHORTEST_YEAR:
                return seconds  # next year's date would be too far ahead
            candidates: tuple[int, ...] = (current + 1,)
        else:
            candidates = (current - 1, current - 2, current - 3, current - 4)
        for year in candidates:
            try:
                candidate = self._epoch(fields, year, tz)
            except TimestampError:
                continue
            if candidate <= latest:
                return candidate
        if seconds is not None and seconds <= latest:
            return seconds
        raise TimestampError(f"day {fields.day} out of range for month {fields.month}")

    def _fields(self, text: str) -> _Fields:
        fields = _Fields()
        pos = 0
        for item in self.items:
            if isinstance(item, str):
                pos = _skip_literal(text, pos, item)
            else:
                pos = _READERS[item.kind](item, text, pos, fields)
        if pos != len(text):
            raise TimestampError(f"extra text {text[pos:]!r} after the timestamp")
        if fields.pm is not None:
            if fields.pm and fields.hour < 12:
                fields.hour += 12
            elif not fields.pm and fields.hour == 12:
                fields.hour = 0
        return fields

    @staticmethod
    def _epoch(fields: _Fields, year: int, tz: tzinfo | None) -> float:
        if not 1 <= year <= 9999:
            raise TimestampError(f"year {year} out of range")
        if fields.day < 1 or fields.day > calendar.monthrange(year, fields.month)[1]:
            raise TimestampError(f"day {fields.day} out of range for month {fields.month} of {year}")
        wall = (year, fields.month, fields.day, fields.hour, fields.minute, fields.second)
        offset = fields.offset
        if offset is None and fields.zone_name is not None and not _is_local_abbreviation(wall, fields.zone_name, tz):
            offset = 0  # an abbreviation the local zone does not use: offset zero, as Go reads it
        if offset is not None:
            return calendar.timegm((*wall, 0, 0, 0)) - offset + fields.fraction
        try:
            if tz is None:
                return time.mktime((*wall, 0, 0, -1)) + fields.fraction
            return datetime(*wall, tzinfo=tz).timestamp() + fields.fraction
        except (OverflowError, ValueError, OSError) as exc:
            raise TimestampError(f"cannot place {wall} in the local time zone: {exc}") from exc


def _is_local_abbreviation(wall: tuple[int, int, int, int, int, int], name: str, tz: tzinfo | None) -> bool:
    """Whether ``name`` is an abbreviation of the local zone (``tz``, or the process's when None)."""
    if tz is None:
        return name in time.tzname
    try:
        return datetime(*wall, tzinfo=tz).tzname() == name
    except (OverflowError, ValueError):
        return False


def _year_of(now: float, tz: tzinfo | None) -> int:
    return time.localtime(now).tm_year if tz is None else datetime.fromtimestamp(now, tz).year


def compile_layout(layout: str) -> Layout:
    """Read a Go layout once; raises LayoutError when it is empty or uses an unsupported element."""
    if not layout:
        raise LayoutError("the timestamp layout is empty")
    items = _tokenize(layout)
    kinds = {item.kind for item in items if isinstance(item, _Element)}
    if not kinds:
        raise LayoutError(f"layout {layout!r} has no date or time element (Go layouts write Jan 2 15:04:05 2006)")
    return Layout(
        layout=layout,
        items=items,
        has_year=bool(kinds & {_Kind.LONG_YEAR, _Kind.YEAR}),
        has_zone=bool(kinds & {_Kind.ZONE_NAME, _Kind.NUM_ZONE, _Kind.ISO_ZONE}),
    )
