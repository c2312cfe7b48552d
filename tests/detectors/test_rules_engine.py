"""Matching semantics (node-problem-detector's, plus our extensions): records in → findings out.

Every table row runs on both engines: the fast ``RuleEngine`` and the straightforward
``ReferenceEngine``. A property test and two real corpora then check that they never disagree.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.app.config import load_rule_set
from agent.core.types import Finding, RuleType, Severity
from agent.detectors import rules as rules_module
from agent.detectors.prefix import strip_prefix
from agent.detectors.rulepack import RuleSet
from agent.detectors.rules import ReferenceEngine, RuleEngine, key_values, split_lines

from helpers import REPO

ROOT = REPO
KERNEL_LINES = ROOT.parent / "shared" / "testdata" / "kernel-lines.jsonl"

ENGINES = pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])


def rule_set(directory: Path, rules: list[dict[str, Any]], **pack: Any) -> RuleSet:
    """One JSON pack (NPD schema plus extensions) with the given rules and top-level keys."""
    path = directory / "pack.json"
    path.write_text(json.dumps({"source": "test", **pack, "rules": rules}), encoding="utf-8")
    return load_rule_set([path])


def temp(name: str, pattern: str, reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "temporary", "reason": reason or name.title(), "pattern": pattern, **extra}


def perm(name: str, condition: str, pattern: str, reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "permanent",
        "condition": condition,
        "reason": reason or name.title(),
        "pattern": pattern,
        **extra,
    }


def cond(type_: str) -> dict[str, str]:
    return {"type": type_, "reason": f"{type_}IsFine", "message": f"{type_} is fine"}


def found(findings: Sequence[Finding]) -> list[tuple]:
    """(line, rule, reason, message, fields) per finding: what every table compares."""
    return [(f.line, f.rule, f.reason, f.message, dict(f.fields)) for f in findings]


# --------------------------------------------------------------------------------------------
# The table: (id, pack, lines) → findings (line numbers start at 1)

XID = r"NVRM: Xid \(PCI:(?P<pci>[0-9a-f:]+)\): (?P<xid>\d+), .*"
FALLEN = r"NVRM: The NVIDIA GPU (?P<pci>\S+)[^\n]*\n(?:[^\n]*\n){0,2}[^\n]*NVRM: +fallen off the bus\.?"

CASES = [
    (
        "end-anchored-unanchored-start",
        {"rules": [temp("io", "Buffer I/O error")]},
        ["blk_update_request: Buffer I/O error", "Buffer I/O error on dev sda", "Buffer I/O error"],
        [(1, "io", "Io", "blk_update_request: Buffer I/O error", {}), (3, "io", "Io", "Buffer I/O error", {})],
    ),
    (
        "trailing-dot-star-reaches-the-end",
        {"rules": [temp("ext4", "EXT4-fs error .*", "Ext4Error")]},
        ["EXT4-fs error (device nvme0n1p1): ext4_find_entry:1455: inode #2: comm kubelet", "EXT4-fs warning x"],
        [
            (
                1,
                "ext4",
                "Ext4Error",
                "EXT4-fs error (device nvme0n1p1): ext4_find_entry:1455: inode #2: comm kubelet",
                {},
            )
        ],
    ),
    (
        "dollar-at-the-end",
        {"rules": [temp("cper", r".*\[Hardware Error\]: event severity: fatal$", "CperFatal")]},
        ["{1}[Hardware Error]: event severity: fatal", "{1}[Hardware Error]: event severity: fatal, again"],
        [(1, "cper", "CperFatal", "{1}[Hardware Error]: event severity: fatal", {})],
    ),
    (
        "caret-with-buffer-of-one-is-start-of-line",
        {"bufferSize": 1, "rules": [temp("start", r"^panic: .*")]},
        ["panic: first", "kernel said panic: second", "panic: third"],
        [(1, "start", "Start", "panic: first", {}), (3, "start", "Start", "panic: third", {})],
    ),
    (
        "caret-is-start-of-the-buffer-not-of-the-line",
        {"bufferSize": 3, "rules": [temp("start", r"^panic: .*")]},
        ["boot", "panic: first", "panic: second"],
        [],
    ),
    (
        "caret-multiline-matches-whole-buffer",
        {"bufferSize": 2, "rules": [temp("pair", r"^first\nsecond")]},
        ["zero", "first", "second", "first", "x", "second"],
        [(3, "pair", "Pair", "first\nsecond", {})],
    ),
    (
        "multiline-message-is-the-matched-lines",
        {"bufferSize": 5, "conditions": [cond("GpuGone")], "rules": [perm("fallen", "GpuGone", FALLEN)]},
        [
            "unrelated",
            "NVRM: The NVIDIA GPU 0000:3b:00.0",
            "NVRM: (PCI ID: 10de:2330) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
            "NVRM: fallen off the bus.",
            "after",
        ],
        [
            (
                5,
                "fallen",
                "Fallen",
                "NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\n"
                "NVRM: fallen off the bus and is not responding to commands.\nNVRM: fallen off the bus.",
                {"pci": "0000:3b:00.0"},
            )
        ],
    ),
    (
        "multiline-match-starts-mid-line",
        {"bufferSize": 3, "rules": [temp("pair", r"foo\nbar")]},
        ["xx foo", "bar", "foo", "other", "bar"],
        [(2, "pair", "Pair", "xx foo\nbar", {})],
    ),
    (
        "multiline-longer-than-buffer-never-matches",
        {"bufferSize": 2, "rules": [temp("three", r"one\ntwo\nthree")]},
        ["one", "two", "three"],
        [],
    ),
    (
        "multiline-exactly-the-buffer",
        {"bufferSize": 3, "rules": [temp("three", r"one\ntwo\nthree")]},
        ["one", "two", "three"],
        [(3, "three", "Three", "one\ntwo\nthree", {})],
    ),
    (
        "newline-capable-class-spans-lines",
        {"bufferSize": 2, "rules": [temp("cls", r"alpha[^x]beta")]},
        ["alpha", "beta", "alphaxbeta", "alpha beta"],
        [(2, "cls", "Cls", "alpha\nbeta", {}), (4, "cls", "Cls", "alpha beta", {})],
    ),
    (
        "whitespace-class-spans-lines",
        {"bufferSize": 2, "rules": [temp("ws", r"gamma:\s+delta")]},
        ["gamma:", "delta", "gamma: \tdelta"],
        [(2, "ws", "Ws", "gamma:\ndelta", {}), (3, "ws", "Ws", "gamma: \tdelta", {})],
    ),
    (
        "temporary-and-permanent",
        {
            "conditions": [cond("KernelDeadlock")],
            "rules": [
                temp("task-hung", r"task [\S ]+:\w+ blocked for more than \w+ seconds\.", "TaskHung"),
                perm(
                    "docker-hung",
                    "KernelDeadlock",
                    r"task docker:\w+ blocked for more than \w+ seconds\.",
                    "DockerHung",
                ),
            ],
        },
        [
            "INFO: task python3:123 blocked for more than 120 seconds.",
            "INFO: task docker:456 blocked for more than 120 seconds.",
        ],
        [
            (1, "task-hung", "TaskHung", "INFO: task python3:123 blocked for more than 120 seconds.", {}),
            (2, "task-hung", "TaskHung", "INFO: task docker:456 blocked for more than 120 seconds.", {}),
            (2, "docker-hung", "DockerHung", "INFO: task docker:456 blocked for more than 120 seconds.", {}),
        ],
    ),
    (
        "several-rules-fire-in-rule-order-not-name-order",
        {"rules": [temp("z-last-name", r"Out of memory: .*", "OOM"), temp("a-first-name", r".*memory.*", "Memory")]},
        ["Out of memory: Killed process 1"],
        [
            (1, "z-last-name", "OOM", "Out of memory: Killed process 1", {}),
            (1, "a-first-name", "Memory", "Out of memory: Killed process 1", {}),
        ],
    ),
    (
        "findings-in-line-order-then-rule-order",
        {"rules": [temp("a", "alpha.*"), temp("b", "beta.*"), temp("both", ".*(?:alpha|beta) 2")]},
        ["beta 1", "alpha 1", "alpha 2", "beta 2"],
        [
            (1, "b", "B", "beta 1", {}),
            (2, "a", "A", "alpha 1", {}),
            (3, "a", "A", "alpha 2", {}),
            (3, "both", "Both", "alpha 2", {}),
            (4, "b", "B", "beta 2", {}),
            (4, "both", "Both", "beta 2", {}),
        ],
    ),
    (
        "pattern-generated-message-suffix",
        {
            "rules": [
                temp(
                    "oom",
                    r"Killed process \d+ .*",
                    "OOMKilling",
                    patternGeneratedMessageSuffix="see https://example.invalid/oom",
                )
            ]
        },
        ["Killed process 42 (python3)"],
        [(1, "oom", "OOMKilling", "Killed process 42 (python3); see https://example.invalid/oom", {})],
    ),
    (
        "named-groups-are-fields-and-reason-template",
        {"rules": [temp("xid", XID, "GpuXid{xid}")]},
        ["NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."],
        [
            (
                1,
                "xid",
                "GpuXid79",
                "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                {"pci": "0000:3b:00", "xid": "79"},
            )
        ],
    ),
    (
        "template-field-of-unmatched-optional-group-is-unknown",
        {"rules": [temp("opt", r"error(?: code=(?P<code>\d+))?", "Error{code}")]},
        ["disk error code=5", "disk error"],
        [(1, "opt", "Error5", "disk error code=5", {"code": "5"}), (2, "opt", "ErrorUnknown", "disk error", {})],
    ),
    (
        "field-types-int-and-hex",
        {
            "rules": [
                temp(
                    "mce",
                    r"bank (?P<bank>\d+) status (?P<status>0x[0-9a-f]+) cpu (?P<cpu>\w+)",
                    "Mce",
                    fieldTypes={"bank": "int", "status": "hex", "cpu": "int"},
                )
            ]
        },
        ["mce: bank 4 status 0x4f cpu 12", "mce: bank 04 status 0xff cpu zero"],
        [
            (1, "mce", "Mce", "mce: bank 4 status 0x4f cpu 12", {"bank": 4, "status": 79, "cpu": 12}),
            # a value that does not convert is dropped from the fields, the finding stays
            (2, "mce", "Mce", "mce: bank 04 status 0xff cpu zero", {"bank": 4, "status": 255}),
        ],
    ),
    (
        "where-in-list-and-not-in-lists",
        {
            "lists": {"xid.node": [48, 79], "xid.app": ["13", "43"]},
            "conditions": [cond("GpuXid")],
            "rules": [
                perm("node", "GpuXid", XID, "GpuXid{xid}", fieldTypes={"xid": "int"}, where={"xid": "xid.node"}),
                temp("event", XID, "GpuEvent{xid}", where={"xid": {"notIn": ["xid.node", "xid.app"]}}),
                temp("app", XID, "GpuApp{xid}", where={"xid": {"in": [13]}, "pci": ["0000:3b:00"]}),
            ],
        },
        [
            "NVRM: Xid (PCI:0000:3b:00): 79, gone",
            "NVRM: Xid (PCI:0000:3b:00): 13, app",
            "NVRM: Xid (PCI:0000:3c:00): 13, app",
            "NVRM: Xid (PCI:0000:3b:00): 31, mmu",
        ],
        [
            (1, "node", "GpuXid79", "NVRM: Xid (PCI:0000:3b:00): 79, gone", {"pci": "0000:3b:00", "xid": 79}),
            (2, "app", "GpuApp13", "NVRM: Xid (PCI:0000:3b:00): 13, app", {"pci": "0000:3b:00", "xid": "13"}),
            (4, "event", "GpuEvent31", "NVRM: Xid (PCI:0000:3b:00): 31, mmu", {"pci": "0000:3b:00", "xid": "31"}),
        ],
    ),
    (
        "where-on-a-missing-field",
        {
            "rules": [
                temp("in", r"err(?: (?P<code>\d+))?", "In{code}", where={"code": ["1"]}),
                temp("not-in", r"err(?: (?P<code>\d+))?", "NotIn{code}", where={"code": {"notIn": ["1"]}}),
            ]
        },
        ["err 1", "err 2", "err"],
        [
            (1, "in", "In1", "err 1", {"code": "1"}),
            (2, "not-in", "NotIn2", "err 2", {"code": "2"}),
            (3, "not-in", "NotInUnknown", "err", {}),
        ],
    ),
    (
        "key-values",
        {
            "conditions": [cond("NeuronHealth")],
            "rules": [
                perm(
                    "neuron",
                    "NeuronHealth",
                    r"NEURON_HW_ERR=(?P<error>[A-Z_]+).*",
                    "NeuronHasError_{error}",
                    keyValues=["nd-id", "nc-id", "action"],
                    fieldTypes={"nd_id": "int"},
                )
            ],
        },
        [
            "NEURON_HW_ERR=DMA_ERROR instance-id=i-0abc nd-id=3 nc-id=1 serial-num=ab action=TERMINATE_INSTANCE",
            "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR",
        ],
        [
            (
                1,
                "neuron",
                "NeuronHasError_DMA_ERROR",
                "NEURON_HW_ERR=DMA_ERROR instance-id=i-0abc nd-id=3 nc-id=1 serial-num=ab action=TERMINATE_INSTANCE",
                {"error": "DMA_ERROR", "nd_id": 3, "nc_id": "1", "action": "TERMINATE_INSTANCE"},
            ),
            (
                2,
                "neuron",
                "NeuronHasError_HBM_UNCORRECTABLE_ERROR",
                "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR",
                {"error": "HBM_UNCORRECTABLE_ERROR"},
            ),
        ],
    ),
    (
        "named-group-wins-over-key-value",
        {"rules": [temp("kv", r"dev (?P<nd_id>\d+) .*", "Kv", keyValues=["nd-id"])]},
        ["dev 7 nd-id=3"],
        [(1, "kv", "Kv", "dev 7 nd-id=3", {"nd_id": "7"})],
    ),
    (
        # The matcher decides a `where` filter on the raw groups where it can (rules sharing a pattern):
        # converted fields compare as converted, a field keyValues may give is left to the full build.
        "where-on-converted-and-key-value-fields",
        {
            "rules": [
                temp("hex", r"code (?P<code>\S+)", "Hex", fieldTypes={"code": "hex"}, where={"code": ["255"]}),
                temp(
                    "nothex",
                    r"code (?P<code>\S+)",
                    "NotHex",
                    fieldTypes={"code": "hex"},
                    where={"code": {"notIn": ["255"]}},
                ),
                temp("int", r"n (?P<n>\S+)", "Int", fieldTypes={"n": "int"}, where={"n": ["13"]}),
                temp("kv", r"dev(?: (?P<nd_id>\d+))? .*", "Kv", keyValues=["nd-id"], where={"nd_id": ["3"]}),
            ]
        },
        ["code 0xff", "code ff", "code zz", "n 013", "n 14", "dev nd-id=3", "dev 4 nd-id=3"],
        [
            (1, "hex", "Hex", "code 0xff", {"code": 255}),
            (2, "hex", "Hex", "code ff", {"code": 255}),
            (3, "nothex", "NotHex", "code zz", {}),
            (4, "int", "Int", "n 013", {"n": 13}),
            (6, "kv", "Kv", "dev nd-id=3", {"nd_id": "3"}),
        ],
    ),
    (
        "non-ascii-lines",
        {
            "rules": [
                temp("fs", r"EXT4-fs error .*", "Ext4Error"),
                temp("any", r"(?P<word>\S+) ✓", "Check"),
                temp("deg", r"(?P<temp>\d+)°C above threshold.*", "Hot"),
            ]
        },
        [
            "EXT4-fs error (device sdä1): ünïcödé name ✗",
            "température ✓",
            "日本語 ✓",
            "\udcff broken byte",
            "cpu0: 95°C above threshold, throttled",
        ],
        [
            (1, "fs", "Ext4Error", "EXT4-fs error (device sdä1): ünïcödé name ✗", {}),
            (2, "any", "Check", "température ✓", {"word": "température"}),
            (3, "any", "Check", "日本語 ✓", {"word": "日本語"}),
            (5, "deg", "Hot", "cpu0: 95°C above threshold, throttled", {"temp": "95"}),
        ],
    ),
    (
        "character-classes-are-ascii-as-in-go",
        {"rules": [temp("word", r"(?P<word>\w+) ✓", "Word"), temp("digits", r"Xid (?P<xid>\d+)", "Xid")]},
        ["température ✓", "Xid \u0667\u0669", "Xid 79"],
        [(1, "word", "Word", "température ✓", {"word": "rature"}), (3, "digits", "Xid", "Xid 79", {"xid": "79"})],
    ),
    (
        "empty-lines",
        {"bufferSize": 3, "rules": [temp("gap", r"alpha\n\nbeta"), temp("two-blanks", r"\S+\n\n\n\S+")]},
        ["", "alpha", "", "beta", "", "", "gamma"],
        [(4, "gap", "Gap", "alpha\n\nbeta", {})],
    ),
]


@ENGINES
@pytest.mark.parametrize(("pack", "lines", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_findings(tmp_path: Path, engine_cls: type, pack: dict, lines: list[str], expected: list[tuple]) -> None:
    engine = engine_cls(rule_set=rule_set(tmp_path, **pack))
    assert found(engine.feed(lines, line_numbers=1)) == expected


@ENGINES
def test_finding_carries_rule_metadata(tmp_path: Path, engine_cls: type) -> None:
    rules = rule_set(
        tmp_path,
        [
            temp("event", r"Killed process \d+.*", "OOMKilling"),
            perm("cond", "KernelDeadlock", r"task docker:\w+ blocked.*", "DockerHung", severity="critical"),
        ],
        source="kernel-monitor",
        conditions=[cond("KernelDeadlock")],
    )
    engine = engine_cls(rule_set=rules)
    event, condition = engine.feed(["Killed process 1 (a)", "task docker:1 blocked for long"], times=[10.0, 20.5])
    assert (event.type, event.condition, event.severity, event.source, event.timestamp, event.line) == (
        RuleType.TEMPORARY,
        None,
        Severity.WARNING,
        "kernel-monitor",
        10.0,
        None,
    )
    assert (condition.type, condition.condition, condition.severity, condition.timestamp) == (
        RuleType.PERMANENT,
        "KernelDeadlock",
        Severity.CRITICAL,
        20.5,
    )


@ENGINES
def test_a_finding_is_a_real_frozen_finding(tmp_path: Path, engine_cls: type) -> None:
    """Built through its slot twin (speed), a finding is a ``Finding`` like one made by its constructor."""
    rules = rule_set(
        tmp_path,
        [perm("cond", "KernelDeadlock", r"task (?P<task>\w+):\d+ blocked.*", "Hung")],
        source="k",
        conditions=[cond("KernelDeadlock")],
    )
    (finding,) = engine_cls(rule_set=rules).feed(["task docker:1 blocked"], times=3.0, line_numbers=7)
    assert type(finding) is Finding
    assert finding == Finding(
        rule="cond",
        type=RuleType.PERMANENT,
        condition="KernelDeadlock",
        reason="Hung",
        severity=Severity.ERROR,
        message="task docker:1 blocked",
        timestamp=3.0,
        source="k",
        fields={"task": "docker"},
        line=7,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.reason = "changed"  # type: ignore[misc]
    assert dataclasses.replace(finding, reason="Other").reason == "Other"


# --------------------------------------------------------------------------------------------
# Thresholds: count matches within a window, per `by` key (times come from `times=`)

THRESHOLD_LINES = [
    "Xid 13 on A",
    "Xid 13 on B",
    "Xid 31 on A",
    "Xid 13 on A",
    "Xid 13 on A",
    "Xid 13 on A",
    "Xid 13 on A",
]
THRESHOLD_TIMES = [0.0, 10.0, 20.0, 30.0, 45.0, 100.0, 130.0]
THRESHOLDS = [
    # (id, threshold, lines (1-based) that produce a finding)
    ("by-pci", {"count": 3, "window": "60s", "by": ["pci"]}, [4, 5]),
    ("by-pci-and-xid", {"count": 3, "window": "60s", "by": ["pci", "xid"]}, [5]),
    ("no-by-counts-everything", {"count": 3, "window": "60s"}, [3, 4, 5]),
    ("long-window", {"count": 3, "window": "1h", "by": ["pci"]}, [4, 5, 6, 7]),
    ("count-one-is-every-match", {"count": 1, "window": "1s", "by": ["pci"]}, [1, 2, 3, 4, 5, 6, 7]),
]


@ENGINES
@pytest.mark.parametrize(("threshold", "lines"), [c[1:] for c in THRESHOLDS], ids=[c[0] for c in THRESHOLDS])
def test_threshold(tmp_path: Path, engine_cls: type, threshold: dict, lines: list[int]) -> None:
    rules = rule_set(tmp_path, [temp("rep", r"Xid (?P<xid>\d+) on (?P<pci>\w+)", "Repeated", threshold=threshold)])
    findings = engine_cls(rule_set=rules).feed(THRESHOLD_LINES, times=THRESHOLD_TIMES, line_numbers=1)
    assert [f.line for f in findings] == lines


# --------------------------------------------------------------------------------------------
# Feed options and state across batches

ANNOTATED = ["alpha 1", "noise", "alpha 2"]


@ENGINES
@pytest.mark.parametrize(
    ("line_numbers", "lines"),
    [(None, [None, None]), (1, [1, 3]), (100, [100, 102]), ([7, 8, 20], [7, 20])],
    ids=["none", "int-one", "int-hundred", "sequence"],
)
def test_line_numbers(tmp_path: Path, engine_cls: type, line_numbers: Any, lines: list[int | None]) -> None:
    engine = engine_cls(rule_set=rule_set(tmp_path, [temp("a", r"alpha \d")]))
    assert [f.line for f in engine.feed(ANNOTATED, line_numbers=line_numbers)] == lines


@ENGINES
@pytest.mark.parametrize(
    ("times", "timestamps"), [(5.0, [5.0, 5.0]), ([1.0, 2.0, 3.0], [1.0, 3.0])], ids=["scalar", "sequence"]
)
def test_times(tmp_path: Path, engine_cls: type, times: Any, timestamps: list[float]) -> None:
    engine = engine_cls(rule_set=rule_set(tmp_path, [temp("a", r"alpha \d")]))
    assert [f.timestamp for f in engine.feed(ANNOTATED, times=times)] == timestamps


@ENGINES
def test_permanent_only_drops_temporary_findings(tmp_path: Path, engine_cls: type) -> None:
    rules = rule_set(
        tmp_path,
        [
            temp("event", r"disk error .*"),
            perm("cond", "Disk", r"disk error .*"),
            temp("event-2", r"disk\nerror"),
            perm("cond-2", "Disk", r"disk\nerror"),
        ],
        conditions=[cond("Disk")],
        bufferSize=2,
    )
    engine = engine_cls(rule_set=rules)
    assert [f.rule for f in engine.feed(["disk error x", "disk", "error"], permanent_only=True)] == ["cond", "cond-2"]
    assert [f.rule for f in engine.feed(["disk error y"])] == ["event", "cond"]


BATCHED = [
    # (id, pack, lines, batch sizes): feeding in batches gives the findings of one feed of the reference
    (
        "multiline-spans-two-feeds",
        {"bufferSize": 4, "rules": [temp("pair", r"foo[^\n]*\n(?:[^\n]*\n)?bar")]},
        ["x", "foo 1", "bar", "foo 2", "y", "bar", "foo 3", "z", "w", "bar"],
        [2, 1, 1, 2, 1, 2, 1],
    ),
    (
        "multiline-armed-across-many-feeds",
        {"bufferSize": 5, "rules": [temp("far", r"start\n(?:.*\n){3}end")]},
        ["start", "a", "b", "c", "end", "start", "a", "b", "c", "d", "end"],
        [1] * 11,
    ),
    (
        "caret-across-feeds",
        {"bufferSize": 2, "rules": [temp("pair", r"^first\nsecond")]},
        ["first", "second", "first", "second"],
        [1, 1, 1, 1],
    ),
    (
        "threshold-across-feeds",
        {"rules": [temp("rep", r"Xid (?P<xid>\d+)", threshold={"count": 2, "window": "1h"})]},
        ["Xid 1", "noise", "Xid 2", "Xid 3"],
        [1, 1, 1, 1],
    ),
    ("empty-batches", {"bufferSize": 3, "rules": [temp("pair", r"foo\nbar")]}, ["foo", "bar"], [0, 1, 0, 1, 0]),
]


@ENGINES
@pytest.mark.parametrize(("pack", "lines", "sizes"), [c[1:] for c in BATCHED], ids=[c[0] for c in BATCHED])
def test_state_carries_across_feeds(
    tmp_path: Path, engine_cls: type, pack: dict, lines: list[str], sizes: list[int]
) -> None:
    rules = rule_set(tmp_path, **pack)
    expected = found(ReferenceEngine(rule_set=rules).feed(lines, line_numbers=1, times=list(range(len(lines)))))
    engine = engine_cls(rule_set=rules)
    got, start = [], 0
    for size in sizes:
        batch = lines[start : start + size]
        got += found(engine.feed(batch, line_numbers=start + 1, times=list(range(start, start + len(batch)))))
        start += size
    assert start == len(lines)
    assert got == expected


RECORDS = [
    # (id, raw records as a source may deliver them, findings)
    (
        "prefixed-single-lines",
        ["<4>[  123.456789] EXT4-fs error (device sda1): bad", "Nov 22 14:56:44 host kernel: Buffer I/O error"],
        [
            (1, "ext4", "Ext4Error", "EXT4-fs error (device sda1): bad", {}),
            (2, "io", "IOError", "Buffer I/O error", {}),
        ],
    ),
    (
        "bare-lines",
        ["EXT4-fs error (device sda1): bad", "Buffer I/O error"],
        [
            (1, "ext4", "Ext4Error", "EXT4-fs error (device sda1): bad", {}),
            (2, "io", "IOError", "Buffer I/O error", {}),
        ],
    ),
    (
        "multi-line-record",
        ["kernel: NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: fallen off the bus."],
        [
            (
                2,
                "fallen",
                "Fallen",
                "NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: fallen off the bus.",
                {"pci": "0000:3b:00.0"},
            )
        ],
    ),
]


@ENGINES
@pytest.mark.parametrize(("records", "expected"), [c[1:] for c in RECORDS], ids=[c[0] for c in RECORDS])
def test_records_are_split_and_stripped(
    tmp_path: Path, engine_cls: type, records: list[str], expected: list[tuple]
) -> None:
    rules = rule_set(
        tmp_path,
        [
            temp("ext4", r"EXT4-fs error .*", "Ext4Error"),
            temp("io", r"Buffer I/O error.*", "IOError"),
            perm("fallen", "GpuGone", FALLEN),
        ],
        conditions=[cond("GpuGone")],
        bufferSize=4,
    )
    lines = [strip_prefix(line) for line in split_lines(records)]
    assert found(engine_cls(rule_set=rules).feed(lines, line_numbers=1)) == expected


def test_split_lines() -> None:
    assert split_lines(["a", "b\nc", "", "d\n"]) == ["a", "b", "c", "", "d", ""]


def test_fast_engine_rejects_lines_with_newlines(tmp_path: Path) -> None:
    engine = RuleEngine(rule_set=rule_set(tmp_path, [temp("a", r"alpha \d")]))
    with pytest.raises(ValueError, match="split_lines"):
        engine.feed(["alpha 1\nalpha 2"])


def test_a_stream_of_ever_new_literal_combinations_keeps_few_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plans made per set of literals found in a line are bounded, and findings survive a reset."""
    monkeypatch.setattr(rules_module, "MAX_PLANS", 3)
    rules = rule_set(tmp_path, [temp(name, f"{name} \\d.*") for name in ("alpha", "bravo", "charlie", "delta")])
    words = ["alpha 1", "bravo 2", "charlie 3", "delta 4"]
    lines = [" ".join(words[a:b]) for a in range(4) for b in range(a + 1, 5)]  # ten distinct literal sets
    engine = RuleEngine(rule_set=rules)
    expected = found(ReferenceEngine(rule_set=rules).feed(lines))
    assert len(expected) == 20  # every word of every line
    assert found(engine.feed(lines)) == expected
    assert len(engine._every().plans) <= 3


