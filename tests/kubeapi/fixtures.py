"""pytest fixtures for the test API server.

Import them into a test module (``from kubeapi.fixtures import kube_api, kube_api_client``) or
list ``kubeapi.fixtures`` in the root ``conftest.py``'s ``pytest_plugins``.

``kube_api_client`` talks to a fresh :class:`KubeApiServer` unless the environment variable
``KUBEAPI_CONTRACT_KUBECONFIG`` names a kubeconfig: then it talks to that cluster, so the
contract tests can be checked against a real API server.  A dedicated variable (not
``KUBECONFIG``) keeps a developer's everyday cluster out of reach of tests that create and delete
Nodes.  Tests needing the fake's internals (fault injection, request log, seeding) use
``kube_api``, which skips when a real cluster is targeted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from .server import KubeApiServer

CONTRACT_KUBECONFIG_ENV = "KUBEAPI_CONTRACT_KUBECONFIG"


def real_cluster_kubeconfig() -> str | None:
    return os.environ.get(CONTRACT_KUBECONFIG_ENV) or None


@pytest.fixture
def kube_api_server() -> Iterator[KubeApiServer]:
    """A started :class:`KubeApiServer` (always the fake), stopped after the test."""
    server = KubeApiServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_api(request: pytest.FixtureRequest) -> KubeApiServer:
    """The fake server, for tests that rely on its introspection; skipped against a real cluster."""
    if real_cluster_kubeconfig():
        pytest.skip(f"needs the test API server's internals ({CONTRACT_KUBECONFIG_ENV} is set)")
    return request.getfixturevalue("kube_api_server")


@pytest.fixture
def kube_api_client(request: pytest.FixtureRequest) -> Iterator[client.ApiClient]:
    """An ``ApiClient`` for the fake server, or for the cluster in ``KUBEAPI_CONTRACT_KUBECONFIG``."""
    path = real_cluster_kubeconfig()
    if path:
        configuration = client.Configuration()
        config.load_kube_config(config_file=path, client_configuration=configuration)
        api_client = client.ApiClient(configuration)
    else:
        server: KubeApiServer = request.getfixturevalue("kube_api_server")
        api_client = server.api_client()
    try:
        yield api_client
    finally:
        api_client.close()
