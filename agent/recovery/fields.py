"""Validated fields: the one set of rules for every record recovery reads back from the cluster.

The records (the budget Lease, the pause Lease, the incident, the ladder's history and the flap record
on the Node) are JSON in an annotation anyone with write access may edit. Each has one codec that
reads it through :func:`load` and :class:`Fields`, so every field of every record is checked the same
way, as strictly as configuration:

* a record is at most ``MAX_RECORD`` characters (the API server's limit on all of an object's
  annotations together), JSON, an object;
* a time is a JSON number (not a boolean, not NaN, not an infinity, not an integer too large for a
  float) from 1970 to year 9999 and, given ``now``, not more than ``ahead`` seconds after it;
* a number or a whole number lies within the range its field states;
* a string is a string of at most ``MAX_TEXT`` characters (or its field's own limit);
* a list or an object is one, of at most ``MAX_ITEMS`` entries;
* a record whose codec calls :meth:`Fields.only` holds no field it does not name.

What breaks a rule raises :class:`CorruptRecord` (a ``ValueError``) naming the record and the field,
e.g. ``history: rungs[0].step: must be a whole number from 0 to 1, got -5``; nothing else ever leaves
a codec (no ``OverflowError``, ``IndexError``, ``TypeError``, ``RecursionError``). What a caller does
with a corrupt record is its record's rule (docs/recovery.md, "Records read back from the cluster").
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from agent.core.timefmt import MAX_TIME, iso

MAX_RECORD = 256 * 1024  # characters of one record (the API server's limit on an object's annotations)
MAX_TEXT = 4096  # characters of one string field, unless the field says less
MAX_ITEMS = 4096  # entries of one list or object
FUTURE_SLACK = 86_400.0  # seconds: a recorded time later than now + this is not a time an agent wrote
_MISSING: Any = object()


class CorruptRecord(ValueError):
    """A record read back from the cluster breaks a rule: ``record`` (its name), ``field`` (the path of the
    field, "" for the record as a whole) and ``problem`` say which."""

    def __init__(self, record: str, field: str, problem: str) -> None:
        self.record = record
        self.field = field
        self.problem = problem
        super().__init__(f"{record}: {field}: {problem}" if field else f"{record}: {problem}")


def show(value: Any) -> str:
    """``value`` for a message, bounded whatever it is (a 10 MB string, an integer of 400 digits)."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        digits = int(value.bit_length() * 0.30103) + 1
        return repr(value) if digits <= 20 else f"an integer of about {digits} digits"
    if isinstance(value, str):
        return repr(value[:60]) + (f" (of {len(value)} characters)" if len(value) > 60 else "")
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _in_range(value: Any, low: float, high: float) -> bool:
    """A JSON number (never a boolean) within [low, high]; an int is compared as an int (no overflow)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return low <= value <= high  # False for NaN; exact for integers of any size


def load(text: Any, record: str, *, error: type[CorruptRecord] = CorruptRecord) -> Fields | None:
    """The record in an annotation's ``text``: None when absent or blank; raises ``error`` otherwise when
    it is too long, not JSON or not an object."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise error(record, "", f"not a string: {show(text)}")
    if len(text) > MAX_RECORD:
        raise error(record, "", f"{len(text)} characters, more than {MAX_RECORD}")
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep; ValueError: 5000 digits too
        raise error(record, "", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise error(record, "", f"not a JSON object: {show(data)}")
    return Fields(record=record, data=data, error=error)


@dataclass(frozen=True, slots=True)
class Fields:
    """One JSON object of a record, read field by field (``path``: where it is in the record)."""

    record: str
    data: Mapping[str, Any]
    path: str = ""
    error: type[CorruptRecord] = CorruptRecord

    def name(self, key: str) -> str:
        if not self.path or key.startswith("["):
            return f"{self.path}{key}"
        return f"{self.path}.{key}"

    def fail(self, key: str, problem: str) -> NoReturn:
        raise self.error(self.record, self.name(key), problem)

    def only(self, keys: Collection[str]) -> None:
        """Refuse a field not in ``keys`` (the first one, by name; a record whose codec knows all it may hold)."""
        for key in sorted(set(self.data) - set(keys)):
            shown = key if len(key) <= 60 else f"{key[:60]}..."
            self.fail(shown, f"is not a field of this record (its fields: {', '.join(sorted(keys))})")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                self.fail(key, "is missing")
            return default
        return value

    # ---- scalars -------------------------------------------------------------------------------------

    def text(self, key: str, *, default: Any = _MISSING, limit: int = MAX_TEXT, nonempty: bool = False) -> str:
        value = self._get(key, default)
        if not isinstance(value, str) or len(value) > limit or (nonempty and not value):
            self.fail(
                key,
                f"must be a {'non-empty ' if nonempty else ''}string of at most {limit} characters, got {show(value)}",
            )
        return value

    def choice(self, key: str, options: Collection[str], *, default: Any = _MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str) or value not in options:
            self.fail(key, f"must be one of {', '.join(sorted(options))}, got {show(value)}")
        return value

    def flag(self, key: str, *, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {show(value)}")
        return value

    def integer(self, key: str, *, low: int, high: int, default: Any = _MISSING) -> int:
        value = self._get(key, default)
        if not isinstance(value, int) or not _in_range(value, low, high):
            self.fail(key, f"must be a whole number from {low} to {high}, got {show(value)}")
        return value

    def number(self, key: str, *, low: float, high: float, default: Any = _MISSING) -> float:
        value = self._get(key, default)
        if not _in_range(value, low, high):
            self.fail(key, f"must be a number from {low:g} to {high:g}, got {show(value)}")
        return float(value)

    def time(self, key: str, *, default: Any = _MISSING, now: float | None = None, ahead: float = 0.0) -> float:
        """A time in seconds since 1970 (before year 10000; given ``now``, at most ``ahead`` after it)."""
        return check_time(self._get(key, default), self, key, now=now, ahead=ahead)

    def optional_time(self, key: str, *, now: float | None = None, ahead: float = 0.0) -> float | None:
        """A time, or None when the field is absent or null."""
        return self.time(key, now=now, ahead=ahead) if self.has(key) else None

    # ---- lists and objects ---------------------------------------------------------------------------

    def _list(self, key: str, default: Any) -> list[Any]:
        value = self._get(key, default)
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            self.fail(key, f"must be a list of at most {MAX_ITEMS} entries, got {show(value)}")
        return value

    def texts(
        self, key: str, *, default: Any = _MISSING, limit: int = MAX_TEXT, nonempty: bool = False
    ) -> tuple[str, ...]:
        """A list of strings (``nonempty``: at least one, none empty)."""
        items = self._list(key, default)
        if nonempty and not items:
            self.fail(key, "must be a non-empty list")
        view = Fields(record=self.record, data={}, path=self.name(key), error=self.error)
        for index, item in enumerate(items):
            if not isinstance(item, str) or len(item) > limit or (nonempty and not item):
                view.fail(
                    f"[{index}]",
                    f"must be a {'non-empty ' if nonempty else ''}string of at most {limit} "
                    f"characters, got {show(item)}",
                )
        return tuple(items)

    def times(
        self, key: str, *, default: Any = _MISSING, now: float | None = None, ahead: float = 0.0
    ) -> tuple[float, ...]:
        items = self._list(key, default)
        return tuple(check_time(t, self, f"{key}[{i}]", now=now, ahead=ahead) for i, t in enumerate(items))

    def objects(self, key: str, *, default: Any = _MISSING) -> Iterator[Fields]:
        """Each entry of a list of objects, as Fields."""
        for index, item in enumerate(self._list(key, default)):
            yield self._object(item, f"{key}[{index}]")

    def entries(self, key: str, *, default: Any = _MISSING, limit: int = MAX_TEXT) -> Iterator[tuple[str, Fields]]:
        """Each (name, entry) of an object of objects, as Fields; names are strings of at most ``limit``."""
        value = self._get(key, default)
        if not isinstance(value, Mapping) or len(value) > MAX_ITEMS:
            self.fail(key, f"must be an object of at most {MAX_ITEMS} entries, got {show(value)}")
        for name, item in value.items():
            if len(name) > limit:
                self.fail(key, f"has a key of {len(name)} characters, more than {limit}")
            yield name, self._object(item, f"{key}[{name!r}]")

    def _object(self, item: Any, where: str) -> Fields:
        if not isinstance(item, Mapping):
            self.fail(where, f"must be an object, got {show(item)}")
        return Fields(record=self.record, data=item, path=self.name(where), error=self.error)


def check_version(fields: Fields, current: int) -> int:
    """The record's ``version`` (absent: ``current``); one written by a newer agent is refused."""
    version = fields.integer("version", low=1, high=2**31, default=current)
    if version > current:
        fields.fail("version", f"written in format version {version} by a newer agent (this one reads {current})")
    return version


def check_time(value: Any, fields: Fields, key: str, *, now: float | None = None, ahead: float = 0.0) -> float:
    """``value`` as a time (see :meth:`Fields.time`); raises ``fields.error`` naming ``key``."""
    if not _in_range(value, 0.0, MAX_TIME):
        fields.fail(key, f"must be a time (seconds since 1970, before year 10000), got {show(value)}")
    moment = float(value)
    if now is not None and moment > now + ahead:
        fields.fail(key, f"is {iso(moment)}, more than {ahead:g}s after now ({iso(now)})")
    return moment


MAX_FENCES = 64  # devices of one incident (a node has at most a few dozen)
MAX_POD_KEY = 317  # "namespace/name": 63 + 1 + 253
FENCE_KEYS = ("device", "fence", "rule", "holders", "evicted", "steps")
FENCE_OUTCOMES = ("", "fenced", "vendor", "no-api", "not-dra")  # agent.recovery.fence.FenceOutcome values
DEVICE_STEPS = ("fence-device", "drain-device", "unfence-device")  # the device actions (model.Action values)


@dataclass(frozen=True, kw_only=True, slots=True)
class FenceFields:
    """One entry of an incident's ``fences``, checked (agent.recovery.node makes it a DeviceFence)."""

    device: str
    fence: str
    rule: str
    holders: tuple[str, ...]
    evicted: tuple[str, ...]
    steps: tuple[str, ...]


def read_fences(fields: Fields) -> tuple[FenceFields, ...]:
    """The incident's ``fences`` (absent: none): each entry checked, at most :data:`MAX_FENCES`, one per
    device, only known fields. Raises ``fields.error`` naming the field."""
    found: list[FenceFields] = []
    for entry in fields.objects("fences", default=[]):
        entry.only(FENCE_KEYS)
        fence = FenceFields(
            device=entry.text("device", limit=300, nonempty=True),
            fence=entry.choice("fence", FENCE_OUTCOMES, default=""),
            rule=entry.text("rule", default="", limit=253),
            holders=entry.texts("holders", default=[], limit=MAX_POD_KEY),
            evicted=entry.texts("evicted", default=[], limit=MAX_POD_KEY),
            steps=_steps(entry),
        )
        if any(f.device == fence.device for f in found):
            entry.fail("device", f"names {fence.device} a second time")
        found.append(fence)
    if len(found) > MAX_FENCES:
        fields.fail("fences", f"lists {len(found)} devices, more than {MAX_FENCES}")
    return tuple(found)


def _steps(entry: Fields) -> tuple[str, ...]:
    steps = entry.texts("steps", default=[])
    view = Fields(record=entry.record, data={}, path=entry.name("steps"), error=entry.error)
    for index, step in enumerate(steps):
        if step not in DEVICE_STEPS:
            view.fail(f"[{index}]", f"must be one of {', '.join(DEVICE_STEPS)}, got {show(step)}")
    return tuple(dict.fromkeys(steps))
