"""The GSP rules (plugins/nvidia/gsp-monitor.yaml) against lines rendered from the driver's format strings.

Each row is a print site of NVIDIA/open-gpu-kernel-modules src/nvidia/src/kernel/gpu/gsp/ (the rule's
provenance names it) with values that reach the edges of its conversions, rendered with every
NV_PRINTF prefix generation. All built-in packs are loaded: a failure line gives exactly its rule's
finding (no NVRM family finding beside it), and the same files' informational prints, state dumps
and report context give none.
"""

from __future__ import annotations

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers.kprintf import kprintf

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

RULE_SET = load_rule_set([builtin_plugins_dir()])
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])

# NV_PRINTF's prefix: "NVRM: GPU<n> <function>: " (recent), "NVRM: <function>: ", and the
# "NVRM <function>: " of the 515-525 releases.
PREFIXES = ["NVRM: GPU{gpu} {function}: ", "NVRM: {function}: ", "NVRM {function}: "]
GPUS = [0, 7, 63]

# (function, format string, argument tuples, rule, reason)
FAILURES: list[tuple[str, str, list[tuple], str, str]] = [
    (
        "_kgspRpcGspEventPmuHalted",
        "Received signal from GSP that PMU has halted.\n",
        [()],
        "nvidia/gsp-pmu-halted",
        "GpuGspPmuHalted",
    ),
    (
        "_kgspRpcGspTriggerBugcheck",
        "Received signal from GSP to trigger bugcheck! BugCode=0x%x\n",
        [(0,), (0x7F,), (0xFFFFFFFF,)],
        "nvidia/gsp-bugcheck",
        "GpuGspBugcheck",
    ),
    ("kgspInitRm_IMPL", "need firmware to initialize GSP\n", [()], "nvidia/gsp-failure", "GpuGspError"),
    (
        "_kgspFwContainerVerifyVersion",
        "%s version unknown or malformed, expected version %s\n",
        [("GSP firmware image", "595.45.04"), ("GSP firmware log", ""), ("", "515.43.04")],
        "nvidia/gsp-failure",
        "GpuGspError",
    ),
    (
        "_kgspProcessRpcEvent",
        "Attempted to process RPC event from GPU%d: 0x%x (%s) during bootup without API lock\n",
        [(0, 0x101A, "PFM_REQ_HNDLR_STATE_SYNC_CALLBACK"), (-1, 0, ""), (2147483647, 0xFFFFFFFF, "UNKNOWN")],
        "nvidia/gsp-failure",
        "GpuGspError",
    ),
    (
        "s_patchBooterUcodeSignature",
        "signature for fuse version %u not present\n",
        [(0,), (4294967295,)],
        "nvidia/gsp-failure",
        "GpuGspError",
    ),
    ("kgspPrepareForBootstrap_TU102", "RISC-V core is not enabled.\n", [()], "nvidia/gsp-failure", "GpuGspError"),
    ("kgspService_TU102", "GPU is detached, bailing!\n", [()], "nvidia/gsp-failure", "GpuGspError"),
    ("kgspExtractVbiosFromRom_TU102", "did not find valid ROM signature\n", [()], "nvidia/gsp-failure", "GpuGspError"),
    (
        "kgspExtractVbiosFromRom_TU102",
        "expansion ROM has exceedingly large size: 0x%x\n",
        [(0,), (0xFFFFFFFF,)],
        "nvidia/gsp-failure",
        "GpuGspError",
    ),
    (
        "s_vbiosPatchInterfaceData",
        "too few interface entires found for FWSEC cmd 0x%x\n",
        [(0,), (0x15,), (0xFFFFFFFF,)],
        "nvidia/gsp-failure",
        "GpuGspError",
    ),
    (
        "s_vbiosPatchInterfaceData",
        "too few interface entires found for FRTS\n",
        [()],
        "nvidia/gsp-failure",
        "GpuGspError",
    ),
    (
        "GspMsgQueueSendCommand",
        "Incorrect message length %u\n",
        [(0,), (4294967295,)],
        "nvidia/gsp-failure",
        "GpuGspError",
    ),
    ("GspMsgQueueReceiveStatus", "Incorrect message length %u\n", [(0,)], "nvidia/gsp-failure", "GpuGspError"),
    ("GspMsgQueueReceiveStatus", "Incorrect length %u\n", [(0,), (4294967295,)], "nvidia/gsp-failure", "GpuGspError"),
    (
        "GspMsgQueueSendCommand",
        "buffer is full (waiting for %d free elements, got %d)\n",
        [(0, 0), (-1, 2147483647)],
        "nvidia/gsp-failure",
        "GpuGspError",
    ),
    ("GspMsgQueueSendCommand", "buffer is full\n", [()], "nvidia/gsp-failure", "GpuGspError"),
    ("GspMsgQueueReceiveStatus", "Incomplete read.\n", [()], "nvidia/gsp-failure", "GpuGspError"),
]

