"""``KubeApiServer``: a Kubernetes API server for tests, served over HTTP on 127.0.0.1 (HTTPS with ``tls=True``:
a self-signed certificate made with the ``openssl`` command, as a pod's service account CA).

Usage::

    with KubeApiServer() as server:
        server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, ...})
        api = kubernetes.client.CoreV1Api(server.api_client())
        api.patch_node_status("n1", {"status": {"conditions": [...]}})
        assert server.requests.count(method="PATCH", path_regex=r"/nodes/n1/status$") == 1
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from .api import KubeApi
from .authz import Authorizer, PolicyRule
from .dra import DraApis, dra_resources, resolve, storage_resources
from .faults import FaultInjector
from .gotime import format_time
from .handler import HttpServer
from .kubelet import Kubelet
from .requestlog import RequestLog
from .resources import ResourceType, default_resources
from .schema import load_schema
from .store import Store
from .tainteviction import DeviceTaintController

OutageMode = Literal["refuse", "drop"]
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def _utc_now() -> datetime:
    return datetime.now(UTC)


class KubeApiServer:
    """A faithful-enough kube-apiserver for the resources the agent uses.

    ``token=None`` disables authentication.  ``anonymous_auth`` lets requests without a token
    reach ``/healthz``, ``/readyz``, ``/livez`` and ``/version`` (as the default RBAC of real
    clusters does).  ``clock`` stamps ``creationTimestamp``/``deletionTimestamp`` and drives
    ``kubelet.auto_confirm``.  ``kubelet`` (:class:`~kubeapi.kubelet.Kubelet`) confirms the
    termination of gracefully deleted pods: ``confirm()`` now, ``auto_confirm(delay)`` in the
    background (off by default).  ``dra`` says which ``resource.k8s.io`` versions serve which
    kinds: a release from ``kubeapi.dra.DRA_RELEASES`` (``"1.33"``, ``"1.35"``, ``"1.36"``,
    ``"1.37"``, ``"off"``) or a mapping plural -> versions.  ``device_taints``
    (:class:`~kubeapi.tainteviction.DeviceTaintController`) writes DeviceTaintRule status as the
    device-taint eviction controller does: ``reconcile()`` now, ``auto(True)`` in the background.
    """

    def __init__(
        self,
        token: str | None = "test-token",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        anonymous_auth: bool = False,
        release: str | None = None,
        history_size: int = 1000,
        clock: Callable[[], datetime] = _utc_now,
        default_watch_timeout: float | None = None,
        dra: str | DraApis = "1.37",
        tls: bool = False,
    ) -> None:
        self.token = token
        self.tls = tls
        self._tls_dir: Path | None = None  # the certificate and key, made at the first start
        self.host = host
        self.port = port
        self.anonymous_auth = anonymous_auth
        self.store = Store(history_size=history_size)
        self.faults = FaultInjector()
        self.requests = RequestLog()
        self.outage_requests = RequestLog()  # requests that arrived during a "drop" outage (never answered)
        self.authorizer = Authorizer()
        self.schema = load_schema(release)

        def now() -> str:
            return format_time(clock())

        self.dra_apis = resolve(dra)
        self.resources: list[ResourceType] = default_resources() + dra_resources(self.dra_apis, now)
        self._unserved = storage_resources(now)  # for put_object / get_object of DRA kinds, served or not
        self.api = KubeApi(
            self.store,
            self.schema,
            self.resources,
            clock=clock,
            authorizer=self.authorizer,
            server_address=lambda: f"{self.host}:{self.port}",
            default_watch_timeout=default_watch_timeout,
        )
        self.api.seed_resources = self.resources + self._unserved
        self.outage_mode: OutageMode | None = None
        self.kubelet = Kubelet(self.api, clock=clock, available=lambda: self.outage_mode is None)
        self.device_taints = DeviceTaintController(self.api, clock=clock, available=lambda: self.outage_mode is None)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._httpd: HttpServer | None = None
        self._thread: threading.Thread | None = None
        for name in DEFAULT_NAMESPACES:
            self.put_object(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": name},
                    "spec": {"finalizers": ["kubernetes"]},
                    "status": {"phase": "Active"},
                }
            )

    # --- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The server's certificate (self-signed: its own CA), once started with ``tls=True``."""
        assert self._tls_dir is not None, "ca_file: the server serves TLS only with tls=True, once started"
        return self._tls_dir / "ca.crt"

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        if self._tls_dir is None:
            self._tls_dir = Path(tempfile.mkdtemp(prefix="kubeapi-tls-"))
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-days", "2", "-subj", "/CN=kubeapi-test", "-addext", f"subjectAltName=IP:{self.host}",
                 "-keyout", str(self._tls_dir / "tls.key"), "-out", str(self._tls_dir / "ca.crt")],
                check=True, capture_output=True,
            )  # fmt: skip
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self._tls_dir / "ca.crt", self._tls_dir / "tls.key")
        return context

    def start(self) -> KubeApiServer:
        self._stopping.clear()
        self._listen()
        self.kubelet.start()
        self.device_taints.start()
        return self

    def _listen(self) -> None:
        httpd = HttpServer((self.host, self.port), self, ssl_context=self._ssl_context())
        self.port = httpd.server_address[1]
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"kubeapi-{self.port}", daemon=True
        )
        thread.start()
        self._httpd, self._thread = httpd, thread

    def _close_listener(self) -> None:
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def stop(self) -> None:
        self._stopping.set()
        self.kubelet.stop()
        self.device_taints.stop()
        self._close_listener()
        self.store.close_watchers()
        self._drop_connections()
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)
            self._tls_dir = None

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- connections and outages -----------------------------------------------------------------

    def _track(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def _untrack(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _drop_connections(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def set_outage(self, mode: OutageMode | None) -> None:
        """Make the whole server unavailable, or available again with ``None``.

        ``refuse`` closes the listening socket (new connections are refused); ``drop`` accepts
        connections and closes them without an answer.  Open connections and watches are cut in
        both modes.  Stored state is untouched.
        """
        if mode not in (None, "refuse", "drop"):
            raise ValueError(f"unknown outage mode {mode!r}")
        previous, self.outage_mode = self.outage_mode, mode
        if mode is not None:
            self.store.close_watchers()
            if mode == "refuse" and self._httpd is not None:
                self._close_listener()
            self._drop_connections()
        elif previous == "refuse" and not self._stopping.is_set():
            self._listen()

    @contextlib.contextmanager
    def outage(self, mode: OutageMode = "refuse") -> Iterator[None]:
        """``with server.outage(): ...`` - unavailable inside the block."""
        self.set_outage(mode)
        try:
            yield
        finally:
            self.set_outage(None)

    @property
    def available(self) -> bool:
        return self.outage_mode is None

    # --- authorization ---------------------------------------------------------------------------

    def restrict(self, rules: Iterable[PolicyRule] | None, *, user: str | None = None) -> None:
        """Only allow requests some rule permits (``None``: allow everything again)."""
        self.authorizer.rules = None if rules is None else tuple(rules)
        if user is not None:
            self.authorizer.user = user

    # --- introspection and seeding ---------------------------------------------------------------

    def reset_requests(self) -> None:
        self.requests.clear()

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        return self.store.revision

    def set_watch_cache_lag(self, revisions: int) -> None:
        """Serve ``resourceVersion=0`` reads (the watch cache) ``revisions`` revisions behind etcd (0: caught up)."""
        self.api.watch_cache_lag = max(0, revisions)

    def compact(self) -> None:
        """Forget the watch history: watches from any older resourceVersion get 410 Gone."""
        self.store.compact()

    def _resource(self, resource: str) -> ResourceType:
        for rt in self.resources + self._unserved:
            if resource in (rt.plural, str(rt.group_resource), rt.kind, *rt.short_names):
                return rt
        raise KeyError(f"unknown resource {resource!r}")

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object as the API serves it (``events`` = core/v1; ``events.events.k8s.io``
        for the other shape), or ``None``."""
        rt = self._resource(resource)
        obj = self.store.get(rt.storage_key, (namespace or "default") if rt.namespaced else "", name)
        return None if obj is None else self.api.external(rt, obj)

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        rt = self._resource(resource)
        return [self.api.external(rt, o) for o in self.store.list(rt.storage_key, namespace)]

    def put_object(self, obj: Any) -> dict[str, Any]:
        """Store an object directly (a dict or a ``kubernetes.client`` model), bypassing validation
        and strategies: e.g. a Node with kubelet conditions, or a Running+Ready pod.  Creates the
        namespace if needed; emits watch events like any write."""
        if not isinstance(obj, dict):
            from kubernetes.client import ApiClient

            obj = ApiClient().sanitize_for_serialization(obj)
        return self.api.seed(json.loads(json.dumps(obj)))

    def delete_object(self, resource: str, name: str, namespace: str | None = None) -> bool:
        rt = self._resource(resource)
        return self.store.delete(rt.storage_key, (namespace or "default") if rt.namespaced else "", name) is not None

    # --- clients ---------------------------------------------------------------------------------

    def write_kubeconfig(self, path: str | Path, *, token: str | None = None, namespace: str = "default") -> Path:
        """Write a kubeconfig for ``kubernetes.config.load_kube_config(config_file=path)``."""
        user: dict[str, Any] = {}
        chosen = token if token is not None else self.token
        if chosen is not None:
            user["token"] = chosen
        cluster: dict[str, Any] = {"server": self.url}
        if self.tls:
            cluster["certificate-authority"] = str(self.ca_file)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kubeapi-test", "cluster": cluster}],
            "users": [{"name": "kubeapi-test", "user": user}],
            "contexts": [
                {
                    "name": "kubeapi-test",
                    "context": {"cluster": "kubeapi-test", "user": "kubeapi-test", "namespace": namespace},
                }
            ],
            "current-context": "kubeapi-test",
        }
        target = Path(path)
        target.write_text(json.dumps(config, indent=2), encoding="utf-8")
        return target

    def write_service_account(self, directory: str | Path, *, token: str | None = None) -> Path:
        """Write what a pod's service account mount holds (``token``, ``ca.crt``, ``namespace``) for the
        client's in-cluster loader; with :meth:`in_cluster_environ` a process talks to this server as a pod
        does (needs ``tls=True``: the in-cluster loader speaks only HTTPS)."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        (target / "token").write_text(token if token is not None else (self.token or ""), encoding="utf-8")
        shutil.copyfile(self.ca_file, target / "ca.crt")
        (target / "namespace").write_text("kube-system", encoding="utf-8")
        return target

    def in_cluster_environ(self) -> dict[str, str]:
        """The service variables the kubelet sets in every pod, pointing at this server."""
        return {"KUBERNETES_SERVICE_HOST": self.host, "KUBERNETES_SERVICE_PORT": str(self.port)}

    def client_configuration(self, *, token: str | None = None) -> Any:
        """A ``kubernetes.client.Configuration`` pointing at this server."""
        from kubernetes.client import Configuration

        configuration = Configuration(host=self.url)
        if self.tls:
            configuration.ssl_ca_cert = str(self.ca_file)
        chosen = token if token is not None else self.token
        if chosen is not None:
            configuration.api_key = {"authorization": f"Bearer {chosen}"}
        return configuration

    def api_client(self, *, token: str | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` for this server (close it when done)."""
        from kubernetes.client import ApiClient

        return ApiClient(self.client_configuration(token=token))
