"""Kernel integrity and memory pressure rules, tested from the format strings that print the lines.

Each table names a format string exactly as the kernel source writes it (``provenance`` of the
rule in ``plugins/kernel/kernel-monitor.yaml``), renders it with ``render`` (the kernel's
``vsprintf`` for the conversions these formats use) over edge values (0, the largest unsigned
value, negative ``%d``, empty ``%s``, names with spaces and brackets, NULL pointers printed the
old way), with and without the ``pr_fmt`` prefixes and optional continuation clauses, and checks
that the built-in packs give exactly the expected rules, reason and fields, in both engines.
"""

from __future__ import annotations

import itertools
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

# The oops / lockup / panic / OOM family: NPD's rules for it and ours. A line of the family must
# give exactly the listed findings of these rules (other families may add their own).
FAMILY = {
    "kernel/oom-killing",
    "kernel/task-hung",
    "kernel/oops-null-pointer",
    "kernel/oops-divide-error",
    "kernel/docker-hung",
    "kernel/oops",
    "kernel/oops-null-pointer-new-wording",
    "kernel/general-protection-fault",
    "kernel/panic",
    "kernel/sysrq-crash",
    "kernel/soft-lockup",
    "kernel/hard-lockup",
    "kernel/rcu-stall",
    "kernel/file-max",
    "kernel/oom-kill-selected",
    "kernel/oom-kill-constraint",
    "kernel/oom-reaper",
    "kernel/segfault",
    "kernel/warning",
}

U32 = 2**32 - 1
U64 = 2**64 - 1


def render(fmt: str, *args: Any) -> str:
    """A printk format rendered by the kernel's rules (tests/helpers/kprintf.py), outer whitespace trimmed as
    the agent matches messages (as NPD does)."""
    return kprintf(fmt, *args).strip()


# --------------------------------------------------------------------------------------------
# The tables: (format, values, expected findings of FAMILY rules [(rule, reason, fields)])

Case = tuple[str, tuple, list[tuple[str, str, dict[str, str]]]]
CASES: list[tuple[str, Case]] = []


def add(table: str, fmt: str, values: tuple, *expected: tuple[str, str, dict[str, str]]) -> None:
    CASES.append((table, (fmt, values, list(expected))))


# kernel/watchdog.c, kernel/softlockup.c: soft lockups
for prefix in ("", "watchdog: ", "NMI watchdog: "):
    for cpu, secs, comm, pid in [
        (0, 0, "swapper/0", 0),
        (47, 26, "nccl-proxy", 81234),
        (-1, -1, "", -1),  # %u wraps; empty comm
        (4095, 22, "pt_main thread]:x", 2147483647),  # comm with a space, ']' and ':'
    ]:
        shown = secs % 2**32
        add(
            "soft-lockup",
            prefix + "BUG: soft lockup - CPU#%d stuck for %us! [%s:%d]",
            (cpu, secs, comm, pid),
            (
                "kernel/soft-lockup",
                "SoftLockup",
                {"cpu": str(cpu), "seconds": str(shown), "task": f"{comm}:{pid}", "comm": comm, "pid": str(pid)},
            ),
        )
add(
    "soft-lockup",
    "BUG: soft lockup - CPU#%d stuck for %lus! [%s:%d]",
    (3, -1, "kworker/3:1", 77),
    ("kernel/soft-lockup", "SoftLockup", {"cpu": "3", "seconds": str(U64), "comm": "kworker/3:1", "pid": "77"}),
)
add("soft-lockup", "BUG: soft lockup detected on CPU#%d!", (5,), ("kernel/soft-lockup", "SoftLockup", {"cpu": "5"}))
add(
    "soft-lockup",
    "BUG: soft lockup detected on CPU#%d! %ld-%ld(%ld)",
    (1, 4294937296, -30000, 10000),
    ("kernel/soft-lockup", "SoftLockup", {"cpu": "1"}),
)
add(
    "soft-lockup",
    "BUG: soft lockup detected on CPU#%u! %lu-%lu(%lu)",
    (U32, 0, U64, 1),
    ("kernel/soft-lockup", "SoftLockup", {"cpu": str(U32)}),
)

# kernel/watchdog.c, kernel/watchdog_hld.c: hard lockups
for prefix in ("", "NMI watchdog: ", "watchdog: "):
    for cpu in (0, 12, -1, 2147483647):
        add(
            "hard-lockup",
            prefix + "Watchdog detected hard LOCKUP on cpu %d",
            (cpu,),
            ("kernel/hard-lockup", "HardLockup", {"cpu": str(cpu)}),
        )
