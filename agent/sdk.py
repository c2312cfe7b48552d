"""The plugin API: everything a check plugin may import from node-health-agent, in one place.

A Python check (a class found through the ``node_health_agent.checks`` entry point group, or a
``use:`` module under ``plugins/``) imports only this module::

    from agent.sdk import Check, CheckContext, CheckResult, CheckStatus, ConditionSpec, Value

What is here is the contract (see plugins/README.md); everything else in ``agent`` may move between
releases. The older paths ``agent.types`` and ``agent.checks.model`` still work for plugins written
against them (``agent.types`` warns that it is deprecated).
"""

from __future__ import annotations

from agent.checks.model import (
    ENTRY_POINT_GROUP,
    Check,
    CheckConfigError,
    CheckContext,
    CheckResult,
    CheckStatus,
    Value,
)
from agent.checks.verdicts import tool_trouble, unknown
from agent.core.durations import format_duration, parse_duration
from agent.core.process import ProcessResult
from agent.core.statedir import atomic_write
from agent.core.types import ConditionSpec, Severity

__all__ = [
    "ENTRY_POINT_GROUP",
    "Check",
    "CheckConfigError",
    "CheckContext",
    "CheckResult",
    "CheckStatus",
    "ConditionSpec",
    "ProcessResult",
    "Severity",
    "Value",
    "atomic_write",
    "format_duration",
    "parse_duration",
    "tool_trouble",
    "unknown",
]
