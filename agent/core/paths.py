"""Where the agent finds what ships with it."""

from __future__ import annotations

from pathlib import Path


def builtin_plugins_dir() -> Path:
    """Where the built-in rule packs live: inside the installed package, or ``plugins/`` of a checkout."""
    here = Path(__file__).resolve().parent.parent  # agent/
    for candidate in (here / "builtin_plugins", here.parent / "plugins"):
        if candidate.is_dir():
            return candidate
    return here / "builtin_plugins"
