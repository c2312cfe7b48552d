"""An example third-party check: is the kernel tainted by a fault?

``/proc/sys/kernel/tainted`` is a bit mask (Linux ``Documentation/admin-guide/tainted-kernels.rst``).
Some bits say the kernel has seen a fault it could not fully handle — a machine check (bit 4, ``M``),
an oops or BUG (bit 7, ``D``), a soft lockup (bit 14, ``L``), a warning (bit 9, ``W``) — others only
say what was loaded (proprietary or unsigned modules). This check reports a PROBLEM for the fault
bits chosen in ``problemBits`` (default M, D and L) and exports the whole mask as a value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.sdk import CheckConfigError, CheckContext, CheckResult, CheckStatus, ConditionSpec, Severity, Value

CONDITION = "KernelTainted"
# bit -> (letter, meaning), for the flags this example names in its messages
FLAGS = {
    0: ("P", "proprietary module loaded"),
    4: ("M", "machine check exception"),
    7: ("D", "kernel died recently (oops or BUG)"),
    9: ("W", "kernel warning"),
    12: ("O", "out-of-tree module loaded"),
    13: ("E", "unsigned module loaded"),
    14: ("L", "soft lockup"),
}
LETTERS = {letter: bit for bit, (letter, _) in FLAGS.items()}
DEFAULT_PROBLEM_BITS = ("M", "D", "L")


class KernelTaintedCheck:
    """A check is any object with name, interval, timeout, conditions and run(); this one is a class."""

    interval = 60.0
    timeout = 5.0

    def __init__(self, *, name: str, context: CheckContext, options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - {"problemBits", "procRoot"})
        if unknown:
            raise CheckConfigError(unknown[0], "unknown option (known: problemBits, procRoot)")
        letters = options.get("problemBits", list(DEFAULT_PROBLEM_BITS))
        if not isinstance(letters, list) or not all(isinstance(x, str) and x in LETTERS for x in letters):
            raise CheckConfigError(
                "problemBits", f"must be a list of taint letters from {sorted(LETTERS)}, got {letters!r}"
            )
        self.name = name
        self._bits = tuple(LETTERS[x] for x in letters)
        self._path = Path(options.get("procRoot", "/proc")) / "sys" / "kernel" / "tainted"
        self.conditions: Sequence[ConditionSpec] = (
            ConditionSpec(type=CONDITION, reason="KernelNotTainted", message="no fault taint flag set", source=name),
        )

    def run(self) -> list[CheckResult]:
        try:
            text = self._path.read_text().strip()
            mask = int(text)
        except OSError as exc:  # our trouble, not the node's
            return [self._unknown(f"cannot read {self._path}: {exc.strerror or exc}")]
        except ValueError:
            return [self._unknown(f"{self._path} holds {text[:40]!r}, not a number")]
        value = Value(name="kernel_taint_mask", value=float(mask))
        faults = [b for b in self._bits if mask & (1 << b)]
        if not faults:
            return [
                CheckResult(
                    status=CheckStatus.OK,
                    condition=CONDITION,
                    reason="KernelNotTainted",
                    message=f"taint mask {mask}: no fault flag",
                    values=(value,),
                )
            ]
        names = ", ".join(f"{FLAGS[b][0]} ({FLAGS[b][1]})" for b in faults)
        return [
            CheckResult(
                status=CheckStatus.PROBLEM,
                condition=CONDITION,
                reason="KernelTaintedByFault",
                message=f"taint mask {mask}: {names}",
                severity=Severity.ERROR,
                values=(value,),
            )
        ]

    def _unknown(self, message: str) -> CheckResult:
        return CheckResult(
            status=CheckStatus.UNKNOWN, condition=CONDITION, reason="KernelTaintUnreadable", message=message
        )
