"""The AWS seam: the only module that imports botocore, and only inside functions.

Importing this module costs nothing (botocore and its clients are ~20 MiB of the agent's 80 MiB budget):
they are imported when the first client is built, which happens only when CloudWatch publishing or
Auto Scaling recovery is switched on, or a diagnostics bundle is put to S3. The EC2 client is built
only when a reboot is requested (:class:`Ec2Reboot`), never on the idle path. The EC2, Auto Scaling
and CloudWatch clients read their service models trimmed to the operations in :data:`CALLS`
(:data:`TRIMMED_MODELS_DIR`, made by :mod:`agent.adapters.trim_models`): EC2's full model alone
costs ~15 MiB.

Configuration comes only from the standard AWS environment, so the same code runs against AWS and
against moto in the tests: ``AWS_ENDPOINT_URL`` (and ``AWS_ENDPOINT_URL_<SERVICE>``), the region
(``AWS_REGION``/``AWS_DEFAULT_REGION``, else the instance metadata service), the default credential
chain (IRSA web identity, EKS Pod Identity, environment, instance profile) and
``AWS_EC2_METADATA_SERVICE_ENDPOINT``. Every client has connect/read timeouts and botocore's own
retries off: callers retry with backoff (:class:`CloudWatchPublisher` within a call, the sinks and
the recovery loop across calls).

Every failure is an :class:`AwsError` saying what failed, whether retrying may help (``transient``)
and what to do, so callers never import botocore.

:data:`ACTIONS` lists every AWS API call the agent makes, as IAM actions; all of them go through
:meth:`AwsClients.call`. ``tests/deploy/test_iam_policy.py`` checks the table against this file and against
``iam/node-health-agent-policy.json``.
"""

from __future__ import annotations

import functools
import http.client
import logging
import math
import os
import random
import re
import socket
import threading
import time
import types
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Every AWS API call in this module (service as boto3 names it, operation) -> the IAM action it needs.
CALLS: Mapping[tuple[str, str], str] = types.MappingProxyType(
    {
        ("autoscaling", "DescribeAutoScalingInstances"): "autoscaling:DescribeAutoScalingInstances",
        ("autoscaling", "SetInstanceHealth"): "autoscaling:SetInstanceHealth",
        ("cloudwatch", "PutMetricData"): "cloudwatch:PutMetricData",
        ("s3", "PutObject"): "s3:PutObject",
        ("ec2", "RebootInstances"): "ec2:RebootInstances",
    }
)
ACTIONS = frozenset(CALLS.values())

# Services whose botocore model the clients read trimmed to the operations in CALLS (agent.adapters.trim_models):
# EC2's full model costs ~15 MiB for one operation. The directory is a loader search path of the agent's session.
TRIMMED_SERVICES = frozenset({"autoscaling", "cloudwatch", "ec2"})
TRIMMED_MODELS_DIR = Path(__file__).with_name("botocore-models")

CONNECT_TIMEOUT = 5.0  # seconds to open a connection to an AWS endpoint
READ_TIMEOUT = 10.0  # seconds to wait for an answer
IMDS_ENDPOINT = "http://169.254.169.254"
IMDS_ENDPOINT_IPV6 = "http://[fd00:ec2::254]"
IMDS_TIMEOUT = 2.0  # seconds per instance metadata request
IMDS_DEADLINE = 5.0  # seconds one ``get`` may take in all (token and GET, each byte of a trickling answer)
IMDS_TOKEN_TTL = 21_600  # seconds an IMDSv2 session token lives (the maximum)
IMDS_MAX_BODY = 64 * 1024
MAX_DATUMS = 1000  # PutMetricData: metrics per request
MAX_PAYLOAD = 1_000_000  # PutMetricData: bytes per request (the limit is 1 MB; the estimate is conservative)
MAX_DIMENSIONS = 30

