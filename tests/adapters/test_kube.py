"""The Kubernetes adapter's credentials: where :meth:`KubeClient.load` finds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.adapters.kube import KubeClient, KubeConfigError

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
