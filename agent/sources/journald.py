"""The systemd journal (node-problem-detector's ``plugin: journald``) as a source of ``LogRecord``s.

node-problem-detector links libsystemd; this source runs ``journalctl`` instead (no binding to build or
load) and reads its JSON output::

    journalctl --follow --output=json --no-pager --all --lines=all --since=@<start - lookback>
               [--directory=<logPath>] SYSLOG_IDENTIFIER=<pluginConfig.source> [_TRANSPORT=kernel]

``SYSLOG_IDENTIFIER`` is whatever the sender says: any local user can write ``logger -t kernel
"NVRM: Xid ..."``. So for ``source: kernel`` the entries must also have ``_TRANSPORT=kernel``, a
trusted field (journald sets the fields starting with ``_`` itself; a client cannot), which only
messages read from the kernel's own log carry. Other identifiers (``dockerd``, ``kubelet``) can be
written by any user; see plugins/README.md, "Who can write to a log source".

``--all`` keeps fields over 4096 bytes (journalctl prints them as ``null`` otherwise); ``--lines=all``
because with ``--after-cursor`` and ``--follow`` journalctl 252 prints only the first 10 entries of the
backlog. The process runs without a shell in its own process group, with only ``PATH``/``LANG``/``LC_ALL``
set, and the whole group is killed when the source stops. When it exits, it is started again after a
backoff, continuing after the cursor (``__CURSOR``) of the last entry read, so nothing is read twice.

Each output line is one JSON object (journalctl(1), "json" output; systemd.io/JOURNAL_EXPORT_FORMATS):
values are strings, except a value with non-printable or non-UTF-8 bytes (an array of byte values), a
field that occurs several times (an array of its values; like node-problem-detector, the last one
counts), and an over-long field without ``--all`` (``null``). ``__REALTIME_TIMESTAMP`` is microseconds
since the epoch as a decimal string. The message is ``MESSAGE`` with surrounding white space removed
(as node-problem-detector does); entries without a message are counted and dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agent.core import proctree
from agent.core.backoff import Backoff
from agent.core.process import DEFAULT_PATH, resolve
from agent.core.types import LogRecord
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.polling import Poll, polled_chunks

_logger = logging.getLogger(__name__)

MAX_ENTRY_MESSAGE = 64 * 1024  # characters: a longer message is cut here
MAX_JSON_LINE = 1 << 20  # bytes: a longer output line (entry) is dropped
READ_SIZE = 64 * 1024
STDERR_KEEP = 4096  # bytes of journalctl's stderr kept for the error message
# The default image has no journalctl (systemd is about 105 MB); the journald variant has it (Dockerfile).
NO_JOURNALCTL_HINT = (
    " (the default image has no journalctl: run the journald variant, image tag <version>-journald, which the"
    " kustomize component daemonset/components/journald selects)"
)
EXIT_GRACE = 0.5  # seconds journalctl may take to exit after closing its output
KERNEL_SOURCE = "kernel"  # the identifier journald gives kernel messages; any user can log under it too


@dataclass(frozen=True, kw_only=True, slots=True)
class JournalConfig:
    """The validated settings of one ``plugin: journald`` monitor.

    ``source`` = ``pluginConfig.source`` (matched against ``SYSLOG_IDENTIFIER``, must not be empty);
    ``directory`` = ``logPath`` (a journal directory; None = the system journal); ``lookback`` in seconds.
    """

    source: str
    directory: str | None = None
    lookback: float = 0.0


@dataclass
class JournalStats(KmsgStats):
    """:class:`KmsgStats` for the journal: ``reader_restarts`` counts journalctl restarts, ``read_errors``
    failed starts and exits, ``parse_errors`` output lines that are not JSON objects.

    Written by the reader thread: ``read_errors``, ``reader_restarts``, ``last_activity``, ``last_error``,
    ``connected``; by :meth:`JournalSource.decode`: the rest.
    """

    entries_too_long: int = 0  # output lines over MAX_JSON_LINE, dropped
    empty_messages: int = 0  # entries without a MESSAGE (missing, null, or only white space)
    messages_cut: int = 0  # messages over MAX_ENTRY_MESSAGE
    timestamp_errors: int = 0  # no usable __REALTIME_TIMESTAMP: kept with the read time


@dataclass(frozen=True, slots=True)
class JournalChunk:
    """Complete output lines as read (each ends in ``\\n``) and when they were read."""

    data: bytes
    read_time: float


def build_command(
    program: str, config: JournalConfig, *, since: float | None = None, after_cursor: str | None = None
) -> list[str]:
    """The journalctl command line: entries after ``after_cursor``, else from ``since`` (epoch seconds)."""
    argv = [program, "--follow", "--output=json", "--no-pager", "--all", "--lines=all"]
    if after_cursor is not None:
        argv.append(f"--after-cursor={after_cursor}")
    elif since is not None:
        argv.append(f"--since=@{int(since)}")
    if config.directory:
        argv.append(f"--directory={config.directory}")
    argv.append(f"SYSLOG_IDENTIFIER={config.source}")
    if config.source == KERNEL_SOURCE:
        argv.append("_TRANSPORT=kernel")  # ANDed with the identifier: only what the kernel itself logged
    return argv


def _field_text(value: Any) -> str | None:
    """A journal field value as text: a string, a byte array, or the last of several values; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if all(isinstance(item, int) and not isinstance(item, bool) for item in value):
            try:
                return bytes(value).decode("utf-8", "replace")
            except ValueError:  # a number outside 0..255
                return None
        return _field_text(value[-1])
    return None


