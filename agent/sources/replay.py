"""Replay-cursor policy: what to do with kernel records seen again after an agent restart.

The cursor ``(boot_id, last_seq)`` is saved in the state directory once everything up to
``last_seq`` has been handled durably; on restart the kernel replays its ring buffer, and records
up to the cursor only rebuild permanent conditions (no repeated Events). An operator's clear adds a
boundary (:mod:`agent.core.clears`): records up to it never raise what was cleared again
(:func:`held_back`), whether replayed or read live, until a new boot.
"""

from __future__ import annotations

import bisect
import json
import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from agent.core.clears import ClearRecord
from agent.core.columns import RecordColumns
from agent.core.statedir import atomic_write
from agent.core.types import LogRecord
from agent.sources.kmsg.columns import MicrosecondTimes

_logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Cursor:
    """The last record processed, tied to the boot it belongs to (sequence numbers restart at boot)."""

    boot_id: str
    last_seq: int


class CursorStore:
    """Persist a :class:`Cursor` as ``<state_dir>/kmsg-cursor.json``, written atomically."""

    FILE_NAME = "kmsg-cursor.json"

    def __init__(self, *, state_dir: Path) -> None:
        self._state_dir = Path(state_dir)
        self.path = self._state_dir / self.FILE_NAME

    def load(self) -> Cursor | None:
        """Return the saved cursor; ``None`` if there is none or it is unreadable (logged, never raised)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            _logger.warning("kmsg cursor %s cannot be read, ignoring it: %s", self.path, exc)
            return None
        try:
            data = json.loads(text)
            boot_id, last_seq = data["boot_id"], data["last_seq"]
        except (ValueError, TypeError, KeyError) as exc:
            _logger.warning("kmsg cursor %s is corrupt, ignoring it: %r", self.path, exc)
            return None
        if not isinstance(boot_id, str) or not boot_id or type(last_seq) is not int or last_seq < 0:
            _logger.warning("kmsg cursor %s has invalid values, ignoring it: %r", self.path, data)
            return None
        return Cursor(boot_id=boot_id, last_seq=last_seq)

    def save(self, cursor: Cursor) -> None:
        """Write the cursor atomically (temp file in the same directory, fsync, rename). Raises OSError."""
        atomic_write(self.path, json.dumps({"boot_id": cursor.boot_id, "last_seq": cursor.last_seq}).encode())


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayPolicy:
    """Which records were (probably) handled before an agent restart: those only rebuild permanent state.

    With a cursor from this boot, records up to ``cursor.last_seq`` were processed already. Without
    one (first start, or a new boot), or for a record without a sequence number, records older than
    ``now - lookback`` count as processed.
    """

    cursor: Cursor | None
    boot_id: str
    lookback: float

    def replayed(self, record: LogRecord, *, now: float) -> bool:
        return self._replayed(record.seq, record.timestamp, oldest=now - self.lookback)

    def _replayed(self, seq: int | None, timestamp: float, *, oldest: float) -> bool:
        cursor = self.cursor
        if cursor is not None and cursor.boot_id == self.boot_id and seq is not None:
            return seq <= cursor.last_seq
        return timestamp < oldest

    def split(self, records: Sequence[LogRecord], *, now: float) -> list[tuple[Sequence[LogRecord], bool]]:
        """Runs of consecutive records with the same :meth:`replayed`, in order: ``(records, replayed)``.

        Decided on the records' columns (:class:`RecordColumns`): no record is built for it."""
        if not records:
            return []
        columns = RecordColumns.of(records)
        seqs, oldest, cursor = columns.seqs, now - self.lookback, self.cursor
        if cursor is None or cursor.boot_id != self.boot_id:  # by time alone (a first start, a new boot)
            times = columns.timestamps
            if times.at_least(oldest) if isinstance(times, MicrosecondTimes) else min(times) >= oldest:  # every one new
                return [(records, False)]
        elif None not in seqs:
            known = cast(Sequence[int], seqs)
            if min(known) > cursor.last_seq:  # the usual case: every one new (C loops only)
                return [(records, False)]
            if all(map(operator.lt, known, known[1:])):
                cut = bisect.bisect_right(known, cursor.last_seq)  # ascending: one cut point
                return [run for run in ((records[:cut], True), (records[cut:], False)) if run[0]]
        flags = [
            self._replayed(seq, timestamp, oldest=oldest)
            for seq, timestamp in zip(seqs, columns.timestamps, strict=True)
        ]
        runs: list[tuple[Sequence[LogRecord], bool]] = []
        start = 0
        for i in range(1, len(records) + 1):
            if i == len(records) or flags[i] != flags[start]:
                runs.append((records[start:i], flags[start]))
                start = i
        return runs


def held_back(
    records: Sequence[LogRecord], clears: Sequence[ClearRecord], *, boot_id: str
) -> list[tuple[Sequence[LogRecord], tuple[ClearRecord, ...]]]:
    """Runs of consecutive records with the clears whose boundary holds them back (none: a run of new
    records), in order. Only clears of this boot count: a new boot voids every boundary."""
    if not records:
        return []
    active = [c for c in clears if c.seq is not None and c.holds_back(boot_id=boot_id, seq=c.seq)]
    if not active:
        return [(records, ())]
    seqs = RecordColumns.of(records).seqs
    newest = max(c.seq for c in active if c.seq is not None)
    if None not in seqs and min(cast(Sequence[int], seqs)) > newest:  # the usual case: all after every boundary
        return [(records, ())]
    held = [tuple(c for c in active if c.holds_back(boot_id=boot_id, seq=seq)) for seq in seqs]
    runs: list[tuple[Sequence[LogRecord], tuple[ClearRecord, ...]]] = []
    start = 0
    for i in range(1, len(records) + 1):
        if i == len(records) or held[i] != held[start]:
            runs.append((records[start:i], held[start]))
            start = i
    return runs
