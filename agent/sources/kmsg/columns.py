"""The decoder's lazy columns: a chunk's records, each ``LogRecord`` and each time worked out when asked for.

Why: docs/benchmarks.md, "The kmsg fast path".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from agent.core.columns import RecordColumns, items_equal
from agent.core.types import LogRecord

# A kernel record (facility 0: priority 0-7) at level L starts its line with "0," to "L,".
_HEADS = {level: tuple(b"%d," % n for n in range(level + 1)) for level in range(8)}
_SCANS: dict[int, Any] = {}


def _severe_scan(max_level: int) -> Any:
    """The RE2 pattern that finds the line starts of kernel records at ``max_level`` or worse (after a newline)."""
    found = _SCANS.get(max_level)
    if found is None:
        import re2  # google-re2, already loaded by agent.core.patterns; not at import: the relay imports no RE2

        found = _SCANS[max_level] = re2.compile(rb"\n[0-%d]," % max_level)
    return found


class KmsgColumns(RecordColumns):
    """A decoded chunk as columns. ``rows[i]`` is what ``make`` builds record ``i`` from.

    ``raw_lines`` (see :class:`~agent.core.columns.RecordColumns`): a literal a message holds is in its line;
    one found in a header only makes the line a candidate the rules' regexes then turn down.
    """

    __slots__ = ("messages", "timestamps", "seqs", "_rows", "_make", "raw_lines", "_lines")

    def __init__(
        self,
        *,
        messages: Sequence[str],
        timestamps: Sequence[float],
        seqs: Sequence[int | None],
        rows: Sequence[Any],
        make: Callable[[Any], LogRecord],
        raw_lines: bytes | None = None,
        lines: bytes | None = None,
    ) -> None:
        """``lines``: the chunk's bytes where they are one line a record (a device's read without dictionary
        lines), escaped or not; :meth:`severe` scans them (``raw_lines`` are such lines too)."""
        self.messages = messages
        self.timestamps = timestamps
        self.seqs = seqs
        self._rows = rows
        self._make = make
        self.raw_lines = raw_lines
        self._lines = lines if lines is not None else raw_lines

    @overload
    def __getitem__(self, index: int) -> LogRecord: ...

    @overload
    def __getitem__(self, index: slice) -> KmsgColumns: ...

    def __getitem__(self, index: int | slice) -> LogRecord | KmsgColumns:
        if isinstance(index, slice):
            return KmsgColumns(
                messages=self.messages[index],
                timestamps=self.timestamps[index],
                seqs=self.seqs[index],
                rows=self._rows[index],
                make=self._make,
            )
        return self._make(self._rows[index])

    def severe(self, max_level: int) -> list[int]:
        """:meth:`RecordColumns.severe` by one scan of the chunk's bytes in C where the columns have them (the
        kernel's own lines, one a record): no record built, no per-record Python work."""
        raw = self._lines
        if raw is None or not 0 <= max_level <= 7:
            return [i for i, row in enumerate(self._rows) if _level(row[0], max_level)]
        # One RE2 scan for "\nL," (about 0.03 us a record; bytes.find per level and Python's re take ten times
        # that): the records at error level are few. A kernel record (facility 0) at level L starts its line "L,".
        starts = [0] if raw[:2] in _HEADS[max_level] else []
        starts += [m.start() + 1 for m in _severe_scan(max_level).finditer(raw)]
        found: list[int] = []
        line = 0
        at = 0
        for start in starts:
            line += raw.count(b"\n", at, start)
            at = start
            found.append(line)
        return found

    def gated(self, max_level: int) -> list[int]:
        """:meth:`RecordColumns.gated`: every record of the kernel's device has its level, so :meth:`severe`."""
        return self.severe(max_level)


def _level(priority: str, max_level: int) -> bool:
    """Whether a record's priority text is the kernel's (facility 0) at ``max_level`` or worse."""
    prio = int(priority)
    return prio < 8 and prio <= max_level


# How much earlier than the first of a run of kernel log records (in the order the kernel logged them) a
# later one's time can be: the CPUs' clocks differ by microseconds, a printk preempted between taking its
# time and taking its place in the log waits milliseconds at most (see ``MicrosecondTimes.at_least``).
KERNEL_ORDER_SLACK = 1.0


class MicrosecondTimes(Sequence[float]):
    """Times given as microseconds (decimal text, as the kernel prints them) after ``base`` seconds, each
    one's ``base + micros / 1e6`` worked out only when read. Equal to any sequence of the same floats.

    ``logged_order``: the times are of kernel log records read in the order the kernel logged them (one read
    of its device), none earlier than the first by more than ``KERNEL_ORDER_SLACK``."""

    __slots__ = ("_micros", "_base", "_logged_order")

    def __init__(self, *, micros: Sequence[str], base: float, logged_order: bool = False) -> None:
        self._micros = micros
        self._base = base
        self._logged_order = logged_order

    def __len__(self) -> int:
        return len(self._micros)

    @overload
    def __getitem__(self, index: int) -> float: ...

    @overload
    def __getitem__(self, index: slice) -> MicrosecondTimes: ...

    def __getitem__(self, index: int | slice) -> float | MicrosecondTimes:
        if isinstance(index, slice):
            in_order = self._logged_order and index.step in (None, 1)
            return MicrosecondTimes(micros=self._micros[index], base=self._base, logged_order=in_order)
        return self._base + int(self._micros[index]) / 1e6

    def at_least(self, oldest: float) -> bool:
        """Whether no time is before ``oldest``. In logged order, a first time ``KERNEL_ORDER_SLACK`` or more
        after ``oldest`` answers it without reading the others (the replay policy asks for every batch read,
        and every one read live is that new)."""
        if self._logged_order and self._micros and self[0] - KERNEL_ORDER_SLACK >= oldest:
            return True
        return not self._micros or self.earliest() >= oldest

    def __iter__(self) -> Iterator[float]:
        base = self._base
        return iter([base + micros / 1e6 for micros in map(int, self._micros)])

    def earliest(self) -> float:
        """``min(self)`` without working out every time (the sum is monotonic in the microseconds)."""
        return self._base + min(map(int, self._micros)) / 1e6

    def __eq__(self, other: object) -> bool:
        equal = items_equal(self, other)
        return NotImplemented if equal is None else equal

    __hash__ = None  # type: ignore[assignment]  # a sequence, compared by content

    def __repr__(self) -> str:
        return f"MicrosecondTimes({list(self)!r})"
