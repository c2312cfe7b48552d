"""The Kubernetes API seam: the only module that imports the ``kubernetes`` client.

Bodies go out and come back as plain dicts (``_preload_content=False`` + ``json.loads``), so the
agent never builds model objects it does not need. Every failure is a ``KubeError`` carrying the
HTTP status (``None`` for connection problems and timeouts), the API's reason and the server's
``Retry-After`` so callers can classify it (see ``agent.sinks.worker``). Every call has a client
timeout (``timeout``, default 10 s). The client is imported lazily, when Kubernetes mode starts,
not at import time.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 10.0
USER_AGENT = "node-health-agent"
MAX_RETRY_AFTER = 600.0  # a larger Retry-After is clamped to this many seconds
TRANSIENT_STATUSES = frozenset({408, 409, 429})  # plus every 5xx
DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")  # best first


class KubeError(Exception):
    """An API call failed. ``status`` is None when no HTTP answer arrived (connection, timeout).

    ``reason`` is the Status reason (``AlreadyExists``, ``Invalid``, ...) when the server sent one;
    ``retry_after`` the server's ``Retry-After`` in seconds (clamped to ``MAX_RETRY_AFTER``).
    """

    def __init__(
        self, message: str, *, status: int | None = None, reason: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Worth retrying: no answer, a timeout, a conflict, throttling or a server error."""
        return self.status is None or self.status in TRANSIENT_STATUSES or self.status >= 500

    @property
    def already_exists(self) -> bool:
        """A create found an object of that name (e.g. stored by an earlier attempt that timed out)."""
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def unauthorized(self) -> bool:
        return self.status in (401, 403)


class KubeConfigError(Exception):
    """No usable credentials / API server address."""


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # the pod's token and CA


def _client_module(name: str) -> Any:
    """``kubernetes.<name>`` without the rest of the package.

    ``kubernetes/__init__.py`` imports every part of the client (``dynamic``, ``watch``, ``stream`` with
    websocket-client, ``leaderelection``, ``informer``, ``utils``), ``kubernetes/config/__init__.py`` the
    kubeconfig loader (requests, oauthlib, requests-oauthlib, for the OIDC and cloud auth plugins) and
    ``kubernetes/utils/__init__.py`` the YAML loader and metrics helpers (the REST layer needs its retry and
    keep-alive modules): memory of a pod that the in-cluster agent never uses. The packages are registered here
    unexecuted and the modules the agent calls imported by their full names; the first other attribute
    asked of either package runs its ``__init__`` after all, so anything else in the process that uses the
    client (a test, a debugger) finds the whole package as usual."""
    import importlib
    import importlib.util
    import sys

    for package in ("kubernetes", "kubernetes.config", "kubernetes.utils"):
        if package in sys.modules:
            continue
        spec = importlib.util.find_spec(package)
        if spec is None or spec.loader is None:
            break  # not installed: the import below fails as it would have
        module = importlib.util.module_from_spec(spec)

        def complete(attr: str, module: Any = module, spec: Any = spec) -> Any:
            del module.__getattr__
            spec.loader.exec_module(module)  # the package's own __init__, once
            return getattr(module, attr)

        module.__getattr__ = complete  # type: ignore[method-assign]
        sys.modules[package] = module
        if package != "kubernetes":
            sys.modules["kubernetes"].__dict__[package.rsplit(".", 1)[1]] = module
    return importlib.import_module(f"kubernetes.{name}")


