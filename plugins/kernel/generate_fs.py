"""Filesystem print sites (issue 38): the pack sites-fs.yaml from plugins/kernel/sites/fs.tsv.

    python plugins/kernel/generate_fs.py extract /work/src/linux-source-6.1 > plugins/kernel/sites/fs.tsv
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
    name: Call(level=None, fmt_arg=1, prefix="pr", level_arg=0, head="VFS: %s:%d ", arg_levels={"ERR": "err"})
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
        "cifs_dbg": Call(level=None, fmt_arg=1, prefix="pr", level_arg=0, head="VFS: ", arg_levels=_VFS),
        "cifs_server_dbg": Call(level=None, fmt_arg=1, prefix="pr", level_arg=0, head=r"VFS: \\\\%s ", arg_levels=_VFS),
        "cifs_tcon_dbg": Call(level=None, fmt_arg=1, prefix="pr", level_arg=0, head="VFS: %s ", arg_levels=_VFS),
        **_SMBD,
    },
    # The pr_fmt these directories take from a header.
    pr_fmt={
        "fs/smb/client/*.c": "CIFS: ",  # cifs_debug.h
        "fs/overlayfs/*.c": "overlayfs: ",  # overlayfs.h
        "fs/fuse/*.c": "fuse: ",  # fuse_i.h (cuse.c sets its own)
    },
)

FAMILY = Family(name="fs", reason="FilesystemError")

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # The body of smbdirect.c's log_rdma() macro (cifs_dbg(VFS, "%s:%d " fmt, ...)): its callers
    # (log_rdma_event(ERR, "..."), ...) are the sites, each listed with its own text.
    Exclusion(
        pattern=r"^CIFS: VFS: %s:%d \{fmt\}",
        where=r"^fs/smb/client/smbdirect\.c:",
        reason="the log_rdma macro's own body: its callers are listed as the sites",
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(pattern=r"^EXT4-fs error ", reason="kernel-monitor.yaml kernel/ext4-error (Ext4Error)"),
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
