"""What every test module shares: the fixtures that start servers, and the ``slow`` marker.

Fixtures: ``moto_server`` (moto's server, one per session) and ``aws`` (a fresh account on it per
test, :mod:`helpers.aws`); ``api`` (the test API server holding the walkthrough's cluster,
:mod:`helpers.agents`; a module may define its own ``api``). Tools the tests share live in the
``helpers`` package, never in another test module.

``pytest -m "not slow"`` runs the fast lane (the README gives its time): everything but the modules
below, which start agent processes, drive the test API server or moto's server through many
scenarios, render with Helm and kubectl, build packages, or run the linters, and the exhaustive rule
tables tests/plugins/test_rules_* (every format string of a family's print sites in both engines:
thousands of cases; the fast lane keeps every rule's recorded example,
tests/detectors/test_builtin_rules.py). The README's test
command (and CI) runs everything; the fast lane is for the edit-test loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


SLOW_MODULES = frozenset(
    {
        "test_admission_policy",
        "test_alarm_template",
        "test_aws",
        "test_boot_restore",
        "test_check_plugins",
        "test_cli",
        "test_components_ops",
        "test_config_limits",
        "test_faults",
        "test_fleet_sim",
        "test_helm",
        "test_iam_policy",
        "test_image_pipeline",
        "test_install_fleet",
        "test_kmsg_real",
        "test_kubeapi_contract",
        "test_kubernetes",
        "test_manifests",
        "test_monitoring",
        "test_project_rules",
        "test_recovery_e2e",
        "test_recovery_fleet",
        "test_recovery_ladder",
        "test_recovery_ladder_e2e",
        "test_recovery_pause_e2e",
        "test_reload",
        "test_rules_cpu_kernel",
        "test_rules_kernel_integrity",
        "test_rules_memory_pcie",
        "test_rules_network",
        "test_rules_neuron",
        "test_rules_npd_kernel",
        "test_rules_nvidia",
        "test_rules_nvidia_gsp",
        "test_rules_nvrm_family",
        "test_rules_storage",
        "test_value_bounds",
    }
)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast lane (exactly ``-m "not slow"``) does not even import the slow modules: their tables are
    built at import (seconds of collection for tests that would all be deselected)."""
    if config.getoption("markexpr", "") == "not slow" and collection_path.stem in SLOW_MODULES:
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