def resolve_node_name(*, flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``--node-name``, then ``NODE_NAME`` (downward API), then the hostname."""
    env = os.environ if environ is None else environ
    return flag or env.get("NODE_NAME") or socket.gethostname()


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientInfo:
    host: str
    source: str  # "in-cluster service account" or the kubeconfig path


class KubeClient:
    """Narrow access to the API calls the agent makes, with dict bodies.

    Requests go through the client's ``Configuration`` (credentials, the token's refresh hook, TLS) and
    its REST layer (``RESTClientObject``: urllib3's pool with the configuration's certificates) with
    paths of our own. The generated ``CoreV1Api`` and ``CoordinationV1Api`` classes cost about 20 MiB of
    memory (pydantic validators for every one of their hundreds of methods) for the dozen calls below,
    whose bodies the agent reads as dicts anyway; ``ApiClient``, which only serializes models and
    parameters, imports pydantic itself (about 5 MiB more)."""

    def __init__(self, *, configuration: Any, rest: Any, info: ClientInfo, timeout: float = REQUEST_TIMEOUT) -> None:
        """``timeout``: seconds each call may take in all (connecting, sending, the answer)."""
        self._configuration = configuration
        self._rest = rest
        self._timeout = timeout
        self.info = info
        self._dra_versions: dict[str, str | None] = {}  # resource -> version, from discovery

    @classmethod
    def load(
        cls,
        *,
        kubeconfig: Path | None,
        environ: Mapping[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT,
        service_account_dir: Path | None = None,
    ) -> KubeClient:
        """In-cluster service account when running in a pod (its token and CA in ``service_account_dir``,
        default the pod's own), else ``kubeconfig`` / ``KUBECONFIG``."""
        configuration = _client_module("client.configuration")
        rest = _client_module("client.rest")
        ConfigException = _client_module("config.config_exception").ConfigException  # noqa: N806 - a class

        env = os.environ if environ is None else environ
        cfg = configuration.Configuration()
        try:
            if kubeconfig is not None:
                _client_module("config.kube_config").load_kube_config(
                    config_file=str(kubeconfig), client_configuration=cfg
                )
                source = str(kubeconfig)
            elif env.get("KUBERNETES_SERVICE_HOST"):
                account = service_account_dir or SERVICE_ACCOUNT_DIR
                _client_module("config.incluster_config").InClusterConfigLoader(
                    token_filename=str(account / "token"), cert_filename=str(account / "ca.crt"), environ=env
                ).load_and_set(cfg)
                source = "in-cluster service account"
            elif env.get("KUBECONFIG") or Path("~/.kube/config").expanduser().is_file():
                # Named here: the client reads KUBECONFIG once, when it is first imported, not at this call.
                source = env.get("KUBECONFIG") or "~/.kube/config"
                _client_module("config.kube_config").load_kube_config(config_file=source, client_configuration=cfg)
            else:
                raise KubeConfigError(
                    "no in-cluster service account (KUBERNETES_SERVICE_HOST unset) and no kubeconfig: pass "
                    "--kubeconfig or set KUBECONFIG"
                )
        except (ConfigException, OSError, ValueError, TypeError) as exc:
            where = kubeconfig or "the environment"
            raise KubeConfigError(f"cannot load Kubernetes credentials from {where}: {exc}") from None
        cfg.retries = False  # we retry ourselves, with backoff, in the sinks
        return cls(
            configuration=cfg,
            rest=rest.RESTClientObject(cfg),
            info=ClientInfo(host=cfg.host, source=source),
            timeout=timeout,
        )

    def close(self) -> None:
        try:
            self._rest.pool_manager.clear()
        except Exception:  # closing must never fail shutdown
            log.debug("error closing the API client", exc_info=True)

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: Mapping[str, object] | None = None,
        body: dict[str, Any] | None = None,
        patch: bool = False,
        merge_patch: bool = False,
    ) -> dict[str, Any]:
        """One request: ``path`` with ``{name}``-style parts already filled in (quoted), ``query`` as
        parameters (None values left out), ``body`` as JSON (a strategic merge patch when ``patch``,
        an RFC 7386 JSON merge patch when ``merge_patch``)."""
        from urllib3.exceptions import HTTPError

        ApiException = _client_module("client.exceptions").ApiException  # noqa: N806 - a class

        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = (
                "application/merge-patch+json"
                if merge_patch
                else "application/strategic-merge-patch+json"
                if patch
                else "application/json"
            )
        params = [
            (k, str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in (query or {}).items()
            if v is not None and v != ""
        ]
        url = self._configuration.host + path + ("?" + urlencode(params, quote_via=quote) if params else "")
        try:
            # The bearer token as the configuration has it now: its refresh hook rereads a rotated
            # service account token (the in-cluster loader) or runs a kubeconfig's exec plugin.
            for auth in self._configuration.auth_settings().values():
                if auth["in"] == "header" and auth["value"]:
                    headers[auth["key"]] = auth["value"]
            response = self._rest.request(method, url, headers=headers, body=body, _request_timeout=self._timeout)
            response.read()
            if not 200 <= response.status <= 299:
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            data = response.data
            return json.loads(data) if data else {}
        except ApiException as exc:
            raise _api_error(what, exc) from None
        except (HTTPError, OSError) as exc:
            raise KubeError(f"{what}: no answer from the API server: {exc}", status=None) from None
        except ValueError as exc:
            raise KubeError(f"{what}: unreadable answer: {exc}", status=None) from None

    def get_node(self, name: str, *, cached: bool = False) -> dict[str, Any]:
        """The Node; ``cached``: served from the API server's watch cache (``resourceVersion=0``: no etcd
        read, possibly a moment old)."""
        query = {"resourceVersion": "0"} if cached else None
        return self._call(f"get node {name}", "GET", f"/api/v1/nodes/{_seg(name)}", query=query)

    def patch_node_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Strategic merge patch of ``nodes/{name}/status`` (conditions merge by ``type``)."""
        return self._call(
            f"patch node {name} status", "PATCH", f"/api/v1/nodes/{_seg(name)}/status", body=body, patch=True
        )

    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST an Event; a name already taken fails with ``KubeError.already_exists``."""
        return self._call(
            f"create event in {namespace}", "POST", f"/api/v1/namespaces/{_seg(namespace)}/events", body=body
        )

    def patch_event(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(
            f"patch event {namespace}/{name}",
            "PATCH",
            f"/api/v1/namespaces/{_seg(namespace)}/events/{_seg(name)}",
            body=body,
            patch=True,
        )

    # ---- recovery: nodes, pods, evictions, Leases -------------------------------------------------

    def list_nodes(self, *, label_selector: str = "", cached: bool = False) -> list[dict[str, Any]]:
        """Every Node matching ``label_selector`` (pages followed). ``cached``: from the API server's watch
        cache (``resourceVersion=0``: any version, possibly a moment old), which answers the whole list
        whatever the limit; a server that pages it anyway is followed by the continue token (its version)."""
        return self._list_all(
            f"list nodes {label_selector!r}", "/api/v1/nodes", cached=cached, labelSelector=label_selector
        )

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Strategic merge patch of the Node (spec, metadata). Include ``metadata.resourceVersion`` in
        ``body`` to make it conditional (409 Conflict when the Node changed since it was read)."""
        return self._call(f"patch node {name}", "PATCH", f"/api/v1/nodes/{_seg(name)}", body=body, patch=True)

    def list_pods_on_node(self, node_name: str) -> list[dict[str, Any]]:
        """Every pod bound to ``node_name``, in all namespaces (pages followed)."""
        return self._list_all(f"list pods on {node_name}", "/api/v1/pods", fieldSelector=f"spec.nodeName={node_name}")

    def list_pods(self, namespace: str, *, label_selector: str = "") -> list[dict[str, Any]]:
        """Every pod in ``namespace`` matching ``label_selector`` (pages followed): the CLI finds the agents."""
        return self._list_all(
            f"list pods in {namespace} {label_selector!r}",
            f"/api/v1/namespaces/{_seg(namespace)}/pods",
            labelSelector=label_selector,
        )

    def evict_pod(self, namespace: str, name: str, *, grace_period: int | None = None) -> dict[str, Any]:
        """POST a policy/v1 Eviction; a PodDisruptionBudget that forbids it answers 429 (transient)."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_period is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period}
        return self._call(
            f"evict pod {namespace}/{name}",
            "POST",
            f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}/eviction",
            body=body,
        )

    def delete_pod(self, namespace: str, name: str, *, grace_period: int | None = None) -> dict[str, Any]:
        """DELETE the pod (no PodDisruptionBudget check: only when a drain's policy says so)."""
        return self._call(
            f"delete pod {namespace}/{name}",
            "DELETE",
            f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}",
            query={"gracePeriodSeconds": grace_period},
        )

    def get_lease(self, namespace: str, name: str, *, cached: bool = False) -> dict[str, Any]:
        """The Lease; a missing one is ``KubeError`` with status 404. ``cached``: served from the API
        server's watch cache (``resourceVersion=0``: no etcd read, possibly a moment old), for polls."""
        query = {"resourceVersion": "0"} if cached else None
        return self._call(f"get lease {namespace}/{name}", "GET", _lease_path(namespace, name), query=query)

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create; a Lease of that name already there is ``KubeError.already_exists``."""
        return self._call(f"create lease in {namespace}", "POST", _lease_path(namespace), body=body)

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT the Lease; ``body.metadata.resourceVersion`` makes it conditional: 409 Conflict when
        another agent wrote it since it was read (read again and redo)."""
        return self._call(f"replace lease {namespace}/{name}", "PUT", _lease_path(namespace, name), body=body)

    # ---- recovery: DRA device fences (resource.k8s.io) ----------------------------------------------

    def resource_api_version(self, resource: str) -> str | None:
        """The best ``resource.k8s.io`` version serving ``resource`` (``devicetaintrules``,
        ``resourceslices``), preferring v1 > v1beta2 > v1beta1 > v1alpha3; None when the group or
        no version of it serves the resource (a 404 is an answer). Cached per client once read."""
        if resource in self._dra_versions:
            return self._dra_versions[resource]
        group = self._discover(f"discover {DRA_GROUP}", f"/apis/{DRA_GROUP}")
        listed = {v.get("version") for v in (group or {}).get("versions") or []}
        found = None
        for version in (v for v in DRA_VERSIONS if v in listed):
            document = self._discover(f"discover {DRA_GROUP}/{version}", f"/apis/{DRA_GROUP}/{version}")
            if any(r.get("name") == resource for r in (document or {}).get("resources") or []):
                found = version
                break
        self._dra_versions[resource] = found
        return found

    def _discover(self, what: str, path: str) -> dict[str, Any] | None:
        try:
            return self._call(what, "GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list_resource_slices(self, version: str, *, node_name: str) -> list[dict[str, Any]]:
        """This node's ResourceSlices (``fieldSelector spec.nodeName``, pages followed)."""
        return self._list_all(
            f"list resourceslices on {node_name}",
            f"/apis/{DRA_GROUP}/{_seg(version)}/resourceslices",
            fieldSelector=f"spec.nodeName={node_name}",
        )

    def get_device_taint_rule(self, version: str, name: str) -> dict[str, Any]:
        """The DeviceTaintRule (cluster-scoped); a missing one is ``KubeError`` with status 404."""
        return self._call(f"get devicetaintrule {name}", "GET", _rule_path(version, name))

    def create_device_taint_rule(self, version: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create; one of that name already there is ``KubeError.already_exists``."""
        name = (body.get("metadata") or {}).get("name", "")
        return self._call(f"create devicetaintrule {name}", "POST", _rule_path(version), body=body)

    def patch_device_taint_rule(self, version: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch (RFC 7386). The built-in resource.k8s.io kinds accept strategic merge
        patch too, but our patches change only scalars (``spec.taint``, labels), where both agree,
        and a merge patch means the same for every kind and version, patch tags or not."""
        return self._call(
            f"patch devicetaintrule {name}", "PATCH", _rule_path(version, name), body=body, merge_patch=True
        )

    def delete_device_taint_rule(self, version: str, name: str) -> dict[str, Any]:
        """DELETE; a rule already gone is ``KubeError`` with status 404."""
        return self._call(f"delete devicetaintrule {name}", "DELETE", _rule_path(version, name))

    def list_device_taint_rules(self, version: str, *, label_selector: str = "") -> list[dict[str, Any]]:
        return self._list_all(
            f"list devicetaintrules {label_selector!r}", _rule_path(version), labelSelector=label_selector
        )

    def _list_all(self, what: str, path: str, *, cached: bool = False, **query: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            version = "0" if cached and token is None else None  # a continue token carries its own version
            page = self._call(
                what, "GET", path, query={**query, "limit": 500, "continue": token, "resourceVersion": version}
            )
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items


def _seg(value: str) -> str:
    """One path segment: every character that is not unreserved is %-escaped (a name is never a path)."""
    return quote(value, safe="")


def _rule_path(version: str, name: str | None = None) -> str:
    base = f"/apis/{DRA_GROUP}/{_seg(version)}/devicetaintrules"
    return base if name is None else f"{base}/{_seg(name)}"


def _lease_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases"
    return base if name is None else f"{base}/{_seg(name)}"


def parse_retry_after(value: object) -> float | None:
    """Seconds from a ``Retry-After`` header (delay-seconds form), clamped to ``MAX_RETRY_AFTER``.

    The HTTP-date form (which the API server never sends), a missing header and garbage give None.
    """
    if value is None:
        return None
    try:
        seconds = float(str(value).strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return min(seconds, MAX_RETRY_AFTER)


def _api_error(what: str, exc: Any) -> KubeError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", "") or ""
    if not status:
        # The client's status 0: no HTTP answer, its TLS handshake failed (a CA that did not sign the server's
        # certificate). Like a refused connection: no status, retried with backoff, the cause in the message.
        detail = " ".join(reason.split())
        return KubeError(f"{what}: no answer from the API server: {detail}", status=None, reason="")
    message = reason
    headers = getattr(exc, "headers", None) or {}
    wait = parse_retry_after(headers.get("Retry-After"))
    try:
        body = json.loads(exc.body) if getattr(exc, "body", None) else {}
        message = body.get("message") or message
        reason = body.get("reason") or reason
        if wait is None and (body.get("details") or {}).get("retryAfterSeconds") is not None:
            wait = parse_retry_after(body["details"]["retryAfterSeconds"])
    except (ValueError, TypeError, AttributeError):
        pass
    hint = ""
    if status == 401:
        hint = " (the API server rejected our credentials: check the service account token or kubeconfig)"
    elif status == 403:
        hint = " (forbidden: check the ClusterRole bound to the agent's service account)"
    return KubeError(f"{what}: HTTP {status} {reason}: {message}{hint}", status=status, reason=reason, retry_after=wait)
