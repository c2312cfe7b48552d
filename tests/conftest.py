"""What every test module shares: the fixtures that start servers, and the ``slow`` marker.

Fixtures: ``moto_server`` (moto's server, one per session) and ``aws`` (a fresh account on it per
test, :mod:`helpers.aws`); ``api`` (the test API server holding the walkthrough's cluster,
:mod:`helpers.agents`; a module may define its own ``api``). Tools the tests share live in the
``helpers`` package, never in another test module.

``pytest -m "not slow"`` runs the fast lane (the README gives its time): everything but the modules
that mark themselves ``pytestmark = pytest.mark.slow`` (with the reason beside it). They start agent
processes, drive the test API server or moto's server through many scenarios, render with Helm and
kubectl, build packages, or run the linters, or are the exhaustive rule tables
tests/plugins/test_rules_* (the fast lane keeps every rule's recorded example,
tests/detectors/test_builtin_rules.py). The README's test command (and CI) runs everything; the fast
lane is for the edit-test loop.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.agents import walkthrough_api
from helpers.aws import aws_fixture, moto_server_fixture
from kubeapi import KubeApiServer

__all__ = ["aws_fixture", "moto_server_fixture"]  # fixtures: aws, moto_server


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    """The test API server with the walkthrough's cluster: the agent's namespace and three other nodes."""
    with walkthrough_api() as server:
        yield server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``early`` first, in their order, then the rest in theirs: with two workers, a test of
    minutes started last would run alone at the end of the suite."""
    items.sort(key=lambda item: item.get_closest_marker("early") is None)  # sort is stable
