"""The memory-pcie family (plugins/kernel/memory-pcie.yaml), tested from the format strings the kernel prints.

Every line below is rendered from a kernel format string (the kernel's vsnprintf semantics: ``%u``
of -1 is 4294967295, ``%#x`` of 0 is ``0x0``, ``%s`` may be empty) behind the printk helper's own
prefix (pci_printk/dev_printk with dev_fmt "AER: " or "DPC: ", pr_fmt "mce: " and HW_ERR,
edac_mc_printk and friends, pr_fmt "Memory failure: "), in the wordings of the kernel versions
where a message changed, with edge values, every PCI address form and the optional clauses
present and absent. Each line must produce the expected rule, reason and fields and no other rule
of this family (in particular no family fallback), through both the fast and the reference
matcher. Corrected-error rules must stay quiet below their count and speak at it, per device.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers.kprintf import kprintf as kformat

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

RULE_SET = load_rule_set([builtin_plugins_dir()])
PACK = yaml.safe_load((builtin_plugins_dir() / "kernel" / "memory-pcie.yaml").read_text())
FAMILY = {r["name"] for r in PACK["rules"]}
FALLBACKS = {r["name"] for r in PACK["rules"] if r.get("fallback")}
THRESHOLDS = {r["name"]: r["threshold"] for r in PACK["rules"] if "threshold" in r}
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])

# ---------------------------------------------------------------------------------------------
# Prefixes and the values they carry.

# dev_name() of a PCI device: "%04x:%02x:%02x.%d" (drivers/pci/probe.c); domains above 0xffff
# print more digits (VMD 10000:, Hyper-V 8-digit domains); tools also show the short form.
PCI_ADDRS = ["0000:00:1c.5", "0000:ff:1f.7", "10000:e0:06.0", "c3b7a1f2:00:00.0", "3b:00.0"]
DRIVERS = ["pcieport", "nvidia", "mlx5_core", "nvme", "pci"]


def pci_prefixes(dev_fmt: str) -> Iterator[tuple[str, dict[str, str]]]:
    """pci_printk / dev_printk prefixes "%s %s: " + dev_fmt, with the pci field they carry, and none."""
    for driver, pci in zip(itertools.cycle(DRIVERS), PCI_ADDRS, strict=False):
        yield f"{driver} {pci}: {dev_fmt}", {"pci": pci}
    yield f"dpc 0000:00:10.0:pcie010: {dev_fmt}", {"pci": "0000:00:10.0"}  # a 4.x port service device
    yield dev_fmt, {}


def source_ids() -> Iterator[tuple[tuple[int, int, int, int], str]]:
    """(domain, bus, slot, func) edge values for "%04x:%02x:%02x.%d", with the text they print."""
    for dom, bus, slot, fn in [(0, 0, 0, 0), (0xFFFF, 0xFF, 0x1F, 7), (0x10000, 0x3B, 0, 1), (0xC3B7A1F2, 1, 2, 3)]:
        yield (dom, bus, slot, fn), kformat("%04x:%02x:%02x.%d", dom, bus, slot, fn)


@dataclass
class Case:
    rule: str
    reason: str
    lines: list[str]
    fields: dict[str, Any] = field(default_factory=dict)


CASES: list[Case] = []


def add(rule: str, reason: str, line: str, fields: dict[str, Any] | None = None) -> None:
    """One rendered line; a threshold rule gets its count of the same line (the last one speaks)."""
    count = THRESHOLDS[rule]["count"] if rule in THRESHOLDS else 1
    CASES.append(Case(rule, reason, [line] * count, dict(fields or {})))


# ---------------------------------------------------------------------------------------------
# PCIe AER: drivers/pci/pcie/aer.c (4.19+), drivers/pci/pcie/aer/aerdrv_errprint.c (before).

SEVERITY_OLD = ["Uncorrected (Non-Fatal)", "Uncorrected (Fatal)", "Corrected"]  # before 6.6
SEVERITY_NEW = ["Uncorrectable (Non-Fatal)", "Uncorrectable (Fatal)", "Correctable"]  # 6.6+
LAYERS = ["Physical Layer", "Data Link Layer", "Transaction Layer", "General", ""]
AGENTS = ["Receiver ID", "Requester ID", "Completer ID", "Transmitter ID", ""]
AER_RULE = {
    0: ("kernel/pcie-uncorrected-nonfatal", "PCIeUncorrectableErrorNonFatal", "Non-Fatal"),
    1: ("kernel/pcie-uncorrected-fatal", "PCIeUncorrectableErrorFatal", "Fatal"),
    2: ("kernel/pcie-corrected", "PCIeCorrectedError", None),
}


def _aer_bus_error_lines() -> Iterator[tuple[int, str, dict[str, str]]]:
    """(severity index, line, prefix fields) for every "Bus Error" printer."""
    for sev in range(3):
        for strings in (SEVERITY_OLD, SEVERITY_NEW):
            s = strings[sev]
            # 4.19-6.15: pci_printk(level, dev, "PCIe Bus Error: severity=%s, type=%s, (%s)\n", ...)
            for (prefix, pf), layer, agent in zip(pci_prefixes("AER: "), LAYERS, AGENTS, strict=False):
                yield sev, prefix + kformat("PCIe Bus Error: severity=%s, type=%s, (%s)\n", s, layer, agent), pf
            for prefix, pf in pci_prefixes("AER: "):
                yield (
                    sev,
                    prefix + kformat("PCIe Bus Error: severity=%s, type=Inaccessible, (Unregistered Agent ID)\n", s),
                    pf,
                )
                # 6.16+: aer_printk(level, dev, "%s Bus Error: severity=%s\n", bus_type, ...)
                for bus in ("PCIe", "CXL"):
                    yield sev, prefix + kformat("%s Bus Error: severity=%s\n", bus, s), pf
                    yield sev, prefix + kformat("%s Bus Error: severity=%s (Inaccessible)\n", bus, s), pf
        # before 4.19: dev_err(&dev->dev, "PCIe Bus Error: severity=%s, type=%s, id=%04x(%s)\n", ...)
        for (prefix, pf), agent, ident in zip(pci_prefixes(""), AGENTS, [0, 0xFFFF, 0x00E0, 0x0100], strict=False):
            yield (
                sev,
                prefix
                + kformat(
                    "PCIe Bus Error: severity=%s, type=%s, id=%04x(%s)\n",
                    SEVERITY_OLD[sev],
                    "Transaction Layer",
                    ident,
                    agent,
                ),
                pf,
            )
            yield (
                sev,
                prefix
                + kformat(
                    "PCIe Bus Error: severity=%s, type=Unaccessible, id=%04x(Unregistered Agent ID)\n",
                    SEVERITY_OLD[sev],
                    ident,
                ),
                pf,
            )


for sev, line, pf in _aer_bus_error_lines():
    rule, reason, fatality = AER_RULE[sev]
    add(rule, reason, line, {**pf, **({"fatality": fatality} if fatality else {})})


def _aer_source_lines(sev: int) -> Iterator[tuple[str, dict[str, str]]]:
    """The root port's "error received" line (aer_print_port_info / aer_print_source), every version."""
    for multiple in ("Multiple ", ""):
        for (prefix, pf), (ident, text) in zip(pci_prefixes("AER: "), itertools.cycle(source_ids()), strict=False):
            s_old, s_new = SEVERITY_OLD[sev], SEVERITY_NEW[sev]
            # 4.19-6.9: pci_info(dev, "%s%s error received: %04x:%02x:%02x.%d\n", ...) ("Corrected" until 6.6)
            for s in (s_old, s_new):
                yield (
                    prefix + kformat("%s%s error received: %04x:%02x:%02x.%d\n", multiple, s, *ident),
                    {**pf, "source": text},
                )
            # 6.10-6.15: "%s%s error message received from %04x:%02x:%02x.%d%s\n"
            for details in ("", " (no details found)"):
                yield (
                    prefix
                    + kformat(
                        "%s%s error message received from %04x:%02x:%02x.%d%s\n", multiple, s_new, *ident, details
                    ),
                    {**pf, "source": text},
                )
                # 6.16+: "%s%s Error message%s from %04x:%02x:%02x.%d%s\n"
                yield (
                    prefix
                    + kformat(
                        "%s%s Error message%s from %04x:%02x:%02x.%d%s\n",
                        multiple,
                        s_new,
                        "s received, first one" if multiple else " received",
                        *ident,
                        details,
                    ),
                    {**pf, "source": text},
                )
        # before 4.19: dev_info(&dev->dev, "AER: %s%s error received: id=%04x\n", ...)
        for (prefix, pf), ident in zip(pci_prefixes(""), [0, 0xFFFF, 0x00E0], strict=False):
            yield (
                prefix + kformat("AER: %s%s error received: id=%04x\n", multiple, SEVERITY_OLD[sev], ident),
                {
                    **pf,
                    "source": kformat("%04x", ident),
                },
            )


