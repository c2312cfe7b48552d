"""Every built-in rule that names a device gives its findings that device: one line per printed form.

The lines are the drivers' own forms (the rule's provenance names the print site; real lines from
``../shared/testdata/kernel-lines.jsonl`` where we have them). A line that names no device keeps its finding
node-scoped (``device`` None). Both matchers must agree.
"""

from __future__ import annotations

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

RULE_SET = load_rule_set([builtin_plugins_dir()])
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])

CASES = [
    # NVIDIA Xid printer, src/nvidia/src/kernel/gpu/rc/kernel_rc.c (krcReportXid):
    # "NVRM: Xid (PCI:%04x:%02x:%02x): %d, "
    ("xid-real", "NVRM: Xid (PCI:0000:84:00): 95, Uncontained: FBHUB. RST: Yes", "nvidia/xid-node", "gpu:0000:84:00.0"),
    (
        "xid-pid-name",
        "NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, name=pt_main_thread, Ch 00000008",
        "nvidia/xid-event",
        "gpu:0000:38:00.0",
    ),
    (
        "xid-gb200-domain",
        "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 "
        "0x00000000 0x00000000 0x00000000)",
        "nvidia/xid-nvlink5-fatal",
        "gpu:0009:01:00.0",
    ),
    (
        "xid-154",
        "NVRM: Xid (PCI:0019:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset "
        "Required)",
        "nvidia/xid-recovery-action",
        "gpu:0019:01:00.0",
    ),
    # kernel_rc.c on MIG: " GPU-I:%02u GPU-CI:%02u" inside the parentheses
    (
        "xid-mig",
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 79, pid=77, name=python, GPU has fallen off the bus.",
        "nvidia/xid-node",
        "gpu:0000:3b:00.0",
    ),
    # drivers before R515: "NVRM: Xid (%04x:%02x:%02x): %d, %s" (no "PCI:")
    (
        "xid-pre-r515",
        "NVRM: Xid (0000:3b:00): 48, An uncorrectable double bit error",
        "nvidia/xid-node",
        "gpu:0000:3b:00.0",
    ),
    # a form the fallback rule speaks for: its group holds any text; no address, no device
    ("xid-fallback-no-address", "NVRM: Xid (GPU 3): 79, something new", "nvidia/xid-fallback-node", None),
    # osinit.c osHandleGpuLost NV_DEV_PRINTF "NVRM: GPU %04x:%02x:%02x.%x: GPU has fallen off the bus."
    (
        "fallen-dev-printf",
        "NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.",
        "nvidia/fallen-off-bus",
        "gpu:0000:5d:00.0",
    ),
    # before R515: "NVRM: GPU at %04x:%02x:%02x.%x has fallen off the bus." ("GPU at PCI:" in some releases)
    ("fallen-gpu-at", "NVRM: GPU at 0000:5d:00.0 has fallen off the bus.", "nvidia/fallen-off-bus", "gpu:0000:5d:00.0"),
    (
        "fallen-gpu-at-pci",
        "NVRM: GPU at PCI:0000:5d:00: has fallen off the bus.",
        "nvidia/fallen-off-bus",
        "gpu:0000:5d:00.0",
    ),
    # osinit.c RmInitAdapter NV_DEV_PRINTF "RmInitAdapter failed! (0x%x:0x%x:%d)"; the older nv_printf has no device
    (
        "init-dev-printf",
        "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x22:0x56:667)",
        "nvidia/init-adapter-failed",
        "gpu:0000:3b:00.0",
    ),
    ("init-no-device", "NVRM: RmInitAdapter failed! (0x22:0x56:667)", "nvidia/init-adapter-failed", None),
    ("init-minor-only", "NVRM: rm_init_adapter failed, device minor number 0", "nvidia/init-adapter-failed", None),
    # drivers/base/dd.c: "%s: probe of %s failed with error %d"
    ("probe", "nvidia: probe of 0000:3b:00.0 failed with error -1", "nvidia/probe-failed", "gpu:0000:3b:00.0"),
    # NEURON_HW_ERR (aws-neuron-sdk nrt-troubleshoot.rst; real lines): nd-id=<int>
    (
        "neuron-hw-err",
        "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR instance-id=i-0592464924bd45322 hostname=ip-172-31-61-252 nd-id=0 "
        "nc-id=0 serial-num=19fcda00f5ff6eb9 action=TERMINATE_INSTANCE",
        "neuron/hw-error",
        "neuron:neuron0",
    ),
    (
        "neuron-hw-err-nd12",
        "NEURON_HW_ERR=DMA_ERROR instance-id=i-0592464924bd45322 hostname=ip-172-31-61-252 nd-id=12 nc-id=3 "
        "serial-num=19fcda00f5ff6eb9 action=TERMINATE_INSTANCE",
        "neuron/hw-error",
        "neuron:neuron12",
    ),
    # the eks-node-monitoring-agent's test line names no device
    ("neuron-no-device", "NEURON_HW_ERR=DMA_ERROR affecting neuron devices", "neuron/hw-error", None),
    (
        "neuron-runtime-nd",
        "(FATAL-RT-UNDEFINED-STATE) [ND 3][NC 1] Uncorrectable memory error is detected, metadata: 0x16.",
        "neuron/runtime-uncorrectable-memory",
        "neuron:neuron3",
    ),
    (
        "neuron-tdrv",
        "2022-Aug-31 04:59:21.0546 117717:117717 ERROR  TDRV:tsync_wait_eng_stop                     nd5 nc0 "
        "Timestamp program stop timeout (1000 ms)",
        "neuron/runtime-engine-stop-timeout",
        "neuron:neuron5",
    ),
    # ibdev_printk (drivers/infiniband/core/device.c): "%s %s %s: " driver, parent device, IB device name
    (
        "efa-ibdev",
        "efa 0000:00:1c.0 efa_0: Admin queue is closed",
        "kernel/efa-admin-queue-closed",
        "rdma:efa_0",
    ),
    (
        "efa-null-name",
        "efa 0000:00:1c.0 (null): Admin queue is closed",
        "kernel/efa-admin-queue-closed",
        "rdma:0000:00:1c.0",
    ),
    ("efa-ib-only", "infiniband rdmap32s0: Admin queue is closed", "kernel/efa-admin-queue-closed", "rdma:rdmap32s0"),
    # mlx5_core_err (dev_printk + "%s:%d:(pid %d): "), mlx5/core/health.c
    (
        "mlx5",
        "mlx5_core 0000:17:00.1: poll_health:800:(pid 0): device's health compromised - reached miss count",
        "kernel/mlx5-health-compromised",
        "rdma:0000:17:00.1",
    ),
]


@ENGINES
@pytest.mark.parametrize(("case", "line", "rule", "device"), CASES, ids=[c[0] for c in CASES])
def test_finding_names_its_device(engine_cls: type, case: str, line: str, rule: str, device: str | None) -> None:
    findings = [f for f in engine_cls(rule_set=RULE_SET).feed([line], times=1.0) if f.rule == rule]
    assert len(findings) == 1, [f.rule for f in engine_cls(rule_set=RULE_SET).feed([line], times=1.0)]
    found = findings[0].device
    assert (found.key if found else None) == device
    if found is not None:
        assert found.printed in line


def test_rules_without_a_device_field_name_none() -> None:
    findings = RuleEngine(rule_set=RULE_SET).feed(["NVRM: GPU1 rpcRecvPoll timedout for fn 76!"], times=1.0)
    assert findings and all(f.device is None for f in findings)  # "GPU%d" is RM's instance number, not a device
