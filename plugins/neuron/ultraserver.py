"""The ``neuron-ultraserver`` check: a Trn2 UltraServer node's placement labels, present and consistent.

Labels (Neuron docs ``containers/how-to/how-to-ultraserver.rst``):

- ``neuron.amazonaws.com/ultraserver-mode``: the node configurations offered, ``_``-joined from 1, 2, 4
  (example ``1_2_4``).
- ``...-server-id-2`` / ``...-node-id-2``: the 2-node group id, and this node's index in it (0..1).
- ``...-server-id-4`` / ``...-node-id-4``: the 4-node UltraServer id, and this node's index (0..3).

A mode that includes 2 (or 4) needs both labels of that configuration; labels of a configuration the mode
does not name are inconsistent too. Where the driver exposes UltraServer attributes in sysfs (globbed:
their names are not documented, so any file named ``*ultraserver*`` is read, and classified by name as
mode / server id / node id), their values must agree with the labels; ``busy`` (node election in
progress) is UNKNOWN, never a fault. Label problems are ``error`` severity: the devices still work, the
placement of multi-node work does not.

Values carry ``ultraserver_id`` so an alarm can add up a whole UltraServer (4 nodes x 16 devices).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.sdk import CheckContext, CheckResult, CheckStatus, ConditionSpec, Severity, Value

from .devices import DEFAULT_SYSFS_GLOBS, NEVER_READ, DeviceScanError, discover, opt_bool, opt_strings, reject_unknown

CONDITION = "NeuronUltraServer"
HEALTHY_REASON = "NeuronUltraServerOk"
HEALTHY_MESSAGE = "UltraServer labels present and consistent"

PREFIX = "neuron.amazonaws.com/ultraserver-"
MODE_LABEL = PREFIX + "mode"
GROUP_SIZES: tuple[int, ...] = (2, 4)  # the multi-node configurations (1 = this node alone)
VALID_MODES = frozenset({1, *GROUP_SIZES})
DEFAULT_INSTANCE_TYPES: tuple[str, ...] = ("trn2u.*",)
DEFAULT_ATTRIBUTE_GLOBS: tuple[str, ...] = (
    "devices/virtual/neuron_device/*ultraserver*",
    "devices/virtual/neuron_device/neuron*/*ultraserver*",
    "devices/virtual/neuron_device/neuron*/info/*ultraserver*",
)
BUSY = "busy"


def server_label(size: int) -> str:
    return f"{PREFIX}server-id-{size}"


def node_label(size: int) -> str:
    return f"{PREFIX}node-id-{size}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Membership:
    """This node's place in one UltraServer configuration."""

    nodes: int
    server_id: str
    node_id: int


@dataclass(frozen=True, kw_only=True, slots=True)
class LabelVerdict:
    missing: bool  # no ultraserver label at all
    problems: tuple[str, ...]
    modes: frozenset[int]
    memberships: tuple[Membership, ...]


def parse_mode(value: str) -> frozenset[int] | None:
    """``1_2_4`` → {1, 2, 4}; None when it is not such a list."""
    parts = value.strip().split("_")
    if not all(p.isdigit() for p in parts):
        return None
    modes = frozenset(int(p) for p in parts)
    return modes if modes <= VALID_MODES else None


