"""Software RAID (md) print sites (issue 38): the pack sites-md.yaml from plugins/kernel/sites/md.tsv.

    python plugins/kernel/generate_md.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/md.tsv
    python plugins/kernel/generate_md.py generate plugins/kernel/sites/md.tsv > plugins/kernel/sites-md.yaml

Every error-level print of the md core and its personalities (raid0, raid1, raid10, raid4/5/6, the
bitmap, the cluster and the journal/ppl code: ``md: ...``, ``md/raid1:md0: ...``), and every ``pr_warn``
(md predates the pr_err convention: it reports most failures at warning level, raid5's read errors
among them), is a warning Event ``MDRaidError``: a member disk failed or was kicked out, a read or write
could not be recovered, an array could not be assembled or started. The print does not say what the
failure costs the node (a degraded array still serves), so it sets no condition. The device-mapper
targets under drivers/md are generate_dm.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "md.tsv"
PACK = HERE / "sites-md.yaml"
DRIVER = "nvme"

SPEC = Spec(
    name="md",
    paths=["drivers/md/md.c", "drivers/md/md-*.c", "drivers/md/raid*.c"],
    # md's failures at warning level (see above); the rules' maxLevel is the sites' level.
    calls=printsites.call_forms("pr_warn", "warning", 0, "pr"),
    levels=frozenset({"emerg", "alert", "crit", "err", "warn", "warning"}),
    printk_pr_fmt=False,
)

FAMILY = Family(name="md", reason="MDRaidError")

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # Notices md prints with pr_warn on healthy machines: the boot-time autodetection skipping an array it
    # already started or a repeated md= parameter, the cluster module's load banner and its safe-mode note.
    Exclusion(
        pattern=r"^md: (Ignoring %s, already autodetected|md=%s%d, Specified more than once\. Replacing previous)",
        where=r"^drivers/md/md-autodetect\.c:",
        reason="a boot-time notice: the array is started once, the last md= definition is used",
        benign=True,
    ),
    Exclusion(
        pattern=r"^(md-cluster: support raid1 and raid10 \(limited support\)"
        r"|md: Safemode is disabled for clustered mode)",
        reason="the md-cluster module's load banner and its safe-mode note: configuration, not a fault",
        benign=True,
    ),
    # do_md_stop()/md_set_readonly(): an administrator asked to stop or set read-only an array that is open.
    Exclusion(
        pattern=r"^md: %s still in use\.",
        where=r"^drivers/md/md\.c:",
        reason="an administrator's stop of an array still open (mdadm gets -EBUSY): not a fault",
        benign=True,
    ),
    # md_run(): its warning that two members share a physical disk is two records.
    Exclusion(
        pattern=r"^True protection against single-disk failure might be compromised\.",
        where=r"^drivers/md/md\.c:",
        reason="the second record of the 'appears to be on the same physical disk' warning (the first is the finding)",
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = []


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_md.py",
        extract_path="plugins/kernel/sites/md.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
