"""Memory-management print sites (issue 38): the pack sites-mm.yaml from plugins/kernel/sites/mm.tsv.

    python plugins/kernel/generate_mm.py extract \\
        /work/src/linux-source-6.1 /work/src/linux-source-5.10 > plugins/kernel/sites/mm.tsv
    python plugins/kernel/generate_mm.py generate plugins/kernel/sites/mm.tsv > plugins/kernel/sites-mm.yaml

Every error-level print under mm/ (the page allocator, the OOM killer, hardware poison handling, the slab
allocators, vmalloc, hugetlb, swap, the page-table walkers, KFENCE and KASAN reports, zswap, CMA, percpu
and the rest), and the page allocator's own ``warn_alloc()`` reports ("page allocation failure: order:%u",
"vmalloc error: size %lu, ...", printed at KERN_WARNING with a call trace and the memory state), that
kernel-monitor.yaml's and memory-pcie.yaml's specific rules do not already speak for, is a warning Event
``MemoryManagementError``: the print says that an allocation failed, that the allocator found a
corrupted page or object, or that a swap device failed an I/O, not what that costs the node, so it sets
no condition. The OOM kill (OOMKilling) and a poisoned page left in use (MemoryFailure, the
MemoryUncorrectableError condition) stay with those packs.

The slab allocators report through their own helpers (slub.c ``slab_err``/``object_err``/``slab_bug``
print "BUG <cache> (<taint>): <message>" between two rules of '=' and '-'; ``slab_fix`` prints the
"FIX <cache>: ..." record after it; slab.c ``slab_error`` prints "slab error in <function>(): cache
`<cache>': <message>"): the extract lists those helpers' call sites with their messages.
"""

from __future__ import annotations

import sys
from pathlib import Path

import printsites
from printsites import Call, Exclusion, Family, Spec

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "sites" / "mm.tsv"
PACK = HERE / "sites-mm.yaml"
DRIVER = "nvme"

SPEC = Spec(
    name="mm",
    paths=["mm/*.c", "mm/damon/*.c", "mm/kasan/*.c", "mm/kfence/core.c", "mm/kfence/report.c"],
    calls={
        # mm/page_alloc.c: pr_warn("%s: %pV, mode:%#x(%pGg), nodemask=%*pbl", current->comm, &vaf, ...)
        "warn_alloc": Call(level="warning", fmt_arg=2, prefix="none", head="%s: "),
        # mm/slub.c slab_bug(): pr_err("BUG %s (%s): %pV\n", s->name, print_tainted(), &vaf)
        "slab_bug": Call(level="err", fmt_arg=1, prefix="none", head="BUG %s (%s): "),
        "slab_err": Call(level="err", fmt_arg=2, prefix="none", head="BUG %s (%s): "),
        "object_err": Call(level="err", fmt_arg=3, prefix="none", head="BUG %s (%s): "),
        # mm/slub.c slab_fix(): pr_err("FIX %s: %pV\n", s->name, &vaf)
        "slab_fix": Call(level="err", fmt_arg=1, prefix="none", head="FIX %s: "),
        # mm/slab.c __slab_error(): pr_err("slab error in %s(): cache `%s': %s\n", function, name, msg)
        "slab_error": Call(level="err", fmt_arg=1, prefix="none", head="slab error in %s(): cache `%s': "),
    },
    # mm/ is built in (z3fold, zsmalloc: one-file modules): KBUILD_MODNAME is the file's name.
    modname_from_file=True,
    printk_pr_fmt=False,
    # warn_alloc() prints at KERN_WARNING; with it come the level-less printk() sites (default level).
    levels=frozenset({"emerg", "alert", "crit", "err", "warn", "warning"}),
)

FAMILY = Family(name="mm", reason="MemoryManagementError")

