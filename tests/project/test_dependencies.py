"""Runtime dependencies are exactly what the agent imports (each unused one comes back with its user)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib

from helpers import REPO

ROOT = REPO
# Distribution name -> the module it provides, where they differ.
MODULE_OF = {
    "prometheus-client": "prometheus_client",
    "pyyaml": "yaml",
    "google-re2": "re2",
    "nvidia-ml-py": "pynvml",
    "grpcio": "grpc",
}
# Pinned for resolution only (kubernetes needs it, and botocore, under boto3, needs it below 3).
PINS_ONLY = {"python-dateutil"}


def _import_module_call(node: ast.AST) -> str:
    """The module named by ``importlib.import_module("x.y")`` or ``import_module(f"x.{part}")`` (its literal
    head), else "": agent/adapters/kube.py imports the client's modules by name."""
    if not (isinstance(node, ast.Call) and node.args):
        return ""
    func = node.func
    if not (
        (isinstance(func, ast.Attribute) and func.attr == "import_module")
        or (isinstance(func, ast.Name) and func.id == "import_module")
    ):
        return ""
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return ""


def third_party_imports() -> set[str]:
    found: set[str] = set()
    built_in = [p for p in (ROOT / "plugins").rglob("*.py") if "examples" not in p.parts]
    for path in [*(ROOT / "agent").rglob("*.py"), *built_in]:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif _import_module_call(node):
                names = [_import_module_call(node)]
            for name in names:
                top = name.split(".")[0]
                # a generator script's helper beside it, or the print-site generators' shared one
                sibling = (path.parent / f"{top}.py").exists() or (ROOT / "plugins" / "kernel" / f"{top}.py").exists()
                if top != "agent" and top not in sys.stdlib_module_names and not sibling:
                    found.add(top)
    return found


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    return {MODULE_OF.get(n, n.replace("-", "_")) for n in names - PINS_ONLY}


def test_runtime_dependencies_are_exactly_the_imports():
    assert declared() == third_party_imports()
