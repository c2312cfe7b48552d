"""The Neuron pack (plugins/neuron/neuron-monitor.yaml), tested from the documented line formats.

The kernel line is the one the Neuron runtime troubleshooting guide documents (the rule's
``provenance``; facts in ../shared/reference/neuron-and-aks-systems.md, sections 1.2-1.4):

    NEURON_HW_ERR=<TYPE> instance-id=<i-hex> hostname=<host> nd-id=<int> nc-id=<int> serial-num=<hex> action=<ACTION>

It is rendered here for every error type the upstream rules know, types they do not know yet, the
device and core numbers of every instance size (and beyond), with optional key=value fields left
out, at the start of the message (as documented), after a prefix, and with the token last. The
runtime (libnrt) rules are rendered from the guides' example lines with their numbers varied and
the runtime's log prefix (date, pid:tid, level, module:function padded with spaces) present, absent
and padded differently. Every line must give exactly the expected findings (rule, reason, fields)
in both engines; lines the driver and runtime print when nothing is wrong stay silent; and every
line the upstream node-problem-detector rules match gets the reason upstream gives it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from agent.app.config import load_rule_set
from agent.core.bounds import bounded_reason
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers.kprintf import kprintf

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

RULE_SET = load_rule_set([builtin_plugins_dir()])
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
NEURON = {r.name for r in RULE_SET.rules if r.name.startswith("neuron/")}

KNOWN = [
    "SRAM_UNCORRECTABLE_ERROR",
    "NC_UNCORRECTABLE_ERROR",
    "HBM_UNCORRECTABLE_ERROR",
    "DMA_ERROR",
    "HANG_ON_COLLECTIVES",
]
FUTURE = ["HBM_REPAIRABLE_UNCORRECTABLE_ERROR", "NC_PARITY_ERROR_V2", "TOP_SP_ERROR", "X"]
HW_ERR = "NEURON_HW_ERR=%s instance-id=%s hostname=%s nd-id=%d nc-id=%d serial-num=%s action=%s"
# (nd-id, nc-id): inf1/inf2/trn1 (up to 16 devices, 4 cores), trn2 (16 devices, 8 physical cores), beyond
IDS = [(0, 0), (5, 2), (15, 7), (63, 127), (-1, -1)]
PREFIXES = ["", "kernel: ", "neuron: ", "[12345.678901] ", "ip-10-0-0-1 kernel: [ 8812.345901] "]


def render(fmt: str, *args: Any) -> str:
    return kprintf(fmt, *args).strip()


Finding = tuple[str, str, dict[str, Any]]
CASES: list[tuple[str, str, list[Finding]]] = []


def add(table: str, line: str, *expected: Finding) -> None:
    CASES.append((table, line, list(expected)))


def hw(error: str, **fields: Any) -> Finding:
    return ("neuron/hw-error", f"NeuronHasError_{error}", {"error": error, **fields})


# --- the kernel line, every type, every position ---
for error in KNOWN + FUTURE:
    for nd, nc in IDS:
        line = render(
            HW_ERR, error, "i-0592464924bd45322", "ip-172-31-61-252", nd, nc, "19fcda00f5ff6eb9", "TERMINATE_INSTANCE"
        )
        fields = {
            "nd_id": nd,
            "nc_id": nc,
            "serial_num": "19fcda00f5ff6eb9",
            "action": "TERMINATE_INSTANCE",
            "instance_id": "i-0592464924bd45322",
        }
        for prefix in PREFIXES:
            add("hw-error", prefix + line, hw(error, **fields))
    # optional key=values missing, other actions, token last
    add("hw-error", render("NEURON_HW_ERR=%s nd-id=%d", error, 3), hw(error, nd_id=3))
    add("hw-error", render("NEURON_HW_ERR=%s nc-id=%d", error, 1), hw(error, nc_id=1))
    add(
        "hw-error",
        render("NEURON_HW_ERR=%s nd-id=%d nc-id=%d serial-num=%s", error, 0, 0, "0"),
        hw(error, nd_id=0, nc_id=0, serial_num="0"),
    )
    for action in ("TERMINATE_INSTANCE", "RESET_DEVICE", "NONE", ""):
        add(
            "hw-error",
            render("NEURON_HW_ERR=%s nd-id=%d action=%s", error, 2, action),
            hw(error, nd_id=2, **({"action": action} if action else {})),
        )
    add("hw-error", render("NEURON_HW_ERR=%s", error), hw(error))
    add("hw-error", render("kernel: %s NEURON_HW_ERR=%s", "affecting neuron devices", error), hw(error))
    add("hw-error", render("kernel: NEURON_HW_ERR=%s affecting neuron devices", error), hw(error))  # NMA's test line
add("hw-error", "NEURON_HW_ERR=DMA_ERROR, nd-id=4", hw("DMA_ERROR", nd_id=4))
add("hw-error", "NEURON_HW_ERR=DMA_ERROR nd-id=x nc-id=", hw("DMA_ERROR"))  # unreadable numbers: fields left out
# no upper-case type after the token: not an error report (the pack's decision; see its comment)
add("hw-error", "NEURON_HW_ERR= nd-id=1")
add("hw-error", "kernel: NEURON_HW_ERR=")
add("hw-error", "NEURON_HW_ERR=none since boot")


# --- the runtime's lines (libnrt) ---
def nrt(level: str, module: str, function: str, message: str, *, pad: int = 1) -> list[str]:
    """The message bare and behind the runtime's log prefix, padded as the guides show it. The guides
    show the prefix of the TDRV/NRT lines; for the FATAL-RT and DMA-abort lines the module:function
    given here is illustrative (the guide shows those messages without a prefix)."""
    head = f"2022-Aug-31 04:59:21.0546 117717:117718 {level}{' ' * pad}{module}:{function}"
    return [message, f"{head} {message}", f"{head.ljust(90)} {message}"]


for nd, nc in IDS[:4]:
    for metadata in (0, 0x16, 2**32 - 1):
        msg = render(
            "(FATAL-RT-UNDEFINED-STATE) [ND %d][NC %d] Uncorrectable memory error is detected, metadata: 0x%x."
            " Please terminate or stop/start this instance to prevent future impact from the hardware error.",
            nd,
            nc,
            metadata,
        )
        for line in nrt("ERROR", "NRT", "nrt_execute", msg):
            add(
                "runtime",
                line,
                (
                    "neuron/runtime-uncorrectable-memory",
                    "NeuronRuntimeUncorrectableMemoryError",
                    {"nd_id": nd, "nc_id": nc},
                ),
            )
    for direction in ("TX", "RX"):
        for engine in (0, 15, 31):
            for line in nrt(
                "ERROR",
                "TDRV",
                "dma_check_abort",
                render("[MLA %d][NC %d] DMA %s engine %d is in an abort state", nd, nc, direction, engine),
            ):
                add(
                    "runtime",
                    line,
                    ("neuron/runtime-dma-abort", "NeuronRuntimeDMAAbort", {"nd_id": nd, "nc_id": nc, "engine": engine}),
                )
    for model, op, total in [(0, 0, 100), (7, 99, 100), (2147483647, 12, 40)]:
        msg = render(
            "(FATAL-RT-UNDEFINED-STATE) missing collectives status on Neuron Device %d NC %d, model %d"
            " - suspected hang in collectives operation %d out of %d",
            nd,
            nc,
            model,
            op,
            total,
        )
        for line in nrt("ERROR", "NRT", "nrt_execute", msg):
            add(
                "runtime",
                line,
                ("neuron/runtime-collectives-hang", "NeuronRuntimeCollectivesHang", {"nd_id": nd, "nc_id": nc}),
            )
    for ms, model in [(0, "xxx.neff"), (30000, "llama 3 (70b).neff"), (2147483647, "")]:
        msg = render(
            "(FATAL-RT-UNDEFINED-STATE) execution timeout (%d ms) on Neuron Device %d NC %d, model %s,"
            " waiting for execution completion notification",
            ms,
            nd,
            nc,
            model,
        )
        for line in nrt("ERROR", "NRT", "nrt_execute", msg):
            add(
                "runtime",
                line,
                ("neuron/runtime-execution-timeout", "NeuronRuntimeExecutionTimeout", {"nd_id": nd, "nc_id": nc}),
            )
    for pad in (1, 2, 3):
        for ms in (1000, 0):
            for line in nrt(
                "ERROR",
                "TDRV",
                "tsync_wait_eng_stop",
                render("nd%d nc%d Timestamp program stop timeout (%d ms)", nd, nc, ms),
                pad=pad,
            )[1:]:
                add(
                    "runtime",
                    line,
                    ("neuron/runtime-engine-stop-timeout", "NeuronRuntimeDeviceNeedsReset", {"nd_id": nd, "nc_id": nc}),
                )
        for err in (1, 0, -1):
            for line in nrt(
                "ERROR",
                "TDRV",
                "tdrv_init_one_mla_phase2",
                render("nd%d nc%d HAL init failed. error:%d", nd, nc, err),
                pad=pad,
            )[1:]:
                add(
                    "runtime",
                    line,
                    ("neuron/runtime-hal-init-failed", "NeuronRuntimeInitFailed", {"nd_id": nd, "nc_id": nc}),
                )
for pad in (1, 2, 3):
    for err in (5, 0, -1, 2147483647):
        for line in nrt("ERROR", "NRT", "nrt_init", render("Failed to initialize devices, error:%d", err), pad=pad)[1:]:
            add("runtime", line, ("neuron/runtime-init-failed", "NeuronRuntimeInitFailed", {"nrt_error": err}))
    for function in ("tpb_eng_init_hals_v2", "tpb_eng_init_hals"):
        msg = "CRITICAL HW ERROR: One or more engines are running. Please restart device by reloading driver:"
        for line in nrt("ERROR", "TDRV", function, msg, pad=pad):
            add("runtime", line, ("neuron/runtime-engines-running", "NeuronRuntimeDeviceNeedsReset", {}))

# The driver's failed resets (neuron_reset.c, pr_info without pr_fmt), for each device index and request id.
for nd in (0, 15, 2147483647):
    for request in (1, 0, 4294967295):
        for fmt in (
            "nd%d: reset request %u failed\n",
            "nd%d: reset request %u was initiated, but failed to complete\n",
        ):
            add(
                "driver",
                render(fmt, nd, request).strip(),
                ("neuron/driver-reset-failed", "NeuronDeviceResetFailed", {"nd_id": nd, "request": request}),
            )
    for fmt in ("nd%d: failed to initialize dma after reset\n", "nd%d: failed to complete post reset configuration\n"):
        add("driver", render(fmt, nd).strip(), ("neuron/driver-reset-failed", "NeuronDeviceResetFailed", {"nd_id": nd}))

# Lines the driver and the runtime print when nothing is wrong (the same guides): no built-in rule fires.
SILENT = [
    render("Neuron Driver Started with Version:%s-%s", "2.26.5.0", "6670442319042643165ab7986e5184496ea4407c"),
    "Neuron Driver Started with Version:2.9.4.0-8a6fdf292607dccc3b7059ebbe2fb24c60dfc7c4",
    render("neuron:npid_detach: neuron:npid_detach: pid=%d, slot=%d", 90193, 0),
    # device memory exhausted while loading a model: the workload's problem, not the node's
    render(
        "neuron:mc_alloc: device mempool [%d:%d] total %llu occupied %llu needed %llu available %llu",
        0,
        0,
        1073741568,
        960539030,
        1272,
        768,
    ),
    # a copy retried during a NeuronCore reset (driver 2.7 notes: informational)
    "neuron:ndma_memcpy_wait_for_completion: DMA completion timeout for UDMA_ENG_33 q0",
    *nrt("ERROR", "NRT", "nrt_allocate_neuron_cores", "NeuronCore(s) not available - Requested:nc1-nc1 Available:0")[
        1:
    ],
    # a race with EFA on process exit the guide calls harmless: one line stays below the EFA threshold
    "efa 0000:a0:1a.0 rdmap160s26: Failed to process command DEREG_MR (opcode 8) comp_status 7 err -22",
    # the token's name without '=', and other words around it (synthetic look-alikes)
    "NEURON_HW_ERR_COUNT 0",
    "neuron: no NEURON_HW_ERR reported",
    "[MLA 0][NC 0] DMA TX engine 0 is idle",
    "(FATAL-RT-UNDEFINED-STATE) execution completed on Neuron Device 0 NC 0",
    # a reset that worked (neuron_reset.c)
    "nd0: initiating device reset request 7",
    "nd0: Coalesced 4 reset requests",
    "nd0: reset request 7 completed",
]

# The upstream node-problem-detector rules (Neuron problem detector ConfigMap; the ECS sample without
# the spaces and with HANG_ON_COLLECTIVES), matched the NPD way (pattern + \z, searched).
UPSTREAM = [(f"NeuronHasError_{e}", f".* NEURON_HW_ERR={e} .*") for e in KNOWN[:4]] + [
    (f"NeuronHasError_{e}", f".*NEURON_HW_ERR={e}.*") for e in KNOWN
]


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for table, _line, _expected in CASES:
        seen[table] = seen.get(table, 0) + 1
        out.append(f"{table}-{seen[table]}")
    return out


@ENGINES
@pytest.mark.parametrize(("table", "line", "expected"), CASES, ids=_ids())
def test_rendered_line_gives_exactly_the_expected_findings(engine_cls, table, line, expected):
    findings = [f for f in engine_cls(rule_set=RULE_SET).feed([line]) if f.rule in NEURON]
    assert [(f.rule, f.reason) for f in findings] == [(rule, reason) for rule, reason, _ in expected], line
    for finding, (_rule, _reason, fields) in zip(findings, expected, strict=True):
        for name, value in fields.items():
            assert finding.fields.get(name) == value, (line, name, dict(finding.fields))
        if finding.rule == "neuron/hw-error":
            # a field the line does not carry (or carries unreadably) is absent, never invented
            assert set(finding.fields) <= {"error", "nd_id", "nc_id", "serial_num", "action", "instance_id"}
            assert {k for k in finding.fields if k != "error"} == {k for k in fields if k != "error"}, line


@ENGINES
@pytest.mark.parametrize("line", SILENT, ids=[f"silent-{i}" for i in range(len(SILENT))])
def test_benign_neuron_lines_stay_silent(engine_cls, line):
    assert [(f.rule, f.reason) for f in engine_cls(rule_set=RULE_SET).feed([line])] == [], line


def test_every_upstream_match_gets_the_upstream_reason():
    hw_lines = [line for table, line, _e in CASES if table == "hw-error"]
    checked = 0
    for line in hw_lines:
        ours = {f.reason for f in RuleEngine(rule_set=RULE_SET).feed([line]) if f.rule == "neuron/hw-error"}
        for reason, pattern in UPSTREAM:
            if re.search(f"(?:{pattern})\\Z", line):
                assert ours == {reason}, (line, reason, ours)
                checked += 1
    assert checked > 100
    # the documented line itself, which the upstream ConfigMap's rules miss (no space before the token)
    documented = render(
        HW_ERR,
        "SRAM_UNCORRECTABLE_ERROR",
        "i-0592464924bd45322",
        "ip-172-31-61-252",
        0,
        0,
        "19fcda00f5ff6eb9",
        "TERMINATE_INSTANCE",
    )
    assert not any(re.search(f"(?:{p})\\Z", documented) for _r, p in UPSTREAM[:4])
    assert [f.reason for f in RuleEngine(rule_set=RULE_SET).feed([documented])] == [
        "NeuronHasError_SRAM_UNCORRECTABLE_ERROR"
    ]


def test_every_listed_error_type_is_rendered():
    pack = yaml.safe_load((builtin_plugins_dir() / "neuron" / "neuron-monitor.yaml").read_text())
    listed = set(pack["lists"]["neuron.hw_errors"])
    assert listed == set(KNOWN)


def test_every_neuron_rule_has_generated_lines_and_names_its_source():
    covered = {rule for _t, _l, expected in CASES for rule, _r, _f in expected}
    assert covered == NEURON
    for rule in RULE_SET.rules:
        if rule.name in NEURON:
            assert rule.provenance and all(p.startswith("aws-neuron/") for p in rule.provenance), rule.name
            assert rule.literals, f"{rule.name} has no required literal for the prefilter"
            assert not rule.multiline, f"{rule.name} can match across lines"


@ENGINES
@pytest.mark.parametrize("length", [104, 113, 241, 300, 4000], ids=lambda n: f"type-{n}")
def test_a_type_of_any_length_still_fires_with_a_reason_of_at_most_128_characters(engine_cls, length):
    """The reason is the Kubernetes Event limit at most; a longer one ends in a digest of the whole (the same
    type always gives the same reason, two long types two reasons); the full type stays in the fields."""
    error = "E" * length
    line = render(HW_ERR, error, "i-0592464924bd45322", "ip-172-31-61-252", 0, 0, "19fcda00f5ff6eb9", "NONE")
    (finding,) = engine_cls(rule_set=RULE_SET).feed([line])
    full = f"NeuronHasError_{error}"
    assert finding.rule == "neuron/hw-error" and finding.fields["error"] == error
    assert finding.reason == bounded_reason(full)
    assert len(finding.reason) == min(len(full), 128)
    assert finding.reason.startswith("NeuronHasError_EEEE")
    (other,) = engine_cls(rule_set=RULE_SET).feed([line.replace(error, error + "F")])
    assert other.reason != finding.reason
