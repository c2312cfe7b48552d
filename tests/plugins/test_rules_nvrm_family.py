"""The NVRM family rules (plugins/nvidia/nvrm-family.yaml) against the driver's own print sites.

The pack is generated from plugins/nvidia/nvrm-print-sites.tsv (NV_PRINTF / NV_DEV_PRINTF / nv_printf
sites of NVIDIA/open-gpu-kernel-modules with their levels) by plugins/nvidia/generate_rules.py. Every
error-level site that uses the failure vocabulary, rendered as the driver prints it (each prefix
generation), gives exactly one finding; every informational site, rendered the same way, gives none
(except the few the generated file lists as having no phrase of their own).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers.kprintf import kprintf

pytestmark = pytest.mark.slow  # the exhaustive rule table: thousands of cases

NVIDIA = builtin_plugins_dir() / "nvidia"
EXTRACT = NVIDIA / "nvrm-print-sites.tsv"
GENERATED = NVIDIA / "nvrm-family.yaml"
RULE_SET = load_rule_set([builtin_plugins_dir()])
ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])


def _generator():
    spec = importlib.util.spec_from_file_location("nvrm_generate_rules", NVIDIA / "generate_rules.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


GEN = _generator()
RELEASE, SITES, TOTALS = GEN.read_extract(EXTRACT.read_text())
WORDS = {w for w, _, _ in GEN.vocabulary(SITES)}
_, UNCOVERED = GEN.informational_phrases(SITES, WORDS)

# Prefixes of each driver generation: NV_PRINTF with GPU and function (recent), with the function
# only, the 515-525 form without a colon; NV_DEV_PRINTF with the device.
NV_PRINTF_PREFIXES = ["NVRM: GPU0 rmFunction_IMPL: ", "NVRM: rmFunction_IMPL: ", "NVRM rmFunction_IMPL: "]
NV_DEV_PREFIX = "NVRM: GPU 0000:3b:00.0: "
_CONV = re.compile(
    r"%(?P<flags>[-#0 +]*)(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?(?P<len>hh|h|ll|l|L|z|j|t)?"
    r"(?:(?P<ptr>p[A-Za-z]*)|(?P<conv>[%cdiouxXs]))"
)


def _values(fmt: str) -> list:
    values: list = []
    for m in _CONV.finditer(fmt):
        values += [8] * (m["width"] == "*") + [3] * (m["prec"] == "*")
        conv = m["conv"]
        if m["ptr"]:
            values.append(0xFFFF8881DEAD0000)
        elif conv == "s":
            values.append("GR0")
        elif conv == "c":
            values.append("c")
        elif conv in ("d", "i"):
            values.append(-1)
        elif conv != "%":
            values.append(0x1F)
    return values


def render(site) -> list[str]:
    """The lines a site prints, one per prefix generation; none for a multi-line message."""
    text = re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), site.text)
    if "\n" in text.rstrip("\n") or "%n" in text:
        return []
    message = kprintf(text, *_values(text)).strip()
    if site.level.startswith("NV_DBG_"):
        return [message] if message.startswith("NVRM") else [NV_DEV_PREFIX + message]
    return [prefix + message for prefix in NV_PRINTF_PREFIXES]


def _findings_per_line(engine_cls, lines: list[str]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    for finding in engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1):
        found[finding.line].append(finding.rule)
    return found


def test_the_committed_pack_is_what_the_generator_makes_of_the_committed_extract():
    assert GENERATED.read_text() == GEN.generate(EXTRACT.read_text()), (
        "regenerate: python plugins/nvidia/generate_rules.py generate plugins/nvidia/nvrm-print-sites.tsv "
        "> plugins/nvidia/nvrm-family.yaml"
    )


def test_the_extract_names_its_release_and_totals():
    assert re.fullmatch(r"\d+\.\d+(?:\.\d+)?", RELEASE)
    assert TOTALS["LEVEL_ERROR"] > 1000 and all(s.where.count(":") == 1 for s in SITES)


@pytest.mark.parametrize("word", ["failed", "error", "timeout", "timed", "invalid", "unable", "cannot", "mismatch"])
def test_the_vocabulary_holds_the_drivers_common_failure_words(word):
    assert word in WORDS


def test_general_words_are_not_failure_vocabulary():
    assert not WORDS & {"not", "no", "disabled", "unknown", "successful", "loading"}


def _error_lines() -> list[tuple[str, str]]:
    return [
        (site.where, line)
        for site in SITES
        if site.level in GEN.ERROR_LEVELS and GEN._words(site.text) & WORDS
        for line in render(site)
    ]


# Error-level prints that gsp-monitor.yaml reads as context of a GSP report whose finding is another
# line (nvidia/gsp-report-context): the WPR2 line's continuation and a fatal-error detail line
# followed by its Xid. They give no finding of their own.
REPORT_CONTEXT = {
    "src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c:4681",
    "src/nvidia/src/kernel/gpu/gsp/arch/blackwell/kernel_gsp_gb100.c:181",
}
# Error-level prints of code that carries on after them (generate_rules.TOLERATED_TEXT, TOLERATED_SITES): silent.
TOLERATED = {site.where for site in SITES if GEN.tolerated(site)}


@ENGINES
def test_every_error_print_using_the_vocabulary_gives_one_finding(engine_cls):
    lines = _error_lines()
    assert len(lines) > 3000
    found = _findings_per_line(engine_cls, [line for _, line in lines])
    wrong = [
        (where, line, found.get(i + 1, []))
        for i, (where, line) in enumerate(lines)
        if len(found[i + 1]) != (0 if where in REPORT_CONTEXT | TOLERATED else 1)
    ]
    assert len(TOLERATED) >= len(GEN.TOLERATED_SITES)  # every listed phrase names a site of the extract
    assert not wrong, f"{len(wrong)} of {len(lines)} lines: {wrong[:5]}"


@ENGINES
def test_a_family_line_no_specific_rule_knows_is_a_warning_event(engine_cls):
    line = "NVRM: GPU3 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP"
    (finding,) = engine_cls(rule_set=RULE_SET).feed([line])
    assert (finding.rule, finding.reason, finding.type.value, finding.severity.value) == (
        "nvidia/nvrm-failure",
        "NvidiaDriverError",
        "temporary",
        "warning",
    )
    assert (finding.fields["head"], finding.fields["failure"]) == ("GPU3", "unexpected")


@ENGINES
@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",  # the Xid rules' line
        "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x62:0x40:2168)",  # a specific rule's line
        "NVRM: Xid (GPU0): 13, Graphics Exception: failed",  # the Xid fallback's line
    ],
)
def test_lines_other_rules_speak_for_get_only_their_finding(engine_cls, line):
    findings = engine_cls(rule_set=RULE_SET).feed([line])
    assert len(findings) == 1 and findings[0].rule != "nvidia/nvrm-failure"


@ENGINES
def test_informational_prints_stay_silent(engine_cls):
    uncovered = {s.where for s in UNCOVERED}
    lines = [
        (site.where, line)
        for site in SITES
        if site.level in GEN.INFO_LEVELS and site.where not in uncovered
        for line in render(site)
    ]
    assert len(lines) > 500
    found = _findings_per_line(engine_cls, [line for _, line in lines])
    loud = [(where, line, found[i + 1]) for i, (where, line) in enumerate(lines) if found.get(i + 1)]
    assert not loud, f"{len(loud)} of {len(lines)} lines: {loud[:5]}"


@ENGINES
@pytest.mark.parametrize(
    "line",
    [
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.45.04  Release Build  (dvs-builder@U16)",
        "NVRM: GPU at PCI:0000:01:00: GPU-02187fd8-22a1-3f71-cd52-22af54f42481",
        "NVRM: GPU Board Serial Number: 1650123456789",
        "NVRM kgspExecuteBooterUnloadIfNeeded_TU102: skipping executing Booter Unload as WPR is not up",
        "NVRM: kgspCheckGspRmCcCleanup_GH100: CC secret cleanup successful!",
        "NVRM: Persistence mode is deprecated and will be removed in a future release. Please use"
        " nvidia-persistenced instead.",
        # error-level prints of code that carries on: a VF capability read on a GPU without SR-IOV in use, a
        # chipset workaround's setup, the GSP log firmware the driver calls non-fatal itself
        "NVRM: GPU1 kbifCacheVFInfo_GB100: Unable to read NV_PF0_INITIAL_AND_TOTAL_VFS",
        "NVRM objClInitPcieChipset: *** Chipset Setup Function Error!",
        "NVRM: RmFetchGspRmImages: Failed to load gsp_log_*.bin, no GSP-RM logs will be printed (non-fatal)",
        "NVRM: GPU0 nv_init_msi: Failed to enable MSI; falling back to PCIe virtual-wire interrupts.",
    ],
)
def test_the_drivers_normal_lines_stay_silent(engine_cls, line):
    assert engine_cls(rule_set=RULE_SET).feed([line]) == []


def test_informational_sites_without_a_phrase_are_listed_in_the_pack():
    text = GENERATED.read_text()
    assert all(f"{s.level} {s.where}" in text for s in UNCOVERED)
    assert len(UNCOVERED) < 0.02 * sum(TOTALS[level] for level in GEN.INFO_LEVELS)


def test_extract_reads_print_sites_with_levels_from_c_source(tmp_path: Path):
    (tmp_path / "a.c").write_text(
        "#define NV_PRINTF(level, fmt, ...) x\n"
        'void f(void) {\n    NV_PRINTF(LEVEL_ERROR, "failed to map 0x%" NvU64_fmtx " (%s)\\n",\n'
        "              addr, name);  // a comment, (with parens\n"
        '    NV_PRINTF_COND(c, LEVEL_INFO, LEVEL_ERROR, "timeout %d\\n", t);\n'
        '    nv_printf(NV_DBG_INFO, "NVRM: loading, %s\\n", f(a, "x,y"));\n}\n'
    )
    sites, totals = GEN.extract(tmp_path)
    assert [(s.level, s.where, s.text) for s in sites] == [
        ("LEVEL_ERROR", "a.c:3", "failed to map 0x%llx (%s)\\n"),
        ("LEVEL_ERROR", "a.c:5", "timeout %d\\n"),
        ("NV_DBG_INFO", "a.c:6", "NVRM: loading, %s\\n"),
    ]
    assert totals == {"LEVEL_ERROR": 2, "NV_DBG_INFO": 1}
    text = GEN.write_extract(sites, totals, release="1.2.3")
    assert GEN.read_extract(text) == ("1.2.3", sites[:2], totals)  # the loading line holds no lexicon word


# A CrashCat report (GSP/SEC2/... firmware crash): kernel_crashcat_engine.c kcrashcatEngineVprintf logs the
# report's first line with nvErrorLog as an Xid of the engine's errorId ("%s %s": engine name, source
# line), the rest with portDbgPrintString behind CRASHCAT_LOG_PREFIX "NVRM: " and one or two
# CRASHCAT_LOG_INDENT "    " (g_crashcat_report_nvoc.h; formats of crashcat_report_v1.c and the
# libos3 reporter/source): the report is one event, its Xid.
CRASHCAT_PACKET = "NVRM: " + "    "
CRASHCAT_DATA = "NVRM: " + "    " * 2
U64 = 2**64 - 1


def _crashcat_report(source: str) -> list[str]:
    return [
        kprintf(
            "NVRM: Xid (PCI:%s): %d, pid=%s, name=%s, %s %s",
            "0000:c1:00",
            120,
            "'<unknown>'",
            "<unknown>",
            "GSP",
            source,
        ),
        CRASHCAT_PACKET
        + kprintf("Reported by libos partition:%u#%u kernel v%u.%u [%u] @ ts:%u", 1, 3, 3, 1, 0, 4294967295),
        CRASHCAT_PACKET + "RISC-V CSR State:",
        CRASHCAT_DATA
        + kprintf(
            "sstatus:0x%016llx  sscratch:0x%016llx     sie:0x%016llx  sip:0x%016llx", 0x8000000200006000, 0, U64, 0x20
        ),
        CRASHCAT_DATA + kprintf("sepc:0x%016llx     stval:0x%016llx  scause:0x%016llx", 0x7F3A1C, 0xDEADBEEF, 0xD),
        CRASHCAT_PACKET + "RISC-V GPR State:",
        CRASHCAT_DATA + kprintf("ra:0x%016llx   sp:0x%016llx   gp:0x%016llx   tp:0x%016llx", 1, 2, 3, 4),
        CRASHCAT_PACKET + "Stack Trace:",
        CRASHCAT_DATA + kprintf("0x%016llx", 0x7F3A1C),
        CRASHCAT_PACKET + "PC Trace:",
        CRASHCAT_DATA + kprintf("0x%016llx  0x%016llx  0x%016llx", 1, 2, U64),
        CRASHCAT_PACKET + "Local I/O Register State:",
        CRASHCAT_DATA + kprintf("0x%08x:0x%08x   0x%08x:0x%08x", 0x110040, 0, 0xFFFFFFFF, 0x1),
    ]


@ENGINES
@pytest.mark.parametrize(
    "source",
    [
        kprintf("%s timeout @ pc:0x%llx, partition:%u#%u, task:%u", "task", 0x7F3A1C, 1, 3, 4),
        kprintf(
            "%s panic: %s (%u) @ pc:0x%llx, aux:0x%llx, partition:%u#%u",
            "kernel",
            "fatal hardware error",
            3,
            0,
            U64,
            0,
            0,
        ),
        kprintf("%s in partition:%u ucode:%u [%c-mode] @ pc:0x%llx, data:0x%llx", "exception", 0, 0, "S", 0x1000, 0xD),
    ],
    ids=["libos3-timeout", "libos3-panic", "generic-exception"],
)
def test_a_crashcat_report_is_one_event_its_xid(engine_cls, source):
    lines = _crashcat_report(source)
    findings = engine_cls(rule_set=RULE_SET).feed(lines, line_numbers=1)
    assert [f.line for f in findings] == [1], [(f.line, f.rule) for f in findings]
    assert findings[0].rule.startswith("nvidia/xid"), findings[0].rule