def judge_labels(labels: Mapping[str, str]) -> LabelVerdict:
    """Whether the node's UltraServer labels are present and agree with each other."""
    ours = {k: v for k, v in labels.items() if k.startswith(PREFIX)}
    if not ours:
        return LabelVerdict(missing=True, problems=(f"no {PREFIX}* label",), modes=frozenset(), memberships=())
    problems: list[str] = []
    mode_text = ours.get(MODE_LABEL)
    modes = parse_mode(mode_text) if mode_text is not None else None
    if mode_text is None:
        problems.append(f"{MODE_LABEL} label missing")
    elif modes is None:
        problems.append(f"{MODE_LABEL}={mode_text!r} is not a list of 1, 2 and 4 joined by '_'")
    memberships = []
    for size in GROUP_SIZES:
        server, node = ours.get(server_label(size), "").strip(), ours.get(node_label(size))
        if modes is not None and size not in modes:
            if server or node is not None:
                problems.append(f"{size}-node labels set but {MODE_LABEL}={mode_text} has no {size}-node configuration")
            continue
        if modes is None and not server and node is None:
            continue
        if not server:
            problems.append(f"{server_label(size)} missing")
        if node is None:
            problems.append(f"{node_label(size)} missing")
        elif not (node.strip().isdigit() and int(node) < size):
            problems.append(f"{node_label(size)}={node!r} is not in 0..{size - 1}")
        elif server:
            memberships.append(Membership(nodes=size, server_id=server, node_id=int(node)))
    return LabelVerdict(
        missing=False, problems=tuple(problems), modes=modes or frozenset(), memberships=tuple(memberships)
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SysfsReport:
    """UltraServer attributes the driver shows, by kind: ``mode``, ``server_id``, ``node_id``."""

    values: Mapping[str, frozenset[str]] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()

    @property
    def busy(self) -> bool:
        return any(v.lower() == BUSY for vs in self.values.values() for v in vs)


def attribute_kind(name: str) -> str | None:
    lowered = name.lower()
    if "mode" in lowered:
        return "mode"
    if "server" in lowered and "id" in lowered:
        return "server_id"
    if "node" in lowered and "id" in lowered:
        return "node_id"
    return None


def read_attributes(sys_root: Path, globs: Sequence[str]) -> SysfsReport:
    """Read-only scan of the UltraServer attributes the globs find (a directory hit: its files)."""
    files: list[Path] = []
    for pattern in globs:
        for hit in sorted(sys_root.glob(pattern)):
            if hit.is_dir():
                files.extend(sorted(p for p in hit.iterdir() if p.is_file()))
            elif hit.is_file():
                files.append(hit)
    values: dict[str, set[str]] = {}
    unreadable = []
    for path in files:
        kind = attribute_kind(path.name) or attribute_kind(path.parent.name)
        if kind is None or path.name in NEVER_READ:
            continue
        try:
            with open(path, "rb") as f:
                text = f.read(256).decode("utf-8", errors="replace").strip()
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        if text:
            values.setdefault(kind, set()).add(text)
    return SysfsReport(values={k: frozenset(v) for k, v in values.items()}, unreadable=tuple(unreadable))


def _norm_id(value: str) -> str:
    text = value.strip().lower()
    return text[2:] if text.startswith("0x") else text


def compare_sysfs(verdict: LabelVerdict, report: SysfsReport) -> list[str]:
    """Where the driver's UltraServer attributes disagree with the labels (``busy`` is handled by the caller)."""
    problems = []
    label_servers = {_norm_id(m.server_id) for m in verdict.memberships}
    for value in sorted(report.values.get("server_id", ())):
        if label_servers and _norm_id(value) not in label_servers:
            problems.append(f"sysfs UltraServer id {value!r} matches no server-id label")
    label_nodes = {m.node_id for m in verdict.memberships}
    for value in sorted(report.values.get("node_id", ())):
        if label_nodes and value.isdigit() and int(value) not in label_nodes:
            problems.append(f"sysfs UltraServer node id {value} matches no node-id label")
    for value in sorted(report.values.get("mode", ())):
        numbers = {int(n) for n in re.findall(r"\d+", value)}
        if verdict.modes and numbers and not numbers <= verdict.modes:
            problems.append(f"sysfs UltraServer mode {value!r} is not offered by {MODE_LABEL}")
    return problems


class NeuronUltraServerCheck:
    """``neuron-ultraserver``: on Trn2 UltraServer nodes, placement labels present and consistent."""

    interval = 60.0
    timeout = 10.0
    OPTIONS = ("instanceTypes", "attributeGlobs", "compareSysfs", "sysfsGlobs")

    def __init__(self, *, name: str, context: CheckContext, options: Mapping[str, Any]) -> None:
        reject_unknown(options, self.OPTIONS)
        self.name = name
        self.context = context
        self.instance_types = tuple(p.lower() for p in opt_strings(options, "instanceTypes", DEFAULT_INSTANCE_TYPES))
        self.attribute_globs = opt_strings(options, "attributeGlobs", DEFAULT_ATTRIBUTE_GLOBS)
        self.compare = opt_bool(options, "compareSysfs", True)
        self.device_globs = opt_strings(options, "sysfsGlobs", DEFAULT_SYSFS_GLOBS)
        self.conditions = (
            ConditionSpec(
                type=CONDITION, reason=HEALTHY_REASON, message=HEALTHY_MESSAGE, accelerator=True, source=name
            ),
        )

    def _result(self, status: CheckStatus, reason: str, message: str, **kw: Any) -> CheckResult:
        return CheckResult(status=status, condition=CONDITION, reason=reason, message=message, **kw)

    def _values(self, verdict: LabelVerdict, *, consistent: bool) -> tuple[Value, ...]:
        """Per configuration this node is in: ``neuron_ultraserver_node`` (1 = labels consistent, 0 = not)
        and ``neuron_ultraserver_devices`` (usable devices), both labelled with the UltraServer id."""
        ctx = self.context
        try:
            devices: int | None = len(
                discover(sys_root=ctx.sys_root, dev_root=ctx.dev_root, globs=self.device_globs).usable
            )
        except DeviceScanError:
            devices = None
        values = []
        for m in verdict.memberships:
            labels = {"ultraserver_id": m.server_id, "nodes": str(m.nodes), "node_id": str(m.node_id)}
            values.append(Value(name="neuron_ultraserver_node", value=1 if consistent else 0, labels=labels))
            if devices is not None:
                values.append(Value(name="neuron_ultraserver_devices", value=devices, labels=labels))
        return tuple(values)

    def run(self) -> list[CheckResult]:
        ctx = self.context
        instance_type = ctx.instance_type()
        labels = ctx.node_labels()
        ours = labels is not None and any(k.startswith(PREFIX) for k in labels)
        if instance_type is not None and not any(
            fnmatch.fnmatch(instance_type.lower(), p) for p in self.instance_types
        ):
            return [
                self._result(CheckStatus.OK, "NotUltraServer", f"not an UltraServer instance type ({instance_type})")
            ]
        if instance_type is None and not ours:
            return [
                self._result(
                    CheckStatus.OK,
                    "NotUltraServer",
                    "not an UltraServer node (instance type unknown, no UltraServer labels)",
                )
            ]
        if labels is None:
            return [self._result(CheckStatus.UNKNOWN, "NodeLabelsUnknown", "node labels not known (standalone?)")]

        verdict = judge_labels(labels)
        if verdict.problems:
            reason = "NeuronUltraServerLabelsMissing" if verdict.missing else "NeuronUltraServerLabelsInconsistent"
            return [
                self._result(
                    CheckStatus.PROBLEM,
                    reason,
                    "; ".join(verdict.problems),
                    severity=Severity.ERROR,
                    values=self._values(verdict, consistent=False),
                )
            ]
        values = self._values(verdict, consistent=True)
        notes: list[str] = []
        if self.compare:
            report = read_attributes(ctx.sys_root, self.attribute_globs)
            notes.extend(f"unreadable: {u}" for u in report.unreadable)
            if report.busy:
                return [
                    self._result(
                        CheckStatus.UNKNOWN,
                        "NeuronUltraServerBusy",
                        "sysfs UltraServer attributes read 'busy' (node election in progress)",
                        values=values,
                    )
                ]
            mismatches = compare_sysfs(verdict, report)
            if mismatches:
                return [
                    self._result(
                        CheckStatus.PROBLEM,
                        "NeuronUltraServerMismatch",
                        "; ".join(mismatches + notes),
                        severity=Severity.ERROR,
                        values=self._values(verdict, consistent=False),
                    )
                ]
        groups = (
            ", ".join(f"{m.nodes}-node {m.server_id} node {m.node_id}" for m in verdict.memberships) or "1-node only"
        )
        modes = "_".join(str(m) for m in sorted(verdict.modes))
        message = f"UltraServer labels consistent (mode {modes}; {groups})" + "".join(f"; {n}" for n in notes)
        return [self._result(CheckStatus.OK, HEALTHY_REASON, message, values=values)]
