"""The NVIDIA rules against lines rendered from the driver's own format strings.

Each table maps a format string (as printed by NVIDIA/open-gpu-kernel-modules, the Linux driver
core or the nvswitch driver; the provenance of the rule names the file) to values that exercise
its edges: smallest and largest numbers, negative ``%d``, empty ``%s``, every PCI domain width,
MIG attribution, the print prefixes of each driver generation. Every rendered line goes through
the fast and the reference matcher with all built-in packs loaded and must produce exactly the
expected finding (so no other rule, and no fallback, speaks for it as well).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

RULE_SET = load_rule_set([builtin_plugins_dir()])
PACK = yaml.safe_load((builtin_plugins_dir() / "nvidia" / "nvidia-monitor.yaml").read_text())
LISTS = {name: set(values) for name, values in PACK["lists"].items()}
NODE, NVLINK5, RECOVERY = LISTS["nvidia.xid.node"], LISTS["nvidia.xid.nvlink5"], LISTS["nvidia.xid.recovery"]
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])

_CONVERSION = re.compile(r"%([-+ #0]*\d*(?:\.\d+)?)(?:hh|h|ll|l|z|j|t)?([diouxXcs%])")


def printf(fmt: str, *args: Any) -> str:
    """A C format string rendered as printk renders it (length modifiers dropped, ``%u`` as ``%d``)."""
    return _CONVERSION.sub(lambda m: "%" + m.group(1) + m.group(2).replace("u", "d"), fmt) % args


def kernel_lines(text: str) -> list[str]:
    """One printk record as a reader sees it: a line per embedded newline, outer whitespace trimmed."""
    return [line.strip() for line in text.rstrip("\n").split("\n")]


@dataclass(frozen=True)
class Case:
    id: str
    lines: list[str]
    rule: str
    reason: str
    fields: dict[str, Any] = field(default_factory=dict)
    line: int = 0  # 1-based line of the finding; 0 = the last line


def _cycle(values: list, count: int, stride: int = 1) -> list:
    """``count`` values taken from ``values`` round-robin (a different stride per axis mixes the edges)."""
    return [values[(i * stride) % len(values)] for i in range(count)]


# --- Xid lines -------------------------------------------------------------------------------

DOMAINS = [0x0, 0x8, 0xFFFF, 0x10000, 0xFFFFFFFF]  # %04x: 4 to 8 hex digits
BUSES = [0x00, 0x3B, 0xFF]
DEVICES = [0x00, 0x1F]
PIDS = [("'<unknown>'", "<unknown>"), ("0", "0"), ("4294967295", "4294967295"), ("", "")]
NAMES = ["<unknown>", "python3", "", "kworker/u8:2"]
MESSAGES = [
    "",
    "GPU has fallen off the bus.",
    "Ch 0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS",
    "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
]
ROOT_CAUSES = ["", " caused by previous Xid 79"]
CODES = [0, 13, 31, 43, 45, 48, 63, 74, 79, 94, 119, 145, 154, 2147483647, -1]

XID_WITH_PROCESS = "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s%s"
XID_NO_PROCESS = "NVRM: Xid (PCI:%04x:%02x:%02x): %d, %s%s"
XID_MIG_GI = "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, pid=%s, name=%s, %s%s"
XID_MIG_GI_CI = "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, %s%s"
XID_OPEN_515 = "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s"
XID_BEFORE_515 = "NVRM: Xid (%04x:%02x:%02x): %d, %s"


def expected_xid_rule(code: int) -> tuple[str, str]:
    """The rule and reason for a code whose line carries no NVLink5 or recovery-action payload."""
    if code in NODE:
        return "nvidia/xid-node", f"GpuXid{code}"
    if code in NVLINK5:
        return "nvidia/xid-nvlink5-unparsed", f"GpuXid{code}"
    if code in RECOVERY:
        return "nvidia/xid-recovery-unparsed", f"GpuXid{code}"
    return "nvidia/xid-event", f"GpuXid{code}"


def _xid_cases() -> list[Case]:
    cases = []
    n = 2 * len(CODES)  # every code twice; each other axis cycles with a stride prime to its length
    axes = zip(
        _cycle(DOMAINS, n, 2),
        _cycle(BUSES, n, 2),
        _cycle(DEVICES, n, 3),
        _cycle(CODES, n),
        _cycle(PIDS, n, 3),
        _cycle(NAMES, n, 5),
        _cycle(MESSAGES, n, 7),
        _cycle(ROOT_CAUSES, n, 3),
        strict=True,
    )
    for i, (dom, bus, dev, code, (pid, pid_field), name, msg, cause) in enumerate(axes):
        pci = printf("%04x:%02x:%02x", dom, bus, dev)
        rule, reason = expected_xid_rule(code)
        common = {"pci": pci, "xid": code}
        variants = [
            (XID_WITH_PROCESS, (dom, bus, dev, code, pid, name, msg, cause), {"pid": pid_field, "name": name}),
            (XID_NO_PROCESS, (dom, bus, dev, code, msg, cause), {}),
            (XID_MIG_GI, (dom, bus, dev, i % 15, code, pid, name, msg, cause), {"gpu_instance": f"{i % 15:02d}"}),
            (XID_MIG_GI_CI, (dom, bus, dev, 14, 65535, code, pid, name, msg, cause), {"compute_instance": "65535"}),
            (XID_OPEN_515, (dom, bus, dev, code, "'<unknown>'", "<unknown>", msg), {"pid": "<unknown>"}),
            (XID_BEFORE_515, (dom, bus, dev, code, msg), {}),
        ]
        for fmt, args, extra in variants:
            text = printf(fmt, *args)
            cases.append(Case(f"{fmt[11:20]}|{text[10:]}", kernel_lines(text), rule, reason, {**common, **extra}))
    return cases


NVLINK5_FORMAT = "%s %s XC%01u i%01u Link %02d (0x%08x 0x%08x 0x%08x 0x%08x 0x%08x 0x%08x)\n"
NVLINK_LINK_DOWN_FORMAT = "%s %s XC%01u i%01u Link %02u : Link Down While Active.\n"


def _nvlink5_cases() -> list[Case]:
    cases = []
    units = ["MSE_WATCHDOG", "MSE degraded", "RLW_REMAP", "NETIR_BER_EVENT"]
    words = [(0, 0, 0, 0, 0, 0), (0xFFFFFFFF,) * 6, (0x040A7F01, 0x100, 0, 0, 0, 0)]
    for (unit, fatal, links, code), payload in zip(
        itertools.product(units, [True, False], [0, 7, 17, -1], sorted(NVLINK5)[:2]), itertools.cycle(words)
    ):
        severity = " Fatal  " if fatal else "Nonfatal"
        message = printf(NVLINK5_FORMAT, unit, severity, int(fatal), 1 - int(fatal), links, *payload)
        text = printf(XID_NO_PROCESS, 0x18, 1, 0, code, message, "")
        rule = "nvidia/xid-nvlink5-fatal" if fatal else "nvidia/xid-nvlink5-nonfatal"
        expect = {"xid": code, "link": links, "nvlink_severity": severity.strip(), "unit": unit}
        cases.append(
            Case(f"{code}-{unit}-{severity.strip()}-{links}", kernel_lines(text), rule, f"GpuXid{code}", expect)
        )
    # The software-defined link-down (a node-level code) keeps its node impact whatever it says.
    for fatal in (True, False):
        message = printf(
            NVLINK_LINK_DOWN_FORMAT, "NVLINK_SW_DEFINED_ERROR", " Fatal  " if fatal else "Nonfatal", 0, 0, 3
        )
        text = printf(XID_WITH_PROCESS, 0, 0x1B, 0, 155, "'<unknown>'", "<unknown>", message, "")
        cases.append(Case(f"155-link-down-{fatal}", kernel_lines(text), "nvidia/xid-node", "GpuXid155", {"link": 3}))
    return cases


RECOVERY_FORMAT = "GPU recovery action changed from 0x%x (%s) to 0x%x (%s)"
ACTIONS = ["None", "GPU Reset Required", "Drain P2P", "Drain and Reset", "Node Reboot Required", "OS Reboot", "PF FLR"]


def _recovery_cases() -> list[Case]:
    cases = []
    for (i, before), (j, after) in itertools.product(enumerate(ACTIONS), repeat=2):
        if before == after:
            continue
        code_after = 0xFFFFFFFF if after == "PF FLR" else j
        message = printf(RECOVERY_FORMAT, i, before, code_after, after)
        text = printf(XID_NO_PROCESS, 0x8, 1, 0, 154, message, "")
        rule = "nvidia/xid-recovery-cleared" if after == "None" else "nvidia/xid-recovery-action"
        fields = {"previous_action": before, "action": after, "action_code": f"0x{code_after:x}"}
        cases.append(Case(f"{before}->{after}", kernel_lines(text), rule, "GpuXid154", fields))
    return cases


XID_MESSAGES = [
    # (code, message format, values, rule, extra fields)
    (
        119,
        "Timeout after %llus of waiting for RPC response from GPU%d GSP! Expected function %d (%s) (0x%llx 0x%llx).",
        (6, 4, 103, "GSP_RM_ALLOC", 0x2081, 0x4),
        "nvidia/xid-node",
        {},
    ),
    (
        119,
        "Timeout after %llus of waiting for RPC response from GPU%d GSP! Expected function %d (%s) sequence %u "
        "(0x%llx 0x%llx).",
        (45, 0, 76, "GSP_RM_CONTROL", 4294967295, 0xFFFFFFFFFFFFFFFF, 0),
        "nvidia/xid-node",
        {},
    ),
    (119, "Timeout waiting for RPC from GSP! Expected function %s (0x%x 0x%x).", ("FREE", 0, 0), "nvidia/xid-node", {}),
    (
        119,
        "Timeout waiting for RPC from GPU%d GSP! Expected function %d (%s) (0x%x 0x%x).",
        (0, 76, "GSP_RM_CONTROL", 0x90CC0301, 0xC),
        "nvidia/xid-node",
        {},
    ),
    (79, "GPU has fallen off the bus.", (), "nvidia/xid-node", {}),
    (
        74,
        "NVLink: fatal error detected on link %d(0x%x, 0x%x, 0x%x, 0x%x, 0x%x, 0x%x, 0x%x)",
        (14, 0, 0, 0x10000, 0, 0, 0, 0),
        "nvidia/xid-node",
        {"link": 14},
    ),
    (74, "NVLink: fatal error detected on link %d", (6,), "nvidia/xid-node", {"link": 6}),
    (
        999,
        "NVLink: Link training failed for link %u(0x%x, 0x%x, 0x%x, 0x%x, 0x%x, 0x%x, 0x%x)",
        (17, 1, 2, 3, 4, 5, 6, 7),
        "nvidia/xid-event",
        {"link": 17},
    ),
    (
        999,
        "NVLink: Link training failed for links 0x%llx(0x%x, 0x%x, 0x%x, 0x%x, 0x%x, 0x%x, 0x%x)",
        (0x3FFFF, 0, 0, 0, 0, 0, 0, 0),
        "nvidia/xid-event",
        {},
    ),
]


def _message_cases() -> list[Case]:
    cases = []
    for code, fmt, values, rule, extra in XID_MESSAGES:
        for prefix in (XID_WITH_PROCESS, XID_NO_PROCESS):
            head = (0, 0x9B, 0, code, "2024380", "nvidia-smi") if prefix == XID_WITH_PROCESS else (0, 0x9B, 0, code)
            text = printf(prefix, *head, printf(fmt, *values), "")
            cases.append(Case(f"{code}:{fmt[:30]}", kernel_lines(text), rule, f"GpuXid{code}", {"xid": code, **extra}))
    return cases


# Xid lines the specific pattern does not understand: the family fallback speaks, by the code's list.
FALLBACK_LINES = [
    "NVRM: Xid (PCI:0000:3b:00.0 ): %d, GPU has fallen off the bus.",  # a space inside the parentheses
    "NVRM: Xid (PCI:): %d, %s",  # an empty address
    "NVRM: Xid (GPU0): %d, %s",  # another device name
    "NVRM: Xid (0001:00): %d, %s",  # a bus:slot-only address
    "NVRM: Xid (PCI:0000:3b:00) %d %s",  # no colon, no comma
    "NVRM: Xid: %d, %s",  # no address
]


def _fallback_cases() -> list[Case]:
    cases = []
    for fmt, code in itertools.product(FALLBACK_LINES, [79, 13, 145, 154, 0, 4294967295]):
        text = printf(fmt, code, "Graphics Exception") if fmt.count("%") == 2 else printf(fmt, code)
        rule = "nvidia/xid-fallback-node" if code in NODE else "nvidia/xid-fallback"
        cases.append(Case(f"{fmt[11:25]}-{code}", kernel_lines(text), rule, f"GpuXid{code}", {"xid": code}))
    return cases


# --- NVRM lines without an Xid ---------------------------------------------------------------

NV_DEV = "NVRM: GPU %04x:%02x:%02x.%x: "  # NV_DEV_PRINTF
PCI_ARGS = [(0, 0x3B, 0, 0), (0xFFFF, 0xFF, 0x1F, 7), (0x10000, 1, 0, 0), (0xFFFFFFFF, 0, 0, 1)]
NV_PRINTF_PREFIXES = ["NVRM: ", "NVRM: GPU0 ", "NVRM: %s: ", "NVRM: GPU255 %s: "]  # NV_PRINTF generations


def _nv_printf(prefix: str, function: str, message: str) -> str:
    return (prefix % function if "%s" in prefix else prefix) + message


def _device_cases() -> list[Case]:
    cases = []
    for dom, bus, dev, fn in PCI_ARGS:
        pci = printf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
        head = printf(NV_DEV, dom, bus, dev, fn)
        for values in [(0x62, 0x65, 1860), (0, 0, 0), (0xFFFFFFFF, 0xFFFFFFFF, -1)]:
            text = head + printf("RmInitAdapter failed! (0x%x:0x%x:%d)\n", *values)
            fields = {"pci": pci, "init_status": f"0x{values[0]:x}", "init_line": str(values[2])}
            cases.append(
                Case(f"init-{text}", kernel_lines(text), "nvidia/init-adapter-failed", "GpuInitFailed", fields)
            )
        for minor in (0, 254, -1):
            text = head + printf("rm_init_adapter failed, device minor number %d\n", minor)
            fields = {"pci": pci, "minor": str(minor)}
            cases.append(
                Case(f"init-{text}", kernel_lines(text), "nvidia/init-adapter-failed", "GpuInitFailed", fields)
            )
        text = head + "GPU has fallen off the bus.\n"
        cases.append(Case(f"bus-{text}", kernel_lines(text), "nvidia/fallen-off-bus", "GpuFallenOffBus", {"pci": pci}))
        text = printf("NVRM: GPU at %04x:%02x:%02x.%x has fallen off the bus.\n", dom, bus, dev, fn)
        cases.append(Case(f"bus-{text}", kernel_lines(text), "nvidia/fallen-off-bus", "GpuFallenOffBus", {"pci": pci}))
        text = head + "GPU Reset Required\n"
        cases.append(
            Case(f"reset-{text}", kernel_lines(text), "nvidia/reset-required", "GpuResetRequired", {"pci": pci})
        )
        for driver in ("nvidia", "nvidia-nvswitch"):
            for error in (-1, -12, 2147483647):
                text = printf("%s: probe of %s failed with error %d\n", driver, pci, error)
                fields = {"pci": pci, "error": error}
                cases.append(Case(f"probe-{text}", kernel_lines(text), "nvidia/probe-failed", "GpuProbeFailed", fields))
                text = printf("%s %s: probe with driver %s failed with error %d\n", driver, pci, driver, error)
                fields = {"pci": pci, "error": error, "driver": driver}
                cases.append(Case(f"probe-{text}", kernel_lines(text), "nvidia/probe-failed", "GpuProbeFailed", fields))
    for message, values in [
        ("RmInitAdapter failed! (0x%x:0x%x:%d)\n", (0x26, 0xFFFF, 1227)),
        ("rm_init_adapter failed, device minor number %d\n", (3,)),
        ("rm_init_adapter failed for device bearing minor number %d\n", (0,)),
    ]:
        text = "NVRM: " + printf(message, *values)
        cases.append(Case(f"init-{text}", kernel_lines(text), "nvidia/init-adapter-failed", "GpuInitFailed"))
    for count in (1, 8, -1):
        text = printf("NVRM: The NVIDIA probe routine failed for %d device(s).\n", count)
        fields = {"failed_devices": count}
        cases.append(Case(f"probe-{text}", kernel_lines(text), "nvidia/probe-failed", "GpuProbeFailed", fields))
    # nv_drivers_init's conclusion when no GPU came up (and the proprietary driver's older wording)
    for text in [
        "NVRM: None of the NVIDIA devices were initialized.\n",
        "NVRM: None of the NVIDIA graphics adapters were initialized!\n",
    ]:
        cases.append(Case(f"probe-{text}", kernel_lines(text), "nvidia/probe-failed", "GpuProbeFailed"))
    return cases


# Multi-line records: the finding belongs to the line that completes the match.
FALLEN_OFF_MULTILINE = (
    "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\nNVRM: (PCI ID: %04x:%04x) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands.\n"
)
NOT_SUPPORTED = [
    "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x (PCI ID: %04x:%04x)\nNVRM: installed in this system is not supported by "
    "open\nNVRM: nvidia.ko because it does not include the required GPU\nNVRM: System Processor (GSP).\n",
    "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x (PCI ID: %04x:%04x)\nNVRM: installed in this vGPU host system is not "
    "supported by\nNVRM: open nvidia.ko.\n",
    "NVRM: The NVIDIA vGPU %04x:%02x:%02x.%x (PCI ID: %04x:%04x)\nNVRM: installed in this system is not supported by "
    "open\nNVRM: nvidia.ko.\n",
    "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x (PCI ID: %04x:%04x)\nNVRM: installed in this system is not supported by "
    "the\nNVRM: NVIDIA %s driver release.\n",
    "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x (PCI ID: %04x:%04x) installed\nNVRM: in this system is not supported by "
    "the %s NVIDIA Linux\nNVRM: graphics driver release.\n",
]


def _multiline_cases() -> list[Case]:
    cases = []
    for dom, bus, dev, fn in PCI_ARGS:
        pci = printf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
        for vendor, device in [(0x10DE, 0x2330), (0xFFFF, 0x0000)]:
            lines = kernel_lines(printf(FALLEN_OFF_MULTILINE, dom, bus, dev, fn, vendor, device))
            rule = "nvidia/fallen-off-bus-multiline"
            cases.append(Case(f"bus-{pci}-{device}", lines, rule, "GpuFallenOffBus", {"pci": pci}))
        for i, fmt in enumerate(NOT_SUPPORTED):
            args = (dom, bus, dev, fn, 0x10DE, 0x13D8) + (("550.54.15",) if fmt.count("%s") else ())
            lines = kernel_lines(printf(fmt, *args))
            fields = {"pci": pci, "pci_id": "10de:13d8"}
            cases.append(Case(f"unsupported{i}-{pci}", lines, "nvidia/gpu-not-supported", "GpuNotSupported", fields, 2))
    return cases


GSP_MESSAGES = [
    ("_kgspLogXid119", "********************************* GSP Timeout **********************************", (), {}),
    ("_kgspLogGspTimeout", "*** GSP Timeout: %s (origin=%s) ***", ("GSP heartbeat timeout", "HealthCheck"), {}),
    ("_kgspLogGspTimeout", "*** GSP Timeout: %s (origin=%s) ***", ("GSP-RM is slow", "RPC"), {}),
    ("_kgspLogGspTimeout", "*** GSP Timeout: %s (origin=%s) ***", ("", ""), {}),
    (
        "_kgspIsHeartbeatTimedOut",
        "%s heartbeat timed out, currentTimeMs %u heartbeat %u heartbeatWithOffsetMs %u diff %u timeout %u",
        ("LibOS", 0, 4294967295, 0, 4294967295, 0),
        {"heartbeat": "LibOS"},
    ),
    (
        "_kgspIsHeartbeatTimedOut",
        "%s heartbeat timed out, currentTimeMs %u heartbeat %u heartbeatWithOffsetMs %u diff %u timeout %u",
        ("GSP-RM", 1234, 1000, 1000, 234, 200),
        {"heartbeat": "GSP-RM"},
    ),
    ("_kgspLogHeartbeatSpecificTimeout", "GPU%d: GSP ERROR: %s Heartbeat Timeout detected.", (7, "GSP-RM"), {}),
    (
        "_kgspLogRpcSanityCheckFailure",
        "GPU%d sanity check failed 0x%x waiting for RPC response from GSP. Expected function %d (%s) (0x%llx 0x%llx).",
        (0, 0xF, 76, "GSP_RM_CONTROL", 0x20801813, 0x4C),
        {},
    ),
    (
        "_kgspLogRpcSanityCheckFailure",
        "GPU%d sanity check failed 0x%x waiting for RPC response from GSP. Expected "
        "function %d (%s) sequence %u (0x%llx 0x%llx).",
        (255, 0xFFFFFFFF, 10, "FREE", 0, 0, 0),
        {},
    ),
    ("_issueRpcAndWait", "rpcRecvPoll timedout for fn %d!", (76,), {}),
    ("_issueRpcAndWait", "rpcRecvPoll timedout for fn %d!", (-1,), {}),
]

RESET_MESSAGES = [
    (
        "nvAssertOkFailedNoLog",
        "Assertion failed: %s (0x%08X) returned from %s @ %s:%d",
        ("Reset required [NV_ERR_RESET_REQUIRED]", 0x62, "status", "kernel_gsp.c", 2076),
    ),
    (
        "nvCheckOkFailedNoLog",
        "Check failed: %s (0x%08X) returned from %s @ %s:%d",
        ("Reset required [NV_ERR_RESET_REQUIRED]", 0x62, "pRmApi->Control(...)", "osinit.c", 0),
    ),
    (
        "nvAssertOkFailed",
        "Assertion failed: %s (0x%08X) returned from 0x%016llx",
        ("Reset required [NV_ERR_RESET_REQUIRED]", 0x62, 0xFFFFFFFFFFFFFFFF),
    ),
    ("nvAssertOkFailed", "Assertion failed: %s (0x%08X) returned from 0x%016llx", ("Reset required", 0x62, 0)),
    (
        "nvAssertFailedNoLog",
        "Assertion failed: %s @ %s:%d",
        ("Back to back GSP RPC timeout detected! GPU marked for reset", "kernel_gsp.c", 2076),
    ),
    ("krcErrorInvokeCallback_IMPL", "Gpu marked for reset. Triggering TDR.", ()),
]


def _nv_printf_cases() -> list[Case]:
    cases = []
    for (function, fmt, values, fields), prefix in itertools.product(GSP_MESSAGES, NV_PRINTF_PREFIXES):
        text = _nv_printf(prefix, function, printf(fmt, *values))
        gpu = re.search(r"GPU(\d+)", prefix)
        expect = {**fields, **({"gpu": gpu.group(1)} if gpu else {})}
        cases.append(Case(f"gsp-{text}", kernel_lines(text), "nvidia/gsp-timeout", "GpuGspTimeout", expect))
    for (function, fmt, values), prefix in itertools.product(RESET_MESSAGES, NV_PRINTF_PREFIXES):
        text = _nv_printf(prefix, function, printf(fmt, *values))
        cases.append(Case(f"reset-{text}", kernel_lines(text), "nvidia/reset-required", "GpuResetRequired"))
    for seconds, prefix in itertools.product([7, 0, -1], NV_PRINTF_PREFIXES):
        message = printf("RC watchdog: GPU is probably locked!  Notify Timeout Seconds: %d\n", seconds)
        text = _nv_printf(prefix, "krcWatchdog_IMPL", message)
        rule, fields = "nvidia/rc-watchdog", {"timeout_seconds": str(seconds)}
        cases.append(Case(f"rc-{text}", kernel_lines(text), rule, "GpuRCWatchdogTimeout", fields))
    return cases


# --- NVSwitch SXid lines -----------------------------------------------------------------------

SXID_PREFIX = "nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, "  # NVSWITCH_PRINT_SXID
SXID_LINK = ["Fatal, Link %02d %s%s\n", "Non-fatal, Link %02d %s%s\n"]
SXID_INSTANCE = ["Fatal, %s, instance=%d, chiplet=%d\n", "Non-fatal, %s, instance=%d, chiplet=%d\n"]
SXID_FREE_TEXT = [
    ("SOE init Failed(0)\n", ()),
    ("IO failure\n", ()),
    ("NVSWITCH Temperature %dC | TSENSE WARN Threshold %dC\n", (95, 90)),
    ("Thermal Slowdown Engaged | Links Thermal Mode %s\n", ("ON",)),
    ("Module %d faulty\n", (-1,)),
]


def _sxid_cases() -> list[Case]:
    cases = []
    switches = ["nvswitch0", "nvswitch11"]
    for (dom, bus, dev, fn), code, switch in zip(PCI_ARGS, [0, -1, 24007, 99999], itertools.cycle(switches)):
        pci = printf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
        head = printf(SXID_PREFIX, switch, dom, bus, dev, fn, code)
        base = {"pci": pci, "sxid": code, "switch": switch.removeprefix("nvswitch")}
        for fmt, (link, text, first) in itertools.product(
            SXID_LINK, [(0, "sourcetrack timeout error", " (First)"), (63, "", ""), (-1, "RX Short Error Rate", "")]
        ):
            fatal = fmt.startswith("Fatal")
            rule = "nvidia/sxid-fatal" if fatal else "nvidia/sxid-nonfatal"
            fields = {**base, "link": link, "sxid_severity": "Fatal" if fatal else "Non-fatal"}
            line = head + printf(fmt, link, text, first)
            cases.append(Case(f"sxid-{line}", kernel_lines(line), rule, f"NVSwitchSXid{code}", fields))
        for fmt in SXID_INSTANCE:
            fatal = fmt.startswith("Fatal")
            line = head + printf(fmt, "PRI WRITE PRT error", -1, 2147483647)
            rule = "nvidia/sxid-fatal" if fatal else "nvidia/sxid-nonfatal"
            cases.append(Case(f"sxid-{line}", kernel_lines(line), rule, f"NVSwitchSXid{code}", base))
        line = head + printf("Fatal, unhandled interrupt in %s(%d)\n", "_nvswitch_service_nport_ls10", 1234)
        cases.append(Case(f"sxid-{line}", kernel_lines(line), "nvidia/sxid-fatal", f"NVSwitchSXid{code}", base))
        for fmt, values in SXID_FREE_TEXT:
            line = head + printf(fmt, *values)
            fields = {"pci": pci, "sxid": code}
            cases.append(
                Case(f"sxid-{line}", kernel_lines(line), "nvidia/sxid-fallback", f"NVSwitchSXid{code}", fields)
            )
    return cases


# The records nvswitch_record_error prints after the header (error_nvswitch.c, _nvswitch_dump_error_entry).
SXID_DETAIL = [
    ("Severity %d Engine instance %02d Sub-engine instance %02d\n", (0, 61, 0)),
    ("Severity %d Engine instance %02d Sub-engine instance %02d\n", (-1, 2147483647, -2147483648)),
    ("Data {0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x}\n", (0, 1, 2, 3, 4, 5, 6, 7, 8)),
    ("Data {0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x, 0x%08x}\n", (0xFFFFFFFF,) * 8),
]


def _sxid_detail_reports() -> list[tuple[list[str], str]]:
    """(lines, the header's rule): a header and every detail record after it, for each code and switch."""
    reports = []
    for (dom, bus, dev, fn), code in zip(PCI_ARGS, [0, -1, 24007, 99999], strict=True):
        head = printf(SXID_PREFIX, "nvswitch3", dom, bus, dev, fn, code)
        for fmt, rule in [(SXID_LINK[0], "nvidia/sxid-fatal"), (SXID_LINK[1], "nvidia/sxid-nonfatal")]:
            lines = [head + printf(fmt, 44, "sourcetrack timeout error", " (First)")]
            lines += [head + printf(detail, *values) for detail, values in SXID_DETAIL]
            reports.append(([line.strip() for line in lines], rule))
    return reports


@ENGINES
@pytest.mark.parametrize(("lines", "rule"), _sxid_detail_reports())
def test_an_sxid_report_with_its_detail_records_is_its_headers_one_finding(engine_cls, lines, rule):
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [(f.rule, f.line) for f in findings] == [(rule, 1)]
    # Read without their header (a log cut short, a grep for the code), the records are the fallback's Events.
    alone = engine_cls(rule_set=RULE_SET).feed(lines[1:], line_numbers=1)
    assert {(f.rule, f.reason) for f in alone} == {("nvidia/sxid-fallback", findings[0].reason)}


# nv_pci_probe's invalid BAR report (one nv_printf, two lines), RmLogGpuCrash's notice after the fault it
# dumped, and the GSP RPC timeouts' rate-limit notice after the Xid 119s it counts.
INVALID_BAR = (
    "NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:\n"
    "NVRM: BAR%d is %lluM @ 0x%llx (PCI:%04x:%02x:%02x.%x)\n"
)
CRASH_DUMP = (
    "NVRM: A GPU crash dump has been created. If possible, please run\n"
    "NVRM: nvidia-bug-report.sh as root to collect this data before\n"
    "NVRM: the NVIDIA kernel module is unloaded.\n"
)
RATE_LIMITED = (
    "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:%04x:%02x:%02x (printing 1 of every %d).  "
    "The GPU likely needs to be reset.\n"
)


def _report_cases() -> list[tuple[str, list[str], list[tuple[str, int]], list[tuple[str, str]]]]:
    """(id, a report's lines, its findings as (rule, line), the findings of its last record(s) alone)."""
    cases = []
    for (dom, bus, dev, fn), (bar, size, addr) in zip(
        PCI_ARGS,
        [(0, 0, 0), (1, 0, 0), (3, 18446744073709551615, 0xFFFFFFFFFFFFFFFF), (5, 32768, 0xE0000000)],
        strict=True,
    ):
        lines = kernel_lines(printf(INVALID_BAR, bar, size, addr, dom, bus, dev, fn))
        cases.append(
            (
                f"bar{bar}-{dom:x}",
                lines,
                [("nvidia/invalid-bar", 1)],
                [("nvidia/invalid-bar-continuation", "GpuInvalidBar")],
            )
        )
    for (dom, bus, dev, _fn), code in zip(PCI_ARGS, [79, 48, 119, 13], strict=True):
        xid = printf(
            "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=1234, name=python3, GPU has fallen off the bus.",
            dom,
            bus,
            dev,
            code,
        )
        lines = [xid, *kernel_lines(CRASH_DUMP)]
        rule = "nvidia/xid-node" if code in NODE else "nvidia/xid-event"
        cases.append((f"crash-dump-xid{code}", lines, [(rule, 1)], [("nvidia/gpu-crash-dump", "GpuCrashDumpCreated")]))
    for (dom, bus, dev, _fn), skip in zip(PCI_ARGS, [30, 1, 2147483647, 0], strict=True):
        xid = printf(
            "NVRM: Xid (PCI:%04x:%02x:%02x): 119, pid=2357, name=nv-hostengine, Timeout after 6s of waiting for RPC "
            "response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x2080a097 0x490).",
            dom,
            bus,
            dev,
        )
        lines = [xid, xid, *kernel_lines(printf(RATE_LIMITED, dom, bus, dev, skip))]
        cases.append(
            (
                f"rate-limited-{skip}",
                lines,
                [("nvidia/xid-node", 1), ("nvidia/xid-node", 2)],
                [("nvidia/nvrm-failure", "NvidiaDriverError")],
            )
        )
    return cases


REPORT_CASES = _report_cases()


@ENGINES
@pytest.mark.parametrize(("lines", "found", "alone"), [c[1:] for c in REPORT_CASES], ids=[c[0] for c in REPORT_CASES])
def test_a_report_and_the_records_after_its_header_are_the_headers_findings(engine_cls, lines, found, alone):
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [(f.rule, f.line) for f in findings] == found, lines
    # The records after the header read without it (a log cut short, a grep): one Event.
    tail = [line for line in lines[1:] if "Xid" not in line]
    assert [(f.rule, f.reason) for f in engine_cls(rule_set=RULE_SET).feed(tail, line_numbers=1)] == alone, tail


# --- other GPU-stack lines ---------------------------------------------------------------------

OTHER_CASES = (
    [
        # An SXid report's detail records read without their header (error_nvswitch.c): the fallback's Event.
        Case(
            f"sxid-detail-{i}",
            [printf("nvidia-nvswitch%d: SXid (PCI:%04x:%02x:%02x.%x): %05d, ", sw, 0, bus, 0, 0, code) + rest],
            "nvidia/sxid-fallback",
            f"NVSwitchSXid{code}",
            {"sxid": code},
        )
        for i, (sw, bus, code, rest) in enumerate(
            [
                (1, 0x87, 12028, "Severity 0 Engine instance 61 Sub-engine instance 00"),
                (0, 0x05, 24007, "Severity 1 Engine instance 44 Sub-engine instance 00"),
                (
                    3,
                    0x86,
                    12028,
                    "Data {"
                    + ", ".join([f"0x{w:08x}" for w in (0x1C0, 0xE265F, 0x500, 0x40, 0, 0x8000, 0x5A000100, 0, 0)])
                    + "}",
                ),
                (1, 0x84, 22013, "Data {" + ", ".join([f"0x{w:08x}" for w in (0x1C0, 0, 0, 0, 0, 0, 0, 0)]) + "}"),
                (1, 0x84, 12028, "Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, "),  # cut short
            ]
        )
    ]
    + [
        # The last line of rm_is_supported_device's three-line message read alone: an Event, no device.
        Case(f"fallen-off-bus-continuation-{i}", [text], "nvidia/fallen-off-bus-continuation", "GpuFallenOffBus")
        for i, text in enumerate(
            [
                "NVRM: fallen off the bus and is not responding to commands.",
                "               NVRM: fallen off the bus and is not responding to commands.",
            ]
        )
    ]
    + [
        Case(
            f"peermem-{text}",
            [text],
            "nvidia/peermem-invalid-context",
            "NvidiaPeermemError",
            {"function": "nv_get_p2p_free_callback"},
        )
        for text in [
            printf("nvidia-peermem %s:%d %s", "nv_get_p2p_free_callback", line, message)
            for line, message in itertools.product(
                [0, 127, 2147483647],
                [
                    "detected invalid context, skipping further processing",
                    "ERROR detected invalid context, skipping further processing",
                    "nv_get_p2p_free_callback -- invalid nv_mem_context",
                    "nv_get_p2p_free_callback -- invalid page_table",
                    "nv_get_p2p_free_callback -- invalid dma_mapping",
                ],
            )
        ]
    ]
    + [
        Case(f"cuda-{text}", [text], "nvidia/cuda-uncorrectable-ecc", "CudaUncorrectableECCError")
        for text in [
            printf("%sCUDA error: %s", head, "uncorrectable ECC error encountered") for head in ["", "RuntimeError: "]
        ]
    ]
    + [
        Case(f"fm-{text}", [text], "nvidia/fabricmanager-nvswitch-error", "NVSwitchError", {"sxid": sxid, "pci": pci})
        for text, sxid, pci in [
            (
                printf(
                    "[%s] [ERROR] [tid %d] detected NVSwitch %s error %d on fid %d on NVSwitch pci bus id %s "
                    "physical id %d port %d",
                    "Mar 03 2026 11:02:17",
                    1808,
                    severity,
                    sxid,
                    fid,
                    pci,
                    3,
                    44,
                ),
                sxid,
                pci,
            )
            for severity, sxid, fid, pci in [
                ("fatal", 24007, 0, "00000000:86:00.0"),
                ("non-fatal", 12028, -1, "0000:87:00.0"),
            ]
        ]
    ]
)

DISPLAY_CASES = [
    Case(f"display-{text}", [text], "nvidia/display-error", "NvidiaDisplayError", fields)
    for text, fields in [
        *[
            (printf("%s%s%s%s", "nvidia-modeset: ", "ERROR: ", prefix, msg), extra)
            for (prefix, extra), msg in itertools.product(
                [("GPU:0: ", {"gpu": "0"}), ("GPU:15: ", {"gpu": "15"}), ("", {})],
                ["Idling display engine timed out: 0x0000c67e:0:0:1128", "Failed to allocate memory", ""],
            )
        ],
        *[
            (printf("[drm:%s [nvidia_drm]] *ERROR* [nvidia-drm] %s%s", func, gpu, msg), extra)
            for func, (gpu, extra), msg in itertools.product(
                ["nv_drm_dev_load", "__nv_drm_gem_nvkms_map"],
                [("[GPU ID 0x00000100] ", {"gpu_id": "0x00000100"}), ("", {})],
                ["Failed to allocate NvKmsKapiDevice", "Failed to map NvKmsKapiMemory 0x0000000012345678"],
            )
        ],
    ]
] + [
    Case(
        f"fw-{text}",
        [text],
        "nvidia/firmware-load-failed",
        "GpuFirmwareLoadFailed",
        {"pci": pci, "firmware": fw, "error": err},
    )
    for pci, fw, err in itertools.product(
        ["0000:01:00.0", "0008:3b:00.0", "10000:e1:00.0"],
        ["nvidia/570.133.20/gsp_ga10x.bin", "nvidia/535.54.03/gsp_tu10x.bin"],
        [-2, -4, 0],
    )
    for text in [printf("nvidia %s: Direct firmware load for %s failed with error %d\n", pci, fw, err).strip()]
]

CASES = (
    DISPLAY_CASES
    + _xid_cases()
    + _nvlink5_cases()
    + _recovery_cases()
    + _message_cases()
    + _fallback_cases()
    + _device_cases()
    + _multiline_cases()
    + _nv_printf_cases()
    + _sxid_cases()
    + OTHER_CASES
)


@ENGINES
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rendered_line_gives_exactly_its_finding(engine_cls, case: Case):
    findings = engine_cls(rule_set=RULE_SET).feed(case.lines, line_numbers=1)
    assert [(f.rule, f.reason) for f in findings] == [(case.rule, case.reason)], case.lines
    (finding,) = findings
    assert finding.line == (case.line or len(case.lines))
    for name, value in case.fields.items():
        assert finding.fields.get(name) == value, (name, dict(finding.fields))


def test_every_rule_of_the_pack_has_rendered_lines():
    rules = {r.name for r in RULE_SET.rules if r.source == "nvidia-monitor"}
    threshold_only = {"nvidia/xid-repeated", "nvidia/sxid-correctable"}  # see the count-in-window tests below
    # never a finding: see the SXid report test and the report test above
    quiet = {
        "nvidia/sxid-detail-in-report",
        "nvidia/invalid-bar-in-report",
        "nvidia/gpu-crash-dump-in-report",
        "nvidia/gsp-rpc-rate-limited-in-report",
    }
    reports = {rule for _, _, found, alone in REPORT_CASES for rule, _ in found + alone}
    assert rules - threshold_only - quiet == {c.rule for c in CASES} | (reports & rules)


@ENGINES
def test_every_xid_code_gives_one_finding_with_the_impact_of_its_list(engine_cls):
    """Never silent, never twice: each code, whatever its text, by the list it is in."""
    engine = engine_cls(rule_set=RULE_SET)
    for code in [*range(0, 256), 2147483647, 4294967295, -2147483648]:
        for text in (
            printf(XID_NO_PROCESS, 0, 0x3B, 0, code, "a message this pack has never seen", ""),
            printf("NVRM: Xid (PCI:%s): %d, %s", "0000:3b:00.0 ", code, ""),
        ):
            findings = engine.feed([text])
            assert len(findings) == 1, (text, findings)
            permanent = findings[0].condition == "GpuXid"
            assert permanent == (code in NODE), (text, findings[0].rule)
            assert findings[0].reason == f"GpuXid{code}"


@ENGINES
@pytest.mark.parametrize(
    ("code", "reason"), [(13, "GpuXid13Repeated"), (31, "GpuXid31Repeated"), (43, "GpuXid43Repeated")]
)
def test_repeated_codes_mark_the_gpu_on_the_tenth_line_in_an_hour(engine_cls, code, reason):
    engine = engine_cls(rule_set=RULE_SET)
    line = printf(XID_WITH_PROCESS, 0, 0x5E, 0, code, "7001", "pt_main_thread", "Ch 00000008", "")
    other_gpu = printf(XID_WITH_PROCESS, 0, 0x5F, 0, code, "7001", "pt_main_thread", "Ch 00000008", "")
    assert all(f.rule == "nvidia/xid-event" for f in engine.feed([line] * 9 + [other_gpu], times=0.0))
    late = engine.feed([line], times=4000.0)  # the first nine are more than an hour old
    assert [f.rule for f in late] == ["nvidia/xid-event"]
    burst = engine.feed([line] * 9, times=4001.0)
    assert [f.reason for f in burst if f.rule == "nvidia/xid-repeated"] == [reason]


@ENGINES
def test_corrected_sxids_are_counted_per_switch_and_code(engine_cls):
    engine = engine_cls(rule_set=RULE_SET)

    def line(switch: int, code: int, link: int) -> str:
        return printf(SXID_PREFIX, f"nvswitch{switch}", 0, 5 + switch, 0, 0, code) + printf(
            "Correctable, Link %02d %s%s", link, "RX Short Error Rate", ""
        )

    quiet = [line(0, 20009, link) for link in range(9)] + [line(1, 20009, 0), line(0, 20010, 0)]
    assert engine.feed(quiet, times=0.0) == []
    assert engine.feed([line(0, 20009, 9)], times=100.0)[0].reason == "NVSwitchSXid20009Repeated"
    assert engine.feed([line(1, 20009, 1)], times=90000.0) == []  # a day later the window starts again
