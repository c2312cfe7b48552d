"""Replay-cursor policy: what to do with kernel records seen again after an agent restart.

The cursor ``(boot_id, last_seq)`` is saved in the state directory once everything up to
``last_seq`` has been handled durably; on restart the kernel replays its ring buffer, and records
up to the cursor only rebuild permanent conditions (no repeated Events).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent.types import LogRecord

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
        self._state_dir.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"boot_id": cursor.boot_id, "last_seq": cursor.last_seq}).encode()
        fd, tmp = tempfile.mkstemp(dir=self._state_dir, prefix=f".{self.FILE_NAME}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        try:
            dir_fd = os.open(self._state_dir, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass  # some filesystems cannot fsync a directory; the rename is still atomic
        finally:
            os.close(dir_fd)


class ReplayMode(enum.StrEnum):
    """How detectors treat a record: all rules, or only permanent ones (rebuild state, no repeat Events)."""

    FULL = "full"
    PERMANENT_ONLY = "permanent_only"


def replay_mode(*, record: LogRecord, cursor: Cursor | None, boot_id: str, now: float, lookback: float) -> ReplayMode:
    """Decide whether a record was (probably) already handled before an agent restart.

    With a cursor from this boot, records up to ``cursor.last_seq`` were processed already:
    PERMANENT_ONLY. Without one (first start, or a new boot), records older than ``now - lookback``
    are PERMANENT_ONLY; everything else is FULL.
    """
    if cursor is not None and cursor.boot_id == boot_id and record.seq is not None:
        return ReplayMode.PERMANENT_ONLY if record.seq <= cursor.last_seq else ReplayMode.FULL
    return ReplayMode.PERMANENT_ONLY if record.timestamp < now - lookback else ReplayMode.FULL
