"""Print sites of the NVIDIA kernel modules other than NVRM (issue 38): sites-modules.yaml from sites-modules.tsv.

    git -C open-gpu-kernel-modules archive HEAD kernel-open src/common src/nvidia-modeset | tar -x -C /tmp/nvidia-src
    python plugins/nvidia/generate_modules.py extract /tmp/nvidia-src > plugins/nvidia/sites-modules.tsv
    python plugins/nvidia/generate_modules.py generate plugins/nvidia/sites-modules.tsv \\
        > plugins/nvidia/sites-modules.yaml

(the extract's header names the tree; say which release it is by editing ``SOURCE`` below when the tree
is a new one). The modules, each with the prefix its print helper writes:

- nvidia-uvm: ``UVM_ERR_PRINT`` and its forms print ``nvidia-uvm: <file>:<line> <function>[pid:<n>] ``
  before the message (uvm_common.h), only when the ``uvm_debug_prints`` parameter is set (it is not by
  default: an operator turned it on to see them); ``UVM_ASSERT_RELEASE`` (on in release builds unless
  ``uvm_release_asserts=0``) prints ``Assert failed, condition <expr> not true``. ``UVM_ASSERT`` is
  compiled only into debug builds: not listed.
- nvidia-drm: ``NV_DRM_LOG_ERR`` / ``NV_DRM_DEV_LOG_ERR`` are ``DRM_ERROR("[nvidia-drm] [GPU ID 0x%08x] ...")``,
  printed by the kernel as ``[drm:<function>] *ERROR* [nvidia-drm] ...``.
- nvidia-modeset: ``nvEvoLog``/``nvEvoLogDev``/``nvEvoLogDisp`` at ``EVO_LOG_ERROR`` print
  ``nvidia-modeset: ERROR: [GPU:<n>: ]<message>`` (nvkms-utils.c nvVEvoLog, nvidia-modeset-linux.c nvkms_log);
  their ``*Debug`` forms exist only in debug builds.
- nvidia-peermem: ``peer_err`` prints ``nvidia-peermem <function>:<line> ERROR <message>``.
- nvidia-nvswitch: ``NVSWITCH_PRINT_SXID`` prints ``nvidia-nvswitch<n>: SXid (PCI:<bdf>): <sxid>, ...``
  (nvidia-monitor.yaml's SXid rules read those); linux_nvswitch.c prints with the device's name,
  ``nvidia-nvswitch<n>``. ``NVSWITCH_PRINT`` is compiled only into debug builds: not listed.
- nvidia.ko's own non-NVRM prints: ``nvidia-nvlink: `` (nvlink_print), the SPDM crypto helpers, the
  kthread queue's WARNs. Its NVRM prints are plugins/nvidia/generate_rules.py's (nvrm-family.yaml).

Every error-level print no specific rule of nvidia-monitor.yaml speaks for (its display, peermem and SXid
rules) is a warning Event ``NvidiaModuleError``: the module does not say what the failure costs the node
(a UVM channel that could not be created, a mapping that failed, a switch interrupt that could not be
set up), so it sets no condition.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "kernel"))
import printsites  # noqa: E402
from printsites import Call, Exclusion, Family, Spec  # noqa: E402

sys.path.remove(str(HERE.parent / "kernel"))

EXTRACT = HERE / "sites-modules.tsv"
PACK = HERE / "sites-modules.yaml"
DRIVER = "nvidia"
SOURCE = "NVIDIA/open-gpu-kernel-modules 595.45.04 (df1c9a3de2be4b130f4fc7680f7198193d8ac6ad)"

_UVM = "nvidia-uvm: %s:%u %s[pid:%d] "  # UVM_PRINT_FUNC_PREFIX: kbasename(__FILE__), __LINE__, __FUNCTION__, pid
_UVM_ASSERT = _UVM + "Assert failed, condition %s not true"
_DRM = "[drm:%ps] *ERROR* [nvidia-drm] "  # DRM_ERROR -> __drm_err (drivers/gpu/drm/drm_print.c)
_MODESET = "nvidia-modeset: ERROR: "  # nvkms_log(NVKMS_LOG_LEVEL_ERROR, ...)
_EVO_LEVELS = {"EVO_LOG_ERROR": "err", "EVO_LOG_WARN": "warning", "EVO_LOG_INFO": "info"}
_SXID = "nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, "  # NVSWITCH_PRINT_SXID, NVLINK_PCI_DEV_FMT
_NVSWITCH_LEVELS = {
    "NVSWITCH_DBG_LEVEL_ERROR": "err",
    "NVSWITCH_DBG_LEVEL_WARN": "warning",
    "NVSWITCH_DBG_LEVEL_INFO": "info",
}
_NVLINK_LEVELS = {
    "NVLINK_DBG_ERRORS": "err",
    "NVLINK_DBG_WARNINGS": "warning",
    "NVLINK_DBG_USERERRORS": "notice",
    "NVLINK_DBG_INFO": "info",
    "NVLINK_DBG_SETUP": "debug",
}

SPEC = Spec(
    name="nvidia-modules",
    paths=[
        "kernel-open/nvidia-uvm/*.c",
        "kernel-open/nvidia-uvm/*.h",
        "kernel-open/nvidia-drm/*.c",
        "kernel-open/nvidia-modeset/*.c",
        "src/nvidia-modeset/src/*.c",
        "src/nvidia-modeset/src/dp/*.cpp",
        "src/nvidia-modeset/kapi/src/*.c",
        "kernel-open/nvidia-peermem/*.c",
        "kernel-open/nvidia/*.c",
        "src/common/nvswitch/kernel/*.c",
        "src/common/nvswitch/kernel/*/*.c",
        "src/common/nvswitch/kernel/*/*/*.c",
        "src/common/nvswitch/kernel/inc/*.h",
    ],
    calls={
        "UVM_ERR_PRINT": Call(level="err", fmt_arg=0, prefix="none", head=_UVM),
        "UVM_ERR_PRINT_RL": Call(level="err", fmt_arg=0, prefix="none", head=_UVM),
        "UVM_ERR_PRINT_ALWAYS": Call(level="err", fmt_arg=0, prefix="none", head=_UVM),
        "UVM_ERR_PRINT_ALWAYS_RL": Call(level="err", fmt_arg=0, prefix="none", head=_UVM),
        "UVM_ERR_PRINT_NV_STATUS": Call(level="err", fmt_arg=0, prefix="none", head=_UVM + "ERROR: %s : "),
        "UVM_ASSERT_MSG_RELEASE": Call(level="err", fmt_arg=1, prefix="none", head=_UVM_ASSERT + ": "),
        # No format of its own: the text is the head alone (see extract()).
        "UVM_ASSERT_RELEASE": Call(level="err", fmt_arg=0, prefix="none", head=_UVM_ASSERT),
        # UVM_PANIC_MSG(fmt) is panic("%s:%u %s[pid:%d]: " fmt): a panic site (see extract()).
        "UVM_PANIC_MSG": Call(level="emerg", fmt_arg=0, prefix="none", head="%s:%u %s[pid:%d]: "),
        "UVM_PANIC_ON_MSG": Call(level="emerg", fmt_arg=1, prefix="none", head="%s:%u %s[pid:%d]: "),
        "NV_DRM_LOG_ERR": Call(level="err", fmt_arg=0, prefix="none", head=_DRM),
        "NV_DRM_DEV_LOG_ERR": Call(level="err", fmt_arg=1, prefix="none", head=_DRM + "[GPU ID 0x%08x] "),
        "nvEvoLog": Call(level=None, fmt_arg=1, prefix="none", level_arg=0, level_names=_EVO_LEVELS, head=_MODESET),
        "nvEvoLogDev": Call(
            level=None, fmt_arg=2, prefix="none", level_arg=1, level_names=_EVO_LEVELS, head=_MODESET + "GPU:%d: "
        ),
        "nvEvoLogDisp": Call(
            level=None, fmt_arg=2, prefix="none", level_arg=1, level_names=_EVO_LEVELS, head=_MODESET + "GPU:%d: "
        ),
        "nvkms_log": Call(
            level=None,
            fmt_arg=2,
            prefix="none",
            level_arg=0,
            level_names={"NVKMS_LOG_LEVEL_ERROR": "err", "NVKMS_LOG_LEVEL_WARN": "warning"},
            head=_MODESET + "{1}",
        ),
        "peer_err": Call(level="err", fmt_arg=0, prefix="none", head="nvidia-peermem %s:%d ERROR "),
        "NVSWITCH_PRINT_SXID": Call(level="err", fmt_arg=2, prefix="none", head=_SXID),
        "NVSWITCH_PRINT_SXID_NO_BBX": Call(level="err", fmt_arg=2, prefix="none", head=_SXID),
        "nvswitch_os_print": Call(level=None, fmt_arg=1, prefix="none", level_arg=0, level_names=_NVSWITCH_LEVELS),
        "nvlink_print": Call(
            level=None, fmt_arg=1, prefix="none", level_arg=0, level_names=_NVLINK_LEVELS, head="nvidia-nvlink: "
        ),
    },
    macros={"NVLINK_PCI_DEV_FMT": "%04x:%02x:%02x.%x", "NVIDIA_UVM_PRETTY_PRINTING_PREFIX": "nvidia-uvm: "},
)

# linux_nvswitch.c prints "%s: ..." with nvswitch_dev->name, which nvswitch_probe() sets to
# NVSWITCH_DRIVER_NAME "%d" ("nvidia-nvswitch%d"): the site's text carries the name.
_NAMED = {"kernel-open/nvidia/linux_nvswitch.c": ("%s:", "nvidia-nvswitch%d:")}


def extract(root: Path) -> list[printsites.Site]:
    """printsites.extract, with what the scanner cannot see from the call alone written in."""
    sites = []
    for site in printsites.extract(root, SPEC):
        path = site.where.split(":")[0]
        if site.call == "UVM_ASSERT_RELEASE":
            site = replace(site, text=_UVM_ASSERT + "\\n")  # the argument is the condition, not a format
        elif site.call.startswith("UVM_PANIC"):
            site = replace(site, call="panic")  # the kernel prints "Kernel panic - not syncing: ..."
        elif path in _NAMED and site.text.startswith(_NAMED[path][0]):
            site = replace(site, text=_NAMED[path][1] + site.text.removeprefix(_NAMED[path][0]))
        sites.append(site)
    return sites


FAMILY = Family(name="nvidia-modules", reason="NvidiaModuleError", repository="NVIDIA/open-gpu-kernel-modules")

# Sites no rule of this pack speaks for, and why. A multi-record report is one finding: its header's.
EXCLUSIONS: list[Exclusion] = [
    # The print inside a wrapper's own #define (its format is the macro's argument: {fmt}, {_fmt}, {FMT},
    # {msg}); every caller of the wrapper is a site of its own in this list.
    Exclusion(
        pattern=r"\{(_?fmt|FMT|msg)\}(\\n)?$",
        where=r"(uvm_common\.h|common_nvswitch\.h|nvidia-peermem\.c):",
        reason="the print inside a wrapper macro's definition: each caller is listed as a site",
    ),
    # UVM's built-in tests run only when the module is loaded with uvm_enable_builtin_tests=1, which
    # uvm_common.c says must not be set outside testing (it breaks security).
    Exclusion(
        pattern=r".",
        where=r"^kernel-open/nvidia-uvm/uvm_\w+_test\.c:",
        reason="a UVM built-in test (runs only with uvm_enable_builtin_tests=1, never in production)",
    ),
    # uvm_lock.c's lock-order checks (__uvm_record_lock, __uvm_check_locked, ...) are called from
    # UVM_ASSERT_MSG in uvm_lock.h's #if UVM_IS_DEBUG() block and from uvm_lock_test.c: a release
    # build never runs them.
    Exclusion(
        pattern=r".",
        where=r"^kernel-open/nvidia-uvm/uvm_lock\.c:",
        reason="UVM lock-order tracking: called only from debug-build asserts and the built-in tests",
    ),
    # uvm_channel_check_errors(): "Detected a channel error, channel %s GPU %s" is the finding; the
    # "Channel error likely caused by ..." record that follows names the push or GPFIFO entry.
    Exclusion(
        pattern=r"Channel error likely caused by ",
        where=r"^kernel-open/nvidia-uvm/uvm_channel\.c:",
        reason="a detail record of a UVM channel error (the 'Detected a channel error' record is the finding)",
    ),
    # uvm_rm_mem_alloc(): a sysmem allocation with the big page size failed and is retried with the
    # default one; the retry's own failure is the next site (uvm_rm_mem.c "nvUvmInterfaceMemoryAlloc%s()
    # failed"). Printed (with uvm_debug_prints on) wherever big pages are short, on healthy machines too.
    Exclusion(
        pattern=r"alloc failed with big page size, retry with default page size",
        reason="an informational retry notice printed at error level (the retry's failure has its own site)",
        benign=True,
    ),
    # _nvswitch_init_irq(): after "No supported interrupt mechanism was found. This device supports:"
    # one record per mechanism the device has (MSI-X, MSI, PCI Pin): the list of that finding.
    Exclusion(
        pattern=r"^nvidia-nvswitch%d: (MSI-X|MSI|PCI Pin)\\n$",
        where=r"^kernel-open/nvidia/linux_nvswitch\.c:",
        reason="a detail record of 'No supported interrupt mechanism was found' (that record is the finding)",
    ),
    # nvswitch_init(): printk(KERN_ERR, "nvidia-nvswitch: Major: %d Minor: %d\n", ...) passes KERN_ERR as
    # the format and the message as an argument (a comma too many): the record is empty.
    Exclusion(
        pattern=r"^$",
        where=r"^kernel-open/nvidia/linux_nvswitch\.c:",
        reason="printk(KERN_ERR, ...) with the message as an argument: prints an empty record (a source bug)",
    ),
    # nvswitch_os_assert_log(): the text of a failed NVSWITCH_ASSERT, then WARN_ON(1): the WARNING record
    # (kernel/warning) is the report's finding.
    Exclusion(
        pattern=r"^\{fmt_printk\}$",
        where=r"^kernel-open/nvidia/linux_nvswitch\.c:",
        reason="an NVSwitch assert's message: the WARN_ON(1) after it gives the WARNING record, the finding",
    ),
    # os_log_error(): printk(KERN_ERR "%s", ...) of a caller's preformatted text; nothing in this release
    # calls it (declared in os-interface.h for the RM, which logs through nv_printf and NV_PRINTF).
    Exclusion(
        pattern=r"^%s$",
        where=r"^kernel-open/nvidia/os-interface\.c:",
        reason='os_log_error(): prints a caller\'s text ("%s"); no caller in this release',
    ),
    # nv_drm_master_set() (nvidia-drm-drv.c) runs when a DRM client becomes master (a compositor, an X
    # server, a second one started beside the first); it asks NVKMS for modeset ownership, and another
    # client already holding it makes the request fail: the new client gets -EINVAL and the one that owns
    # the display goes on. Two display clients on one GPU, not a fault of the GPU or the driver.
    Exclusion(
        pattern=r"\*ERROR\* \[nvidia-drm\] \[GPU ID 0x%08x\] Failed to grab (NVKMS )?modeset ownership$",
        reason="a DRM client refused modeset ownership that another client holds (nv_drm_master_set)",
        benign=True,
    ),
]

# Sites a specific rule of nvidia-monitor.yaml already speaks for: no rule here, so a line is reported once.
LEAVE: list[Exclusion] = [
    Exclusion(pattern=r"^nvidia-modeset: ERROR: ", reason="nvidia-monitor.yaml nvidia/display-error"),
    Exclusion(pattern=r"\*ERROR\* \[nvidia-drm\] ", reason="nvidia-monitor.yaml nvidia/display-error"),
    Exclusion(pattern=r"SXid \(PCI:", reason="nvidia-monitor.yaml nvidia/sxid-* (NVSwitchSXid)"),
]


def generate(sites: list[printsites.Site]) -> str:
    return printsites.family_pack(
        family=FAMILY,
        sites=sites,
        exclusions=EXCLUSIONS,
        leave=LEAVE,
        generator="plugins/nvidia/generate_modules.py",
        extract_path="plugins/nvidia/sites-modules.tsv",
    )


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "extract":
        sys.stdout.write(printsites.write_extract(SPEC, SOURCE, extract(Path(argv[1]))))
        return 0
    return printsites.main(argv, spec=SPEC, generate=generate)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
