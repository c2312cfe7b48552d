"""The storage family's rules (plugins/kernel/storage.yaml) against the lines the kernel prints.

Every table row is a printk format string copied from the code that prints it (the path is in the
row), rendered by ``c_format`` with edge values for each conversion (the smallest and largest
numbers, negatives where the conversion is signed, %#x of 0, empty strings, %pS symbols with and
without a module, every device name and PCI address form, each optional clause present and
absent, dev_printk prefixes present and absent). Each rendered line, matched as if alone by the
built-in packs (node-problem-detector's rules in kernel-monitor.yaml included), must yield exactly
one finding, from the expected rule, with the expected reason and fields, through both the fast and
the reference matcher: so the family's rules cover their sources and never report a line twice,
and the fallbacks speak only for lines no specific rule matched. node-problem-detector's own rules
for these printers are checked the same way (they keep their lines, nothing doubles them), and the
printers' handled or context lines must stay silent.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers.kprintf import kprintf

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

RULE_SET = load_rule_set([builtin_plugins_dir()])
ENGINES = [RuleEngine, ReferenceEngine]


def c_format(fmt: str, args: Sequence[Any]) -> str:
    """A printk format rendered by the kernel's rules (tests/helpers/kprintf.py)."""
    return kprintf(fmt, *args)


# ---------------------------------------------------------------------------------------------
# edge values

S32 = [0, 1, -1, 2147483647, -2147483648]  # %d
U32 = [0, 1, 4294967295]  # %u / %x of a u32
U64 = [0, 1, 18446744073709551615]  # %llu / %llx of a u64
S64 = [0, -1, 9223372036854775807]  # %lld
DISKS = ["sda", "nvme0n1", "nvme10n1", "nvme0c0n1", "dm-3", "md127", "vda", "xvdf", "loop0", "mmcblk0", "?"]
BDEVS = ["sda1", "nvme0n1", "nvme10n1p3", "dm-3", "md127", "vdb", "xvdf1", "loop7", "mmcblk0p2", "rbd0"]
JOURNALS = ["sda1-8", "nvme10n1p3-8", "dm-0-8", "md127-8", "sdb1:8", "mmcblk0p2-12"]  # "%pg-%lu", older "%s:%lu"
SYMBOLS = [  # %pS / %pF: symbol+offset/size, with or without a module, or a bare address
    "xfs_buf_ioend+0x1a4/0x3c0 [xfs]",
    "xfs_dinode_verify.part.0+0x739/0x920 [xfs]",
    "xfs_trans_cancel+0x12e/0x150",
    "0xffffffffc06a7e2b",
]
CTRLS = ["nvme0", "nvme10"]
PCI = ["0000:3b:00.0", "10000:e1:00.0", "fffffffe:00:02.1", "3b:00.0"]  # 4- to 8-digit domains (VMD: 10000), none


def nvme_prefixes(devices: Sequence[str] = (*CTRLS, *PCI)) -> list[str]:
    """The dev_printk prefix "%s %s: " (driver, device) for each device, and none."""
    return [f"nvme {d}: " for d in devices] + [""]


# ---------------------------------------------------------------------------------------------
# tables


@dataclass(frozen=True)
class Source:
    """A format string and the rule that must report every line rendered from it."""

    where: str  # path in torvalds/linux
    fmt: str
    args: Sequence[Sequence[Any]]  # one argument list per line
    rule: str
    reason: str
    fields: dict[str, int | Callable[[Sequence[Any]], Any]] = field(default_factory=dict)
    prefixes: Sequence[str] = ("",)  # dev_printk prefixes to render in front

    def cases(self):
        for prefix, args in product(self.prefixes, self.args):
            line = (prefix + c_format(self.fmt, args)).strip()  # the kernel's trailing newline/space
            want = {}
            for name, how in self.fields.items():
                value = how(args) if callable(how) else args[how]
                if value is not None:
                    want[name] = str(value)
            if "device" not in want and prefix:
                want["device"] = prefix.split()[1].rstrip(":")
            yield line, want


def edges(*columns: Sequence[Any]) -> list[tuple]:
    """Each argument through its edge values while the others keep their first value."""
    rows = [tuple(c[0] for c in columns)]
    for i, col in enumerate(columns):
        for v in col[1:]:
            row = [c[0] for c in columns]
            row[i] = v
            rows.append(tuple(row))
    return rows


def hexs(i: int) -> Callable[[Sequence[Any]], str]:
    return lambda a: format(a[i], "x")


EXT4_MSG = "EXT4-fs (%s): "  # fs/ext4/super.c __ext4_msg: "%sEXT4-fs (%s): %pV\n"
XFS_MSG = "XFS (%s): "  # fs/xfs/xfs_message.c __xfs_printk: "%sXFS (%s): %pV\n"