@ENGINES
def test_engines_are_independent(tmp_path: Path, engine_cls: type) -> None:
    rules = rule_set(
        tmp_path, [temp("pair", r"foo\nbar"), temp("rep", "Xid", threshold={"count": 2, "window": "1h"})], bufferSize=2
    )
    first, second = engine_cls(rule_set=rules), engine_cls(rule_set=rules)
    assert found(first.feed(["Xid", "foo"])) == []
    assert found(second.feed(["bar", "Xid"])) == []


@pytest.mark.parametrize(
    "pattern", [r"café error: \d+", r"°C above threshold.*", r"Ünïcödé .*"], ids=["e-acute", "degree", "umlaut"]
)
def test_fast_engine_matches_non_ascii_literals(tmp_path: Path, pattern: str) -> None:
    rules = rule_set(tmp_path, [temp("r", pattern)])
    lines = ["café error: 5", "cpu0: 95°C above threshold, throttled", "Ünïcödé line"]
    expected = found(ReferenceEngine(rule_set=rules).feed(lines))
    assert len(expected) == 1
    assert found(RuleEngine(rule_set=rules).feed(lines)) == expected


def test_engines_agree_on_non_word_boundary_at_an_empty_line(tmp_path: Path) -> None:
    rules = rule_set(tmp_path, [temp("nb", r"\B")], bufferSize=2)
    lines = ["alpha", ""]
    assert found(RuleEngine(rule_set=rules).feed(lines)) == found(ReferenceEngine(rule_set=rules).feed(lines))


