"""A synthetic but realistic kernel-log stream for benchmarks, deterministic for a seed.

Records are drawn independently: a fault (``fault_rate``), a near miss (``near_miss_rate``: a
line that carries a rule's literal text but does not match, so the matcher has to look), a
benign multi-line block (``trace_rate``: a warning with its call trace, continuation lines
indented), or a benign line. Some faults span lines too (a hung task followed by its trace, a GPU
that fell off the bus in three lines). Every ``{placeholder}`` gets its own random value.

The templates are written for this project in the shapes real nodes print (container
networking churn, audit/apparmor, systemd scopes, filesystem mounts, NVIDIA/Neuron/EFA driver
chatter); fault lines follow the formats described in shared/reference.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

BENIGN = (
    "IPv6: ADDRCONF(NETDEV_CHANGE): cali{hex8}{hex4}: link becomes ready",
    "IPv6: ADDRCONF(NETDEV_UP): eth{small}: link is not ready",
    "eth0: renamed from tmp{hex8}",
    "cni0: port {small}(veth{hex8}) entered forwarding state",
    "cni0: port {small}(veth{hex8}) entered blocking state",
    "cni0: port {small}(veth{hex8}) entered disabled state",
    "device veth{hex8} entered promiscuous mode",
    "device veth{hex8} left promiscuous mode",
    'audit: type=1400 audit({epoch}.{ms}:{num}): apparmor="DENIED" operation="open" '
    'profile="cri-containerd.apparmor.d" name="/proc/{num}/mounts" pid={num} comm="python3" '
    'requested_mask="r" denied_mask="r" fsuid=0 ouid=0',
    "audit: type=1325 audit({epoch}.{ms}:{num}): table=nat family=2 entries={small} op=xt_replace pid={num} "
    'comm="iptables-restor"',
    "EXT4-fs (nvme{small}n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
    "xfs filesystem being mounted at /var/lib/kubelet/pods/{uuid}/volumes supports timestamps until 2038",
    "XFS (nvme{small}n1): Mounting V5 Filesystem",
    "XFS (nvme{small}n1): Ending clean mount",
    "nvidia-nvswitch{small}: open (major=510)",
    "NVRM: GPU at PCI:0000:{hex2}:00: GPU-{uuid}",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.{small}.{small}  Release Build",
    "nvidia-uvm: Loaded the UVM driver, major device number 511.",
    "nvidia 0000:{hex2}:00.0: enabling device (0000 -> 0002)",
    "TCP: request_sock_TCP: Possible SYN flooding on port {num}. Sending cookies.",
    "neuron:npid_detach: neuron:npid_detach: pid={num}, slot={small}",
    "neuron:ncdev_open: device nd{small} opened by pid {num}",
    "Neuron Driver Started with Version:2.{small}.{small}.0-{hex8}",
    "efa 0000:{hex2}:00.0 rdmap{small}s{small}: Setup irq:{num} name:efa-mgmnt@pci:0000:{hex2}:00.0",
    "ena 0000:{hex2}:00.0 eth{small}: Local page cache is disabled for less than 16 channels",
    "pci 0000:{hex2}:00.0: [10de:2330] type 00 class 0x030200",
    "pcieport 0000:{hex2}:01.0: PME: Signaling with IRQ {small}",
    "systemd[1]: Started cri-containerd-{hex8}{hex8}.scope - libcontainer container {hex8}.",
    "systemd[1]: run-containerd-runc-k8s.io-{hex8}-runc.{hex4}.mount: Deactivated successfully.",
    "overlayfs: upperdir is in-use as upperdir/workdir of another mount, accessing files from both mounts will "
    "result in undefined behavior.",
    "hrtimer: interrupt took {num} ns",
    "perf: interrupt took too long ({num} > {num}), lowering kernel.perf_event_max_sample_rate to {num}",
    "mlx5_core 0000:{hex2}:00.0: mlx5_fw_tracer_handle_traces:724:(pid {num}): FWTracer: Events were lost",
    "bond0: (slave eth{small}): link status definitely up, 100000 Mbps full duplex",
    "kauditd_printk_skb: {small} callbacks suppressed",
    "nfs: server fs-{hex8}.efs.us-west-2.amazonaws.com OK",
    "docker0: port {small}(veth{hex8}) entered forwarding state",
    "loop{small}: detected capacity change from 0 to {num}",
    "Memory cgroup stats for /kubepods.slice/kubepods-burstable.slice:",
    "watchdog: watchdog{small}: watchdog did not stop!",
)

# Lines with a rule's literal text (or most of it) that match no rule: the matcher must look at
# them (and usually run a regex) to tell.
NEAR_MISSES = (
    "NVRM: Xid (PCI:0000:{hex2}:00): GPU reset notification received",
    "nvidia-nvswitch{small}: SXid (PCI:0000:{hex2}:00.0): {num}, Info, nothing to report",
    "Killed process {num} (python3) total-vm:{num}kB",
    "oom_reaper: reaped process {num} (python3)",
    "INFO: task {comm}:{num} blocked for more than {num} seconds, watchdog rearmed",
    "watchdog: BUG: soft lockup - CPU#{small} stuck for {small}s",
    "Memory failure: 0x{hex8}",
    "NEURON_HW_ERR=none since boot",
    "EDAC MC{small}: Giving out device to module skx_edac controller Skylake Socket#{small} IMC#{small}: DEV "
    "0000:{hex2}:0a.0 (INTERRUPT)",
    "nfs: server fs-{hex8}.efs.us-west-2.amazonaws.com not responding, will retry",
    "NETDEV WATCHDOG: eth{small} (ena): transmit queue {small} recovered",
    "{comm}[{num}]: segfault at {hex8} ip {hex8} sp {hex8} in libc.so.6[7f{hex8}+195000]",
    "pcieport 0000:{hex2}:01.0: AER: device recovery successful",
    "nvme nvme{small}: I/O {num} QID {small} timeout, retrying",
)

_TRACE = (
    " <TASK>",
    " __schedule+0x{hex3}/0x{hex3}",
    " schedule+0x{hex2}/0x{hex3}",
    " ? __pfx_{comm}_worker+0x10/0x10",
    " io_schedule+0x{hex2}/0x{hex2}",
    " folio_wait_bit_common+0x{hex3}/0x{hex3}",
    " ret_from_fork+0x{hex2}/0x{hex2}",
    " </TASK>",
)

# Benign multi-line blocks: a backtrace an operator asked for (sysrq l), with registers and call trace
# (a WARNING report is not benign: kernel/warning reports it).
BENIGN_BLOCKS = (
    (
        "sysrq: Show backtrace of all active CPUs",
        "NMI backtrace for cpu {small}",
        "Modules linked in: nvidia_uvm(POE) nvidia_drm(POE) nvidia_modeset(POE) nvidia(POE) efa ena",
        "CPU: {small} PID: {num} Comm: kworker/{small}:{small} Tainted: P           OE     6.1.{small}-aws #1",
        "Hardware name: Amazon EC2 p5.48xlarge/, BIOS 1.0 10/16/2017",
        "RIP: 0010:netif_tx_lock+0x{hex2}/0x{hex3}",
        "RSP: 0018:ffffb{hex4}{hex8} EFLAGS: 00010246",
        "Call Trace:",
        *_TRACE,
        "---[ end trace {hex8}{hex8} ]---",
    ),
)

FAULTS = (
    "NVRM: Xid (PCI:0000:{hex2}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:{hex2}:00): 13, pid={num}, name=python3, Graphics SM Warp Exception on (GPC {small}, "
    "TPC {small}, SM {small}): Out Of Range Address",
    "NVRM: Xid (PCI:0000:{hex2}:00): 48, pid={num}, name=pt_main_thread, An uncorrectable double bit error (DBE) "
    "has been detected on GPU in the framebuffer at physAddr 0x{hex8} partition {small}, subpartition 1.",
    "NEURON_HW_ERR=DMA_ERROR instance-id=i-0{hex8}{hex8} hostname=ip-10-0-{small}-{small} nd-id={small} "
    "nc-id={small} serial-num={hex8}{hex8} action=TERMINATE_INSTANCE",
    "Killed process {num} (python3) total-vm:{num}kB, anon-rss:{num}kB, file-rss:{num}kB, shmem-rss:0kB, UID:0 "
    "pgtables:{num}kB oom_score_adj:900",
    "pcieport 0000:{hex2}:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:{hex2}:00.0",
    "EXT4-fs error (device nvme{small}n1p1): ext4_find_entry:1455: inode #{num}: comm kubelet: reading directory "
    "lblock 0",
    "infiniband rdmap{small}s{small}: Admin queue is closed",
    "watchdog: BUG: soft lockup - CPU#{small} stuck for 23s! [python3:{num}]",
)

# Faults that span lines: the first line (or the whole block) matches, the rest is context.
FAULT_BLOCKS = (
    (
        "INFO: task {comm}:{num} blocked for more than 122 seconds.",
        "      Tainted: P           OE     6.1.{small}-aws #1",
        '"echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.',
        "task:{comm} state:D stack:0     pid:{num} ppid:{num} flags:0x00004000",
        "Call Trace:",
        *_TRACE,
    ),
    (
        "NVRM: The NVIDIA GPU 0000:{hex2}:00.0",
        "NVRM: (PCI ID: 10de:2330) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ),
)

_COMMS = ("python3", "pt_main_thread", "kworker/u{small}:{small}", "containerd", "kubelet", "jbd2/nvme0n1p1-8")
_VALUES: dict[str, Callable[[random.Random], str]] = {
    "hex2": lambda rng: f"{rng.getrandbits(8):02x}",
    "hex3": lambda rng: f"{rng.getrandbits(12):03x}",
    "hex4": lambda rng: f"{rng.getrandbits(16):04x}",
    "hex8": lambda rng: f"{rng.getrandbits(32):08x}",
    "small": lambda rng: str(rng.randint(0, 31)),
    "num": lambda rng: str(rng.randint(100, 999999)),
    "epoch": lambda rng: str(rng.randint(1700000000, 1800000000)),
    "ms": lambda rng: str(rng.randint(100, 999)),
    "uuid": lambda rng: "-".join(f"{rng.getrandbits(4 * n):0{n}x}" for n in (8, 4, 4, 4, 12)),
    "comm": lambda rng: _fill(rng.choice(_COMMS), rng),
}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _fill(template: str, rng: random.Random) -> str:
    """Every placeholder gets its own value (unknown names stay as written)."""
    return _PLACEHOLDER.sub(lambda m: _VALUES[m.group(1)](rng) if m.group(1) in _VALUES else m.group(0), template)


# The share of the records that are no fault yet printed at error level (3): this machine's kernel log had 6
# of 1,697 records at level 3 or worse (0.35 %) on 2026-12-03; the stream takes three times that.
BENIGN_ERROR_SHARE = 0.01
ERR, WARNING, INFO = 3, 4, 6  # kernel levels (include/linux/kern_levels.h)


def kernel_lines(
    count: int,
    *,
    fault_rate: float = 0.01,
    near_miss_rate: float = 0.02,
    trace_rate: float = 0.002,
    seed: int = 7,
) -> list[str]:
    """``count`` kernel messages (no prefixes): each record is a fault with probability ``fault_rate``."""
    return kernel_records(
        count, fault_rate=fault_rate, near_miss_rate=near_miss_rate, trace_rate=trace_rate, seed=seed
    )[0]


def kernel_records(
    count: int,
    *,
    fault_rate: float = 0.01,
    near_miss_rate: float = 0.02,
    trace_rate: float = 0.002,
    seed: int = 7,
) -> tuple[list[str], list[int]]:
    """:func:`kernel_lines` and each line's kernel level, as ``/dev/kmsg`` gives it: a fault's first line at
    error level and its further lines (a trace) at warning level; a warning block (a WARN and its trace) at
    warning level; any other record at info level, or at error level for ``BENIGN_ERROR_SHARE`` of them. The
    levels come from their own random stream: the lines are those of ``kernel_lines`` for the same seed."""
    rng = random.Random(seed)
    levels_rng = random.Random(seed + 1)
    lines: list[str] = []
    levels: list[int] = []
    while len(lines) < count:
        draw = rng.random()
        fault = trace = False
        if draw < fault_rate:
            block = (rng.choice(FAULTS),) if rng.random() < 0.9 else rng.choice(FAULT_BLOCKS)
            fault = True
        elif draw < fault_rate + near_miss_rate:
            block = (rng.choice(NEAR_MISSES),)
        elif draw < fault_rate + near_miss_rate + trace_rate:
            block = rng.choice(BENIGN_BLOCKS)
            trace = True
        else:
            block = (rng.choice(BENIGN),)
        lines.extend(_fill(line, rng) for line in block)
        if fault:
            levels.extend([ERR] + [WARNING] * (len(block) - 1))
        elif trace:
            levels.extend([WARNING] * len(block))
        else:
            levels.extend([ERR if levels_rng.random() < BENIGN_ERROR_SHARE else INFO] * len(block))
    return lines[:count], levels[:count]
