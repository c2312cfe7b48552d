"""A synthetic but realistic kernel-log stream for benchmarks: mostly benign, ~0.1% faults.

The templates are written for this project in the shapes real nodes print (container
networking churn, audit/apparmor, systemd scopes, filesystem mounts, NVIDIA/Neuron/EFA driver
chatter); fault lines follow the formats described in shared/reference.
"""

from __future__ import annotations

import random

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

FAULTS = (
    "NVRM: Xid (PCI:0000:{hex2}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:{hex2}:00): 13, pid={num}, name=python3, Graphics SM Warp Exception on (GPC {small}, "
    "TPC {small}, SM {small}): Out Of Range Address",
    "NVRM: Xid (PCI:0000:{hex2}:00): 48, pid={num}, name=pt_main_thread, An uncorrectable double bit error (DBE) "
    "has been detected on GPU in the framebuffer at physAddr 0x{hex8} partition {small}, subpartition 1.",
    "NEURON_HW_ERR=DMA_ERROR instance-id=i-0{hex8}{hex8} hostname=ip-10-0-{small}-{small} nd-id={small} "
    "nc-id={small} serial-num={hex8}{hex8} action=TERMINATE_INSTANCE",
    "INFO: task python3:{num} blocked for more than 122 seconds.",
    "Killed process {num} (python3) total-vm:{num}kB, anon-rss:{num}kB, file-rss:{num}kB, shmem-rss:0kB, UID:0 "
    "pgtables:{num}kB oom_score_adj:900",
    "pcieport 0000:{hex2}:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:{hex2}:00.0",
    "EXT4-fs error (device nvme{small}n1p1): ext4_find_entry:1455: inode #{num}: comm kubelet: reading directory "
    "lblock 0",
    "infiniband rdmap{small}s{small}: Admin queue is closed",
    "watchdog: BUG: soft lockup - CPU#{small} stuck for 23s! [python3:{num}]",
)


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        hex2=f"{rng.getrandbits(8):02x}",
        hex4=f"{rng.getrandbits(16):04x}",
        hex8=f"{rng.getrandbits(32):08x}",
        small=rng.randint(0, 31),
        num=rng.randint(100, 999999),
        epoch=rng.randint(1700000000, 1800000000),
        ms=rng.randint(100, 999),
        uuid="-".join(f"{rng.getrandbits(4 * n):0{n}x}" for n in (8, 4, 4, 4, 12)),
    )


def kernel_lines(count: int, *, fault_rate: float = 0.001, seed: int = 7) -> list[str]:
    """``count`` kernel messages (no prefixes), deterministic for a seed."""
    rng = random.Random(seed)
    return [_fill(rng.choice(FAULTS if rng.random() < fault_rate else BENIGN), rng) for _ in range(count)]
