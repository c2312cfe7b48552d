"""Block layer, NVMe, SCSI and libata print sites (issue 38): the pack sites-block.yaml from
plugins/kernel/sites/block.tsv.

    python plugins/kernel/generate_block.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/block.tsv
    python plugins/kernel/generate_block.py generate plugins/kernel/sites/block.tsv > plugins/kernel/sites-block.yaml

Every error-level print of the block core (block/, partitions), the NVMe host driver (PCIe, fabrics,
TCP, RDMA, multipath), the SCSI midlayer and its disk, CD-ROM and generic drivers (sd, sr, sg) and libata
that storage.yaml's specific rules do not already speak for is a warning Event ``StorageError``: the print
does not say what the failure costs the node (a controller that did not answer Identify, a fabric queue
that failed to connect, a link reset that gave up), so it sets no condition; the I/O error, timeout and
dead-device conditions stay with storage.yaml.

The SCSI and libata wrappers print a device prefix of their own, rendered here as the kernel writes it:
``sd H:C:T:L: `` (sdev_printk: dev_printk on the scsi_device, "sd" standing for whichever upper driver is
bound), ``[disk] `` after it (sd_printk), ``[disk] tag#N `` (scmd_printk), ``scsi hostN: `` (shost_printk),
``ataN: `` / ``ataN.DD: `` (ata_port_err, ata_link_err, ata_dev_err: pr_err with the port's print id).
Plain dev_err sites (the NVMe controller ``nvme nvmeN: ``, a PCI host adapter ``ahci 0000:00:17.0: ``, a
SCSI host or target) must begin with such a device prefix (``DEVICE_PREFIX``): their text alone ("Failed
to map data", "unable to set any I/O queues") is what many drivers print.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Call, Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "block.tsv"
PACK = HERE / "sites-block.yaml"
DRIVER = "nvme"

# drivers/scsi/scsi_logging.c: sdev_prefix_printk and scmd_printk print through dev_printk on the
# scsi_device ("<upper driver> <host>:<channel>:<id>:<lun>: "), then "[<disk>] " and "tag#<tag> ".
_SDEV = "sd %u:%u:%u:%llu: "

SPEC = Spec(
    name="block",
    paths=[
        "block/*.c",
        "block/partitions/*.c",
        "drivers/nvme/host/core.c",
        "drivers/nvme/host/pci.c",
        "drivers/nvme/host/fabrics.c",
        "drivers/nvme/host/tcp.c",
        "drivers/nvme/host/rdma.c",
        "drivers/nvme/host/multipath.c",
        "drivers/nvme/host/ioctl.c",
        "drivers/nvme/host/zns.c",
        "drivers/nvme/host/hwmon.c",
        "drivers/nvme/host/auth.c",
        "drivers/nvme/host/nvme.h",
        "drivers/scsi/scsi.c",
        "drivers/scsi/hosts.c",
        "drivers/scsi/scsi_error.c",
        "drivers/scsi/scsi_lib.c",
        "drivers/scsi/scsi_scan.c",
        "drivers/scsi/scsi_sysfs.c",
        "drivers/scsi/scsi_logging.c",
        "drivers/scsi/scsi_ioctl.c",
        "drivers/scsi/scsi_devinfo.c",
        "drivers/scsi/sd.c",
        "drivers/scsi/sd_zbc.c",
        "drivers/scsi/sr.c",
        "drivers/scsi/sr_ioctl.c",
        "drivers/scsi/sg.c",
        "drivers/scsi/scsi_proc.c",
        "drivers/scsi/scsi_dh.c",
        "drivers/scsi/scsi_transport_sas.c",
        "drivers/scsi/ses.c",
        "drivers/ata/libata-*.c",
        "drivers/ata/libahci.c",
        "drivers/ata/ahci.c",
    ],
    # KBUILD_MODNAME of the files whose pr_fmt prints it (drivers/nvme/host/Makefile, block/Makefile).
    modules={
        "drivers/nvme/host/fabrics.c": "nvme_fabrics",
        "drivers/nvme/host/tcp.c": "nvme_tcp",
        "drivers/nvme/host/rdma.c": "nvme_rdma",
        "block/bounce.c": "bounce",
        "block/sed-opal.c": "sed_opal",
    },
    calls={
        "sdev_printk": Call(level=None, fmt_arg=2, prefix="none", level_arg=0, head=_SDEV),
        "sdev_prefix_printk": Call(level=None, fmt_arg=3, prefix="none", level_arg=0, head=_SDEV + "[%s] "),
        "sd_printk": Call(level=None, fmt_arg=2, prefix="none", level_arg=0, head=_SDEV + "[%s] "),
        "sd_first_printk": Call(level=None, fmt_arg=2, prefix="none", level_arg=0, head=_SDEV + "[%s] "),
        "scmd_printk": Call(level=None, fmt_arg=2, prefix="none", level_arg=0, head=_SDEV + "[%s] tag#%d "),
        "shost_printk": Call(level=None, fmt_arg=2, prefix="none", level_arg=0, head="scsi host%d: "),
        "starget_printk": Call(level=None, fmt_arg=2, prefix="none", level_arg=0, head="scsi target%d:%d:%d: "),
        # block/partitions/ldm.c: _ldm_printk prints "%s%s(): %pV\n" with the level and __func__.
        "ldm_crit": Call(level="crit", fmt_arg=0, prefix="none", head="%s(): "),
        "ldm_error": Call(level="err", fmt_arg=0, prefix="none", head="%s(): "),
        # include/linux/libata.h: pr_err("ata%u: " fmt, ap->print_id) (a link behind a port multiplier
        # prints "ata%u.%02u: " as a device does).
        "ata_port_err": Call(level="err", fmt_arg=1, prefix="pr", head="ata%u: "),
        "ata_link_err": Call(level="err", fmt_arg=1, prefix="pr", head="ata%u: "),
        "ata_dev_err": Call(level="err", fmt_arg=1, prefix="pr", head="ata%u.%02u: "),
    },
)

# A dev_err site's line begins with its device: an NVMe controller, a PCI function (the NVMe or ATA host
# adapter), a SCSI host or target.
DEVICE_PREFIX = (
    r"(?:nvme nvme\d+|\S+ [0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]|scsi (?:host\d+|target\d+:\d+:\d+)): "
)

FAMILY = Family(name="block", reason="StorageError", device_prefix=DEVICE_PREFIX)

_ATA_EH_REPORT = r"^drivers/ata/libata-eh\.c:(2[34]\d\d)$"  # ata_eh_link_report()

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # ata_eh_link_report(): "exception Emask 0x%x SAct 0x%x SErr 0x%x action 0x%x" (per device or per
    # link) is the report's header and this pack's finding; the description, SError bits, each failed
    # command with its taskfile ("cmd .../res ..."), and the decoded status and error registers are its
    # detail records.
    Exclusion(
        pattern=r"^ata%u(\.%02u)?: (%s\\n$|SError: |failed command: |cmd %02x|status: |error: )",
        where=_ATA_EH_REPORT,
        reason="a detail record of a libata error-handler report (its 'exception Emask' header is the finding)",
    ),
    # ata_to_sense_error(): prints only with verbose set, which its callers pass for drivers without
    # new-style error handling (!ap->ops->error_handler); the failed command is reported by the EH report
    # and the block layer's I/O error line.
    Exclusion(
        pattern=r"^ata%u: translated ATA stat/err ",
        where=r"^drivers/ata/libata-scsi\.c:",
        reason="the sense translation of a failed command, printed only for old-style (no-EH) ATA drivers",
    ),
    # nvme_log_error(): a failed I/O command. kernel/nvme-io-error (storage.yaml) grades it by status code
    # type (media and path errors are findings); the request's failure itself is blk_print_req_error's
    # "I/O error, dev nvme0n1, sector ..." line (kernel/block-io-error), printed right after.
    Exclusion(
        pattern=r"^%s: %s\(0x%x\) @ LBA ",
        where=r"^drivers/nvme/host/core\.c:",
        reason="a failed NVMe I/O command: graded by kernel/nvme-io-error, its request reported as a block I/O error",
    ),
    # nvme_log_error() for an admin command (no namespace): "nvme0: Get Features(0xa), Invalid Field in
    # Command (sct 0x0 / sc 0x2)" is what a healthy controller answers a tool probing optional features
    # or log pages (nvme-cli, smartctl, the udev rules); the caller gets the status back.
    Exclusion(
        pattern=r"^%s: %s\(0x%x\), %s \(sct ",
        where=r"^drivers/nvme/host/core\.c:",
        reason="an admin command's error status (a healthy controller's answer to an optional feature probe)",
        benign=True,
    ),
    # nvme_print_device_info() and nvme_pci_print_device_info(): the controller's identity, printed by
    # nvme_init_ns_head() just before the "ignoring nsid %d because of duplicate IDs" / "clearing duplicate
    # IDs for nsid %d" record it explains; "use of /dev/disk/by-id/ may cause data corruption" follows
    # the latter.
    Exclusion(
        pattern=r"^VID:(DID )?%04x",
        reason="the controller identity printed with a duplicate namespace ID report (the report is the finding)",
    ),
    Exclusion(
        pattern=r"^use of /dev/disk/by-id/ may cause data corruption",
        where=r"^drivers/nvme/host/core\.c:",
        reason="the second record of 'clearing duplicate IDs for nsid' (that record is the finding)",
    ),
    # nvmf_log_connect_error(): the failing field's wording is a local variable ("Connect Invalid Data
    # Parameter", "Connect Invalid SQE Parameter"); the printed text ", cntlid: %d" / ", qid %d" is too
    # short to tell from other prints. The failed connect returns its error to the nvme connect that asked
    # for it, and an I/O queue's is reported again as "failed to connect queue: %d ret=%d".
    Exclusion(
        pattern=r"^%s, (cntlid: %d|qid %d)\\n$",
        where=r"^drivers/nvme/host/fabrics\.c:",
        reason="a Connect rejection worded in a variable, too little literal text; the connect's caller gets the error",
    ),
    # blk_integrity_compare():
    # md and device-mapper compare their members' integrity profiles when stacking; a mismatch (disks of
    # different protection formats in one array) makes the stack go without integrity, and is printed on
    # healthy machines that mix disks.
    Exclusion(
        pattern=r"^blk_integrity_compare: %s/%s (protection interval|tuple sz|tag sz|type) ",
        where=r"^block/blk-integrity\.c:",
        reason="an integrity-profile mismatch of stacked devices (md/dm drop integrity for the stack): configuration",
        benign=True,
    ),
    # queue_state_write(): the answer to a root's write of an unknown word to /sys/kernel/debug/block/<dev>/state.
    Exclusion(
        pattern=r"^queue_state_write: (operation too long|unsupported operation|use 'run')",
        where=r"^block/blk-mq-debugfs\.c:",
        reason="the reply to a bad command written to a queue's debugfs 'state' file (operator input)",
        benign=True,
    ),
    # Amiga RDB partition parsing: a known-bad word of some RDB tools the parser skips while it checks
    # the block; the table is still read.
    Exclusion(
        pattern=r"^Trashed word at 0xd0 in block %llu ignored",
        where=r"^block/partitions/amiga\.c:",
        reason="an informational note of the Amiga partition parser (a word it skips), the table is read",
        benign=True,
    ),
    # nvme_pci_alloc_dev quirk: Samsung PM1725 controllers get a smaller queue depth; printed at error
    # level on every probe of a healthy one.
    Exclusion(
        pattern=r"^detected PM1725 NVMe controller, set queue depth",
        where=r"^drivers/nvme/host/pci\.c:",
        reason="a quirk applied at probe of a healthy Samsung PM1725 (an informational print at error level)",
        benign=True,
    ),
    # ahci_port_suspend(): the wording is ahci_deinit_port()'s message in a variable ("failed to stop
    # engine"), the printed literal "%s (%d)" tells nothing; the port is frozen, and EH's report follows
    # on resume.
    Exclusion(
        pattern=r"^ata%u: %s \(%d\)\\n$",
        where=r"^drivers/ata/libahci\.c:",
        reason="an AHCI port suspend failure worded in a variable (too little literal text); the frozen port's EH reports",  # noqa: E501
    ),
    # ldm_parse_cmp3/dgr3/dsk3/dsk4/prt3/vol5() and ldm_relative(): the field checks of one VBLK record
    # of a Windows LDM (dynamic disk) database; ldm_parse_vblk() prints "Failed to parse VBLK 0x%llx
    # (type: 0x%02x)." right after the one that failed, and that record is the finding.
    Exclusion(
        pattern=r"^%s\(\): (r_\w+ %d < 0|len %d [<>] |!buffer|offset \(%d\) < 0|base \(%d\) )",
        where=r"^block/partitions/ldm\.c:",
        reason="a field check of an LDM VBLK record: the 'Failed to parse VBLK' record that follows is the finding",
    ),
    # Allocation failures worded generically after the caller's function name (__func__, which the
    # scanner cannot resolve): ": no memory", ": allocation failure" are printed by many drivers, and the
    # page allocator's own "page allocation failure: order:" report precedes them.
    Exclusion(
        pattern=r"^(scsi_dev_info_list_add_keyed|scsi_alloc_target): (no memory|allocation failure)\\n$",
        where=r"^drivers/scsi/(scsi_devinfo|scsi_scan)\.c:",
        reason="a generic allocation failure message (too little literal text); the allocator reports the failure",
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    # blk_print_req_error(): kernel/block-io-error reports it unless the error is not the device's
    # (kernel.block.not-device-errors: "operation not supported", "nonblocking retry", ...); a fallback
    # rule here would report exactly those.
    Exclusion(
        pattern=r"^%s error, dev %s, sector ",
        where=r"^block/blk-mq\.c:",
        reason="storage.yaml kernel/block-io-error (BlockIOError), which decides by the error's name",
    ),
    Exclusion(
        pattern=r"^Device not ready; aborting %s",
        where=r"^drivers/nvme/host/core\.c:",
        reason="storage.yaml kernel/nvme-disabled (NVMeDeviceDisabled)",
    ),
]


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_block.py",
        extract_path="plugins/kernel/sites/block.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