for sev in (0, 1):
    rule, reason, fatality = AER_RULE[sev]
    for line, fields in _aer_source_lines(sev):
        add(rule, reason, line, {**fields, "fatality": fatality})

# drivers/pci/pcie/err.c (4.19+): pci_info(bridge, "device recovery failed\n") with dev_fmt "AER: ";
# 4.17-4.18 err.c and aerdrv_core.c before: dev_info / pci_info(dev, "AER: Device recovery failed\n").
for prefix, pf in pci_prefixes("AER: "):
    add("kernel/pcie-recovery-failed", "PCIeErrorRecoveryFailed", prefix + kformat("device recovery failed\n"), pf)
for prefix, pf in pci_prefixes(""):
    add("kernel/pcie-recovery-failed", "PCIeErrorRecoveryFailed", prefix + kformat("AER: Device recovery failed\n"), pf)

# drivers/pci/pcie/dpc.c
DPC_STATUS = [0, 0x0009, 0x1F01, 0xFFFF]
for (prefix, pf), status in zip(pci_prefixes("DPC: "), itertools.cycle(DPC_STATUS), strict=False):
    st = kformat("%#06x", status)
    # 4.19-6.15: pci_info(pdev, "containment event, status:%#06x source:%#06x\n", status, source)
    for source in (0, 0x0100, 0xFFFF):
        add(
            "kernel/pcie-dpc-containment",
            "PCIeContainmentEvent",
            prefix + kformat("containment event, status:%#06x source:%#06x\n", status, source),
            {**pf, "status": st, "source_id": kformat("%#06x", source)},
        )
    # 6.16+: the trigger reason on the same line
    add(
        "kernel/pcie-dpc-containment",
        "PCIeContainmentEvent",
        prefix + kformat("containment event, status:%#06x: unmasked uncorrectable error detected\n", status),
        {**pf, "status": st, "trigger": "unmasked uncorrectable error"},
    )
    for trigger, (ident, text) in zip(("ERR_FATAL", "ERR_NONFATAL"), source_ids(), strict=False):
        add(
            "kernel/pcie-dpc-containment",
            "PCIeContainmentEvent",
            prefix
            + kformat("containment event, status:%#06x, %s received from %04x:%02x:%02x.%d\n", status, trigger, *ident),
            {**pf, "status": st, "trigger": trigger, "source": text},
        )
    for trigger in ("RP PIO error", "reserved error"):
        add(
            "kernel/pcie-dpc-containment",
            "PCIeContainmentEvent",
            prefix + kformat("containment event, status:%#06x: %s detected\n", status, trigger),
            {**pf, "trigger": trigger},
        )
    # 4.19-6.15: the trigger on a record of its own after the containment event; read alone, its Event
    for trigger in ("unmasked uncorrectable error", "ERR_NONFATAL", "ERR_FATAL", "RP PIO error", "reserved error"):
        add(
            "kernel/pcie-dpc-trigger",
            "PCIeContainmentEvent",
            prefix + kformat("%s detected\n", trigger),
            {**pf, "trigger": trigger},
        )
# Intel thermal throttling (drivers/thermal/intel/therm_throt.c; before 5.5 "... temperature above threshold, cpu
# clock throttled ...", at times behind pr_fmt "mce: ")
for cpu, level, events in itertools.product((0, 127), ("Core", "Package"), (0, 18446744073709551615)):
    for fmt in (
        "CPU%d: %s temperature is above threshold, cpu clock is throttled (total events = %lu)\n",
        "CPU%d: %s temperature above threshold, cpu clock throttled (total events = %lu)\n",
        "mce: CPU%d: %s temperature above threshold, cpu clock throttled (total events = %lu)\n",
    ):
        add(
            "kernel/cpu-thermal-throttled",
            "CPUThermalThrottled",
            kformat(fmt, cpu, level, events),
            {"cpu": str(cpu), "level": level, "events": str(events)},
        )
# 4.9-4.18 (pcie-dpc.c): dev_info(dev, "DPC containment event, status:%#06x source:%#06x\n") on the service device
for status, source in ((0x1F01, 0), (0, 0xFFFF)):
    add(
        "kernel/pcie-dpc-containment",
        "PCIeContainmentEvent",
        "dpc 0000:00:10.0:pcie010: " + kformat("DPC containment event, status:%#06x source:%#06x\n", status, source),
        {"pci": "0000:00:10.0", "status": kformat("%#06x", status)},
    )

# Family fallback: AER lines that report an uncorrectable error and no specific rule knows.
for prefix, pf in pci_prefixes("AER: "):
    # pci_print_aer() (GHES / firmware-first): "aer_uncor_severity: 0x%08x\n" only for uncorrectable errors
    for sev_mask in (0, 0x00062030, 0xFFFFFFFF):
        add(
            "kernel/pcie-uncorrected-fallback",
            "PCIeUncorrectableErrorUnclassified",
            prefix + kformat("aer_uncor_severity: 0x%08x\n", sev_mask),
            pf,
        )
    # a wording no version printed yet: the fallback still speaks
    add(
        "kernel/pcie-uncorrected-fallback",
        "PCIeUncorrectableErrorUnclassified",
        prefix + "Uncorrectable (Fatal) error reported by 0000:01:00.0",
        pf,
    )