@ENGINES
def test_multiline_message_starts_at_the_right_character_after_non_ascii_text(tmp_path: Path, engine_cls: type) -> None:
    """RE2 matches UTF-8 bytes; the message is cut at a character offset."""
    rules = rule_set(tmp_path, [temp("pair", r"fo+\nbar (?P<t>\S+)")], bufferSize=3)
    findings = engine_cls(rule_set=rules).feed(["été", "çà fooo", "bar °C"], line_numbers=1)
    assert found(findings) == [(3, "pair", "Pair", "çà fooo\nbar °C", {"t": "°C"})]


@ENGINES
def test_line_with_a_lone_surrogate_does_not_break_matching(tmp_path: Path, engine_cls: type) -> None:
    rules = rule_set(tmp_path, [temp("err", r"disk error (?P<dev>\w+)")])
    findings = engine_cls(rule_set=rules).feed(["x\ud800 disk error sda", "disk error sdb"], line_numbers=1)
    assert [(f.line, dict(f.fields)) for f in findings] == [(1, {"dev": "sda"}), (2, {"dev": "sdb"})]


@ENGINES
def test_rule_in_re2_only_syntax_runs_on_every_line(tmp_path: Path, engine_cls: type) -> None:
    """Python's parser cannot read \\p{..}: no known literal, so the rule is tried on every line."""
    rules = rule_set(tmp_path, [temp("greek", r"(?P<word>\p{Greek}+) failure (?P<n>\d+)")], bufferSize=2)
    assert (rules.rules[0].literals, rules.rules[0].multiline) == (None, True)
    findings = engine_cls(rule_set=rules).feed(["boot", "αβγ failure 7", "latin failure 8"], line_numbers=1)
    assert found(findings) == [(2, "greek", "Greek", "αβγ failure 7", {"word": "αβγ", "n": "7"})]