for this_cpu, cpu in [(0, 0), (3, 7), (U32, U32)]:
    add(
        "hard-lockup",
        "watchdog: CPU%u: Watchdog detected hard LOCKUP on cpu %u",
        (this_cpu, cpu),
        ("kernel/hard-lockup", "HardLockup", {"detector": str(this_cpu), "cpu": str(cpu)}),
    )
# arch/powerpc/kernel/watchdog.c (pr_fmt "watchdog: "; 4.13-5.x "Watchdog CPU:%d ..."): its own hard lockups
for cpu in (0, 59, 2147483647):
    for fmt, values in [
        ("watchdog: CPU %d Hard LOCKUP", (cpu,)),
        ("watchdog: CPU %d self-detected hard LOCKUP @ %pS", (cpu, "plpar_hcall_norets+0x1c/0x28")),
        ("watchdog: CPU %d detected hard LOCKUP on other CPUs %s", (cpu, "8-11")),
        ("Watchdog CPU:%d Hard LOCKUP", (cpu,)),
        ("Watchdog CPU:%d detected Hard LOCKUP other CPUS:%s", (cpu, "0-3")),
    ]:
        add("hard-lockup", fmt, values, ("kernel/hard-lockup", "HardLockup", {}))
add(  # 2.6.36-4.x with hardlockup_panic: the panic line is the only report
    "hard-lockup",
    "Kernel panic - not syncing: " + "Watchdog detected hard LOCKUP on cpu %d",
    (3,),
    ("kernel/panic", "KernelPanic", {"cause": "Watchdog detected hard LOCKUP on cpu 3"}),
    ("kernel/hard-lockup", "HardLockup", {"cpu": "3"}),
)

# kernel/rcu/tree_stall.h, tree_exp.h, tasks.h, rcutree.c: RCU stalls
for prefix in ("", "rcu: "):
    for name in ("rcu_preempt", "rcu_sched", "rcu_bh"):
        for fmt in (
            "INFO: %s detected stalls on CPUs/tasks:",
            "INFO: %s self-detected stall on CPU",
            "INFO: %s detected expedited stalls on CPUs/tasks: {",
            "INFO: %s detected expedited stalls, but suppressed full report due to a stuck CSD-lock.",
        ):
            add("rcu-stall", prefix + fmt, (name,), ("kernel/rcu-stall", "RCUStall", {"flavor": name}))
for fmt, flavor in [
    ("INFO: rcu_tasks detected stalls on tasks:", "rcu_tasks"),
    ("INFO: rcu_tasks_trace detected stalls on tasks:", "rcu_tasks_trace"),
]:
    add("rcu-stall", fmt, (), ("kernel/rcu-stall", "RCUStall", {"flavor": flavor}))
add(
    "rcu-stall",
    "INFO: %s detected stall on CPU %d (t=%lu jiffies)",
    ("rcu_sched_state", 0, U64),
    ("kernel/rcu-stall", "RCUStall", {"flavor": "rcu_sched_state"}),
)
add(  # 2.6.3x: the CPU list and summary follow on the same line (printk without newline)
    "rcu-stall",
    "INFO: %s detected stalls on CPUs/tasks: {" + " %d" + "} (detected by %d, t=%ld jiffies)",
    ("rcu_bh_state", 3, 5, -1),
    ("kernel/rcu-stall", "RCUStall", {"flavor": "rcu_bh_state"}),
)

# fs/file_table.c
for limit in (0, 838860, U64):
    add(
        "file-max",
        "VFS: file-max limit %lu reached",
        (limit,),
        ("kernel/file-max", "FileMaxReached", {"limit": str(limit)}),
    )

# kernel/panic.c
for cause in (
    "Fatal exception",
    "Fatal exception in interrupt",
    "softlockup: hung tasks",
    "hung_task: blocked tasks",
    "Hard LOCKUP",
    "RCU Stall",
    "sysrq triggered crash",
    "Out of memory and no killable processes...",
    "System is deadlocked on memory",
    "Attempted to kill init! exitcode=0x0000000b",
    "VFS: Unable to mount root fs on unknown-block(0,0)",
    "Kernel panic - not syncing: nested",
):
    add("panic", "Kernel panic - not syncing: %s", (cause,), ("kernel/panic", "KernelPanic", {"cause": cause}))
add("panic", "Kernel panic - not syncing: %s", ("",), ("kernel/panic", "KernelPanic", {}))  # empty message
for cause in ("Fatal exception", "", "Hard LOCKUP"):  # the trailer of a panic already reported
    add("panic", "---[ end Kernel panic - not syncing: %s ]---", (cause,))

