"""The state directory: atomic writes, our conditions kept across restarts, and what went wrong.

What lives there: ``kmsg-cursor.json`` (the replay cursor), ``clears.json`` (the operator's clears and
their boundaries), ``conditions.json`` (our conditions with status, reason, severity, transition times
and the devices whose problems hold them, so a restart needs no API server to stay consistent and a
per-device problem keeps its device) and ``events-outbox.json`` (Events not yet delivered). A state
directory that cannot be written is not a liveness failure (a restart would not fix it): it is reported
in ``/healthz`` details and the ``node_health_agent_state_dir_ok`` metric, and the agent goes on in memory.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.core.bounds import bounded_reason
from agent.core.clears import MAX_BLOB, BadClear, ClearRecord, parse_records, records_text
from agent.core.devices import BadDevice, DeviceProblem, device_problem_from_json
from agent.core.state import MAX_DEVICES
from agent.core.types import Condition, Severity, Status

log = logging.getLogger(__name__)

CONDITIONS_FILE = "conditions.json"
MAX_CONDITIONS_FILE = 4 * 1024 * 1024  # bytes: far above what our conditions take; a bigger file is not ours
_FORMAT = 1


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename). Raises OSError."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(dir_fd)


class StateDirHealth:
    """Problems writing or reading the state directory, by part (``cursor``, ``conditions``, ``outbox``).

    Thread-safe. Each part's first failure is logged at error level, later ones only at debug
    level, and its recovery at info level, so a broken directory costs one log line, not one per write.
    """

    def __init__(self, *, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._problems: dict[str, str] = {}
        self._watched: dict[str, Callable[[], str | None]] = {}

    def watch(self, part: str, error: Callable[[], str | None]) -> None:
        """A part that keeps its own last error (e.g. the Event outbox): read it with the others."""
        self._watched[part] = error

    def report(self, part: str, error: str | None) -> None:
        with self._lock:
            before = self._problems.get(part)
            if error is None:
                self._problems.pop(part, None)
            else:
                self._problems[part] = error
        if error is not None and before is None:
            log.error("state directory %s: %s (restarts will replay more or lose state)", self.path, error)
        elif error is not None:
            log.debug("state directory %s: %s", self.path, error)
        elif before is not None:
            log.info("state directory %s: %s works again", self.path, part)

    def problems(self) -> dict[str, str]:
        with self._lock:
            found = dict(self._problems)
        for part, error in self._watched.items():
            if (text := error()) is not None:
                found[part] = text
        return found

    @property
    def ok(self) -> bool:
        return not self.problems()

    def check(self) -> None:
        """Probe at startup that the directory exists (created if missing) and takes files."""
        try:
            atomic_write(self.path / ".write-test", b"ok")
            (self.path / ".write-test").unlink()
        except OSError as exc:
            self.report("directory", f"cannot write to {self.path}: {exc.strerror or exc}")
        else:
            self.report("directory", None)


def condition_to_json(cond: Condition) -> dict[str, object]:
    return {
        "type": cond.type,
        "status": cond.status.value,
        "reason": cond.reason,
        "message": cond.message,
        "lastTransition": cond.last_transition,
        "lastUpdate": cond.last_update,
        "severity": cond.severity.value,
        "fields": {k: v for k, v in cond.fields.items() if isinstance(v, str | int | float | bool)},
        "devices": [d.to_json() for d in cond.devices],  # an older agent ignores the key (no new format)
    }


def condition_from_json(raw: object) -> Condition:
    """Raises ValueError/KeyError/TypeError for anything but a condition we wrote.

    The reason is cut as every rule and sink cuts it (:func:`~agent.core.bounds.bounded_reason`): a file an
    older version wrote with a reason of any length restores the reason the same line gives now."""
    if not isinstance(raw, dict):
        raise TypeError(f"not an object: {raw!r}")
    for key in ("lastTransition", "lastUpdate"):
        if isinstance(raw[key], bool) or not isinstance(raw[key], int | float):
            raise TypeError(f"{key} is not a number")
    if not isinstance(raw["type"], str) or not raw["type"]:
        raise TypeError("type is not a non-empty string")
    return Condition(
        type=raw["type"],
        status=Status(raw["status"]),
        reason=bounded_reason(str(raw["reason"])),
        message=str(raw["message"]),
        last_transition=float(raw["lastTransition"]),
        last_update=float(raw["lastUpdate"]),
        severity=Severity(raw.get("severity", Severity.ERROR.value)),
        fields=dict(raw.get("fields") or {}),
        devices=_devices(raw["type"], raw.get("devices")) if raw["status"] == Status.TRUE.value else (),
    )


def _devices(condition: str, raw: object) -> tuple[DeviceProblem, ...]:
    """The devices whose problems hold ``condition`` (a file of an older agent has none: node-scoped, as it
    was). An entry that is not one we wrote is dropped and logged: the condition itself is kept (held by
    the devices left, or by the node when none is left), never the whole file lost for one entry."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        log.warning("state directory: condition %s: devices is not a list: restored without its devices", condition)
        return ()
    kept: dict[str, DeviceProblem] = {}
    for i, entry in enumerate(raw[:MAX_DEVICES]):
        try:
            problem = device_problem_from_json(entry)
        except BadDevice as exc:
            log.warning("state directory: condition %s: device entry %d dropped (%s)", condition, i, exc)
            continue
        kept.setdefault(problem.device.key, problem)  # a key twice: the first kept, as the state has it
    if len(raw) > MAX_DEVICES:
        log.warning(
            "state directory: condition %s: %d device entries over %d dropped",
            condition,
            len(raw) - MAX_DEVICES,
            MAX_DEVICES,
        )
    return tuple(kept.values())