# before 4.19: cper_print_aer() dev_err(&dev->dev, "aer_uncor_severity: 0x%08x\n") without "AER: "
add(
    "kernel/pcie-uncorrected-fallback",
    "PCIeUncorrectableErrorUnclassified",
    "pcieport 0000:00:01.0: " + kformat("aer_uncor_severity: 0x%08x\n", 0x00062030),
)

# ---------------------------------------------------------------------------------------------
# Machine checks: arch/x86/kernel/cpu/mce/core.c (pr_fmt "mce: ", HW_ERR "[Hardware Error]: "),
# drivers/edac/mce_amd.c (HW_ERR only). Before 4.x some lines had no "mce: ".

MCE_PREFIXES = ["mce: ", ""]
HW_ERR = "[Hardware Error]: "

for pfx in MCE_PREFIXES:
    add("kernel/mce-logged", "MachineCheckEvent", pfx + HW_ERR + kformat("Machine check events logged\n"))
add("kernel/mce-logged", "MachineCheckEvent", "Machine check events logged")  # 2.6: no HW_ERR

# __print_mce: pr_emerg(HW_ERR "CPU %d: Machine Check%s: %Lx Bank %d: %016Lx\n", ...); MCi_STATUS
# bit 61 (UC) set: the first of the 16 hex digits is 2, 3, 6, 7, a, b, e or f.
UC_STATUS = [0xB200000000070F0F, 0xBE00000000800400, 0xFD0000000000017A, 0x2000000000000000, 0xE600000000000000]
for pfx, cpu, exc, mcg, bank, status in zip(
    itertools.cycle(MCE_PREFIXES),
    [0, 255, -1, 8191, 3],
    itertools.cycle([" Exception", ""]),
    [5, 0, 7, -1, 0x10],
    [0, 31, 4, 6, -1],
    UC_STATUS,
    strict=False,
):
    text = kformat("%016Lx", status)
    add(
        "kernel/mce-uncorrected",
        "MachineCheckUncorrectedError",
        pfx + HW_ERR + kformat("CPU %d: Machine Check%s: %Lx Bank %d: %016Lx\n", cpu, exc, mcg, bank, status),
        {"cpu": str(cpu), "bank": str(bank), "status": text},
    )
# mce_amd.c decode_error_status(): pr_emerg(HW_ERR "%s\n", ...)
for recovery in ("restartable", "containable"):
    add(
        "kernel/mce-uncorrected",
        "MachineCheckUncorrectedError",
        HW_ERR + kformat("%s\n", f"Uncorrected, software {recovery} error."),
        {"recovery": recovery},
    )

for pfx in MCE_PREFIXES:
    for addr in (0, 0x3F1A2B4000, 0xFFFFFFFFFFFFFFFF):
        text = kformat("%llx", addr)
        add(
            "kernel/mce-uncorrected-memory",
            "MachineCheckUncorrectedMemoryError",
            pfx + kformat("Uncorrected hardware memory error in user-access at %llx", addr),
            {"addr": text, "context": "user-access"},
        )
        add(
            "kernel/mce-uncorrected-memory",
            "MachineCheckUncorrectedMemoryError",
            pfx + kformat("Kernel accessed poison in user space at %llx\n", addr),
            {"addr": text},
        )
    add(
        "kernel/mce-uncorrected-memory",
        "MachineCheckUncorrectedMemoryError",
        pfx + kformat("Memory error not recovered"),
    )
    for pfn in (0, 0x3F1A2B, 0xFFFFFFFFFFFFF):
        # the message continues "\nRebuild kernel with ..." on its own line
        line = kformat(
            "Uncorrected memory error in page 0x%lx ignored\n"
            "Rebuild kernel with CONFIG_MEMORY_FAILURE=y for smarter handling\n",
            pfn,
        )
        add(
            "kernel/mce-uncorrected-memory",
            "MachineCheckUncorrectedMemoryError",
            pfx + line.split("\n")[0],
            {"pfn": kformat("0x%lx", pfn)},
        )

# mce_panic(msg, ...) -> panic(msg): kernel/panic.c "Kernel panic - not syncing: %s\n"
MCE_PANICS = [
    "Fatal machine check",
    "Fatal Machine check",  # 3.x
    "Fatal local machine check",
    "Local fatal machine check!",
    "Fatal machine check on current CPU",
    "Fatal machine check from unknown source",
    "Machine check from unknown source",  # 2.6
    "Failed kernel mode recovery",
    "Too many consecutive machine checks while accessing user data",
    "Consecutive machine checks to different user pages",
    "Timeout: Not all CPUs entered broadcast exception handler",
    "Timeout: Subject CPUs unable to finish machine check processing",
    "Timeout: Monarch CPU unable to finish machine check processing",
    "Timeout: Monarch CPU did not finish machine check processing",
    "Panicing machine check CPU died",
    "MCA architectural violation!\n",
]
for msg in MCE_PANICS:
    add("kernel/mce-fatal", "MachineCheckFatal", kformat("Kernel panic - not syncing: %s\n", msg).split("\n")[0])
# mce_panic: pr_emerg(HW_ERR "Machine check: %s\n", exp), exp from severity.c
for pfx in MCE_PREFIXES:
    for exp in (
        "Processor context corrupt",
        "Action required with lost events",
        "Uncorrected",
        "Overflowed uncorrected",
        "Action required: data load in error recoverable area of kernel",
        "Unknown",
    ):
        add(
            "kernel/mce-fatal",
            "MachineCheckFatal",
            pfx + HW_ERR + kformat("Machine check: %s\n", exp),
            {"explanation": exp},
        )
add("kernel/mce-fatal", "MachineCheckFatal", HW_ERR + kformat("%s\n", "System Fatal error."))  # mce_amd.c, UC and PCC

# CMCI storm: intel.c (3.8-6.7) and threshold.c (6.8+)
for pfx in MCE_PREFIXES:
    add(
        "kernel/mce-cmci-storm",
        "MachineCheckCorrectedErrorStorm",
        pfx + kformat("CMCI storm detected: switching to poll mode\n"),
    )
    for cpu, bank in ((0, 0), (8191, 31), (-1, -1)):
        add(
            "kernel/mce-cmci-storm",
            "MachineCheckCorrectedErrorStorm",
            pfx + kformat("CPU%d BANK%d CMCI storm detected\n", cpu, bank),
            {"cpu": str(cpu), "bank": str(bank)},
        )

