"""Importing the built-in checks that live under ``plugins/<domain>/``.

Installed, ``plugins/`` is the package ``agent.builtin_plugins`` (see pyproject). In a source
checkout there is no such directory under ``agent/``, so the package is made here, explicitly,
with ``plugins/`` as its one search location. ``plugins`` itself is never importable.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

from agent.core.paths import builtin_plugins_dir

PACKAGE = "agent.builtin_plugins"


def _ensure_package() -> None:
    if PACKAGE in sys.modules:
        return
    if importlib.util.find_spec(PACKAGE) is not None:
        return
    spec = importlib.machinery.ModuleSpec(PACKAGE, loader=None, is_package=True)
    spec.submodule_search_locations = [str(builtin_plugins_dir())]
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module


def import_builtin(name: str) -> ModuleType:
    """``import_builtin("nvidia.checks")`` → the module ``plugins/nvidia/checks.py``."""
    _ensure_package()
    return importlib.import_module(f"{PACKAGE}.{name}")