# Error codes worth retrying whatever the HTTP status says (throttling and service-side trouble).
TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "ServiceUnavailable",
        "InternalFailure",
        "InternalError",
        "InternalServiceFault",
        "ResourceContention",
        "ExpiredToken",
        "ExpiredTokenException",
        "IDPCommunicationError",
    }
)
ACCESS_DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})
CREDENTIALS_REFUSED_CODES = frozenset(
    {"InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "IncompleteSignature"}
)
POLICY_HINT = "attach iam/node-health-agent-policy.json to the agent's role (IRSA or EKS Pod Identity, iam/README.md)"

_INSTANCE_ID = r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})"
_INSTANCE_ID_RE = re.compile(rf"^{_INSTANCE_ID}$")
# aws:///<availability zone>/<instance id> (the zone may be empty: aws:////i-...).
_PROVIDER_ID_RE = re.compile(rf"^aws://[^/]*/[a-z0-9-]*/({_INSTANCE_ID})$")


class AwsError(Exception):
    """An AWS call (or the instance metadata service) failed.

    ``code`` is AWS's error code (``Throttling``, ``AccessDenied``, ``ValidationError``, ...) or ours
    (``ConnectionError``, ``Timeout``, ``NoRegion``, ``ImdsUnavailable``, ...); ``transient`` says
    whether the same call may succeed later; ``status`` is the HTTP status when an answer arrived.
    """

    def __init__(self, message: str, *, code: str = "", transient: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.transient = transient
        self.status = status
        self.retry_after: float | None = None  # AWS sends none; the SDK's own retries have waited already

    @property
    def reason(self) -> str:
        """The error code, under the name the sinks' failure policy reads (as :class:`KubeError`'s reason)."""
        return self.code


def instance_id_from_provider_id(provider_id: str) -> str | None:
    """The EC2 instance id in a Node's ``spec.providerID`` (``aws:///us-west-2a/i-0123...``), else None."""
    match = _PROVIDER_ID_RE.match(provider_id.strip()) if isinstance(provider_id, str) else None
    return match.group(1) if match else None


def _check_instance_id(instance_id: str) -> None:
    if not _INSTANCE_ID_RE.match(instance_id):
        raise AwsError(
            f"{instance_id!r} is not an EC2 instance id (i- and 8 or 17 hex digits): check the Node's spec.providerID",
            code="InvalidInstanceId",
        )


# ---- instance metadata (IMDSv2) ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceIdentity:
    instance_id: str
    region: str
    availability_zone: str


def imds_endpoint(environ: Mapping[str, str]) -> str:
    """``AWS_EC2_METADATA_SERVICE_ENDPOINT``, else the IPv4 (or, with ``..._ENDPOINT_MODE=IPv6``, IPv6) address."""
    explicit = environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "").strip()
    if explicit:
        return explicit.rstrip("/")
    if environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "").strip().lower() == "ipv6":
        return IMDS_ENDPOINT_IPV6
    return IMDS_ENDPOINT


