"""AWS test doubles: moto's server for the AWS APIs, and two tiny HTTP servers at our own seams.

- fixture ``moto_server`` (session): one ``ThreadedMotoServer`` on a free port; fixture ``aws`` (per test)
  resets its state (``POST /moto-api/reset``) and points the standard AWS environment at it
  (``AWS_ENDPOINT_URL``, ``AWS_REGION``, fake credentials; IMDS off, no config files), so the
  agent's code runs unchanged, with real boto3, against it.
- :class:`FaultyFront`: an HTTP server in front of moto that answers the first requests with
  scripted AWS errors (in the wire format of the request: AWS JSON or Query XML) and forwards the
  rest: throttling and server errors without patching anything.
- :class:`StrictImds`: the EC2 instance metadata service, IMDSv2 only (moto's serves fixed values
  and does not require a token), with a token count and token revocation.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from helpers import free_port

REGION = "us-west-2"
ACCOUNT = "123456789012"  # moto's default account
AMI = "ami-12c6146b"  # an image moto knows


class Moto:
    """The running moto server: its endpoint and its control API."""

    def __init__(self, server: ThreadedMotoServer) -> None:
        host, port = server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def _control(self, path: str, body: bytes = b"") -> bytes:
        request = urllib.request.Request(
            self.endpoint + path, data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read()

    def reset(self) -> None:
        """Forget every resource (all services)."""
        self._control("/moto-api/reset")

    @contextlib.contextmanager
    def iam_enforced(self) -> Iterator[None]:
        """Inside: moto checks every request's signature and IAM policies (it does not by default)."""
        self._control("/moto-api/reset-auth", b"0")
        try:
            yield
        finally:
            self._control("/moto-api/reset-auth", b"inf")


@pytest.fixture(scope="session", name="moto_server")
def moto_server_fixture() -> Iterator[Moto]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    try:
        yield Moto(server)
    finally:
        server.stop()


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeGroup:
    name: str
    arn: str
    instance_ids: tuple[str, ...]


class AwsTestEnv:
    """What a test sees: the endpoint, setup clients, and helpers that build AWS resources in moto."""

    def __init__(self, moto: Moto) -> None:
        self.moto = moto
        self.endpoint = moto.endpoint
        self._session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
        )

    def client(self, service: str) -> Any:
        """A test-side client (for setting up and inspecting moto), independent of the agent's."""
        return self._session.client(service, endpoint_url=self.endpoint)

    def node_group(self, name: str = "eks-neuron-ng", *, size: int = 1) -> NodeGroup:
        """An Auto Scaling group from a launch template, with ``size`` running instances."""
        ec2 = self.client("ec2")
        ec2.create_launch_template(
            LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": AMI, "InstanceType": "trn1.32xlarge"}
        )
        asg = self.client("autoscaling")
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateName": f"{name}-lt", "Version": "$Latest"},
            MinSize=size,
            MaxSize=size,
            DesiredCapacity=size,
            AvailabilityZones=[f"{REGION}a"],
        )
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        return NodeGroup(
            name=name, arn=group["AutoScalingGroupARN"], instance_ids=tuple(i["InstanceId"] for i in group["Instances"])
        )

    def lone_instance(self) -> str:
        """An instance in no Auto Scaling group (as Karpenter and self-managed nodes are)."""
        answer = self.client("ec2").run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="trn1.32xlarge")
        return answer["Instances"][0]["InstanceId"]


@pytest.fixture(name="aws")
def aws_fixture(moto_server: Moto, monkeypatch: pytest.MonkeyPatch, tmp_path) -> AwsTestEnv:
    """Fresh moto state and the standard AWS environment pointing at it (nothing else from the host)."""
    moto_server.reset()
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return AwsTestEnv(moto_server)


