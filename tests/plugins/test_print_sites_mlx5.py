"""The mlx5 print-site pack (plugins/kernel/generate_mlx5.py, sites-mlx5.yaml): sites render as the driver
prints them, a failure the driver prints is one MLX5Error Event, and what a healthy or merely refused
request prints (a report's detail record, a configuration refusal, a module EEPROM read) is none.

tests/plugins/test_print_sites.py checks the pack against its extract and counts its coverage.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import RuleEngine

PLUGINS = builtin_plugins_dir()
sys.path.insert(0, str(PLUGINS / "kernel"))
import printsites  # noqa: E402

sys.path.remove(str(PLUGINS / "kernel"))

GEN = printsites.load_generator(PLUGINS / "kernel" / "generate_mlx5.py")
SITES = {s.where: s for s in printsites.read_extract(Path(GEN.EXTRACT).read_text())}
RULES = load_rule_set([PLUGINS])
CORE = "drivers/net/ethernet/mellanox/mlx5/core"


def _findings(line: str) -> list[tuple[str, str]]:
    return [(f.rule, f.reason) for f in RuleEngine(rule_set=RULES).feed([line], times=0.0, line_numbers=1)]


def test_an_mlx5_core_err_site_renders_with_the_device_function_line_and_pid() -> None:
    (line,) = printsites.render(SITES[f"{CORE}/main.c:1215"], driver=GEN.DRIVER)
    assert line == "mlx5_core 0000:3b:00.0: x:3:(pid 3): init hca failed"


def test_an_mlx5_ib_err_site_renders_on_the_ib_device() -> None:
    (line,) = printsites.render(SITES["drivers/infiniband/hw/mlx5/qp.c:3039"], driver=GEN.DRIVER)
    assert line == "infiniband x: x:3:(pid 3): Create QP type 3 failed"


FAILURES = [
    "mlx5_core 0000:3b:00.0: mlx5_function_open:1217:(pid 812): init hca failed",
    "mlx5_core.sf mlx5_core.sf.2: mlx5_function_open:1217:(pid 812): init hca failed",
    "infiniband mlx5_0: create_qp:3087:(pid 4242): Create QP type 8 failed",
    "infiniband rocep59s0f0: create_qp:3087:(pid 4242): Create QP type 8 failed",
    "mlx5_core 0000:3b:00.0 enp59s0f0np0: TX timeout detected",
    "mlx5_core 0000:3b:00.0 enp59s0f0np0: Error cqe on cqn 0x40a, ci 0x1b2, qn 0x10c7, opcode 0xd, "
    "syndrome 0x2, vendor syndrome 0x68",
    "mlx5_core 0000:3b:00.0: print_health_info:441:(pid 0): Health issue observed, firmware internal error, "
    "severity(3) ERROR:",
]


@pytest.mark.parametrize("line", FAILURES)
def test_a_failure_the_driver_prints_is_one_mlx5_error_event(line: str) -> None:
    got = _findings(line)
    assert len(got) == 1 and got[0][0].startswith("mlx5/sites-") and got[0][1] == "MLX5Error", got


QUIET = [
    # print_health_info's health buffer, after its "Health issue observed" header (the finding)
    "mlx5_core 0000:3b:00.0: print_health_info:445:(pid 0): assert_var[0] 0x00000000",
    "mlx5_core 0000:3b:00.0: print_health_info:453:(pid 0): hw_id 0x0000020d",
    # a configuration refusal: the operator's ethtool command fails, the node is fine
    "mlx5_core 0000:3b:00.0 enp59s0f0np0: mlx5e_ethtool_set_channels: HTB offload is active, cannot change "
    "the number of channels",
    "mlx5_core 0000:3b:00.0 enp59s0f0np0: mlx5e_dcbnl_setpgtccfgtx, priority is out of range",
    # a module EEPROM read an empty cage cannot answer
    "mlx5_core 0000:3b:00.0: mlx5_query_mcia:399:(pid 48211): query_mcia_reg failed: status: 0x3",
]


@pytest.mark.parametrize("line", QUIET)
def test_a_detail_record_a_refusal_or_a_healthy_print_is_no_event(line: str) -> None:
    assert _findings(line) == []


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("mlx5_core 0000:3b:00.0: poll_health:836:(pid 0): Fatal error 1 detected", "kernel/mlx5-fatal-error"),
        (
            "mlx5_core 0000:3b:00.0: mlx5_health_try_recover:355:(pid 1203): health recovery failed",
            "kernel/mlx5-health-recovery-failed",
        ),
    ],
)
def test_a_line_network_yaml_speaks_for_is_reported_once_by_it(line: str, rule: str) -> None:
    assert [r for r, _ in _findings(line)] == [rule]


@pytest.mark.parametrize(
    "line",
    [
        "mlx4_core 0000:3b:00.0: init hca failed",
        "ice 0000:3b:00.0 ens1f0: TX timeout detected",
        "bnxt_en 0000:3b:00.0 ens1f0: Error cqe on cqn 0x40a, ci 0x1b2, qn 0x10c7, opcode 0xd, syndrome 0x2, "
        "vendor syndrome 0x68",
    ],
)
def test_the_same_words_from_another_driver_are_not_mlx5s(line: str) -> None:
    """The rules for dev_*/netdev_* sites require the mlx5_core device prefix: another NIC's line with
    the same text is not this driver's failure."""
    assert not [r for r, _ in _findings(line) if r.startswith("mlx5/")]


def test_the_scanner_reads_a_literal_continued_over_a_backslash_newline(tmp_path: Path) -> None:
    (tmp_path / "x.c").write_text('void f(void) {\n\tpr_err("rate limit(err %d): \\\n\t rate %u\\n", e, r);\n}\n')
    (site,) = printsites.extract(tmp_path, printsites.Spec(name="t", paths=["*.c"]))
    assert site.text == "rate limit(err %d): \t rate %u\\n"
