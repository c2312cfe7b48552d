"""A followed log file (node-problem-detector's ``plugin: filelog``) as a source of ``LogRecord``s.

Reading (:meth:`FileLogSource.chunks`, the producer thread, I/O only) follows the file like ``tail -F``:

- start: at the end of the file; with ``lookback`` the reader first goes back at most
  ``lookback_max_bytes`` and hands out that stretch marked as backlog: of it, only lines whose timestamp
  is within ``lookback`` of the start become records (node-problem-detector reads the whole file and drops
  lines timestamped before ``now - lookback``; the result is the same for the recent past it keeps);
- appends are read as they come; a partial last line is held until its newline, a line longer than
  ``MAX_LINE`` bytes is cut there (the rest, up to its newline, is dropped);
- at the end of the file the path is checked: another file there (rotation by rename, deletion and
  re-creation) means the old file is read to its end, then the new one from its start; a file smaller
  than the position read (copytruncate) is read again from its start;
- a missing file is waited for (``last_error`` says so), never fatal; a file that appears after the start
  is read from its start.

Decoding (:meth:`FileLogSource.decode`, the main loop) applies the ``pluginConfig`` of the monitor the way
node-problem-detector's translator does: ``skipList`` (substring) drops a line, the ``message`` regex
must match (the last capture group, or the whole match without groups, is the message; otherwise the line
is dropped and counted in ``parse_errors``), the ``timestamp`` regex and ``timestampFormat`` (a Go layout,
:mod:`agent.sources.golayout`) give the time. Unlike node-problem-detector, a line whose timestamp cannot be
read is kept with the time it was read (counted in ``timestamp_errors``): a log whose time format changed
must not go silent. Patterns are RE2 (Go syntax), searched unanchored as Go's ``FindStringSubmatch`` does.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import tzinfo

from agent.core.backoff import Backoff
from agent.core.patterns import MAX_MEMORY, Spans, compile_anchored, spans_function
from agent.core.regex import PatternError
from agent.core.types import LogRecord
from agent.sources.golayout import Layout, LayoutError, TimestampError, compile_layout
from agent.sources.kmsg.stats import KmsgStats
from agent.sources.polling import Poll, polled_chunks

_logger = logging.getLogger(__name__)

MAX_LINE = 64 * 1024  # bytes: a longer line is cut here
READ_SIZE = 64 * 1024
LOOKBACK_MAX_BYTES = 8 << 20  # how far back from the end the start-up lookback reads at most


@dataclass(frozen=True, kw_only=True, slots=True)
class FileLogConfig:
    """The validated settings of one ``plugin: filelog`` monitor.

    ``path`` = ``logPath``; ``timestamp_regex``/``message_regex``/``timestamp_format`` = ``pluginConfig``
    ``timestamp``/``message``/``timestampFormat``; ``lookback`` = ``lookback`` in seconds; ``skip_list`` =
    ``skipList``.
    """

    path: str
    timestamp_regex: str
    message_regex: str
    timestamp_format: str
    lookback: float = 0.0
    skip_list: tuple[str, ...] = ()


class FileLogConfigError(ValueError):
    """A ``pluginConfig`` value cannot be used; ``field`` names it (e.g. ``pluginConfig.message``)."""

    def __init__(self, *, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass
class FileLogStats(KmsgStats):
    """:class:`KmsgStats` plus what a log file adds. ``parse_errors`` = lines the message regex did not match.

    Written by the reader thread: ``read_errors``, ``reader_restarts``, ``rotations``, ``last_activity``,
    ``last_error``, ``connected``; by :meth:`FileLogSource.decode`: the rest.
    """

    rotations: int = 0  # the path named a new file (rename, re-creation) or the file was truncated
    lines_skipped: int = 0  # dropped by skipList
    lines_cut: int = 0  # longer than MAX_LINE
    timestamp_errors: int = 0  # kept with the read time: no timestamp found, or it did not fit the layout
    lines_before_lookback: int = 0  # start-up backlog lines older than lookback


@dataclass(frozen=True, slots=True)
class FileChunk:
    """Complete lines as read (each ends in ``\\n``), with what decoding them needs."""

    data: bytes
    read_time: float  # clock() when read: the time of lines without a readable timestamp
    cutoff: float | None = None  # backlog at start: lines timestamped before this are dropped
    cut_lines: int = 0  # lines the reader cut at MAX_LINE (counted when decoded)


# --------------------------------------------------------------------------------------------------
# Line parsing


@dataclass(frozen=True, slots=True)
class Search:
    """A filelog pattern searched unanchored in UTF-8 bytes, as Go's ``FindSubmatch`` does."""

    pattern: str
    groups: int  # capture groups in the pattern
    spans: Spans  # data -> (start, end) of the match and of each group, or None

    def last_group(self, data: bytes) -> bytes | None:
        """The last capture group of the first match (the whole match without groups; ``b""`` when that group
        took no part); None: no match. node-problem-detector's translator takes the last submatch too."""
        found = self.spans(data)
        if found is None:
            return None
        start, end = found[self.groups]
        return data[start:end] if start >= 0 else b""