# Family fallback: any "mce: " line that reports an uncorrected error and no specific rule knows.
for msg in (
    HW_ERR + kformat("Fake kernel panic: %s\n", "Fatal machine check"),
    "Uncorrected error in bank 4 ignored",
    "[Hardware Error]: uncorrectable error found by patrol scrub on socket 1",
):
    add("kernel/mce-uncorrected-fallback", "MachineCheckUncorrectedErrorUnclassified", "mce: " + msg)

# ---------------------------------------------------------------------------------------------
# EDAC: drivers/edac/edac_mc.c, edac_device.c; prefixes from edac_mc.h.

EDAC_MC_PREFIXES = [("EDAC MC%d: ", None), ("EDAC %s MC%d: ", "skx"), ("EDAC %s MC%d: ", "sbridge")]
LABELS = [
    "CPU_SrcID#0_MC#1_Chan#0_DIMM#1",
    "DIMM_A1 or DIMM_B1",
    "unknown memory",
    "any memory",
    "mc#0csrow#1channel#0",
]
LOCATIONS = ["channel:0 slot:1", "node:0 card:2 module:3", "memory:0", ""]
MSGS = ["memory read error", "memory scrubbing error", "Single-bit ECC", "", "patrol scrub error"]
OTHER = [
    "err_code:0x0000:0x009f socket:0 imc:1 rank:0 bg:0 ba:0 row:0x1a2b col:0x3c8",
    "APEI location: node:0 card:0 module:0",
    "",
]


def edac_prefix(mc: int, i: int) -> str:
    fmt, chip = EDAC_MC_PREFIXES[i % len(EDAC_MC_PREFIXES)]
    return kformat(fmt, chip, mc) if chip else kformat(fmt, mc)


def _edac_lines(kind: str) -> Iterator[tuple[str, dict[str, str]]]:
    """Every printer of a corrected (CE) or uncorrected (UE) memory controller error."""
    combos = zip(
        [0, 1, 7, -1, 63],
        [1, 0, 65535, -1, 3],
        itertools.cycle(MSGS),
        itertools.cycle(LABELS),
        itertools.cycle(LOCATIONS),
        itertools.cycle(OTHER),
        strict=False,
    )
    for i, (mc, count, msg, label, loc, other) in enumerate(combos):
        pre = edac_prefix(mc, i)
        fields = {"ctl": "MC", "mc": str(mc), "count": str(count), "label": label}
        sp = " " if msg else ""
        # 5.8+: "%d CE %s%son %s (%s page:0x%lx offset:0x%lx grain:%ld syndrome:0x%lx%s%s)\n"
        if kind == "CE":
            yield (
                pre
                + kformat(
                    "%d CE %s%son %s (%s page:0x%lx offset:0x%lx grain:%ld syndrome:0x%lx%s%s)\n",
                    count,
                    msg,
                    sp,
                    label,
                    loc,
                    0x3AD4F,
                    0x340,
                    32,
                    0,
                    " - " if other else "",
                    other,
                ),
                fields,
            )
        else:
            yield (
                pre
                + kformat(
                    "%d UE %s%son %s (%s page:0x%lx offset:0x%lx grain:%ld%s%s)\n",
                    count,
                    msg,
                    sp,
                    label,
                    loc,
                    0xFFFFFFFFFFFFF,
                    0,
                    -1,
                    " - " if other else "",
                    other,
                ),
                fields,
            )
        # 3.5-5.7: "%d CE %s%son %s (%s %s - %s)\n" and "%d CE %s%son %s (%s %s)\n"
        detail = kformat("page:0x%lx offset:0x%lx grain:%ld syndrome:0x%lx", 0, 0, 1, 0xFFFF)
        yield pre + kformat(f"%d {kind} %s%son %s (%s %s - %s)\n", count, msg, sp, label, loc, detail, other), fields
        yield pre + kformat(f"%d {kind} %s%son %s (%s %s)\n", count, msg, sp, label, loc, detail), fields
    # before 3.5: edac_mc_handle_ce / _ue / _no_info / _fbd_*
    for mc, i in ((0, 0), (3, 1), (-1, 2)):
        pre = edac_prefix(mc, i)
        fields = {"ctl": "MC", "mc": str(mc)}
        if kind == "CE":
            yield (
                pre
                + kformat(
                    'CE page 0x%lx, offset 0x%lx, grain %d, syndrome 0x%lx, row %d, channel %d, label "%s": %s\n',
                    0x1F00,
                    0,
                    64,
                    0xAB,
                    2,
                    -1,
                    "DIMM_A1",
                    "i5000 CE",
                ),
                fields,
            )
            yield pre + kformat('CE row %d, channel %d, label "%s": %s\n', 0, 1, "", "FBD CE"), fields
        else:
            yield (
                pre
                + kformat(
                    'UE page 0x%lx, offset 0x%lx, grain %d, row %d, labels "%s": %s\n',
                    0,
                    0xFFF,
                    1,
                    -1,
                    "A1:B1",
                    "UE msg",
                ),
                fields,
            )
            yield (
                pre
                + kformat('UE row %d, channel-a= %d channel-b= %d labels "%s": %s\n', 2, 0, 1, "DIMM_A2-DIMM_B2", ""),
                fields,
            )
        yield pre + kformat(f"{kind} - no information available: %s\n", "INTERNAL ERROR"), fields
        yield pre + kformat(f"{kind} - no information available: %s\n", ""), fields
    # edac_device.c: "CE: %s instance: %s block: %s count: %d '%s'\n" (before 6.x without count)
    for dev, count in ((0, 1), (12, -1)):
        pre = kformat("EDAC DEVICE%d: ", dev)
        fields = {"ctl": "DEVICE", "mc": str(dev)}
        yield (
            pre
            + kformat(
                f"{kind}: %s instance: %s block: %s count: %d '%s'\n", "cortex_a72_edac", "cpu2", "L2", count, "L2 ECC"
            ),
            fields,
        )
        yield pre + kformat(f"{kind}: %s instance: %s block: %s '%s'\n", "qcom_llcc", "llcc0", "N/A", ""), fields


for line, fields in _edac_lines("CE"):
    add("kernel/edac-ce", "EDACCorrectableError", line, fields)
for line, fields in _edac_lines("UE"):
    add("kernel/edac-ue", "EDACUncorrectableError", line, fields)
for mc in (0, 15):
    # panic("EDAC MC%d: Uncorrected Error") (edac_mc_handle_ue_no_info with panic_on_ue, before 3.5)
    add(
        "kernel/edac-ue",
        "EDACUncorrectableError",
        kformat("Kernel panic - not syncing: EDAC MC%d: Uncorrected Error", mc),
        {"mc": str(mc)},
    )

# ---------------------------------------------------------------------------------------------
# Memory failure: mm/memory-failure.c action_result().