# drivers/tty/sysrq.c (drivers/char/sysrq.c before 2.6.37)
for fmt in ("sysrq: " + "%s", "sysrq: " + "SysRq : " + "%s", "SysRq : " + "%s"):
    add("sysrq-crash", fmt, ("Trigger a crash",), ("kernel/sysrq-crash", "KernelCrashTriggered", {}))

# arch/x86/kernel/dumpstack.c __die_header: every die() header is one KernelOops
X86_DIE = ("%s: %04lx [#%d]%s%s%s%s%s", "Oops: %s: %04lx [#%d]%s%s%s%s%s")
X86_FLAGS = [
    ("", "", "", "", ""),
    ("", " SMP", "", "", ""),
    (" PREEMPT", " SMP", "", "", " NOPTI"),
    (" PREEMPT_RT", " SMP", " DEBUG_PAGEALLOC", " KASAN", " PTI"),
]
X86_TRAPS = [
    "Oops",  # arch/x86/mm/fault.c
    "divide error",
    "divide_error",
    "overflow",
    "bounds",
    "invalid opcode",
    "coprocessor segment overrun",
    "invalid TSS",
    "segment not present",
    "stack segment",
    "alignment check",
    "double fault",
    "kernel stack overflow (double-fault)",
    "kernel stack overflow (page fault)",
    "stack guard page",
    "int3",
    "fpu exception",
    "simd exception",
    "iret exception",
    "unexpected #NM exception",
    "kernel control protection fault",
]
GPFSTR = "general protection fault"
for fmt in X86_DIE:
    for trap in X86_TRAPS:
        for err, count in [(0, 1), (2, 2), (0x10, 10), (0xFFFF, 2147483647)]:
            for flags in X86_FLAGS[:2] if trap != "Oops" else X86_FLAGS:
                rule = "kernel/oops"
                line = render(fmt, trap, err, count, *flags)
                if re.fullmatch(r"(?:Oops: )?divide error: 0000 \[#\d+\] SMP", line):
                    rule = "kernel/oops-divide-error"  # NPD's own rule speaks; no second KernelOops
                add("die", fmt, (trap, err, count, *flags), (rule, "KernelOops", {}))
    for flags in X86_FLAGS:
        add("die", fmt, (GPFSTR, 0, 1, *flags), ("kernel/general-protection-fault", "KernelOops", {}))
        add(
            "die",
            fmt,
            ("segment-related " + GPFSTR, 0x18, 3, *flags),
            ("kernel/general-protection-fault", "KernelOops", {}),
        )
    for hint in (
        "probably for non-canonical address",
        "maybe for address",
        "probably LASS violation for address",
        "LASS prevented access to address",
        "kernel NULL pointer dereference",
    ):
        for addr in (0, 0xDEAD000000000122, U64):
            desc = render(GPFSTR + ", %s 0x%lx", hint, addr)  # traps.c builds desc, die() prints it
            add(
                "die",
                fmt,
                (desc, 0, 1, " PREEMPT", " SMP", "", " KASAN", " NOPTI"),
                ("kernel/general-protection-fault", "KernelOops", {"hint": hint, "addr": f"0x{addr:x}"}),
            )
# arm64 / arm / powerpc die()
for fmt, values in [
    ("Internal error: %s: %016lx [#%d]" + " PREEMPT" + " SMP", ("Oops", 0x96000004, 1)),
    ("Internal error: %s: %016lx [#%d]" + " SMP", ("Oops - BUG", 0xF2000800, 2)),
    ("Internal error: %s: %016lx [#%d]", ("Oops - BTI", 0, 1)),
    ("Internal error: %s: %x [#%d]" + " PREEMPT" + " SMP", ("Oops", 0x96000045, 1)),
    ("Internal error: %s: %x [#%d]" + " SMP" + " ARM", ("Oops", 0x805, 1)),
    ("Internal error: %s: %x [#%d]" + " PREEMPT" + " SMP" + " THUMB2", ("Oops - undefined instruction", 0, 3)),
    ("Oops: %s, sig: %ld [#%d]", ("Kernel access of bad area", 11, 1)),
    (
        "Oops: %s, sig: %ld [#%d]" + " LE PAGE_SIZE=64K MMU=Radix SMP NR_CPUS=2048 NUMA PowerNV",
        ("Exception in kernel mode", 5, 2),
    ),
]:
    add("die", fmt, values, ("kernel/oops", "KernelOops", {}))

# arch/x86/mm/fault.c, arch/arm64/mm/fault.c, arch/arm/mm/fault.c: the page-fault oops line
for addr in (0, 8, 0xFFF):
    add(
        "page-fault",
        "BUG: kernel NULL pointer dereference, address: %px",
        (addr,),
        ("kernel/oops-null-pointer-new-wording", "KernelOops", {"addr": f"{addr:016x}"}),
    )