_KV_REGEX = re.compile(r"(?:^|(?<=\s))([A-Za-z0-9_.-]+)=(\S+)")  # the definition key_values implements


@settings(max_examples=300, deadline=None)
@given(message=st.text(alphabet="ab-_.=:( \t\u00a0é", max_size=40))
def test_key_values_finds_what_the_regex_definition_finds(message: str) -> None:
    wanted = ("a", "b", "a-b", "a.b", "é")
    expected = [(k, v) for k, v in _KV_REGEX.findall(message) if k in wanted]
    assert key_values(message, wanted=wanted) == expected


# Catastrophic backtracking for Python's re (each line below would take longer than the age of the
# universe); RE2 is linear. In a subprocess with a generous timeout so that a regression fails
# instead of hanging the test run.
HOSTILE_RULES = [
    temp("nested", r"(a+)+$"),
    temp("overlap", r"(x+x+)+y"),
    temp("star", r"(.*a){20}"),
    temp("alternation", r"(a|aa)+$"),
    temp("named", r"(?P<run>(?:a|a)*)+b"),
]
HOSTILE_SCRIPT = """
import json, sys
from pathlib import Path
from agent.app.config import load_rule_set
from agent.detectors.rules import ReferenceEngine, RuleEngine
rules = load_rule_set([Path(sys.argv[1])])
lines = ["a" * 10_000 + "!", "x" * 10_000, "a" * 10_000, "(" * 5_000 + "a" * 5_000 + "!"]
print(json.dumps({
    engine.__name__: [[f.line, f.rule] for f in engine(rule_set=rules).feed(lines, line_numbers=1)]
    for engine in (RuleEngine, ReferenceEngine)
}))
"""


