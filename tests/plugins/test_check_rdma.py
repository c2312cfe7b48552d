"""The ib-ports check (plugins/rdma): RDMA ports present, up, fast enough, not dropping or flapping.

Every scenario runs against a sysfs tree written under tmp_path by ``write_sysfs`` from a table of
ports, with an injected clock. The tree is synthetic, in the kernel's formats (reference §3.1):
two ConnectX HDR ports (``200 Gb/sec (4X HDR)``) and one EFA device under its udev name
``rdmap0s31`` (EFA reports ACTIVE / LinkUp / ``100 Gb/sec (4X EDR)`` and link layer ``Unknown``).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml

from agent.checks.builtin import import_builtin
from agent.checks.model import Check, CheckConfigError, CheckContext, CheckResult, CheckStatus
from agent.core.types import Severity

from helpers import REPO

checks = import_builtin("rdma.checks")
sysfs = import_builtin("rdma.sysfs")

PLUGIN_DIR = REPO / "plugins" / "rdma"

OK, PROBLEM, UNKNOWN = CheckStatus.OK, CheckStatus.PROBLEM, CheckStatus.UNKNOWN


# --------------------------------------------------------------------------------------------------
# Fixture tree


@dataclass(frozen=True, kw_only=True)
class Port:
    """One port directory; a value of ``DIR`` makes that attribute a directory (unreadable as a file)."""

    device: str
    port: int = 1
    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = "200 Gb/sec (4X HDR)"
    link_layer: str = "InfiniBand"
    counters: Mapping[str, object] = field(default_factory=dict)
    hw_counters: Mapping[str, object] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.device}:{self.port}"


DIR = object()  # marker: write a directory where the file should be (reads fail with EISDIR)

PMA = {
    "symbol_error": 0,
    "link_error_recovery": 0,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "port_xmit_discards": 0,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
    "port_rcv_data": 123456789,
}
MLX5_HW = {"rnr_nak_retry_err": 0, "out_of_buffer": 0}
EFA_HW = {"tx_pkts": 1000, "rx_drops": 0, "retrans_pkts": 0, "unresponsive_remote_events": 0, "lifespan": 12}

HEALTHY: tuple[Port, ...] = (
    Port(device="mlx5_0", counters=PMA, hw_counters=MLX5_HW),
    Port(device="mlx5_1", counters=PMA, hw_counters=MLX5_HW),
    Port(device="rdmap0s31", rate="100 Gb/sec (4X EDR)", link_layer="Unknown", hw_counters=EFA_HW),
)


def _write(path: Path, value: object) -> None:
    if value is DIR:
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.write_text(f"{value}\n")


def write_sysfs(sys_root: Path, ports: Iterable[Port]) -> Path:
    """(Re)write ``<sys_root>/class/infiniband`` to hold exactly ``ports``; returns ``sys_root``."""
    base = sysfs.class_dir(sys_root)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    for p in ports:
        port_dir = base / p.device / "ports" / str(p.port)
        port_dir.mkdir(parents=True, exist_ok=True)
        for name in ("state", "phys_state", "rate", "link_layer"):
            _write(port_dir / name, getattr(p, name))
        for group, values in (("counters", p.counters), ("hw_counters", p.hw_counters)):
            if values:
                (port_dir / group).mkdir()
                for name, value in values.items():
                    _write(port_dir / group / name, value)
    return sys_root


def changed(ports: Sequence[Port], key: str, **changes: object) -> tuple[Port, ...]:
    """``ports`` with the port ``key`` (``mlx5_1:1``) changed."""
    assert any(p.key == key for p in ports), key
    return tuple(replace(p, **changes) if p.key == key else p for p in ports)


def down(ports: Sequence[Port], key: str) -> tuple[Port, ...]:
    return changed(ports, key, state="1: DOWN", phys_state="2: Polling")


def counters(ports: Sequence[Port], key: str, **values: int) -> tuple[Port, ...]:
    port = next(p for p in ports if p.key == key)
    return changed(ports, key, counters={**port.counters, **values})


def without(ports: Sequence[Port], device: str) -> tuple[Port, ...]:
    return tuple(p for p in ports if p.device != device)


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.start = self.now = now

    def __call__(self) -> float:
        return self.now

    def at(self, offset: float) -> None:
        self.now = self.start + offset


@dataclass
class Rig:
    root: Path
    clock: Clock
    check: Check

    def run(self, at: float, ports: Sequence[Port]) -> list[CheckResult]:
        write_sysfs(self.root, ports)
        self.clock.at(at)
        return list(self.check.run())


def make_rig(tmp_path: Path, options: Mapping[str, object] | None = None) -> Rig:
    clock = Clock()
    context = CheckContext(sys_root=tmp_path, clock=clock, state_dir=tmp_path / "state")
    return Rig(
        root=tmp_path, clock=clock, check=checks.IbPortsCheck(name="ib-ports", context=context, options=options or {})
    )


def verdict(results: Sequence[CheckResult]) -> CheckResult:
    (result,) = [r for r in results if r.condition == "IbDev"]
    return result


def warnings(results: Sequence[CheckResult]) -> dict[str, CheckResult]:
    return {r.reason: r for r in results if r.condition is None}


# --------------------------------------------------------------------------------------------------
# Scenarios: (seconds since start, ports) steps, each with the IbDev verdict expected after it

HDR_DOWN = down(HEALTHY, "mlx5_1:1")

SCENARIOS = {
    "healthy": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, HEALTHY, OK, "IbDevGood"),
    ],
    "a port down briefly does not flip the condition": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, HDR_DOWN, OK, "IbDevGood"),
        (60, HDR_DOWN, OK, "IbDevGood"),
        (90, HEALTHY, OK, "IbDevGood"),
        (120, HEALTHY, OK, "IbDevGood"),
    ],
    "down for 4m is a drop, which clears 10m after the port is back": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, HDR_DOWN, OK, "IbDevGood"),
        (240, HDR_DOWN, OK, "IbDevGood"),  # 3m30s down
        (269, HDR_DOWN, OK, "IbDevGood"),  # 3m59s down
        (270, HDR_DOWN, PROBLEM, "IbPortDrop"),  # 4m down
        (300, HEALTHY, PROBLEM, "IbPortDrop"),  # up again: stays until 10m without trouble
        (899, HEALTHY, PROBLEM, "IbPortDrop"),
        (900, HEALTHY, OK, "IbDevGood"),
    ],
    "a port down again during the quiet window restarts it": [
        (0, HDR_DOWN, OK, "IbDevGood"),
        (240, HDR_DOWN, PROBLEM, "IbPortDrop"),
        (270, HEALTHY, PROBLEM, "IbPortDrop"),
        (600, HDR_DOWN, PROBLEM, "IbPortDrop"),  # latched drop; down again
        (630, HEALTHY, PROBLEM, "IbPortDrop"),
        (1229, HEALTHY, PROBLEM, "IbPortDrop"),
        (1230, HEALTHY, OK, "IbDevGood"),
    ],
    "three down/up cycles are a flap, which clears after 10m quiet": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, HDR_DOWN, OK, "IbDevGood"),
        (60, HEALTHY, OK, "IbDevGood"),  # cycle 1
        (90, HDR_DOWN, OK, "IbDevGood"),
        (120, HEALTHY, OK, "IbDevGood"),  # cycle 2
        (150, HDR_DOWN, OK, "IbDevGood"),
        (180, HEALTHY, PROBLEM, "IbPortFlapping"),  # cycle 3
        (779, HEALTHY, PROBLEM, "IbPortFlapping"),
        (780, HEALTHY, OK, "IbDevGood"),
    ],
    "three cycles spread over more than the flap window are not a flap": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, HDR_DOWN, OK, "IbDevGood"),
        (60, HEALTHY, OK, "IbDevGood"),
        (330, HDR_DOWN, OK, "IbDevGood"),
        (360, HEALTHY, OK, "IbDevGood"),
        (630, HDR_DOWN, OK, "IbDevGood"),
        (660, HEALTHY, OK, "IbDevGood"),  # the first cycle (60) left the 10m window at 660
    ],
    "bounces between samples counted by link_downed make a flap": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, counters(HEALTHY, "mlx5_0:1", link_downed=1), OK, "IbDevGood"),
        (60, counters(HEALTHY, "mlx5_0:1", link_downed=3), PROBLEM, "IbPortFlapping"),
    ],
    "a drop that is also flapping reports the drop": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, HDR_DOWN, OK, "IbDevGood"),
        (60, HEALTHY, OK, "IbDevGood"),
        (90, HDR_DOWN, OK, "IbDevGood"),
        (120, HEALTHY, OK, "IbDevGood"),
        (150, HDR_DOWN, OK, "IbDevGood"),
        (180, HEALTHY, PROBLEM, "IbPortFlapping"),
        (210, HDR_DOWN, PROBLEM, "IbPortFlapping"),
        (450, HDR_DOWN, PROBLEM, "IbPortDrop"),
    ],
    "a device seen earlier that vanishes is missing after dropAfter": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, without(HEALTHY, "mlx5_1"), OK, "IbDevGood"),
        (269, without(HEALTHY, "mlx5_1"), OK, "IbDevGood"),
        (270, without(HEALTHY, "mlx5_1"), PROBLEM, "IbDeviceMissing"),
        (300, HEALTHY, PROBLEM, "IbPortDrop"),  # back: the drop stays for the quiet window
        (900, HEALTHY, OK, "IbDevGood"),
    ],
    "the whole class directory vanishing after devices were seen": [
        (0, HEALTHY, OK, "IbDevGood"),
        (30, (), OK, "IbDevGood"),
        (270, (), PROBLEM, "IbDeviceMissing"),
    ],
}


@pytest.mark.parametrize("steps", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_scenarios(tmp_path: Path, steps: list) -> None:
    rig = make_rig(tmp_path)
    for at, ports, status, reason in steps:
        result = verdict(rig.run(at, ports))
        assert (at, result.status, result.reason) == (at, status, reason), result.message


def test_a_short_down_is_noted_in_the_ok_message(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.run(0, HEALTHY)
    rig.run(30, HDR_DOWN)
    result = verdict(rig.run(90, HDR_DOWN))
    assert result.message == (
        "2 of 3 RDMA ports active: mlx5_0:1 200 Gb/s, rdmap0s31:1 100 Gb/s; "
        "mlx5_1:1 down for 1m (state 1: DOWN, phys_state 2: Polling; a drop after 4m)"
    )


def test_drop_and_flap_messages(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.run(0, HDR_DOWN)
    dropped = verdict(rig.run(240, HDR_DOWN))
    assert dropped.severity is Severity.CRITICAL
    assert dropped.message == "mlx5_1:1 down for 4m (state 1: DOWN, phys_state 2: Polling)"
    back = verdict(rig.run(270, HEALTHY))
    assert back.message == "mlx5_1:1 was down for 4m or more, up again; clears after 10m without trouble"

    rig = make_rig(tmp_path)
    for at in (0, 60, 120):
        rig.run(at, HEALTHY)
        rig.run(at + 30, HDR_DOWN)
    flapping = verdict(rig.run(180, HEALTHY))
    assert flapping.severity is Severity.ERROR
    assert flapping.message == (
        "mlx5_1:1 went down and up 3 times within 10m (limit 3); clears after 10m without trouble"
    )


def test_a_flap_that_aged_out_of_the_window_still_says_why_until_it_clears(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, {"clearAfter": "20m"})
    rig.run(0, HEALTHY)
    rig.run(30, counters(HEALTHY, "mlx5_0:1", link_downed=3))
    late = verdict(rig.run(630, counters(HEALTHY, "mlx5_0:1", link_downed=3)))  # the 3 cycles (at 30) left the window
    assert (late.reason, late.message) == (
        "IbPortFlapping",
        "mlx5_0:1 was flapping (3 or more down/up cycles within 10m); clears after 20m without trouble",
    )


def test_a_single_cycle_is_noted(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.run(0, HEALTHY)
    result = verdict(rig.run(30, counters(HEALTHY, "mlx5_0:1", link_downed=1)))
    assert result.message.endswith("; mlx5_0:1 went down and up once within 10m")


def test_vanished_ports_are_forgotten_without_remember_ports(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, {"rememberPorts": False})
    rig.run(0, HEALTHY)
    result = verdict(rig.run(600, without(HEALTHY, "mlx5_1")))
    assert (result.status, result.message) == (OK, "2 of 2 RDMA ports active: mlx5_0:1 200 Gb/s, rdmap0s31:1 100 Gb/s")


def test_a_vanished_port_is_noted_before_it_counts_as_missing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.run(0, HEALTHY)
    rig.run(30, without(HEALTHY, "mlx5_1"))
    result = verdict(rig.run(90, without(HEALTHY, "mlx5_1")))
    assert result.message.endswith("; mlx5_1:1 gone for 1m (present earlier; missing after 4m)")
    missing = verdict(rig.run(270, without(HEALTHY, "mlx5_1")))
    assert (missing.severity, missing.message) == (Severity.CRITICAL, "mlx5_1:1 gone for 4m (present earlier)")


def test_options_change_the_drop_and_flap_rules(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, {"dropAfter": "1m", "flapCount": 2, "flapWindow": "5m", "clearAfter": "2m"})
    assert verdict(rig.run(0, HDR_DOWN)).status is OK
    assert verdict(rig.run(60, HDR_DOWN)).reason == "IbPortDrop"
    assert verdict(rig.run(90, HEALTHY)).reason == "IbPortDrop"
    assert verdict(rig.run(210, HEALTHY)).reason == "IbDevGood"
    rig.run(240, HDR_DOWN)
    assert verdict(rig.run(270, HEALTHY)).reason == "IbDevGood"  # one cycle
    rig.run(300, HDR_DOWN)
    assert verdict(rig.run(330, HEALTHY)).reason == "IbPortFlapping"  # two cycles


# --------------------------------------------------------------------------------------------------
# Presence, rate, applicability

PRESENCE = {
    "all expected ports present": (
        {"expectedDevices": ["mlx5_0:1", "mlx5_1:1", "rdmap0s31"]},
        HEALTHY,
        OK,
        "IbDevGood",
        "3 of 3 RDMA ports active: mlx5_0:1 200 Gb/s, mlx5_1:1 200 Gb/s, rdmap0s31:1 100 Gb/s",
    ),
    "an expected port missing": (
        {"expectedDevices": ["mlx5_0:1", "mlx5_1:1", "mlx5_1:2", "mlx5_2"]},
        HEALTHY,
        PROBLEM,
        "IbDeviceMissing",
        "missing mlx5_1:2, mlx5_2",
    ),
    "fewer ports than expectedPorts": (
        {"expectedPorts": 4},
        HEALTHY,
        PROBLEM,
        "IbDeviceMissing",
        "3 RDMA ports present, expected at least 4",
    ),
    "expected, but no RDMA driver": (
        {"expectedDevices": ["mlx5_0:1"]},
        None,
        PROBLEM,
        "IbDeviceMissing",
        "{root}/class/infiniband does not exist (RDMA driver not loaded?); expected mlx5_0:1",
    ),
    "expected count, but no RDMA driver": (
        {"expectedPorts": 8},
        None,
        PROBLEM,
        "IbDeviceMissing",
        "{root}/class/infiniband does not exist (RDMA driver not loaded?); expected at least 8 ports",
    ),
    "nothing expected and no RDMA driver": (
        {},
        None,
        OK,
        "NoRdmaDevices",
        "no RDMA devices on this node ({root}/class/infiniband does not exist) and none expected",
    ),
    "nothing expected and an empty class directory": (
        {},
        (),
        OK,
        "NoRdmaDevices",
        "no RDMA ports on this node match devices ['*'] and none expected",
    ),
    "filters leave nothing": (
        {"devices": ["bnxt_*"]},
        HEALTHY,
        OK,
        "NoRdmaDevices",
        "no RDMA ports on this node match devices ['bnxt_*'] and none expected",
    ),
    "filters select devices and ports": (
        {"devices": ["mlx5_*", "rdmap*"], "excludeDevices": ["mlx5_1:1"]},
        HEALTHY,
        OK,
        "IbDevGood",
        "2 of 2 RDMA ports active: mlx5_0:1 200 Gb/s, rdmap0s31:1 100 Gb/s",
    ),
    "an expected device is watched even when filtered out": (
        {"devices": ["rdmap*"], "expectedDevices": ["mlx5_1"]},
        HDR_DOWN,
        OK,
        "IbDevGood",
        "1 of 2 RDMA ports active: rdmap0s31:1 100 Gb/s; "
        "mlx5_1:1 down (state 1: DOWN, phys_state 2: Polling; a drop after 4m)",
    ),
    "a disabled port is not watched": (
        {},
        HEALTHY + (Port(device="mlx5_1", port=2, state="1: DOWN", phys_state="3: Disabled"),),
        OK,
        "IbDevGood",
        "3 of 3 RDMA ports active: mlx5_0:1 200 Gb/s, mlx5_1:1 200 Gb/s, rdmap0s31:1 100 Gb/s; "
        "mlx5_1:2 disabled, not watched",
    ),
    "only disabled ports": (
        {},
        (Port(device="mlx5_0", state="1: DOWN", phys_state="3: Disabled"),),
        OK,
        "NoRdmaDevices",
        "no RDMA port in use and none expected: mlx5_0:1 disabled, not watched",
    ),
    "an HDR port trained at EDR": (
        {"minRateGbps": 200, "devices": ["mlx5_*"]},
        changed(HEALTHY, "mlx5_1:1", rate="100 Gb/sec (4X EDR)"),
        PROBLEM,
        "IbRateLow",
        "mlx5_1:1 at 100 Gb/s (4X EDR), below 200 Gb/s",
    ),
    "a 2X-wide HDR link": (
        {"minRateGbps": 200, "devices": ["mlx5_*"]},
        changed(HEALTHY, "mlx5_0:1", rate="100 Gb/sec (2X HDR)"),
        PROBLEM,
        "IbRateLow",
        "mlx5_0:1 at 100 Gb/s (2X HDR), below 200 Gb/s",
    ),
    "rate at the minimum": (
        {"minRateGbps": 100},
        HEALTHY,
        OK,
        "IbDevGood",
        "3 of 3 RDMA ports active: mlx5_0:1 200 Gb/s, mlx5_1:1 200 Gb/s, rdmap0s31:1 100 Gb/s",
    ),
    "the rate of a down port is not judged": (
        {"minRateGbps": 200, "devices": ["mlx5_*"]},
        changed(HDR_DOWN, "mlx5_1:1", rate="10 Gb/sec (4X SDR)"),
        OK,
        "IbDevGood",
        "1 of 2 RDMA ports active: mlx5_0:1 200 Gb/s; "
        "mlx5_1:1 down (state 1: DOWN, phys_state 2: Polling; a drop after 4m)",
    ),
    "missing wins over a low rate, both are named": (
        {"minRateGbps": 200, "expectedDevices": ["mlx5_2:1"]},
        HEALTHY,
        PROBLEM,
        "IbDeviceMissing",
        "missing mlx5_2:1; rdmap0s31:1 at 100 Gb/s (4X EDR), below 200 Gb/s",
    ),
}


@pytest.mark.parametrize(("options", "ports", "status", "reason", "message"), PRESENCE.values(), ids=PRESENCE.keys())
def test_presence_rate_and_applicability(
    tmp_path: Path, options: dict, ports: tuple[Port, ...] | None, status: CheckStatus, reason: str, message: str
) -> None:
    rig = make_rig(tmp_path, options)
    if ports is not None:
        write_sysfs(tmp_path, ports)
    result = verdict(rig.check.run())
    assert (result.status, result.reason, result.message) == (status, reason, message.format(root=tmp_path))


def test_severities(tmp_path: Path) -> None:
    missing = verdict(make_rig(tmp_path, {"expectedDevices": ["mlx5_9"]}).run(0, HEALTHY))
    slow = verdict(make_rig(tmp_path, {"minRateGbps": 400}).run(0, HEALTHY))
    assert (missing.severity, slow.severity) == (Severity.CRITICAL, Severity.ERROR)


def test_this_machine_is_never_a_problem() -> None:
    """``check --json`` on a machine without RDMA hardware: not applicable, never PROBLEM."""
    if sysfs.class_dir(Path("/sys")).exists():
        pytest.skip("this machine has RDMA devices")
    check = checks.IbPortsCheck(name="ib-ports", context=CheckContext(), options={})
    results = check.run()
    assert [(r.status, r.reason) for r in results] == [(OK, "NoRdmaDevices")]


# --------------------------------------------------------------------------------------------------
# Unreadable and garbage files

BROKEN = {
    "state is garbage": (
        changed(HEALTHY, "mlx5_1:1", state="banana"),
        {},
        UNKNOWN,
        "IbPortUnreadable",
        "cannot judge mlx5_1:1: {port}/state: expected '<number>: <NAME>' (e.g. '4: ACTIVE'), got 'banana'",
    ),
    "phys_state is empty": (
        changed(HEALTHY, "mlx5_1:1", phys_state=""),
        {},
        UNKNOWN,
        "IbPortUnreadable",
        "cannot judge mlx5_1:1: {port}/phys_state: expected '<number>: <Name>' (e.g. '5: LinkUp'), got ''",
    ),
    "state cannot be read": (
        changed(HEALTHY, "mlx5_1:1", state=DIR),
        {},
        UNKNOWN,
        "IbPortUnreadable",
        "cannot judge mlx5_1:1: {port}/state: cannot read (Is a directory)",
    ),
    "rate is garbage and a minimum is set": (
        changed(HEALTHY, "mlx5_1:1", rate="fast"),
        {"minRateGbps": 100},
        UNKNOWN,
        "IbPortUnreadable",
        "cannot judge the rate of mlx5_1:1: {port}/rate: expected '<n> Gb/sec (<w>X <SPEED>)' "
        "(e.g. '200 Gb/sec (4X HDR)'), got 'fast'",
    ),
    "rate is garbage and no minimum is set": (
        changed(HEALTHY, "mlx5_1:1", rate="fast"),
        {},
        OK,
        "IbDevGood",
        "3 of 3 RDMA ports active: mlx5_0:1 200 Gb/s, mlx5_1:1, rdmap0s31:1 100 Gb/s",
    ),
    "a problem elsewhere wins over an unreadable port": (
        changed(HEALTHY, "mlx5_1:1", state="banana"),
        {"expectedDevices": ["mlx5_2:1"]},
        PROBLEM,
        "IbDeviceMissing",
        "missing mlx5_2:1; cannot judge mlx5_1:1: {port}/state: expected '<number>: <NAME>' "
        "(e.g. '4: ACTIVE'), got 'banana'",
    ),
}


@pytest.mark.parametrize(("ports", "options", "status", "reason", "message"), BROKEN.values(), ids=BROKEN.keys())
def test_unreadable_and_garbage_files(
    tmp_path: Path, ports: tuple[Port, ...], options: dict, status: CheckStatus, reason: str, message: str
) -> None:
    rig = make_rig(tmp_path, options)
    result = verdict(rig.run(0, ports))
    port_dir = sysfs.class_dir(tmp_path) / "mlx5_1" / "ports" / "1"
    assert (result.status, result.reason, result.message) == (status, reason, message.format(port=port_dir))


def test_an_unreadable_sample_neither_advances_nor_clears_the_drop(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.run(0, HDR_DOWN)
    assert verdict(rig.run(240, HDR_DOWN)).reason == "IbPortDrop"
    garbage = changed(HEALTHY, "mlx5_1:1", state="banana")
    assert verdict(rig.run(1000, garbage)).reason == "IbPortDrop"  # still latched, still down as last seen
    assert verdict(rig.run(1030, HEALTHY)).reason == "IbPortDrop"  # up again now: 10m quiet from here
    assert verdict(rig.run(1630, HEALTHY)).reason == "IbDevGood"


def test_the_class_directory_unlistable_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    sysfs.class_dir(tmp_path).write_text("not a directory")
    result = verdict(make_rig(tmp_path).check.run())
    assert (result.status, result.reason) == (UNKNOWN, "IbPortUnreadable")
    assert result.message == f"cannot list {sysfs.class_dir(tmp_path)}: Not a directory"


# --------------------------------------------------------------------------------------------------
# Error counters: warnings, never the condition

COUNTER_STEPS = {
    "no increase": ([(0, {}), (30, {})], None),
    "link_downed +1 (any increase)": (
        [(0, {}), (30, {"link_downed": 1})],
        "mlx5_0:1 link_downed +1 in 30s (any increase)",
    ),
    "excessive_buffer_overrun_errors +1": (
        [(0, {}), (30, {"excessive_buffer_overrun_errors": 1})],
        "mlx5_0:1 excessive_buffer_overrun_errors +1 in 30s (any increase)",
    ),
    "local_link_integrity_errors +2": (
        [(0, {}), (30, {"local_link_integrity_errors": 2})],
        "mlx5_0:1 local_link_integrity_errors +2 in 30s (any increase)",
    ),
    "symbol_error 120 within the hour is allowed": (
        [(0, {}), (1800, {"symbol_error": 60}), (3600, {"symbol_error": 120})],
        None,
    ),
    "symbol_error 121 within the hour": (
        [(0, {}), (1800, {"symbol_error": 60}), (3600, {"symbol_error": 121})],
        "mlx5_0:1 symbol_error +121 in 1h (more than 120 per 1h)",
    ),
    "symbol_error older than the hour is forgotten": (
        [(0, {}), (60, {"symbol_error": 100}), (3700, {"symbol_error": 200})],
        None,
    ),
    "port_rcv_errors at 10/s is allowed": ([(0, {}), (30, {"port_rcv_errors": 300})], None),
    "port_rcv_errors above 10/s": (
        [(0, {}), (30, {"port_rcv_errors": 330})],
        "mlx5_0:1 port_rcv_errors +11 in 30s (more than 10 per 1s)",
    ),
    "a counter reset (driver reload) starts over": (
        [(0, {"symbol_error": 5000}), (30, {"symbol_error": 3})],
        None,
    ),
}


@pytest.mark.parametrize(("steps", "expected"), COUNTER_STEPS.values(), ids=COUNTER_STEPS.keys())
def test_counter_thresholds_are_warnings(tmp_path: Path, steps: list, expected: str | None) -> None:
    rig = make_rig(tmp_path, {"counterThresholds": {"link_downed": {"max": 0}}})
    results: list[CheckResult] = []
    for at, values in steps:
        results = rig.run(at, counters(HEALTHY, "mlx5_0:1", **values))
    found = warnings(results).get("IbCounterErrors")
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert (found.status, found.severity) == (PROBLEM, Severity.WARNING)
        assert found.message == f"RDMA error counters above their thresholds: {expected}"


def test_efa_counters_use_their_own_thresholds(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.run(0, HEALTHY)
    efa = changed(HEALTHY, "rdmap0s31:1", hw_counters={**EFA_HW, "unresponsive_remote_events": 161, "rx_drops": 900})
    found = warnings(rig.run(60, efa))["IbCounterErrors"]
    assert found.message == (
        "RDMA error counters above their thresholds: rdmap0s31:1 unresponsive_remote_events +161 in 1m "
        "(more than 160 per 1m)"
    )


def test_counter_thresholds_can_be_replaced_and_removed(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, {"counterThresholds": {"link_downed": None, "port_rcv_data": {"max": 10, "window": "1m"}}})
    rig.run(0, HEALTHY)
    results = rig.run(30, counters(HEALTHY, "mlx5_0:1", link_downed=1, port_rcv_data=123456800))
    assert warnings(results)["IbCounterErrors"].message == (
        "RDMA error counters above their thresholds: mlx5_0:1 port_rcv_data +11 in 30s (more than 10 per 1m)"
    )


def test_counter_warnings_do_not_touch_the_condition(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.run(0, HEALTHY)
    results = rig.run(30, counters(HEALTHY, "mlx5_0:1", symbol_error=10_000, excessive_buffer_overrun_errors=3))
    assert verdict(results).status is OK
    assert warnings(results)["IbCounterErrors"].message == (
        "RDMA error counters above their thresholds: "
        "mlx5_0:1 excessive_buffer_overrun_errors +3 in 30s (any increase), "
        "mlx5_0:1 symbol_error +10000 in 30s (more than 120 per 1h)"
    )


def test_an_unreadable_counter_is_an_unknown_warning(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    results = rig.run(0, counters(HEALTHY, "mlx5_1:1", symbol_error="lots"))
    assert verdict(results).status is OK
    found = warnings(results)["IbCountersUnreadable"]
    path = sysfs.class_dir(tmp_path) / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error"
    assert (found.status, found.message) == (
        UNKNOWN,
        f"cannot read RDMA counters: {path}: expected a decimal counter, got 'lots'",
    )


# --------------------------------------------------------------------------------------------------
# Metrics


def test_values_for_metrics(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    result = verdict(rig.run(0, HDR_DOWN))
    values = {(v.name, tuple(sorted(v.labels.items()))): v.value for v in result.values}
    assert values[("rdma_port_active", (("device", "mlx5_0"), ("port", "1")))] == 1.0
    assert values[("rdma_port_active", (("device", "mlx5_1"), ("port", "1")))] == 0.0
    assert values[("rdma_port_rate_gbps", (("device", "rdmap0s31"), ("port", "1")))] == 100.0
    counter_names = {dict(labels)["counter"] for name, labels in values if name == "rdma_port_counter"}
    assert counter_names == {
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_xmit_discards",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "rnr_nak_retry_err",
        "rx_drops",
        "retrans_pkts",
        "unresponsive_remote_events",
    }  # error counters only: not port_rcv_data, out_of_buffer, tx_pkts, lifespan
    label_sets = {name: {tuple(sorted(dict(labels))) for n, labels in values if n == name} for name, _ in values}
    assert label_sets == {
        "rdma_port_active": {("device", "port")},
        "rdma_port_rate_gbps": {("device", "port")},
        "rdma_port_counter": {("counter", "device", "port")},
    }


# --------------------------------------------------------------------------------------------------
# Pure parts, as tables

LINK_STATES = {
    "active": ("4: ACTIVE\n", (4, "ACTIVE")),
    "active defer": ("5: ACTIVE_DEFER", (5, "ACTIVE_DEFER")),
    "phys link up": ("5: LinkUp\n", (5, "LinkUp")),
    "two words": ("4: PortConfigurationTraining", (4, "PortConfigurationTraining")),
    "phys test": ("7: Phy Test", (7, "Phy Test")),
    "no number": ("ACTIVE", None),
    "empty": ("", None),
    "no name": ("4:", None),
}


@pytest.mark.parametrize(("text", "expected"), LINK_STATES.values(), ids=LINK_STATES.keys())
def test_parse_link_state(text: str, expected: tuple[int, str] | None) -> None:
    parsed = sysfs.parse_link_state(text)
    assert (None if parsed is None else (parsed.code, parsed.name)) == expected


RATES = {
    "HDR 4X": ("200 Gb/sec (4X HDR)\n", (200.0, 4, "HDR")),
    "NDR 4X": ("400 Gb/sec (4X NDR)", (400.0, 4, "NDR")),
    "EFA": ("100 Gb/sec (4X EDR)", (100.0, 4, "EDR")),
    "SDR has no speed word": ("10 Gb/sec (4X)", (10.0, 4, "SDR")),
    "half rate": ("2.5 Gb/sec (1X)", (2.5, 1, "SDR")),
    "FDR10": ("40 Gb/sec (4X FDR10)", (40.0, 4, "FDR10")),
    "no width": ("200 Gb/sec", None),
    "other units": ("200 Mb/sec (4X HDR)", None),
    "garbage": ("fast", None),
}


@pytest.mark.parametrize(("text", "expected"), RATES.values(), ids=RATES.keys())
def test_parse_rate(text: str, expected: tuple[float, int, str] | None) -> None:
    parsed = sysfs.parse_rate(text)
    assert (None if parsed is None else (parsed.gbps, parsed.lanes, parsed.speed)) == expected


class ScriptedReader:
    """Reads real files, except paths ending in a name given here, which raise OSError(errno)."""

    def __init__(self, failures: Mapping[str, int]) -> None:
        self.failures = failures

    def __call__(self, path: Path) -> str:
        for suffix, code in self.failures.items():
            if path.as_posix().endswith(suffix):
                raise OSError(code, errno.errorcode[code])
        return sysfs.read_attribute(path)


COUNTER_READS = {
    "EINVAL means not supported": ({"counters/symbol_error": errno.EINVAL}, {"symbol_error"}, []),
    "ENOSYS means not supported": ({"counters/link_downed": errno.ENOSYS}, {"link_downed"}, []),
    "EOPNOTSUPP means not supported": ({"hw_counters/rnr_nak_retry_err": errno.EOPNOTSUPP}, {"rnr_nak_retry_err"}, []),
    "EACCES is an error": (
        {"counters/symbol_error": errno.EACCES},
        set(),
        ["counters/symbol_error: cannot read (permission denied)"],
    ),
    "EIO is an error": ({"counters/link_downed": errno.EIO}, set(), ["counters/link_downed: cannot read (EIO)"]),
}


@pytest.mark.parametrize(("failures", "unsupported", "errors"), COUNTER_READS.values(), ids=COUNTER_READS.keys())
def test_counter_read_failures(tmp_path: Path, failures: dict, unsupported: set, errors: list) -> None:
    write_sysfs(tmp_path, HEALTHY[:1])
    port_dir = sysfs.class_dir(tmp_path) / "mlx5_0" / "ports" / "1"
    reading = sysfs.read_port(port_dir, device="mlx5_0", port=1, read=ScriptedReader(failures))
    assert set(reading.unsupported) == unsupported
    assert [str(e).removeprefix(f"{port_dir}/") for e in reading.counter_errors] == errors
    assert set(reading.counters) == (set(PMA) | set(MLX5_HW)) - {n.split("/")[-1] for n in failures}


def test_state_unreadable_for_permission_names_the_file(tmp_path: Path) -> None:
    write_sysfs(tmp_path, HEALTHY[:1])
    port_dir = sysfs.class_dir(tmp_path) / "mlx5_0" / "ports" / "1"
    reading = sysfs.read_port(port_dir, device="mlx5_0", port=1, read=ScriptedReader({"/state": errno.EACCES}))
    assert reading.link_up is None
    assert [str(e) for e in reading.link_errors] == [f"{port_dir}/state: cannot read (permission denied)"]


def test_scan_reads_all_counters_without_a_name_list(tmp_path: Path) -> None:
    write_sysfs(tmp_path, HEALTHY)
    scan = sysfs.scan(tmp_path)
    assert [p.key for p in scan.ports] == ["mlx5_0:1", "mlx5_1:1", "rdmap0s31:1"]
    efa = scan.ports[2]
    assert (efa.link_up, efa.link_layer, dict(efa.counters)) == (
        True,
        "Unknown",
        {k: v for k, v in EFA_HW.items() if k != "lifespan"},
    )


def test_devices_sort_naturally(tmp_path: Path) -> None:
    write_sysfs(tmp_path, [Port(device=f"mlx5_{n}") for n in (10, 2, 1)])
    assert [p.device for p in sysfs.scan(tmp_path).ports] == ["mlx5_1", "mlx5_2", "mlx5_10"]


POLICY = checks.LinkPolicy(drop_after=240, flap_count=3, flap_window=600, clear_after=600)
UP, DOWN = True, False

# (steps of (now, up, link_downed), expected (dropped, flapping, cycles) after the last step)
LINK_TABLE = {
    "first sample up": ([(0, UP, 0)], (False, False, 0)),
    "first sample down starts the clock": ([(0, DOWN, None), (239, DOWN, None)], (False, False, 0)),
    "down 4m": ([(0, DOWN, None), (240, DOWN, None)], (True, False, 0)),
    "unreadable samples change nothing": ([(0, DOWN, None), (100, None, None), (240, DOWN, None)], (True, False, 0)),
    "down then up is one cycle": ([(0, UP, 0), (30, DOWN, 0), (60, UP, 1)], (False, False, 1)),
    "link_downed between up samples": ([(0, UP, 0), (30, UP, 2)], (False, False, 2)),
    "link_downed reset is no cycle": ([(0, UP, 7), (30, UP, 0)], (False, False, 0)),
    "three cycles": ([(0, UP, 0), (30, UP, 3)], (False, True, 3)),
    "flap clears after quiet": ([(0, UP, 0), (30, UP, 3), (629, UP, 3)], (False, True, 3)),
    "flap cleared": ([(0, UP, 0), (30, UP, 3), (630, UP, 3)], (False, False, 0)),
    "clock stepped back restarts the down timer": (
        [(1000, DOWN, None), (100, DOWN, None), (339, DOWN, None)],
        (False, False, 0),
    ),
}


@pytest.mark.parametrize(("steps", "expected"), LINK_TABLE.values(), ids=LINK_TABLE.keys())
def test_observe_link(steps: list, expected: tuple[bool, bool, int]) -> None:
    history = checks.LinkHistory()
    for now, up, link_downed in steps:
        history = checks.observe_link(history, now=now, up=up, link_downed=link_downed, policy=POLICY)
    assert (history.dropped, history.flapping, len(history.cycles)) == expected


ANY = checks.CounterRule(counter="c", max=0)
HOURLY = checks.CounterRule(counter="c", max=120, window=3600)
PER_SECOND = checks.CounterRule(counter="c", max=10, window=1)

# (rule, samples as (at, value), then (now, value)) → increase reported or None
COUNTER_TABLE = {
    "first sample": (ANY, [], (0, 5), None),
    "unchanged": (ANY, [(0, 5)], (30, 5), None),
    "any increase": (ANY, [(0, 5)], (30, 6), 1.0),
    "reset": (ANY, [(0, 5)], (30, 0), None),
    "same instant": (ANY, [(0, 5)], (0, 9), None),
    "within the hour, from the oldest sample": (HOURLY, [(0, 0), (1800, 100)], (3600, 121), 121.0),
    "outside the hour, oldest dropped": (HOURLY, [(0, 0), (1800, 100)], (3601, 121), None),
    "window shorter than the interval is scaled": (PER_SECOND, [(0, 0)], (30, 330), 11.0),
}


@pytest.mark.parametrize(("rule", "samples", "now", "expected"), COUNTER_TABLE.values(), ids=COUNTER_TABLE.keys())
def test_observe_counter(rule, samples: list, now: tuple[float, int], expected: float | None) -> None:
    kept = tuple(checks.CounterSample(at=at, value=v) for at, v in samples)
    _, exceeded = checks.observe_counter(kept, now=now[0], value=now[1], rule=rule)
    assert (None if exceeded is None else exceeded.increase) == expected


# --------------------------------------------------------------------------------------------------
# Options and declaration

BAD_OPTIONS = {
    "unknown option": ({"expectedDevice": ["mlx5_0"]}, "expectedDevice"),
    "expectedDevices not a list": ({"expectedDevices": "mlx5_0:1"}, "expectedDevices"),
    "expectedDevices bad entry": ({"expectedDevices": ["mlx5_0:x"]}, "expectedDevices"),
    "expectedDevices port 0": ({"expectedDevices": ["mlx5_0:0"]}, "expectedDevices"),
    "expectedPorts negative": ({"expectedPorts": -1}, "expectedPorts"),
    "expectedPorts not an integer": ({"expectedPorts": 2.5}, "expectedPorts"),
    "minRateGbps text": ({"minRateGbps": "200G"}, "minRateGbps"),
    "dropAfter garbage": ({"dropAfter": "soon"}, "dropAfter"),
    "dropAfter zero": ({"dropAfter": "0"}, "dropAfter"),
    "flapCount zero": ({"flapCount": 0}, "flapCount"),
    "flapCount bool": ({"flapCount": True}, "flapCount"),
    "flapWindow negative": ({"flapWindow": -5}, "flapWindow"),
    "clearAfter garbage": ({"clearAfter": "10 minutes"}, "clearAfter"),
    "devices empty pattern": ({"devices": [""]}, "devices"),
    "counterThresholds not a mapping": ({"counterThresholds": [1]}, "counterThresholds"),
    "counterThresholds without max": (
        {"counterThresholds": {"symbol_error": {"window": "1h"}}},
        "counterThresholds.symbol_error",
    ),
    "counterThresholds negative max": (
        {"counterThresholds": {"symbol_error": {"max": -1}}},
        "counterThresholds.symbol_error.max",
    ),
    "counterThresholds bad window": (
        {"counterThresholds": {"symbol_error": {"max": 1, "window": "x"}}},
        "counterThresholds.symbol_error.window",
    ),
    "rememberPorts text": ({"rememberPorts": "yes"}, "rememberPorts"),
}


@pytest.mark.parametrize(("options", "field_name"), BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_options_name_the_option(options: dict, field_name: str) -> None:
    with pytest.raises(CheckConfigError) as info:
        checks.IbPortsCheck(name="ib-ports", context=CheckContext(), options=options)
    assert info.value.field == field_name


def test_defaults() -> None:
    settings = checks.parse_options({})
    assert settings.link == checks.LinkPolicy(drop_after=240, flap_count=3, flap_window=600, clear_after=600)
    assert (settings.expected, settings.expected_ports, settings.min_rate_gbps) == ((), None, None)
    rules = {r.counter: (r.max, r.window) for r in settings.counter_rules}
    assert rules["link_downed"] == (0, None)
    assert rules["symbol_error"] == (120, 3600)
    assert rules["excessive_buffer_overrun_errors"] == (0, None)
    assert rules["local_link_integrity_errors"] == (0, None)


def test_the_check_satisfies_the_contract(tmp_path: Path) -> None:
    check = checks.IbPortsCheck(name="ib-links", context=CheckContext(sys_root=tmp_path), options={})
    assert isinstance(check, Check)
    (spec,) = check.conditions
    assert (spec.type, spec.reason, spec.accelerator, spec.source) == ("IbDev", "IbDevGood", False, "ib-links")
    assert (check.name, check.interval, check.timeout) == ("ib-links", 30.0, 10.0)


def test_the_declaration_builds_the_check(tmp_path: Path) -> None:
    declared = yaml.safe_load((PLUGIN_DIR / "checks.yaml").read_text())
    entry, active = declared["checks"]  # ib-ports, then the active efa-loopback (tests/plugins/test_active_rdma.py)
    assert (active["name"], active["use"], active["enabled"]) == ("efa-loopback", "rdma.active:EfaLoopbackCheck", False)
    module, attribute = entry["use"].split(":")
    factory = getattr(import_builtin(module), attribute)
    check = factory(name=entry["name"], context=CheckContext(sys_root=tmp_path), options=entry["options"])
    assert check.name == "ib-ports"
    assert checks.parse_options(entry["options"]) == checks.parse_options({})  # the file states the defaults
    assert [(r.status, r.reason) for r in check.run()] == [(OK, "NoRdmaDevices")]
