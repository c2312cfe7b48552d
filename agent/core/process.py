"""Running an external program for a check: no shell, scrubbed environment, own process group.

- The program is looked up in ``path`` (never in the agent's own ``PATH``) unless given with a
  ``/``; it runs with only ``PATH``, ``LANG`` and ``LC_ALL`` set (plus what the caller adds, and
  ``NODE_HEALTH_AGENT_RUN``, the mark of this run).
- It gets a new session, so it and everything it starts share one process group; at the timeout
  the whole group is killed with SIGKILL. When the program exits, what it left behind is killed
  too (a plugin's background child must not outlive it or hold its output open), including what
  left the group with ``setsid``: see :mod:`agent.core.proctree` (the agent is the child
  subreaper of its runs; their leftovers are found by ancestry and by the run's mark, killed,
  and reaped).
- Output is read as it comes and kept up to ``max_output`` bytes (at most ``OUTPUT_MAX``, 1 MiB,
  whatever the caller asks; stderr up to 4 KiB); the rest is read, one ``READ_SIZE`` chunk at a
  time, and dropped, so a program printing 100 MB neither blocks nor costs more than what is kept
  plus one chunk.
- Nothing here raises for the program's sake: a missing or non-executable program, or one the
  kernel refuses to start, comes back as :class:`ProcessResult` with ``error`` set.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Literal

from agent.core import proctree


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessResult:
    """How one run of an external program went (see :func:`agent.core.process.run_process`).

    ``error`` is set when it could not start (``no such file``, ``permission denied``), or when it was
    ``cancelled`` (the agent is stopping); ``timed_out`` when it was killed (with everything it
    started) at the timeout. ``exit_code``
    is the exit status, or ``-N`` when a signal N ended it, or None when it never started.
    ``stdout``/``stderr`` are decoded (UTF-8, bad bytes replaced) and cut to the requested size.
    """

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    error: str | None = None
    stdout_truncated: bool = False
    duration: float = 0.0
    cancelled: bool = False

    @property
    def cannot_start(self) -> bool:
        """The program could not be started at all (missing, not executable, refused by the kernel)."""
        return self.error is not None and not self.cancelled

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and self.exit_code == 0

    def describe(self) -> str:
        """Why it did not succeed, in a few words (for UNKNOWN messages)."""
        name = self.argv[0] if self.argv else "?"
        if self.error is not None:
            return f"{name}: {self.error}"
        if self.timed_out:
            return f"{name}: timed out after {self.duration:.1f}s (killed)"
        if self.exit_code is not None and self.exit_code < 0:
            return f"{name}: killed by signal {-self.exit_code}"
        detail = (self.stderr or self.stdout).strip().splitlines()
        return f"{name}: exit code {self.exit_code}" + (f": {detail[-1][:200]}" if detail else "")


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STDERR_MAX = 4096
OUTPUT_MAX = 1 << 20  # bytes of stdout kept, at most, whatever ``max_output`` asks
READ_SIZE = 65536  # bytes read at once: the most held beyond what is kept
EXIT_GRACE = 0.2  # after the program exits, how long its output may still drain


def resolve(program: str, *, path: str) -> tuple[str | None, str | None]:
    """(absolute path, None) or (None, why it cannot run)."""
    if "/" in program:
        if not os.path.exists(program):
            return None, "no such file"
        if os.path.isdir(program):
            return None, "is a directory"
        if not os.access(program, os.X_OK):
            return None, "not executable (permission denied)"
        return program, None
    found = shutil.which(program, path=path)
    if found is None:
        return None, f"not found in PATH ({path})"
    return found, None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (its pid still names the process group)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def run_process(
    argv: Sequence[str],
    *,
    timeout: float,
    max_output: int = 4096,
    path: str = DEFAULT_PATH,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    cancel: threading.Event | None = None,
) -> ProcessResult:
    """Run ``argv`` to completion or ``timeout`` seconds; never raises for the program's behaviour.

    ``cancel`` set (the agent is stopping) ends the run at once, killing the process group: no
    plugin outlives the agent."""
    args = tuple(str(a) for a in argv)
    program, why = _program(args, path=path, cwd=cwd)
    if program is None:
        return ProcessResult(argv=args, exit_code=None, error=why)
    environment = {"PATH": path, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", **(env or {})}
    max_output = min(max(0, max_output), OUTPUT_MAX)
    proctree.become_subreaper()
    mark = proctree.new_mark()
    start = time.monotonic()
    try:
        proc = proctree.start([program, *args[1:]], env=environment, cwd=cwd, mark=mark)
    except OSError as exc:
        reason = "exec format error (a script without #! line?)" if exc.errno == errno.ENOEXEC else exc.strerror
        return ProcessResult(argv=args, exit_code=None, error=f"cannot start: {reason or exc}")
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes (Popen above)
    with selectors.DefaultSelector() as sel:
        output = _Output(sel, stdout=proc.stdout, stderr=proc.stderr, max_output=max_output)
        ending = _wait_for_end(proc.pid, output, deadline=start + timeout, cancel=cancel)
    code = _reap(proc, mark)
    timed_out, cancelled = ending == "timed out", ending == "cancelled"
    return ProcessResult(
        argv=args,
        exit_code=None if timed_out or cancelled else code,
        error="cancelled: the agent is stopping (process group killed)" if cancelled else None,
        cancelled=cancelled,
        stdout=output.out.decode("utf-8", errors="replace"),
        stderr=output.err.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        stdout_truncated=output.truncated,
        duration=time.monotonic() - start,
    )


def _program(args: tuple[str, ...], *, path: str, cwd: str | None) -> tuple[str | None, str | None]:
    """(the program to run, None) or (None, why ``args`` cannot run in ``cwd``)."""
    if not args:
        return None, "empty command"
    if cwd is not None and not os.path.isdir(cwd):
        return None, f"working directory {cwd} does not exist"
    return resolve(args[0] if cwd is None or "/" not in args[0] else os.path.join(cwd, args[0]), path=path)


class _Output:
    """A run's stdout and stderr, read as they come: each kept up to its cap, the rest read and dropped."""

    def __init__(self, sel: selectors.BaseSelector, *, stdout: IO[bytes], stderr: IO[bytes], max_output: int) -> None:
        self.out, self.err = bytearray(), bytearray()
        self.truncated = False  # stdout said more than max_output
        self._sel = sel
        self._stdout = stdout
        self._limits: dict[object, tuple[bytearray, int]] = {
            stdout: (self.out, max_output),
            stderr: (self.err, STDERR_MAX),
        }
        for pipe in (stdout, stderr):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ)

    def open(self) -> bool:
        """Some pipe is still open (not yet at end of file)."""
        return bool(self._sel.get_map())

    def read(self, wait: float) -> None:
        """Read what is ready within ``wait`` seconds, one chunk per pipe; a pipe at end of file is dropped."""
        for key, _ in self._sel.select(timeout=wait):
            try:
                chunk = os.read(key.fd, READ_SIZE)
            except BlockingIOError:
                continue
            if not chunk:
                self._sel.unregister(key.fileobj)
                continue
            buf, cap = self._limits[key.fileobj]
            room = cap - len(buf)
            if room > 0:
                buf += chunk[:room]
            if len(chunk) > room and key.fileobj is self._stdout:
                self.truncated = True


