"""PCI, AER and DPC print sites (issue 38): the pack sites-pci.yaml from plugins/kernel/sites/pci.tsv.

    python plugins/kernel/generate_pci.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/pci.tsv
    python plugins/kernel/generate_pci.py generate plugins/kernel/sites/pci.tsv > plugins/kernel/sites-pci.yaml

Every error-level print of the PCI core, the PCIe port services (AER, DPC, EDR, the error recovery of
err.c) and the PCIe hotplug driver that memory-pcie.yaml's specific rules do not already speak for is a
warning Event ``PCIError``: the print does not say what the failure costs the node (a failed BAR
assignment, a link that did not train, a reset that timed out), so it sets no condition; the
uncorrectable AER and failed recovery conditions stay with memory-pcie.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "pci.tsv"
PACK = HERE / "sites-pci.yaml"
DRIVER = "pcieport"

SPEC = Spec(
    name="pci",
    paths=[
        "drivers/pci/pcie/aer.c",
        "drivers/pci/pcie/dpc.c",
        "drivers/pci/pcie/edr.c",
        "drivers/pci/pcie/err.c",
        "drivers/pci/pcie/portdrv_*.c",
        "drivers/pci/pcie/aspm.c",
        "drivers/pci/pcie/ptm.c",
        "drivers/pci/pci.c",
        "drivers/pci/probe.c",
        "drivers/pci/setup-*.c",
        "drivers/pci/iov.c",
        "drivers/pci/quirks.c",
        "drivers/pci/hotplug/pciehp_*.c",
    ],
    # aer.c prints a report with pci_printk(level, ...): KERN_ERR for uncorrectable errors.
    calls={"pci_printk": printsites.Call(level="err", fmt_arg=2, prefix="dev")},
)

FAMILY = Family(name="pci", reason="PCIError")

_AER = r"^drivers/pci/pcie/aer\.c:"
_DPC_RP_PIO = r"^drivers/pci/pcie/dpc\.c:(19\d|2[0-3]\d)$"  # dpc_process_rp_pio_error()

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # aer_print_error() and __aer_print_error(): after the "PCIe Bus Error: severity=..." header (the
    # report's finding, memory-pcie.yaml's for the uncorrected forms; a corrected report prints at
    # KERN_WARNING and is no finding) come its detail records. kernel/pcie-aer-detail-in-report keeps them
    # quiet inside a report; a rule of their own would make one report several findings.
    Exclusion(
        pattern=r"^ *(TLP Header: |\[%2d\] |device \[%04x:%04x\] error status/mask=|Error of this Agent)",
        where=_AER,
        reason="a detail record of an AER report: the report's header is its finding",
    ),
    # cper_print_aer(): the firmware-first (GHES) form of the same report, "aer_status:" first. An
    # uncorrected one is memory-pcie.yaml's kernel/pcie-uncorrected-fallback finding on its
    # "aer_uncor_severity:" record; a corrected one (no aer_uncor_severity record) is a corrected error,
    # which the native path prints at KERN_WARNING and no rule reports.
    Exclusion(
        pattern=r"^aer_(status|layer)",
        where=_AER,
        reason="a record of a firmware-first AER report: its uncorrected form is reported on aer_uncor_severity",
    ),
    # dpc_process_rp_pio_error(): runs from dpc_process_error() right after the "containment event"
    # record (memory-pcie.yaml's kernel/pcie-dpc-containment finding); the RP PIO status, severity, bit
    # names, header and prefix logs are that event's details.
    Exclusion(
        pattern=r"^DPC: (rp_pio_status|RP PIO (severity|ImpSpec)|\[%2d\]|TLP (Prefix )?Header)",
        where=_DPC_RP_PIO,
        reason="a detail record of a DPC containment event (RP PIO log): the containment event is its finding",
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(
        pattern=r"^aer_uncor_severity: ",
        where=_AER,
        reason="memory-pcie.yaml kernel/pcie-uncorrected-fallback (PCIeUncorrectableError)",
    ),
]


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_pci.py",
        extract_path="plugins/kernel/sites/pci.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
