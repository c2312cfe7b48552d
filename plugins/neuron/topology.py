"""Which sets of Neuron devices one workload may get (the Neuron scheduler extension's rules), and the
``neuron-allocation`` check that exports how much of that survives on the healthy devices.

Rules (Neuron docs ``deploy/infrastructure/scheduler.rst``, ``inf1/inf2/trn1-arch``):

- ring (Inf1, Inf2; NeuronLink ring): any number of devices, but only a contiguous run of indices
  (``0,1,2`` yes, ``0,2,4`` no). Assumption: contiguity is by index without wrap-around (``11,0`` is not
  a run), the way the scheduler documentation words it.
- 2D torus (trn1.32xlarge, trn1n.32xlarge: 16 devices): only 1, 4, 8 or all 16 devices. The documentation
  names the sizes, not the sets. Assumption: aligned groups, ``{0-3}, {4-7}, {8-11}, {12-15}`` for 4 and
  ``{0-7}, {8-15}`` for 8. Trn2 (16 devices in a 4x4 torus, rows of 4 consecutive indices per the
  ``neuron-ls --topology`` example) has no documented rule; it is treated as a torus the same way.
- any: every subset (a topology the tables do not know, when configured so).

Everything above the check class is a pure function of its arguments.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agent.sdk import CheckConfigError, CheckContext, CheckResult, CheckStatus, ConditionSpec, Value

from .devices import (
    DEFAULT_SYSFS_GLOBS,
    DeviceScanError,
    discover,
    opt_count,
    opt_instance_counts,
    opt_strings,
    reject_unknown,
)

TORUS_SIZES: tuple[int, ...] = (1, 4, 8, 16)
RING_FAMILIES = frozenset({"inf1", "inf2"})
TORUS_FAMILIES = frozenset({"trn1", "trn1n", "trn2", "trn2n", "trn2u"})


class Topology(enum.StrEnum):
    RING = "ring"
    TORUS = "torus"
    ANY = "any"


def topology_for(instance_type: str | None, total: int) -> Topology | None:
    """The interconnect rule for an instance type; None when the tables do not know it."""
    if total <= 1:
        return Topology.ANY
    if not instance_type:
        return None
    family = instance_type.lower().split(".", 1)[0]
    if family in RING_FAMILIES:
        return Topology.RING
    if family in TORUS_FAMILIES and total == TORUS_SIZES[-1]:
        return Topology.TORUS
    return None


def aligned_groups(total: int, sizes: Sequence[int] = TORUS_SIZES) -> dict[int, list[range]]:
    """Size → the aligned device groups of that size (``{4: [range(0, 4), range(4, 8), ...]}``)."""
    return {
        s: [range(start, start + s) for start in range(0, total, s)] for s in sizes if s <= total and total % s == 0
    }


def is_allowed(topology: Topology, devices: Collection[int], total: int) -> bool:
    """Whether one workload may be given exactly ``devices`` on a node of ``total`` devices."""
    chosen = sorted(set(devices))
    if not chosen or chosen[0] < 0 or chosen[-1] >= total or len(chosen) != len(devices):
        return False
    if topology is Topology.ANY:
        return True
    if topology is Topology.RING:
        return chosen[-1] - chosen[0] + 1 == len(chosen)
    return any(chosen == list(group) for group in aligned_groups(total).get(len(chosen), []))


def longest_run(healthy: Collection[int], total: int) -> int:
    """The longest run of consecutive healthy indices in ``0..total-1``."""
    best = run = 0
    for i in range(total):
        run = run + 1 if i in healthy else 0
        best = max(best, run)
    return best


def free_groups(healthy: Collection[int], total: int) -> dict[int, int]:
    """Torus: size → how many aligned groups of that size are entirely healthy."""
    return {
        size: sum(all(i in healthy for i in group) for group in groups)
        for size, groups in aligned_groups(total).items()
    }


def largest_allocation(topology: Topology, healthy: Collection[int], total: int) -> int:
    """The largest number of devices one workload can still get on the healthy devices."""
    inside = {i for i in healthy if 0 <= i < total}
    if topology is Topology.ANY:
        return len(inside)
    if topology is Topology.RING:
        return longest_run(inside, total)
    return max((size for size, count in free_groups(inside, total).items() if count), default=0)


class NeuronAllocationCheck:
    """``neuron-allocation``: metrics only; the largest allocation the healthy devices still allow."""

    interval = 60.0
    timeout = 10.0
    conditions: tuple[ConditionSpec, ...] = ()
    OPTIONS = ("expectedCount", "instanceTypes", "topology", "sysfsGlobs")

    def __init__(self, *, name: str, context: CheckContext, options: Mapping[str, Any]) -> None:
        reject_unknown(options, self.OPTIONS)
        self.name = name
        self.context = context
        self.expected_option = opt_count(options, "expectedCount")
        self.table = opt_instance_counts(options)
        self.globs = opt_strings(options, "sysfsGlobs", DEFAULT_SYSFS_GLOBS)
        topology = options.get("topology", "auto")
        known = ["auto", *(t.value for t in Topology)]
        if topology not in known:
            raise CheckConfigError(field="topology", message=f"expected one of {', '.join(known)}, got {topology!r}")
        self.topology = None if topology == "auto" else Topology(topology)

    def _ok(self, reason: str, message: str, values: tuple[Value, ...] = ()) -> CheckResult:
        return CheckResult(status=CheckStatus.OK, condition=None, reason=reason, message=message, values=values)

    def run(self) -> list[CheckResult]:
        ctx = self.context
        try:
            healthy = discover(sys_root=ctx.sys_root, dev_root=ctx.dev_root, globs=self.globs).usable
        except DeviceScanError as exc:
            return [
                CheckResult(
                    status=CheckStatus.UNKNOWN, condition=None, reason="NeuronSysfsUnreadable", message=str(exc)
                )
            ]
        instance_type = ctx.instance_type()
        total = self.expected_option
        if total is None and instance_type:
            total = self.table.get(instance_type.lower())
        if total is None:
            total = max(healthy) + 1 if healthy else 0
        if total == 0:
            return [self._ok("NoNeuronDevices", "no Neuron device on this node and none expected")]
        topology = self.topology or topology_for(instance_type, total)
        assumed = ""
        if topology is None:
            topology, assumed = (
                Topology.ANY,
                f" (topology of {instance_type or 'unknown instance type'} unknown: any set)",
            )
        best = largest_allocation(topology, healthy, total)
        values = [
            Value(name="neuron_allocatable_devices_max", value=best),
            Value(name="neuron_allocation_devices_total", value=total),
            Value(name="neuron_allocation_devices_healthy", value=len({i for i in healthy if i < total})),
        ]
        if topology is Topology.TORUS:
            values.extend(
                Value(name="neuron_allocatable_groups", value=count, labels={"size": str(size)})
                for size, count in sorted(free_groups(healthy, total).items())
            )
        message = f"largest allocation possible: {best} of {total} devices ({topology.value}){assumed}"
        return [self._ok("NeuronAllocation", message, tuple(values))]