def _wait_for_end(
    pid: int, output: _Output, *, deadline: float, cancel: threading.Event | None
) -> Literal["exited", "timed out", "cancelled"]:
    """Read ``output`` until the program has exited and its pipes are drained (or ``EXIT_GRACE`` passed)."""
    exited_at: float | None = None
    while output.open():
        now = time.monotonic()
        if now >= deadline:
            return "timed out"
        if cancel is not None and cancel.is_set():
            return "cancelled"
        if exited_at is None and _exited(pid):
            exited_at = now
        if exited_at is not None and now - exited_at >= EXIT_GRACE:
            return "exited"  # the program is gone; whatever still holds its pipes is killed by _reap
        output.read(min(deadline - now, 0.05 if exited_at is None else EXIT_GRACE))
    if exited_at is None:
        # Both pipes closed: wait for the exit itself, still bounded by the deadline.
        while not _exited(pid):
            if time.monotonic() >= deadline:
                return "timed out"
            time.sleep(0.01)
    return "exited"


def _reap(proc: subprocess.Popen[bytes], mark: str) -> int:
    """Kill what is left of the run, reap it and close its pipes; the program's exit status."""
    # On timeout: everything; otherwise: whatever the program left behind, in its group or not.
    killed = proctree.kill_leftovers(proc.pid, mark)
    _kill_group(proc.pid)
    code = proctree.wait(proc)
    proctree.settle(killed)  # reap the leftovers the agent adopted (and any other orphan that exited)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return code
