"""Deprecated: the old home of the plugin vocabulary. Import from :mod:`agent.sdk` instead.

Plugins written before the layout of 0.2 import ``ConditionSpec`` and ``Severity`` from here; this
re-export keeps them working and warns once. It will be removed in a later release.
"""

from __future__ import annotations

import warnings

from agent.core.types import ConditionSpec, Severity, Status

warnings.warn(
    "agent.types is deprecated: import ConditionSpec and Severity from agent.sdk",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["ConditionSpec", "Severity", "Status"]
