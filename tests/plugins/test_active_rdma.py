"""The EFA loopback check, on AWS's documented fi_info / efa_test.sh outputs and a fake runner."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.checks.builtin import import_builtin
from agent.sdk import CheckConfigError, CheckContext, CheckStatus, ProcessResult

active = import_builtin("rdma.active")
EfaLoopbackCheck, device_key, efa_domains, pingpong_rows = (
    active.EfaLoopbackCheck,
    active.device_key,
    active.efa_domains,
    active.pingpong_rows,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "active"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text().split("---8<---\n", 1)[1]


FI_INFO = recorded("fi-info-efa-cdi-sdk.txt")
PINGPONG = recorded("fi-pingpong-efa-test-cdi-sdk.txt")
# Constructed from the EC2 user guide's p4d/p5 example (several provider blocks) and a DGRAM block as
# fi_info prints without -t: efa_0-rdm and efa_1-rdm count, efa_0-dgrm does not.
FI_INFO_TWO = (
    "provider: efa\n    fabric: EFA-fe80::c6e:8fff:fef6:e7ff\n    domain: efa_0-rdm\n    version: 111.0\n"
    "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\nprovider: efa\n    fabric: EFA-fe80::c6e:8fff:fef6:e7ff\n"
    "    domain: efa_0-dgrm\n    version: 111.0\n    type: FI_EP_DGRAM\n    protocol: FI_PROTO_EFA\n"
    "provider: efa\n    fabric: EFA-fe80::c34:3eff:feb2:3c35\n    domain: efa_1-rdm\n    version: 111.0\n"
    "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n"
)


class Runner:
    """A fake CheckContext.run_process (thread-safe: the server runs in a thread)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []
        self._lock = threading.Lock()

    def __call__(self, argv: Sequence[str], *, timeout: float, max_output: int = 0, path: str = "") -> ProcessResult:
        argv = tuple(argv)
        with self._lock:
            self.calls.append(argv)
        answer = self.answers.get(argv[0])
        if answer is None:
            return ProcessResult(argv=argv, exit_code=None, error=f"not found in PATH ({path})")
        return answer(argv) if callable(answer) else answer


def ran(stdout: str = "", *, exit_code: int = 0, **kw: Any) -> ProcessResult:
    return ProcessResult(argv=("tool",), exit_code=exit_code, stdout=stdout, **kw)


def pingpong(client: ProcessResult, server: ProcessResult | None = None):  # type: ignore[no-untyped-def]
    def answer(argv: tuple[str, ...]) -> ProcessResult:
        return client if argv[-1] == "localhost" else (server or ran(PINGPONG))

    return answer


def efa(runner: Runner, **options: Any) -> EfaLoopbackCheck:
    return EfaLoopbackCheck(
        name="efa-loopback", context=CheckContext(run_process=runner), options=options, sleep=lambda s: None
    )


def test_documented_outputs_are_read() -> None:
    assert efa_domains(FI_INFO) == ("rdmap0s6-rdm",)
    assert efa_domains(FI_INFO_TWO) == ("efa_0-rdm", "efa_1-rdm")
    assert device_key("rdmap0s6-rdm") == "rdma:rdmap0s6"
    assert pingpong_rows(PINGPONG) == 6
    assert pingpong_rows("Starting server...\nfi_getinfo(): -61 (No data available)\n") == 0


def test_each_device_passes_its_own_loopback() -> None:
    runner = Runner({"fi_info": ran(FI_INFO_TWO), "fi_pingpong": pingpong(ran(PINGPONG))})
    results = efa(runner).run()
    assert [(r.devices, r.status, r.reason) for r in results] == [
        (("rdma:efa_0",), CheckStatus.OK, "EfaLoopbackPassed"),
        (("rdma:efa_1",), CheckStatus.OK, "EfaLoopbackPassed"),
    ]
    assert runner.calls[0] == ("fi_info", "-p", "efa", "-t", "FI_EP_RDM")
    assert ("fi_pingpong", "-p", "efa", "-e", "rdm", "-d", "efa_1-rdm", "localhost") in runner.calls
    assert ("fi_pingpong", "-p", "efa", "-e", "rdm", "-d", "efa_1-rdm") in runner.calls  # its server


@pytest.mark.parametrize(
    ("answers", "status", "reason"),
    [
        ({}, CheckStatus.UNKNOWN, "ToolMissing"),
        ({"fi_info": ran("fi_getinfo: -61 (No data available)\n", exit_code=1)}, CheckStatus.UNKNOWN, "NoEfaDevice"),
        ({"fi_info": ran(FI_INFO)}, CheckStatus.UNKNOWN, "ToolMissing"),  # no fi_pingpong
        (
            {
                "fi_info": ran(FI_INFO),
                "fi_pingpong": pingpong(ProcessResult(argv=("fi_pingpong",), exit_code=-9, timed_out=True)),
            },
            CheckStatus.UNKNOWN,
            "Timeout",
        ),
        (
            {
                "fi_info": ran(FI_INFO),
                "fi_pingpong": pingpong(ran("fi_getinfo(): -61 (No data available)", exit_code=1)),
            },
            CheckStatus.PROBLEM,
            "EfaLoopbackFailed",
        ),
        ({"fi_info": ran(FI_INFO), "fi_pingpong": pingpong(ran("nothing"))}, CheckStatus.UNKNOWN, "OutputUnparsable"),
    ],
)
def test_verdicts(answers: dict[str, Any], status: CheckStatus, reason: str) -> None:
    (result,) = efa(Runner(answers)).run()
    assert (result.status, result.reason) == (status, reason)


def test_presence_only_says_so() -> None:
    runner = Runner({"fi_info": ran(FI_INFO)})
    (result,) = efa(runner, loopback=False).run()
    assert (result.status, result.reason, result.devices) == (CheckStatus.OK, "EfaProviderPresent", ("rdma:rdmap0s6",))
    assert "presence only" in result.message
    assert runner.calls == [("fi_info", "-p", "efa", "-t", "FI_EP_RDM")]


@pytest.mark.parametrize(("options", "field"), [({"loopback": "yes"}, "loopback"), ({"x": 1}, "x")])
def test_bad_options_name_the_option(options: dict[str, Any], field: str) -> None:
    with pytest.raises(CheckConfigError) as caught:
        efa(Runner({}), **options)
    assert caught.value.field == field
