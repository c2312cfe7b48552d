"""Software RAID (md) print sites (issue 38): the pack sites-md.yaml from plugins/kernel/sites/md.tsv.

    python plugins/kernel/generate_md.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/md.tsv
    python plugins/kernel/generate_md.py generate plugins/kernel/sites/md.tsv > plugins/kernel/sites-md.yaml

Every error-level print of the md core and its personalities (raid0, raid1, raid10, raid4/5/6, the
bitmap, the cluster and the journal/ppl code: ``md: ...``, ``md/raid1:md0: ...``) is a warning Event
``MDRaidError``: a member disk failed or was kicked out, a read or write could not be recovered, an array
could not be assembled or started. The print does not say what the failure costs the node (a degraded
array still serves), so it sets no condition. The device-mapper targets under drivers/md are
generate_dm.py's.
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
    printk_pr_fmt=False,
)

FAMILY = Family(name="md", reason="MDRaidError")

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = []

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