class ConditionStore:
    """Our conditions in ``<state_dir>/conditions.json``; failures go to :class:`StateDirHealth`."""

    def __init__(self, *, health: StateDirHealth) -> None:
        self._health = health
        self.path = health.path / CONDITIONS_FILE

    def load(self) -> list[Condition] | None:
        """The kept conditions; None when there are none or they cannot be read (reported, never raised)."""
        if self.path.exists() and not self.path.is_file():
            self._health.report("conditions", f"{self.path} is not a regular file")
            return None
        try:
            with self.path.open("rb") as f:
                blob = f.read(MAX_CONDITIONS_FILE + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._health.report("conditions", f"cannot read {self.path}: {exc}")
            return None
        if len(blob) > MAX_CONDITIONS_FILE:
            log.warning(
                "ignoring %s (over %d bytes: not ours); the Node's copy is read instead", self.path, MAX_CONDITIONS_FILE
            )
            return None
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._health.report("conditions", f"cannot read {self.path}: {exc}")
            return None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError(f"unknown format {data.get('format') if isinstance(data, dict) else data!r}")
            return [condition_from_json(c) for c in data["conditions"]]
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring %s (corrupt: %r); the Node's copy is read instead", self.path, exc)
            return None

    def save(self, conditions: Iterable[Condition]) -> None:
        body = {"format": _FORMAT, "conditions": [condition_to_json(c) for c in conditions]}
        try:
            atomic_write(self.path, json.dumps(body, sort_keys=True).encode())
        except OSError as exc:
            self._health.report("conditions", f"cannot write {self.path}: {exc.strerror or exc}")
        else:
            self._health.report("conditions", None)


class ClearStore:
    """The operator's clears the agent handled (their boundaries) in ``<state_dir>/clears.json``: a restart
    holds back the records before each boundary though the Node cannot be read. Failures go to
    :class:`StateDirHealth` (part ``clears``)."""

    FILE_NAME = "clears.json"

    def __init__(self, *, health: StateDirHealth) -> None:
        self._health = health
        self.path = health.path / self.FILE_NAME

    def load(self) -> tuple[ClearRecord, ...]:
        """The kept records; none when there are none or they cannot be read (reported, never raised)."""
        try:
            with self.path.open("rb") as f:
                blob = f.read(MAX_BLOB + 1)
            return parse_records(blob.decode("utf-8"))
        except FileNotFoundError:
            return ()
        except (OSError, UnicodeDecodeError, BadClear) as exc:
            self._health.report("clears", f"cannot read {self.path}: {exc}")
            return ()

    def save(self, records: Iterable[ClearRecord]) -> None:
        try:
            atomic_write(self.path, records_text(records).encode())
        except OSError as exc:
            self._health.report("clears", f"cannot write {self.path}: {exc.strerror or exc}")
        else:
            self._health.report("clears", None)
