"""Sequence accounting: skip records already delivered, count gaps in sequence numbers as lost records."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent.core.columns import RecordColumns
from agent.core.types import LogRecord
from agent.sources.kmsg.stats import KmsgStats


class SequenceTracker:
    """Skip records already seen and count gaps in sequence numbers as lost records.

    Records that could not be parsed are reported with :meth:`skip`: they are not lost, so they do not
    count toward a gap.
    """

    def __init__(self, *, start_after_seq: int | None, stats: KmsgStats, log: logging.Logger) -> None:
        self._last = start_after_seq
        self._unparsed = 0  # skipped records of unknown seq since the last accepted one
        self._stats = stats
        self._log = log

    @property
    def last(self) -> int | None:
        """The sequence number of the last record accepted (or the start cursor); None before any."""
        return self._last

    def accept(self, seq: int) -> bool:
        """Whether a record with this seq is new; a jump past the last one counts the records between as lost."""
        last = self._last
        if last is not None:
            if seq <= last:
                return False
            lost = seq - last - 1 - self._unparsed
            if lost > 0:
                self._stats.records_lost += lost
                self._log.warning("kmsg: %d record(s) lost (sequence jumped from %d to %d)", lost, last, seq)
        self._last = seq
        self._unparsed = 0
        return True

    def accept_all(self, records: Sequence[LogRecord]) -> Sequence[LogRecord]:
        """:meth:`accept` each record in order; returns the new ones (``records`` itself when all are)."""
        if not records:
            return records
        seqs = records.seqs if isinstance(records, RecordColumns) else [record.seq for record in records]
        first, last = seqs[0], self._last
        if first is not None and (last is None or first == last + 1):  # noqa: SIM102  # narrows first
            if _consecutive(seqs, first):  # the usual case: nothing to skip
                self._last = first + len(seqs) - 1
                self._unparsed = 0
                return records
        return [record for record in records if record.seq is not None and self.accept(record.seq)]

    def skip(self, seq: int | None) -> bool:
        """Note a record that could not be parsed; returns whether it is new (count it once, as a parse error).

        With its seq unknown, it stands for one number of the next gap.
        """
        if seq is None:
            self._unparsed += 1
            return True
        return self.accept(seq)


def _consecutive(seqs: Sequence[int | None], first: int) -> bool:
    """Whether ``seqs`` are ``first``, ``first + 1``, ... (a device chunk's numbers come as that range already:
    compared without making a list of it)."""
    expected = range(first, first + len(seqs))
    return seqs == expected if isinstance(seqs, range) else list(seqs) == list(expected)
