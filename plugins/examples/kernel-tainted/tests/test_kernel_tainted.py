"""The example check on fixture /proc trees (run with the agent installed: pytest plugins/examples/kernel-tainted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nha_kernel_tainted import KernelTaintedCheck

from agent.sdk import CheckConfigError, CheckContext, CheckStatus


def make(tmp_path: Path, content: str | None, **options: object) -> KernelTaintedCheck:
    kernel = tmp_path / "sys" / "kernel"
    kernel.mkdir(parents=True)
    if content is not None:
        (kernel / "tainted").write_text(content)
    return KernelTaintedCheck(
        name="kernel-tainted", context=CheckContext(), options={"procRoot": str(tmp_path), **options}
    )


@pytest.mark.parametrize(
    ("content", "options", "status", "reason"),
    [
        ("0\n", {}, CheckStatus.OK, "KernelNotTainted"),
        ("4097\n", {}, CheckStatus.OK, "KernelNotTainted"),  # P + O: modules, not faults
        ("128\n", {}, CheckStatus.PROBLEM, "KernelTaintedByFault"),  # D
        ("16\n", {}, CheckStatus.PROBLEM, "KernelTaintedByFault"),  # M
        ("512\n", {}, CheckStatus.OK, "KernelNotTainted"),  # W is not a fault by default...
        ("512\n", {"problemBits": ["W"]}, CheckStatus.PROBLEM, "KernelTaintedByFault"),  # ...unless chosen
        ("garbage", {}, CheckStatus.UNKNOWN, "KernelTaintUnreadable"),
        (None, {}, CheckStatus.UNKNOWN, "KernelTaintUnreadable"),
    ],
    ids=["clean", "modules-only", "oops", "mce", "warning-default", "warning-chosen", "garbage", "missing"],
)
def test_verdicts(tmp_path, content, options, status, reason):
    [result] = make(tmp_path, content, **options).run()
    assert (result.status, result.reason, result.condition) == (status, reason, "KernelTainted")


def test_bad_option_names_the_option(tmp_path):
    with pytest.raises(CheckConfigError) as exc:
        make(tmp_path, "0", problemBits=["Q"])
    assert exc.value.field == "problemBits"
