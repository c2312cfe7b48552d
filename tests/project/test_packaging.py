"""The wheel holds every package of the agent: ``pip install .`` (the README's quick start, the image's
build) installs only the packages ``[tool.setuptools] packages`` lists, so a package missing there is an
agent that cannot start (``agent.app.wiring`` was missing once: ModuleNotFoundError at ``run``)."""

from __future__ import annotations

import tomllib

from helpers import REPO


def _listed() -> set[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(config["packages"])


def _in_tree() -> set[str]:
    agent = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "agent").rglob("__init__.py")}
    plugins = {
        "agent.builtin_plugins." + ".".join(p.parent.relative_to(REPO / "plugins").parts)
        for p in (REPO / "plugins").rglob("__init__.py")
        if "examples" not in p.parts
    }
    return agent | plugins | {"agent.builtin_plugins"}


def test_every_package_of_the_agent_is_in_the_wheel() -> None:
    assert _in_tree() - _listed() == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_the_wheel_lists_no_package_that_is_not_there() -> None:
    assert _listed() - _in_tree() == set()
