"""The Neuron driver's print-site pack (plugins/neuron/sites-neuron.yaml, from generate_driver.py): what
the driver prints when the device, its firmware or the driver failed is a NeuronDriverError Event; what
it prints for a process's bad request, or on every healthy start, is no Event; the runtime's hardware
error reports stay neuron-monitor.yaml's. (Pack = generator output and the coverage figure:
test_print_sites.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import RuleEngine

PLUGINS = builtin_plugins_dir()
sys.path.insert(0, str(PLUGINS / "kernel"))
import printsites  # noqa: E402

sys.path.remove(str(PLUGINS / "kernel"))

GEN = printsites.load_generator(PLUGINS / "neuron" / "generate_driver.py")
RULE_SET = load_rule_set([PLUGINS])


def _findings(line: str) -> list[tuple[str, str]]:
    return [(f.rule.split("/")[0], f.reason) for f in RuleEngine(rule_set=RULE_SET).feed([line])]


def test_the_driver_prefix_is_the_module_and_the_function(tmp_path: Path) -> None:
    (tmp_path / "neuron_dma.c").write_text(
        '#define pr_fmt(fmt) "%s:%s: " fmt, KBUILD_MODNAME, __func__\n'
        "static int ndma_wait(struct ndma_eng *eng,\n"
        "                     int count)\n"
        "{\n"
        "    if (count < 0) {\n"
        '        pr_err("DMA completion timeout on nd%02d\\n", eng->nd);\n'
        "    }\n"
        '    printk(KERN_ERR "%s\\n", str);\n'
        "}\n"
    )
    got = [(s.call, s.text) for s in printsites.extract(tmp_path, GEN.SPEC)]
    # pr_err adds pr_fmt; printk does not
    assert got == [("pr_err", "neuron:ndma_wait: DMA completion timeout on nd%02d\\n"), ("printk", "%s\\n")]


def test_a_prefix_the_scanner_cannot_pair_is_left_as_written(tmp_path: Path) -> None:
    (tmp_path / "x.c").write_text(
        '#define pr_fmt(fmt) "%s[%d]: " fmt, __func__, __LINE__\nvoid f(void)\n{\n    pr_err("gone\\n");\n}\n'
    )
    assert [s.text for s in printsites.extract(tmp_path, printsites.Spec(name="t", paths=["*.c"]))] == [
        "%s[%d]: gone\\n"
    ]


@pytest.mark.parametrize(
    "line",
    [
        "neuron:ndma_memcpy_wait_for_completion: DMA completion timeout on nd03 for UDMA_ENG_33 q0 desc count 2",
        "neuron:fw_io_execute_request: seq: 1234, cmd: 7 timed out",
        "neuron:ncdev_open: nd7 is in an invalid state",
        "neuron:npe_primary_device_do_election: nd02: left ultraserver link is miss-wired to nd05 (0000000000000005)",
        "UDMA ENG:12 init failed",
        "neuron-driver 0000:10:1c.0: Using 32bit DMA configuration.",
    ],
)
def test_a_device_firmware_or_driver_failure_is_a_warning_event(line: str) -> None:
    assert _findings(line) == [("neuron-driver", "NeuronDriverError")]


@pytest.mark.parametrize(
    "line",
    [
        "neuron:ncdev_mem_handle_to_mem_chunk: invalid memory handle 7f00deadbeef",
        "neuron:ncdev_mem_copy: src offset+size is too large for mem handle",
        "neuron:ncdev_misc_ioctl: invalid misc IOCTL 3221770753 (dir=3, type=78, nr=1, size=16)",
        "neuron:nmmap_get_mc: nd0: partial mmap of mc not supported(400000 != 1000)",
        "neuron:udma_q_init_validate: queue3 size(4) too small",
    ],
)
def test_a_processs_bad_request_is_no_event(line: str) -> None:
    assert _findings(line) == []


def test_the_runtimes_hardware_error_report_is_neuron_monitors_alone() -> None:
    """NEURON_IOCTL_PRINTK prints the runtime's string as it is (neuron_cdev.c ncdev_printk)."""
    line = (
        "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0592464924bd45322 hostname=ip-172-31-61-252 "
        "nd-id=0 nc-id=0 serial-num=19fcda00f5ff6eb9 action=TERMINATE_INSTANCE"
    )
    assert _findings(line) == [("neuron", "NeuronHasError_SRAM_UNCORRECTABLE_ERROR")]


def test_every_user_request_exclusion_names_the_process_and_what_it_asked() -> None:
    for exclusion in GEN.EXCLUSIONS:
        if exclusion.reason.startswith("a process's bad request"):
            assert not exclusion.benign, exclusion.pattern
            assert exclusion.reason.split(": ", 1)[1].strip(), exclusion.pattern
