"""node-problem-detector's own kernel rules (the first 15 rules of plugins/kernel/kernel-monitor.yaml),
tested from the format strings that print their lines.

Each table row names a printk format as the kernel source writes it (the rule's ``provenance``),
renders it with tests/helpers/kprintf.py over the values the conversions can take (task names that are
empty, 15 bytes long, with spaces, colons and parentheses; interface names with dots, dashes and
``@``; zero, the largest and negative numbers where the conversion is signed; ``%p`` of NULL as
kernels before 4.15 print it), in every wording the kernel versions used, and checks that exactly the
expected NPD rules fire, with the expected reasons, in both engines. Look-alikes printed next to
these lines by the same code must leave the NPD rules silent, and the plainly benign ones every
built-in rule.

The patterns are NPD's except two widened ones (kernel/task-hung, kernel/unregister-netdevice); a
test checks that they still match every line NPD's pattern matches, and names the lines they add.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers.kprintf import kprintf

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

RULE_SET = load_rule_set([builtin_plugins_dir()])
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])

# NPD's config/kernel-monitor.json and config/readonly-monitor.json, as published (name -> pattern).
UPSTREAM = {
    "kernel/oom-killing": r"Killed process \d+ (.+) total-vm:\d+kB, anon-rss:\d+kB, file-rss:\d+kB.*",
    "kernel/task-hung": r"task [\S ]+:\w+ blocked for more than \w+ seconds\.",
    "kernel/unregister-netdevice": r"unregister_netdevice: waiting for \w+ to become free. Usage count = \d+",
    "kernel/oops-null-pointer": r"BUG: unable to handle kernel NULL pointer dereference at .*",
    "kernel/oops-divide-error": r"divide error: 0000 \[#\d+\] SMP",
    "kernel/ext4-error": r"EXT4-fs error .*",
    "kernel/ext4-warning": r"EXT4-fs warning .*",
    "kernel/io-error": r"Buffer I/O error .*",
    "kernel/xfs-shutdown": r"XFS .* Shutting down filesystem.?",
    "kernel/memory-read-error": r"CE memory read error .*",
    "kernel/cper-corrected": r".*\[Hardware Error\]: event severity: corrected$",
    "kernel/cper-recoverable": r".*\[Hardware Error\]: event severity: recoverable$",
    "kernel/cper-fatal": r".*\[Hardware Error\]: event severity: fatal$",
    "kernel/docker-hung": r"task docker:\w+ blocked for more than \w+ seconds\.",
    "kernel/readonly-filesystem": r"Remounting filesystem read-only",
}
NPD = set(UPSTREAM)
WIDENED = {"kernel/task-hung", "kernel/unregister-netdevice"}

U32 = 2**32 - 1
U64 = 2**64 - 1
S32 = (0, 1, -1, 2**31 - 1, -(2**31))
# task comm: TASK_COMM_LEN 16, so 0-15 bytes, anything but NUL; prctl(PR_SET_NAME) sets any of them
COMMS = ("python3", "kworker/u256:3", "jbd2/nvme0n1p1-8", "", "pt_main thread", "a:b (c) [d]", "x" * 15)
PIDS = (1, 4194304)  # task_pid_nr: 1 .. PID_MAX_LIMIT, never negative
BDEVS = ("sda1", "nvme0n1p1", "nvme10n1", "dm-3", "md127", "xvdf", "loop0")


def render(fmt: str, *args: Any) -> str:
    """A printk format rendered by the kernel's rules, outer whitespace trimmed as the agent (and NPD)
    trims messages."""
    return kprintf(fmt, *args).strip()


Expected = list[tuple[str, str]]
CASES: list[tuple[str, str, tuple, Expected]] = []


def add(table: str, fmt: str, values: tuple, *expected: tuple[str, str]) -> None:
    CASES.append((table, fmt, values, list(expected)))


# --- mm/oom_kill.c __oom_kill_process ---
OOM_NEW = (
    "%s: Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB,"
    " UID:%u pgtables:%lukB oom_score_adj:%hd"
)
for message in ("Out of memory", "Memory cgroup out of memory", "Out of memory (oom_kill_allocating_task)"):
    for comm in COMMS:
        for pid, kb, uid, adj in [(1, 0, 0, -1000), (4194304, U64, U32, 1000)]:
            add(
                "oom", OOM_NEW, (message, pid, comm, kb, kb, kb, kb, uid, kb, adj), ("kernel/oom-killing", "OOMKilling")
            )
for comm in COMMS:
    add(  # 4.x before 4.19
        "oom",
        "Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB",
        (2813, comm, 18237636, 16109284, 0, U64),
        ("kernel/oom-killing", "OOMKilling"),
    )
    add(  # 3.x
        "oom",
        "Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB, file-rss:%lukB",
        (1, comm, 0, 0, 0),
        ("kernel/oom-killing", "OOMKilling"),
    )

# --- kernel/hung_task.c check_hung_task (DockerHung is the same line for the task "docker") ---
HUNG = "INFO: task %s:%d blocked for more than %ld seconds."
for comm in (*COMMS, "docker", "dockerd", "umount.aufs", "containerd-shim"):
    for pid in PIDS:
        for secs in (0, 120, 2**63 - 1):
            expected = [("kernel/task-hung", "TaskHung")]
            if comm == "docker":
                expected.append(("kernel/docker-hung", "DockerHung"))
            add("hung-task", HUNG, (comm, pid, secs), *expected)

# --- net/core/dev.c netdev_wait_allrefs(_any) ---
UNREG = "unregister_netdevice: waiting for %s to become free. Usage count = %d"
# dev_valid_name: 1-15 bytes, no '/', ':' or whitespace
for name in (
    "lo",
    "eth0",
    "veth1a2b3c4",
    "flannel.1",
    "vxlan.calico",
    "br-1a2b3c4d5e6f",
    "eth0.100",
    "tun@x",
    "y" * 15,
):
    for count in S32:
        add("unregister-netdevice", UNREG, (name, count), ("kernel/unregister-netdevice", "UnregisterNetDevice"))

# --- arch/x86/mm/fault.c show_fault_oops before 4.20 (NULL page: address < PAGE_SIZE) ---
for fmt, addr in [
    ("BUG: unable to handle kernel NULL pointer dereference at %p", None),  # before 4.15: "(null)"
    ("BUG: unable to handle kernel NULL pointer dereference at %p", 0x10),
    ("BUG: unable to handle kernel NULL pointer dereference at %px", 0),
    ("BUG: unable to handle kernel NULL pointer dereference at %px", 0xFFF),
    ("BUG: unable to handle kernel NULL pointer dereference at virtual address %08lx", 0),  # i386
]:
    add("null-pointer", fmt, (addr,), ("kernel/oops-null-pointer", "KernelOops"))
for addr in (0, 0xFFF):
    add(
        "null-pointer",
        "BUG: unable to handle kernel %s at %px",
        ("NULL pointer dereference", addr),
        ("kernel/oops-null-pointer", "KernelOops"),
    )

# --- arch/x86/kernel/traps.c die("divide error") + dumpstack.c __die_header ---
for fmt in ("%s: %04lx [#%d]%s%s%s%s%s", "Oops: %s: %04lx [#%d]%s%s%s%s%s"):
    for count in (1, 2, 10, 2**31 - 1):
        add(
            "divide-error",
            fmt,
            ("divide error", 0, count, "", " SMP", "", "", ""),
            ("kernel/oops-divide-error", "KernelOops"),
        )
        # Any other flag set is the die() family's kernel/oops, not NPD's rule
        add("divide-error", fmt, ("divide error", 0, count, " PREEMPT", " SMP", "", "", " NOPTI"))
        add("divide-error", fmt, ("divide error", 0, count, "", " SMP", "", "", " PTI"))
        add("divide-error", fmt, ("divide_error", 0, count, "", " SMP", "", "", ""))  # 2.6

# --- fs/ext4/super.c ---
for dev in BDEVS:
    for fmt, values in [
        (
            "EXT4-fs error (device %s): %s:%d: comm %s: %pV",
            ("ext4_lookup", -1, "kubelet", "deleted inode referenced: 1"),
        ),
        ("EXT4-fs error (device %s): %s:%d: comm %s: %pV", ("ext4_journal_check_start", 83, "", "")),
        (
            "EXT4-fs error (device %s): %s:%d: inode #%lu: block %llu: comm %s: %pV",
            ("ext4_find_entry", 1, U64, U64, "a b", "reading directory lblock 0"),
        ),
        (
            "EXT4-fs error (device %s): %s:%d: inode #%lu: comm %s: %pV",
            ("ext4_iget", 2**31 - 1, 0, "x", "bad extra_isize"),
        ),
        (
            "EXT4-fs error (device %s): %s:%d: inode #%lu: comm %s: path %s: %pV",
            ("ext4_readdir", 0, 2, "ls", "/var/lib/kubelet", "directory fails checksum at offset 0"),
        ),
        ("EXT4-fs error (device %s) in %s:%d: %s", ("ext4_reserve_inode_write", 5781, "Journal has aborted")),
        ("EXT4-fs error (device %s): %s:%d: group %u, %pV", ("ext4_mb_generate_buddy", 1, U32, "block bitmap corrupt")),
        (
            "EXT4-fs error (device %s): %s:%d: %pV",
            ("ext4_put_super", 1, "Couldn't clean up the journal"),
        ),  # __ext4_abort
    ]:
        add("ext4-error", fmt, (dev, *values), ("kernel/ext4-error", "Ext4Error"))
    for fmt, values in [
        ("EXT4-fs warning (device %s): %s:%d: %pV", ("ext4_dx_add_entry", 2372, "Directory index full!")),
        ("EXT4-fs warning (device %s): %s:%d: %pV", ("ext4_end_bio", -1, "")),
        ("EXT4-fs warning (device %s): %s:%d: %pV", ("ext4_multi_mount_protect", 2**31 - 1, "MMP interval 42 higher")),
        ("EXT4-fs warning (device %s): %s:%d: inode #%lu: comm %s: %pV", ("ext4_xattr_set_entry", 1, U64, "", "x")),
        ("EXT4-fs warning (device %s): %s:%d: inode #%lu: comm %s: %pV", ("ext4_da_release_space", 0, 2, "a (b)", "y")),
    ]:
        add("ext4-warning", fmt, (dev, *values), ("kernel/ext4-warning", "Ext4Warning"))
    add(
        "readonly",
        "EXT4-fs (%s): %pV",
        (dev, "Remounting filesystem read-only"),
        ("kernel/readonly-filesystem", "FilesystemIsReadOnly"),
    )

# --- fs/buffer.c buffer_io_error ---
for dev in BDEVS:
    for block in (0, U64):
        for msg in ("", ", async page read", ", lost async page write", ", lost sync page write"):
            add(
                "io-error",
                "Buffer I/O error on dev %pg, logical block %llu%s",
                (dev, block, msg),
                ("kernel/io-error", "IOError"),
            )
        add(
            "io-error", "Buffer I/O error on device %s, logical block %Lu", (dev, block), ("kernel/io-error", "IOError")
        )

# --- fs/xfs/xfs_fsops.c xfs_do_force_shutdown, with fs/xfs/xfs_message.c's "XFS (%s): " ---
for dev in BDEVS:
    for why in (
        "Corruption of in-memory data",
        "Corruption of on-disk metadata",
        "Log I/O Error",
        "Metadata I/O Error",
    ):
        for flags, line in [(0x8, 1136), (0, -1), (U32, 2**31 - 1)]:
            add(
                "xfs-shutdown",
                "XFS (%s): %s (0x%x) detected at %pS (%s:%d).  Shutting down filesystem.",
                (dev, why, flags, "xfs_trans_cancel+0x12e/0x150 [xfs]", "fs/xfs/xfs_trans.c", line),
                ("kernel/xfs-shutdown", "XfsHasShutdown"),
            )
    for msg in (
        "Corruption of in-memory data detected.  Shutting down filesystem",
        "Log I/O Error Detected.  Shutting down filesystem",
        "I/O Error Detected. Shutting down filesystem",
        "All device paths lost. Shutting down filesystem",
        "User initiated shutdown received. Shutting down filesystem",
    ):
        add("xfs-shutdown", "XFS (%s): %s", (dev, msg), ("kernel/xfs-shutdown", "XfsHasShutdown"))

# --- drivers/edac/edac_mc.c with the sb_edac / skx_common optype "memory read error" ---
for mc, count in [(0, 1), (1, 2), (7, 2**31 - 1)]:
    add(
        "memory-read-error",
        "EDAC MC%d: %d CE %s%son %s (%s page:0x%lx offset:0x%lx grain:%ld syndrome:0x%lx%s%s)",
        (
            mc,
            count,
            "memory read error",
            " ",
            "CPU_SrcID#1_MC#0_Chan#2_DIMM#0",
            "channel:2 slot:0",
            0x3AD4F,
            0x340,
            32,
            0,
            " - ",
            "area:DRAM err_code:0001:0090 socket:1 imc:0 rank:0 bg:0 ba:0 row:0x1 col:0x8",
        ),
        ("kernel/memory-read-error", "MemoryReadError"),
    )
    add(  # 3.5-5.7
        "memory-read-error",
        "EDAC MC%d: %d CE %s%son %s (%s %s - %s)",
        (
            mc,
            count,
            "memory read error",
            " ",
            "CPU_SrcID#0_Ha#0_Chan#1_DIMM#0",
            "channel:1 slot:0 page:0x12345 offset:0x0 grain:32 syndrome:0x0",
            "",
            "area:DRAM err_code:0001:0091 socket:0 ha:0 channel_mask:2 rank:0",
        ),
        ("kernel/memory-read-error", "MemoryReadError"),
    )

# --- drivers/firmware/efi/cper.c cper_estatus_print, pfx from drivers/acpi/apei/ghes.c ---
CPER = {"corrected": "kernel/cper-corrected", "recoverable": "kernel/cper-recoverable", "fatal": "kernel/cper-fatal"}
CPER_REASON = {
    "corrected": "CperHardwareErrorCorrected",
    "recoverable": "CperHardwareErrorRecoverable",
    "fatal": "CperHardwareErrorFatal",
}
for pfx, pfx_values in [
    ("{%u}[Hardware Error]: ", (1,)),
    ("{%u}[Hardware Error]: ", (U32,)),
    ("[Hardware Error]: ", ()),
]:
    for severity in ("recoverable", "fatal", "corrected", "info", "unknown"):
        expected = [(CPER[severity], CPER_REASON[severity])] if severity in CPER else []
        add("cper", pfx + "event severity: %s", (*pfx_values, severity), *expected)


# Look-alikes printed by the same code: NPD's rules stay silent (another pack's rule may speak).
NPD_SILENT: list[tuple[str, tuple]] = [
    ("%s: Kill process %d (%s) score %u or sacrifice child", ("Out of memory", 1, "java", 912)),
    ("oom_reaper: reaped process %d (%s), now anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB", (1, "a", 0, 0, 0)),
    ("Killed process %d (%s) vsz:%lukB, anon-rss:%lukB, file-rss:%lukB", (1, "java", 4, 5, 6)),  # 2.6.3x
    ("Kernel panic - not syncing: %s", ("hung_task: blocked tasks",)),
    ("BUG: unable to handle kernel paging request at %px", (0xFFFFC90000A3C000,)),
    ("BUG: kernel NULL pointer dereference, address: %px", (8,)),
    ("EXT4-fs (%s): warning: mounting fs with errors, running e2fsck is recommended", ("sda1",)),
    ("EXT4-fs (%s): error count since last fsck: %u", ("sda1", 3)),  # ext4 print_daily_error_info
    ("XFS (%s): Please unmount the filesystem and rectify the problem(s)", ("sda1",)),
    ("EDAC MC%d: %d CE %s%son %s (%s)", (0, 1, "memory write error", " ", "DIMM_A1", "channel:0")),
    ("EDAC MC%d: %d CE %s%son %s (%s)", (0, 1, "memory scrubbing error", " ", "DIMM_A1", "channel:0")),
    ("EDAC MC%d: %d UE %s%son %s (%s)", (0, 1, "memory read error", " ", "DIMM_A1", "channel:0")),
    ("{%u}[Hardware Error]:  Error %d, type: %s", (1, 0, "fatal")),  # section header (newpfx: one more space)
    ("{%u}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: %d", (1, 0)),
    (
        "blk_update_request: I/O error, dev %s, sector %llu op 0x%x:(%s) flags 0x%x phys_seg %u prio class %u",
        ("sda", 8, 1, "WRITE", 0x800, 1, 0),
    ),
    # kernel/hung_task.c debug_show_blocker (6.16+; paraphrased; verify): context, not a second report
    ("INFO: task %s:%d is blocked on a mutex likely owned by task %s:%d.", ("python3", 7, "kworker/0:1", 9)),
]

# Benign lines printed by the same code: no built-in rule at all may fire.
SILENT: list[tuple[str, tuple]] = [
    # kernel/hung_task.c context lines and kernel/sched/core.c sched_show_task (6.x)
    ('"echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.', ()),
    ("      %s %s %.*s", ("Tainted: P           OE", "6.8.0-1015-aws", 9, "#16-Ubuntu SMP")),
    (
        "task:%-15.15s state:%c stack:%-5lu pid:%-5d tgid:%-5d ppid:%-6d flags:0x%08lx",
        ("kworker/u256:3", "D", 0, 1442, 1442, 2, 0x4000),
    ),
    ("oom_score_adj set for pid %d (%s)", (1, "systemd")),
    ("%s: renamed from %s", ("eth0", "veth1a2b3c4")),  # net/core/dev.c dev_change_name
    ("EXT4-fs (%s): mounted filesystem with ordered data mode. Quota mode: %s.", ("sda1", "none")),
    ("EXT4-fs (%s): re-mounted. Opts: %s", ("sda1", "(null)")),  # 4.x-5.x remount (paraphrased)
    ("XFS (%s): Ending clean mount", ("nvme1n1",)),
    ("XFS (%s): Unmounting Filesystem", ("nvme1n1",)),
    (
        "EDAC MC%d: Giving out device to module %s controller %s: DEV %s (INTERRUPT)",
        (0, "skx_edac", "Skylake Socket#0 IMC#0", "0000:3a:0a.0"),
    ),
    ("{%u}[Hardware Error]: It has been corrected by h/w and requires no further action", (1,)),
    ("VFS: Mounted root (%s filesystem) readonly on device %u:%u.", ("ext4", 259, 1)),
]
for fmt, values in NPD_SILENT:
    add("npd-silent", fmt, values)


def _ids(cases: list) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for case in cases:
        seen[case[0]] = seen.get(case[0], 0) + 1
        out.append(f"{case[0]}-{seen[case[0]]}")
    return out


@ENGINES
@pytest.mark.parametrize(("table", "fmt", "values", "expected"), CASES, ids=_ids(CASES))
def test_rendered_line_gives_exactly_the_npd_findings(engine_cls, table, fmt, values, expected):
    line = render(fmt, *values)
    findings = [(f.rule, f.reason) for f in engine_cls(rule_set=RULE_SET).feed([line]) if f.rule in NPD]
    assert findings == expected, line


@ENGINES
@pytest.mark.parametrize(("fmt", "values"), SILENT, ids=[f"silent-{i}" for i in range(len(SILENT))])
def test_benign_lines_of_the_same_printers_stay_silent(engine_cls, fmt, values):
    line = render(fmt, *values)
    assert [(f.rule, f.reason) for f in engine_cls(rule_set=RULE_SET).feed([line])] == [], line


def _npd_rules() -> list:
    return [r for r in RULE_SET.rules if r.name in NPD]


def test_the_npd_rules_keep_their_names_reasons_and_order():
    rules = _npd_rules()
    assert [r.name for r in rules] == list(UPSTREAM)
    assert [r.name for r in RULE_SET.rules[: len(UPSTREAM)]] == list(UPSTREAM)


def test_every_npd_rule_has_generated_lines_and_names_its_source():
    covered = {rule for _t, _f, _v, expected in CASES for rule, _r in expected}
    assert NPD - covered == set()
    for rule in _npd_rules():
        assert rule.provenance and all(p.startswith("torvalds/linux:") for p in rule.provenance), rule.name
        assert rule.literals, f"{rule.name} has no required literal for the prefilter"


def test_only_the_widened_patterns_differ_from_npd():
    differ = {r.name for r in _npd_rules() if r.pattern != UPSTREAM[r.name]}
    assert differ == WIDENED


def _npd_matches(pattern: str, line: str) -> bool:
    """NPD's method: the pattern with \\z appended, searched in the line (ASCII classes, as Go)."""
    return re.search(f"(?:{pattern})\\Z", line, re.ASCII) is not None


def test_widened_patterns_match_everything_npd_matches_and_say_what_they_add():
    ours = {r.name: r.pattern for r in _npd_rules()}
    lines = [render(fmt, *values) for _t, fmt, values, _e in CASES]
    added: dict[str, set[str]] = {name: set() for name in WIDENED}
    for name in WIDENED:
        for line in lines:
            if _npd_matches(UPSTREAM[name], line):
                assert _npd_matches(ours[name], line), (name, line)
            elif _npd_matches(ours[name], line):
                added[name].add(line)
    assert "INFO: task :1 blocked for more than 0 seconds." in added["kernel/task-hung"]
    assert all(": waiting for " in x for x in added["kernel/unregister-netdevice"])
    assert (
        "unregister_netdevice: waiting for flannel.1 to become free. Usage count = 1"
        in added["kernel/unregister-netdevice"]
    )
    assert (
        "unregister_netdevice: waiting for lo to become free. Usage count = -1" in added["kernel/unregister-netdevice"]
    )