def compile_search(pattern: str) -> Search:
    """Compile a filelog pattern; raises PatternError with the rule patterns' messages.

    The pattern first goes through :func:`agent.core.patterns.compile_anchored`, so RE2/Go syntax, ``\\C``
    and the program-size budget are checked exactly as for rule patterns; that module matches anchored at
    the end (rule semantics), so the unanchored search is compiled here with the same memory budget and
    searched with that module's fast span function.
    """
    compile_anchored(pattern)
    import re2  # google-re2, already loaded by agent.core.patterns

    options = re2.Options()
    options.max_mem = MAX_MEMORY
    options.log_errors = False
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as exc:  # compile_anchored accepted it, so this is not expected
        raise PatternError(f"invalid regular expression: {exc}") from exc
    return Search(pattern=pattern, groups=compiled.groups, spans=spans_function(compiled))


@dataclass(frozen=True, slots=True)
class LineParser:
    """The ``pluginConfig`` of a filelog monitor, compiled (:func:`compile_line_parser`); lines are UTF-8 bytes."""

    timestamp_regex: Search
    message_regex: Search
    layout: Layout
    skip_list: tuple[bytes, ...]

    def skipped(self, data: bytes) -> bool:
        return any(item in data for item in self.skip_list)

    def message(self, data: bytes) -> str | None:
        found = self.message_regex.last_group(data)
        return None if found is None else found.decode("utf-8", "replace")

    def timestamp_text(self, data: bytes) -> str | None:
        """The text the timestamp regex picks out of the line (None: no match)."""
        found = self.timestamp_regex.last_group(data)
        return None if found is None else found.decode("utf-8", "replace")

    def timestamp(self, data: bytes, *, now: float, tz: tzinfo | None) -> float:
        """Raises TimestampError when the line has no timestamp the layout can read."""
        text = self.timestamp_text(data)
        if text is None:
            raise TimestampError("the timestamp regex does not match")
        return self.layout.parse(text, now=now, tz=tz)


def compile_line_parser(config: FileLogConfig) -> LineParser:
    """Compile the patterns and layout of ``config``; raises FileLogConfigError naming the bad field."""
    searches: dict[str, Search] = {}
    for field, pattern in (("timestamp", config.timestamp_regex), ("message", config.message_regex)):
        if not pattern:
            raise FileLogConfigError(field=f"pluginConfig.{field}", message="must not be empty")
        try:
            searches[field] = compile_search(pattern)
        except PatternError as exc:
            raise FileLogConfigError(field=f"pluginConfig.{field}", message=str(exc)) from exc
    try:
        layout = compile_layout(config.timestamp_format)
    except LayoutError as exc:
        raise FileLogConfigError(field="pluginConfig.timestampFormat", message=str(exc)) from exc
    return LineParser(
        timestamp_regex=searches["timestamp"],
        message_regex=searches["message"],
        layout=layout,
        skip_list=tuple(item.encode() for item in config.skip_list if item),
    )