# Prints of the same files that are not failures of their own: informational (LEVEL_INFO/NOTICE/
# WARNING), error-level dumps and notes, and report lines whose finding is another line.
SILENT: list[tuple[str, str, tuple]] = [
    # informational
    (
        "_kgspIsHeartbeatTimedOut",
        "Heartbeat not timed out, currentTimeMs %u heartbeat %u heartbeatWithOffsetMs %u diff %u timeout %u\n",
        (5, 0, 4294967295, 6, 5200),
    ),
    ("_kgspRpcRecvPoll", "GSP crashed, skipping RPC\n", ()),
    ("_kgspRpcRecvPoll", "GPU lost, skipping RPC\n", ()),
    ("_kgspRpcRecvPoll", "GPU in reset, skipping RPC\n", ()),
    (
        "_kgspRpcIncrementTimeoutCountAndRateLimitPrints",
        "Rate limiting GSP RPC error prints (printing 1 of every %d)\n",
        (30,),
    ),
    ("_kgspBootGspRm", "GSP-RM boot attempt #%u of %u\n", (1, 3)),
    ("kgspExecuteBooterUnloadIfNeeded_TU102", "skipping executing Booter Unload as WPR2 is not up\n", ()),
    ("kgspExecuteBooterUnloadIfNeeded_TU102", "skipping executing Booter Unload as WPR is not up\n", ()),
    ("kgspBootstrap_TU102", "GSP ucode loaded and RISCV started.\n", ()),
    ("kgspWaitForRmInitDone_IMPL", "Waiting for GSP fw RM to be ready...\n", ()),
    ("kgspBootstrap_GH100", "Starting to boot GSP via FSP.\n", ()),
    ("GspMsgQueueInit", "Created command queue.\n", ()),
    # error-level dumps and notes
    ("kgspPrintGspBinBuildId_IMPL", "GSP bin buildId: %s\n", ("6332050fe14352839619385982f83700835ef570",)),
    ("kgspDumpMailbox_TU102", "GSP: MAILBOX(%d) = 0x%08X\n", (0, 0xBADF4100)),
    ("s_prepareForFwsec_TU102", "(note: VBIOS version %s)\n", ("94.02.71.40.83",)),
    ("GspMsgQueueReceiveStatus", "Read succeeded with %d retries.\n", (3,)),
    ("kgspServiceFatalHwError_GB100", "NV_PGSP_FALCON_ECC_STATUS_UNCORRECTED_ERR_IMEM PENDING\n", ()),
    ("kgspServiceFatalHwError_GB100", "NV_PGSP_FALCON_IRQSTAT_FATAL_ERROR %s pending (mask: 0x%x)\n", ("MEMERR", 1)),
    # report context: the finding is the report's Xid, its timeout banner or its first line
    ("kgspHealthCheck_TU102", "********************************* GSP Failure **********************************\n", ()),
    ("kgspHealthCheck_TU102", "%d more errors skipped\n", (1,)),
    ("kgspHealthCheck_TU102", "NV_PGSP_FALCON_IRQSTAT_FATAL_ERROR unknown error pending\n", ()),
    ("kgspServiceFatalHwError_GB100", "NV_PGSP_FALCON_IRQSTAT_FATAL_ERROR unknown error pending\n", ()),
    ("_kgspBootGspRm", "(the GPU is likely in a bad state and may need to be reset)\n", ()),
    ("_kgspClassifyGspTimeout", "================ GSP core unresponsive ===============\n", ()),
    ("_kgspClassifyGspTimeout", "=============== GSP-RM unresponsive ==================\n", ()),
    ("_kgspClassifyGspTimeout", "=================== GSP-RM is slow ===================\n", ()),
    ("_kgspLogXid119", "Note: Please also check logs above.\n", ()),
]


def _rendered(function: str, fmt: str, args: tuple) -> list[str]:
    message = kprintf(fmt, *args).strip()
    return [
        p.format(gpu=gpu, function=function) + message for p in PREFIXES for gpu in (GPUS if "{gpu}" in p else [None])
    ]


FAILURE_CASES = [
    pytest.param(line, rule, reason, id=f"{rule}:{i}:{line[:60]}")
    for i, (function, fmt, arg_rows, rule, reason) in enumerate(FAILURES)
    for args in arg_rows
    for line in _rendered(function, fmt, args)
]
SILENT_CASES = [
    pytest.param(line, id=f"{i}:{line[:70]}")
    for i, (function, fmt, args) in enumerate(SILENT)
    for line in _rendered(function, fmt, args)
]


@ENGINES
@pytest.mark.parametrize(("line", "rule", "reason"), FAILURE_CASES)
def test_failure_print_gives_exactly_its_finding(engine_cls, line, rule, reason):
    findings = engine_cls(rule_set=RULE_SET).feed([line], line_numbers=1)
    assert [(f.rule, f.reason) for f in findings] == [(rule, reason)], line


@ENGINES
@pytest.mark.parametrize("line", SILENT_CASES)
def test_informational_dump_and_context_prints_stay_silent(engine_cls, line):
    assert engine_cls(rule_set=RULE_SET).feed([line], line_numbers=1) == [], line


def test_gpu_and_bug_code_are_fields():
    (finding,) = RuleEngine(rule_set=RULE_SET).feed(
        ["NVRM: GPU3 _kgspRpcGspTriggerBugcheck: Received signal from GSP to trigger bugcheck! BugCode=0x1f"],
        line_numbers=1,
    )
    assert (finding.fields["gpu"], finding.fields["bug_code"]) == ("3", "0x1f")


def test_every_rule_of_the_pack_has_rendered_lines():
    rules = {r.name for r in RULE_SET.rules if r.source == "nvidia-gsp"}
    assert rules == {rule for *_, rule, _ in FAILURES} | {"nvidia/gsp-report-context"}


def test_the_conditions_are_the_prints_that_say_the_gpu_is_lost():
    permanent = {r.name for r in RULE_SET.rules if r.source == "nvidia-gsp" and r.type == "permanent"}
    assert permanent == {"nvidia/gsp-pmu-halted", "nvidia/gsp-bugcheck"}
