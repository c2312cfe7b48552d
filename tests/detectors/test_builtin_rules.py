"""Every built-in rule fires on its recorded example (tests/fixtures/rules/*-examples.yaml),
with the expected reason and fields, through both the fast and the reference matcher; benign
lines that mention the same words stay silent."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.prefilter import Prefilter
from agent.detectors.rules import ReferenceEngine, RuleEngine

from helpers import FIXTURES


def _examples() -> dict:
    """Every examples file merged: examples by rule (a rule's examples live in one file), benign lines."""
    merged: dict = {"examples": {}, "benign": [], "quiet": {}}
    for path in sorted((FIXTURES / "rules").glob("*-examples.yaml")):
        doc = yaml.safe_load(path.read_text())
        twice = set(merged["examples"]) & set(doc.get("examples") or {})
        assert not twice, f"{path.name}: examples for {sorted(twice)} are also in another file"
        merged["examples"].update(doc.get("examples") or {})
        merged["benign"].extend(doc.get("benign") or [])
        merged["quiet"].update(doc.get("quiet") or {})
    return merged


FIXTURE = _examples()
RULE_SET = load_rule_set([builtin_plugins_dir()])
CASES = [(rule, i, ex) for rule, exs in FIXTURE["examples"].items() for i, ex in enumerate(exs)]


def test_every_builtin_rule_has_an_example():
    # A generated pack's quiet rule for its benign sites: tests/plugins/test_print_sites.py renders every one.
    benign = {r.name for r in RULE_SET.rules if r.name.endswith("/benign")}
    missing = sorted({r.name for r in RULE_SET.rules} - set(FIXTURE["examples"]) - set(FIXTURE["quiet"]) - benign)
    assert missing == [], f"built-in rules without a recorded example: {missing}"
    unknown = sorted((set(FIXTURE["examples"]) | set(FIXTURE["quiet"])) - {r.name for r in RULE_SET.rules})
    assert unknown == [], f"examples for rules that do not exist: {unknown}"


@pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
@pytest.mark.parametrize(("rule", "index", "example"), CASES, ids=[f"{r}#{i}" for r, i, _ in CASES])
def test_rule_fires_on_its_example(engine_cls, rule, index, example):
    lines = example["lines"]
    findings = engine_cls(rule_set=RULE_SET).feed(lines, times=0.0, line_numbers=1)
    mine = [f for f in findings if f.rule == rule]
    assert mine, f"{rule} did not fire; findings: {[(f.rule, f.reason) for f in findings]}"
    last = mine[-1]
    assert last.line == len(lines), "the finding belongs to the line that completed the match"
    assert last.reason == example["reason"]
    for name, value in (example.get("fields") or {}).items():
        assert last.fields.get(name) == value, (name, dict(last.fields))


QUIET = [(rule, lines) for rule, examples in FIXTURE["quiet"].items() for lines in examples]


@pytest.mark.parametrize("engine_cls", [RuleEngine, ReferenceEngine], ids=["fast", "reference"])
@pytest.mark.parametrize(("rule", "lines"), QUIET, ids=[r for r, _ in QUIET])
def test_a_quiet_rule_keeps_its_familys_fallback_silent(engine_cls, rule, lines):
    """A rule that matches lines another finding speaks for (informational prints, a report's detail
    lines) and never fires: nothing is reported for the last line, and without the rule a fallback would."""

    def on_last_line(rule_set):
        findings = engine_cls(rule_set=rule_set).feed(lines, times=0.0, line_numbers=1)
        return [f.rule for f in findings if f.line == len(lines)]

    assert on_last_line(RULE_SET) == []
    assert on_last_line(dataclasses.replace(RULE_SET, rules=tuple(r for r in RULE_SET.rules if r.name != rule)))


@pytest.mark.parametrize("line", FIXTURE["benign"])
def test_benign_lines_stay_silent(line):
    assert RuleEngine(rule_set=RULE_SET).feed([line]) == []


# Benign lines a busy node prints by the thousand. A rule literal found in one of them sends every such
# line through Python and a regex (the rate-limited I/O rule's literal ' callbacks suppressed' did).
FREQUENT_BENIGN = [
    "kauditd_printk_skb: 12 callbacks suppressed",
    "net_ratelimit: 187 callbacks suppressed",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
    "NVRM: GPU at PCI:0000:53:00: GPU-0a5ab9cd-2b93-d1a4-3b6c-1a1e9c7d2b11",
    "IPv6: ADDRCONF(NETDEV_CHANGE): cali4f2d1e0a9b3: link becomes ready",
    "cni0: port 3(veth1c2d3e4f) entered forwarding state",
]


@pytest.mark.parametrize("line", FREQUENT_BENIGN)
def test_frequent_benign_lines_carry_no_rule_literal(line):
    prefilter = Prefilter.build(lit for rule in RULE_SET.rules for lit in rule.literals or ())
    assert prefilter.by_line(line.encode()) == ({}, 0)


# A rule that can match across lines is tried on its whole window for bufferSize lines after each line
# with its literal: a character class that forgets to exclude "\n" ("[^)]*") makes a one-line message
# such a rule, at ten regex runs per literal hit. Only the messages printed over several lines may be.
MULTILINE = {
    "kernel/pcie-aer-detail-in-report",  # an AER report's header with its detail lines
    "kernel/xfs-corruption-detail-in-report",  # an XFS verifier report's header with its detail lines
    "kernel/ext4-delalloc-detail-in-report",  # a failed delayed allocation's two records
    "kernel/mlx5-unrecoverable-synd-in-report",  # an mlx5 health report's header and its syndrome record
    "kernel/scsi-additional-sense-in-report",  # a SCSI sense report's Sense Key line and its additional sense
    "kernel/ata-eh-detail-in-report",  # a libata error-handler report's header and its detail records
    "kernel/bug-oops-header-in-report",  # "kernel BUG at" and the die() header after it
    "kernel/page-fault-decode-in-report",  # a page fault's "BUG:" line and its "#PF:" decode
    "nvidia/sxid-detail-in-report",  # an SXid report's header and its error entry's records
    "nvidia/fallen-off-bus-multiline",  # "NVRM: The NVIDIA GPU ..." / "NVRM: fallen off the bus ..."
    "nvidia/gpu-not-supported",  # "NVRM: The NVIDIA GPU ..." / "NVRM: installed in this system is not supported"
    "nvidia/invalid-bar-in-report",  # nv_pci_probe's invalid BAR report: its first line and the BAR line
    "nvidia/gpu-crash-dump-in-report",  # the fault (an Xid, a GPU off the bus) and the crash-dump notice after it
    "nvidia/gsp-rpc-rate-limited-in-report",  # the Xid 119s and the RPC rate-limit notice after them
    "kernel/warning-netdev-watchdog-in-report",  # NETDEV WATCHDOG and the WARNING line of its WARN_ONCE
    "kernel/pcie-dpc-trigger-in-report",  # a DPC containment event and its "%s detected" record (4.19-6.15)
}


def test_only_messages_printed_over_several_lines_have_multiline_rules():
    assert {r.name for r in RULE_SET.rules if r.multiline} == MULTILINE
