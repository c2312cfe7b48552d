"""Kernel core print sites (issue 38): the pack sites-core.yaml from plugins/kernel/sites/core.tsv.

    python plugins/kernel/generate_core.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/core.tsv
    python plugins/kernel/generate_core.py generate plugins/kernel/sites/core.tsv > plugins/kernel/sites-core.yaml

Every error-level print of the kernel's own health checks (RCU stall and grace-period reports, the soft
and hard lockup detectors, the hung-task detector, the workqueue lockup detector, CSD-lock (IPI) waits,
the scheduler's "BUG: scheduling while atomic" / "sleeping function called from invalid context"
checks, the lock debugging of kernel/locking), of its crash paths (lib/bug.c, kernel/panic.c, the x86
traps, page-fault oops and NMI handlers, arch/x86/kernel/dumpstack.c) that kernel-monitor.yaml's
specific rules (KernelOops, TaskHung, SoftLockup, HardLockup, RCUStall, KernelWarning, KernelPanic)
do not already speak for is a warning Event ``KernelCoreError``: the print says the kernel found itself
in a state it should not be in, not what that costs the node, so it sets no condition.

An oops, a panic and a WARN are reports of many records: the header is the finding ("<trap>: <code>
[#n]", "Kernel panic - not syncing: ...", "WARNING: CPU: ..."), and the records around it (the
"kernel BUG at" line BUG() prints before its invalid-opcode oops, the #PF decode, registers, the
call trace) are its details. The die() header itself prints at KERN_DEFAULT, below error level, so it
is not in the extract: kernel/oops speaks for it. Torture and self-test modules (rcutorture,
locktorture, test-ww_mutex) are not scanned: they are loaded by hand to test a kernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "core.tsv"
PACK = HERE / "sites-core.yaml"
DRIVER = "nvme"

SPEC = Spec(
    name="core",
    paths=[
        "kernel/rcu/tree.c",
        "kernel/rcu/tree_*.h",
        "kernel/rcu/tasks.h",
        "kernel/rcu/update.c",
        "kernel/rcu/srcutree.c",
        "kernel/watchdog.c",
        "kernel/watchdog_hld.c",
        "kernel/hung_task.c",
        "kernel/panic.c",
        "kernel/smp.c",
        "kernel/workqueue.c",
        "kernel/sched/core.c",
        "kernel/locking/lockdep.c",
        "kernel/locking/spinlock_debug.c",
        "kernel/locking/mutex.c",
        "kernel/locking/rwsem.c",
        "kernel/locking/rtmutex.c",
        "kernel/locking/irqflag-debug.c",
        "lib/bug.c",
        "arch/x86/kernel/dumpstack.c",
        "arch/x86/kernel/traps.c",
        "arch/x86/kernel/nmi.c",
        "arch/x86/mm/fault.c",
    ],
    # kernel/smp.c and arch/x86/kernel/traps.c: #define pr_fmt(fmt) KBUILD_MODNAME ": " fmt ("smp: ", "traps: ").
    modname_from_file=True,
    printk_pr_fmt=False,
    # The RCU tree's headers are included in kernel/rcu/tree.c: #define pr_fmt(fmt) "rcu: " fmt.
    pr_fmt={"kernel/rcu/tree_*.h": "rcu: "},
)

FAMILY = Family(name="core", reason="KernelCoreError")

_STALL = r"^kernel/rcu/(tree_stall|tree_exp|tasks)\.h:"

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # --- the details of a report whose header is the finding ---
    # RCU stall reports (kernel/rcu-stall's "INFO: %s detected stalls on CPUs/tasks:" / "self-detected
    # stall" / "detected expedited stalls" headers, kernel/rcu-kthread-starved's "kthread starved"):
    # the per-CPU and per-task records, the rcu_node and kthread state after them.
    Exclusion(
        pattern=r"^(rcu: )?(\\t|%p: |P%d: |Offline CPU %d blocking|All QSes seen|INFO: Stall ended before state dump"
        r"|RCU grace-period kthread stack dump|RCU GP kthread last ran|Stack dump where RCU GP kthread"
        r"|blocking rcu_node structures)",
        where=_STALL,
        reason="a detail record of an RCU stall report (its INFO: ... detected stall(s) header is the finding)",
    ),
    # The headers themselves are kernel/rcu-stall's: its pattern wants the flavor the %s prints
    # (rcu_sched, rcu_preempt, rcu_bh), which a render's "x" is not.
    Exclusion(
        pattern=r"INFO: %s (self-)?detected (expedited )?stall",
        where=_STALL,
        reason="kernel-monitor.yaml kernel/rcu-stall (RCUStall) for every RCU flavor the %s prints",
    ),
    Exclusion(
        pattern=r"^rcu: rcu_organize_nocb_kthreads: No-CB GP kthread CPU %d:",
        where=r"^kernel/rcu/tree_nocb\.h:",
        reason="show_rcu_nocb_state(): the no-CB kthread state in an RCU stall or sysrq dump",
    ),
    Exclusion(
        pattern=r"^rcu: %s%s Tree SRCU g%ld state",
        where=r"^kernel/rcu/srcutree\.c:",
        reason="srcu_torture_stats_print(): printed on request by rcutorture, not by a fault",
    ),
    Exclusion(
        pattern=r"^rcu: rcu_gp_torture_wait: (Waiting %lu jiffies|Wait complete)",
        where=r"^kernel/rcu/tree\.c:",
        reason="rcu_gp_torture_wait(): only in a CONFIG_RCU_TORTURE_TEST kernel, a delay rcutorture asked for",
    ),
    # hung_task.c check_hung_task(): kernel/task-hung's "INFO: task %s:%d blocked for more than %ld
    # seconds." is the finding; the taint/release line and the sysctl advice follow it.
    Exclusion(
        pattern=r"^ +%s %s %\.\*s%s|echo 0 > /proc/sys/kernel/hung_task_timeout_secs",
        where=r"^kernel/hung_task\.c:",
        reason="a detail record of a hung task report (the INFO: task ... blocked header is the finding)",
    ),
    Exclusion(
        pattern=r"^\{and\}\{reboot\}$",
        where=r"^kernel/hung_task\.c:",
        reason="'panic (and reboot, if panic_timeout= is set)' in a comment, not a print",
    ),
    # The scheduler's atomic-context checks: the BUG: header, then the counters and where preemption
    # was disabled.
    Exclusion(
        pattern=r"^(Preemption disabled at:|in_atomic\(\): |preempt_count: %x, expected|RCU nest depth: "
        r"|Thread overran stack, or stack corrupted)",
        where=r"^kernel/sched/core\.c:",
        reason="a detail record of a BUG: scheduling while atomic / sleeping function called ... report",
    ),
    # CSD lock waits (smp.c csd_lock_wait_toolong): "csd: Detected non-responsive CSD lock ..." and
    # "csd: CSD lock (#%d) got unstuck ..." are the findings; the per-CSD history and the IPI resend
    # follow the first.
    Exclusion(
        pattern=r"^smp: (\\t|csd: Re-sending CSD lock)",
        where=r"^kernel/smp\.c:",
        reason="a detail record of a non-responsive CSD lock report (its csd: header is the finding)",
    ),
    # Lock debugging (CONFIG_DEBUG_SPINLOCK, CONFIG_LOCKDEP): the lock and owner, and lockdep turning
    # itself off after a report.
    Exclusion(
        pattern=r"^( lock: %pS, \.magic:|turning off the locking correctness validator|The code is fine but needs"
        r"|you didn't initialize this object)",
        where=r"^kernel/locking/",
        reason="a detail record of a spinlock or lockdep report (its BUG:/INFO: header is the finding)",
    ),
    # panic(): kernel/panic's "Kernel panic - not syncing: %s" is the finding (every panic() site
    # renders to it); the reboot countdown, the sparc console advice and the closing
    # "---[ end Kernel panic" (which kernel/panic filters out) follow it.
    Exclusion(
        pattern=r"^(Rebooting in %d seconds|Press Stop-A|---\[ end Kernel panic)",
        where=r"^kernel/panic\.c:",
        reason="a detail record of a kernel panic (its Kernel panic - not syncing header is the finding)",
    ),
    # arch/x86/mm/fault.c show_fault_oops(): around kernel/oops-null-pointer-new-wording's "BUG: kernel
    # NULL pointer dereference" / "BUG: unable to handle page fault" come the NX/SMEP hint, the #PF
    # decode, the IDT/GDT and LDT/TSS descriptors, then the oops header; "Thread overran stack" after.
    Exclusion(
        pattern=r"^(%s: NULL|%s: 0x%hx -- |kernel tried to execute NX-protected page|unable to execute userspace code"
        r"|IDT: 0x%lx|Thread overran stack)",
        where=r"^arch/x86/mm/fault\.c:",
        reason="a detail record of a kernel page-fault oops (the BUG: line and the Oops header are its findings)",
    ),
    # arch/x86/kernel/nmi.c: after "Uhhuh. NMI received for unknown reason" / the SERR and IOCK records.
    Exclusion(
        pattern=r"^Dazed and confused, but trying to continue",
        where=r"^arch/x86/kernel/nmi\.c:",
        reason="the second record of an unknown-NMI or NMI error report (the first is the finding)",
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(
        pattern=r"INFO: rcu_tasks(_trace)? detected stalls on tasks:", reason="kernel-monitor.yaml kernel/rcu-stall"
    ),
    Exclusion(
        pattern=r"^rcu: %s kthread (starved for|timer wakeup didn't happen for)",
        reason="kernel-monitor.yaml kernel/rcu-kthread-starved (RCUKthreadStarved)",
    ),
    Exclusion(pattern=r"BUG: soft lockup - CPU#", reason="kernel-monitor.yaml kernel/soft-lockup (SoftLockup)"),
    Exclusion(
        pattern=r"^[Kk]ernel BUG at ", where=r"^lib/bug\.c:", reason="kernel-monitor.yaml kernel/bug-at (KernelOops)"
    ),
    Exclusion(
        pattern=r"^#PF: ",
        where=r"^arch/x86/mm/fault\.c:",
        reason="kernel-monitor.yaml kernel/page-fault-decode (KernelOops; quiet after its BUG: line)",
    ),
    Exclusion(pattern=r"Watchdog detected hard LOCKUP", reason="kernel-monitor.yaml kernel/hard-lockup (HardLockup)"),
    Exclusion(
        pattern=r"^INFO: task %s:%d blocked for more than", reason="kernel-monitor.yaml kernel/task-hung (TaskHung)"
    ),
    Exclusion(pattern=r"^Kernel panic - not syncing: ", reason="kernel-monitor.yaml kernel/panic (KernelPanic)"),
    Exclusion(
        pattern=r"^BUG: (kernel NULL pointer dereference, address:|unable to handle page fault for address:)",
        reason="kernel-monitor.yaml kernel/oops-null-pointer-new-wording (KernelOops)",
    ),
]


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_core.py",
        extract_path="plugins/kernel/sites/core.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