PAGE_TYPES = [
    "reserved kernel page",
    "high-order kernel page",
    "kernel slab page",
    "different compound page after locking",
    "huge page",
    "free huge page",
    "non-pmd-sized huge page",
    "unmapping failed page",
    "dirty swapcache page",
    "clean swapcache page",
    "dirty mlocked LRU page",
    "clean mlocked LRU page",
    "dirty unevictable LRU page",
    "clean unevictable LRU page",
    "dirty LRU page",
    "clean LRU page",
    "already truncated LRU page",
    "free buddy page",
    "dax page",
    "unsplit thp",
    "already poisoned",
    "non struct page pfn",
    "get hwpoison page",
    "unknown page",
]
FAILED = ["Ignored", "Failed"]


def _memory_failure_lines(results: list[str]) -> Iterator[tuple[str, dict[str, str]]]:
    for page_type, result, pfn in zip(
        PAGE_TYPES, itertools.cycle(results), itertools.cycle([0, 0x3F1A2B, 0xFFFFFFFFFFFFF]), strict=False
    ):
        text = kformat("%#lx", pfn)
        # 4.16+: pr_err("%#lx: recovery action for %s: %s\n") with pr_fmt "Memory failure: "
        yield (
            "Memory failure: " + kformat("%#lx: recovery action for %s: %s\n", pfn, page_type, result),
            {
                "pfn": text,
                "page_type": page_type,
                "result": result,
            },
        )
        # 4.1-4.15: pr_err("MCE %#lx: recovery action for %s: %s\n")
        yield kformat("MCE %#lx: recovery action for %s: %s\n", pfn, page_type, result), {"pfn": text, "result": result}
    for msg, result in zip(
        ["dirty LRU", "free huge", "kernel", "unknown page state"], itertools.cycle(results), strict=False
    ):
        # before 4.1: pr_err("MCE %#lx: %s page recovery: %s\n"); 2.6.32-3.x: "MCE %#lx: %s%s page recovery: %s\n"
        yield kformat("MCE %#lx: %s page recovery: %s\n", 0x8F12A, msg, result), {"result": result}
        yield kformat("MCE %#lx: %s%s page recovery: %s\n", 0, "dirty ", msg, result), {"result": result}


for line, fields in _memory_failure_lines(FAILED):
    add("kernel/memory-failure", "MemoryFailure", line, fields)

# ---------------------------------------------------------------------------------------------
# Corrected machine checks: __print_mce (core.c) and the EDAC chipset drivers' copy of its line
# (sb_edac/pnd2 "CPU %d: Machine Check %s: %Lx Bank %d: %016Lx\n", skx_common "... %s: 0x%llx Bank
# %d: %016Lx\n", "Exception" or "Event", behind edac_mc_chipset_printk "EDAC %s MC%d: "). UC (bit
# 61) clear: the first hex digit is 0, 1, 4, 5, 8, 9, c or d.

CE_STATUS = [0x0000000000000000, 0x1000000000000000, 0x4400000000000001, 0x5FFFFFFFFFFFFFFF]
CE_STATUS += [0x8C00004F000800C2, 0x9000004000010005, 0xCC00008000010090, 0xDFFFFFFFFFFFFFFF]
EDAC_MCE = [
    ("sbridge", "CPU %d: Machine Check %s: %Lx Bank %d: %016Lx\n"),
    ("pnd2", "CPU %u: Machine Check %s: %llx Bank %u: %llx\n"),
    ("skx", "CPU %d: Machine Check %s: 0x%llx Bank %d: %016Lx\n"),
]
for i, status in enumerate(CE_STATUS):
    cpu, mcg, bank = [0, 255, 8191, 3][i % 4], [0, 5, 0x10, 0xFFFFFFFFFFFFFFFF][i % 4], [0, 31, 11, 7][i % 4]
    text = kformat("%016Lx", status)
    add(
        "kernel/mce-corrected",
        "MachineCheckCorrectedError",
        MCE_PREFIXES[i % 2]
        + HW_ERR
        + kformat(
            "CPU %d: Machine Check%s: %Lx Bank %d: %016Lx\n", cpu, ["", " Exception"][i % 2], mcg, bank, status
        ).strip(),
        {"cpu": str(cpu), "bank": str(bank), "status": text},
    )
    chip, fmt = EDAC_MCE[i % 3]
    for kind in ("Event", "Exception"):
        add(
            "kernel/mce-corrected",
            "MachineCheckCorrectedError",
            kformat("EDAC %s MC%d: ", chip, i) + kformat(fmt, cpu, kind, mcg, bank, status).strip(),
            {"edac": chip, "mc": str(i), "cpu": str(cpu), "bank": str(bank), "status": text},
        )
# The same EDAC line with UC set is an uncorrected machine check.
for i, status in enumerate(UC_STATUS):
    chip, fmt = EDAC_MCE[i % 3]
    add(
        "kernel/mce-uncorrected",
        "MachineCheckUncorrectedError",
        kformat("EDAC %s MC%d: ", chip, i) + kformat(fmt, i, ["Exception", "Event"][i % 2], 5, 7, status).strip(),
        {"edac": chip, "edac_status": kformat("%016Lx", status)},
    )
for pfx in MCE_PREFIXES:  # genpool.c pr_warn_ratelimited("MCE records pool full!\n")
    add("kernel/mce-records-lost", "MachineCheckRecordsLost", pfx + kformat("MCE records pool full!\n").strip())

# ---------------------------------------------------------------------------------------------
# AER error recovery steps: drivers/pci/pcie/err.c, aer.c (dev_fmt "AER: " on 4.19+; the 4.19-5.x
# wording carried "AER: " in the text itself).

for prefix, fields in pci_prefixes("AER: "):
    if not fields:
        continue
    driver = prefix.split(" ")[0]
    add(
        "kernel/pcie-no-recovery-callback",
        "PCIeNoErrorRecoveryCallback",
        prefix + kformat("can't recover (no error_detected callback)\n").strip(),
        {**fields, "driver": driver},
    )
    add(
        "kernel/pcie-link-reset-failed",
        "PCIeLinkResetFailed",
        prefix + kformat("subordinate device reset failed\n").strip(),
        fields,
    )
    add("kernel/pcie-link-reset-failed", "PCIeLinkResetFailed", prefix + kformat("link reset failed\n").strip(), fields)
    for port, rc in (("Root", -25), ("Downstream", -1), ("Root", 2147483647), ("Downstream", -2147483648)):
        add(
            "kernel/pcie-link-reset-failed",
            "PCIeLinkResetFailed",
            prefix + kformat("%s Port link has been reset (%d)\n", port, rc).strip(),
            {**fields, "port": port, "rc": str(rc)},
        )
    for flr in (kformat("not reset (no FLR support: %d)\n", -25), kformat("not reset (no FLR support)\n")):
        add("kernel/pcie-link-reset-failed", "PCIeLinkResetFailed", prefix + flr.strip(), fields)
