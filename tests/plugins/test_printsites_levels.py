"""A KERN_* level inside a print's format (issue 38): printk takes a record's level only from the KERN_*
pieces at the very start of the text it formats (printk_parse_prefix, kernel/printk/printk.c) and drops
them; one after any text (a pr_fmt prefix, dev_printk's "<driver> <device>: ", earlier format text) is
printed as it is, its KERN_SOH and digit in the middle of the message. The scanner keeps such a piece as
``{KERN_*}`` (a gap between the rule's literal runs), render prints its two bytes, and the rule built from
the site matches the record as /dev/kmsg hands it out (aws-neuron-driver's neuron_fw_io.c:293,
``pr_err(KERN_ERR "seq: %u, cmd: %u failed %u\\n", ...)``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import RuleEngine
from agent.sources.kmsg.decoder import Mode, decode

sys.path.insert(0, str(builtin_plugins_dir() / "kernel"))
import printsites  # noqa: E402

sys.path.remove(str(builtin_plugins_dir() / "kernel"))

CASES = [
    # (file prefix define, the call, level, text as extracted, the first rendered record)
    (
        '#define pr_fmt(fmt) "mod: " fmt',
        'pr_err(KERN_ERR "seq: %u failed\\n", s);',
        "err",
        "mod: {KERN_ERR}seq: %u failed\\n",
        "mod: \x013seq: 3 failed",
    ),
    ("", 'pr_err(KERN_ERR "seq: %u failed\\n", s);', "err", "seq: %u failed\\n", "seq: 3 failed"),
    ("", 'printk(KERN_ERR KERN_CONT "seq: %u failed\\n", s);', "err", "seq: %u failed\\n", "seq: 3 failed"),
    (
        "",
        'printk(KERN_ERR "seq: " KERN_CONT "%u failed\\n", s);',
        "err",
        "seq: {KERN_CONT}%u failed\\n",
        "seq: \x01c3 failed",
    ),
    (
        "",
        'dev_err(dev, KERN_ERR "seq: %u failed\\n", s);',
        "err",
        "{KERN_ERR}seq: %u failed\\n",
        "mod 0000:3b:00.0: \x013seq: 3 failed",
    ),
    ("", 'printk(KERN_CRIT "seq: %u failed\\n", s);', "crit", "seq: %u failed\\n", "seq: 3 failed"),
]


@pytest.mark.parametrize(("define", "call", "level", "text", "record"), CASES)
def test_a_level_after_text_is_printed_mid_record(
    tmp_path: Path, define: str, call: str, level: str, text: str, record: str
) -> None:
    (tmp_path / "f.c").write_text(f"{define}\nstatic void f(void)\n{{\n\t{call}\n}}\n")
    spec = printsites.Spec(name="t", paths=["f.c"], printk_pr_fmt=False)
    [site] = printsites.extract(tmp_path, spec)
    assert (site.level, site.text) == (level, text)
    assert printsites.render(site, driver="mod")[0] == record


def test_the_neuron_firmware_command_failure_is_found_as_the_kernel_hands_it_out() -> None:
    rule_set = load_rule_set([builtin_plugins_dir()])
    chunk = b"3,7001,4000000,-;neuron:fw_io_execute_request: \\x013seq: 5, cmd: 3 failed 1\n"
    [record] = decode(chunk, mode=Mode.KERNEL_DEVICE, boot_time=0.0).records
    assert record.message == "neuron:fw_io_execute_request: \x013seq: 5, cmd: 3 failed 1"
    found = [(f.rule, f.reason) for f in RuleEngine(rule_set=rule_set).feed([record.message])]
    assert [reason for _, reason in found] == ["NeuronDriverError"]
    assert found[0][0].startswith("neuron-driver/")
