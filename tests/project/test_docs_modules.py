"""docs/modules.md names every module of agent/: a module added without a row fails here, naming it.

A row names a module by its path (`agent/app/cli.py`), by its name beside another of its folder
(`agent/app/cli.py`, `settings.py`), or by its package folder (`agent/sources/kmsg/`).
"""

from __future__ import annotations

import re

from helpers import REPO

MODULES = REPO / "docs" / "modules.md"
AGENT = REPO / "agent"


def _listed(text: str, path: str) -> bool:
    folder, _, name = path.rpartition("/")
    for line in text.splitlines():
        if not line.startswith("| `agent/"):
            continue
        cell = line.split("|")[1]
        if f"`{path}`" in cell or f"`{folder}/`" in cell:
            return True
        if re.search(rf"`{re.escape(folder)}/\w+\.py`", cell) and f"`{name}`" in cell:
            return True
    return False


def test_every_module_of_agent_has_a_row() -> None:
    text = MODULES.read_text(encoding="utf-8")
    paths = sorted(p.relative_to(REPO).as_posix() for p in AGENT.rglob("*.py") if p.name != "__init__.py")
    missing = [path for path in paths if not _listed(text, path)]
    assert paths and not missing, f"modules with no row in docs/modules.md: {missing}"