class InstanceMetadata:
    """The EC2 instance metadata service, IMDSv2 only (a session token on every request).

    The token is fetched with ``PUT /latest/api/token`` and reused until shortly before it expires;
    a 401 (token expired or revoked) fetches a new one once. Requests bypass any HTTP proxy.
    Each socket operation waits ``timeout`` at most and one :meth:`get` ``deadline`` in all (real time),
    so an answer that trickles a byte at a time ends as a timeout instead of holding its caller.
    """

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        timeout: float = IMDS_TIMEOUT,
        deadline: float = IMDS_DEADLINE,
        token_ttl: int = IMDS_TOKEN_TTL,
        environ: Mapping[str, str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self.endpoint = (endpoint or imds_endpoint(env)).rstrip("/")
        self._disabled = env.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true"
        self._timeout = timeout
        self._deadline = deadline
        self._ttl = token_ttl
        self._monotonic = monotonic
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _DeadlineHandler())
        self._lock = threading.Lock()
        self._token: str | None = None
        self._token_expires = 0.0

    def instance_id(self) -> str:
        return self.get("meta-data/instance-id")

    def region(self) -> str:
        return self.get("meta-data/placement/region")

    def availability_zone(self) -> str:
        return self.get("meta-data/placement/availability-zone")

    def identity(self) -> InstanceIdentity:
        return InstanceIdentity(
            instance_id=self.instance_id(), region=self.region(), availability_zone=self.availability_zone()
        )

    def get(self, path: str) -> str:
        """The text at ``/latest/<path>``."""
        if self._disabled:
            raise AwsError(
                "the instance metadata service is disabled (AWS_EC2_METADATA_DISABLED=true): set AWS_REGION "
                "and give the agent its instance id through the Node's spec.providerID",
                code="ImdsDisabled",
            )
        url = f"{self.endpoint}/latest/{path.lstrip('/')}"
        deadline = time.monotonic() + self._deadline  # real time: the whole get, a renewed token included
        try:
            return self._get(url, deadline=deadline)
        except AwsError as exc:
            if exc.status != 401:
                raise
        with self._lock:  # the token expired or was revoked: one more try with a new one
            self._token = None
        return self._get(url, deadline=deadline)

    def _get(self, url: str, *, deadline: float) -> str:
        token = self._session_token(deadline=deadline)
        request = _ImdsRequest(url, headers={"X-aws-ec2-metadata-token": token}, deadline=deadline)
        return self._send(request, what=f"GET {url}")

    def _session_token(self, *, deadline: float) -> str:
        with self._lock:
            if self._token is not None and self._monotonic() < self._token_expires:
                return self._token
            request = _ImdsRequest(
                f"{self.endpoint}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self._ttl)},
                deadline=deadline,
            )
            token = self._send(request, what="the IMDSv2 session token request (PUT /latest/api/token)")
            if not token:
                raise AwsError(
                    f"the instance metadata service at {self.endpoint} answered an empty IMDSv2 token",
                    code="ImdsUnavailable",
                    transient=True,
                )
            self._token = token
            self._token_expires = self._monotonic() + max(1.0, self._ttl - 60.0)
            return token

    def _send(self, request: _ImdsRequest, *, what: str) -> str:
        hop_hint = (
            "from a pod without hostNetwork the instance's metadata hop limit must be at least 2 (aws ec2 "
            "modify-instance-metadata-options --instance-id <id> --http-tokens required "
            "--http-put-response-hop-limit 2); or set AWS_REGION and let the agent read its instance id from "
            "the Node's spec.providerID"
        )
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                return response.read(IMDS_MAX_BODY).decode("utf-8", "replace").strip()
        except urllib.error.HTTPError as exc:
            status = exc.code
            if status == 401:
                hint = "the IMDSv2 token was refused; a new one is fetched"
            elif status == 403:
                hint = (
                    "instance metadata is turned off for this instance "
                    "(aws ec2 modify-instance-metadata-options --instance-id <id> --http-endpoint enabled)"
                )
            elif status == 404:
                hint = "this path does not exist on this instance"
            else:
                hint = "retry later"
            raise AwsError(
                f"instance metadata {what} failed with HTTP {status} at {self.endpoint}: {hint}",
                code=f"Imds{status}",
                transient=status >= 500 or status == 429,
                status=status,
            ) from None
        except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            timed_out = isinstance(reason, TimeoutError) or "timed out" in str(reason)
            if time.monotonic() >= request.deadline:
                happened = f"did not finish answering within {self._deadline:g}s"
            elif timed_out:
                happened = f"did not answer within {self._timeout:g}s"
            else:
                happened = f"cannot be reached ({reason})"
            raise AwsError(
                f"the instance metadata service at {self.endpoint} {happened} for {what}: not on EC2? {hop_hint}",
                code="ImdsTimeout" if timed_out else "ImdsUnavailable",
                transient=True,
            ) from None


class _ImdsRequest(urllib.request.Request):
    """A request that must be answered by ``deadline`` (``time.monotonic``), every byte of it."""

    def __init__(self, url: str, *, deadline: float, **kw: Any) -> None:
        super().__init__(url, **kw)
        self.deadline = deadline


