"""The NVIDIA module print sites (plugins/nvidia/generate_modules.py, issue 38): what the scanner reads
from the modules' own print helpers, and which pack speaks for each kind of line.

tests/plugins/test_print_sites.py checks the pack against the extract and the coverage; these pin the
module-specific reading: the prefixes the helpers write, the levels they take as arguments, and the
lines left to nvidia-monitor.yaml's specific rules.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.detectors.rules import RuleEngine

PLUGINS = builtin_plugins_dir()
sys.path.insert(0, str(PLUGINS / "kernel"))
import printsites  # noqa: E402

sys.path.remove(str(PLUGINS / "kernel"))

GEN = printsites.load_generator(PLUGINS / "nvidia" / "generate_modules.py")
RULES = load_rule_set([PLUGINS])


def _tree(tmp_path: Path, files: dict[str, str]) -> list[printsites.Site]:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return GEN.extract(tmp_path)


def _rules_on(line: str) -> list[tuple[str, str]]:
    return [(f.rule, f.reason) for f in RuleEngine(rule_set=RULES).feed([line], times=0.0, line_numbers=1)]


def test_uvm_prints_carry_the_module_file_function_and_pid_prefix(tmp_path: Path) -> None:
    sites = _tree(
        tmp_path,
        {
            "kernel-open/nvidia-uvm/uvm_x.c": (
                "void f(void) {\n"
                '    UVM_ERR_PRINT("Failed to init ISR: %s, GPU %s\\n", a, b);\n'
                "    UVM_ASSERT_RELEASE(a == b);\n"
                '    UVM_ASSERT_MSG_RELEASE(a, "semaphore jump 0x%llx\\n", v);\n'
                '    UVM_INFO_PRINT("fine\\n");\n'
                '    UVM_PANIC_ON_MSG(c, "bad state\\n");\n'
                "}\n"
            )
        },
    )
    assert [(s.call, s.text) for s in sites] == [
        ("UVM_ERR_PRINT", "nvidia-uvm: %s:%u %s[pid:%d] Failed to init ISR: %s, GPU %s\\n"),
        ("UVM_ASSERT_RELEASE", "nvidia-uvm: %s:%u %s[pid:%d] Assert failed, condition %s not true\\n"),
        (
            "UVM_ASSERT_MSG_RELEASE",
            "nvidia-uvm: %s:%u %s[pid:%d] Assert failed, condition %s not true: semaphore jump 0x%llx\\n",
        ),
        ("panic", "%s:%u %s[pid:%d]: bad state\\n"),
    ]


def test_a_helper_that_takes_the_drivers_own_level_is_read_at_that_level(tmp_path: Path) -> None:
    sites = _tree(
        tmp_path,
        {
            "src/nvidia-modeset/src/nvkms-x.c": (
                "void f(void) {\n"
                '    nvEvoLogDev(pDevEvo, EVO_LOG_ERROR, "Failed to open GPU");\n'
                '    nvEvoLogDev(pDevEvo, EVO_LOG_INFO, "Opened GPU");\n'
                '    nvEvoLogDev(pDevEvo, logType, "Either");\n'
                "}\n"
            ),
            "kernel-open/nvidia/nvlink_linux.c": (
                "void g(void) {\n"
                '    nvlink_print(NVLINK_DBG_ERRORS, "alloc_chrdev_region failed: %d\\n", rc);\n'
                '    nvlink_print(NVLINK_DBG_INFO, "nvlink driver open\\n");\n'
                "}\n"
            ),
        },
    )
    assert [(s.level, s.text) for s in sites] == [
        ("err", "nvidia-nvlink: alloc_chrdev_region failed: %d\\n"),
        ("err", "nvidia-modeset: ERROR: GPU:%d: Failed to open GPU"),
    ]


def test_the_nvswitch_drivers_device_prints_name_the_switch(tmp_path: Path) -> None:
    (site,) = _tree(
        tmp_path,
        {
            "kernel-open/nvidia/linux_nvswitch.c": (
                'void f(void) { printk(KERN_ERR "%s: Failed to map BAR0 region : %d\\n", nvswitch_dev->name, rc); }\n'
            )
        },
    )
    assert site.text == "nvidia-nvswitch%d: Failed to map BAR0 region : %d\\n"
    assert printsites.render(site) == ["nvidia-nvswitch3: Failed to map BAR0 region : 3"]


def test_a_module_failure_no_specific_rule_reads_is_a_warning_event() -> None:
    line = "nvidia-uvm: uvm_gpu.c:1561 init_parent_gpu[pid:812] Failed to init ISR: NV_ERR_NO_MEMORY, GPU GPU-5f2c1b8e"
    (got,) = _rules_on(line)
    assert got[0].startswith("nvidia-modules/sites-") and got[1] == "NvidiaModuleError"


def test_display_sxid_and_peermem_lines_stay_with_their_specific_rules() -> None:
    assert [r for r, _ in _rules_on("nvidia-modeset: ERROR: GPU:0: Failed to initialize display engine: 0x1 (x)")] == [
        "nvidia/display-error"
    ]
    assert [r for r, _ in _rules_on("[drm:nv_drm_load [nvidia_drm]] *ERROR* [nvidia-drm] [GPU ID 0x00000100] x")] == [
        "nvidia/display-error"
    ]
    assert [r for r, _ in _rules_on("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 22013, SOE HALTED")] == [
        "nvidia/sxid-fallback"
    ]
    peermem = "nvidia-peermem nv_get_p2p_free_callback:144 ERROR nv_get_p2p_free_callback -- invalid page_table"
    assert [r for r, _ in _rules_on(peermem)] == ["nvidia/peermem-invalid-context"]


def test_the_extract_names_the_driver_release_it_was_read_from() -> None:
    first = Path(GEN.EXTRACT).read_text().splitlines()[0]
    assert first.startswith(f"# {GEN.SOURCE}: ")


def test_a_benign_retry_notice_is_excluded_and_no_rule_fires_on_it() -> None:
    (site,) = [
        s for s in printsites.read_extract(Path(GEN.EXTRACT).read_text()) if "retry with default page size" in s.text
    ]
    assert any(e.benign and e.matches(site) for e in GEN.EXCLUSIONS)
    assert _rules_on(printsites.render(site)[0]) == []
