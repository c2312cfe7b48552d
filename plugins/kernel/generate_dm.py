"""Device-mapper print sites (issue 38): the pack sites-dm.yaml from plugins/kernel/sites/dm.tsv.

    python plugins/kernel/generate_dm.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/dm.tsv
    python plugins/kernel/generate_dm.py generate plugins/kernel/sites/dm.tsv > plugins/kernel/sites-dm.yaml

Every error-level print of the device-mapper core and its targets (linear, striped, crypt, verity,
integrity, thin provisioning and its metadata, cache, snapshot, multipath, raid, mirror, writecache,
...) and the persistent-data library under thin, cache and era is a warning Event
``DeviceMapperError``: DMERR/DMERR_LIMIT/DMCRIT print "device-mapper: <target>: <message>"
(include/linux/device-mapper.h), which says a table load, a metadata operation or an I/O of a mapped
device failed, not what that costs the node, so it sets no condition. DMWARN and DMINFO are below
error level and are no sites.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Call, Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "dm.tsv"
PACK = HERE / "sites-dm.yaml"
DRIVER = "nvme"

# DM_FMT(fmt): DM_NAME ": " DM_MSG_PREFIX ": " fmt "\n", each file defining its DM_MSG_PREFIX.
_HEAD = "device-mapper: {DM_MSG_PREFIX}: "

SPEC = Spec(
    name="dm",
    paths=["drivers/md/dm*.c", "drivers/md/persistent-data/*.c"],
    calls={
        "DMERR": Call(level="err", fmt_arg=0, prefix="pr", head=_HEAD),
        "DMERR_LIMIT": Call(level="err", fmt_arg=0, prefix="pr", head=_HEAD),
        "DMCRIT": Call(level="crit", fmt_arg=0, prefix="pr", head=_HEAD),
        # dm-writecache.c: writecache_error(wc, err, msg, ...) is DMERR(msg, ...) for the first error.
        "writecache_error": Call(level="err", fmt_arg=2, prefix="pr", head=_HEAD),
        # dm-zoned: DMERR("(%s): " format, zmd->label) and DMERR("(%pg): " format, dev->bdev).
        "dmz_zmd_err": Call(level="err", fmt_arg=1, prefix="pr", head=_HEAD + "(%s): "),
        "dmz_dev_err": Call(level="err", fmt_arg=1, prefix="pr", head=_HEAD + "(%pg): "),
    },
)

FAMILY = Family(name="dm", reason="DeviceMapperError")

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # The DMERR inside a wrapper macro's own body: the wrapper's callers are the sites (SPEC.calls).
    Exclusion(
        pattern=r"^device-mapper: writecache: \{msg\}$",
        where=r"^drivers/md/dm-writecache\.c:",
        reason="the writecache_error macro's own body: its callers are listed as the sites",
    ),
    Exclusion(
        pattern=r"^device-mapper: zoned metadata: \(%s\): \{format\}$",
        where=r"^drivers/md/dm-zoned-metadata\.c:",
        reason="the dmz_zmd_err macro's own body: its callers are listed as the sites",
    ),
    # dm_table_add_target(): DMERR("%s: %s: %s (%pe)", device, target type, ti->error, errno) after a
    # target's constructor failed. Its text is the target's error string, set by the constructor
    # (hundreds of them, in every target): the format has only the "device-mapper: table: " prefix,
    # which the table code's warnings and notices share, so a pattern from it would fire on those.
    Exclusion(
        pattern=r"^device-mapper: table: %s: %s: %s \(%pe\)$",
        where=r"^drivers/md/dm-table\.c:",
        reason="only conversions after the prefix (the target's own error string): too generic to tell apart",
    ),
    # check_for_metadata_space(): DMERR("%s", ooms_reason), the reason a string set just above ("Could
    # not get free metadata blocks", "No free metadata blocks"); the pool then goes out-of-metadata-space,
    # which notify_of_pool_mode_change() reports at info level (no site).
    Exclusion(
        pattern=r"^device-mapper: thin: %s$",
        where=r"^drivers/md/dm-thin\.c:",
        reason="only a conversion after the prefix (a reason string chosen by the caller): too generic to tell apart",
    ),
    # rs_check_reshape() and friends: after "Reshaping raid sets not yet supported by metadata. (raid
    # layout change keeping level)", tab-indented records compare the current and the new layout,
    # stripe size, disk count and raid10 copies: the first record is the finding.
    Exclusion(
        pattern=r"^device-mapper: raid: \t ",
        where=r"^drivers/md/dm-raid\.c:",
        reason="a detail record of a refused raid reshape (the 'not yet supported' record is the finding)",
    ),
    # configure_discard_support(): a raid456 set on devices that discard prints these two records at
    # every table load unless dm-raid.devices_handle_discard_safely=Y; the set works, without discards.
    Exclusion(
        pattern=r"^device-mapper: raid: (raid456 discard support disabled|Set dm-raid\.devices_handle_discard_safely)",
        where=r"^drivers/md/dm-raid\.c:",
        reason="a healthy raid456 set prints it at table load (discards off by default): no fault",
        benign=True,
    ),
    # parse_raid_params(): a raid1 table with a chunk size; the parameter is ignored and the table loads.
    Exclusion(
        pattern=r"^device-mapper: raid: Ignoring chunk size parameter for RAID 1",
        where=r"^drivers/md/dm-raid\.c:",
        reason="a raid1 table's ignored chunk size: the table loads, no fault",
        benign=True,
    ),
    # pad_uncommitted(): DMCRIT of the journal counters right after WARN_ON() of the same check; the
    # "WARNING: CPU:" report is kernel/warning's finding, the counters its detail.
    Exclusion(
        pattern=r"^device-mapper: integrity: journal_sections %u, journal_section_entries",
        where=r"^drivers/md/dm-integrity\.c:",
        reason="the detail record of a WARN_ON report (kernel/warning's WARNING: CPU: header is the finding)",
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
        generator="plugins/kernel/generate_dm.py",
        extract_path="plugins/kernel/sites/dm.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