for addr in (0x1000, 0xFFFFB6C5C1D3F000, U64):
    for fmt in (
        "BUG: unable to handle page fault for address: %px",
        "BUG: unable to handle kernel paging request at %px",
    ):
        add(
            "page-fault", fmt, (addr,), ("kernel/oops-null-pointer-new-wording", "KernelOops", {"addr": f"{addr:016x}"})
        )
    add(
        "page-fault",
        "BUG: unable to handle kernel paging request at %p",
        (addr,),
        ("kernel/oops-null-pointer-new-wording", "KernelOops", {"addr": f"{addr:016x}"}),
    )
add(
    "page-fault",
    "BUG: unable to handle kernel paging request at virtual address %08lx",
    (0xF8A0C000,),
    ("kernel/oops-null-pointer-new-wording", "KernelOops", {"addr": "f8a0c000"}),
)
# arch/powerpc/mm/fault.c bad_page_fault: before 5.1 "Unable to handle kernel paging request for data at address
# 0x%08lx" (or "for instruction fetch", "for unknown fault"), 5.1+ "BUG: Unable to handle kernel data access ..."
for fmt, values in [
    ("Unable to handle kernel paging request for data at address 0x%08lx", (0,)),
    ("Unable to handle kernel paging request for data at address 0x%08lx", (0xC000000000001234,)),
    ("Unable to handle kernel paging request for instruction fetch", ()),
    ("Unable to handle kernel paging request for unknown fault", ()),
    ("BUG: Unable to handle kernel data access on %s at 0x%08lx", ("write", 0x10)),
    ("BUG: Unable to handle kernel instruction fetch%s", (" (bad address)",)),
    ("BUG: Unable to handle kernel unaligned access at 0x%08lx", (0xDEADBEEF,)),
]:
    add("page-fault", fmt, values, ("kernel/oops-null-pointer-new-wording", "KernelOops", {}))
# NPD's own wording stays NPD's rule alone (%p of NULL printed "(null)" before 4.15)
for fmt, addr in [
    ("BUG: unable to handle kernel NULL pointer dereference at %p", None),
    ("BUG: unable to handle kernel NULL pointer dereference at %px", 16),
    ("BUG: unable to handle kernel NULL pointer dereference at virtual address %08lx", 0),
]:
    add("page-fault", fmt, (addr,), ("kernel/oops-null-pointer", "KernelOops", {}))
for msg in (
    "NULL pointer dereference",
    "paging request",
    "execute from non-executable memory",
    "read from unreadable memory",
    "write to read-only memory",
    "access to user memory outside uaccess routines",
):
    add(
        "page-fault",
        "Unable to handle kernel %s at virtual address %016lx",
        (msg, 0xFFFF800081234000),
        ("kernel/oops-null-pointer-new-wording", "KernelOops", {"fault": msg, "addr": "ffff800081234000"}),
    )
    add(
        "page-fault",
        "Unable to handle kernel %s at virtual address %08lx when %s",
        (msg, 0, "read"),
        ("kernel/oops-null-pointer-new-wording", "KernelOops", {"fault": msg, "addr": "00000000"}),
    )
add(
    "page-fault",
    "Unable to handle kernel %s at %016lx RIP: ",
    ("NULL pointer dereference", 0x10),
    ("kernel/oops-null-pointer-new-wording", "KernelOops", {"addr": "0000000000000010"}),
)

# mm/oom_kill.c: OOM context lines (Events only)
for message in (
    "Out of memory",
    "Memory cgroup out of memory",
    "Out of memory (oom_kill_allocating_task)",
):
    for pid, comm, score in [(1, "java", 912), (2147483647, "", -1), (-1, "my (app)", 0)]:
        add(
            "oom",
            "%s: Kill process %d (%s) score %u or sacrifice child",
            (message, pid, comm, score),
            (
                "kernel/oom-kill-selected",
                "OOMKillSelected",
                {"context": message, "pid": str(pid), "comm": comm, "score": str(score % 2**32)},
            ),
        )
    add(
        "oom",
        "%s: Kill process %d (%s) score %d or sacrifice child",
        (message, 3817, "java", -1000),
        ("kernel/oom-kill-selected", "OOMKillSelected", {"score": "-1000"}),
    )
