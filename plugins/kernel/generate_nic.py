"""AWS NIC print sites, ENA and EFA (issue 38): the pack sites-nic.yaml from plugins/kernel/sites/nic.tsv.

    python plugins/kernel/generate_nic.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/nic.tsv
    python plugins/kernel/generate_nic.py generate plugins/kernel/sites/nic.tsv > plugins/kernel/sites-nic.yaml

Every error-level print of the ENA Ethernet driver (drivers/net/ethernet/amazon/ena: its netif_err and
netdev_err wrappers, dev_err at probe) and of the EFA RDMA driver (drivers/infiniband/hw/efa: ibdev_err and
ibdev_err_ratelimited) that network.yaml's specific rules do not already speak for is a warning Event
``NICError``: a failed queue creation, a register read that timed out, a probe step that failed. The print
does not say what it costs the node (the driver often resets the device and carries on), so it sets no
condition; the keep-alive, lost-completion, admin-queue and reset failures, and EFA's admin command timeouts
and device failures, stay with network.yaml's rules (their own reasons, conditions and thresholds).

ibdev_printk prints "<driver> <PCI address> <IB device>: " (drivers/infiniband/core/device.c), the shape of
netdev_printk's prefix, so the ibdev sites are listed with the netdev prefix kind. The in-tree 6.1 copy of
ENA is the source here; Amazon's out-of-tree driver (amzn/amzn-drivers, kernel/linux/ena) prints through
the same wrappers with some messages reworded: its lines match where the wording is the same.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Call, Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "nic.tsv"
PACK = HERE / "sites-nic.yaml"
# The device prefix each file's prints render with: the driver that owns the device.
DRIVER = {"drivers/net/ethernet/amazon/ena/*": "ena", "drivers/infiniband/hw/efa/*": "efa"}


def _levels(base: str, fmt_arg: int) -> dict[str, Call]:
    """``<base>_err`` ... ``<base>_emerg`` and their _ratelimited/_once forms, printed with a device prefix."""
    return {
        f"{base}_{level}{suffix}": Call(level=level, fmt_arg=fmt_arg, prefix="netdev")
        for level in ("err", "crit", "alert", "emerg")
        for suffix in ("", "_ratelimited", "_once")
    }


SPEC = Spec(
    name="nic",
    paths=[
        "drivers/net/ethernet/amazon/ena/*.c",
        "drivers/infiniband/hw/efa/*.c",
    ],
    calls={
        # include/linux/netdevice.h: netif_err(priv, type, dev, fmt, ...) is netdev_err(dev, fmt, ...)
        # when the adapter's msg_enable has the type (ENA enables the error types by default).
        **_levels("netif", 3),
        # include/rdma/ib_verbs.h: ibdev_err(ibdev, fmt, ...), ibdev_err_ratelimited(ibdev, fmt, ...).
        **_levels("ibdev", 1),
    },
    # ena_com.h defines pr_fmt(fmt) KBUILD_MODNAME ": " fmt for the files that include it (5.10's ena_com.c
    # printed with pr_err: "ena: Reading reg failed for timeout. ..."; 6.1's prints through netdev_err).
    pr_fmt={
        "drivers/net/ethernet/amazon/ena/ena_com.c": "ena: ",
        "drivers/net/ethernet/amazon/ena/ena_eth_com.c": "ena: ",
    },
)

FAMILY = Family(name="nic", reason="NICError", device_prefix=r"(?:ena|efa) ")

_ENA = r"^drivers/net/ethernet/amazon/ena/"
_ENA_ETHTOOL = r"^drivers/net/ethernet/amazon/ena/ena_ethtool\.c:"

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its first record's.
# "(?:ena: )?": 5.10's ena_com.c printed with pr_err and ena_com.h's pr_fmt, 6.1's with netdev_err.
EXCLUSIONS: list[Exclusion] = [
    # ena_dump_stats_ex(): after "Trigger reset is on" (network.yaml kernel/ena-reset-triggered) and
    # "Destroy failure, restarting device", one "<counter name>: <value>" record per ethtool counter.
    Exclusion(
        pattern=r"^(?:ena: )?%s: %llu",
        where=_ENA_ETHTOOL,
        reason="a counter record of the statistics dump after a reset trigger (the trigger record is the finding)",
    ),
    # ena_tx_timeout() is the ndo_tx_timeout dev_watchdog() calls right after its "NETDEV WATCHDOG:
    # CPU: ..: transmit queue .. timed out" record (kernel/netdev-tx-timeout-cpu).
    Exclusion(
        pattern=r"^(?:ena: )?Transmit time out",
        where=_ENA,
        reason="the driver's record of a transmit timeout the NETDEV WATCHDOG record already reported",
    ),
    # create_queues_with_size_backoff(): "Not enough memory to create queues with sizes TX=, RX=" is
    # the failure; "Retrying ..." the next step of the same back-off.
    Exclusion(
        pattern=r"^(?:ena: )?Retrying queue creation with sizes",
        where=_ENA,
        reason="the second record of a queue-creation back-off (the 'Not enough memory' record is the finding)",
    ),
    # ena_fw_reset_device(): printed when the reset ENA made after a fault has brought the device back;
    # the fault and "Trigger reset is on" were reported before it.
    Exclusion(
        pattern=r"^(?:ena: )?Device reset completed successfully",
        where=_ENA,
        reason="a success notice at error level: the device is back after a reset whose cause was the finding",
        benign=True,
    ),
    # ena_com_dev_reset() and efa_com_dev_reset(): the steps of a device reset. Its caller reports the
    # outcome: at probe "Can not reset device" / "EFA device init failed" (rules here), in ENA's reset
    # flow "Reset attempt failed. Can not reset the device" (network.yaml kernel/ena-reset-failed) or
    # "Device reset completed successfully"; on teardown (remove, a failed probe's unwinding) the device
    # is going away. The same words in both drivers: a text rule could not tell them apart.
    Exclusion(
        pattern=r"^(?:ena: )?(Reset indication didn't turn (on|off)|Device isn't ready, can't reset device)",
        reason="a step of an ENA/EFA device reset: the caller's record of the reset's outcome is the finding",
        benign=True,
    ),
    # ena_com.c: "Memory allocation failed" alone: words every driver prints (NVRM's "Memory allocation
    # failed for GFID tracking" too), so a text rule on them would speak for other drivers' lines; the
    # queue or probe step that failed prints its own record after it.
    Exclusion(
        pattern=r"^(?:ena: )?Memory allocation failed\\n$",
        where=r"^drivers/net/ethernet/amazon/ena/ena_com\.c:",
        reason="generic words other drivers print too; the failed step's own record (the caller's) is the finding",
    ),
    # ena_com_config_llq_info(): the device does not offer the driver's default LLQ stride, entry size
    # or descriptors-before-header, and the driver uses one it does offer ("performing fallback").
    Exclusion(
        pattern=r"^(?:ena: )?Default llq .* is not supported, performing fallback",
        where=_ENA,
        reason="an informational notice at error level: the driver picks an LLQ setting the device supports",
        benign=True,
    ),
    # ena_set_queues_placement_policy() (5.10): a device without LLQ; the driver places the queues in host
    # memory and returns 0 (6.1 no longer prints it at error level). Older instance types print it at every probe.
    Exclusion(
        pattern=r"^(?:ena: )?LLQ is not supported Fallback to host mode policy",
        where=_ENA,
        reason="an informational notice at error level: the driver uses host-memory queues on a device without LLQ",
        benign=True,
    ),
    # ena_ethtool.c: the answer to an ethtool request (rxnfc commands, hash functions) the driver does
    # not support; the caller gets -EOPNOTSUPP. Tuning tools (irqbalance, tuned, ethtool -X) make these on healthy hosts.  # noqa: E501
    Exclusion(
        pattern=r"^(?:ena: )?(Command parameter (%d )?is not supported|Unsupported hfunc)",
        where=_ENA_ETHTOOL,
        reason="the driver refusing an ethtool request it does not support (the caller gets the error)",
        benign=True,
    ),
    # efa_com_cmd.c: each admin command wrapper prints its own "Failed to <verb> ..." after
    # efa_com_cmd_exec() printed "Failed to submit/process command %s (opcode %u) ..." (network.yaml
    # kernel/efa-command-failed, counted per device: a rule here would give an Event per rejection).
    # The get_feature users print after efa_com_get_feature_ex()'s own "Failed to submit get_feature".
    # efa_com_cmd_exec(): network.yaml kernel/efa-command-failed counts these per device (10 in 10
    # minutes, the burst the ratelimit lets through): one rejected command alone is no finding, by design.
    Exclusion(
        pattern=r"^Failed to (submit|process) command %s \(opcode %u\)",
        where=r"^drivers/infiniband/hw/efa/efa_com\.c:",
        reason="network.yaml kernel/efa-command-failed: counted per device, an Event past 10 in 10 minutes",
    ),
    Exclusion(
        pattern=r"^Failed to (?!get device attr api version)",
        where=r"^drivers/infiniband/hw/efa/efa_com_cmd\.c:",
        reason="the caller's record of a failed EFA admin command (efa_com_cmd_exec's record is the finding)",
    ),
]

# Sites network.yaml's specific rules speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(
        pattern=r"^(?:ena: )?(Keep alive watchdog timeout|ENA admin queue is not in running state"
        r"|The number of lost tx "
        r"completions is above|Potential MSIX issue on|Reset attempt failed\. Can not reset|Trigger reset is on)",
        where=_ENA,
        reason="network.yaml kernel/ena-* (keep-alive, admin queue, lost completions, MSI-X, reset)",
    ),
    Exclusion(
        pattern=r"^(The device (didn't send any completion|sent a completion but the driver didn't receive)"
        r"|Wait for completion \(polling\) timeout|Admin queue is closed|Device isn't ready, abort com init)",
        where=r"^drivers/infiniband/hw/efa/efa_com\.c:",
        reason="network.yaml kernel/efa-* and kernel/ib-completion-timeout (admin queue, device not ready)",
    ),
]


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_nic.py",
        extract_path="plugins/kernel/sites/nic.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