class _DeadlineSocket(socket.socket):
    """A connected socket each of whose operations waits ``op_timeout`` at most and ends by ``deadline``."""

    deadline = 0.0
    op_timeout = IMDS_TIMEOUT

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out (the request's deadline passed)")
        self.settimeout(min(self.op_timeout, left))

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._arm()
        return super().recv(bufsize, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._arm()
        super().sendall(data, flags)


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP connection whose socket ends by the request's deadline (headers and body alike)."""

    def __init__(self, host: str, *, deadline: float, **kw: Any) -> None:
        super().__init__(host, **kw)
        self._deadline = deadline

    def connect(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out (the request's deadline passed)")
        op_timeout = self.timeout if isinstance(self.timeout, int | float) else IMDS_TIMEOUT
        self.timeout = min(op_timeout, left)
        super().connect()
        raw = self.sock
        wrapped = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
        wrapped.deadline, wrapped.op_timeout = self._deadline, op_timeout
        self.sock = wrapped


class _DeadlineHandler(urllib.request.HTTPHandler):
    """``http:`` with a whole-request deadline for an :class:`_ImdsRequest` (IMDS is plain HTTP)."""

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        if not isinstance(req, _ImdsRequest):
            return super().http_open(req)
        return self.do_open(functools.partial(_DeadlineConnection, deadline=req.deadline), req)


class InstanceIdLookup:
    """``() -> instance id or None``: the Node's ``spec.providerID`` first, else IMDS; the first answer is kept.

    Failed IMDS lookups are retried no more often than every ``retry`` seconds (callers may ask each minute).
    """

    def __init__(
        self,
        *,
        provider_id: Callable[[], str | None],
        imds: InstanceMetadata | None,
        retry: float = 300.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._provider_id = provider_id
        self._imds = imds
        self._retry = retry
        self._monotonic = monotonic
        self._found: str | None = None
        self._next_try = float("-inf")

    def __call__(self) -> str | None:
        if self._found is not None:
            return self._found
        found = instance_id_from_provider_id(self._provider_id() or "")
        if found is None and self._imds is not None and self._monotonic() >= self._next_try:
            try:
                found = self._imds.instance_id()
            except AwsError as exc:
                self._next_try = self._monotonic() + self._retry
                log.warning("instance id unknown (retrying in %.0fs): %s", self._retry, exc)
        self._found = found
        return found


def resolve_region(*, environ: Mapping[str, str], imds: Callable[[], str]) -> str:
    """``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else the instance metadata service's region."""
    region = environ.get("AWS_REGION", "").strip() or environ.get("AWS_DEFAULT_REGION", "").strip()
    if region:
        return region
    try:
        return imds()
    except AwsError as exc:
        raise AwsError(
            f"no AWS region: AWS_REGION and AWS_DEFAULT_REGION are unset and the instance metadata service did not "
            f"tell ({exc}); set AWS_REGION in the agent's environment",
            code="NoRegion",
            transient=exc.transient,
        ) from None


# ---- clients -------------------------------------------------------------------------------------


class AwsClients:
    """botocore clients from the standard AWS environment, one per service, built on first use.

    ``region`` None = :func:`resolve_region` (environment, else IMDS) when the first client is built.
    botocore is imported then, not before.
    """

    def __init__(
        self,
        *,
        region: str | None = None,
        environ: Mapping[str, str] | None = None,
        imds: InstanceMetadata | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self._environ = os.environ if environ is None else environ
        self._region = region
        self._imds = imds
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._lock = threading.Lock()
        self._session: Any = None
        self._clients: dict[str, Any] = {}

    @property
    def region(self) -> str:
        with self._lock:
            return self._resolved_region()

    def _resolved_region(self) -> str:
        if self._region is None:
            imds = self._imds or InstanceMetadata(environ=self._environ)
            self._region = resolve_region(environ=self._environ, imds=imds.region)
        return self._region

    def client(self, service: str) -> Any:
        """The botocore client for ``service`` (built once; botocore clients are thread-safe)."""
        with self._lock:
            client = self._clients.get(service)
            if client is not None:
                return client
            region = self._resolved_region()
            # botocore's own session, not boto3's: the same clients, credential chain, region and endpoint
            # configuration, without boto3 importing s3transfer (and with it multiprocessing, concurrent)
            import botocore.session
            from botocore.config import Config

            if self._session is None:
                self._session = botocore.session.get_session()  # a session of our own: no global default
                self._session.register_component("data_loader", _loader(self._session))
            config = Config(
                connect_timeout=self._connect_timeout,
                read_timeout=self._read_timeout,
                retries={"total_max_attempts": 1, "mode": "standard"},  # we retry ourselves, with backoff
                user_agent_appid="node-health-agent",
            )
            client = self._session.create_client(service, region_name=region, config=config)
            self._clients[service] = client
            return client

    def call(self, service: str, operation: str, **params: Any) -> dict[str, Any]:
        """Call ``operation`` (as the API names it, e.g. ``PutMetricData``) of ``service``; errors are AwsError."""
        action = CALLS.get((service, operation))
        if action is None:
            raise ValueError(
                f"{service}:{operation} is not in agent.adapters.aws.CALLS (and not in the IAM policy): add it to both"
            )
        client = self.client(service)
        from botocore import xform_name
        from botocore.exceptions import BotoCoreError, ClientError
        from botocore.parsers import ResponseParserError

        try:
            return getattr(client, xform_name(operation))(**params)
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise aws_error(exc, action=action, endpoint=client.meta.endpoint_url) from None


def _loader(session: Any) -> Any:
    """botocore's loader with the trimmed models (TRIMMED_MODELS_DIR) searched before botocore's own data.

    ``AWS_DATA_PATH`` (the user's own models) still comes first. The directory holds only the services in
    TRIMMED_SERVICES, so every other client reads botocore's models as before."""
    from botocore.loaders import Loader

    user = session.get_config_variable("data_path") or ""
    paths = [os.path.expanduser(os.path.expandvars(p)) for p in user.split(os.pathsep) if p]
    return Loader(extra_search_paths=[*paths, str(TRIMMED_MODELS_DIR)])


def aws_error(exc: Exception, *, action: str, endpoint: str = "") -> AwsError:
    """An :class:`AwsError` for a botocore exception raised by ``action`` (``service:Operation``)."""
    from botocore import exceptions as bce
    from botocore.parsers import ResponseParserError

    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = str(error.get("Code") or status or "Unknown")
        message = str(error.get("Message") or "")
        transient = code in TRANSIENT_CODES or status == 429 or (status is not None and status >= 500)
        if code in CREDENTIALS_REFUSED_CODES:
            hint = "AWS refused the agent's credentials: check the role setup (IRSA or EKS Pod Identity, iam/README.md)"
        elif code in ACCESS_DENIED_CODES or status == 403:
            hint = f"the agent's AWS identity may not call {action}: {POLICY_HINT}"
        elif transient:
            hint = "retried with backoff"
        else:
            hint = "the request was refused as invalid; it is not retried as is"
        return AwsError(f"{action} failed: {code}: {message} ({hint})", code=code, transient=transient, status=status)
    where = f" at {endpoint}" if endpoint else ""
    if isinstance(exc, bce.ConnectTimeoutError | bce.ReadTimeoutError):
        return AwsError(
            f"{action} timed out{where}: {exc} (retried with backoff; check the node's route to AWS, AWS_ENDPOINT_URL "
            "and any proxy)",
            code="Timeout",
            transient=True,
        )
    if isinstance(exc, bce.ConnectionError | bce.HTTPClientError | ResponseParserError):
        return AwsError(
            f"{action} could not reach AWS{where}: {exc} (retried with backoff; check the node's route to AWS, "
            "AWS_ENDPOINT_URL and any proxy)",
            code="ConnectionError",
            transient=True,
        )
    if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError):
        return AwsError(
            f"{action}: no AWS credentials found: {POLICY_HINT}; for IRSA the pod needs AWS_ROLE_ARN and "
            "AWS_WEB_IDENTITY_TOKEN_FILE, for Pod Identity AWS_CONTAINER_CREDENTIALS_FULL_URI",
            code="NoCredentials",
        )
    if isinstance(exc, bce.CredentialRetrievalError | bce.TokenRetrievalError):
        return AwsError(
            f"{action}: AWS credentials could not be fetched: {exc} (retried with backoff; check the role's trust "
            "policy, iam/README.md)",
            code="CredentialRetrieval",
            transient=True,
        )
    if isinstance(exc, bce.NoRegionError):
        return AwsError(f"{action}: no AWS region: set AWS_REGION", code="NoRegion")
    if isinstance(exc, bce.ParamValidationError):
        return AwsError(
            f"{action}: invalid request: {exc} (a bug in the agent: please report it)", code="ParamValidation"
        )
    return AwsError(f"{action} failed: {type(exc).__name__}: {exc}", code=type(exc).__name__)


# ---- Auto Scaling --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class AsgMembership:
    """An instance's place in an Auto Scaling group (DescribeAutoScalingInstances)."""

    instance_id: str
    group: str
    health_status: str  # "HEALTHY" / "UNHEALTHY" (AWS spells them in capitals here)
    lifecycle_state: str  # "InService", "Terminating", ...


class AutoScaling:
    def __init__(self, *, clients: AwsClients) -> None:
        self._clients = clients

    def find_group(self, instance_id: str) -> AsgMembership | None:
        """The Auto Scaling group of the instance; None when it is in none (Karpenter, self-managed): not an error."""
        _check_instance_id(instance_id)
        answer = self._clients.call("autoscaling", "DescribeAutoScalingInstances", InstanceIds=[instance_id])
        for item in answer.get("AutoScalingInstances", []):
            if item.get("InstanceId") == instance_id:
                return AsgMembership(
                    instance_id=instance_id,
                    group=item["AutoScalingGroupName"],
                    health_status=str(item.get("HealthStatus", "")).upper(),
                    lifecycle_state=str(item.get("LifecycleState", "")),
                )
        return None

    def set_unhealthy(self, instance_id: str, *, respect_grace_period: bool) -> None:
        """``SetInstanceHealth(Unhealthy)``: the group replaces the instance (after its grace period, if respected)."""
        _check_instance_id(instance_id)
        self._clients.call(
            "autoscaling",
            "SetInstanceHealth",
            InstanceId=instance_id,
            HealthStatus="Unhealthy",
            ShouldRespectGracePeriod=respect_grace_period,
        )


# ---- S3 ------------------------------------------------------------------------------------------


class S3Uploader:
    """``put(key, body)``: one ``PutObject`` into ``bucket`` (the diagnostics bundles; the IAM policy allows
    it under the configured prefix only). The S3 client is built by the first put."""

    def __init__(self, *, clients: AwsClients, bucket: str) -> None:
        self._clients = clients
        self.bucket = bucket

    def put(self, key: str, body: bytes) -> None:
        """Store ``body`` at ``key``; AwsError as every call (denied, throttled, unreachable)."""
        self._clients.call("s3", "PutObject", Bucket=self.bucket, Key=key, Body=body, ContentType="application/gzip")


# ---- EC2 ------------------------------------------------------------------------------------------

# RebootInstances answers for an instance that cannot be rebooted now (stopping, stopped, terminated).
INSTANCE_STATE_CODES = frozenset({"IncorrectState", "IncorrectInstanceState", "InvalidInstanceID.NotFound"})


class Ec2Reboot:
    """``reboot(instance_id)``: EC2 ``RebootInstances`` for one instance (in place: same host, same id).

    Holding one costs nothing: the EC2 client is built by the first :meth:`reboot` (``AwsClients``
    builds clients on first use), so an agent that never reboots never loads the EC2 service model."""

    def __init__(self, *, clients: AwsClients) -> None:
        self._clients = clients

    def reboot(self, instance_id: str) -> None:
        """Ask EC2 to reboot the instance; AwsError as every call (``code`` tells throttled, denied, wrong state)."""
        _check_instance_id(instance_id)
        self._clients.call("ec2", "RebootInstances", InstanceIds=[instance_id])


# ---- CloudWatch ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricDatum:
    """One value of a metric. ``timestamp`` is wall-clock seconds (None = when CloudWatch receives it)."""

    name: str
    value: float
    dimensions: tuple[tuple[str, str], ...] = ()
    timestamp: float | None = None
    unit: str = "Count"

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 255:
            raise ValueError(f"metric name {self.name!r}: CloudWatch needs 1 to 255 characters")
        if not math.isfinite(self.value):
            raise ValueError(f"metric {self.name}: CloudWatch rejects the value {self.value}")
        if len(self.dimensions) > MAX_DIMENSIONS:
            raise ValueError(
                f"metric {self.name}: {len(self.dimensions)} dimensions; CloudWatch allows {MAX_DIMENSIONS}"
            )

    def to_api(self) -> dict[str, Any]:
        item: dict[str, Any] = {
            "MetricName": self.name,
            "Value": float(self.value),
            "Unit": self.unit,
            "Dimensions": [{"Name": k, "Value": v} for k, v in self.dimensions],
        }
        if self.timestamp is not None:
            item["Timestamp"] = self.timestamp
        return item

    def encoded_size(self) -> int:
        """Bytes this datum adds to a request in the most verbose wire format (AWS Query, at member index 1000)."""
        prefix = "MetricData.member.1000."
        fields = [("MetricName", self.name), ("Value", repr(float(self.value))), ("Unit", self.unit)]
        if self.timestamp is not None:
            fields.append(("Timestamp", "2026-01-01T00:00:00.000000Z"))
        for i, (key, value) in enumerate(self.dimensions, start=1):
            fields += [(f"Dimensions.member.{i}.Name", key), (f"Dimensions.member.{i}.Value", value)]
        return len(urllib.parse.urlencode([(prefix + k, v) for k, v in fields])) + 1


def batches(
    datums: Sequence[MetricDatum], *, max_datums: int = MAX_DATUMS, max_bytes: int = MAX_PAYLOAD
) -> Iterator[list[MetricDatum]]:
    """``datums`` in order, cut into requests of at most ``max_datums`` datums and ``max_bytes`` bytes."""
    batch: list[MetricDatum] = []
    size = 0
    overhead = len("Action=PutMetricData&Version=2010-08-01&Namespace=") + 256
    for datum in datums:
        bytes_ = datum.encoded_size()
        if batch and (len(batch) >= max_datums or overhead + size + bytes_ > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(datum)
        size += bytes_
    if batch:
        yield batch


class CloudWatchPublisher:
    """``put_metrics(namespace, datums)``: PutMetricData in as few requests as the limits allow.

    Each request is retried up to ``attempts`` times in all on throttling, 5xx and connection
    errors, after a full-jitter delay (``rng() * min(max_delay, base_delay * 2**n)``, AWS's
    recommendation against synchronized retries across a fleet); never on a refused request
    (validation, access denied).
    """

    def __init__(
        self,
        *,
        clients: AwsClients,
        attempts: int = 3,
        base_delay: float = 0.5,
        max_delay: float = 4.0,
        sleep: Callable[[float], Any] = time.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if attempts < 1 or base_delay < 0 or max_delay < base_delay:
            raise ValueError("need attempts >= 1 and 0 <= base_delay <= max_delay")
        self._clients = clients
        self._attempts = attempts
        self._base = base_delay
        self._max = max_delay
        self._sleep = sleep
        self._rng = rng

    def put_metrics(self, namespace: str, datums: Sequence[MetricDatum]) -> int:
        """Publish ``datums`` in ``namespace``; the number of PutMetricData requests made. Raises AwsError."""
        sent = 0
        parts = list(batches(datums))
        for index, batch in enumerate(parts):
            try:
                self._put(namespace, batch)
            except AwsError as exc:
                if len(parts) > 1:
                    exc.args = (f"{exc.args[0]} [request {index + 1} of {len(parts)}; {sent} sent]",)
                raise
            sent += 1
        return sent

    def _put(self, namespace: str, batch: list[MetricDatum]) -> None:
        body = [d.to_api() for d in batch]
        for attempt in range(self._attempts):
            try:
                self._clients.call("cloudwatch", "PutMetricData", Namespace=namespace, MetricData=body)
                return
            except AwsError as exc:
                if not exc.transient or attempt + 1 >= self._attempts:
                    raise
                delay = self._rng() * min(self._max, self._base * 2**attempt)
                log.info("PutMetricData attempt %d failed (%s); retrying in %.2fs", attempt + 1, exc.code, delay)
                self._sleep(delay)