add(
    "oom",
    "%s: kill process %d (%s) score %li or a child",
    ("Out of memory", 42, "stress", 1234),
    ("kernel/oom-kill-selected", "OOMKillSelected", {"context": "Out of memory", "comm": "stress"}),
)
add(
    "oom",
    "Out of Memory: Kill process %d (%s) score %li and children.",
    (7, "dd", 99),
    ("kernel/oom-kill-selected", "OOMKillSelected", {"context": "Out of Memory", "pid": "7"}),
)
OOM_SUMMARY = "oom-kill:constraint=%s,nodemask=%*pbl"
for constraint in ("CONSTRAINT_NONE", "CONSTRAINT_CPUSET", "CONSTRAINT_MEMORY_POLICY", "CONSTRAINT_MEMCG"):
    for comm, pid in [("python3", 2813), ("", -1), ("a,b", 1)]:
        add(
            "oom",
            OOM_SUMMARY + ",cpuset=%s,mems_allowed=%*pbl" + ",oom_memcg=%s,task_memcg=%s" + ",task=%s,pid=%d,uid=%d",
            (
                constraint,
                64,
                "(null)",
                "/",
                64,
                "0-1",
                "/kubepods.slice/pod1",
                "/kubepods.slice/pod1/c1",
                comm,
                pid,
                -1,
            ),
            (
                "kernel/oom-kill-constraint",
                "OOMKillConstraint",
                {"constraint": constraint, "comm": comm, "pid": str(pid)},
            ),
        )
    add(  # 4.19: "pid=%5d,uid=%5d", no memcg context
        "oom",
        OOM_SUMMARY + ",task=%s,pid=%5d,uid=%5d",
        (constraint, 64, "0", "kubelet", 12, 0),
        ("kernel/oom-kill-constraint", "OOMKillConstraint", {"constraint": constraint, "comm": "kubelet", "pid": "12"}),
    )
    add(  # the pr_cont tail lost to an interleaved record
        "oom",
        OOM_SUMMARY,
        (constraint, 64, "0-1"),
        ("kernel/oom-kill-constraint", "OOMKillConstraint", {"constraint": constraint}),
    )
for pid, comm, anon in [(2813, "python3", 0), (-1, "", U64), (1, "my (app)", 4)]:
    add(
        "oom",
        "oom_reaper: reaped process %d (%s), now anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB",
        (pid, comm, anon, 0, U64),
        ("kernel/oom-reaper", "OOMReaper", {"pid": str(pid), "comm": comm}),
    )
for message in ("Out of memory", "Memory cgroup out of memory"):  # NPD's kernel/oom-killing
    add(
        "oom",
        "%s: Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB,"
        " UID:%u pgtables:%lukB oom_score_adj:%hd",
        (message, 2813, "python3", 18237636, 16109284, 0, 4, 1000, 33184, 999),
        ("kernel/oom-killing", "OOMKilling", {}),
    )

# arch/x86/mm/fault.c show_signal_msg (+ mm/memory.c print_vma_addr): user segfaults
SEGV = "%s%s[%d]: segfault at %lx ip %px sp %px error %lx"
IN_OLD, IN_NEW, IN_NONAME = " in %s[%lx+%lx]", " in %s[%lx,%lx+%lx]", " in " + "?[%lx+%lx]"
LIKELY = " likely on CPU %d (core %d, socket %d)"
for comm, pid in [("python3", 40211), ("", 1), ("my app [x]", 2147483647)]:
    for addr, error in [(0, 4), (0x7F3A1C2B4E10, 0x14), (U64, 0x1F)]:
        base = ("", comm, pid, addr, 0x7F3A1C2B4E10, 0x7FFD5D3C8A10, error)
        fields = {"comm": comm, "pid": str(pid), "addr": f"{addr:x}", "error": f"{error:x}"}
        add("segfault", SEGV, base, ("kernel/segfault", "ProcessSegfault", fields))
        add(
            "segfault",
            SEGV + IN_OLD,
            (*base, "libcuda.so.550.90.07", 0x7F3A1C000000, 0x1E00000),
            ("kernel/segfault", "ProcessSegfault", {**fields, "object": "libcuda.so.550.90.07"}),
        )
        add(
            "segfault",
            SEGV + IN_NEW + LIKELY,
            (*base, "libc.so.6", 0x28A3E, 0x7F1B2C400000, 0x195000, 17, 1, 0),
            ("kernel/segfault", "ProcessSegfault", {**fields, "object": "libc.so.6", "cpu": "17"}),
        )
        add(
            "segfault",
            SEGV + IN_NONAME + LIKELY,
            (*base, 0x7F1B2C400000, 0x1000, 0, 0, 0),
            ("kernel/segfault", "ProcessSegfault", {**fields, "object": "?", "cpu": "0"}),
        )
        add(
            "segfault",
            SEGV + LIKELY,
            (*base, -1, -1, -1),
            ("kernel/segfault", "ProcessSegfault", {**fields, "cpu": "-1"}),
        )
