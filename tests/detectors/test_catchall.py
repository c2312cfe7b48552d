"""The catch-all: error-level kernel records no rule knows become bounded KernelError_* Events (issue 38 §2)."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from agent.app.commands.simulate import simulate_lines
from agent.app.config import load_rule_set
from agent.core.configdoc import read_pack
from agent.core.errors import ConfigError
from agent.core.state import NodeState
from agent.core.types import RuleType, Status
from agent.detectors.catchall import (
    DEFAULT,
    CatchAll,
    CatchAllConfig,
    Leveled,
    compile_catch_all,
    reasons,
    subsystem_of,
)
from agent.detectors.pipeline import Batch, DetectionPipeline
from agent.detectors.prefix import saved_level
from agent.sources.kmsg.decoder import Mode, decode

from helpers.sinks import IDLE_STATS

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
NOISE = PLUGINS / "kernel" / "platform-noise.yaml"
KERNEL_SOURCE = Path("/work/src/linux-source-6.1")


@pytest.fixture(scope="module")
def rule_set():
    return load_rule_set([PLUGINS / "kernel", PLUGINS / "nvidia", PLUGINS / "neuron"])


@pytest.mark.parametrize(
    ("message", "subsystem"),
    [
        ("iommu: Default domain type: Translated", "iommu"),
        ("DMAR: DRHD: unhandled state 2", "iommu"),
        ("AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0000]", "iommu"),
        ("arm-smmu-v3 arm-smmu-v3.0.auto: event 0x10 received:", "iommu"),
        ("nvme nvme0: I/O 12 QID 3 timeout, aborting", "nvme"),
        ("mlx5_core 0000:3b:00.0: mlx5_cmd_check:810: failed", "net"),
        ("ena 0000:00:05.0 eth0: Found a Tx that wasn't completed on time", "net"),
        ("pcieport 0000:00:01.0: AER: Multiple Uncorrected (Fatal) error received", "pci"),
        ("ACPI Error: Method parse/execution failed", "acpi"),
        ("[Firmware Bug]: TSC_DEADLINE disabled due to Errata", "firmware"),
        ("EXT4-fs (nvme0n1p1): error loading journal", "fs"),
        ("XFS (md0): Corruption detected", "fs"),
        ("ata3: COMRESET failed (errno=-16)", "block"),
        ("nvidia-uvm: Loaded the UVM driver", "nvidia"),
        ("BUG: kernel NULL pointer dereference, address: 0000000000000008", "kernel"),
        ("12345 something else", "other"),
        ("", "other"),
    ],
)
def test_subsystem_by_first_word(message, subsystem):
    assert subsystem_of(message) == subsystem


def test_reasons_are_bounded_and_event_reasons():
    names = reasons()
    assert "KernelError_other" in names and "KernelError_iommu" in names
    assert len(names) <= 16
    assert all(re.fullmatch(r"KernelError_[a-z]+", r) for r in names)


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("3,88412,219470994,-;NVRM: Xid", 3),
        ("6,3964,206764307,-;nvidia-nvswitch2: open", 6),
        ("12,1,2,-;a user's record", None),  # facility user: not the kernel's
        ("<3>[  201.65] BUG: oops", 3),
        ("<0>[2315424.098863] Kernel panic", 0),
        ("<14>[ 1.0] user", None),
        ("kern  :err   : 2025-01-21T04:41:44,283302+00:00 x", 3),
        ("kern  :warn  : 2025-01-21T04:41:44,283302+00:00 x", 4),
        ("daemon:err   : 2025-01-21T04:41:44,283302+00:00 x", None),
        ("[  12.3] no level", None),
        ("Jan 14 22:15:17 host kernel: [1.0] syslog keeps none", None),
    ],
)
def test_saved_log_levels(line, level):
    assert saved_level(line) == level


def _leveled(message, *, level=3, at=0.0, line=1):
    return Leveled(message=message, level=level, timestamp=at, line=line)


def test_findings_are_temporary_warnings_never_conditions():
    stage = CatchAll(config=DEFAULT)
    (finding,) = stage.findings([_leveled("DMAR: DRHD: unhandled state 2")])
    assert finding.type is RuleType.TEMPORARY
    assert finding.condition is None
    assert finding.reason == "KernelError_iommu"
    assert finding.severity.value == "warning"
    assert finding.fields == {"subsystem": "iommu", "level": 3, "records": 1}
    state = NodeState(conditions=(), clock=lambda: 0.0)
    events = state.apply(finding)
    assert [(e.type, e.reason, e.condition) for e in events] == [("Warning", "KernelError_iommu", None)]
    assert all(c.status is Status.FALSE or c.type == "AcceleratedHardwareReady" for c in state.snapshot().conditions)
    assert state.snapshot().problem_counts["KernelError_iommu"] == 1


def test_window_bounds_one_event_per_reason_and_max_reasons():
    stage = CatchAll(config=CatchAllConfig(window=600.0, max_reasons=2))
    records = [
        _leveled("iommu: a", at=0.0),
        _leveled("iommu: b", at=1.0),  # same reason, same window: held
        _leveled("nvme nvme0: c", at=2.0),
        _leveled("ena 0000:00:05.0: d", at=3.0),  # a third reason: held
        _leveled("iommu: e", at=700.0),  # a new window: told, standing for itself and b
    ]
    verdicts = stage.judge(records)
    assert [v.outcome for v in verdicts] == ["event", "held", "event", "held", "event"]
    last = verdicts[-1].finding
    assert last is not None and last.fields["records"] == 2 and "1 more such records" in last.message
    assert stage.unmatched == {"iommu": 3, "nvme": 1, "net": 1}
    assert stage.held == {"iommu": 1, "net": 1}
    assert stage.events == 3


def test_levels_above_max_are_not_the_catch_alls():
    stage = CatchAll(config=CatchAllConfig(max_level=2))
    assert stage.judge([_leveled("iommu: err", level=3), _leveled("iommu: warning", level=4)]) == []


def test_off_switch():
    assert CatchAll(config=CatchAllConfig(enabled=False)).judge([_leveled("iommu: x")]) == []


def _kmsg(*lines: str) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


@pytest.mark.parametrize("mode", [Mode.KERNEL_DEVICE, Mode.OTHER_DEVICE, Mode.FILE])
def test_pipeline_stage_after_the_rules(rule_set, mode):
    chunk = _kmsg(
        "3,1,100,-;ACPI BIOS Error (bug): Could not resolve symbol [\\_SB.PC00], AE_NOT_FOUND (20210730/psargs-330)",
        "3,2,200,-;DMAR: DRHD: unhandled state 2",
        "6,3,300,-;iommu: informational",
        "3,4,400,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "11,5,500,-;a user's error",
        "3,6,600,-;nvme nvme0: controller is down; will reset",
    )
    records = decode(chunk, mode=mode, boot_time=1000.0).records
    pipeline = DetectionPipeline(rule_set=rule_set)
    got = [(f.rule, f.reason, f.line) for f in pipeline.process(Batch(records=records))]
    caught = [g for g in got if g[0] == "kernel/catch-all"]
    assert ("kernel/catch-all", "KernelError_iommu", 2) in caught
    assert all(line not in (1, 3, 4, 5) for _, _, line in caught)  # benign, info, a rule's, not the kernel's
    assert any(r == "GpuXid79" for _, r, _ in got)
    assert pipeline.catch_all is not None and pipeline.catch_all.benign == {"acpi-bios-error": 1}


def test_replayed_records_raise_no_catch_all_event(rule_set):
    records = decode(_kmsg("3,2,200,-;DMAR: DRHD: unhandled state 2"), mode=Mode.FILE, boot_time=0.0).records
    pipeline = DetectionPipeline(rule_set=rule_set)
    assert pipeline.process(Batch(records=records, permanent_only=True)) == []


def test_a_rule_held_back_by_where_or_threshold_still_knows_the_line(rule_set):
    """A line some rule's pattern matched is the rules' even when no finding came of it."""
    records = decode(
        _kmsg("3,1,1,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception"), mode=Mode.FILE, boot_time=0.0
    ).records
    findings = DetectionPipeline(rule_set=rule_set).process(Batch(records=records))
    assert all(f.rule != "kernel/catch-all" for f in findings)


def test_simulate_shows_the_verdict_for_leveled_lines(rule_set):
    lines = [
        "<3>[   1.0] DMAR: DRHD: unhandled state 2",  # event
        "[   1.1] DMAR: DRHD: unhandled state 3",  # no level kept: nothing
        "<3>[   2.0] [Firmware Bug]: TSC_DEADLINE disabled due to Errata",  # benign
        "3,9,1,-;Neuron Driver Started with Version:2.26.5.0 at: 2026-Jan-01",  # benign
        "kern  :err   : 2025-01-21T04:41:44,283302+00:00 nvme nvme0: bad",  # event
    ]
    found = list(simulate_lines(rule_set=rule_set, lines=iter(lines)))
    assert [(f["line"], f["rule"], f["reason"], f["type"], f["condition"]) for f in found] == [
        (1, "kernel/catch-all", "KernelError_iommu", "temporary", None),
        (5, "kernel/catch-all", "KernelError_nvme", "temporary", None),
    ]
    json.dumps(found)


def _write(tmp_path, text):
    path = tmp_path / "catch-all.yaml"
    path.write_text(textwrap.dedent(text))
    doc, problems = read_pack(path)
    assert doc is not None and not problems
    return path, doc


@pytest.mark.parametrize(
    ("body", "field", "line"),
    [
        ("catchAll:\n  window: 5\n", "catchAll.window", 2),
        ("catchAll:\n  maxReasons: 0\n", "catchAll.maxReasons", 2),
        ("catchAll:\n  maxLevel: warning\n", "catchAll.maxLevel", 2),
        ("catchAll:\n  enabled: 'no'\n", "catchAll.enabled", 2),
        ("catchAll:\n  colour: red\n", "catchAll.colour", 2),
        ("catchAll:\n  benign:\n    - name: x\n      pattern: 'a(b'\n      why: y\n", "catchAll.benign[0].pattern", 4),
        ("catchAll:\n  benign:\n    - name: x\n      pattern: 'a'\n", "catchAll.benign[0].why", 3),
    ],
)
def test_bad_config_names_file_field_and_line(tmp_path, body, field, line):
    path, doc = _write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        compile_catch_all([(path, doc)])
    (problem,) = err.value.problems
    assert (problem.file, problem.field, problem.line) == (str(path), field, line)


def test_a_later_file_turns_it_off_and_adds_entries(tmp_path):
    builtin = read_pack(NOISE)[0]
    body = "catchAll:\n  enabled: false\n  benign:\n    - {name: mine, pattern: 'x.*', why: ours}\n"
    path, doc = _write(tmp_path, body)
    config = compile_catch_all([(NOISE, builtin), (path, doc)])
    assert config.enabled is False
    assert config.window == 3600.0 and config.max_reasons == 3
    assert [e.name for e in config.benign][-1] == "mine"


def test_validate_config_exits_2_on_a_bad_catch_all_file(tmp_path, capsys):
    from agent.app.cli import main

    path, _ = _write(tmp_path, "catchAll:\n  maxReasons: 99\n")
    assert main(["validate-config", str(path)]) == 2
    err = capsys.readouterr()
    assert "catchAll.maxReasons" in err.out + err.err


# -- the platform-noise list, from its print sites -------------------------------------------------------------

NOISE_EXAMPLES = {
    "acpi-bios-error": "ACPI BIOS Error (bug): Could not resolve symbol [\\_SB.PCI0.SAT0.PRT1._GTF.DSSP], AE_NOT_FOUND "
    "(20210730/psargs-330)",
    "acpi-namespace-error": "ACPI Error: Aborting method \\_SB.PCI0.SAT0.PRT1._GTF due to previous error "
    "(AE_NOT_FOUND) (20210730/psparse-529)",
    "firmware-bug": "AMD-Vi: [Firmware Bug]: : IOAPIC[4] not in IVRS table",
    "firmware-warn": "[Firmware Warn]: MTRR: CPU 0: SYSCFG[MtrrFixDramModEn] not cleared by BIOS, clearing this bit",
    "hex-dump-row": "00000000: 58 41 47 46 00 00 00 01 00 00 00 00 00 00 00 00  XAGF............",
    "neuron-driver-banner": "Neuron Driver Started with Version:2.26.5.0-6670442319042643165ab7986e5184496ea4407c at: "
    "2026-Jan-05 10:11:12.000001",
}


@pytest.mark.parametrize(
    "row",
    [
        # print_hex_dump's three prefix types (lib/hexdump.c), group sizes 1, 2, 4, 8, with and without the bytes
        # as text, a full and a last row, rows of 16 and 32 bytes
        "00000000: 58 41 47 46 00 00 00 01 00 00 00 00 00 00 00 00  XAGF............",  # XFS (xfs_hex_dump)
        "00000070: 00 00 00 00 00 00 00 00                          ........",
        "00000010: 0001 0002 0003 0004 0005 0006 0007 0008  ................",
        "imap: 00000000a1b2c3d4: 00000001 00000002 00000003 00000004  ................",  # jfs, DUMP_PREFIX_ADDRESS
        "ip: (____ptrval____): 0000000000000001 0000000000000002",
        "00000020: " + " ".join(["ab"] * 32) + "  " + "." * 32,
        "de ad be ef 00 01 02 03",  # DUMP_PREFIX_NONE without a prefix
    ],
)
def test_a_hex_dump_row_after_its_header_is_no_event_of_its_own(row):
    config = compile_catch_all([(NOISE, read_pack(NOISE)[0])])
    (verdict,) = CatchAll(config=config).judge([_leveled(row)])
    assert (verdict.outcome, verdict.noise) == ("benign", "hex-dump-row")


def test_every_noise_entry_has_an_example_that_it_silences():
    config = compile_catch_all([(NOISE, read_pack(NOISE)[0])])
    assert {e.name for e in config.benign} == set(NOISE_EXAMPLES)
    for entry in config.benign:
        assert entry.why and entry.provenance, entry.name
        stage = CatchAll(config=config)
        (verdict,) = stage.judge([_leveled(NOISE_EXAMPLES[entry.name])])
        assert (verdict.outcome, verdict.noise) == ("benign", entry.name)


@pytest.mark.parametrize(
    "message",
    [
        "ACPI Error: AE_AML_BUFFER_LIMIT, Field [D128] at bit offset/length 128/1024 exceeds size of target Buffer",
        "DMAR: [INTR-REMAP] Request device [f0:1f.0] fault index 0x0 [fault reason 0x25] Blocked a compatibility",
        "mce: [Hardware Error]: Machine check events logged",
        "mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: be00000000800400",  # ends in a hex group
        "nvme nvme0: controller status 00 00",  # ends in two: not a row without an offset, behind a prefix
        "XFS (dm-0): First 128 bytes of corrupted metadata buffer:",  # a dump's header is a finding
    ],
)
def test_noise_entries_leave_real_faults_alone(message):
    config = compile_catch_all([(NOISE, read_pack(NOISE)[0])])
    (verdict,) = CatchAll(config=config).judge([_leveled(message)])
    assert verdict.outcome == "event"


@pytest.mark.skipif(not KERNEL_SOURCE.is_dir(), reason="the kernel source is not at /work/src/linux-source-6.1")
def test_every_kernel_print_site_named_is_in_the_source():
    config = compile_catch_all([(NOISE, read_pack(NOISE)[0])])
    for entry in config.benign:
        for site in entry.provenance:
            where, _, text = site.partition(": ")
            path, _, line = where.partition(":")
            if "/" not in path or path.startswith("aws-neuron/"):
                continue  # not the kernel's
            source = (KERNEL_SOURCE / path).read_text(errors="replace").splitlines()
            near = "\n".join(source[max(0, int(line) - 3) : int(line) + 2])
            word = re.search(r"[A-Za-z_][A-Za-z_ ]{6,}", text)
            assert word is not None and word.group(0).split()[0] in near, site


def test_never_a_recovery_action(rule_set):
    """Every catch-all finding is an Event only: the built-in recovery policy matches nothing after a storm."""
    from agent.recovery.policy import matching
    from agent.recovery.policyfile import DEFAULT_POLICY

    stage = CatchAll(config=CatchAllConfig(max_reasons=16))
    state = NodeState(conditions=rule_set.conditions, clock=lambda: 0.0, aggregate=True)
    messages = [f"{word} x: failed" for word in ("iommu:", "nvme", "NVRM:", "neuron", "pcieport", "mce:", "BUG:", "zz")]
    for finding in stage.findings(_leveled(m, at=float(i)) for i, m in enumerate(messages)):
        state.apply(finding)
    snapshot = state.snapshot()
    assert all(c.status is not Status.TRUE for c in snapshot.conditions if c.type != "AcceleratedHardwareReady")
    assert matching(snapshot, DEFAULT_POLICY) == ()


def test_metrics_series_exist_at_zero_and_count(rule_set):
    from agent.sinks.metrics import AgentCollector

    pipeline = DetectionPipeline(rule_set=rule_set)
    counts = pipeline.catch_all_counts()
    assert set(counts["unmatched_errors"]) == {r.removeprefix("KernelError_") for r in reasons()}
    assert set(counts["unmatched_errors"].values()) == {0}
    records = decode(_kmsg("3,2,200,-;DMAR: DRHD: unhandled state 2"), mode=Mode.FILE, boot_time=0.0)
    pipeline.process(Batch(records=records.records))
    stats = replace(IDLE_STATS, rules_loaded=1, **pipeline.catch_all_counts())
    collector = AgentCollector(snapshot=NodeState(conditions=(), clock=lambda: 0.0).snapshot, stats=lambda: stats)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for family in collector.collect() for s in family.samples
    }
    assert samples[("node_health_agent_kernel_unmatched_errors_total", (("subsystem", "iommu"),))] == 1
    assert samples[("node_health_agent_kernel_unmatched_errors_total", (("subsystem", "nvme"),))] == 0
    assert samples[("node_health_agent_kernel_platform_noise_total", (("entry", "acpi-bios-error"),))] == 0


@pytest.mark.parametrize("mode", [Mode.KERNEL_DEVICE, Mode.OTHER_DEVICE, Mode.FILE])
@pytest.mark.parametrize("escaped", [False, True])
@pytest.mark.parametrize("level", [0, 2, 3])
def test_severe_scan_equals_the_records_levels(mode, escaped, level):
    tail = "\\x1b" if escaped else ""
    chunk = _kmsg(
        "0,1,1,-;panic",
        "3,2,2,-;err" + tail,
        "4,3,3,-;warning",
        "11,4,4,-;user err",
        "2,5,5,-;crit",
        "30,6,6,-;daemon info",
        "1,7,7,c;alert",
    )
    columns = decode(chunk, mode=mode, boot_time=0.0).records
    expected = [i for i, r in enumerate(columns) if r.facility == 0 and r.priority is not None and r.priority <= level]
    assert columns.severe(level) == expected
