"""The network family (plugins/kernel/network.yaml), tested from the format strings the kernel prints.

Every line below is rendered from a driver's format string (C printf semantics: ``%u`` of -1 is
4294967295, ``%#x`` of 0 is ``0``, ``%s`` may be empty) behind the printk helper's own prefix
(netdev_printk, dev_printk, mlx5_core_err, ibdev_printk, pr_fmt), with edge values, every PCI
address form and the optional clauses present and absent. Each line must produce the expected
rule, reason and fields, and no other rule of this family, through both the fast and the
reference matcher. Threshold rules must stay quiet below their count and speak at it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import yaml

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers.kprintf import kprintf as cformat

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

RULE_SET = load_rule_set([builtin_plugins_dir()])
PACK = yaml.safe_load((builtin_plugins_dir() / "kernel" / "network.yaml").read_text())
FAMILY = {r["name"] for r in PACK["rules"]}
THRESHOLDS = {r["name"]: r["threshold"]["count"] for r in PACK["rules"] if "threshold" in r}
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])

# ---------------------------------------------------------------------------------------------
# printk helper prefixes (include/linux/netdevice.h, drivers/base/core.c, net/core/dev.c,
# drivers/infiniband/core/device.c) and the values they carry.


def netdev(driver: str, bus_id: str, ifname: str, reg_state: str = "") -> str:
    """__netdev_printk with a parent device: "%s %s %s%s: "."""
    return cformat("%s %s %s%s: ", driver, bus_id, ifname, reg_state)


def netdev_old(driver: str, bus_id: str, ifname: str) -> str:
    """__netdev_printk before 3.x: dev_printk(parent) + "%s: "."""
    return cformat("%s %s: %s: ", driver, bus_id, ifname)


def netdev_noparent(ifname: str, reg_state: str = "") -> str:
    return cformat("%s%s: ", ifname, reg_state)


def dev(driver: str, name: str) -> str:
    """dev_printk: "%s %s: " (driver, device name)."""
    return cformat("%s %s: ", driver, name)


def mlx5(name: str, func: str = "poll_health", line: int = 800, pid: int = 0) -> str:
    """mlx5_core_err/warn/info: dev_printk + "%s:%d:(pid %d): "."""
    return dev("mlx5_core", name) + cformat("%s:%d:(pid %d): ", func, line, pid)


def ibdev(driver: str, parent: str, name: str) -> str:
    """__ibdev_printk with a parent: "%s %s %s: "."""
    return cformat("%s %s %s: ", driver, parent, name)


# dev_name() of a PCI device is "%04x:%02x:%02x.%d" (domain up to 32 bits: 4 to 8 digits); other
# printers drop the domain or the function.
PCI = ["0000:3b:00.0", "10000:01:00.7", "c2b5:00:02.0", "ffffffff:ff:1f.7", "3b:00.0", "0000:3b:00"]
IFNAMES = ["eth0", "eno1", "enp59s0f0np0", "eth0.100", "ens801f0np0", "e"]
REG_STATES = ["", " (unregistering)", " (unregistered)", " (uninitialized)"]
INT = [0, -1, 2147483647, -2147483648]  # %d
UINT = [0, 1, 4294967295, -1]  # %u (-1 renders as 4294967295)


def netdev_prefixes(driver: str, pci: str, ifname: str) -> Iterator[tuple[str, dict[str, str]]]:
    """Every prefix a netdev_* message of ``ifname`` gets, with the fields it carries."""
    for reg in REG_STATES:
        yield netdev(driver, pci, ifname, reg), {"interface": ifname}
    yield netdev_old(driver, pci, ifname), {"interface": ifname}
    yield netdev_noparent(ifname), {"interface": ifname}


Case = tuple[str, list[str], str, str, dict[str, str]]  # id, lines, rule, reason, fields


def case(rule: str, reason: str, lines: list[str] | str, fields: dict[str, str] | None = None) -> Case:
    lines = [lines] if isinstance(lines, str) else lines
    return (lines[-1], [ln.strip() for ln in lines], rule, reason, fields or {})


# ---------------------------------------------------------------------------------------------
# The tables: format string -> rendered lines -> expected finding.


def nic_link_down() -> Iterator[Case]:
    rule, reason = "kernel/nic-link-down", "NICLinkDown"
    # ixgbe, i40e, ice, igc, bnxt: netdev_info(..., "NIC Link is Down\n"); phylib/phylink: "Link is Down";
    # tg3: "Link is down"; mlx5e: "Link down"
    for (driver, text), ifname in itertools.product(
        [
            ("ixgbe", "NIC Link is Down\n"),
            ("i40e", "NIC Link is Down\n"),
            ("ice", "NIC Link is Down\n"),
            ("r8169", "Link is Down\n"),
            ("tg3", "Link is down\n"),
            ("mlx5_core", "Link down\n"),
        ],
        IFNAMES,
    ):
        for prefix, fields in netdev_prefixes(driver, "0000:3b:00.0", ifname):
            yield case(rule, reason, prefix + cformat(text), fields)
    for ifname in IFNAMES:
        # igb: "igb: %s NIC Link is Down\n" (printk, later netdev_info); e1000e: pr_info("%s NIC Link is Down\n")
        yield case(rule, reason, cformat("igb: %s NIC Link is Down\n", ifname), {"interface": ifname})
        yield case(
            rule,
            reason,
            netdev("igb", "0000:02:00.2", ifname) + cformat("igb: %s NIC Link is Down\n", ifname),
            {"interface": ifname},
        )
        yield case(
            rule,
            reason,
            dev("igb", "0000:02:00.2") + cformat("%s: ", ifname) + cformat("igb: %s NIC Link is Down\n", ifname),
            {"interface": ifname},
        )
        yield case(rule, reason, "e1000e: " + cformat("%s NIC Link is Down\n", ifname), {"interface": ifname})
        # bnx2: netdev_err(bp->dev, "NIC %s Link is Down\n", bnx2_xceiver_str(bp))
        for xceiver in ["Copper", "Remote Copper", "SerDes"]:
            yield case(
                rule,
                reason,
                netdev("bnx2", "0000:01:00.0", ifname) + cformat("NIC %s Link is Down\n", xceiver),
                {"interface": ifname},
            )
        # mlx4_en: en_print "%s: %s: " (DRV_NAME, dev->name) + "Link Down\n"
        yield case(rule, reason, cformat("%s: %s: Link Down\n", "mlx4_en", ifname), {"interface": ifname})


def nic_link_down_any() -> Iterator[Case]:
    """The family fallback: link-down wordings that kernel/nic-link-down does not list."""
    rule, reason = "kernel/nic-link-down-any", "NICLinkDown"
    for ifname in IFNAMES:
        for prefix, fields in netdev_prefixes("sfc", "0000:3b:00.0", ifname):
            yield case(rule, reason, prefix + cformat("link down\n"), fields)  # sfc efx_link_status_changed
        yield case(rule, reason, cformat("%s: link is down\n", ifname), {"interface": ifname})  # ibm emac
        for text in ("Link is DOWN\n", "link is Down\n", "NIC Link is DOWN\n"):
            yield case(rule, reason, netdev("drv", "0000:3b:00.0", ifname) + cformat(text), {"interface": ifname})
    for name, port in itertools.product(["10110000.esw", "1e110000.ethernet", "0000:3b:00.0"], INT):
        if port < 0:
            continue  # "port %d" of a switch port index is never negative
        yield case(
            rule,
            reason,
            dev("rt3050-esw", name) + cformat("port %d link down\n", port),
            {"interface": name, "port": str(port)},
        )


def bonding() -> Iterator[Case]:
    bonds, slaves = ["bond0", "bond-wan", "mgmt", "b"], ["eth0", "enp95s0f0", "ens19", "veth2"]
    for bond, reg in itertools.product(bonds, REG_STATES):
        yield case(
            "kernel/bond-no-active-interface",
            "BondNoActiveInterface",
            netdev_noparent(bond, reg) + cformat("now running without any active interface!\n"),
            {"bond": bond},
        )
        for slave in slaves:
            yield case(
                "kernel/bond-slave-link-down",
                "BondSlaveLinkDown",
                netdev_noparent(bond, reg)
                + cformat("(slave %s): ", slave)
                + cformat("link status definitely down, disabling slave\n"),
                {"bond": bond, "slave": slave},
            )
            yield case(
                "kernel/bond-slave-link-down-legacy",
                "BondSlaveLinkDown",
                netdev_noparent(bond, reg)
                + cformat("link status definitely down for interface %s, disabling it\n", slave),
                {"bond": bond, "slave": slave},
            )
    for bond in bonds:  # before 3.14: pr_info with pr_fmt "bonding: "
        yield case(
            "kernel/bond-no-active-interface",
            "BondNoActiveInterface",
            "bonding: " + cformat("%s: now running without any active interface !\n", bond),
            {"bond": bond},
        )
        yield case(
            "kernel/bond-slave-link-down-legacy",
            "BondSlaveLinkDown",
            "bonding: " + cformat("%s: link status definitely down for interface %s, disabling it\n", bond, "eth1"),
            {"bond": bond, "slave": "eth1"},
        )


def tx_watchdog() -> Iterator[Case]:
    rule, reason = "kernel/netdev-tx-timeout", "NICTransmitTimeout"
    for ifname, driver, queue in itertools.product(IFNAMES, ["e1000e", "mlx5_core", "virtio_net", ""], UINT):
        q = str(queue % (1 << 32))
        base = {"interface": ifname, "driver": driver, "queue": q}
        yield case(
            rule,
            reason,
            cformat("NETDEV WATCHDOG: %s (%s): transmit queue %u timed out\n", ifname, driver, queue),
            base,
        )
        for ms in UINT:
            yield case(
                rule,
                reason,
                cformat("NETDEV WATCHDOG: %s (%s): transmit queue %u timed out %u ms\n", ifname, driver, queue, ms),
                {**base, "timeout_ms": str(ms % (1 << 32))},
            )
        yield case(
            rule,
            reason,
            cformat("NETDEV WATCHDOG: %s (%s): transmit timed out\n", ifname, driver),
            {"interface": ifname, "driver": driver},
        )
    for ifname in IFNAMES:
        yield case(rule, reason, cformat("NETDEV WATCHDOG: %s: transmit timed out\n", ifname), {"interface": ifname})
    # 6.8+: netdev_crit(dev, "NETDEV WATCHDOG: CPU: %d: transmit queue %u timed out %u ms\n")
    rule = "kernel/netdev-tx-timeout-cpu"
    fmt = "NETDEV WATCHDOG: CPU: %d: transmit queue %u timed out %u ms\n"
    for (driver, bus), ifname, reg in itertools.product(
        [
            ("mlx5_core", "0000:3b:00.0"),
            ("virtio_net", "virtio0"),
            ("icssg-prueth", "icssg1-eth"),
            ("ice", "10000:b1:00.0"),
        ],
        IFNAMES,
        REG_STATES,
    ):
        for cpu, queue, ms in [(0, 0, 0), (-1, 4294967295, 4294967295), (2147483647, 14, 80692736)]:
            fields = {
                "interface": ifname,
                "driver": driver,
                "bus_id": bus,
                "cpu": str(cpu),
                "queue": str(queue % (1 << 32)),
                "timeout_ms": str(ms % (1 << 32)),
            }
            yield case(rule, reason, netdev(driver, bus, ifname, reg) + cformat(fmt, cpu, queue, ms), fields)
    for ifname in IFNAMES:
        yield case(
            rule,
            reason,
            netdev_noparent(ifname) + cformat(fmt, 3, 0, 5376),
            {"interface": ifname, "cpu": "3", "queue": "0", "timeout_ms": "5376"},
        )


def nic_faults() -> Iterator[Case]:
    unrecoverable = [
        "tx_timeout recovery unsuccessful, device is in non-recoverable state.\n",  # i40e
        "tx_timeout recovery unsuccessful, device is in unrecoverable state.\n",  # ice
        "tx_timeout recovery unsuccessful\n",  # i40e before 4.16
    ]
    overheated = [
        "Network adapter has been stopped because it has over heated. Restart the computer. "
        "If the problem persists, power off the system and replace the adapter\n",  # ixgbe_overheat_msg
        "The network adapter was stopped because it overheated\n",  # igb
    ]
    for ifname in IFNAMES:
        for prefix, fields in netdev_prefixes("i40e", "0000:3b:00.0", ifname):
            for text in unrecoverable:
                yield case(
                    "kernel/nic-tx-timeout-unrecoverable", "NICTxTimeoutUnrecoverable", prefix + cformat(text), fields
                )
            for text in overheated:
                yield case(
                    "kernel/nic-overheated", "NICOverheated", prefix + cformat("%s\n", text.removesuffix("\n")), fields
                )


# ENA: netif_* is netdev_printk ("ena <pci> <if>: "), dev_err is "ena <pci>: "; the FreeBSD driver
# ("ena0: ") prints the same text, which the rules accept without fields.
def ena_prefixes(pci: str, ifname: str) -> Iterator[tuple[str, dict[str, str]]]:
    for reg in REG_STATES:
        yield netdev("ena", pci, ifname, reg), {"pci": pci, "interface": ifname}
    yield netdev_old("ena", pci, ifname), {"pci": pci, "interface": ifname}
    yield dev("ena", pci), {"pci": pci}
    yield "ena0: ", {}


def ena() -> Iterator[Case]:
    for pci, ifname in itertools.product(PCI, ["eth0", "ens5", "enp39s0"]):
        for prefix, fields in ena_prefixes(pci, ifname):
            yield case(
                "kernel/ena-keep-alive-timeout",
                "ENAKeepAliveTimeout",
                prefix + cformat("Keep alive watchdog timeout.\n"),
                fields,
            )
            yield case(
                "kernel/ena-admin-queue-stalled",
                "ENAAdminQueueStalled",
                prefix + cformat("ENA admin queue is not in running state!\n"),
                fields,
            )
            yield case(
                "kernel/ena-reset-failed",
                "ENAResetFailed",
                prefix + cformat("Reset attempt failed. Can not reset the device\n"),
                fields,
            )
            for missed, threshold in [(129, 128), (0, 0), (-1, 2147483647)]:
                for fmt in [
                    "The number of lost tx completions is above the threshold (%d > %d). Reset the device\n",
                    "The number of lost tx completion is above the threshold (%d > %d). Reset the device\n",
                ]:
                    yield case(
                        "kernel/ena-tx-completions-lost",
                        "ENATxCompletionsLost",
                        prefix + cformat(fmt, missed, threshold),
                        {**fields, "missed": str(missed), "threshold": str(threshold)},
                    )
            for side, queue in itertools.product(["Rx", "Tx"], INT):
                yield case(
                    "kernel/ena-interrupt-missing",
                    "ENAInterruptMissing",
                    prefix + cformat("Potential MSIX issue on %s side Queue = %d. Reset the device\n", side, queue),
                    {**fields, "side": side, "queue": str(queue)},
                )


def mlx5_prefixes(pci: str) -> Iterator[tuple[str, dict[str, str]]]:
    yield mlx5(pci), {"pci": pci}
    yield mlx5(pci, "mlx5_health_try_recover", 0, -1), {"pci": pci}
    yield (
        dev("mlx5_core", pci) + cformat("%s:%s:%d:(pid %d): ", "mlx5_core0", "poll_health", 123, 4194304),
        {"pci": pci},
    )
    yield dev("mlx5_core", pci), {"pci": pci}  # 3.x: dev_err without the function


def mlx5_all_prefixes() -> Iterator[tuple[str, dict[str, str]]]:
    for pci in PCI:
        yield from mlx5_prefixes(pci)
    # sub-functions: the auxiliary device mlx5_core.sf.N
    yield (
        dev("mlx5_core.sf", "mlx5_core.sf.4") + cformat("%s:%d:(pid %d): ", "poll_health", 800, 0),
        {"pci": "mlx5_core.sf.4"},
    )


def mlx5_rules() -> Iterator[Case]:
    loglevels = ["EMERGENCY", "ALERT", "CRITICAL", "ERROR", "WARNING", "NOTICE", "INFO", "DEBUG", "Unknown log level"]
    pme_errors = [
        "Power budget exceeded",
        "Long Range for non MLNX cable",
        "Bus stuck (I2C or data shorted)",
        "No EEPROM/retry timeout",
        "Enforce part number list",
        "Unknown identifier",
        "High Temperature",
        "Bad or shorted cable/module",
        "One or more network ports have been powered down due to insufficient/unadvertised power on the PCIe slot",
        "Unknown error",
        "",
    ]
    for prefix, fields in mlx5_all_prefixes():
        for text in ["device's health compromised - reached miss count\n", "device's health compromised\n"]:
            yield case("kernel/mlx5-health-compromised", "MLX5HealthCompromised", prefix + cformat(text), fields)
        for error in UINT:
            yield case(
                "kernel/mlx5-fatal-error",
                "MLX5FatalError",
                prefix + cformat("Fatal error %u detected\n", error),
                {**fields, "error": str(error % (1 << 32))},
            )
        yield case(  # before 5.17: the syndrome record, no header
            "kernel/mlx5-unrecoverable-synd",
            "MLX5UnrecoverableError",
            prefix + cformat("synd 0x%x: %s\n", 8, "unrecoverable hardware error"),
            {**fields, "synd": "0x8"},
        )
        for severity, level in zip([0, 1, 2, 3, 4, 5, 6, 7, -1], loglevels, strict=True):
            yield case(
                "kernel/mlx5-unrecoverable",
                "MLX5UnrecoverableError",
                prefix
                + cformat(
                    "Health issue observed, %s, severity(%d) %s:\n", "unrecoverable hardware error", severity, level
                ),
                {**fields, "severity": str(severity), "level": level},
            )
        for text in [
            "health recovery failed\n",
            "health recovery flow aborted, PCI reads still not working\n",
            "Driver is in error state. Unloading\n",
        ]:
            yield case("kernel/mlx5-health-recovery-failed", "MLX5HealthRecoveryFailed", prefix + cformat(text), fields)
        for command, opcode in [("QUERY_VPORT_COUNTER", 0x770), ("unknown command opcode", 0), ("2ERR_QP", 0xFFFF)]:
            opc = cformat("0x%x", opcode)
            yield case(
                "kernel/mlx5-command-leak",
                "MLX5CommandTimeout",
                prefix + cformat("%s(0x%x) timeout. Will cause a leak of a command resource\n", command, opcode),
                {**fields, "command": command, "opcode": opc},
            )
            for idx in [0, 31, -1]:
                yield case(
                    "kernel/mlx5-command-leak",
                    "MLX5CommandTimeout",
                    prefix
                    + cformat(
                        "cmd[%d]: %s(0x%x) Async, timeout. Will cause a leak of a command resource\n",
                        idx,
                        command,
                        opcode,
                    ),
                    {**fields, "command": command, "opcode": opc},
                )
        for watts in UINT:
            yield case(
                "kernel/mlx5-insufficient-power",
                "NICInsufficientPower",
                prefix + cformat("Detected insufficient power on the PCIe slot (%uW).\n", watts),
                {**fields, "watts": str(watts % (1 << 32))},
            )
        for module, error in itertools.product([0, 1, 255], pme_errors):
            yield case(
                "kernel/mlx5-module-error",
                "NICModuleError",
                prefix + cformat("Port module event[error]: module %u, %s, %s\n", module, "Cable error", error),
                {**fields, "module": str(module), "error": f"Cable error, {error}".strip()},
            )
        for msb, lsb in [(0, 0), (0, 1), (-1, 0x8000000000000000)]:
            for fmt in [
                "High temperature on sensors with bit set %llx %llx",
                "High temperature on sensors with bit set %#llx %#llx.\n",
            ]:
                yield case(
                    "kernel/mlx5-high-temperature",
                    "NICHighTemperature",
                    prefix + cformat(fmt, msb, lsb),
                    {
                        **fields,
                        "sensors_msb": cformat(fmt.split()[-2], msb),
                        "sensors_lsb": cformat(fmt.split()[-1].rstrip("."), lsb),
                    },
                )
    # older ports.c (before 5.1): mlx5_core_info, the same text
    yield case(
        "kernel/mlx5-module-error",
        "NICModuleError",
        dev("mlx5_core", "0000:3b:00.1")
        + cformat("Port module event[error]: module %u, %s, %s\n", 1, "Cable error", "Power budget exceeded"),
        {"pci": "0000:3b:00.1", "module": "1"},
    )


def efa_prefixes() -> Iterator[tuple[str, dict[str, str]]]:
    for pci, name in zip(PCI, itertools.cycle(["rdmap0s29", "efa_0", "(null)"])):
        yield ibdev("efa", pci, name), {"pci": pci, "ibdev": name}
    for name in ["rdmap32s0", "efa_0"]:
        yield cformat("%s %s: ", "infiniband", name), {"ibdev": name}  # dev_printk on the IB device
    for pci in PCI:
        yield dev("efa", pci), {"pci": pci}


def efa() -> Iterator[Case]:
    commands = ["CREATE_QP", "DEREG_MR", "GET_STATS", "unknown command opcode"]
    for prefix, fields in efa_prefixes():
        yield case(
            "kernel/ib-completion-timeout",
            "RDMACommandTimeout",
            prefix + cformat("Wait for completion (polling) timeout\n"),
            fields,
        )
        yield case(
            "kernel/efa-admin-queue-closed", "EFAAdminQueueClosed", prefix + cformat("Admin queue is closed\n"), fields
        )
        yield case(
            "kernel/efa-device-not-ready",
            "EFADeviceNotReady",
            prefix + cformat("Device isn't ready, abort com init\n"),
            fields,
        )
        for sts in [0, 2, 0xFFFFFFFF]:
            yield case(
                "kernel/efa-device-not-ready",
                "EFADeviceNotReady",
                prefix + cformat("Device isn't ready, abort com init %#x\n", sts),
                {**fields, "dev_sts": cformat("%#x", sts)},
            )
        for command, opcode, status, (pc, cc) in zip(
            commands, [1, 8, 13, 255], [0, 1, -1, -2147483648], [(0, 0), (2147483647, -2147483648)] * 2, strict=True
        ):
            base = {
                **fields,
                "command": command,
                "opcode": str(opcode),
                "status": str(status),
                "sq_producer": str(pc),
                "sq_consumer": str(cc),
                "cq_consumer": str(cc),
            }
            for ctx in ["00000000a1b2c3d4", "(null)", "ffff8c2a4b6d0000"]:
                yield case(
                    "kernel/efa-admin-timeout",
                    "EFAAdminCommandTimeout",
                    prefix
                    + cformat(
                        "The device didn't send any completion for admin cmd %s(%d) status %d "
                        "(ctx 0x%p, sq producer: %d, "
                        "sq consumer: %d, cq consumer: %d)\n",
                        command,
                        opcode,
                        status,
                        ctx,
                        pc,
                        cc,
                        cc,
                    ),
                    {**base, "ctx": "0x" + ctx},
                )
                yield case(
                    "kernel/efa-admin-timeout",
                    "EFAAdminCommandTimeout",
                    prefix
                    + cformat(
                        "The device sent a completion but the driver didn't receive any MSI-X interrupt "
                        "for admin cmd %s(%d) "
                        "status %d (ctx: 0x%p, sq producer: %d, sq consumer: %d, cq consumer: %d)\n",
                        command,
                        opcode,
                        status,
                        ctx,
                        pc,
                        cc,
                        cc,
                    ),
                    {**base, "ctx": "0x" + ctx},
                )
            for cmd_id in [0, 65535, -1]:
                for text in [
                    "The device didn't send any completion",
                    "The device sent a completion but the driver didn't receive any MSI-X interrupt",
                ]:
                    yield case(
                        "kernel/efa-admin-timeout",
                        "EFAAdminCommandTimeout",
                        prefix
                        + cformat(
                            "%s for admin cmd %s(%d) status %d "
                            "(id: %d, sq producer: %d, sq consumer: %d, cq consumer: %d)\n",
                            text,
                            command,
                            opcode,
                            status,
                            cmd_id,
                            pc,
                            cc,
                            cc,
                        ),
                        {**base, "cmd_id": str(cmd_id)},
                    )


def nic_resets_and_load_failures() -> Iterator[Case]:
    """Issue 18: the ENA reset trigger, mlx5 load failures, NIC probe failures (drivers/base/dd.c)."""
    for pci, ifname in itertools.product(PCI, ["eth0", "ens5"]):
        for prefix, fields in ena_prefixes(pci, ifname):
            if prefix != "ena0: ":
                yield case("kernel/ena-reset-triggered", "ENAResetTriggered", prefix + "Trigger reset is on", fields)
    for pci in PCI[:5]:
        for prefix, fields in mlx5_prefixes(pci):
            for step, fmt, err in [
                ("mlx5_load_one", "mlx5_load_one failed with error code %d\n", -22),
                ("mlx5_init_one", "mlx5_init_one failed with error code %d\n", -28),
                ("mlx5_pci_init", "mlx5_pci_init failed with error code %d\n", 0),
                ("mlx5_load_one", "mlx5_pci_resume: mlx5_load_one failed with error code: %d\n", -2147483648),
            ]:
                yield case(
                    "kernel/mlx5-load-failed",
                    "MLX5LoadFailed",
                    prefix + cformat(fmt, err),
                    {**fields, "step": step, "error": err},
                )
            yield case(
                "kernel/mlx5-load-failed",
                "MLX5LoadFailed",
                prefix + "handle_hca_cap failed",
                {**fields, "step": "handle_hca_cap"},
            )
    for driver, pci, err in itertools.product(["ena", "mlx5_core", "efa", "ixgbe", "bnxt_en"], PCI[:5], [-22, -1]):
        fields = {"pci": pci, "error": err}
        yield case(
            "kernel/nic-probe-failed",
            "NICProbeFailed",
            cformat("%s: probe of %s failed with error %d\n", driver, pci, err),
            {**fields, "driver": driver},
        )
        yield case(
            "kernel/nic-probe-failed",
            "NICProbeFailed",
            cformat("%s %s: probe with driver %s failed with error %d\n", driver, pci, driver, err),
            {**fields, "probe_driver": driver},
        )


CASES = [
    c
    for gen in (
        nic_link_down,
        nic_link_down_any,
        bonding,
        tx_watchdog,
        nic_faults,
        ena,
        mlx5_rules,
        efa,
        nic_resets_and_load_failures,
    )
    for c in gen()
]
BY_RULE: dict[str, list[Case]] = {}
for _c in CASES:
    BY_RULE.setdefault(_c[2], []).append(_c)
QUIET = {"kernel/mlx5-unrecoverable-synd-in-report"}  # never a finding: see the health report test below
PER_LINE = FAMILY - set(THRESHOLDS) - QUIET  # rules that speak on every matching line


def test_every_rule_of_the_family_has_generated_lines():
    covered = set(BY_RULE) | {t[0] for t in THRESHOLD_CASES} | QUIET
    assert sorted(FAMILY - covered) == []
    assert all(len(BY_RULE[r]) >= 10 for r in PER_LINE), {r: len(BY_RULE[r]) for r in PER_LINE}


def _health_report(prefix: str, severity: int, level: str, *, fields: int) -> list[str]:
    """print_health_info (5.17+, health.c): the header, ``fields`` of its field records, the syndrome record."""
    body = [cformat("assert_var[%d] 0x%08x\n", i, 0xFFFFFFFF) for i in range(5)]
    body += [cformat("assert_exit_ptr 0x%08x\n", 0), cformat("assert_callra 0x%08x\n", 0)]
    body += [
        cformat("fw_ver %d.%d.%d", 28, 39, 1002),
        cformat("time %u\n", 4294967295),
        cformat("hw_id 0x%08x\n", 0x20D),
    ]
    body += [cformat("rfr %d\n", 1), cformat("severity %d (%s)\n", severity, level), cformat("irisc_index %d\n", 255)]
    header = cformat("Health issue observed, %s, severity(%d) %s:\n", "unrecoverable hardware error", severity, level)
    synd = cformat("synd 0x%x: %s\n", 8, "unrecoverable hardware error")
    return [(prefix + text).strip() for text in [header, *body[:fields], synd]]


@pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
@pytest.mark.parametrize("fields", [13, 0, 5])  # the whole report (14 records between), and shorter ones
def test_an_unrecoverable_health_report_is_one_finding_its_headers(engine_cls, fields):
    for prefix, _ in mlx5_all_prefixes():
        for severity, level in [(3, "ERROR"), (0, "EMERGENCY"), (-1, "Unknown log level")]:
            lines = _health_report(prefix, severity, level, fields=fields)
            findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
            assert [(f.rule, f.line) for f in findings] == [("kernel/mlx5-unrecoverable", 1)], lines


def test_every_rule_names_its_source():
    for rule in RULE_SET.rules:
        if rule.name in FAMILY:
            assert rule.provenance, rule.name
            assert all(p.startswith(("torvalds/linux:", "freebsd/freebsd-src:")) for p in rule.provenance), rule.name


@ENGINES
@pytest.mark.parametrize("rule", sorted(BY_RULE))
def test_rendered_lines_fire_their_rule(engine_cls, rule):
    """Each rendered line (a table row) gives exactly its rule of the family, with reason and fields.

    The rows of a rule go through one engine in one batch (lines are independent: no pattern of the
    family spans lines); threshold rules of the family are left out here and tested on their own.
    """
    cases = BY_RULE[rule]
    lines = [ln for c in cases for ln in c[1]]
    last_line = list(itertools.accumulate(len(c[1]) for c in cases))
    findings: dict[int, list] = {}
    for f in engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1):
        if f.rule in PER_LINE:
            findings.setdefault(f.line, []).append(f)
    wrong = []
    for (text, _lines, want_rule, reason, fields), line in zip(cases, last_line, strict=True):
        got = findings.pop(line, [])
        if [(f.rule, f.reason) for f in got] != [(want_rule, reason)]:
            wrong.append((text, [(f.rule, f.reason) for f in got]))
        elif {k: got[0].fields.get(k) for k in fields} != fields:
            wrong.append((text, dict(got[0].fields), fields))
    stray = [(line, [(f.rule, f.message) for f in fs]) for line, fs in findings.items()]
    assert wrong == [] and stray == [], (wrong[:5], len(wrong), stray[:5])


# ---------------------------------------------------------------------------------------------
# Threshold rules: the same tables, counted per device.


def threshold_cases() -> Iterator[tuple[str, str, list[str], dict[str, str]]]:
    for ifname in IFNAMES:
        for prefix, fields in netdev_prefixes("ixgbe", "0000:19:00.0", ifname):
            yield "kernel/nic-link-flapping", "NICLinkFlapping", [prefix + cformat("NIC Link is Down\n")], fields
        yield (
            "kernel/nic-link-flapping",
            "NICLinkFlapping",
            [cformat("%s: %s: Link Down\n", "mlx4_en", ifname)],
            {"interface": ifname},
        )
        # e1000e: e_err("Detected Hardware Unit Hang:\n  TDH <%x>\n ..."), a multi-line record
        hang = netdev("e1000e", "0000:00:19.0", ifname) + cformat(
            "Detected Hardware Unit Hang:\n  TDH                  <%x>\n  TDT                  <%x>\n", 0x1F, 0x0
        )
        yield "kernel/nic-tx-hang", "NICTxHang", hang.split("\n"), {"device": ifname}
        for xdp in ["", "(XDP)"]:
            ixgbe = netdev("ixgbe", "0000:19:00.1", ifname) + cformat(
                "Detected Tx Unit Hang %s\n  Tx Queue             <%d>\n  TDH, TDT             <%x>, <%x>\n",
                xdp,
                61,
                0,
                0xFFFF,
            )
            yield "kernel/nic-tx-hang", "NICTxHang", ixgbe.split("\n"), {"device": ifname}
        yield (
            "kernel/nic-tx-hang",
            "NICTxHang",
            [cformat("ixgbe: %s: %s: Detected Tx Unit Hang\n", ifname, "ixgbe_clean_tx_irq")],
            {"device": ifname},
        )
        for prefix, fields in ena_prefixes("0000:00:05.0", ifname):
            for qid, index in [(0, 0), (-1, 2147483647)]:
                yield (
                    "kernel/ena-tx-completion-late",
                    "ENATxCompletionLate",
                    [prefix + cformat("Found a Tx that wasn't completed on time, qid %d, index %d.\n", qid, index)],
                    {**fields, "qid": str(qid), "index": str(index)},
                )
                yield (
                    "kernel/ena-tx-completion-late",
                    "ENATxCompletionLate",
                    [
                        prefix
                        + cformat(
                            "Found a Tx that wasn't completed on time, qid %d, index %d. "
                            "%u usecs have passed since last napi execution. "
                            "Missing Tx timeout value %u msecs\n",
                            qid,
                            index,
                            -1,
                            5000,
                        )
                    ],
                    {
                        **fields,
                        "qid": str(qid),
                        "index": str(index),
                        "usecs_since_napi": "4294967295",
                        "timeout_ms": "5000",
                    },
                )
    for pci in PCI:  # igb: dev_err(tx_ring->dev, "Detected Tx Unit Hang\n ...")
        yield "kernel/nic-tx-hang", "NICTxHang", [dev("igb", pci) + cformat("Detected Tx Unit Hang\n")], {"device": pci}
    for prefix, fields in itertools.islice(mlx5_all_prefixes(), 0, None, 3):
        for status, code in [
            ("bad parameter", 0x3),
            ("bad packet (discarded)", 0x8),
            ("internal error", 0x1),
            ("", 0x0),
        ]:
            for syndrome, err in [(0x5ADD95, -22), (0, 0)]:
                text = cformat(
                    "%s(0x%x) op_mod(0x%x) failed, status %s(0x%x), syndrome (0x%x), err(%d)\n",
                    "QUERY_HCA_CAP",
                    0x100,
                    0x40,
                    status,
                    code,
                    syndrome,
                    err,
                )
                yield (
                    "kernel/mlx5-command-failed",
                    "MLX5CommandFailed",
                    [prefix + text],
                    {
                        **fields,
                        "command": "QUERY_HCA_CAP",
                        "opcode": "0x100",
                        "op_mod": "0x40",
                        "status": status,
                        "status_code": cformat("0x%x", code),
                        "syndrome": cformat("0x%x", syndrome),
                        "err": str(err),
                    },
                )
                old = cformat(
                    "%s(0x%x) op_mod(0x%x) failed, status %s(0x%x), syndrome (0x%x)\n",
                    "CREATE_MKEY",
                    0x200,
                    0,
                    status,
                    code,
                    syndrome,
                )
                yield (
                    "kernel/mlx5-command-failed",
                    "MLX5CommandFailed",
                    [prefix + old],
                    {**fields, "command": "CREATE_MKEY", "op_mod": "0x0"},
                )
        for fmt in [
            "%s(0x%x) canceled on out of queue timeout.\n",
            "%s(0x%x) timeout while waiting for command semaphore.\n",
        ]:
            yield (
                "kernel/mlx5-command-failed",
                "MLX5CommandFailed",
                [prefix + cformat(fmt, "unknown command opcode", 0)],
                {**fields, "command": "unknown command opcode", "opcode": "0x0"},
            )
    for prefix, fields in efa_prefixes():
        for comp_status, err in [(0, 0), (2, -12), (-1, -62)]:
            yield (
                "kernel/efa-command-failed",
                "EFACommandFailed",
                [
                    prefix
                    + cformat(
                        "Failed to process command %s (opcode %u) comp_status %d err %d\n",
                        "CREATE_QP",
                        1,
                        comp_status,
                        err,
                    )
                ],
                {**fields, "command": "CREATE_QP", "opcode": "1", "comp_status": str(comp_status), "err": str(err)},
            )
        yield (
            "kernel/efa-command-failed",
            "EFACommandFailed",
            [
                prefix
                + cformat(
                    "Failed to submit command %s (opcode %u) err %ld\n", "unknown command opcode", 4294967295, -19
                )
            ],
            {**fields, "command": "unknown command opcode", "opcode": "4294967295", "err": "-19"},
        )


THRESHOLD_CASES = list(threshold_cases())


@ENGINES
@pytest.mark.parametrize("rule", sorted(THRESHOLDS))
def test_threshold_rules_speak_at_their_count(engine_cls, rule):
    """count-1 copies of a rendered record stay quiet; the count-th speaks, with reason and fields."""
    count = THRESHOLDS[rule]
    rows = [t for t in THRESHOLD_CASES if t[0] == rule]
    assert len(rows) >= 10
    wrong = []
    for _rule, reason, record, fields in rows:
        engine = engine_cls(rule_set=RULE_SET)  # a fresh count for every row
        record = [ln.strip() for ln in record if ln.strip()]
        quiet = [f for f in engine.feed(record * (count - 1), line_numbers=1) if f.rule == rule]
        mine = [f for f in engine.feed(record, line_numbers=len(record) * (count - 1) + 1) if f.rule == rule]
        if quiet or len(mine) != 1:
            wrong.append((record[0], len(quiet), len(mine)))
        elif mine[0].reason != reason or mine[0].line != len(record) * (count - 1) + 1:
            wrong.append((record[0], mine[0].reason, mine[0].line))
        elif {k: mine[0].fields.get(k) for k in fields} != fields:
            wrong.append((record[0], dict(mine[0].fields), fields))
    assert wrong == [], (wrong[:5], len(wrong))


@ENGINES
def test_thresholds_count_per_device(engine_cls):
    count = THRESHOLDS["kernel/nic-link-flapping"]
    lines = [
        netdev("ixgbe", "0000:19:00.0", f"eth{i % count}") + "NIC Link is Down" for i in range(count * (count - 1))
    ]
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [f for f in findings if f.rule == "kernel/nic-link-flapping"] == []
    assert len([f for f in findings if f.rule == "kernel/nic-link-down"]) == len(lines)


@ENGINES
def test_threshold_window_forgets_old_flaps(engine_cls):
    count = THRESHOLDS["kernel/nic-link-flapping"]
    line = netdev("ixgbe", "0000:19:00.0", "eno1") + "NIC Link is Down"
    engine = engine_cls(rule_set=RULE_SET)
    times = [i * 3600.0 for i in range(count)]  # one flap an hour: never five within the hour
    assert [f for f in engine.feed([line] * count, times=times) if f.rule == "kernel/nic-link-flapping"] == []


# ---------------------------------------------------------------------------------------------
# Look-alikes rendered from the benign counterparts of the same drivers.


def benign_lines() -> Iterator[str]:
    for ifname in IFNAMES:
        for prefix, _ in netdev_prefixes("ixgbe", "0000:19:00.0", ifname):
            yield prefix + cformat("NIC Link is Up %s, Flow Control: %s\n", "10 Gbps", "RX/TX")
            yield prefix + cformat("Link is Up - %s/%s - flow control %s\n", "1Gbps", "Full", "off")
            yield prefix + cformat("Link up\n")
        yield cformat("igb: %s NIC Link is Up %d Mbps %s Duplex, Flow Control: %s\n", ifname, 1000, "Full", "RX")
        yield "e1000e: " + cformat(
            "%s NIC Link is Up %d Mbps %s Duplex, Flow Control: %s\n", ifname, 1000, "Full", "Rx/Tx"
        )
        yield cformat("bond0: (slave %s): link status definitely up, %u Mbps %s duplex\n", ifname, 0, "half")
        yield cformat("bond0: (slave %s): link status down for interface, disabling it in %d ms\n", ifname, 200)
        yield cformat("bond0: (slave %s): link status up, enabling it in %d ms\n", ifname, 0)
        yield cformat(
            "bond0: link status definitely up for interface %s, %u Mbps %s duplex\n", ifname, 4294967295, "full"
        )
        yield cformat("bond0: (slave %s): making interface the new active one\n", ifname)
        yield cformat("%s: link up at %uMbps %s-duplex (MTU %d)\n", ifname, 25000, "full", 9001)  # sfc
        yield cformat("IPv6: ADDRCONF(NETDEV_UP): %s: link is not ready\n", ifname)
    for port in (1, 2, 32):  # libata empty ports at boot; PCIe hotplug: not NIC links
        yield cformat("ata%u: SATA link down (SStatus %X SControl %X)\n", port, 0, 0x300)
        yield dev("pcieport", "0000:00:01.4") + cformat("pciehp: Slot(%s): Link Down\n", str(port))
        yield cformat("bond0: making interface %s the new active one\n", ifname)
    for pci in PCI:
        yield dev("ena", pci) + cformat(
            "Device reset completed successfully, Driver info: %s\n", "Elastic Network Adapter (ENA) v2.0.2K"
        )
        yield dev("ena", pci) + cformat("Device reset completed successfully\n")
        yield mlx5(pci, "mlx5_health_try_recover") + cformat("health recovery succeeded\n")
        yield mlx5(pci, "wait_func_handle_exec_timeout") + cformat(
            "cmd[%d]: %s(0x%x) recovered after timeout\n", 0, "ACCESS_REG", 0x805
        )
        yield mlx5(pci, "cb_timeout_handler") + cformat(
            "cmd[%d]: %s(0x%x) Async, recovered after timeout\n", 3, "QUERY_Q_COUNTER", 0x773
        )
        yield mlx5(pci, "mlx5_pcie_event") + cformat("PCIe slot advertised sufficient power (%uW).\n", 75)
        yield mlx5(pci, "mlx5_pcie_event") + cformat("PCIe slot power capability was not advertised.\n")
        for status in ["Cable plugged", "Cable unplugged", "Cable disabled", "Unknown status"]:
            yield mlx5(pci, "port_module") + cformat("Port module event: module %u, %s\n", 0, status)
        yield ibdev("efa", pci, "rdmap0s29") + cformat("Setup irq:%d name:%s\n", 0, "efa-mgmnt@pci:0000:00:1d.0")


@ENGINES
def test_benign_counterparts_stay_silent(engine_cls):
    lines = list(dict.fromkeys(ln.strip() for ln in benign_lines()))
    assert len(lines) > 100
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [(f.rule, f.message) for f in findings if f.rule in FAMILY] == []