def test_hostile_patterns_cannot_stall_the_engine(tmp_path: Path) -> None:
    pack = tmp_path / "hostile.json"
    pack.write_text(json.dumps({"source": "test", "bufferSize": 3, "rules": HOSTILE_RULES}), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-c", HOSTILE_SCRIPT, str(pack)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["RuleEngine"] == result["ReferenceEngine"] == [[3, "nested"], [3, "star"], [3, "alternation"]]


# --------------------------------------------------------------------------------------------
# Equivalence: the fast engine finds exactly what the reference engine finds

_WORDS = ["alpha", "alphabet", "beta", "Xid 7", "gamma:", "ERR=", "12", "7", "x", " ", "\t", "é"]
_LITERALS = [re.escape(w) for w in _WORDS if w.strip()]
_BOUNDED = [*_LITERALS, r"\s", "[^x]", "x?", r"\w", r"\d", ".", r"[^\n]"]
# At most two of these per line-piece: enough to exercise the analysis without catastrophic
# backtracking (long chains of .*, \w+ ... make a failing search polynomial of high degree).
_UNBOUNDED = [".*", ".+", r"\d+", "[a-z]+", r"\S+", r"\w+", r"[^\n]*", r"\s*", "(?:alpha )+", r"(?:beta|\d+)"]
_element = st.one_of(
    st.sampled_from(_BOUNDED),
    st.lists(st.sampled_from(_BOUNDED), min_size=2, max_size=3).map(lambda xs: "(?:" + "|".join(xs) + ")"),
    st.lists(st.sampled_from(_LITERALS), min_size=2, max_size=3).map(lambda xs: "(?:" + "|".join(xs) + ")"),
    st.sampled_from(_BOUNDED).map(lambda x: f"(?:{x})?"),
)


@st.composite
def _piece(draw: st.DrawFn) -> str:
    parts = draw(st.lists(_element, min_size=1, max_size=4))
    for repeat in draw(st.lists(st.sampled_from(_UNBOUNDED), max_size=2)):
        parts.insert(draw(st.integers(0, len(parts))), repeat)
    return "".join(parts)


def _pattern() -> st.SearchStrategy[str]:
    return st.tuples(
        st.booleans(),  # ^-anchored
        st.lists(_piece(), min_size=1, max_size=3),  # joined with \n: spans lines
        st.booleans(),  # one named group around the last piece
        st.booleans(),  # $ at the end
    ).map(_assemble)


def _assemble(parts: tuple[bool, list[str], bool, bool]) -> str:
    caret, pieces, named, dollar = parts
    if named:
        pieces = [*pieces[:-1], f"(?P<f>{pieces[-1]})"]
    return ("^" if caret else "") + r"\n".join(pieces) + ("$" if dollar else "")


_line = st.lists(st.sampled_from(_WORDS), max_size=6).map("".join) | st.text(alphabet="alph bet:7x\té", max_size=8)


@st.composite
def _scenario(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[str], list[int]]:
    packs = []
    for p in range(draw(st.integers(1, 2))):
        rules = []
        for r in range(draw(st.integers(1, 3))):
            pattern = draw(_pattern(), label="pattern")
            reason = "R{f}" if "(?P<f>" in pattern else f"R{p}{r}"
            rules.append({"name": f"r{p}-{r}", "type": "temporary", "reason": reason, "pattern": pattern})
        packs.append({"bufferSize": draw(st.integers(1, 4)), "source": f"p{p}", "rules": rules})
    lines = draw(st.lists(_line, max_size=20), label="lines")
    # Plant text that matches some rule (split into lines when the pattern spans lines), so that
    # most examples do produce findings, multi-line ones included.
    patterns = [rule["pattern"] for pack in packs for rule in pack["rules"]]
    for _ in range(draw(st.integers(0, 3))):
        pattern = draw(st.sampled_from(patterns))
        text = draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True), label="planted")
        at = draw(st.integers(0, len(lines)))
        lines[at:at] = text.split("\n")
    cuts = sorted(draw(st.lists(st.integers(0, len(lines)), max_size=4), label="cuts"))
    return packs, lines, cuts


