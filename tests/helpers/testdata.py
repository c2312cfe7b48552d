"""Access to ../shared/testdata (real published lines and tool outputs), read in place.

Tests using it skip with a clear reason where the folder is absent; nothing is copied.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TESTDATA = Path(__file__).resolve().parents[3] / "shared" / "testdata"


def require_testdata() -> Path:
    if not TESTDATA.is_dir():
        pytest.skip(f"shared test data not found at {TESTDATA}")
    return TESTDATA


def kernel_lines() -> list[dict]:
    path = TESTDATA / "kernel-lines.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tool_output(name: str) -> str:
    """The body of a recorded tool output (the ``# `` header up to the ``---8<---`` line removed)."""
    text = (require_testdata() / "tool-outputs" / name).read_text()
    marker = text.index("---8<---")
    return text[text.index("\n", marker) + 1 :]