for (prefix, fields), (sid, (dom, bus, slot, fn)) in itertools.product(
    [p for p in [*pci_prefixes("AER: "), *pci_prefixes("")] if p[1]],
    [(0x00E5, (0, 0, 0x1C, 5)), (0, (0, 0, 0, 0)), (0xFFFF, (0xFFFF, 0xFF, 0x1F, 7))],
):
    add(
        "kernel/pcie-aer-source-not-found",
        "PCIeErrorSourceNotFound",
        prefix + kformat("can't find device of ID%04x\n", sid).strip(),
        {**fields, "source_id": kformat("%04x", sid)},
    )
    add(
        "kernel/pcie-aer-source-not-found",
        "PCIeErrorSourceNotFound",
        prefix + kformat("found no error details for %04x:%02x:%02x.%d\n", dom, bus, slot, fn).strip(),
        {**fields, "source": kformat("%04x:%02x:%02x.%d", dom, bus, slot, fn)},
    )
for prefix, fields in pci_prefixes(""):
    if not fields:
        continue
    driver = prefix.split(" ")[0]
    add(  # 4.19-5.x: pci_info(dev, "AER: Can't recover (no error_detected callback)\n")
        "kernel/pcie-no-recovery-callback",
        "PCIeNoErrorRecoveryCallback",
        prefix + kformat("AER: Can't recover (no error_detected callback)\n").strip(),
        {**fields, "driver": driver},
    )
    for what in ("no AER-aware driver", "no error-aware driver", "no driver"):  # KERN_DEBUG, before 4.19
        add(
            "kernel/pcie-no-recovery-callback",
            "PCIeNoErrorRecoveryCallback",
            prefix + kformat("device has %s\n", what).strip(),
            {**fields, "driver": driver},
        )
    for pci in ("0000:00:1c.0", "10000:e0:06.0"):  # KERN_DEBUG, 4.17-5.4
        add(
            "kernel/pcie-link-reset-failed",
            "PCIeLinkResetFailed",
            prefix + kformat("link reset at upstream device %s failed\n", pci).strip(),
            {**fields, "upstream": pci},
        )
        add(
            "kernel/pcie-link-reset-failed",
            "PCIeLinkResetFailed",
            prefix + kformat("no link-reset support at upstream device %s\n", pci).strip(),
            {**fields, "unsupported": pci},
        )

# ---------------------------------------------------------------------------------------------
# Benign look-alikes rendered from the same sources: successful recoveries, corrected errors
# below their threshold (one each), banners and the context lines of a record.

BENIGN: list[str] = [line for line, _ in _memory_failure_lines(["Recovered", "Delayed"])]
for prefix, _pf in pci_prefixes("AER: "):
    BENIGN += [
        prefix + kformat("device recovery successful\n"),
        prefix + kformat("%s%s error received: %04x:%02x:%02x.%d\n", "", "Corrected", 0, 0, 0x1C, 5),
        prefix
        + kformat("%s%s error message received from %04x:%02x:%02x.%d%s\n", "Multiple ", "Correctable", 0, 3, 0, 0, ""),
        prefix
        + kformat("%s%s Error message%s from %04x:%02x:%02x.%d%s\n", "", "Correctable", " received", 0, 3, 0, 0, ""),
        prefix + kformat("  device [%04x:%04x] error status/mask=%08x/%08x\n", 0x8086, 0xA33C, 0x1000, 0x2000),
        prefix + kformat("   [%2d] %-22s%s\n", 0, "RxErr", " (First)"),
        prefix + kformat("   [%2d] %-22s%s\n", 13, "NonFatalErr", ""),
        prefix
        + kformat("  [%2d] %-17s | %-11s | %-17s%s\n", 14, "CmpltTO", "Requester", "Transaction Layer", " (First)"),
        prefix + kformat("  TLP Header: %08x %08x %08x %08x\n", 0x4A000001, 0x1000004, 0, 0),
        prefix + kformat("aer_status: 0x%08x, aer_mask: 0x%08x\n", 0x1, 0x2000),
        prefix + kformat("aer_layer=%s, aer_agent=%s\n", "Physical Layer", "Receiver ID"),
        prefix + kformat("%s Port link has been reset (%d)\n", "Root", 0),
        prefix + kformat("enabled with IRQ %d\n", 122),
    ]
for prefix, _pf in pci_prefixes("DPC: "):
    BENIGN += [
        prefix + kformat("containment event, status:%#06x: %s detected\n", 0x1F11, "software trigger"),
        prefix + kformat("%s detected\n", "software trigger"),  # 4.19-6.15: a DPC trigger set on purpose
        prefix + kformat("enabled with IRQ %d\n", 26),
    ]
BENIGN += [
    "mce: " + HW_ERR + kformat("Machine check events logged\n"),
    "mce: " + HW_ERR + kformat("CPU %d: Machine Check%s: %Lx Bank %d: %016Lx\n", 5, "", 0, 0, 0x90000040000F0005),
    "mce: " + HW_ERR + kformat("CPU %d: Machine Check%s: %Lx Bank %d: %016Lx\n", 0, "", 0, 7, 0xCC00008000010090),
    "mce: " + HW_ERR + kformat("RIP%s %02x:<%016Lx> \n", " !INEXACT!", 0x10, 0xFFFFFFFF81000000),
    "mce: "
    + HW_ERR
    + kformat("PROCESSOR %u:%x TIME %llu SOCKET %u APIC %x microcode %x\n", 0, 0x50657, 1700000000, 0, 0, 0x5003604),
    "mce: " + kformat("CMCI storm subsided: switching to interrupt mode\n"),
    "mce: " + kformat("CPU%d BANK%d CMCI storm subsided\n", 3, 7),
    HW_ERR + kformat("%s\n", "Corrected error, no action required."),
    HW_ERR
    + kformat("CPU:%d (%x:%x:%x) MC%d_STATUS[%s|%s|%s|%s|%s", 2, 0x17, 0x31, 0, 18, "-", "CE", "MiscV", "AddrV", "-"),
    edac_prefix(0, 0)
    + kformat(
        "%d CE %s%son %s (%s page:0x%lx offset:0x%lx grain:%ld syndrome:0x%lx%s%s)\n",
        1,
        "memory scrubbing error",
        " ",
        LABELS[0],
        LOCATIONS[0],
        1,
        0,
        32,
        0,
        "",
        "",
    ),
    "pcieport 0000:00:1c.5: AER: "
    + kformat("PCIe Bus Error: severity=%s, type=%s, (%s)\n", "Corrected", "Physical Layer", "Receiver ID"),
    # The rest of a machine check report and the EDAC drivers' handling lines: silent.
    kformat("EDAC %s MC%d: ", "sbridge", 3) + kformat("HANDLING MCE MEMORY ERROR\n").strip(),
    kformat("EDAC %s MC%d: ", "skx", 0) + kformat("HANDLING MCE MEMORY ERROR\n").strip(),
    kformat("EDAC %s MC%d: ", "sbridge", 3) + kformat("TSC %llx ", 0) + kformat("ADDR %llx ", 0x12345000),
    kformat("EDAC %s MC%d: ", "sbridge", 3)
    + kformat("PROCESSOR %u:%x TIME %llu SOCKET %u APIC %x\n", 0, 0x306E7, 1422553404, 0, 0).strip(),
    "mce: "
    + HW_ERR
    + kformat("TSC %llx ", 0x2E62D7B5C)
    + kformat("ADDR %llx ", 0x12345000)
    + kformat("MISC %llx ", 0x144780C86),
    "mce: " + HW_ERR + kformat("Run the above through 'mcelog --ascii'\n").strip(),
    "mce: " + HW_ERR + kformat("Some CPUs didn't answer in synchronization\n").strip(),
    # Recovery steps that went well, and the debug broadcast lines.
    "pcieport 0000:00:1c.2: AER: " + kformat("Root Port link has been reset\n").strip(),
    "pcieport 0000:00:1c.2: AER: " + kformat("Root Port link has been reset (%d)\n", 0).strip(),
    "pcieport 0000:00:1c.2: AER: " + kformat("%s Port link has been reset (%d)\n", "Downstream", 0).strip(),
    "pcieport 0000:00:1c.2: " + kformat("downstream link has been reset\n").strip(),
    "pcieport 0000:00:1c.2: AER: " + kformat("has been reset (%d)\n", 0).strip(),
    *(
        "pcieport 0000:00:1d.0: AER: " + kformat("broadcast %s message\n", m).strip()
        for m in ("error_detected", "mmio_enabled", "slot_reset", "resume")
    ),
    # CPER records belong to the CPER rules (drivers/firmware/efi/cper.c prints these for fatal records)
    "{1}" + HW_ERR + kformat("  aer_uncor_severity: 0x%08x\n", 0x00062030),
]


