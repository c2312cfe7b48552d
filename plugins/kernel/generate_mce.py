"""Machine-check, EDAC and thermal print sites (issue 38): the pack sites-mce.yaml from plugins/kernel/sites/mce.tsv.

    python plugins/kernel/generate_mce.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/mce.tsv
    python plugins/kernel/generate_mce.py generate plugins/kernel/sites/mce.tsv > plugins/kernel/sites-mce.yaml

Every error-level print of the x86 machine-check core (Intel, AMD, APEI), the EDAC core and the memory
controller drivers of the hosts these fleets run (Intel skx/i10nm, AMD amd64/mce_amd, GHES), APEI GHES
and the thermal core and Intel thermal throttling that memory-pcie.yaml's specific rules do not already
speak for is a warning Event ``HardwareError``: the print does not say what the failure costs the node;
the uncorrected machine-check and memory conditions stay with memory-pcie.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "mce.tsv"
PACK = HERE / "sites-mce.yaml"
DRIVER = "pcieport"

_EDAC = printsites.Call(level=None, fmt_arg=2, prefix="none", level_arg=0, head="EDAC {1}: ")
_EDAC_MC = printsites.Call(level=None, fmt_arg=2, prefix="none", level_arg=1, head="EDAC MC%d: ")


def _edac_wrapper(name: str) -> printsites.Call:
    return printsites.Call(level=None, fmt_arg=1, prefix="none", level_arg=0, head=f"EDAC {name}: ")


SPEC = Spec(
    name="mce",
    paths=[
        "arch/x86/kernel/cpu/mce/core.c",
        "arch/x86/kernel/cpu/mce/amd.c",
        "arch/x86/kernel/cpu/mce/intel.c",
        "arch/x86/kernel/cpu/mce/apei.c",
        "arch/x86/kernel/cpu/mce/severity.c",
        "arch/x86/kernel/cpu/mce/threshold.c",
        "drivers/edac/edac_mc.c",
        "drivers/edac/edac_device.c",
        "drivers/edac/edac_pci.c",
        "drivers/edac/ghes_edac.c",
        "drivers/edac/skx_common.c",
        "drivers/edac/skx_base.c",
        "drivers/edac/i10nm_base.c",
        "drivers/edac/amd64_edac.c",
        "drivers/edac/mce_amd.c",
        "drivers/acpi/apei/ghes.c",
        "drivers/thermal/thermal_core.c",
        "drivers/thermal/intel/therm_throt.c",
    ],
    calls={
        "edac_printk": _EDAC,
        "edac_mc_printk": _EDAC_MC,
        "edac_mc_chipset_printk": printsites.Call(
            level=None, fmt_arg=3, prefix="none", level_arg=1, head="EDAC {2} MC%d: "
        ),
        "edac_device_printk": printsites.Call(
            level=None, fmt_arg=2, prefix="none", level_arg=1, head="EDAC DEVICE%d: "
        ),
        "edac_pci_printk": printsites.Call(level=None, fmt_arg=2, prefix="none", level_arg=1, head="EDAC PCI%d: "),
        "amd64_err": printsites.Call(level="err", fmt_arg=0, prefix="none", head="EDAC amd64: Error: "),
        "skx_printk": _edac_wrapper("skx"),
        "i10nm_printk": _edac_wrapper("i10nm"),
    },
    macros={"EDAC_MC": "MC", "EDAC_PCI": "PCI", "EDAC_DEBUG": "DEBUG"},
    pr_fmt={"arch/x86/kernel/cpu/mce/*.c": "mce: "},  # internal.h
)

FAMILY = Family(name="mce", reason="HardwareError")

_CORE = r"^arch/x86/kernel/cpu/mce/core\.c:"

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # __print_mce(): "CPU %d: Machine Check%s: %Lx Bank %d: %016Lx" is the report's header, graded by
    # MCi_STATUS in memory-pcie.yaml (kernel/mce-uncorrected, kernel/mce-corrected); the RIP, TSC/ADDR/
    # MISC, PROCESSOR and "Run the above through 'mcelog --ascii'" records are its details.
    Exclusion(
        pattern=r"^mce: \[Hardware Error\]: (RIP|TSC|PROCESSOR|Run the above)",
        where=_CORE,
        reason="a detail record of a machine-check report (the CPU/Bank/MCi_STATUS header is its finding)",
    ),
    # mce_panic() (5.10): "Some CPUs didn't answer in synchronization" when a CPU missed the rendezvous,
    # printed after the report and before the panic; the report's header and the panic are the findings.
    Exclusion(
        pattern=r"^mce: \[Hardware Error\]: Some CPUs didn't answer in synchronization",
        where=_CORE,
        reason="a detail record of a machine-check panic (the report's header and the panic are its findings)",
    ),
    # amd_decode_mce() (EDAC mce_amd): one report per MCE, its first record decode_error_status()
    # ("Uncorrected, software containable error." / "System Fatal error." / ... are memory-pcie.yaml's
    # machine-check findings; "Corrected error, no action required." is a corrected error, counted from
    # the core's header), then the CPU/MCi_STATUS bits, the bank decode (MCn Error, Ext. Error Code, cache
    # level, internal), Error Addr, PPIN, IPID, SYND, TSC: the report's details.
    Exclusion(
        pattern=r"^\[Hardware Error\]: ",
        where=r"^drivers/edac/mce_amd\.c:",
        reason="a record of an AMD machine-check decode report (its severity record is graded by memory-pcie.yaml)",
    ),
    Exclusion(
        pattern=r"^You shouldn't be seeing MC3 MCE",
        where=r"^drivers/edac/mce_amd\.c:",
        reason="a detail record of an AMD machine-check decode report (bank 3 on a family without one)",
    ),
]

LEAVE: list[Exclusion] = []


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_mce.py",
        extract_path="plugins/kernel/sites/mce.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