SOURCES: list[Source] = [
    # --- ext4 ---
    Source(
        "fs/ext4/super.c",
        EXT4_MSG + "I/O error while writing superblock",
        [(d,) for d in BDEVS],
        "kernel/ext4-io-error",
        "Ext4IOError",
        {"device": 0},
    ),
    Source(
        "fs/ext4/super.c",
        EXT4_MSG + "previous I/O error to superblock detected",
        [(d,) for d in BDEVS],
        "kernel/ext4-io-error",
        "Ext4IOError",
        {"device": 0},
    ),
    # fallback: ext4_msg lines reporting errors (fs/ext4/inode.c, page-io.c, super.c, orphan.c, ioctl.c)
    Source(
        "fs/ext4/inode.c",
        EXT4_MSG
        + "Delayed block allocation failed for inode %lu at logical offset %llu with max blocks %u with error %d",
        edges(BDEVS, [0, 18446744073709551615], U64, U32, [5, 28, 117, 0, -2147483648]),
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/inode.c",
        EXT4_MSG + "This should not happen!! Data will be lost\n",
        [(d,) for d in BDEVS],
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/page-io.c",
        EXT4_MSG
        + "failed to convert unwritten extents to written extents -- potential data loss!  (inode %lu, error %d)",
        edges(BDEVS, U64, S32),
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/super.c",
        EXT4_MSG + "error count since last fsck: %u",
        edges(BDEVS, U32),
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/super.c",
        "EXT4-fs (%s): initial error at time %llu: %.*s:%d",
        edges(BDEVS, U64, [32], ["ext4_lookup", ""], S32),
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/super.c",
        "EXT4-fs (%s): last error at time %u: %.*s:%d",
        edges(BDEVS, U32, [32], ["ext4_find_entry", ""], S32),
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/super.c",
        EXT4_MSG + "warning: mounting fs with errors, running e2fsck is recommended",
        [(d,) for d in BDEVS],
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/orphan.c",
        EXT4_MSG + "Errors on filesystem, clearing orphan list.\n",
        [(d,) for d in BDEVS],
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/super.c",
        EXT4_MSG + "error loading journal",
        [(d,) for d in BDEVS],
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/super.c",
        EXT4_MSG + "ext4_check_descriptors: Checksum for group %u failed (%u!=%u)",
        edges(BDEVS, U32, U32, U32),
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    Source(
        "fs/ext4/ioctl.c",
        EXT4_MSG + "shut down requested (%d)",
        edges(BDEVS, [0, 1, 2, -1, 2147483647]),
        "kernel/ext4-fallback",
        "Ext4Error",
        {"device": 0},
    ),
    # --- jbd2 ---
    Source(
        "fs/jbd2/journal.c",
        "Aborting journal on device %s.\n",
        [(j,) for j in JOURNALS],
        "kernel/jbd2-journal-error",
        "JournalError",
        {"device": 0},
    ),
    Source(
        "fs/jbd2/commit.c",
        "JBD2: Detected IO errors while flushing file data on %s\n",
        [(j,) for j in JOURNALS],
        "kernel/jbd2-journal-error",
        "JournalError",
        {"device": 0},
    ),
    Source(
        "fs/jbd2/commit.c",
        "JBD2: Detected IO errors %d while flushing file data on %s\n",
        edges(S32, JOURNALS),
        "kernel/jbd2-journal-error",
        "JournalError",
        {"device": 1},
    ),
    Source(
        "fs/jbd2/journal.c",
        "JBD2: Error %d detected when updating journal superblock for %s.\n",
        edges([-5, *S32], JOURNALS),
        "kernel/jbd2-journal-error",
        "JournalError",
        {"device": 1},
    ),
    Source(
        "fs/jbd2/journal.c",
        "JBD2: I/O error when updating journal superblock for %s.\n",
        [(j,) for j in JOURNALS],
        "kernel/jbd2-journal-error",
        "JournalError",
        {"device": 0},
    ),
    Source(
        "fs/jbd2/journal.c",
        "JBD2: I/O error detected when updating journal superblock for %s.\n",
        [(j,) for j in JOURNALS],
        "kernel/jbd2-journal-error",
        "JournalError",
        {"device": 0},
    ),
    # --- XFS corruption ---
    Source(
        "fs/xfs/xfs_error.c",
        XFS_MSG + "Metadata %s detected at %pS, %s block 0x%llx %s",
        edges(
            BDEVS,
            ["corruption", "CRC error"],
            SYMBOLS,
            ["xfs_agf", "xfs_dir3_data", "xfs_inode"],
            [0x12A0, 0, 2**64 - 1],
            ["", "xfs_dir3_data_read", "xfs_alloc_read_agf"],
        ),
        "kernel/xfs-corruption",
        "XfsCorruption",
        {"device": 0, "kind": 1, "function": 2, "object": 3, "address": hexs(4)},
    ),
    Source(
        "fs/xfs/xfs_error.c",
        XFS_MSG + "Metadata corruption detected at %pS, %s block 0x%llx",
        edges(BDEVS, SYMBOLS, ["xfs_da3_node", "xfs_refcountbt"], U64),
        "kernel/xfs-corruption",
        "XfsCorruption",
        {"device": 0, "function": 1, "object": 2, "address": hexs(3)},
    ),
    Source(
        "fs/xfs/xfs_error.c",
        XFS_MSG + "Metadata %s detected at %pS, inode 0x%llx %s",
        edges(BDEVS, ["corruption", "CRC error"], SYMBOLS, [0x427B2D1, 0, 2**64 - 1], ["", "dinode"]),
        "kernel/xfs-corruption",
        "XfsCorruption",
        {"device": 0, "kind": 1, "address": hexs(3)},
    ),
    Source(
        "fs/xfs/xfs_error.c (4.x)",
        XFS_MSG + "Metadata %s detected at %pF, %s block 0x%llx",
        edges(BDEVS, ["corruption", "CRC error"], SYMBOLS, ["xfs_agi", "xfs_bmbt"], U64),
        "kernel/xfs-corruption",
        "XfsCorruption",
        {"device": 0, "object": 3},
    ),
    Source(
        "fs/xfs/xfs_error.c (3.x)",
        XFS_MSG + "Metadata %s detected at %pF, block 0x%llx",
        edges(BDEVS, ["corruption", "CRC error"], SYMBOLS, U64),
        "kernel/xfs-corruption",
        "XfsCorruption",
        {"device": 0, "kind": 1, "address": hexs(3)},
    ),
    Source(
        "fs/xfs/xfs_error.c",
        XFS_MSG + "Corruption detected. Unmount and run xfs_repair",
        [(d,) for d in BDEVS],
        "kernel/xfs-corruption",
        "XfsCorruption",
        {"device": 0},
    ),
    # A verifier report's records after its header, read alone (the header rate limited away): the XFS
    # fallback's. With the header in the buffer they stay quiet (kernel/xfs-corruption-detail-in-report).
    Source(
        "fs/xfs/xfs_error.c",
        XFS_MSG + "Unmount and run xfs_repair",
        [(d,) for d in BDEVS],
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_error.c",
        XFS_MSG + "First %d bytes of corrupted metadata buffer:",
        edges(BDEVS, [128, 64, 0, -1, 2147483647]),
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_log.c",
        XFS_MSG + "Corruption warning: Metadata has LSN (%d:%d) ahead of current LSN (%d:%d). "
        "Please unmount and run xfs_repair (>= v4.3) to resolve.",
        edges(BDEVS, S32, S32, S32, S32),
        "kernel/xfs-corruption",
        "XfsCorruption",
        {"device": 0},
    ),
    # --- XFS shutdown lines node-problem-detector's kernel/xfs-shutdown does not see ---
    Source(
        "fs/xfs/xfs_log.c",
        XFS_MSG + "Filesystem has been shut down due to log error (0x%x).",
        edges(BDEVS, [2, 0, 0x12, 0xFFFFFFFF]),
        "kernel/xfs-shutdown-notice",
        "XfsHasShutdown",
        {"device": 0, "flags": hexs(1)},
    ),
    Source(
        "fs/xfs/xfs_log.c",
        XFS_MSG + "Please unmount the filesystem and rectify the problem(s).",
        [(d,) for d in BDEVS],
        "kernel/xfs-shutdown-notice",
        "XfsHasShutdown",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_fsops.c",
        XFS_MSG + "Please unmount the filesystem and rectify the problem(s)",
        [(d,) for d in BDEVS],
        "kernel/xfs-shutdown-notice",
        "XfsHasShutdown",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_fsops.c",
        XFS_MSG + "User initiated shutdown received.",
        [(d,) for d in BDEVS],
        "kernel/xfs-shutdown-notice",
        "XfsHasShutdown",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_fsops.c (4.19-5.13)",
        XFS_MSG + "%s(0x%x) called from line %d of file %s. Return address = %px",
        edges(
            BDEVS,
            ["xfs_do_force_shutdown"],
            [2, 0, 8, 0xFFFFFFFF],
            S32,
            ["fs/xfs/xfs_log.c", "fs/xfs/xfs_trans.c"],
            ["0xffffffffc06a7e2b", "00000000b1c3d9a1", *SYMBOLS],
        ),
        "kernel/xfs-shutdown-notice",
        "XfsHasShutdown",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_fsops.c (3.x-4.x)",
        XFS_MSG + "%s(0x%x) called from line %d of file %s.  Return address = 0x%p",
        edges(
            BDEVS,
            ["xfs_do_force_shutdown"],
            [8, 0],
            S32,
            ["fs/xfs/xfs_trans_buf.c"],
            ["ffffffffa02e7b5f", "0000000012345678"],
        ),
        "kernel/xfs-shutdown-notice",
        "XfsHasShutdown",
        {"device": 0},
    ),
    # --- XFS I/O errors ---
    Source(
        "fs/xfs/xfs_buf.c (5.6+)",
        XFS_MSG + 'metadata I/O error in "%pS" at daddr 0x%llx len %d error %d',
        edges(
            BDEVS,
            [*SYMBOLS, "xfs_buf_ioend_handle_error+0x269/0xce0 [xfs]"],
            U64,
            S32,
            [5, 28, 0, -2147483648, 2147483647],
        ),
        "kernel/xfs-io-error",
        "XfsIOError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_buf.c (4.x-5.5)",
        XFS_MSG + 'metadata I/O error in "%s" at daddr 0x%llx len %d error %d',
        edges(BDEVS, ["xfs_trans_read_buf_map", "xlog_iodone", ""], U64, S32, S32),
        "kernel/xfs-io-error",
        "XfsIOError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_buf.c (3.x-4.x)",
        XFS_MSG + 'metadata I/O error: block 0x%llx ("%s") error %d numblks %d',
        edges(BDEVS, U64, ["xfs_buf_iodone_callbacks", "xfs_trans_read_buf_map", ""], S32, S32),
        "kernel/xfs-io-error",
        "XfsIOError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_buf.c (older)",
        XFS_MSG + 'metadata I/O error: block 0x%llx ("%s") error %d buf count %zd',
        edges(BDEVS, U64, ["xfs_buf_iodone_callbacks", ""], S32, [4096, 0, -1]),
        "kernel/xfs-io-error",
        "XfsIOError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_log.c",
        XFS_MSG + "log I/O error %d",
        edges(BDEVS, [-5, *S32]),
        "kernel/xfs-io-error",
        "XfsIOError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_buf_item.c",
        XFS_MSG + "Failing async write on buffer block 0x%llx. Retrying async write.",
        edges(BDEVS, U64),
        "kernel/xfs-io-error",
        "XfsIOError",
        {"device": 0},
    ),
    # --- XFS fallback ---
    Source(
        "fs/xfs/xfs_error.c",
        XFS_MSG + "Internal error %s at line %d of file %s.  Caller %pS",
        edges(
            BDEVS,
            ["XFS_WANT_CORRUPTED_GOTO", "xfs_trans_cancel", "!xfs_verify_fsbno(mp, bno)", ""],
            S32,
            ["fs/xfs/libxfs/xfs_alloc.c"],
            SYMBOLS,
        ),
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_error.c (old)",
        XFS_MSG + "Internal error %s at line %d of file %s.  Caller 0x%p\n",
        edges(BDEVS, ["XFS_WANT_CORRUPTED_GOTO"], S32, ["fs/xfs/xfs_alloc.c"], ["ffffffffa0251b7e"]),
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    Source(
        'fs/xfs/xfs_message.c: without a mounted superblock, __xfs_printk prints "%sXFS: %pV" (no device)',
        "XFS: Internal error %s at line %d of file %s.  Caller 0x%p\n",
        edges(["XFS_WANT_CORRUPTED_RETURN", "xfs_trans_cancel"], S32, ["fs/xfs/xfs_alloc.c"], ["ffffffffa01e76c2"]),
        "kernel/xfs-fallback",
        "XfsError",
    ),
    Source(
        "fs/xfs/xfs_log.c",
        XFS_MSG + "log mount/recovery failed: error %d",
        edges(BDEVS, [-74, *S32]),
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_log.c",
        XFS_MSG + "log mount failed",
        [(d,) for d in BDEVS],
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_fsops.c",
        XFS_MSG + "Error %d reserving per-AG metadata reserve pool.",
        edges(BDEVS, S32),
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_reflink.c",
        XFS_MSG + "Failed to recover leftover CoW staging extents, err %d.",
        edges(BDEVS, S32),
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    Source(
        "fs/xfs/xfs_message.c",
        XFS_MSG + "Assertion failed: %s, file: %s, line: %d",
        edges(BDEVS, ["bp->b_flags & XBF_DONE", ""], ["fs/xfs/xfs_buf.c"], S32),
        "kernel/xfs-fallback",
        "XfsError",
        {"device": 0},
    ),
    # --- block layer ---
    Source(
        "block/blk-mq.c (5.18+)",
        "%s error, dev %s, sector %llu op 0x%x:(%s) flags 0x%x phys_seg %u prio class %u\n",
        edges(
            [
                "I/O",
                "critical medium",
                "critical target",
                "critical nexus",
                "reservation conflict",
                "recoverable transport",
                "timeout",
                "protection",
                "device offline",
                "critical space allocation",
            ],
            DISKS,
            U64,
            [1, 0, 0xFF],
            ["WRITE", "READ", "FLUSH", "DISCARD", "WRITE_ZEROES", "ZONE_APPEND", "UNKNOWN", ""],
            [0x8800, 0, 0xFFFFFFFF],
            U32,
            [2, 0, 7],
        ),
        "kernel/block-io-error",
        "BlockIOError",
        {"error": 0, "device": 1, "sector": 2, "op": lambda a: a[4] or None},
    ),
    Source(
        "block/blk-core.c (5.3-5.17)",
        "%s: %s error, dev %s, sector %llu op 0x%x:(%s) flags 0x%x phys_seg %u prio class %u\n",
        edges(
            ["blk_update_request"],
            ["I/O", "critical medium", "critical target", "timeout", "protection"],
            DISKS,
            U64,
            [1, 0],
            ["WRITE", "READ"],
            [0x800, 0],
            U32,
            [0, 3],
        ),
        "kernel/block-io-error",
        "BlockIOError",
        {"caller": 0, "error": 1, "device": 2, "sector": 3, "op": 5},
    ),
    Source(
        "block/blk-core.c (5.0-5.2)",
        "%s: %s error, dev %s, sector %llu op 0x%x flags 0x%x\n",
        edges(["blk_update_request", "print_req_error"], ["I/O", "critical medium"], DISKS, U64, [1, 0], [0x800, 0]),
        "kernel/block-io-error",
        "BlockIOError",
        {"caller": 0, "error": 1, "device": 2, "sector": 3},
    ),
    Source(
        "block/blk-core.c (4.18-4.20)",
        "%s: %s error, dev %s, sector %llu flags %x\n",
        edges(["print_req_error"], ["I/O", "critical target"], DISKS, U64, [0x4800, 0]),
        "kernel/block-io-error",
        "BlockIOError",
        {"caller": 0, "error": 1, "device": 2, "sector": 3},
    ),
    Source(
        "block/blk-core.c (3.13-4.17)",
        "%s: %s error, dev %s, sector %llu\n",
        edges(
            ["blk_update_request", "print_req_error"],
            ["I/O", "critical medium", "critical space allocation", "recoverable transport"],
            DISKS,
            U64,
        ),
        "kernel/block-io-error",
        "BlockIOError",
        {"caller": 0, "error": 1, "device": 2, "sector": 3},
    ),
    Source(
        "block/blk-core.c (up to 3.12)",
        "end_request: %s error, dev %s, sector %llu\n",
        edges(["I/O", "critical nexus", "critical target", "recoverable transport"], DISKS, U64),
        "kernel/block-io-error",
        "BlockIOError",
        {"error": 0, "device": 1, "sector": 2},
    ),
    Source(
        "fs/buffer.c",
        "lost page write due to I/O error on %s\n",
        [(d,) for d in BDEVS],
        "kernel/buffer-lost-page-write",
        "IOError",
        {"device": 0},
    ),
    Source(
        "fs/iomap/buffered-io.c",
        "%s: writeback error on inode %lu, offset %lld, sector %llu",
        edges(BDEVS, U64, S64, U64),
        "kernel/writeback-io-error",
        "IOError",
        {"device": 0, "inode": 1, "sector": 3},
    ),
    Source(
        "block/blk-core.c (5.10+)",
        "%s: attempt to access beyond end of device\n",
        [("kworker/u16:2",), ("(udev-worker)",), ("Web Content",), ("systemd-udevd",), ("",)],
        "kernel/access-beyond-end",
        "AccessBeyondEndOfDevice",
    ),
    Source(
        "block/blk-core.c (2.6-5.9)",
        "attempt to access beyond end of device\n",
        [()],
        "kernel/access-beyond-end",
        "AccessBeyondEndOfDevice",
    ),
    # --- NVMe ---
    Source(
        "drivers/nvme/host/pci.c (6.x)",
        "I/O tag %d (%04x) opcode %#x (%s) QID %d timeout, aborting req_op:%s(%u) size:%u\n",
        edges(
            [28, 0, 1023, -1, 2147483647],
            [0x401C, 0, 0xFFFF],
            [0x2, 0, 0x1, 0xFF],
            ["Read", "Write", "Flush", "Write Zeroes", "Dataset Management", "Unknown", ""],
            [5, 0, 1, 65535, -1],
            ["READ", "WRITE", "FLUSH", "DISCARD", "UNKNOWN", ""],
            [0, 1, 35, 4294967295],
            U32,
        ),
        "kernel/nvme-timeout",
        "NVMeTimeout",
        {"tag": 0, "cid": lambda a: format(a[1], "04x"), "qid": 4, "action": lambda a: "aborting"},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/pci.c (6.x)",
        "I/O tag %d (%04x) opcode %#x (%s) QID %d timeout, reset controller\n",
        edges([0, 1023, -1], [0, 0xFFFF], [0, 0x6, 0x7F], ["Flush", "Identify", "Get Log Page", ""], [0, 1, 65535, -1]),
        "kernel/nvme-timeout",
        "NVMeTimeout",
        {"tag": 0, "qid": 4, "action": lambda a: "reset controller"},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/pci.c (6.x)",
        "I/O tag %d (%04x) QID %d timeout, disable controller\n",
        edges([0, 1023, -1, 2147483647], [0, 0xFFFF], [0, 1, -1]),
        "kernel/nvme-timeout",
        "NVMeTimeout",
        {"tag": 0, "qid": 2, "action": lambda a: "disable controller"},
        nvme_prefixes(CTRLS),
    ),
    *[
        Source(
            "drivers/nvme/host/pci.c (4.5-5.x)",
            f"I/O %d QID %d timeout, {action}\n",
            edges(S32, S32),
            "kernel/nvme-timeout",
            "NVMeTimeout",
            {"tag": 0, "qid": 1, "action": lambda a, x=action: x},
            nvme_prefixes(),
        )
        for action in ("aborting", "reset controller", "disable controller")
    ],
    Source(
        "drivers/nvme/host/rdma.c (5.x)",
        "I/O %d QID %d timeout\n",
        edges(S32, S32),
        "kernel/nvme-timeout",
        "NVMeTimeout",
        {"tag": 0, "qid": 1},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/rdma.c (6.x)",
        "I/O tag %d (%04x) opcode %#x (%s) QID %d timeout\n",
        edges([0, 127, -1], [0, 0xFFFF], [0x7F, 0, 0x2], ["Connect", "Property Get", "Read", ""], [0, 3, -1]),
        "kernel/nvme-timeout",
        "NVMeTimeout",
        {"tag": 0, "qid": 4},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/tcp.c (6.x)",
        "I/O tag %d (%04x) type %d opcode %#x (%s) QID %d timeout\n",
        edges([0, 127, -1], [0, 0xFFFF], [4, 0, -1], [0x7F, 0, 0x1], ["Connect", "Write", ""], [0, 3, -1]),
        "kernel/nvme-timeout",
        "NVMeTimeout",
        {"tag": 0, "qid": 5},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/pci.c (4.4)",
        "Timeout I/O %d QID %d\n",
        edges(S32, S32),
        "kernel/nvme-timeout-legacy",
        "NVMeTimeout",
        {"tag": 0, "qid": 1},
        nvme_prefixes(),
    ),
    Source(
        "drivers/nvme/host/tcp.c (5.x)",
        "queue %d: timeout request %#x type %d\n",
        edges(S32, [0x12, 0, 0xFFFFFFFF], S32),
        "kernel/nvme-timeout-legacy",
        "NVMeTimeout",
        {"queue": 0},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/pci.c",
        "controller is down; will reset: CSTS=0x%x, PCI_STATUS=0x%hx\n",
        edges([0xFFFFFFFF, 0, 0x3], [0xFFFF, 0, 0x10]),
        "kernel/nvme-controller-down",
        "NVMeControllerDown",
        {"csts": hexs(0)},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/pci.c",
        "controller is down; will reset: CSTS=0x%x, PCI_STATUS read failed (%d)\n",
        edges([0xFFFFFFFF, 0], S32),
        "kernel/nvme-controller-down",
        "NVMeControllerDown",
        {"csts": hexs(0)},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/pci.c (4.5-4.11)",
        "Failed status: 0x%x, reset controller.\n",
        [(0x3,), (0,), (0xFFFFFFFF,)],
        "kernel/nvme-controller-down",
        "NVMeControllerDown",
        {"csts": hexs(0)},
        nvme_prefixes(PCI),
    ),
    Source(
        "drivers/nvme/host/pci.c",
        "frozen state error detected, reset controller\n",
        [()],
        "kernel/nvme-controller-down",
        "NVMeControllerDown",
        {},
        nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/pci.c",
        "Disabling device after reset failure: %d\n",
        [(v,) for v in [-19, *S32]],
        "kernel/nvme-disabled",
        "NVMeDeviceDisabled",
        {},
        nvme_prefixes(),
    ),
    Source(
        "drivers/nvme/host/pci.c",
        "Removing after probe failure status: %d\n",
        [(v,) for v in [-19, -16, *S32]],
        "kernel/nvme-disabled",
        "NVMeDeviceDisabled",
        {},
        nvme_prefixes(),
    ),
    Source(
        "drivers/nvme/host/core.c",
        "Device not ready; aborting %s, CSTS=0x%x\n",
        edges(["initialisation", "reset", "shutdown"], [0x0, 0x1, 0xFFFFFFFF]),
        "kernel/nvme-disabled",
        "NVMeDeviceDisabled",
        {},
        nvme_prefixes(),
    ),
    Source(
        "drivers/nvme/host/core.c (4.x)",
        "Device not ready; aborting %s\n",
        [("initialisation",), ("reset",)],
        "kernel/nvme-disabled",
        "NVMeDeviceDisabled",
        {},
        nvme_prefixes(),
    ),
    *[
        Source(
            "drivers/nvme/host/pci.c", fmt, args, "kernel/nvme-disabled", "NVMeDeviceDisabled", {}, nvme_prefixes(CTRLS)
        )
        for fmt, args in (
            ("failed to mark controller CONNECTING\n", [()]),
            ("failed to mark controller live state\n", [()]),
            ("failed to mark controller state %d\n", [(v,) for v in [2, *S32]]),
            ("failure state error detected, request disconnect\n", [()]),
        )
    ],
    Source(
        "drivers/nvme/host/pci.c (4.4)",
        "Device failed to resume\n",
        [()],  # generic wording: only with the prefix
        "kernel/nvme-disabled",
        "NVMeDeviceDisabled",
        {},
        nvme_prefixes(PCI)[:-1],
    ),
    Source(
        "drivers/nvme/host/core.c",
        "%s: %s(0x%x) @ LBA %llu, %u blocks, %s (sct 0x%x / sc 0x%x) %s%s\n",
        edges(
            ["nvme0n1", "nvme10n1", "nvme0c0n1", "?"],
            ["Read", "Write", "I/O Cmd", "Zone Append", ""],
            [0x2, 0, 0xFF],
            U64,
            U32,
            ["Unrecovered Read Error", "Write Fault", "Host Aborted Command", "I/O Error", ""],
            [0x2, 0x3],
            [0x81, 0, 0xFF],
            ["", "MORE "],
            ["DNR ", ""],
        ),
        "kernel/nvme-io-error",
        "NVMeIOError",
        {"device": 0, "lba": 3, "blocks": 4, "sct": lambda a: hex(a[6])},
    ),
    # --- NFS ---
    Source(
        "net/sunrpc/clnt.c",
        "%s: server %s not responding, %s\n",
        edges(
            ["nfs", "lockd", "nfsacl"],
            ["10.0.0.1", "fs-0a1b2c3d.efs.us-east-1.amazonaws.com", "fd00::1", "filer"],
            ["still trying", "timed out"],
        ),
        "kernel/nfs-not-responding",
        "NFSServerNotResponding",
        {"program": 0, "server": 1},
    ),
    # --- device-mapper: a thin pool out of metadata space, a target's constructor failing ---
    Source(
        "drivers/md/dm-thin.c",
        "device-mapper: thin: %s",  # DMERR("%s", ooms_reason): the two strings check_for_metadata_space sets
        [("No free metadata blocks",), ("Could not get free metadata blocks",)],
        "kernel/dm-thin-out-of-metadata",
        "ThinPoolOutOfMetadataSpace",
        {"ooms_reason": 0},
    ),
    Source(
        "drivers/md/dm-table.c",
        "device-mapper: table: %s: %s: %s (%s)",  # %pe: the error's name, or its number without CONFIG_SYMBOLIC_ERRNAME
        edges(
            ["253:3", "254:0", "252:17"],
            ["thin-pool", "crypt", "linear", "verity", "snapshot-origin", "raid", "vdo"],
            ["Error creating metadata object", "Device lookup failed", "Error allocating crypto tfm", "Unknown error"],
            ["-EINVAL", "-ENOENT", "-22", "-EBUSY"],
        ),
        "kernel/dm-target-constructor-failed",
        "DeviceMapperTargetFailed",
        {"device": 0, "target": 1, "error": 2, "errno": 3},
    ),
    Source(
        "drivers/md/dm-table.c (before 5.17)",
        "device-mapper: table: %s: %s: %s",
        edges(
            ["253:3", "254:0"], ["thin-pool", "crypt", "multipath"], ["Device lookup failed", "error getting device"]
        ),
        "kernel/dm-target-constructor-failed",
        "DeviceMapperTargetFailed",
        {"device": 0, "target": 1, "error": 2},
    ),
    # --- issue 18: SCSI sense keys, loop write errors, rate-limited error bursts ---
    Source(
        "drivers/scsi/scsi_logging.c",
        "Sense Key : %s [%s]%s",
        edges(["Medium Error", "Hardware Error"], ["current", "deferred"], ["", " [descriptor]"]),
        "kernel/scsi-disk-error",
        "SCSIDiskError",
        {"sense_key": 0},
        prefixes=("sd 3:0:0:0: [sdb] tag#3 ", "sd 0:0:0:0: [sda] ", "sd 10:0:1:255: [sdaa]  ", ""),
    ),
    Source(
        "drivers/scsi/scsi_logging.c",
        "Sense Key : %s [%s]%s",
        edges(["Aborted Command"], ["current", "deferred"], ["", " [descriptor]"]),
        "kernel/scsi-command-aborted",
        "SCSICommandAborted",
        {"sense_key": 0},
        prefixes=("sd 0:0:0:0: [sda] tag#0 ", "sr 1:0:0:0: [sr0] ", ""),
    ),
    Source(
        "drivers/block/loop.c",
        "loop: Write error at byte offset %llu, length %i.\n",
        edges([0, 1140506624, 18446744073709551615], [4096, 0, -1]),
        "kernel/loop-write-error",
        "LoopWriteError",
        {"offset": 0, "length": 1},
    ),
    Source(
        "lib/ratelimit.c",
        "%s: %d callbacks suppressed\n",
        edges(
            [
                "EXT4-fs error",
                "print_req_error",
                "blk_print_req_error",
                "blk_update_request",
                "buffer_io_error",
                "end_buffer_async_write",
                "scsi_io_completion",
                "scsi_io_completion_action",
                "nvme_log_error",
            ],
            [59, 1, 2147483647],
        ),
        "kernel/io-errors-suppressed",
        "IOErrorsSuppressed",
        {"source": 0, "suppressed": 1},
    ),
    # --- SCSI results and additional sense (issue 38) ---
    Source(
        "drivers/scsi/scsi_logging.c",
        "[%s] tag#%d %s Result: hostbyte=%s driverbyte=%s cmd_age=%lus",
        edges(
            DISKS[:4],
            [0, 4294967295],
            ["FAILED", "TIMEOUT_ERROR"],
            ["DID_OK", "DID_BAD_TARGET", "0x07"],
            ["DRIVER_SENSE", "DRIVER_OK"],
            [0, 94],
        ),
        "kernel/scsi-command-failed",
        "SCSICommandFailed",
        {"disk": 0, "tag": 1, "disposition": 2, "hostbyte": 3, "driverbyte": 4, "cmd_age_s": 5},
        prefixes=["sd 0:0:0:0: ", "sd 15:0:0:1: ", ""],
    ),
    Source(
        "drivers/scsi/sd.c",
        "[%s] %s: Result: hostbyte=%s driverbyte=%s",
        edges(
            DISKS[:3],
            ["Synchronize Cache(10) failed", "Start/Stop Unit failed", "Read Capacity(16) failed"],
            ["DID_ERROR", "0x07"],
            ["DRIVER_OK"],
        ),
        "kernel/scsi-command-failed",
        "SCSICommandFailed",
        {"disk": 0, "operation": lambda a: a[1].removesuffix(" failed"), "hostbyte": 2},
        prefixes=["sd 0:0:0:0: "],
    ),
    Source(
        "drivers/scsi/scsi_logging.c",
        "[%s] tag#%d Add. Sense: %s",
        edges(
            DISKS[:3],
            [0, 22],
            [
                "Unrecovered read error",
                "Unrecovered read error - auto reallocate failed",
                "Write error - auto reallocation failed",
                "Peripheral device write fault",
                "Logical unit communication failure",
                "Id CRC or ECC error",
                "Logical block guard check failed",
                "Read retries exhausted",
                "Medium format corrupted",
                "No defect spare location available",
                "Logical unit failure",
                "Internal target failure",
                "Scsi parity error",
                "Information unit iuCRC error detected",
                "Data phase error",
                "PCIe completion timeout",
                "Failure prediction threshold exceeded",
                "Media failure prediction threshold exceeded",
                "Hardware impending failure general hard drive failure",
                "Spindle impending failure seek error rate too high",
            ],
        ),
        "kernel/scsi-additional-sense",
        "SCSIDiskError",
        {"disk": 0, "sense": 2},
        prefixes=["sd 3:0:0:0: ", ""],
    ),
    # --- libata error handling (issue 38) ---
    Source(
        "drivers/ata/libata-eh.c",
        "ata%u.%02u: %s",
        edges(
            [1, 2, 32],
            [0, 1],
            [
                "failed command: READ FPDMA QUEUED",
                "failed command: WRITE DMA EXT",
                "SError: { UnrecovData Handshk }",
                "status: { DRDY ERR }",
                "status: { Busy }",
                "error: { UNC }",
                "error: { ICRC ABRT }",
                "irq_stat 0x08000000, interface fatal error",
                "limiting speed to UDMA/66:PIO4",
                "NCQ disabled due to excessive errors",
                "failed to IDENTIFY (I/O error, err_mask=0x4)",
            ],
        ),
        "kernel/ata-eh-detail",
        "ATAError",
        {"port": 0, "ata_device": lambda a: f"{a[1]:02d}"},
    ),
    Source(
        "drivers/ata/libata-eh.c",
        "ata%u: %s",
        edges(
            [1, 7],
            [
                "hard resetting link",
                "soft resetting link",
                "SError: { HostInt PHYRdyChg 10B8B DevExch }",
                "irq_stat 0x00400000, PHY RDY changed",
                "limiting SATA link speed to 1.5 Gbps",
                "link is slow to respond, please be patient (ready=0)",
                "device not ready (errno=-16), forcing hardreset",
            ],
        ),
        "kernel/ata-eh-detail",
        "ATAError",
        {"port": 0},
    ),
    # --- btrfs (issue 38) ---
    Source(
        "fs/btrfs/super.c",
        "BTRFS %s (device %s%s): %s",
        edges(
            ["error", "critical", "alert", "emergency"],
            BDEVS[:4],
            ["", ": state EA"],
            ["open_ctree failed", "bdev /dev/dm-10 errs: wr 0, rd 0, flush 0, corrupt 1, gen 0"],
        ),
        "kernel/btrfs-error",
        "BtrfsError",
        {"level": 0, "device": 1},
    ),
    Source(
        "fs/btrfs/super.c",
        "BTRFS: error (device %s%s) in %s:%d: errno=%d %s",
        edges(
            BDEVS[:3],
            ["", ": state A"],
            ["btrfs_commit_transaction", "__btrfs_free_extent"],
            [2564, 0],
            [-5, -28],
            ["IO failure", "No space left"],
        ),
        "kernel/btrfs-error",
        "BtrfsError",
        {"fs_device": 0, "function": 2, "source_line": 3, "errno": 4},
    ),
    Source(
        "fs/btrfs/btrfs_inode.h",
        "BTRFS warning (device %s): csum failed root %lld ino %llu off %llu csum 0x%08x expected csum 0x%08x mirror %d",
        edges(BDEVS[:3], [257, -9], [4115546], [0], [0x3E8D9C48], [0x12711C61], [1, 2]),
        "kernel/btrfs-checksum-error",
        "BtrfsError",
        {"device": 0},
    ),
    Source(
        "fs/btrfs/scrub.c",
        "BTRFS warning (device %s): %s at logical %llu on dev %s, physical %llu, root %llu, inode %llu, offset %llu, "
        "length %u, links %u (path: %s)",
        edges(
            BDEVS[:2],
            ["checksum error", "i/o error", "checksum/header error"],
            [0],
            ["/dev/sda2"],
            [0],
            [5],
            [257],
            [0],
            [4096],
            [1],
            ["a/b"],
        ),
        "kernel/btrfs-checksum-error",
        "BtrfsError",
        {"device": 0, "scrub_error": 1},
    ),
]

# Out-of-tree and non-torvalds printers (issue 38): Lustre/LNet (lustre/lustre-release), the Ceph client.
OTHER_SOURCES: list[Source] = [
    Source(
        "lustre/lustre-release:libcfs/libcfs/debug.c",
        "%s: %s",
        edges(
            ["LustreError", "LNetError"],
            [
                "11-0: jmain01-MDT0000-mdc-ffff88203810d800: operation obd_ping to node 172.31.126.88@o2ib failed: "
                "rc = -107",
                "26110:0:(super25.c:187:lustre_fill_super()) llite: Unable to mount <unknown>: rc = -5",
                "166-1: MGC10.130.93.11@o2ib: Connection to MGS (at 10.130.93.10@o2ib) was lost; in progress "
                "operations using this service will fail",
            ],
        ),
        "kernel/lustre-error",
        "LustreError",
        {"subsystem": 0},
    ),
    Source(
        "lustre/lustre-release:lustre/ptlrpc/import.c",
        "Lustre: %s: Connection to %s (at %s) was lost; in progress operations using this service will wait for "
        "recovery to complete",
        edges(
            ["fs-OST0000-osc-ffff8881", "lustre-MDT0000-lwp-OST0018"],
            ["fs-OST0000", "MGS"],
            ["10.0.1.5@tcp", "10.130.93.10@o2ib"],
        ),
        "kernel/lustre-connection-fault",
        "LustreError",
        {"target": 1, "nid": 2},
    ),
    Source(
        "lustre/lustre-release:lustre/ptlrpc/import.c",
        "Lustre: %s: This client was evicted by %s; in progress operations using this service will fail.",
        edges(["fs-OST0000-osc-XXXXX"], ["fs-OST0000", "fs-MDT0000"]),
        "kernel/lustre-connection-fault",
        "LustreError",
        {"evicted_by": 1},
    ),
    Source(
        "lustre/lustre-release:lustre/ptlrpc/client.c",
        "Lustre: %d:0:(client.c:2141:ptlrpc_expire_one_request()) @@@ Request sent has %s: "
        "[sent 1508144508/real 1508144518]",
        edges([2449], ["failed due to network error", "timed out for slow reply", "timed out for sent delay"]),
        "kernel/lustre-connection-fault",
        "LustreError",
        {"request": 1},
    ),
    Source(
        "lustre/lustre-release:lnet/klnds/o2iblnd/o2iblnd_cb.c",
        "LNet: %d:0:(o2iblnd_cb.c:3174:kiblnd_check_conns()) Timed out tx for %s: %lld seconds",
        edges([2431], ["172.31.126.87@o2ib", "10.0.0.1@o2ib1"], [0, 403055]),
        "kernel/lustre-connection-fault",
        "LustreError",
        {"peer": 1},
    ),
    Source(
        "torvalds/linux:net/ceph/messenger.c",
        "libceph: %s%lld %s %s",
        edges(
            ["osd", "mon", "mds"],
            [10, 0],
            ["9.125.70.42:6801", "(1)192.168.178.80:3300"],
            [
                "socket closed (con state PREOPEN)",
                "socket closed (con state V1_BANNER)",
                "socket error on read",
                "connect error",
                "bad crc/signature",
                "protocol error, bad tag",
                "integrity error, bad crc",
            ],
        ),
        "kernel/ceph-connection-fault",
        "CephConnectionFault",
        {"entity": 0, "id": 1, "address": 2, "error": 3},
    ),
    Source(
        "torvalds/linux:fs/ceph/mds_client.c",
        "ceph: mds%d %s",
        edges(
            [0, 12, 2147483647, -1],
            [
                "closed our session",
                "session blocklisted",
                "reconnect denied",
                "rejected session",
                "caps stale",
                "caps still stale",
                "hung",
            ],
        ),
        "kernel/ceph-mds-session-lost",
        "CephSessionLost",
        {"mds": 0, "event": 1},
    ),
    Source(
        "torvalds/linux:fs/ceph/caps.c",
        "ceph:  dropping dirty%s %s state for %s %lld",
        edges(["+flushing", ""], ["Fw", "AxFxw"], ["ffff8802dc150518", "00000000a1b2c3d4"], [1099935956631, 0, -1]),
        "kernel/ceph-dirty-data-dropped",
        "CephDirtyDataDropped",
        {"caps": 1},
    ),
    Source(
        "torvalds/linux:net/ceph/mon_client.c",
        "libceph: mon%d %s session lost, hunting for new mon",
        edges([2, 0], ["(1)10.0.0.247:6789", "10.0.0.1:6789"]),
        "kernel/ceph-connection-fault",
        "CephConnectionFault",
        {"mon": 0},
    ),
    Source(
        "torvalds/linux:net/ceph/osdmap.c",
        "libceph (%s e%u): osd%d down",
        edges(["fb30d64e-7a8c-46d3-bbd7-77a3b1f080d1"], [857, 0], [2, 0]),
        "kernel/ceph-connection-fault",
        "CephConnectionFault",
        {"osd": 2},
    ),
]

# node-problem-detector's rules (kernel-monitor.yaml, unchanged) on the same subsystems' printers:
# they keep reporting these lines, and no rule of this family reports them a second time.
NPD_SOURCES: list[Source] = [
    *[
        Source("fs/ext4/super.c", fmt, args, "kernel/ext4-error", "Ext4Error")
        for fmt, args in (
            (
                "EXT4-fs error (device %s): %s:%d: comm %s: %pV\n",
                edges(
                    BDEVS,
                    ["ext4_lookup", "ext4_journal_check_start"],
                    S32,
                    ["kworker/u16:2", "", "Web Content"],
                    ["Detected aborted journal", "", "deleted inode referenced: 393224"],
                ),
            ),
            (
                "EXT4-fs error (device %s): %s:%d: inode #%lu: block %llu: comm %s: %pV\n",
                edges(BDEVS, ["ext4_find_entry"], S32, U64, U64, ["cp", ""], ["reading directory lblock 0", ""]),
            ),
            (
                "EXT4-fs error (device %s): %s:%d: inode #%lu: comm %s: %pV\n",
                edges(BDEVS, ["ext4_lookup"], S32, U64, ["kubelet", ""], ["deleted inode referenced: 12", ""]),
            ),
            (
                "EXT4-fs error (device %s): %s:%d: inode #%lu: block %llu: comm %s: path %s: %pV\n",
                edges(
                    BDEVS,
                    ["ext4_readdir"],
                    S32,
                    U64,
                    U64,
                    ["ls"],
                    ["/var/lib/kubelet", "(unknown)"],
                    ["bad entry in directory"],
                ),
            ),
            (
                "EXT4-fs error (device %s): %s:%d: inode #%lu: comm %s: path %s: %pV\n",
                edges(BDEVS, ["ext4_readdir"], S32, U64, ["ls"], ["/x", ""], ["directory fails checksum at offset 0"]),
            ),
            (
                "EXT4-fs error (device %s) in %s:%d: %s\n",
                edges(
                    BDEVS,
                    ["ext4_reserve_inode_write", "ext4_dirty_inode"],
                    S32,
                    ["Journal has aborted", "IO failure", "Out of memory", "Readonly filesystem", "error -117"],
                ),
            ),
            (
                "EXT4-fs error (device %s): %s:%d: group %u, inode %lu: block %llu:%pV\n",
                edges(
                    BDEVS, ["ext4_mb_generate_buddy"], S32, U32, U64, U64, ["bg 0: block 5: invalid block bitmap", ""]
                ),
            ),
            (
                "EXT4-fs error (device %s): %s:%d: group %u, %pV\n",
                edges(
                    BDEVS,
                    ["ext4_mb_generate_buddy"],
                    S32,
                    U32,
                    ["block bitmap and bg descriptor inconsistent: 32768 vs 32767 free clusters"],
                ),
            ),
            (
                "EXT4-fs error (device %s): %s: %pV\n",
                edges(BDEVS, ["ext4_put_super"], ["Couldn't clean up the journal"]),
            ),
        )
    ],
    Source(
        "fs/ext4/super.c",
        EXT4_MSG + "Remounting filesystem read-only",
        [(d,) for d in BDEVS],
        "kernel/readonly-filesystem",
        "FilesystemIsReadOnly",
    ),
    Source(
        "fs/buffer.c",
        "Buffer I/O error on dev %pg, logical block %llu%s\n",
        edges(BDEVS, U64, ["", ", lost async page write", ", lost sync page write", ", async page read"]),
        "kernel/io-error",
        "IOError",
    ),
    Source(
        "fs/buffer.c (2.6-4.x)",
        "Buffer I/O error on device %s, logical block %Lu\n",
        edges(BDEVS, U64),
        "kernel/io-error",
        "IOError",
    ),
    Source(
        "fs/xfs/xfs_fsops.c (5.14+)",
        XFS_MSG + "%s (0x%x) detected at %pS (%s:%d).  Shutting down filesystem.",
        edges(
            BDEVS,
            [
                "Corruption of in-memory data",
                "Corruption of on-disk metadata",
                "Block device removal",
                "Log I/O Error",
                "Metadata I/O Error",
            ],
            [0x8, 0, 0xFFFFFFFF],
            SYMBOLS,
            ["fs/xfs/xfs_trans.c", ""],
            S32,
        ),
        "kernel/xfs-shutdown",
        "XfsHasShutdown",
    ),
    *[
        Source(
            "fs/xfs/xfs_fsops.c (5.12-5.13)",
            XFS_MSG + fmt,
            edges(BDEVS, [0x2, 0], SYMBOLS, ["fs/xfs/xfs_log.c"], S32),
            "kernel/xfs-shutdown",
            "XfsHasShutdown",
        )
        for fmt in (
            "Corruption of in-memory data (0x%x) detected at %pS (%s:%d).  Shutting down filesystem",
            "Log I/O error (0x%x) detected at %pS (%s:%d). Shutting down filesystem",
            "I/O error (0x%x) detected at %pS (%s:%d). Shutting down filesystem",
        )
    ],
    Source(
        "fs/xfs/xfs_fsops.c (5.12-5.13)",
        XFS_MSG + "User initiated shutdown (0x%x) received. Shutting down filesystem",
        edges(BDEVS, [0x4, 0]),
        "kernel/xfs-shutdown",
        "XfsHasShutdown",
    ),
    *[
        Source(
            "fs/xfs/xfs_fsops.c (up to 5.11)",
            XFS_MSG + msg,
            [(d,) for d in BDEVS],
            "kernel/xfs-shutdown",
            "XfsHasShutdown",
        )
        for msg in (
            "Corruption of in-memory data detected.  Shutting down filesystem",
            "Log I/O Error Detected.  Shutting down filesystem",
            "Log I/O Error Detected. Shutting down filesystem",
            "I/O Error Detected. Shutting down filesystem",
            "All device paths lost. Shutting down filesystem",
            "User initiated shutdown received. Shutting down filesystem",
        )
    ],
]


def _by_source(sources: list[Source]):
    return [pytest.param(src, id=f"{src.rule or 'silent'}|{src.where}|{src.fmt[:60]}") for src in sources]


# Neutral lines between the rendered ones, as many as the longest multi-line window: each rendered
# line is matched as if it came alone (no pattern of any pack can span two of them), while one
# engine serves a whole table row.
SEPARATOR = "-"
GAP = max(r.window for r in RULE_SET.rules)


def _report_each(engine_cls, lines: list[str]) -> list[list[tuple[str, str, dict]]]:
    """The findings (rule, reason, fields) of each line, fed as one stream with gaps between lines."""
    stream: list[str] = []
    where: dict[int, int] = {}  # stream line number -> index in lines
    for i, line in enumerate(lines):
        stream.extend([SEPARATOR] * GAP)
        stream.append(line)
        where[len(stream)] = i
    found: list[list[tuple[str, str, dict]]] = [[] for _ in lines]
    for f in engine_cls(rule_set=RULE_SET).feed(stream, line_numbers=1):
        assert f.line in where, f"finding on a separator line: {f}"
        found[where[f.line]].append((f.rule, f.reason, dict(f.fields)))
    return found


def test_separated_lines_are_matched_as_if_alone():
    line = "nvme nvme3: I/O 612 QID 7 timeout, aborting"
    alone = [(f.rule, f.reason, dict(f.fields)) for f in RuleEngine(rule_set=RULE_SET).feed([line])]
    assert _report_each(RuleEngine, [line, line]) == [alone, alone]


@pytest.mark.parametrize("engine_cls", ENGINES, ids=["fast", "reference"])
@pytest.mark.parametrize("src", _by_source(SOURCES + OTHER_SOURCES))
def test_every_rendered_line_is_reported_once_by_its_rule(engine_cls, src: Source):
    cases = list(src.cases())
    wrong = []
    for (line, want), found in zip(cases, _report_each(engine_cls, [c[0] for c in cases]), strict=True):
        if [(r, why) for r, why, _ in found] != [(src.rule, src.reason)]:
            wrong.append((line, found))
            continue
        fields = found[0][2]
        if any(str(fields.get(name)) != value for name, value in want.items()):
            wrong.append((line, f"fields {fields}, want {want}"))
    assert not wrong, "\n".join(f"{line!r} -> {got}" for line, got in wrong)


@pytest.mark.parametrize("engine_cls", ENGINES, ids=["fast", "reference"])
@pytest.mark.parametrize("src", _by_source(NPD_SOURCES))
def test_npd_rules_keep_their_lines_and_are_not_doubled(engine_cls, src: Source):
    lines = [line for line, _ in src.cases()]
    found = _report_each(engine_cls, lines)
    wrong = [
        (line, f)
        for line, f in zip(lines, found, strict=True)
        if [(r, why) for r, why, _ in f] != [(src.rule, src.reason)]
    ]
    assert not wrong, "\n".join(f"{line!r} -> {got}" for line, got in wrong)


# Lines of the family's printers that must stay silent: statuses that are the host's request or a
# software outcome, context lines, a first missed interrupt, messages without their driver prefix
# where the wording alone is not specific.
SILENT: list[Source] = [
    Source(
        "block/blk-mq.c",
        "%s error, dev %s, sector %llu op 0x%x:(%s) flags 0x%x phys_seg %u prio class %u\n",
        edges(
            [
                "operation not supported",
                "kernel resource",
                "device resource",
                "nonblocking retry",
                "dm internal retry",
                "open zones exceeded",
                "active zones exceeded",
                "duration limit exceeded",
                "invalid",
            ],
            DISKS,
            U64,
            [9, 0],
            ["WRITE_ZEROES", "DISCARD"],
            [0x800],
            [0],
            [0],
        ),
        "",
        "",
    ),
    Source(
        "block/blk-core.c",
        "%s: rw=%d, sector=%llu, nr_sectors = %u limit=%llu\n",
        edges(BDEVS, S32, U64, U32, U64),
        "",
        "",
    ),
    Source("block/blk-core.c", "%s: rw=%ld, want=%Lu, limit=%Lu\n", edges(BDEVS, S32, U64, U64), "", ""),
    Source(
        "drivers/nvme/host/pci.c",
        "I/O tag %d (%04x) QID %d timeout, completion polled\n",
        edges([0, 1023, -1], [0, 0xFFFF], [0, 1, -1]),
        "",
        "",
        prefixes=nvme_prefixes(CTRLS),
    ),
    Source(
        "drivers/nvme/host/pci.c",
        "I/O %d QID %d timeout, completion polled\n",
        edges(S32, S32),
        "",
        "",
        prefixes=nvme_prefixes(),
    ),
    Source("drivers/nvme/host/pci.c", "Device failed to resume\n", [()], "", ""),
    Source("drivers/nvme/host/pci.c", "Abort status: 0x%x\n", [(0,), (0x7,)], "", "", prefixes=nvme_prefixes(CTRLS)),
    Source(
        "drivers/nvme/host/core.c",
        "%s: %s(0x%x) @ LBA %llu, %u blocks, %s (sct 0x%x / sc 0x%x) %s%s\n",
        edges(
            ["nvme0n1", "?"],
            ["Write Zeroes", "Dataset Management"],
            [0x8, 0x9],
            U64,
            U32,
            ["Invalid Command Opcode", "Invalid Field in Command", "Zone Is Full"],
            [0x0, 0x1],
            [0x1, 0x2, 0xB9],
            ["", "MORE "],
            ["DNR ", ""],
        ),
        "",
        "",
    ),
    Source(
        "drivers/nvme/host/core.c",
        "%s: %s(0x%x), %s (sct 0x%x / sc 0x%x) %s%s\n",
        edges(
            ["nvme0", "nvme10"],
            ["Get Features", "Get Log Page", "Identify"],
            [0xA, 0x2, 0x6],
            ["Invalid Field in Command", "Media Unavailable"],
            [0x0, 0x2],
            [0x2, 0x82],
            ["", "MORE "],
            ["DNR ", ""],
        ),
        "",
        "",
    ),
    Source("net/sunrpc/clnt.c", "%s: server %s OK\n", edges(["nfs", "lockd"], ["10.0.0.1", "filer"]), "", ""),
]


@pytest.mark.parametrize("engine_cls", ENGINES, ids=["fast", "reference"])
@pytest.mark.parametrize("src", _by_source(SILENT))
def test_handled_and_context_lines_stay_silent(engine_cls, src: Source):
    lines = [line for line, _ in src.cases()]
    loud = [(line, f) for line, f in zip(lines, _report_each(engine_cls, lines), strict=True) if f]
    assert not loud, "\n".join(f"{line!r} -> {got}" for line, got in loud)


@pytest.mark.parametrize("engine_cls", ENGINES, ids=["fast", "reference"])
def test_missed_interrupts_are_counted_per_controller(engine_cls):
    """'completion polled' (the timed-out command had completed): an Event only at the 10th in 24h
    on one controller; another controller's count is its own; older than the window does not count."""
    polled = "nvme {dev}: I/O tag {tag} (a00c) QID 3 timeout, completion polled"
    engine = engine_cls(rule_set=RULE_SET)
    hour = 3600.0
    got = []
    for i in range(9):
        got += engine.feed([polled.format(dev="nvme0", tag=i)], times=i * hour)
        got += engine.feed([polled.format(dev="nvme1", tag=i)], times=i * hour)
    assert got == []
    (tenth,) = engine.feed([polled.format(dev="nvme0", tag=9)], times=9 * hour)
    assert (tenth.rule, tenth.reason, tenth.fields["device"]) == ("kernel/nvme-timeout-polled", "NVMeTimeout", "nvme0")
    # nvme1's tenth comes two days later: its first nine are outside the window by then.
    assert engine.feed([polled.format(dev="nvme1", tag=9)], times=48 * hour) == []


@pytest.mark.parametrize("engine_cls", ENGINES, ids=["fast", "reference"])
def test_a_specific_rule_keeps_the_fallback_quiet_in_a_sequence(engine_cls):
    """A whole incident, in order: every line is reported by its own rule, no fallback doubles one."""
    lines = [
        "I/O error, dev nvme1n1, sector 1144832 op 0x1:(WRITE) flags 0x8800 phys_seg 1 prio class 2",
        'XFS (nvme1n1p1): metadata I/O error in "xfs_buf_ioend_handle_error+0x269/0xce0 [xfs]" at daddr 0x28 len 8 '
        "error 5",
        "XFS (nvme1n1p1): log I/O error -5",
        "XFS (nvme1n1p1): Filesystem has been shut down due to log error (0x2).",
        "XFS (nvme1n1p1): Please unmount the filesystem and rectify the problem(s).",
        "XFS (nvme1n1p1): log mount/recovery failed: error -5",
        "Buffer I/O error on dev nvme1n1p2, logical block 0, lost sync page write",
        "Aborting journal on device nvme1n1p2-8.",
        "EXT4-fs (nvme1n1p2): I/O error while writing superblock",
        "EXT4-fs error (device nvme1n1p2): ext4_journal_check_start:83: comm kworker/u16:2: Detected aborted journal",
        "EXT4-fs (nvme1n1p2): Remounting filesystem read-only",
    ]
    got = [(f.line, f.rule) for f in engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)]
    assert got == [
        (1, "kernel/block-io-error"),
        (2, "kernel/xfs-io-error"),
        (3, "kernel/xfs-io-error"),
        (4, "kernel/xfs-shutdown-notice"),
        (5, "kernel/xfs-shutdown-notice"),
        (6, "kernel/xfs-fallback"),
        (7, "kernel/io-error"),
        (8, "kernel/jbd2-journal-error"),
        (9, "kernel/ext4-io-error"),
        (10, "kernel/ext4-error"),
        (11, "kernel/readonly-filesystem"),
    ]


# Reports the kernel prints as several records, in the order it prints them: one finding, the header's.
REPORTS = [
    pytest.param(
        [
            "XFS (dm-3): Metadata CRC error detected at xfs_agf_read_verify+0x70/0x120 [xfs], xfs_agf block 0x4b3c1",
            "XFS (dm-3): Unmount and run xfs_repair",
            "XFS (dm-3): First 128 bytes of corrupted metadata buffer:",
            "00000000: 58 41 47 46 00 00 00 01 00 00 00 00 00 00 00 00  XAGF............",
        ],
        (1, "kernel/xfs-corruption"),
        id="xfs verifier (xfs_error.c)",
    ),
    pytest.param(
        [
            "EXT4-fs (nvme1n1): Delayed block allocation failed for inode 1234 at logical offset 0 with max blocks 8 "
            "with error 28",
            "EXT4-fs (nvme1n1): This should not happen!! Data will be lost",
            "EXT4-fs (nvme1n1): Total free blocks count 0",
            "EXT4-fs (nvme1n1): Free/Dirty block details",
            "EXT4-fs (nvme1n1): free_blocks=0",
        ],
        (1, "kernel/ext4-fallback"),
        id="ext4 delayed allocation (inode.c mpage_map_and_submit_extent, ext4_print_free_blocks on ENOSPC)",
    ),
    pytest.param(
        [
            "sd 1:0:0:0: [sdb] tag#22 Sense Key : Medium Error [current]",
            "sd 1:0:0:0: [sdb] tag#22 Add. Sense: Unrecovered read error - auto reallocate failed",
            "sd 1:0:0:0: [sdb] tag#22 CDB: Read(10) 28 00 00 00 14 88 00 00 08 00",
        ],
        (1, "kernel/scsi-disk-error"),
        id="SCSI sense (scsi_logging.c scsi_print_sense_hdr)",
    ),
    pytest.param(
        [
            "ata2.00: exception Emask 0x0 SAct 0x5c50001f SErr 0x0 action 0x0",
            "ata2.00: irq_stat 0x08000000, interface fatal error",
            "ata2: SError: { UnrecovData Handshk }",
            "ata2.00: failed command: READ FPDMA QUEUED",
            "ata2.00: cmd 60/00:00:00:00:00/01:00:00:00:00/40 tag 0 ncq dma 131072 in",
            "ata2.00: status: { DRDY ERR }",
            "ata2.00: error: { UNC }",
            "ata2: hard resetting link",
            "ata2.00: configured for UDMA/133",
            "ata2: EH complete",
        ],
        (1, "block/sites-*"),  # the exception header's generated rule (numbered as the pack is generated)
        id="libata error-handler report (libata-eh.c ata_eh_link_report, ata_eh_reset)",
    ),
]


@pytest.mark.parametrize("engine_cls", ENGINES, ids=["fast", "reference"])
@pytest.mark.parametrize(("lines", "finding"), REPORTS)
def test_a_report_of_several_records_is_one_finding(engine_cls, lines, finding):
    got = [(f.line, f.rule) for f in engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)]
    assert len(got) == 1 and got[0][0] == finding[0] and fnmatch.fnmatchcase(got[0][1], finding[1]), got


def test_every_storage_rule_names_its_source_and_is_tested_here():
    kernel = builtin_plugins_dir() / "kernel"
    npd = {r.name for r in load_rule_set([kernel / "kernel-monitor.yaml"]).rules}
    storage = [
        r for r in load_rule_set([kernel / "kernel-monitor.yaml", kernel / "storage.yaml"]).rules if r.name not in npd
    ]
    # the threshold test; the quiet rule: its report examples (tests/fixtures/rules/storage-examples.yaml quiet)
    tested = {src.rule for src in SOURCES + OTHER_SOURCES} | {
        "kernel/nvme-timeout-polled",
        "kernel/xfs-corruption-detail-in-report",
        "kernel/ext4-delalloc-detail-in-report",
        "kernel/scsi-additional-sense-in-report",
        "kernel/ata-eh-detail-in-report",
    }
    assert {r.name for r in storage} == tested
    out_of_tree = {"kernel/lustre-error", "kernel/lustre-connection-fault"}
    for rule in storage:
        repository = "lustre/lustre-release:" if rule.name in out_of_tree else "torvalds/linux:"
        assert rule.provenance and all(p.startswith(repository) for p in rule.provenance), rule.name
    assert {r.name for r in storage if r.fallback} == {
        "kernel/ext4-fallback",
        "kernel/xfs-fallback",
        "kernel/scsi-additional-sense",
        "kernel/ata-eh-detail",
    }