# ---------------------------------------------------------------------------------------------
# AER report detail lines read alone (drivers/pci/pcie/aer.c __aer_print_error, aer_print_error;
# aerdrv_errprint.c before 4.19): every error-bit name of both generations, each prefix form.

AER_CORRECTABLE = ["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF"]
AER_CORRECTABLE_OLD = [
    "Receiver Error",
    "Bad TLP",
    "Bad DLLP",
    "RELAY_NUM Rollover",
    "Replay Timer Timeout",
    "Advisory Non-Fatal",
    "Corrected Internal Error",
    "Header Log Overflow",
]
AER_UNCORRECTABLE = [
    "Undefined",
    "DLP",
    "SDES",
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
    "UncorrIntErr",
    "BlockedTLP",
    "AtomicOpBlocked",
    "TLPBlockedErr",
    "PoisonTLPBlocked",
    "DMWrReqBlocked",
    "IDECheck",
    "MisIDETLP",
    "PCRC_CHECK",
    "TLPXlatBlocked",
]
AER_UNCORRECTABLE_OLD = [
    "Data Link Protocol",
    "Surprise Down Error",
    "Poisoned TLP",
    "Flow Control Protocol",
    "Completion Timeout",
    "Completer Abort",
    "Unexpected Completion",
    "Receiver Overflow",
    "Malformed TLP",
    "ECRC",
    "Unsupported Request",
    "ACS Violation",
    "Uncorrectable Internal Error",
    "MC Blocked TLP",
    "AtomicOp Egress Blocked",
    "TLP Prefix Blocked Error",
    "Unknown Error Bit",
]
AER_BIT = "   [%2d] %-22s%s\n"
AER_STATUS = "  device [%04x:%04x] error status/mask=%08x/%08x\n"


def _aer_detail_lines(names: list[str]) -> Iterator[tuple[str, dict[str, str]]]:
    prefixes = itertools.cycle([p for p in pci_prefixes("AER: ") if p[1]] + [p for p in pci_prefixes("") if p[1]])
    for (i, name), (prefix, fields) in zip(enumerate(names), prefixes, strict=False):
        first = " (First)" if i % 2 else ""
        text = prefix + kformat(AER_BIT, i % 32, name, first)  # the format's three spaces follow the prefix
        yield text.strip(), {**fields, "error": name, "bit": str(i % 32)}


for _line, _fields in _aer_detail_lines(AER_CORRECTABLE + AER_CORRECTABLE_OLD):
    add("kernel/pcie-aer-detail-corrected", "PCIeCorrectedError", _line, _fields)
for _line, _fields in _aer_detail_lines(AER_UNCORRECTABLE + AER_UNCORRECTABLE_OLD):
    add("kernel/pcie-aer-detail-uncorrected", "PCIeUncorrectableErrorDetail", _line, _fields)
for (_prefix, _fields), (_vendor, _device, _status, _mask) in zip(
    [p for p in pci_prefixes("AER: ") if p[1]],
    [(0x8086, 0xA29A, 1, 0x2000), (0xFFFF, 0, 0xFFFFFFFF, 0), (0x10DE, 0x2330, 0x4000, 0), (0, 0xFFFF, 0, 0xFFFFFFFF)],
    strict=False,
):
    _line = (_prefix + kformat(AER_STATUS, _vendor, _device, _status, _mask)).strip()
    add("kernel/pcie-aer-status", "PCIeErrorReport", _line, {**_fields, "vendor": kformat("%04x", _vendor)})

# ---------------------------------------------------------------------------------------------
# Tests


def _family(findings: list) -> list:
    return [f for f in findings if f.rule in FAMILY]


@ENGINES
@pytest.mark.parametrize("case", CASES, ids=[f"{c.rule}#{i}" for i, c in enumerate(CASES)])
def test_rendered_line_gives_its_rule(engine_cls, case: Case):
    findings = engine_cls(rule_set=RULE_SET).feed(case.lines, times=0.0, line_numbers=1)
    mine = _family(findings)
    assert [(f.rule, f.line) for f in mine] == [(case.rule, len(case.lines))], (case.lines[-1], mine)
    finding = mine[0]
    assert finding.reason == case.reason
    for name, value in case.fields.items():
        assert finding.fields.get(name) == value, (name, case.lines[-1], dict(finding.fields))
    if case.rule not in FALLBACKS:
        assert not [f for f in findings if f.rule in FALLBACKS], "a fallback spoke for a line a specific rule matched"


@ENGINES
@pytest.mark.parametrize("line", BENIGN)
def test_benign_rendered_line_stays_silent(engine_cls, line: str):
    assert engine_cls(rule_set=RULE_SET).feed([line]) == []


QUIET = {"kernel/pcie-aer-detail-in-report", "kernel/pcie-dpc-trigger-in-report"}  # quiet: see the report tests below