add(  # before 4.15: %p, NULL printed "(null)"
    "segfault",
    "%s%s[%d]: segfault at %lx ip %p sp %p error %lx" + IN_OLD,
    ("", "a.out", 25311, 0, None, 0x7FFF2FB08610, 0x14, "a.out", 0x400000, 0x1000),
    ("kernel/segfault", "ProcessSegfault", {"comm": "a.out", "error": "14", "object": "a.out"}),
)
add(
    "segfault",
    "%s%s[%d]: segfault at %08lx eip %08lx esp %08lx error %lx",
    ("", "httpd", 3000, 0, 0x80484D0, 0xBFFFF000, 6),
    ("kernel/segfault", "ProcessSegfault", {"comm": "httpd", "addr": "00000000"}),
)
add(
    "segfault",
    "%s%s[%d]: segfault at %lx rip %lx rsp %lx error %lx",
    ("", "java", 3001, 0x10, 0x2AAAAB000000, 0x7FFF00000000, 4),
    ("kernel/segfault", "ProcessSegfault", {"comm": "java", "addr": "10"}),
)

# kernel/panic.c __warn / warn_slowpath_common: the WARNING line of a WARN()/WARN_ON() report.
# %pS prints "function+0xoff/0xsize [module]", or the bare address when there is no symbol.
CALLERS = [
    ("drm_mm_takedown+0x2e/0x40 [drm]", "drm_mm_takedown", "drm"),
    ("nv_dma_map_sgt+0x1b/0x90 [nvidia]", "nv_dma_map_sgt", "nvidia"),
    ("__alloc_pages+0x2f5/0x330", "__alloc_pages", None),
    ("0xffffffffc0a1b2c3", "0xffffffffc0a1b2c3", None),
]
for (caller, symbol, module), (cpu, pid, file, line) in itertools.product(
    CALLERS,
    [(0, 0, "mm/page_alloc.c", 0), (8191, 2147483647, "drivers/gpu/drm/drm_mm.c", 1000), (-1, -1, "x.c", 2147483647)],
):
    fields = {"symbol": symbol, **({"module": module} if module else {})}
    add(  # 4.x+ with the file
        "warning",
        "WARNING: CPU: %d PID: %d at %s:%d %pS",
        (cpu, pid, file, line, caller),
        (
            "kernel/warning",
            "KernelWarning",
            {**fields, "cpu": str(cpu), "pid": str(pid), "file": file, "line": str(line)},
        ),
    )
    add(  # without file/line (no CONFIG_DEBUG_BUGVERBOSE)
        "warning",
        "WARNING: CPU: %d PID: %d at %pS",
        (cpu, pid, caller),
        ("kernel/warning", "KernelWarning", {**fields, "cpu": str(cpu), "pid": str(pid)}),
    )
    add(  # 3.12-4.x
        "warning",
        "WARNING: CPU: %d PID: %d at %s:%d %pS()",
        (cpu, pid, file, line, caller),
        ("kernel/warning", "KernelWarning", {**fields, "file": file}),
    )
    add(  # 2.6.26-3.11
        "warning",
        "WARNING: at %s:%d %pS()",
        (file, line, caller),
        ("kernel/warning", "KernelWarning", {**fields, "file": file, "line": str(line)}),
    )
# The transmit watchdog's WARN_ONCE: kernel/netdev-tx-timeout speaks for that report (the WARNING line is quiet
# after its NETDEV WATCHDOG record: test_rules_network.py); read alone, the WARNING line is kernel/warning's.
for fmt, values in [
    ("WARNING: CPU: %d PID: %d at %s:%d %pS", (3, 0, "net/sched/sch_generic.c", 525, "dev_watchdog+0x20f/0x250")),
    ("WARNING: CPU: %d PID: %d at %pS", (3, 0, "dev_watchdog+0x20f/0x250")),
    ("WARNING: at %s:%d %pS()", ("net/sched/sch_generic.c", 255, "dev_watchdog+0x1f5/0x200")),
]:
    add("warning", fmt, values, ("kernel/warning", "KernelWarning", {"symbol": "dev_watchdog"}))