def _int_field(entry: dict[str, Any], name: str) -> int | None:
    value = entry.get(name)
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else None


def _cursor_of(line: bytes) -> str | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    cursor = entry.get("__CURSOR") if isinstance(entry, dict) else None
    return cursor if isinstance(cursor, str) and cursor else None


class _Process:
    """A running journalctl: its pipes (non-blocking) in a selector, and the tail of its stderr."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.stdout_fd = proc.stdout.fileno()
        self.stderr_fd = proc.stderr.fileno()
        self.selector = selectors.DefaultSelector()
        self.stderr = b""
        for fd in (self.stdout_fd, self.stderr_fd):
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)

    def wait_readable(self, timeout: float) -> set[int]:
        return {key.fd for key, _ in self.selector.select(timeout=timeout)}

    def read_stdout(self) -> bytes | None:
        """What is there to read; ``b""`` at the end of the output (or a read error); None: nothing yet."""
        try:
            return os.read(self.stdout_fd, READ_SIZE)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def read_stderr(self) -> bytes:
        """Read what journalctl wrote to stderr (its tail is kept in ``stderr``); returns what was new."""
        new = b""
        while True:
            try:
                data = os.read(self.stderr_fd, READ_SIZE)
            except OSError:  # BlockingIOError included: nothing more for now
                break
            if not data:  # closed: stop watching it, or every select would return at once
                if self.stderr_fd in self.selector.get_map():
                    self.selector.unregister(self.stderr_fd)
                break
            new = (new + data)[-STDERR_KEEP:]
        self.stderr = (self.stderr + new)[-STDERR_KEEP:]
        return new

    def exited(self) -> bool:
        """Whether journalctl has exited, without reaping it: its pid keeps naming its process group."""
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def finish(self, *, grace: float) -> int:
        """Wait up to ``grace`` for the exit, kill what is left of its process group, reap; the exit status."""
        deadline = time.monotonic() + grace
        while not self.exited() and time.monotonic() < deadline:
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the group id is its pid
        code = proctree.wait(self.proc)
        proc = self.proc
        self.read_stderr()
        self.selector.close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        return code


class JournalSource:
    """Follow the journal entries of one ``SYSLOG_IDENTIFIER`` through ``journalctl`` (see the module docstring).

    Implements the producer ``Source`` protocol: ``stats``, ``chunks(stop=...)`` (reader thread),
    ``decode(chunk)`` (main loop, in chunk order). :meth:`poll_once` is one step of ``chunks``.

    ``path`` is where ``program`` is looked up (never the agent's own ``PATH``); ``clock`` (wall seconds)
    gives the start of the lookback and read times; ``monotonic`` feeds ``stats.last_activity``, refreshed
    while journalctl runs (at least every ``poll_interval``); ``sleep`` waits in backoff (default
    ``stop.wait``). A missing ``journalctl`` is ``last_error`` and a retry after backoff, never an exception.
    """

    def __init__(
        self,
        *,
        config: JournalConfig,
        stats: JournalStats | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        path: str = DEFAULT_PATH,
        program: str = "journalctl",
        poll_interval: float = 1.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        logger: logging.Logger | None = None,
    ) -> None:
        if not config.source:
            raise ValueError("pluginConfig.source must name a SYSLOG_IDENTIFIER")
        if poll_interval <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError("need poll_interval > 0 and 0 < backoff_initial <= backoff_max")
        self._config = config
        self._label = f"journald:{config.source}"
        self._stats = stats if stats is not None else JournalStats()
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._path = path
        self._program = program
        self._poll_interval = poll_interval
        self._log = logger if logger is not None else _logger
        self._backoff = Backoff(initial=backoff_initial, maximum=backoff_max)
        # reader state
        self._process: _Process | None = None
        self._pending = b""
        self._discard = False  # dropping the rest of an over-long line
        self._since: float | None = None  # the start of the lookback, fixed at the first start
        self._last_line: bytes | None = None  # the last complete output line: its __CURSOR resumes
        self._last_read: float | None = None
        # decoder state
        self._seq = 0
        self._warned: set[str] = set()

    # -- public ------------------------------------------------------------------------------------

    @property
    def stats(self) -> JournalStats:
        return self._stats

    @property
    def config(self) -> JournalConfig:
        return self._config

    def command(self, program: str | None = None) -> list[str]:
        """The command line the next start runs (``program`` defaults to the configured name)."""
        cursor = _cursor_of(self._last_line) if self._last_line is not None else None
        since = self._since if self._last_read is None else self._last_read
        if since is None:
            since = self._clock() - self._config.lookback
        return build_command(program or self._program, self._config, since=since, after_cursor=cursor)

    def chunks(self, *, stop: threading.Event) -> Iterator[JournalChunk]:
        """Yield chunks of complete output lines until ``stop`` is set; journalctl is killed when this ends."""
        return polled_chunks(poll_once=self.poll_once, close=self.close, stop=stop, sleep=self._sleep)

    def poll_once(self) -> Poll:
        """One step: start journalctl, or wait up to ``poll_interval`` for its output and read once."""
        process = self._process
        if process is None:
            return self._start()
        ready = process.wait_readable(self._poll_interval)
        if process.stderr_fd in ready and (said := process.read_stderr().strip()):
            self._warn_once("stderr", "journalctl says: %s", said.decode("utf-8", "replace"))
        running = not process.exited()
        if process.stdout_fd not in ready and running:
            self._alive()  # running, nothing to say
            return Poll(chunk=None, wait=0.0)
        data = process.read_stdout()
        if data:
            self._alive()
            self._backoff.reset()
            return Poll(chunk=self._take(data), wait=0.0)
        if data is None and running:
            return Poll(chunk=None, wait=0.0)
        return self._exited(process)  # end of output, or exited (a child of it may hold the pipe open)

    def close(self) -> None:
        """Stop journalctl (its whole process group); the next poll starts it again."""
        if self._process is not None:
            self._process.finish(grace=0.0)
            self._process = None
        self._stats.connected = False

    def decode(self, chunk: JournalChunk) -> list[LogRecord]:
        """The records of a chunk's entries, in order; call in chunk order, from one thread."""
        stats = self._stats
        records: list[LogRecord] = []
        for raw in chunk.data.split(b"\n"):
            if not raw.strip():
                continue
            self._seq += 1
            if len(raw) > MAX_JSON_LINE:
                stats.entries_too_long += 1
                self._warn_once("long", "dropping an entry of %d bytes (more than %d)", len(raw), MAX_JSON_LINE)
                continue
            try:
                entry = json.loads(raw)
            except ValueError:
                entry = None
            if not isinstance(entry, dict):
                stats.parse_errors += 1
                self._warn_once("json", "journalctl printed a line that is not a JSON object: %.200r", raw)
                continue
            message = _field_text(entry.get("MESSAGE"))
            message = message.strip() if message is not None else ""
            if not message:
                stats.empty_messages += 1
                continue
            if len(message) > MAX_ENTRY_MESSAGE:
                message = message[:MAX_ENTRY_MESSAGE]
                stats.messages_cut += 1
            records.append(
                LogRecord(
                    message=message,
                    timestamp=self._timestamp(entry, chunk.read_time),
                    seq=self._seq,
                    priority=_int_field(entry, "PRIORITY"),
                    facility=_int_field(entry, "SYSLOG_FACILITY"),
                    source=self._label,
                )
            )
        if records:
            stats.records_read += len(records)
            stats.last_record_time = records[-1].timestamp
        return records

    # -- the process -------------------------------------------------------------------------------

    def _start(self) -> Poll:
        binary, why = resolve(self._program, path=self._path)
        if binary is None:
            hint = NO_JOURNALCTL_HINT if self._program == "journalctl" else ""
            return self._failed(f"{self._program} {why}{hint}")
        if self._since is None:
            self._since = self._clock() - self._config.lookback
        argv = self.command(binary)
        env = {"PATH": self._path, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        try:
            proc = proctree.start(argv, env=env)  # known to the agent's reaper: never taken for an orphan
        except OSError as exc:
            return self._failed(f"cannot start {binary}: {exc.strerror or exc}")
        self._process = _Process(proc)
        self._pending = b""
        self._discard = False
        self._stats.connected = True
        self._log.info("journald: started %s", " ".join(argv))
        return Poll(chunk=None, wait=0.0)

    def _exited(self, process: _Process) -> Poll:
        code = process.finish(grace=EXIT_GRACE)
        self._process = None
        self._stats.connected = False
        detail = process.stderr.decode("utf-8", "replace").strip().splitlines()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        error = f"journalctl {how}" + (f": {detail[-1]}" if detail else "")
        if self._pending:
            self._log.warning("journald: dropping an unterminated last line of %d bytes", len(self._pending))
            self._pending = b""
        return self._failed(error)

    def _take(self, data: bytes) -> JournalChunk | None:
        """Complete output lines; a partial one stays pending, and one past MAX_JSON_LINE goes out whole
        so far (decode drops and counts it) while the rest of it is discarded."""
        if self._discard:
            newline = data.find(b"\n")
            if newline < 0:
                return None
            data = data[newline + 1 :]
            self._discard = False
        buf = self._pending + data if self._pending else data
        end = buf.rfind(b"\n") + 1
        lines, self._pending = buf[:end], buf[end:]
        if len(self._pending) > MAX_JSON_LINE:
            lines += self._pending + b"\n"
            self._pending = b""
            self._discard = True
        if not lines:
            return None
        last_start = lines.rfind(b"\n", 0, len(lines) - 1) + 1
        self._last_line = lines[last_start:-1]
        self._last_read = self._clock()
        return JournalChunk(data=lines, read_time=self._last_read)

    # -- bookkeeping -------------------------------------------------------------------------------

    def _timestamp(self, entry: dict[str, Any], read_time: float) -> float:
        usec = entry.get("__REALTIME_TIMESTAMP")
        if isinstance(usec, str) and usec.isascii() and usec.isdigit():
            return int(usec) / 1e6
        self._stats.timestamp_errors += 1
        return read_time

    def _failed(self, error: str) -> Poll:
        self._stats.read_errors += 1
        self._stats.reader_restarts += 1
        self._stats.last_error = error
        delay = self._backoff.next_delay()
        self._log.warning("journald: %s; retrying in %.3gs", error, delay)
        return Poll(chunk=None, wait=delay)

    def _alive(self) -> None:
        self._stats.last_activity = self._monotonic()
        self._stats.last_error = None

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        self._log.log(level, "journald %s: " + message, self._config.source, *args)
