"""Verdicts an active check shares with every other: UNKNOWN for the agent's own trouble running a tool.

A tool that is absent, cannot start, timed out, was killed or cancelled says nothing about the device:
the run is UNKNOWN with a reason that names which (never a pass, never a fail). Plugins get these
through :mod:`agent.sdk`."""

from __future__ import annotations

from agent.checks.model import CheckResult, CheckStatus
from agent.core.process import ProcessResult


def unknown(reason: str, message: str, devices: tuple[str, ...] = ()) -> CheckResult:
    """An UNKNOWN verdict of an active check (no condition: it is a validation record)."""
    return CheckResult(status=CheckStatus.UNKNOWN, condition=None, reason=reason, message=message, devices=devices)


def tool_trouble(result: ProcessResult) -> CheckResult | None:
    """The UNKNOWN for a run that gave nothing to read (None: it ran to the end): reason ``Cancelled``,
    ``ToolMissing``, ``ToolCannotStart``, ``Timeout`` or ``ToolKilled``."""
    name = result.argv[0] if result.argv else "tool"
    if result.cancelled:
        return unknown("Cancelled", f"{name} was cancelled (the agent is stopping)")
    if result.error is not None:
        missing = result.error.startswith("not found") or result.error == "no such file"
        return unknown("ToolMissing" if missing else "ToolCannotStart", result.describe())
    if result.timed_out:
        return unknown("Timeout", result.describe())
    if result.exit_code is not None and result.exit_code < 0:
        return unknown("ToolKilled", result.describe())
    return None
