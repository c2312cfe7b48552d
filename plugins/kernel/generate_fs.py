"""Filesystem print sites (issue 38): the pack sites-fs.yaml from plugins/kernel/sites/fs.tsv.

    python plugins/kernel/generate_fs.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/fs.tsv
    python plugins/kernel/generate_fs.py generate plugins/kernel/sites/fs.tsv > plugins/kernel/sites-fs.yaml

Every error-level print of the filesystems an accelerator host mounts (XFS and ext4 for local and
instance-store disks, the jbd2 journal under ext4, the NFS client and its SUNRPC transport for shared
datasets and checkpoints, the SMB client, FUSE and virtio-fs, overlayfs under every container) that
storage.yaml's and kernel-monitor.yaml's specific rules and their XFS/ext4 fallbacks do not already speak
for is a warning Event ``FilesystemError``: the print says an operation on a mount failed (a metadata
read, a mount, a reconnect, a copy-up) but not what that costs the node, so it sets no condition; the
shutdown, read-only remount and journal abort conditions stay with those packs.

Lustre (FSx for Lustre) is not in the mainline kernel: its client is an out-of-tree module whose prints
this extract cannot list; the NFS server (fs/nfsd) is left out: accelerator hosts are its clients.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Call, Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "fs.tsv"
PACK = HERE / "sites-fs.yaml"
DRIVER = "nvme"


def _xfs(level: str) -> dict[str, Call]:
    """xfs_<level>(mp, fmt, ...) and its _ratelimited/_once forms: "XFS (<dev>): " (fs/xfs/xfs_message.c)."""
    call = Call(level=level, fmt_arg=1, prefix="none", head="XFS (%s): ")
    return {f"xfs_{level}{suffix}": call for suffix in ("", "_ratelimited", "_once")}


def _ext4(fmt_arg: int, head: str) -> Call:
    """An ext4 error helper (fs/ext4/super.c __ext4_error*): KERN_CRIT, "EXT4-fs error (device <dev>): ..."."""
    return Call(level="crit", fmt_arg=fmt_arg, prefix="none", head="EXT4-fs error (device %s): %s:%d: " + head)


# cifs_dbg(VFS, fmt) prints pr_err("VFS: " fmt) (fs/smb/client/cifs_debug.h); its FYI and NOISY forms
# print at debug level. The server form adds "\\<host> ", the tree-connection form "<share> ".
_VFS = {"VFS": "err"}
# SMB Direct (smbdirect.c): log_<class>(level, fmt) is cifs_dbg(VFS, "%s:%d " fmt, __func__, __LINE__)
# when level <= smbd_logging_level, which is ERR by default: the ERR prints are error-level sites.
_SMBD = {
    name: Call(level=None, fmt_arg=1, prefix="pr", level_arg=0, head="VFS: %s:%d ", level_names={"ERR": "err"})
    for name in (
        "log_outgoing",
        "log_incoming",
        "log_read",
        "log_write",
        "log_rdma_send",
        "log_rdma_recv",
        "log_keep_alive",
        "log_rdma_event",
        "log_rdma_mr",
    )
}

SPEC = Spec(
    name="fs",
    paths=[
        "fs/xfs/*.c",
        "fs/xfs/libxfs/*.c",
        "fs/ext4/*.c",
        "fs/jbd2/*.c",
        "fs/nfs/*.c",
        "net/sunrpc/*.c",
        "fs/smb/client/*.c",
        "fs/cifs/*.c",  # the SMB client before 6.4 (renamed below)
        "fs/fuse/*.c",
        "fs/overlayfs/*.c",
    ],
    calls={
        **_xfs("emerg"),
        **_xfs("alert"),
        **_xfs("crit"),
        **_xfs("err"),
        "xfs_alert_tag": Call(level="alert", fmt_arg=2, prefix="none", head="XFS (%s): "),
        "ext4_error": _ext4(1, "comm %s: "),
        "ext4_error_err": _ext4(2, "comm %s: "),
        "ext4_abort": _ext4(2, "comm %s: "),
        "ext4_error_inode": _ext4(4, "inode #%lu: comm %s: "),
        "ext4_error_inode_err": _ext4(5, "inode #%lu: comm %s: "),
        "ext4_error_inode_block": _ext4(3, "inode #%lu: block %llu: comm %s: "),
        "EXT4_ERROR_INODE": _ext4(1, "inode #%lu: comm %s: "),
        "EXT4_ERROR_INODE_ERR": _ext4(2, "inode #%lu: comm %s: "),
        "ext4_error_file": _ext4(4, "inode #%lu: comm %s: path %s: "),
        "EXT4_ERROR_FILE": _ext4(2, "inode #%lu: comm %s: path %s: "),
        "ext4_grp_locked_error": _ext4(4, "group %u, "),
        # ext4_msg(sb, KERN_ERR, fmt): "EXT4-fs (<dev>): " (__ext4_msg); its level is the second argument.
        "ext4_msg": Call(level=None, fmt_arg=2, prefix="none", level_arg=1, head="EXT4-fs (%s): "),
        "cifs_dbg": Call(level=None, fmt_arg=1, prefix="pr", level_arg=0, head="VFS: ", level_names=_VFS),
        "cifs_server_dbg": Call(
            level=None, fmt_arg=1, prefix="pr", level_arg=0, head=r"VFS: \\\\%s ", level_names=_VFS
        ),
        "cifs_tcon_dbg": Call(level=None, fmt_arg=1, prefix="pr", level_arg=0, head="VFS: %s ", level_names=_VFS),
        **_SMBD,
    },
    renamed={"fs/cifs/": "fs/smb/client/"},
    # The pr_fmt these directories take from a header.
    pr_fmt={
        "fs/smb/client/*.c": "CIFS: ",  # cifs_debug.h
        "fs/overlayfs/*.c": "overlayfs: ",  # overlayfs.h
        "fs/fuse/*.c": "fuse: ",  # fuse_i.h (cuse.c sets its own)
    },
)

# cifs_dbg(VFS, ...) printed "CIFS VFS: " before 5.10's pr_fmt "CIFS: " + "VFS: " (fs/cifs/cifs_debug.h:
# pr_err("CIFS VFS: " fmt)), the form kernels of 4.x and 5.4 still print.
FAMILY = Family(name="fs", reason="FilesystemError", older_prefixes={"CIFS: VFS: ": "CIFS:? VFS: "})

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # The body of smbdirect.c's log_rdma() macro (cifs_dbg(VFS, "%s:%d " fmt, ...)): its callers
    # (log_rdma_event(ERR, "..."), ...) are the sites, each listed with its own text.
    Exclusion(
        pattern=r"^CIFS: VFS: %s:%d \{fmt\}",
        where=r"^fs/smb/client/smbdirect\.c:",
        reason="the log_rdma macro's own body: its callers are listed as the sites",
    ),
    # --- XFS ---
    # xfs_buf_verifier_error() and xfs_inode_verifier_error(): "Metadata %s detected at ..." with %s
    # "corruption" or "CRC error" is storage.yaml's kernel/xfs-corruption line (a specific rule; the
    # site's text names neither word, so a rule here would be its second finding).
    Exclusion(
        pattern=r"^XFS \(%s\): Metadata %s detected at %pS, ",
        where=r"^fs/xfs/xfs_error\.c:",
        reason="storage.yaml kernel/xfs-corruption (XfsCorruption) reports it: %s is corruption or CRC error",
    ),
    # xfs_dabuf_map(): after XFS_IS_CORRUPT's report (xfs_corruption_error: "Corruption detected.
    # Unmount and run xfs_repair"), the block number and one record per extent mapping.
    Exclusion(
        pattern=r"^XFS \(%s\): (%s: bno %u inode %llu|\[%02d\] br_startoff )",
        where=r"^fs/xfs/libxfs/xfs_da_btree\.c:",
        reason="a detail record of an XFS_IS_CORRUPT report (its Corruption detected record is the finding)",
    ),
    # xfs_dir2_node_find_freeblk(): the fblk state after "%s: dir ino %llu needed freesp block ...".
    Exclusion(
        pattern=r"^XFS \(%s\): +(fblk |\.\.\. fblk is NULL)",
        where=r"^fs/xfs/libxfs/xfs_dir2_node\.c:",
        reason="a detail record of a directory freespace corruption report (the needed freesp record is the finding)",
    ),
    # xfs_log_mount(): "Continuing onwards, ..." is the second record of "Log size out of supported range."
    Exclusion(
        pattern=r"^XFS \(%s\): Continuing onwards, but if log hangs",
        where=r"^fs/xfs/xfs_log\.c:",
        reason="the second record of 'Log size out of supported range.' (the first is the finding)",
    ),
    # xlog_space_left(): the tail and grant-head cycles after "xlog_space_left: head behind tail".
    Exclusion(
        pattern=r"^XFS \(%s\):   (tail_cycle|GH   cycle) = ",
        where=r"^fs/xfs/xfs_log\.c:",
        reason="a detail record of 'xlog_space_left: head behind tail' (that record is the finding)",
    ),
    # xlog_verify_*(): inside #if defined(DEBUG) (CONFIG_XFS_DEBUG), which distribution kernels leave off.
    Exclusion(
        pattern=r".",
        where=r"^fs/xfs/xfs_log\.c:(353[7-9]|35[4-9]\d|36\d\d|3700)$",
        reason="built only with CONFIG_XFS_DEBUG (xlog_verify_*), which distribution kernels leave off",
    ),
    # _xfs_alert_tag(): the record before BUG() when xfs_panic_mask names the tag; the kernel BUG
    # report that follows is kernel-monitor.yaml's finding.
    Exclusion(
        pattern=r"^XFS \(%s\): Transforming an alert into a BUG\.",
        where=r"^fs/xfs/xfs_message\.c:",
        reason="the record before a BUG() (fs.xfs.panic_mask set): the kernel BUG report is the finding",
    ),
    # --- ext4 ---
    # ext4_print_free_blocks(): after "Delayed block allocation failed for inode ..." (storage.yaml
    # kernel/ext4-fallback) on ENOSPC, the free, dirty and reserved block counters.
    Exclusion(
        pattern=r"^EXT4-fs \(%s\): (Total free blocks count|Free/Dirty block details|free_blocks=|dirty_blocks="
        r"|Block reservation details|i_reserved_data_blocks=)",
        where=r"^fs/ext4/inode\.c:",
        reason="a detail record of a failed delayed allocation (the Delayed block allocation failed record is the finding)",  # noqa: E501
    ),
    # ext4_orphan_get(): after ext4_error "bad orphan inode %lu" (kernel/ext4-error), the state that
    # made it bad, a record each.
    Exclusion(
        pattern=r"^(ext4_test_bit\(bit=|is_bad_inode\(inode\)=|NEXT_ORPHAN\(inode\)=|max_ino=|i_nlink=)",
        where=r"^fs/ext4/ialloc\.c:",
        reason="a detail record of an ext4 'bad orphan inode' error (the EXT4-fs error record is the finding)",
    ),
    # dump_orphan_list() at unmount: "sb orphan head is %d" is the finding, the list its detail.
    Exclusion(
        pattern=r"^(sb_info orphan list:|  inode %s:%lu at %p: mode )",
        where=r"^fs/ext4/super\.c:",
        reason="a detail record of the orphan list dump (the sb orphan head record is the finding)",
    ),
    # ext4_fill_super(): the block size after "unsupported inode size: %d".
    Exclusion(
        pattern=r"^EXT4-fs \(%s\): blocksize: %lu$",
        where=r"^fs/ext4/super\.c:",
        reason="the second record of 'unsupported inode size' (the first is the finding)",
    ),
    # ext4_mb_normalize_request(): the request's bounds right before BUG() (the kernel BUG report is
    # the finding); ext4_mb_release_inode_pa(): the preallocation's bounds right before
    # ext4_grp_locked_error "free %u, pa_free %u" (kernel/ext4-error): context for the next record.
    Exclusion(
        pattern=r"^EXT4-fs \(%s\): (start %lu, size %lu, fe_logical %lu|pa %p: logic %lu, phys\. %lu, len %d)",
        where=r"^fs/ext4/mballoc\.c:",
        reason="context for the record that follows (a BUG() report, an EXT4-fs error record): that one is the finding",
    ),
    # ext4_ext_release(): extent statistics, built only with EXT_STATS (a developer's #define).
    Exclusion(
        pattern=r"^EXT4-fs: (%lu blocks in %lu extents|extents: %lu min, %lu max)",
        where=r"^fs/ext4/extents\.c:",
        reason="built only with EXT_STATS (a developer's #define, off in every kernel build)",
    ),
    # __ext4_fill_super(): the superblock has no ext4 magic. A mount without -t (or one that tries ext4
    # first) probes each filesystem type in turn, so a healthy node mounting an XFS or vfat volume prints
    # it; ext4_get_journal_blkdev() prints the same text for an external journal device, which a rule
    # could not tell apart.
    Exclusion(
        pattern=r"^EXT4-fs \(%s\): VFS: Can't find ext4 filesystem$",
        where=r"^fs/ext4/super\.c:",
        reason="a mount probing ext4 on a volume of another type prints it: no fault",
        benign=True,
    ),
    # --- jbd2 ---
    # __jbd2_log_wait_for_space(): "%s: needed %d blocks and only had %d space available" is the finding;
    # the record after it names the journal, then WARN_ON and the journal abort follow.
    Exclusion(
        pattern=r"^__jbd2_log_wait_for_space: no way to get more journal space in %s",
        where=r"^fs/jbd2/checkpoint\.c:",
        reason="the second record of 'needed %d blocks and only had %d space available' (the first is the finding)",
    ),
    # --- SMB client ---
    # cifs_dump_detail(), cifs_dump_mids(), smb2_dump_detail(): the SMB header and pending requests
    # after a failed check of a received SMB (its own record is the finding); CONFIG_CIFS_DEBUG2 only.
    Exclusion(
        pattern=r"^CIFS: VFS: (Cmd: %d Err: |smb buf %p len |Dump pending requests:|State: %d Cmd: |IsLarge: |IsMult: )",  # noqa: E501
        where=r"^fs/smb/client/cifs_debug\.c:",
        reason="a detail record of an SMB dump (CONFIG_CIFS_DEBUG2) after the failed check that is the finding",
    ),
    Exclusion(
        pattern=r"^CIFS: VFS: \\\\\\\\%s (Cmd: %d Err: |smb buf %p len )",
        where=r"^fs/smb/client/smb2ops\.c:",
        reason="a detail record of an SMB2 dump (CONFIG_CIFS_DEBUG2) after the failed check that is the finding",
    ),
    # Mount-time notices cifs_dbg(VFS, ...) prints for a working mount, from its options or the server's
    # capabilities: the mount succeeds and works as asked.
    Exclusion(
        pattern=r"^CIFS: VFS: (mounting share with read only caching|mounting share in single client RW caching mode"
        r"|mount option dynperm ignored|mounted to read only share|Signing is enabled, and RDMA read/write will be"
        r" disabled|\\\\\\\\%s cannot query dirs between root and final path)",
        where=r"^fs/smb/client/connect\.c:",
        reason="a working mount's notice (cache=ro/rw, dynperm with cifsacl, a read-only share, signing over RDMA, a prefix path)",  # noqa: E501
        benign=True,
    ),
    # smb3_fs_context_parse_param() (5.10: cifs_dbg(VFS, ...); 6.1: cifs_errorf, no site): a mount that asked
    # for SMB1 (vers=1.0) is told the dialect is less secure; the mount goes on with the dialect it asked for.
    Exclusion(
        pattern=r"^CIFS: VFS: Use of the less secure dialect vers=1\.0 is not recommended",
        where=r"^fs/smb/client/",
        reason="advice to a working mount that asked for SMB1 (vers=1.0): the mount goes on",
        benign=True,
    ),
    Exclusion(
        pattern=r"^CIFS: VFS: mount options mfsymlinks and sfu both enabled",
        where=r"^fs/smb/client/fs_context\.c:",
        reason="a working mount's notice (both symlink emulations asked for; mfsymlinks wins)",
        benign=True,
    ),
    # cifs_autodisable_serverino(): a server that returns no usable inode numbers; the mount goes on
    # with client-generated ones, and the second record says how to silence the first.
    Exclusion(
        pattern=r"^CIFS: VFS: (Autodisabling the use of server inode numbers|Hardlinks will not be recognized on this mount)",  # noqa: E501
        where=r"^fs/smb/client/misc\.c:",
        reason="a working mount's notice (server inode numbers off; noserverino silences it)",
        benign=True,
    ),
    Exclusion(
        pattern=r"^CIFS: VFS: resiliency not supported by server, disabling",
        where=r"^fs/smb/client/smb2file\.c:",
        reason="a working mount's notice (resilienthandles asked for, the server does not offer it)",
        benign=True,
    ),
    Exclusion(
        pattern=r"^CIFS: VFS: \\\\\\\\%s unknown negcontext of type %d ignored",
        where=r"^fs/smb/client/smb2pdu\.c:",
        reason="a newer server's negotiate context this client does not know; negotiation goes on",
        benign=True,
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(pattern=r"^EXT4-fs error ", reason="kernel-monitor.yaml kernel/ext4-error (Ext4Error)"),
    Exclusion(
        pattern=r"^EXT4-fs \(%s\): Remounting filesystem read-only",
        reason="kernel-monitor.yaml kernel/readonly-filesystem (FilesystemIsReadOnly)",
    ),
    Exclusion(
        pattern=r"^Aborting journal on device %s\.",
        where=r"^fs/jbd2/",
        reason="storage.yaml kernel/jbd2-journal-error (JournalError)",
    ),
    Exclusion(
        pattern=r"^EXT4-fs \(%s\): .*(\b(error|Error|ERROR)\b|Errors on filesystem|with errors|corrupt|Corrupt"
        r"|CORRUPT|abort|Abort|ABORT|fail|Fail|FAIL|shut down|shutdown|Data will be lost|data will be lost"
        r"|data loss)",
        reason="storage.yaml kernel/ext4-fallback (Ext4Error): an ext4_msg line naming an error or failure",
    ),
    Exclusion(
        pattern=r"^XFS \(%s\): .*(error|Error|ERROR|corrupt|Corrupt|CORRUPT|fail|Fail|FAIL|shutdown|shut down"
        r"|Shutting down|xfs_repair|rectify|Assertion)",
        reason="storage.yaml kernel/xfs-fallback (XfsError) and the specific XFS rules before it",
    ),
]


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_fs.py",
        extract_path="plugins/kernel/sites/fs.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
