"""Records as columns: what the matcher, the replay policy, the cursor and the ring read of a batch.

A source may hand over a batch whose records are built only when asked for (the kmsg decoder's, in
:mod:`agent.sources.kmsg.columns`); consumers read the columns through :class:`RecordColumns` and
never build a record for it. Why: docs/benchmarks.md, "The kmsg fast path".
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, overload

from agent.core.types import LogRecord


class RecordColumns(Sequence[LogRecord]):
    """Records in read order with their columns: each one's message, time and sequence number.

    ``raw_lines``: where a source has them, the records' bytes as the kernel printed them, one ``\\n``-ended
    line a record holding its message verbatim; the rule prefilter scans these in place of the messages.
    None otherwise, and for a slice. Equal to any sequence of the same records.
    """

    __slots__ = ()

    messages: Sequence[str]
    timestamps: Sequence[float]
    seqs: Sequence[int | None]
    raw_lines: bytes | None

    @staticmethod
    def of(records: Sequence[LogRecord]) -> RecordColumns:
        """``records`` as columns (themselves when they are)."""
        return records if isinstance(records, RecordColumns) else ListedColumns(records)

    @overload
    def __getitem__(self, index: int) -> LogRecord: ...

    @overload
    def __getitem__(self, index: slice) -> RecordColumns: ...

    @abstractmethod
    def __getitem__(self, index: int | slice) -> LogRecord | RecordColumns: ...

    def __len__(self) -> int:
        return len(self.messages)

    def __eq__(self, other: object) -> bool:
        equal = items_equal(self, other)
        return NotImplemented if equal is None else equal

    __hash__ = None  # type: ignore[assignment]  # a sequence of records, compared by content

    def __repr__(self) -> str:
        return f"RecordColumns({list(self)!r})"

    def severe(self, max_level: int) -> list[int]:
        """The indexes of the kernel's records (facility 0, or none known) at level ``max_level`` or worse
        (0 = emerg ... 3 = err): what the catch-all looks at. Records without a level are none of them."""
        return [i for i, r in enumerate(self) if r.priority is not None and r.priority <= max_level and not r.facility]

    def gated(self, max_level: int) -> list[int] | None:
        """The indexes of the records a rule with ``maxLevel: max_level`` looks at: the kernel's at that level or
        worse (as :meth:`severe`) and every record whose level is not known; None when no record's level is known
        (then every rule looks at every record)."""
        found: list[int] = []
        known = False
        for i, r in enumerate(self):
            if r.priority is None:
                found.append(i)
            else:
                known = True
                if r.priority <= max_level and not r.facility:
                    found.append(i)
        return found if known else None


class ListedColumns(RecordColumns):
    """Built records as columns."""

    __slots__ = ("messages", "timestamps", "seqs", "raw_lines", "_records")

    def __init__(self, records: Sequence[LogRecord]) -> None:
        self.messages = [r.message for r in records]
        self.timestamps = [r.timestamp for r in records]
        self.seqs = [r.seq for r in records]
        self.raw_lines = None
        self._records = records

    @overload
    def __getitem__(self, index: int) -> LogRecord: ...

    @overload
    def __getitem__(self, index: slice) -> RecordColumns: ...

    def __getitem__(self, index: int | slice) -> LogRecord | RecordColumns:
        if isinstance(index, slice):
            return ListedColumns(self._records[index])
        return self._records[index]


def items_equal(mine: Sequence[Any], other: object) -> bool | None:
    """Whether ``other`` is a sequence (not text) of items equal to ``mine``'s, in order; None when it is no
    sequence (``__eq__`` then answers NotImplemented): the ``==`` of lazily built sequences."""
    if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
        return len(mine) == len(other) and all(a == b for a, b in zip(mine, other, strict=True))
    return None


_T = TypeVar("_T")
_S = TypeVar("_S")


class Mapped(Sequence[_T]):
    """``read`` of each of ``items``, worked out when asked for (an index, a slice, iterating): per-record
    fields that matching reads for a few lines of a batch only."""

    __slots__ = ("_items", "_read")

    def __init__(self, items: Sequence[_S], read: Callable[[_S], _T]) -> None:
        self._items = items
        self._read = read

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> Mapped[_T]: ...

    def __getitem__(self, index: int | slice) -> _T | Mapped[_T]:
        if isinstance(index, slice):
            return Mapped(self._items[index], self._read)
        return self._read(self._items[index])

    def __iter__(self) -> Iterator[_T]:
        return map(self._read, self._items)
