"""What every test module shares: the ``slow`` marker that makes the fast lane.

``pytest -m "not slow"`` runs the fast lane (the README gives its time): everything but the modules
below, which start agent processes, drive the test API server or moto's server through many
scenarios, render with Helm and kubectl, build packages, or run the linters. The README's test
command (and CI) runs everything; the fast lane is for the edit-test loop.
"""

from __future__ import annotations

import pytest

SLOW_MODULES = frozenset(
    {
        "test_admission_policy",
        "test_alarm_template",
        "test_aws",
        "test_check_plugins",
        "test_components_ops",
        "test_config_limits",
        "test_faults",
        "test_fleet_sim",
        "test_helm",
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
        "test_value_bounds",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