def utf8_line(raw: bytes) -> bytes:
    """The line as valid UTF-8 (what RE2 matches): itself, or with each bad byte replaced by U+FFFD."""
    if raw.isascii():
        return raw
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace").encode("utf-8")
    return raw


# --------------------------------------------------------------------------------------------------
# The source


@dataclass(slots=True)
class _OpenFile:
    fd: int
    identity: tuple[int, int]  # (st_dev, st_ino)
    position: int  # bytes read so far (the offset of the next read)


def _describe(exc: OSError) -> str:
    return f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None and exc.strerror else str(exc)


class FileLogSource:
    """Follow ``config.path`` and turn its lines into records (see the module docstring).

    Implements the producer ``Source`` protocol: ``stats``, ``chunks(stop=...)`` (reader thread),
    ``decode(chunk)`` (main loop, in chunk order). :meth:`poll_once` is one step of ``chunks``.

    ``clock`` (wall seconds) gives read times, the lookback cutoff and the year of year-less timestamps;
    ``monotonic`` feeds ``stats.last_activity``; ``sleep`` waits between polls and in backoff (default:
    ``stop.wait``); ``tz`` is the zone of timestamps without one (None: the local zone). A bad
    ``config`` raises FileLogConfigError.
    """

    def __init__(
        self,
        *,
        config: FileLogConfig,
        stats: FileLogStats | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        tz: tzinfo | None = None,
        poll_interval: float = 0.5,
        backoff_max: float = 10.0,
        lookback_max_bytes: int = LOOKBACK_MAX_BYTES,
        logger: logging.Logger | None = None,
    ) -> None:
        if poll_interval <= 0 or backoff_max < poll_interval or lookback_max_bytes < 0:
            raise ValueError("need 0 < poll_interval <= backoff_max and lookback_max_bytes >= 0")
        self._config = config
        self._parser = compile_line_parser(config)
        self._path = config.path
        self._label = f"filelog:{config.path}"
        self._stats = stats if stats is not None else FileLogStats()
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._tz = tz
        self._poll_interval = poll_interval
        self._lookback_max_bytes = lookback_max_bytes
        self._log = logger if logger is not None else _logger
        self._backoff = Backoff(initial=poll_interval, maximum=backoff_max)
        # reader state
        self._file: _OpenFile | None = None
        self._first_open = True  # the file present at start (even if unreadable at first) is tailed from its end
        self._pending = b""  # a partial last line
        self._discard = False  # drop bytes up to the next newline (rest of a cut line, or before the start)
        self._draining = False  # the path names another file: read this one to its end, then switch
        self._resume: tuple[tuple[int, int], int] | None = None  # (identity, position) after a read error
        self._backlog_end: int | None = None  # position up to which reads are start-up backlog
        self._cutoff: float | None = None
        # decoder state
        self._seq = 0
        self._in_window = False  # backlog: whether the last timestamped line was within lookback
        self._last_timestamp: tuple[tuple[str, float] | None, float | str] = (None, 0.0)
        self._warned: set[str] = set()

    # -- public ------------------------------------------------------------------------------------

    @property
    def stats(self) -> FileLogStats:
        return self._stats

    @property
    def config(self) -> FileLogConfig:
        return self._config

    def chunks(self, *, stop: threading.Event) -> Iterator[FileChunk]:
        """Yield chunks of complete lines until ``stop`` is set; the file is closed when this ends."""
        return polled_chunks(poll_once=self.poll_once, close=self.close, stop=stop, sleep=self._sleep)

    def poll_once(self) -> Poll:
        """One step: open the file, or read once, or look at the path at the end of the file."""
        if self._file is None:
            return self._open()
        opened = self._file
        before = opened.position
        try:
            data = os.read(opened.fd, READ_SIZE)
        except OSError as exc:
            self._resume = (opened.identity, before)
            return self._failed(f"cannot read {self._path}: {_describe(exc)}")
        self._alive()
        if data:
            opened.position += len(data)
            return Poll(chunk=self._take(data, start=before), wait=0.0)
        return self._at_end(opened)

    def close(self) -> None:
        """Close the file (the next poll reopens the path)."""
        if self._file is not None:
            os.close(self._file.fd)
            self._file = None
        self._stats.connected = False

    def decode(self, chunk: FileChunk) -> list[LogRecord]:
        """The records of a chunk's lines, in order; call in chunk order, from one thread."""
        stats, parser = self._stats, self._parser
        stats.lines_cut += chunk.cut_lines
        records: list[LogRecord] = []
        for raw in chunk.data.split(b"\n")[:-1]:
            self._seq += 1
            if len(raw) > MAX_LINE:
                raw = raw[:MAX_LINE]
                stats.lines_cut += 1
            line = utf8_line(raw)
            if parser.skip_list and parser.skipped(line):
                stats.lines_skipped += 1
                continue
            message = parser.message(line)
            if message is None:
                stats.parse_errors += 1
                self._warn_once("message", "the message regex does not match line %d: %.200r", self._seq, line)
                continue
            parsed = self._timestamp(parser.timestamp_text(line), now=chunk.read_time)
            timestamp: float | None = None
            if isinstance(parsed, str):
                stats.timestamp_errors += 1
                self._warn_once("timestamp", "no readable timestamp in line %d (%s): %.200r", self._seq, parsed, line)
            else:
                timestamp = parsed
            if chunk.cutoff is not None:
                if timestamp is not None:
                    self._in_window = timestamp >= chunk.cutoff
                if not self._in_window:  # a line without a timestamp goes with the line before it
                    stats.lines_before_lookback += 1
                    continue
            records.append(
                LogRecord(
                    message=message,
                    timestamp=chunk.read_time if timestamp is None else timestamp,
                    seq=self._seq,
                    source=self._label,
                )
            )
        if records:
            stats.records_read += len(records)
            stats.last_record_time = records[-1].timestamp
        return records

    def _timestamp(self, text: str | None, *, now: float) -> float | str:
        """Seconds for a timestamp text, or why there are none; lines of one second share the result."""
        if text is None:
            return "the timestamp regex does not match"
        key = (text, now)
        if key != self._last_timestamp[0]:
            try:
                value: float | str = self._parser.layout.parse(text, now=now, tz=self._tz)
            except TimestampError as exc:
                value = str(exc)
            self._last_timestamp = (key, value)
        return self._last_timestamp[1]

    # -- reading -----------------------------------------------------------------------------------

    def _open(self) -> Poll:
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._first_open = False  # what appears later is new: read it from its start
            self._resume = None
            self._stats.connected = False
            self._stats.last_error = f"waiting for {self._path}: no such file"
            return Poll(chunk=None, wait=self._backoff.next_delay())
        except OSError as exc:
            return self._failed(f"cannot open {self._path}: {_describe(exc)}")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                return self._failed(f"cannot follow {self._path}: not a regular file")
            identity = (st.st_dev, st.st_ino)
            position = self._start_position(first=self._first_open, identity=identity, size=st.st_size)
            os.lseek(fd, position, os.SEEK_SET)
        except OSError as exc:
            os.close(fd)
            return self._failed(f"cannot open {self._path}: {_describe(exc)}")
        self._file = _OpenFile(fd=fd, identity=identity, position=position)
        self._first_open = False
        self._stats.connected = True
        self._backoff.reset()
        return Poll(chunk=None, wait=0.0)

    def _start_position(self, *, first: bool, identity: tuple[int, int], size: int) -> int:
        resume, self._resume = self._resume, None
        if first:
            position = size
            lookback = self._config.lookback
            if lookback > 0:
                self._cutoff = self._clock() - lookback
                self._backlog_end = size
                position = max(0, size - self._lookback_max_bytes)
            if position > 0:  # start after the newline before it: never in the middle of a line
                self._discard = True
                position -= 1
            return position
        if resume is not None and resume[0] == identity and resume[1] <= size:
            return resume[1]  # the same file after a read error: go on where it stopped
        self._pending = b""
        self._discard = False
        return 0

    def _take(self, data: bytes, *, start: int) -> FileChunk | None:
        """Complete lines of what was read; a partial last line stays pending (cut at MAX_LINE)."""
        if self._discard:
            newline = data.find(b"\n")
            if newline < 0:
                return None
            data = data[newline + 1 :]
            self._discard = False
        buf = self._pending + data if self._pending else data
        end = buf.rfind(b"\n") + 1
        lines, rest = buf[:end], buf[end:]
        cut = 0
        if len(rest) > MAX_LINE:
            lines += rest[:MAX_LINE] + b"\n"
            rest = b""
            cut = 1
            self._discard = True
        self._pending = rest
        return self._chunk(lines, start=start, cut=cut) if lines else None

    def _chunk(self, lines: bytes, *, start: int, cut: int = 0) -> FileChunk:
        cutoff = None
        if self._backlog_end is not None:
            if start < self._backlog_end:
                cutoff = self._cutoff
            else:
                self._backlog_end = None
        return FileChunk(data=lines, read_time=self._clock(), cutoff=cutoff, cut_lines=cut)

    def _at_end(self, opened: _OpenFile) -> Poll:
        """End of the file: wait for more, or move on to the file now at the path."""
        change = self._path_change(opened)
        if change is None:
            return Poll(chunk=None, wait=self._poll_interval)
        if change == "truncated":
            self._log.info("filelog: %s was truncated; reading it from its start", self._path)
            self._stats.rotations += 1
            os.lseek(opened.fd, 0, os.SEEK_SET)
            opened.position = 0
            self._pending = b""
            self._discard = False
            self._backlog_end = None
            return Poll(chunk=None, wait=0.0)
        if not self._draining:
            self._draining = True  # read once more: what the writer added to the old file meanwhile
            return Poll(chunk=None, wait=0.0)
        self._log.info("filelog: %s %s; reading the new file from its start", self._path, change)
        chunk = None
        if self._pending and not self._discard:  # the old file's last line will not get its newline now
            chunk = self._chunk(self._pending + b"\n", start=opened.position)
        self._pending = b""
        self._discard = False
        self._draining = False
        self._backlog_end = None
        self._stats.rotations += 1
        self.close()
        return Poll(chunk=chunk, wait=0.0)

    def _path_change(self, opened: _OpenFile) -> str | None:
        """None, ``"truncated"``, ``"was replaced"`` (another file there) or ``"was removed"``."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return "was removed"
        except OSError:
            return None  # cannot tell: keep reading the open file
        if (st.st_dev, st.st_ino) != opened.identity:
            return "was replaced"
        if st.st_size < opened.position:
            return "truncated"
        return None

    # -- bookkeeping -------------------------------------------------------------------------------

    def _failed(self, error: str) -> Poll:
        self.close()
        self._draining = False
        self._stats.read_errors += 1
        self._stats.reader_restarts += 1
        self._stats.last_error = error
        delay = self._backoff.next_delay()
        self._log.warning("filelog: %s; retrying in %.3gs", self._stats.last_error, delay)
        return Poll(chunk=None, wait=delay)

    def _alive(self) -> None:
        self._stats.last_activity = self._monotonic()
        self._stats.last_error = None

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        """Log the first line of each kind of trouble as a warning, the rest at debug level (floods)."""
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        self._log.log(level, "filelog %s: " + message, self._path, *args)
