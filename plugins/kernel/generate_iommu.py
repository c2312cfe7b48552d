"""IOMMU print sites (issue 38): the pack sites-iommu.yaml from plugins/kernel/sites/iommu.tsv.

    python plugins/kernel/generate_iommu.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/iommu.tsv
    python plugins/kernel/generate_iommu.py generate plugins/kernel/sites/iommu.tsv > plugins/kernel/sites-iommu.yaml

Every error-level print of the IOMMU core and the Intel VT-d (DMAR, interrupt remapping, SVM), AMD-Vi and
ARM SMMUv3 drivers is a warning Event ``IOMMUError``: a DMA-remapping fault names the device whose DMA the
IOMMU blocked (a GPU or NIC that wrote where it may not: a driver or hardware fault), an event-log or
command-queue error a failing IOMMU; neither says on its own what it costs the node, so no condition.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "iommu.tsv"
PACK = HERE / "sites-iommu.yaml"
DRIVER = "pcieport"

SPEC = Spec(
    name="iommu",
    paths=[
        "drivers/iommu/iommu.c",
        "drivers/iommu/dma-iommu.c",
        "drivers/iommu/iova.c",
        "drivers/iommu/intel/*.c",
        "drivers/iommu/amd/*.c",
        "drivers/iommu/arm/arm-smmu-v3/*.c",
    ],
)

FAMILY = Family(name="iommu", reason="IOMMUError")

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # dmar_fault(): "DRHD: handling fault status reg %x" comes before the fault records it reads
    # ("[DMA Read NO_PASID] Request device [..] fault addr .. [fault reason ..] ..."), which name the
    # device and the reason: the status register line only sets context for them.
    Exclusion(
        pattern=r"^DMAR: DRHD: handling fault status reg",
        reason="context for the DMAR fault records that follow it (the fault record is the finding)",
        benign=True,
    ),
    # qi_check_fault(): the QI HEAD/PRIOR descriptors follow the "VT-d detected Invalidation ... Error"
    # record they explain.
    Exclusion(
        pattern=r"^DMAR: QI (HEAD|PRIOR): ",
        reason="a detail record of a VT-d invalidation queue error (the error record is the finding)",
    ),
    # amd/iommu.c: dump_dte_entry() and dump_command() after an ILLEGAL_DEV_TABLE_ENTRY or
    # ILLEGAL_COMMAND_ERROR event, and the "device=.. domain=.." line after "Device not attached to
    # domain properly".
    Exclusion(
        pattern=r"^AMD-Vi: (DTE|CMD)\[%d\]: |^AMD-Vi:   device=",
        reason="a detail record of an AMD-Vi event log report (the event record is the finding)",
    ),
    # amd/init.c: the BIOS-bug advice after "Can not reserve memory region", and "Disabling interrupt
    # remapping" after the IVRS IOAPIC check that failed (its own record is the finding).
    Exclusion(
        pattern=r"^AMD-Vi: (This is a BIOS bug\. Please contact|Disabling interrupt remapping)",
        reason="the second record of a two-record AMD-Vi message (the first is the finding)",
    ),
    # arm_smmu_cmdq_skip_err(): after "CMDQ error (cons ..): <name>", "retrying command fetch" or
    # "skipping command in error state:" and the command's words, one a record.
    Exclusion(
        pattern=r"^(retrying command fetch|skipping command in error state:|\\t0x%016llx)",
        where=r"arm-smmu-v3\.c:",
        reason="a detail record of an SMMUv3 CMDQ error (the CMDQ error record is the finding)",
    ),
]

LEAVE: list[Exclusion] = []


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_iommu.py",
        extract_path="plugins/kernel/sites/iommu.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