# Look-alikes of the family that must stay silent for all of its rules (from the same sources)
for fmt, values in [
    # arch/x86/kernel/traps.c show_signal (pr_fmt "traps: "): a user-mode #GP, not a kernel oops
    (
        "traps: " + "%s[%d] %s%s ip:%lx sp:%lx error:%lx" + " in %s[%lx+%lx]",
        ("python3", 1, "", GPFSTR, 1, 2, 0, "libc.so.6", 3, 4),
    ),
    ("traps: " + "%s[%d] %s%s ip:%lx sp:%lx error:%lx", ("python3", 1, "trap ", "invalid opcode", 1, 2, 0)),
    ("traps: " + "%s[%d] %s%s ip:%lx sp:%lx error:%lx", ("bash", 9, "trap ", "divide error", 1, 2, 0)),
    # kernel/watchdog.c, kernel/rcu, drivers/tty/sysrq.c informational lines
    ("NMI watchdog: Enabled. Permanently consumes one hw-PMU counter.", ()),
    ("watchdog: Disabling watchdog on nohz_full cores by default", ()),
    ("rcu: Hierarchical RCU implementation.", ()),
    ("rcu: \tRCU restricting CPUs from NR_CPUS=%d to nr_cpu_ids=%u.", (8192, 128)),
    ("sysrq: %s", ("Show Blocked State")),
    ("sysrq: HELP : %s", ("loglevel(0-9) reboot(b) crash(c) show-memory-usage(m) ",)),
    ("sysrq: This sysrq operation is disabled.", ()),
    # the rest of a WARNING / oops report, and other "WARNING:" prints that are not __warn's
    ("------------[ cut here ]------------", ()),
    ("---[ end trace %016llx ]---", (0,)),
    ("---[ end trace %016llx ]---", (0xA1B2C3D4E5F60718,)),
    ("RIP: %04x:%pS", (0x10, "dev_watchdog+0x20f/0x250")),
    ("Call Trace:", ()),
    (" <TASK>", ()),
    ("Modules linked in: %s", ("nvidia_uvm(POE) nvidia(POE) ena",)),
    (
        "CPU: %d PID: %d Comm: %.*s %s%s %s %.*s%s",
        (3, 0, 16, "swapper/3", "Not tainted", "", "6.1.0-aws", 35, "#1", ""),
    ),
    ("nvidia-modeset: WARNING: GPU:%d: Lost display notification (%d:0x%08x); continuing.", (0, 0, 0)),
    ("WARNING: possible circular locking dependency detected", ()),
    ("WARNING: kernel stack frame pointer at %p in %s:%d has bad value %p", (0xFFFFB1C2, "python3", 42, 0)),
    # mm/oom_kill.c, fs: context that is not itself the event
    ("Memory cgroup stats for %s:", ("/kubepods.slice",)),
    ("oom_score_adj set for pid %d (%s)", (1, "systemd")),
    ("VFS: Mounted root (%s filesystem) readonly on device %u:%u.", ("ext4", 259, 1)),
]:
    add("look-alike", fmt, values if isinstance(values, tuple) else (values,))


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for table, _case in CASES:
        seen[table] = seen.get(table, 0) + 1
        out.append(f"{table}-{seen[table]}")
    return out


@ENGINES
@pytest.mark.parametrize(("table", "case"), CASES, ids=_ids())
def test_rendered_line_gives_exactly_the_family_findings(engine_cls, table, case):
    fmt, values, expected = case
    line = render(fmt, *values)
    findings = [f for f in engine_cls(rule_set=RULE_SET).feed([line]) if f.rule in FAMILY]
    assert [(f.rule, f.reason) for f in findings] == [(rule, reason) for rule, reason, _ in expected], line
    for finding, (_rule, _reason, fields) in zip(findings, expected, strict=True):
        for name, value in fields.items():
            assert finding.fields.get(name) == value, (line, name, dict(finding.fields))


def _ours() -> list:
    """The rules of this family after NPD's section (kernel/oops to kernel/segfault)."""
    start = next(i for i, r in enumerate(RULE_SET.rules) if r.name == "kernel/oops")
    return [r for r in RULE_SET.rules[start:] if r.name in FAMILY]


def test_every_rule_of_the_family_has_generated_lines():
    covered = {rule for _table, (_f, _v, expected) in CASES for rule, _r, _x in expected}
    assert len(_ours()) == 14
    assert {r.name for r in _ours()} - covered == set()


def test_every_rule_of_the_family_names_its_source():
    for rule in _ours():
        assert rule.provenance and all(p.startswith("torvalds/linux:") for p in rule.provenance), rule.name
        assert rule.literals, f"{rule.name} has no required literal for the prefilter"
        assert not rule.multiline, f"{rule.name} can match across lines"