def _load_packs(packs: list[dict[str, Any]]) -> RuleSet:
    with tempfile.TemporaryDirectory() as directory:
        paths = []
        for i, pack in enumerate(packs):
            path = Path(directory) / f"{i}.json"
            path.write_text(json.dumps(pack), encoding="utf-8")
            paths.append(path)
        return load_rule_set(paths)


def _batched(engine: RuleEngine, lines: list[str], cuts: list[int], *, header: str | None = None) -> list[Finding]:
    """The findings of ``lines`` fed in batches cut at ``cuts``; with ``header``, each batch also comes with its
    raw lines (``header`` before each line, as a kernel record's prefix before its message)."""
    findings: list[Finding] = []
    for start, end in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        batch = lines[start:end]
        raw = (
            None if header is None else "".join(f"{header}{line}\n" for line in batch).encode("utf-8", "surrogatepass")
        )
        times = [float(i) for i in range(start, end)]
        findings += engine.feed(batch, line_numbers=start, times=times, raw_lines=raw)
    return findings


@pytest.mark.parametrize(
    "literals",
    [("foo",), ("o\nb", "o b"), ("6,1", "foo")],
    ids=["in-a-line", "spanning-lines", "in-every-header"],
)
def test_raw_lines_find_what_the_lines_joined_find(tmp_path: Path, literals: tuple[str, ...]) -> None:
    """The prefilter scans raw lines in place of the lines joined only where no literal spans lines (the regex
    analysis never makes one: this engine would lose the match, a prefix standing between its lines); a literal
    in every prefix only makes every line a candidate."""
    rules = rule_set(tmp_path, rules=[temp("pair", r"foo(?: |\n)bar")], bufferSize=2)
    forced = dataclasses.replace(rules, rules=(dataclasses.replace(rules.rules[0], literals=literals),))
    lines = ["x", "foo", "bar", "foo bar"]
    raw = "".join(f"6,1{i},2,-;{line}\n" for i, line in enumerate(lines)).encode()
    expected = found(ReferenceEngine(rule_set=forced).feed(lines, line_numbers=0))
    assert [f[0] for f in expected] == [2, 3]
    assert found(RuleEngine(rule_set=forced).feed(lines, line_numbers=0)) == expected
    assert found(RuleEngine(rule_set=forced).feed(lines, line_numbers=0, raw_lines=raw)) == expected


