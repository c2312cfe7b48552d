"""The Kubernetes adapter's credentials: where :meth:`KubeClient.load` finds them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.adapters.kube import KubeClient, KubeConfigError, KubeError

from kubeapi.server import KubeApiServer


def test_kubeconfig_is_the_one_the_environment_names_at_load_time(api: KubeApiServer, tmp_path: Path) -> None:
    """The client reads KUBECONFIG once, when it is first imported: a process (a test, a command run in one
    process after another) whose KUBECONFIG changed since must still load the file named now."""
    import kubernetes.config  # noqa: F401  (imported now, with the KUBECONFIG of this moment)

    path = api.write_kubeconfig(tmp_path / "kubeconfig")
    client = KubeClient.load(kubeconfig=None, environ={"KUBECONFIG": str(path)})
    assert (client.info.host, client.info.source) == (api.url, str(path))


def test_a_kubeconfig_the_environment_names_that_is_missing_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="cannot load Kubernetes credentials"):
        KubeClient.load(kubeconfig=None, environ={"KUBECONFIG": str(tmp_path / "absent")})


@pytest.fixture
def tls_api() -> Iterator[KubeApiServer]:
    with KubeApiServer(tls=True) as server:
        server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        yield server


def test_in_a_pod_the_service_account_and_the_service_variables_are_the_credentials(
    tls_api: KubeApiServer, tmp_path: Path
) -> None:
    account = tls_api.write_service_account(tmp_path / "sa")
    client = KubeClient.load(kubeconfig=None, environ=tls_api.in_cluster_environ(), service_account_dir=account)
    assert (client.info.host, client.info.source) == (tls_api.url, "in-cluster service account")
    assert client.get_node("n1")["metadata"]["name"] == "n1"  # the server answers only its token (401 else)
    assert tls_api.requests.count(method="GET", path_regex=r"/api/v1/nodes/n1$", status=200) == 1


CREDENTIAL_FAULTS = [
    ("no token", lambda d: (d / "token").unlink(), "cannot load Kubernetes credentials"),
    ("no CA", lambda d: (d / "ca.crt").unlink(), "cannot load Kubernetes credentials"),
    ("empty token", lambda d: (d / "token").write_text(""), "cannot load Kubernetes credentials"),
]


@pytest.mark.parametrize(("case", "spoil", "message"), CREDENTIAL_FAULTS, ids=[c[0] for c in CREDENTIAL_FAULTS])
def test_a_spoiled_service_account_is_a_config_error(
    tls_api: KubeApiServer, tmp_path: Path, case: str, spoil: Callable[[Path], object], message: str
) -> None:
    account = tls_api.write_service_account(tmp_path / "sa")
    spoil(account)
    with pytest.raises(KubeConfigError, match=message):
        KubeClient.load(kubeconfig=None, environ=tls_api.in_cluster_environ(), service_account_dir=account)


def test_a_server_whose_certificate_the_pods_ca_did_not_sign_gets_no_request(
    tls_api: KubeApiServer, tmp_path: Path
) -> None:
    account = tls_api.write_service_account(tmp_path / "sa")
    with KubeApiServer(tls=True) as other:  # another self-signed CA
        (account / "ca.crt").write_bytes(other.ca_file.read_bytes())
    client = KubeClient.load(kubeconfig=None, environ=tls_api.in_cluster_environ(), service_account_dir=account)
    with pytest.raises(KubeError) as caught:
        client.get_node("n1")
    assert caught.value.status is None  # no answer: the TLS handshake failed
    assert tls_api.requests.count(method="GET", path_regex=r"/api/v1/nodes/n1$") == 0


def test_the_in_cluster_client_loads_only_the_parts_of_the_package_it_calls(
    tls_api: KubeApiServer, tmp_path: Path
) -> None:
    """kubernetes/__init__.py imports watch, stream (websocket-client), dynamic, leaderelection and informer,
    kubernetes/config/__init__.py the kubeconfig loader with requests and oauthlib, the ApiClient pydantic:
    none of which a pod's agent calls (about 14 MiB of its memory). A process that asks the package for
    more gets all of it."""
    account = tls_api.write_service_account(tmp_path / "sa")
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from agent.adapters.kube import KubeClient\n"
        f"env, account = {tls_api.in_cluster_environ()!r}, Path({str(account)!r})\n"
        "c = KubeClient.load(kubeconfig=None, environ=env, service_account_dir=account)\n"
        "c.get_node('n1')\n"
        "print(sorted(m for m in ('kubernetes.watch', 'kubernetes.stream', 'kubernetes.dynamic', 'requests',\n"
        "    'requests_oauthlib', 'oauthlib', 'websocket', 'kubernetes.config.kube_config', 'pydantic',\n"
        "    'kubernetes.client.api_client', 'kubernetes.utils.create_from_yaml') if m in sys.modules))\n"
        "import kubernetes\n"
        "print(kubernetes.__version__ != '', 'kubernetes.watch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.splitlines() == ["[]", "True True"]