@ENGINES
def test_an_oops_report_gives_one_finding_per_reporting_line(engine_cls):
    """A whole x86 NULL-pointer oops: the BUG line and the die() header are reported, the context
    lines are not, and the panic that follows is reported once (not again by its trailer)."""
    lines = [
        "BUG: kernel NULL pointer dereference, address: 0000000000000008",
        "#PF: supervisor read access in kernel mode",
        "#PF: error_code(0x0000) - not-present page",
        "PGD 0 P4D 0",
        "Oops: 0000 [#1] PREEMPT SMP NOPTI",
        "CPU: 3 PID: 81234 Comm: nccl-proxy Tainted: P           OE     6.8.0-1015-aws #16-Ubuntu",
        "RIP: 0010:nv_dma_map_sgt+0x1b/0x90 [nvidia]",
        "Kernel panic - not syncing: Fatal exception",
        "Kernel Offset: 0x2a000000 from 0xffffffff81000000 (relocation range: 0xffffffff80000000-0xffffffffbfffffff)",
        "---[ end Kernel panic - not syncing: Fatal exception ]---",
    ]
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [(f.line, f.rule) for f in findings] == [
        (1, "kernel/oops-null-pointer-new-wording"),
        (5, "kernel/oops"),
        (8, "kernel/panic"),
    ]


@ENGINES
def test_user_space_faults_are_not_kernel_oopses(engine_cls):
    line = (
        "traps: python3[40211] general protection fault ip:7f3a1c2b4e10 sp:7ffd5d3c8a10 error:0"
        " in libc.so.6[7f3a1c000000+195000]"
    )
    assert [f.reason for f in engine_cls(rule_set=RULE_SET).feed([line])] == []


@ENGINES
def test_a_segfault_line_with_a_clause_of_a_later_kernel_still_counts(engine_cls):
    line = render(SEGV + LIKELY + " in memory cgroup %s", "", "python3", 7, 0, 1, 2, 4, 3, 1, 0, "/kubepods")
    [finding] = [f for f in engine_cls(rule_set=RULE_SET).feed([line]) if f.rule in FAMILY]
    assert (finding.rule, finding.fields["comm"], finding.fields["cpu"]) == ("kernel/segfault", "python3", "3")


@ENGINES
def test_a_warning_report_gives_one_finding(engine_cls):
    """A WARN_ON report: cut here, the WARNING line, its detail lines, the end marker: one KernelWarning."""
    lines = [
        "------------[ cut here ]------------",
        "WARNING: CPU: 12 PID: 4242 at drivers/gpu/drm/drm_mm.c:1000 drm_mm_takedown+0x2e/0x40 [drm]",
        "Modules linked in: nvidia_drm(POE) drm_kms_helper drm nvidia(POE)",
        "CPU: 12 PID: 4242 Comm: Xorg Tainted: P           OE     6.8.0-1015-aws #16-Ubuntu",
        "Hardware name: Amazon EC2 p5.48xlarge/, BIOS 1.0 10/16/2017",
        "RIP: 0010:drm_mm_takedown+0x2e/0x40 [drm]",
        "RSP: 0018:ffffb1c2c3d4e5f8 EFLAGS: 00010246",
        "Call Trace:",
        " <TASK>",
        " drm_vma_offset_manager_destroy+0x12/0x30 [drm]",
        " </TASK>",
        "---[ end trace 0000000000000000 ]---",
    ]
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [(f.line, f.rule, f.reason) for f in findings] == [(2, "kernel/warning", "KernelWarning")]


@ENGINES
def test_the_transmit_watchdogs_warn_is_one_finding(engine_cls):
    """dev_watchdog's WARN_ONCE: the NETDEV WATCHDOG message speaks; its WARNING line does not again."""
    lines = [
        "------------[ cut here ]------------",
        "NETDEV WATCHDOG: eth0 (ena): transmit queue 3 timed out 5120 ms",
        "WARNING: CPU: 3 PID: 0 at net/sched/sch_generic.c:525 dev_watchdog+0x20f/0x250",
        "RIP: 0010:dev_watchdog+0x20f/0x250",
        "---[ end trace 0000000000000000 ]---",
    ]
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [(f.line, f.rule) for f in findings] == [(2, "kernel/netdev-tx-timeout")]


@ENGINES
def test_a_bug_report_gives_one_finding_at_its_header(engine_cls):
    """lib/bug.c BUG(): "kernel BUG at %s:%u!" then the die() header (invalid opcode): one KernelOops, at the
    record that names where the BUG fired (the header, in its report, is quiet; alone it is kernel/oops's)."""
    lines = [
        "------------[ cut here ]------------",
        render("kernel BUG at %s:%u!", "mm/slub.c", 4321),
        "invalid opcode: 0000 [#1] PREEMPT SMP NOPTI",
        "CPU: 7 PID: 1234 Comm: python3 Tainted: P           OE     6.8.0-1015-aws #16-Ubuntu",
        "RIP: 0010:kfree+0x1c7/0x1d0",
        "Code: 0f 0b 48 8b 45 00",
        "Call Trace:",
        "---[ end trace 0000000000000000 ]---",
    ]
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [(f.line, f.rule) for f in findings] == [(2, "kernel/bug-at")]