# Record prefixes for raw lines: the kernel's own, and ones holding the rules' literals (a hit in a prefix makes
# a line a candidate only: its rules' regexes turn it down).
_HEADERS = [None, "6,1,2,-;", "4,12,77,-,caller=T7;", "alpha Xid 7 ERR=12;"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=_scenario(), header=st.sampled_from(_HEADERS))
def test_fast_engine_equals_reference_engine(
    scenario: tuple[list[dict[str, Any]], list[str], list[int]], header: str | None
) -> None:
    packs, lines, cuts = scenario
    rules = _load_packs(packs)
    expected = ReferenceEngine(rule_set=rules).feed(lines, line_numbers=0, times=[float(i) for i in range(len(lines))])
    assert found(_batched(RuleEngine(rule_set=rules), lines, cuts, header=header)) == found(expected)


@pytest.fixture(scope="module")
def builtin_rules() -> RuleSet:
    return load_rule_set([ROOT / "plugins"])


@pytest.mark.skipif(not KERNEL_LINES.is_file(), reason=f"shared test data not present at {KERNEL_LINES}")
def test_engines_agree_on_real_kernel_lines(builtin_rules: RuleSet) -> None:
    records = [json.loads(line) for line in KERNEL_LINES.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = [strip_prefix(r["text"]).strip() for r in records]
    expected = ReferenceEngine(rule_set=builtin_rules).feed(lines, line_numbers=0)
    assert len(expected) > len(lines) // 2  # the built-in packs do find the labelled problems
    assert found(RuleEngine(rule_set=builtin_rules).feed(lines, line_numbers=0)) == found(expected)
    assert found(_batched(RuleEngine(rule_set=builtin_rules), lines, [1, 2, 30, 31, 90])) == found(expected)


# The benchmark's stream has 1% fault records; a shorter one with 5% checks ~150 faults (every
# template, multi-line ones too), near misses and call traces through the reference engine in ~1 s.
CORPORA = [(3000, 0.05)]


@pytest.mark.parametrize(("count", "fault_rate"), CORPORA, ids=[f"{c}-lines-{r:.1%}-faults" for c, r in CORPORA])
def test_engines_agree_on_benchmark_corpus(
    builtin_rules: RuleSet, monkeypatch: pytest.MonkeyPatch, count: int, fault_rate: float
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.corpus import kernel_lines

    lines = kernel_lines(count, fault_rate=fault_rate)
    expected = ReferenceEngine(rule_set=builtin_rules).feed(lines, line_numbers=0)
    assert expected
    assert found(_batched(RuleEngine(rule_set=builtin_rules), lines, [1, 777, 778, count // 2])) == found(expected)