@ENGINES
@pytest.mark.parametrize("trigger", ["unmasked uncorrectable error", "ERR_NONFATAL", "ERR_FATAL", "RP PIO error"])
def test_a_containment_event_and_its_trigger_record_are_one_finding(engine_cls, trigger: str):
    lines = [
        "pcieport 0000:00:1c.0: DPC: " + kformat("containment event, status:%#06x source:%#06x\n", 0x1F01, 0).strip(),
        "pcieport 0000:00:1c.0: DPC: " + kformat("%s detected\n", trigger).strip(),
    ]
    findings = engine_cls(rule_set=RULE_SET).feed(lines, times=0.0, line_numbers=1)
    assert [(f.rule, f.line) for f in findings] == [("kernel/pcie-dpc-containment", 1)]


def test_every_rule_of_the_family_has_rendered_cases():
    assert FAMILY - QUIET - {c.rule for c in CASES} == set()


AER_HEADERS = [
    ("PCIe Bus Error: severity=%s, type=%s, (%s)\n", "Corrected", "kernel/pcie-corrected"),
    ("PCIe Bus Error: severity=%s, type=%s, (%s)\n", "Uncorrected (Non-Fatal)", "kernel/pcie-uncorrected-nonfatal"),
    ("PCIe Bus Error: severity=%s, type=%s, (%s)\n", "Uncorrectable (Fatal)", "kernel/pcie-uncorrected-fatal"),
]


@ENGINES
@pytest.mark.parametrize(("fmt", "severity", "rule"), AER_HEADERS, ids=[h[1] for h in AER_HEADERS])
@pytest.mark.parametrize("dev_fmt", ["AER: ", ""], ids=["4.19+", "before"])
def test_a_reports_detail_lines_are_read_in_its_context(engine_cls, fmt, severity, rule, dev_fmt):
    """Header, status line, every bit line, TLP header: only the header speaks for the report."""
    prefix = f"nvidia 0000:3b:00.0: {dev_fmt}"
    names = AER_CORRECTABLE if severity == "Corrected" else AER_UNCORRECTABLE_OLD[:6]
    report = [
        prefix + kformat(fmt, severity, "Transaction Layer", "Requester ID").strip(),
        (prefix + kformat(AER_STATUS, 0x10DE, 0x2330, 0x4000, 0)).strip(),
        *[(prefix + kformat(AER_BIT, i, name, "")).strip() for i, name in enumerate(names)],
        (prefix + kformat("  TLP Header: %08x %08x %08x %08x\n", 0x40000001, 0x0000000F, 0xF7C00000, 0)).strip(),
        (prefix + kformat("  Error of this Agent is reported first\n")).strip(),
    ]
    engine = engine_cls(rule_set=RULE_SET)
    count = THRESHOLDS.get(rule, {}).get("count", 1)
    found = [f for _ in range(count) for f in engine.feed(report, times=0.0, line_numbers=1)]
    assert {(f.rule, f.line) for f in found} == {(rule, 1)}, [(f.rule, f.line) for f in found]


def test_every_rule_names_its_source():
    for rule in PACK["rules"]:
        assert rule.get("provenance"), rule["name"]
        assert all(p.startswith("torvalds/linux:") for p in rule["provenance"]), rule["name"]


# --- corrected errors are counted per device ------------------------------------------------

THRESHOLD_LINES = {
    "kernel/pcie-corrected": lambda dev: (
        f"nvidia {dev}: AER: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitter ID)"
    ),
    "kernel/edac-ce": lambda dev: (
        f"EDAC MC0: 1 CE memory read error on {dev} (channel:0 slot:0 page:0x1 offset:0x0 grain:32 syndrome:0x0)"
    ),
    "kernel/mce-logged": lambda dev: "mce: [Hardware Error]: Machine check events logged",
}
DEVICES = {
    "kernel/pcie-corrected": ("0000:3b:00.0", "0000:86:00.0"),
    "kernel/edac-ce": ("CPU_SrcID#0_MC#0_Chan#0_DIMM#0", "CPU_SrcID#0_MC#0_Chan#1_DIMM#0"),
}


@ENGINES
@pytest.mark.parametrize("rule", sorted(THRESHOLD_LINES))
def test_corrected_errors_speak_only_at_the_threshold(engine_cls, rule):
    count = THRESHOLDS[rule]["count"]
    engine = engine_cls(rule_set=RULE_SET)
    line = THRESHOLD_LINES[rule]("dev-a" if rule not in DEVICES else DEVICES[rule][0])
    assert [f for f in engine.feed([line] * (count - 1), times=0.0) if f.rule == rule] == []
    assert [f.rule for f in engine.feed([line], times=1.0) if f.rule == rule] == [rule]


@ENGINES
@pytest.mark.parametrize("rule", sorted(DEVICES))
def test_corrected_errors_are_counted_per_device(engine_cls, rule):
    count = THRESHOLDS[rule]["count"]
    a, b = (THRESHOLD_LINES[rule](d) for d in DEVICES[rule])
    lines = [a] * (count - 1) + [b] * (count - 1)
    assert [f for f in engine_cls(rule_set=RULE_SET).feed(lines, times=0.0) if f.rule == rule] == []


@ENGINES
@pytest.mark.parametrize("rule", sorted(THRESHOLD_LINES))
def test_corrected_errors_outside_the_window_do_not_add_up(engine_cls, rule):
    from agent.core.durations import parse_duration

    count, window = THRESHOLDS[rule]["count"], parse_duration(THRESHOLDS[rule]["window"])
    line = THRESHOLD_LINES[rule]("dev-a" if rule not in DEVICES else DEVICES[rule][0])
    times = [i * (window / (count - 1) + 1.0) for i in range(count)]
    assert [f for f in engine_cls(rule_set=RULE_SET).feed([line] * count, times=times) if f.rule == rule] == []


# --- fallbacks never double-count, and refine nothing away ----------------------------------


@ENGINES
def test_an_incident_gives_one_finding_per_reporting_line(engine_cls):
    """A fatal AER incident as 6.x prints it: the port and device lines speak, context lines do not."""
    incident = [
        "pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received from 0000:01:00.0",
        "nvidia 0000:01:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, "
        "(Receiver ID)",
        "nvidia 0000:01:00.0: AER:   device [10de:2330] error status/mask=00004000/00000000",
        "nvidia 0000:01:00.0: AER:    [14] CmpltTO                (First)",
        "pcieport 0000:00:01.0: AER: Root Port link has been reset (0)",
        "pcieport 0000:00:01.0: AER: device recovery failed",
    ]
    found = [(f.line, f.rule) for f in _family(engine_cls(rule_set=RULE_SET).feed(incident, line_numbers=1))]
    assert found == [
        (1, "kernel/pcie-uncorrected-fatal"),
        (2, "kernel/pcie-uncorrected-fatal"),
        (6, "kernel/pcie-recovery-failed"),
    ]


@ENGINES
def test_dpc_software_trigger_is_quiet_and_silences_the_fallback(engine_cls):
    line = "pcieport 0000:00:10.0: DPC: containment event, status:0x1f11: software trigger detected"
    assert engine_cls(rule_set=RULE_SET).feed([line]) == []
