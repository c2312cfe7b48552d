"""A check that runs an executable: node-problem-detector's custom-plugin exit-code protocol.

Exit code ``0`` is OK, ``1`` is PROBLEM; anything else (``2``, ``137``, a signal, a program that
could not start or ran past its timeout) is UNKNOWN: the agent could not tell, which is the
agent's trouble, never the node's. The trimmed stdout, cut to ``max_output_length`` bytes (at most
``MAX_OUTPUT_LENGTH``, 4 KiB: only the first 4 KiB of stdout are kept, whatever the program prints), is
the message. The program runs through :func:`agent.core.process.run_process`: no shell, a scrubbed
environment, its own process group killed at the timeout, output read with a bound.

One execution can feed several verdicts (:class:`Verdict`): an NPD plugin file often has a
temporary rule (an Event on every failing run) and a permanent rule (a condition) calling the same
script; it runs once and both verdicts read the same outcome.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.checks.model import CANNOT_START, CheckResult, CheckStatus, ProcessResult, RunProcess
from agent.core.process import DEFAULT_PATH, run_process
from agent.core.types import ConditionSpec, Severity

DEFAULT_MAX_OUTPUT_LENGTH = 80  # bytes of trimmed stdout kept as the message (NPD's default)
READ_LIMIT = 4096  # bytes of stdout kept before trimming (NPD reads 4 KiB too); the rest is read and dropped
MAX_OUTPUT_LENGTH = READ_LIMIT  # the largest max_output_length: no more than what is kept can be the message
UNKNOWN_REASON = "CheckUnknown"  # reason of an UNKNOWN result: the check could not tell
# (CANNOT_START instead when the program could not be started at all: missing, not executable)


@dataclass(frozen=True, kw_only=True, slots=True)
class Execution:
    """How one run went, in protocol terms: the status, the message and the raw process result."""

    status: CheckStatus
    message: str  # OK/PROBLEM: the trimmed, cut stdout ("" when it printed nothing); UNKNOWN: why
    process: ProcessResult


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """How an :class:`Execution` becomes one :class:`CheckResult` (one NPD rule).

    ``condition`` None makes a warning (NPD temporary rule). ``ok_reason``/``ok_message`` are what an
    OK run reports (a condition's healthy defaults); an empty ``ok_message`` means "the output".
    """

    condition: str | None
    problem_reason: str
    ok_reason: str
    ok_message: str = ""
    severity: Severity = Severity.ERROR
    repeat_event: bool = False

    def result(self, execution: Execution, *, label: str) -> CheckResult:
        status = execution.status
        if status is CheckStatus.OK:
            reason = self.ok_reason
            message = self.ok_message or execution.message or f"{label}: ok (exit code 0)"
        elif status is CheckStatus.PROBLEM:
            reason = self.problem_reason
            message = execution.message or f"{label}: exit code 1 (a problem, without a message)"
        else:
            reason = CANNOT_START if execution.process.cannot_start else UNKNOWN_REASON
            message = execution.message
        return CheckResult(
            status=status,
            condition=self.condition,
            reason=reason,
            message=message,
            severity=self.severity,
            repeat_event=self.repeat_event,
        )


_CONTROL = {c: "\ufffd" for c in (*range(0x20), 0x7F) if chr(c) not in "\t\n\r\v\f"}


def cut_output(text: str, *, limit: int) -> str:
    """NPD's message: whitespace trimmed, then cut to ``limit`` UTF-8 bytes (never inside a character).

    Lines are joined with ``"; "`` first, so the message stays one line; other control characters
    (a NUL from binary output) become U+FFFD, as undecodable bytes already are.
    """
    lines = [line.strip() for line in text.translate(_CONTROL).strip().splitlines()]
    joined = "; ".join(line for line in lines if line)
    data = joined.encode("utf-8")
    if len(data) <= limit:
        return joined
    return data[:limit].decode("utf-8", errors="ignore").rstrip()


_SIGNAL_NAMES = {int(s): s.name for s in signal.Signals if s.name.startswith("SIG") and "_" not in s.name}


def unknown_message(result: ProcessResult, *, label: str, output: str) -> str:
    """Why a run says nothing about the node, named after ``label`` (the program's file name)."""
    code = result.exit_code
    if result.error is not None or result.timed_out or code is None or code < 0:
        return dataclasses.replace(result, argv=(label,)).describe()
    text = f"{label}: exit code {code}"
    signal_name = _SIGNAL_NAMES.get(code - 128)
    if signal_name is not None:
        text += f" (128+{code - 128}: something it ran was killed by {signal_name}?)"
    detail = output or cut_output((result.stderr.strip().splitlines() or [""])[-1], limit=200)
    return text + (f": {detail}" if detail else "")


def interpret(result: ProcessResult, *, max_output_length: int) -> Execution:
    """Map a process result to the protocol: exit 0 OK, 1 PROBLEM, anything else UNKNOWN."""
    label = os.path.basename(result.argv[0]) if result.argv else "?"
    output = cut_output(result.stdout, limit=max_output_length)
    if result.error is None and not result.timed_out and result.exit_code in (0, 1):
        status = CheckStatus.OK if result.exit_code == 0 else CheckStatus.PROBLEM
        return Execution(status=status, message=output, process=result)
    message = unknown_message(result, label=label, output=output)
    return Execution(status=CheckStatus.UNKNOWN, message=message, process=result)


class ExecutableCheck:
    """Runs ``argv`` every ``interval`` seconds (at most ``timeout`` seconds) and returns one result per verdict.

    ``cwd`` is the working directory of the program (NPD runs plugins in its own, ``/``);
    ``tool_path`` the ``PATH`` it gets; ``run_process`` replaces the process runner in unit tests.
    """

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        interval: float,
        timeout: float,
        verdicts: Sequence[Verdict],
        conditions: Sequence[ConditionSpec] = (),
        max_output_length: int = DEFAULT_MAX_OUTPUT_LENGTH,
        cwd: Path | None = None,
        tool_path: str = DEFAULT_PATH,
        run_process: RunProcess | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv must name a program")
        if not verdicts:
            raise ValueError("an executable check needs at least one verdict")
        if isinstance(max_output_length, bool) or not 1 <= max_output_length <= MAX_OUTPUT_LENGTH:
            raise ValueError(
                f"max_output_length must be from 1 to {MAX_OUTPUT_LENGTH} bytes, got {max_output_length!r}"
            )
        self.name = name
        self.argv = tuple(str(a) for a in argv)
        self.interval = interval
        self.timeout = timeout
        self.verdicts = tuple(verdicts)
        self.conditions = tuple(conditions)
        self.max_output_length = max_output_length
        self.cwd = cwd
        self.tool_path = tool_path
        self._run_process = run_process
        self.label = os.path.basename(self.argv[0]) or self.argv[0]

    def execute(self) -> Execution:
        """Run the program once and interpret its exit status and output."""
        runner = self._run_process or run_process
        kwargs: dict[str, Any] = {"cwd": str(self.cwd)} if self.cwd is not None else {}
        result = runner(
            self.argv,
            timeout=self.timeout,
            max_output=READ_LIMIT,
            path=self.tool_path,
            **kwargs,
        )
        return interpret(result, max_output_length=self.max_output_length)

    def run(self) -> list[CheckResult]:
        execution = self.execute()
        return [verdict.result(execution, label=self.label) for verdict in self.verdicts]

    def __repr__(self) -> str:
        return f"ExecutableCheck(name={self.name!r}, argv={self.argv!r})"
