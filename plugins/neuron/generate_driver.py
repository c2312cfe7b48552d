"""AWS Neuron driver print sites (issue 38): the pack sites-neuron.yaml from plugins/neuron/sites/neuron.tsv.

The Neuron kernel driver (aws-neuron/aws-neuron-driver, the aws-neuronx-dkms package) is out of tree; its
source is one git archive away. The extract names the release and commit in its first line (the source
directory's name)::

    git --git-dir=aws-neuron-driver.git archive HEAD | tar -x -C /tmp/aws-neuron-driver-2.24.7.0-<commit>
    python plugins/neuron/generate_driver.py extract /tmp/aws-neuron-driver-2.24.7.0-<commit> \\
        > plugins/neuron/sites/neuron.tsv
    python plugins/neuron/generate_driver.py generate plugins/neuron/sites/neuron.tsv > plugins/neuron/sites-neuron.yaml

Every error-level print of the driver that says the device, its firmware or the driver failed (a DMA that
did not complete, a firmware command that timed out, an engine or queue that did not initialise, a read
of the device that failed, an UltraServer link that is miswired) is a warning Event ``NeuronDriverError``:
the print does not say what the failure costs the node, so it sets no condition. The hardware errors the
Neuron runtime reports (``NEURON_HW_ERR=<TYPE> ...``, written through the driver's NEURON_IOCTL_PRINTK)
stay with neuron-monitor.yaml, which marks the node (NeuronHealth).

Not every error-level print is the node's fault: most of the driver's prints check a request a process
made through its ioctls, mmap() or sysfs (a handle it does not own, an offset past its buffer, a queue
id the engine does not have). A process's bad request is the process's bug, not the node's: those sites
are excluded below, each family with the function that checks it. The driver also prints two lines at
error level on every healthy start (its version, each device's PCI address and index): excluded as
benign, so no rule may fire on them.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "kernel"))
import printsites  # noqa: E402
from printsites import Call, Exclusion, Family, Spec  # noqa: E402

EXTRACT = HERE / "sites" / "neuron.tsv"
PACK = HERE / "sites-neuron.yaml"
DRIVER = "neuron-driver"  # the pci_driver's name (neuron_pci.c), which dev_err prints before the device

SPEC = Spec(
    name="neuron",
    paths=["*.c", "udma/*.c", "v1/*.c", "v2/*.c", "v3/*.c", "vc/*.c"],
    # printk() takes no pr_fmt (only the pr_* macros add it): the driver's two printk sites print bare.
    calls={"printk": Call(level=None, fmt_arg=0, prefix="none")},
    # Kbuild: obj-m += neuron.o, so each file's pr_fmt "%s:%s: " fmt, KBUILD_MODNAME, __func__ prints
    # "neuron:<function>: " (the files without a pr_fmt print their text bare).
    macros={"KBUILD_MODNAME": "neuron"},
)

# The rules are neuron-driver/sites-N: the neuron/ names are neuron-monitor.yaml's (the runtime's reports).
FAMILY = Family(
    name="neuron-driver",
    reason="NeuronDriverError",
    device_prefix=r"neuron-driver [0-9a-f]{4}:[0-9a-f]{2}:",
    repository="aws-neuron/aws-neuron-driver",
)


def _user(pattern: str, reason: str) -> Exclusion:
    return Exclusion(pattern=pattern, reason=f"a process's bad request, not a node fault: {reason}")


# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # --- what a healthy machine prints at error level -----------------------------------------------------
    # neuron_module_init(): "use ERR log level so driver version will be logged to the serial console".
    Exclusion(
        pattern=r"^Neuron Driver Started with Version:",
        reason="printed at error level on every module load, to reach the serial console (its version)",
        benign=True,
    ),
    # neuron_pci_device_id_to_rid_map_v2/_v3(): the PCI address and the index each device gets, at probe.
    Exclusion(
        pattern=r"\*\* BDF: %2\.2x:%2\.2x\.%x => nd\[%d\] \(routing id: %u\)",
        reason="printed at error level for every device at probe (its PCI address and Neuron device index)",
        benign=True,
    ),
    # mc_alloc_internal(): after dma_alloc_coherent() failed (the kernel's own allocation failure report)
    # the host memory came from the driver's reserved pool: the allocation succeeded.
    Exclusion(
        pattern=r"^neuron:mc_alloc_internal: Completed host allocation of %lluB from the internal pool",
        reason="an allocation that succeeded from the driver's reserved pool (after the kernel's allocation warning)",
        benign=True,
    ),
    # --- the runtime's text and multi-record reports ------------------------------------------------------
    # ncdev_printk(): NEURON_IOCTL_PRINTK writes a string the Neuron runtime passes, printk(KERN_ERR "%s\n");
    # the runtime's NEURON_HW_ERR=<TYPE> reports come this way and neuron-monitor.yaml's neuron/hw-error
    # speaks for them; the format has no text of the driver's own to match.
    Exclusion(
        pattern=r"^%s\\n$",
        where=r"^neuron_cdev\.c:",
        reason="the Neuron runtime's own text (NEURON_IOCTL_PRINTK): its NEURON_HW_ERR lines are neuron-monitor.yaml's",
    ),
    # mpset_print_lifespan_list(): "<list> has unfreed mcs:" heads the list of the chunks left over.
    Exclusion(
        pattern=r"^neuron:mpset_print_lifespan_list: mc:%px ref_count:",
        reason="a detail record of an unfreed memory chunk report (its '<list> has unfreed mcs:' header is the"
        " finding)",
    ),
    # neuron_pci_handle_dup_routing_id_v2/_v3(): what the driver does after "duplicate routing id %u found".
    Exclusion(
        pattern=r"scheduling unload of %s due to duplicate routing id",
        reason="the follow-up of a 'duplicate routing id' report (that record is the finding)",
    ),
    # The print right before a BUG_ON(true): the BUG oopses (invalid opcode: 0000 [#1], kernel-monitor.yaml).
    # (ndmabuf_detach()'s "Failed to retrieve nd%d" before its BUG_ON has a rule all the same: ndmabuf_map()
    # prints the same text, "ndmabuf_detach: ..." as written, where it returns an error and does not oops.)
    Exclusion(
        pattern=r"^ndmabuf_unmap: (Failed to retrieve nd%d|Must attach\(\) before unmap\(\)|dmabuf reference count)",
        where=r"^neuron_dmabuf\.c:(238|244|257)$",
        reason="the BUG_ON(true) on the next line oopses: the oops is the finding",
    ),
    Exclusion(
        pattern=r"^topsp is not supported in v1",
        where=r"^v1/neuron_dhal_v1\.c:(148|187|204)$",
        reason="the BUG_ON(true) on the next line oopses: the oops is the finding",
    ),
    # --- a process's bad request (ioctl arguments, mmap, sysfs writes, the order of its calls) -------------
    _user(r"^neuron:ncdev_mem_handle_to_mem_chunk: invalid memory handle", "a memory handle it does not hold"),
    _user(r"^neuron:neuron_copy_from_user: copy_from_user failed", "an ioctl argument pointer it cannot read"),
    _user(
        r"^neuron:ncdev_dma_descriptor_copyout: (get DMA queue desc failed|[tr]x size is less than count)",
        "an engine, queue or descriptor range past the queue it names",
    ),
    _user(r"(offset\+size|dev  size) is too large for mem handle", "an offset and size past its memory chunk"),
    _user(
        r"^neuron:ncdev_mem_copy_async_wait: dma memcpy wait failed\. invalid",
        "a memory or wait handle it does not hold",
    ),
    _user(r"^neuron:ncdev_verify_mem_region: Address out of range", "a BAR address outside the regions it may write"),
    _user(r"^neuron:ncdev_device_bdf_ext: Invalid nd index", "a device index the node does not have"),
    _user(r": HBM scrub: invalid HBM index", "an HBM index the device does not have"),
    _user(r"Neuron core map entries, but this driver only supports", "more core map entries than the driver has"),
    _user(r"^neuron:ncdev_misc_ioctl: invalid misc IOCTL", "an ioctl number the driver does not have"),
    _user(r"Process not allowed to request cmd=%u, pid not attached", "a command on a device it has not opened"),
    _user(r"NEURON_IOCTL_DMA_QUIESCE_QUEUES is no longer supported", "an ioctl an older runtime uses"),
    _user(
        r"^neuron:ncdev_open: nd%d: pid %d failed to open",
        "the device is held by as many processes as it takes (npid_print_usage lists them)",
    ),
    _user(
        r"^neuron:nci_set_state: nd%d nc:%d (can't set init state|invalid set init state)",
        "core init states out of order",
    ),
    _user(
        r"^neuron:ncrwl_\w+: nd%dnc%d: pid:%d "
        r"(Invalid pid - writer|- reader count is already 0|- writer downgrade called without enter)",
        "a NeuronCore model lock released or downgraded by a process that does not hold it",
    ),
    _user(
        r"^neuron:ncrwl_\w+: nd%dnc%d: pid:%d - (reader|writer) starved",
        "a NeuronCore model lock another process holds too long (contention between the node's workloads)",
    ),
    _user(
        r"^neuron:ndma_memcpy_offset_move: "
        r"Async dma (previous )?request on nd %d nc %d (has invalid state|is too large)",
        "an asynchronous copy larger than the driver takes, or chained to a copy not in flight",
    ),
    _user(r"trying to wait on async DMA context that is not in use", "a wait on a copy it did not start"),
    _user(
        r"^neuron:ndma_is_valid_host_mem: nd%d:invalid host memory",
        "a DMA descriptor that points at host memory it does not own",
    ),
    _user(
        r"could not pin host pages for zero copy dma",
        "a host buffer it cannot pin (unmapped, or past its locked-memory limit)",
    ),
    _user(r"^No matching memory was found with va=", "a dma-buf export for an address it has not mapped"),
    _user(r"^neuron:mc_alloc_internal: Allocating aligned host memory not supported", "an aligned host allocation"),
    _user(r"^neuron:mc_alloc_internal: alignment value not supported", "an alignment over INT_MAX"),
    _user(
        r"^neuron:mc_alloc_internal: (nd %d HBM %d: Could not allocate|Aligned memory allocation failed)",
        "more device memory than is free (the workload's size, not a fault)",
    ),
    _user(r"^neuron:mc_free: nd%d: contiguous scratchpad: freeing page", "scratchpad pages freed out of order"),
    _user(
        r"^neuron:nmmap_search_va: found 0x%llx on dev: %d slot: %d from another pid",
        "an address another process mapped",
    ),
    _user(
        r"^neuron:nmmap_get_mc: nd%d: (mc not found|invalid size|unaligned address|partial mmap|mmap of %lld bytes)",
        "an mmap() offset or size that is not one of its memory chunks",
    ),
    _user(r"notification ring size must be power of 2", "a notification queue size that is not a power of 2"),
    _user(
        r"^neuron:neuron_p2p_register_and_get_pa: Invalid size: request size",
        "a peer-memory registration past its mapping",
    ),
    _user(
        r"^neuron:nr_(start_ncs|wait): (Pending reset request for pid|Invalid reset request id)",
        "a reset request id twice, or one never made",
    ),
    _user(r"^neuron:ndmar_ack_completed: invalid [tr]x qid", "a queue id the engine does not have"),
    _user(r"^neuron:udma_q_handle_get: %s: invalid queue id", "a queue id the engine does not have"),
    _user(
        r"^neuron:udma_m2m_init_queue: "
        r"(invalid [ms]2[ms] ring|Completion ring not supported|invalid completion ring"
        r"|failed to init [ms]2[ms] queue)",
        "DMA queue parameters (NEURON_IOCTL_DMA_QUEUE_INIT: ring memory, size, completion ring) the engine does"
        " not take",
    ),
    _user(
        r"^neuron:udma_q_init_validate: "
        r"(invalid queue id|queue%d (size|has invalid alignment|completion not configured))",
        "DMA queue parameters (NEURON_IOCTL_DMA_QUEUE_INIT: queue id, size, alignment) the engine does not take",
    ),
    _user(r"\*\* blocking %llx", "a BAR write to a register the driver blocks"),
    _user(r"direct BAR%d write is not supported", "a BAR write to a BAR that takes none"),
    _user(r"Unsupported Neuron Core Mapping verion", "a core mapping version the driver does not have"),
    Exclusion(
        pattern=r"^topsp is not supported in v1",
        where=r"^v1/neuron_dhal_v1\.c:174$",
        reason="a process's bad request, not a node fault: a notification queue on Inferentia (v1), which has none",
    ),
    _user(
        r"^neuron:npe_(set_mode|.*ctrl\w*): trying to override exiting mode setting",
        "an UltraServer mode over the one set",
    ),
    _user(r"Invalid ultraserver control request value", "an UltraServer control value the driver does not have"),
    _user(r"^received invalid notify delay for sysfs metrics", "a value written to the notify_delay sysfs file"),
]

# Sites another pack's rules already speak for: no rule here, so a line is reported once. (None: the
# NEURON_HW_ERR lines come through the runtime's printk site, excluded above with its reason.)
LEAVE: list[Exclusion] = []


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/neuron/generate_driver.py",
        extract_path="plugins/neuron/sites/neuron.tsv",
    )


if __name__ == "__main__":
    raise SystemExit(printsites.main(sys.argv[1:], spec=SPEC, generate=generate))