_SHOW_MEM = r"^mm/(page_alloc\.c:6[0-4]\d\d|hugetlb\.c:47\d\d|swap_state\.c:6\d)$"
_SLUB_REPORT = r"^mm/slub\.c:(7[89]\d|8\d\d|9[0-3]\d|101\d|4407)$"  # print_track() ... print_trailer(), object_err()
_KASAN_REPORT = r"^mm/kasan/report(_generic|_sw_tags|_hw_tags)?\.c:"
_KFENCE_REPORT = r"^mm/kfence/report\.c:"

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # --- the details of a report whose header is the finding ---
    # warn_alloc() and the OOM killer's dump_header() call show_mem(): __show_free_areas() (page_alloc.c),
    # hugetlb_show_meminfo_node() and show_swap_cache_info() print the memory state with plain printk().
    Exclusion(
        pattern=r".",
        where=_SHOW_MEM,
        reason="a record of the memory state dump (show_mem) after an allocation failure or OOM header",
    ),
    # slub.c: slab_bug() prints "BUG <cache> (<taint>): <message>" between a rule of '=' and one of '-';
    # print_trailer()/print_track()/print_slab_info() and the bytes check then print the object's
    # details, slab_fix() the repair ("FIX <cache>: ..."). The helpers' own prints (the "%pV" forms)
    # are listed with each call site's message as slab_err/object_err/slab_bug sites.
    Exclusion(
        pattern=r"^(=+|-+)\\n|^BUG %s \(%s\): (%pV|%s)(\\n)?$|^FIX %s: %pV",
        where=r"^mm/slub\.c:",
        reason="slab_bug()/slab_fix()'s own print or its rules: each call site is listed with its message",
    ),
    Exclusion(
        pattern=r".",
        where=_SLUB_REPORT,
        reason="a detail record of a SLUB report (object, track, slab, overwritten bytes): BUG <cache> is its finding",
    ),
    Exclusion(
        pattern=r"^FIX %s: ",
        where=r"^mm/slub\.c:",
        reason="slab_fix(): the repair SLUB made after a BUG <cache> report, a detail record of that report",
    ),
    Exclusion(
        pattern=r"^BUG %s \(%s\): \{text\}$",
        where=r"^mm/slub\.c:",
        reason="list_slab_objects(): the message is its caller's argument (\"Objects remaining in %s on "
        '__kmem_cache_shutdown()"), and kmem_cache_destroy\'s WARN "Slab cache still has objects" follows',
    ),
    # slab.c (the SLAB allocator, not the default): __slab_error() is slab_error()'s print; the hex
    # dump, the bad-RAM advice, redzone and last user records follow a "Slab corruption" or
    # "slab error" header.
    Exclusion(
        pattern=r"^(slab error in %s\(\): cache `%s': %s|%03x: |Single bit error|Run (memtest86\+|a memory test)"
        r"|Redzone: |Last user: |Prev obj: |Next obj: |%px: redzone 1:)",
        where=r"^mm/slab\.c:",
        reason="a detail record of a SLAB corruption report (or slab_error()'s own print): its header is the finding",
    ),
    # dump_page() after "BUG: Bad page state" / "Bad page map": __dump_page_owner() (CONFIG_PAGE_OWNER).
    Exclusion(
        pattern=r".",
        where=r"^mm/page_owner\.c:",
        reason="a record of dump_page()'s page_owner detail, after a Bad page state/map header",
    ),
    Exclusion(
        pattern=r"^(addr:%px vm_flags:|file:%pD fault:)",
        where=r"^mm/memory\.c:",
        reason="a detail record of a BUG: Bad page map report (the header names the process and pte)",
    ),
    Exclusion(
        pattern=r"^(Mempool %p size| nr=%d @ %p)",
        where=r"^mm/mempool\.c:",
        reason="a detail record of a BUG: mempool element poison mismatch report",
    ),
    Exclusion(
        pattern=r"^File: %s PID: %d Comm:",
        where=r"^mm/filemap\.c:",
        reason="the second record of the direct I/O page cache invalidation failure (the first is the finding)",
    ),
    Exclusion(
        pattern=r"cpu_possible_mask=",
        where=r"^mm/percpu\.c:",
        reason="the second record of 'percpu: failed to initialize' (the first is the finding; a panic follows)",
    ),
    # dump_vma()/dump_mm() (mm/debug.c) are printed by VM_BUG_ON_VMA/VM_BUG_ON_MM (CONFIG_DEBUG_VM)
    # right before BUG(): the "kernel BUG at" report is the finding.
    Exclusion(
        pattern=r"^(vma %px start|mm %px task_size)",
        where=r"^mm/debug\.c:",
        reason="a VM_BUG_ON_VMA/VM_BUG_ON_MM dump (CONFIG_DEBUG_VM) before the kernel BUG report it precedes",
    ),
    # validate_mm() (mm/mmap.c, CONFIG_DEBUG_VM_MAPLE_TREE): its records end in VM_BUG_ON_MM, a kernel BUG.
    Exclusion(
        pattern=r"^mmap: (issue in|mt piv|mt vma|vma: %p vma_mt|map_count %d mas_for_each)",
        where=r"^mm/mmap\.c:",
        reason="validate_mm() of a CONFIG_DEBUG_VM_MAPLE_TREE build: the VM_BUG_ON_MM report after it is the finding",
    ),
    # KASAN (CONFIG_KASAN, a debug build): "BUG: KASAN: <type> in <function>" is the report's finding
    # (a rule here); the access, object, stack, shadow-memory and tag records are its details, and
    # "KASAN: <type> in range" is printed inside a general protection fault oops (die_addr), whose
    # header is kernel/general-protection-fault's.
    Exclusion(
        pattern=r"^(?!BUG: KASAN|KASAN internal error)",
        where=_KASAN_REPORT,
        reason="a detail record of a KASAN report (or of a non-canonical access oops): its header is the finding",
    ),
    Exclusion(
        pattern=r"^kasan test: ",
        where=r"^mm/kasan/kasan_test_module\.c:",
        reason="the KASAN test module (test_kasan_module), loaded by hand to test a KASAN build",
    ),
    # KFENCE (on in distribution kernels): "BUG: KFENCE: <type> in <function>" is the finding; the
    # access record, rules and blank lines are its details.
    Exclusion(
        pattern=r"^(?!BUG: KFENCE)",
        where=_KFENCE_REPORT,
        reason="a detail record of a KFENCE report (the BUG: KFENCE header is its finding)",
    ),
    # --- lines that set context, or carry their text in arguments ---
    # pcpu_dump_alloc_info(lvl, ai): the level is its argument, KERN_INFO at every boot
    # (pcpu_setup_first_chunk), KERN_EMERG only after "percpu: failed to initialize".
    Exclusion(
        pattern=r"%spcpu-alloc: ",
        where=r"^mm/percpu\.c:",
        reason="the percpu allocation layout, printed at KERN_INFO on every boot (its level is the caller's argument)",
        benign=True,
    ),
    # print_vma_addr(prefix, ip): called with KERN_CONT " in " by show_signal_msg() and do_trap(): the
    # "in libfoo.so[...]" end of a segfault/trap line (kernel/segfault's), not a record of its own.
    Exclusion(
        pattern=r"^%s%s\[%lx\+%lx\]$",
        where=r"^mm/memory\.c:",
        reason="the object and offset print_vma_addr() appends (KERN_CONT) to a user segfault or trap record",
        benign=True,
    ),
    Exclusion(
        pattern=r"^SLUB: Allocating a useless per node structure",
        where=r"^mm/slub\.c:",
        reason="the second record of 'SLUB: Unable to allocate memory from node %d' (the first is the finding)",
    ),
    Exclusion(
        pattern=r"^BUG %s \(%s\): inuse %u > max %u",
        where=r"^mm/slub\.c:",
        reason="check_slab()'s 'inuse %u > max %u' is too little text to match on ('objects %u > max %u' has a rule)",
    ),
    # memory_failure()'s outcome record is memory-pcie.yaml's kernel/memory-failure, graded by its
    # result (Ignored, Failed: the MemoryUncorrectableError condition); Recovered and Delayed mean the
    # page was isolated, and the machine-check record that led to it is the hardware error's finding.
    Exclusion(
        pattern=r"^Memory failure: %#lx: recovery action for %s: %s",
        reason="memory-pcie.yaml kernel/memory-failure grades this record by its result (Ignored/Failed)",
    ),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(
        pattern=r"^%s: Killed process %d \(%s\) total-vm:",
        where=r"^mm/oom_kill\.c:",
        reason="kernel-monitor.yaml kernel/oom-killing (OOMKilling)",
    ),
]


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/kernel/generate_mm.py",
        extract_path="plugins/kernel/sites/mm.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
