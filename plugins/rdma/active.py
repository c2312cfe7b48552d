"""The EFA loopback check: every EFA device passes a libfabric ping-pong with itself.

What AWS documents as the EFA self-test (aws/aws-cdi-sdk ``INSTALL_GUIDE_LINUX.md``; the EC2 user
guide's "Get started with EFA"): ``fi_info -p efa -t FI_EP_RDM`` lists the EFA interfaces, one
``provider: efa`` block per device with its ``domain`` (``rdmap0s6-rdm``, older drivers
``efa_0-rdm``); the installer's ``efa_test.sh`` then runs ``fi_pingpong -p efa -e rdm`` as a server and
a client on localhost, which print a table (``bytes #sent #ack total time MB/sec usec/xfer
Mxfers/sec``). This check does the same, per device (``-d <domain>``), with the agent's process
runner (each run timed, its process group killed at the timeout).

Verdicts, one per device (``rdma:<device>``, the domain without ``-rdm``): OK when the client printed
at least one result row and exited 0; PROBLEM ``EfaLoopbackFailed`` when it ran and failed; UNKNOWN
when a tool is absent (``ToolMissing``), timed out (``Timeout``), fi_info lists no EFA device
(``NoEfaDevice``), or the output cannot be read. ``loopback: false`` only checks presence (fi_info):
OK ``EfaProviderPresent``, said so in the message. ``condition`` is None (a validation record).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.sdk import (
    CheckConfigError,
    CheckContext,
    CheckResult,
    CheckStatus,
    ConditionSpec,
    ProcessResult,
    parse_duration,
    tool_trouble,
    unknown,
)

GRACE = 30.0
_DOMAIN = re.compile(r"^\s*domain:\s*(\S+)\s*$", re.MULTILINE)
_ROW = re.compile(
    r"^\s*\d+(?:\.\d+)?[kmg]?\s+\d+(?:\.\d+)?[kmg]?\s+=?\d+(?:\.\d+)?[kmg]?\s+\S+\s+[0-9.]+s\s", re.MULTILINE
)


def efa_domains(text: str) -> tuple[str, ...]:
    """The RDM domains in ``fi_info -p efa -t FI_EP_RDM`` output (``rdmap0s6-rdm``), in order, once each."""
    seen: dict[str, None] = {}
    for domain in _DOMAIN.findall(text):
        if domain.endswith("-rdm"):
            seen.setdefault(domain)
    return tuple(seen)


def device_key(domain: str) -> str:
    return "rdma:" + domain.removesuffix("-rdm")


def pingpong_rows(text: str) -> int:
    """How many result rows a ``fi_pingpong`` table has."""
    return len(_ROW.findall(text))


def _seconds(options: Mapping[str, Any], key: str, default: str) -> float:
    try:
        value = parse_duration(options.get(key, default))
    except ValueError as exc:
        raise CheckConfigError(key, str(exc)) from None
    if value <= 0:
        raise CheckConfigError(key, "expected a positive duration")
    return value


class EfaLoopbackCheck:
    """fi_info for the EFA devices, then an fi_pingpong server/client pair on each. Options: loopback
    (true), fiInfo (fi_info), fiPingpong (fi_pingpong), commandTimeout (1m per run), startDelay (1s)."""

    interval: float | None = None
    conditions: tuple[ConditionSpec, ...] = ()

    def __init__(
        self,
        *,
        name: str,
        context: CheckContext,
        options: Mapping[str, Any],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        known = {"loopback", "fiInfo", "fiPingpong", "commandTimeout", "startDelay"}
        unknown_keys = sorted(set(options) - known)
        if unknown_keys:
            raise CheckConfigError(unknown_keys[0], f"unknown option (known: {', '.join(sorted(known))})")
        loopback = options.get("loopback", True)
        if not isinstance(loopback, bool):
            raise CheckConfigError("loopback", f"expected true or false, got {loopback!r}")
        self.name = name
        self._context = context
        self._loopback = loopback
        self._fi_info = str(options.get("fiInfo", "fi_info"))
        self._pingpong = str(options.get("fiPingpong", "fi_pingpong"))
        self.command_timeout = _seconds(options, "commandTimeout", "1m")
        self._delay = parse_duration(options.get("startDelay", "1s"))
        self._sleep = sleep
        self.timeout = 3 * self.command_timeout + GRACE  # fi_info, then the pairs (a first guess; config overrides)

    def run(self) -> list[CheckResult]:
        listed = self._context.run((self._fi_info, "-p", "efa", "-t", "FI_EP_RDM"), timeout=self.command_timeout)
        trouble = tool_trouble(listed)
        if trouble is not None:
            return [trouble]
        domains = efa_domains(listed.stdout)
        if not domains:
            return [unknown("NoEfaDevice", f"fi_info lists no EFA RDM interface ({listed.describe()})")]
        if not self._loopback:
            keys = tuple(device_key(d) for d in domains)
            text = f"EFA provider present on {', '.join(domains)} (presence only: option loopback is false)"
            return [
                CheckResult(
                    status=CheckStatus.OK, condition=None, reason="EfaProviderPresent", message=text, devices=keys
                )
            ]
        return [self._loop(domain) for domain in domains]

    def _loop(self, domain: str) -> CheckResult:
        """One server/client pair on ``domain``; the server runs in a thread while the client talks to it."""
        base = (self._pingpong, "-p", "efa", "-e", "rdm", "-d", domain)
        server: list[ProcessResult] = []
        thread = threading.Thread(
            target=lambda: server.append(self._context.run(base, timeout=self.command_timeout + self._delay)),
            name=f"fi_pingpong-server-{domain}",
            daemon=True,
        )
        thread.start()
        self._sleep(self._delay)
        client = self._context.run((*base, "localhost"), timeout=self.command_timeout)
        thread.join(self.command_timeout + self._delay + GRACE)
        return self._judge(domain, client, server[0] if server else None)

    @staticmethod
    def _judge(domain: str, client: ProcessResult, server: ProcessResult | None) -> CheckResult:
        key = (device_key(domain),)
        trouble = tool_trouble(client)
        if trouble is not None:
            return unknown(trouble.reason, f"{domain}: {trouble.message}", key)
        rows = pingpong_rows(client.stdout)
        if client.exit_code == 0 and rows:
            text = f"{domain}: fi_pingpong loopback passed ({rows} message sizes)"
            return CheckResult(
                status=CheckStatus.OK, condition=None, reason="EfaLoopbackPassed", message=text, devices=key
            )
        if client.exit_code == 0:
            return unknown("OutputUnparsable", f"{domain}: fi_pingpong exited 0 but printed no result row", key)
        side = f"; server: {server.describe()}" if server is not None and not server.ok else ""
        text = f"{domain}: fi_pingpong loopback failed: {client.describe()}{side}"
        return CheckResult(
            status=CheckStatus.PROBLEM, condition=None, reason="EfaLoopbackFailed", message=text, devices=key
        )
