"""The exit codes of every command: 0 success, 1 an unexpected failure, 2 bad configuration or
unusable input (always before anything touches the cluster)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