# ---- our own fakes at the HTTP seam --------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    """An AWS error answer: HTTP status, error code, message."""

    status: int
    code: str
    message: str = "injected by the test"
    applied: bool = False  # the request is carried out (forwarded) and answered with this error all the same

    def render(self, content_type: str) -> tuple[dict[str, str], bytes]:
        """Headers and body in the wire format of a request with ``content_type``."""
        if content_type.startswith("application/x-amz-json"):
            body = json.dumps({"__type": self.code, "message": self.message}).encode()
            sender = "Sender" if self.status < 500 else "Receiver"
            headers = {"Content-Type": content_type, "x-amzn-query-error": f"{self.code};{sender}"}
            return headers, body
        if content_type.startswith("application/x-www-form-urlencoded"):
            body = (
                "<ErrorResponse><Error><Type>Sender</Type>"
                f"<Code>{self.code}</Code><Message>{self.message}</Message></Error>"
                "<RequestId>test-request</RequestId></ErrorResponse>"
            ).encode()
            return {"Content-Type": "text/xml"}, body
        raise AssertionError(f"FaultyFront cannot answer a request of content type {content_type!r}")


THROTTLING = Fault(status=400, code="Throttling", message="Rate exceeded")
SERVER_ERROR = Fault(status=500, code="InternalServiceFault", message="Internal service error")
UNAVAILABLE = Fault(status=503, code="ServiceUnavailable", message="Service unavailable")
INVALID = Fault(status=400, code="InvalidParameterValue", message="The value is invalid")
ACCESS_DENIED = Fault(status=403, code="AccessDenied", message="User is not authorized")


class FaultyFront:
    """Answers the first requests with ``faults`` (in order; None = forward that one), forwards the rest
    to ``upstream``.

    ``requests`` counts every request received (answered with a fault or forwarded); ``actions`` lists
    their API actions in order (``Action=`` of the Query protocol, else the ``X-Amz-Target`` operation).
    """

    def __init__(self, *, upstream: str, faults: list[Fault | None]) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = list(faults)
        self.requests = 0
        self.actions: list[str] = []
        self._lock = threading.Lock()
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                query = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
                target = self.headers.get("X-Amz-Target", "")
                action = (query.get("Action") or [target.rpartition(".")[2]])[0]
                with front._lock:
                    front.requests += 1
                    front.actions.append(action)
                    fault = front.faults.pop(0) if front.faults else None
                if fault is not None and not fault.applied:
                    headers, answer = fault.render(self.headers.get("Content-Type", ""))
                    self._answer(fault.status, headers, answer)
                    return
                forward = urllib.request.Request(
                    front.upstream + self.path,
                    data=body,
                    method="POST",
                    headers={k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")},
                )
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                try:
                    with opener.open(forward, timeout=10) as response:
                        status, headers, answer = response.status, dict(response.headers), response.read()
                except urllib.error.HTTPError as exc:
                    status, headers, answer = exc.code, dict(exc.headers), exc.read()
                if fault is not None:  # applied: carried out, and its answer replaced by the error
                    headers, answer = fault.render(self.headers.get("Content-Type", ""))
                    status = fault.status
                self._answer(status, headers, answer)

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultyFront:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class StrictImds:
    """IMDSv2 as EC2 serves it: ``PUT /latest/api/token`` (with a TTL header) gives a token; every
    ``GET`` needs a valid one (401 without). ``puts`` counts tokens issued; :meth:`revoke` invalidates
    them all (as an expired token would be); ``token_status`` (e.g. 403: metadata turned off)
    makes the token request fail."""

    def __init__(self, *, metadata: dict[str, str], token_status: int = 200) -> None:
        self.metadata = dict(metadata)
        self.token_status = token_status
        self.tokens: set[str] = set()
        self.puts = 0
        self.gets = 0
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # noqa: N802
                if self.path != "/latest/api/token":
                    return self._answer(404, "")
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._answer(400, "")
                if imds.token_status != 200:
                    return self._answer(imds.token_status, "")
                imds.puts += 1
                token = f"token-{imds.puts}"
                imds.tokens.add(token)
                return self._answer(200, token)

            def do_GET(self) -> None:  # noqa: N802
                imds.gets += 1
                if self.headers.get("X-aws-ec2-metadata-token") not in imds.tokens:
                    return self._answer(401, "")
                key = self.path.removeprefix("/latest/meta-data/")
                if key not in imds.metadata:
                    return self._answer(404, "")
                return self._answer(200, imds.metadata[key])

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def revoke(self) -> None:
        self.tokens.clear()

    def __enter__(self) -> StrictImds:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def blackhole() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (for read timeouts)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def closed_endpoint() -> str:
    """An endpoint where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}"
