"""Which remedy the built-in recovery policy tries first for a node-level NVIDIA Xid.

NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) gives each code an immediate action; the
built-in rule pack raises condition ``GpuXid`` (reason ``GpuXid<code>``) for the codes that need more
than restarting the application. The catalog's action decides the first rung:

* ``RESET_GPU``, ``RESTART_BM``, ``RESTART_VM`` (and the workflows that end in a GPU reset: 48 alone,
  74 and the fatal NVLink5 codes 144-150, the recovery-action change 154): **reboot**, then replace
  when the same Xid comes back within the observation window (a GPU that falls off the bus again after
  a reboot is broken hardware).
* ``CONTACT_SUPPORT`` and ``CHECK_MECHANICALS`` (hardware), and 64, the row-remap *failure* (memory
  that can no longer be repaired; the catalog says RESET_GPU, investigation CONTACT_SUPPORT): **replace**.
* Anything else the pack raises (78 ``UPDATE_SWFW``, 159 ``CHECK_UVM``, the ``...Repeated`` reasons of
  application-level codes): cordon and report only.

The device first (``scope: device``, :mod:`agent.recovery.devicescope`): the ``RESET_GPU`` codes that are
one GPU's fault, and the *contained* memory error 94 (``CONTAINED_ERROR``: the catalog says RESTART_APP;
the pack raises no condition for it today), are fenced and their pods drained first, the reboot ladder
following on a repeat. Memory that is uncorrectable stays at the node as before: 95
(``UNCONTAINED_ERROR``, RESET_GPU), 140 (``UNRECOVERABLE_ECC_ERROR_ESCAPE``, RESET_GPU), 48 (``GPU_ECC_DBE``,
its own workflow) and 64 (the row-remap failure, replace); so do 79 (fallen off the bus, RESTART_BM: the
GPU is gone from the bus, nothing on the node can use it again before a reboot), 151 (RESTART_VM) and the
NVLink workflows (74, 144-150: a link has two ends).

``tests/recovery/test_recovery_xid.py`` checks these lists against the catalog kept in shared/reference.
"""

from __future__ import annotations

RESET_GPU = (46, 62, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158)
RESTART_BM = (79,)
RESTART_VM = (151,)
RESET_WORKFLOWS = (48, 74, 144, 145, 146, 147, 148, 149, 150, 154)
REBOOT_FIRST = tuple(sorted(RESET_GPU + RESTART_BM + RESTART_VM + RESET_WORKFLOWS))
ROW_REMAP_FAILURE = 64
REPLACE = (54, ROW_REMAP_FAILURE, 142)  # CHECK_MECHANICALS, the row-remap failure, CONTACT_SUPPORT
UNCORRECTABLE_MEMORY = (48, ROW_REMAP_FAILURE, 95, 140)  # at the node: the GPU's memory cannot be trusted
CONTAINED = (94,)  # CONTAINED_ERROR: the error stayed in the faulting context
DEVICE_FIRST = tuple(sorted({*RESET_GPU, *CONTAINED} - set(UNCORRECTABLE_MEMORY)))


def reasons(codes: tuple[int, ...]) -> tuple[str, ...]:
    """The ``GpuXid`` condition reasons of ``codes``, as the NVIDIA rule pack names them."""
    return tuple(f"GpuXid{code}" for code in codes)
