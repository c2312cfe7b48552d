"""The catch-all: the kernel's own severity for the records no rule knows (issue 38 §2).

A kernel record carries its level (``/dev/kmsg``, ``dmesg -r``, ``dmesg -x``, a raw kmsg dump). One at
error level or worse (``maxLevel``, 3 = ``err``) that no rule's pattern matched, and that no entry of the
platform-noise list (``benign``) describes, becomes a temporary finding: a Warning Event with reason
``KernelError_<subsystem>`` (:data:`SUBSYSTEMS`), never a condition, never a recovery action. Bounded:
in each ``window`` (of the records' own times, the clock count-in-window rules use) at most one finding
per reason and at most ``maxReasons`` reasons; the records held back are counted, and the next finding
of their reason says how many it stands for (``fields.records``).

The stage runs after the rule engine in :class:`agent.detectors.pipeline.DetectionPipeline` and in
``simulate``; it looks only at the few records the engine left unmatched at error level, so what it
costs a busy log is one scan of the batch for levels. Configured by ``catchAll:`` files (built in:
``plugins/kernel/platform-noise.yaml``); ``enabled: false`` turns it off.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.bounds import bounded_message
from agent.core.configdoc import Document, Problems
from agent.core.durations import parse_duration
from agent.core.errors import ConfigError, ConfigProblem
from agent.core.patterns import RulePattern, compile_anchored
from agent.core.regex import PatternError
from agent.core.types import Finding, RuleType, Severity, Status

RULE = "kernel/catch-all"
SOURCE = "kernel-catch-all"
REASON_PREFIX = "KernelError_"
LEVEL_NAMES = ("emerg", "alert", "crit", "err")  # kernel levels 0-3 (include/linux/kern_levels.h)

# The subsystem a message's first word names -> the reason suffix. Bounded: these and "other", so the
# Event reasons and the metric's label values are at most len(set(SUBSYSTEMS.values())) + 1.
SUBSYSTEMS: Mapping[str, str] = {
    **dict.fromkeys(("iommu", "dmar", "dmar-ir", "amd-vi", "arm-smmu", "arm-smmu-v3", "intel_iommu"), "iommu"),
    **dict.fromkeys(("pci", "pcieport", "aer", "dpc", "pciehp", "pci_bus"), "pci"),
    **dict.fromkeys(("nvme",), "nvme"),
    **dict.fromkeys(("blk_update_request", "buffer", "sd", "scsi", "ata", "ahci", "i/o", "print_req_error"), "block"),
    **dict.fromkeys(("ext4-fs", "xfs", "btrfs", "nfs", "nfsd", "cifs", "lustre", "lustreerror", "device-mapper"), "fs"),
    **dict.fromkeys(("mlx5_core", "mlx5_ib", "ena", "efa", "bonding", "netdev", "ixgbe", "i40e", "ice"), "net"),
    **dict.fromkeys(("nvrm", "nvidia", "nvidia-uvm", "nvidia-drm", "nvidia-modeset", "nvidia-peermem"), "nvidia"),
    **dict.fromkeys(("nvidia-nvswitch", "nvswitch"), "nvidia"),
    **dict.fromkeys(("neuron",), "neuron"),
    **dict.fromkeys(("acpi", "ghes", "apei", "erst", "bert", "hest", "einj"), "acpi"),
    **dict.fromkeys(("[firmware", "dmi", "bios", "efi", "firmware"), "firmware"),
    **dict.fromkeys(("mce", "[hardware", "edac", "thermal", "mce:"), "mce"),
    **dict.fromkeys(("out", "oom", "oom-kill", "memory", "swap"), "mm"),
    **dict.fromkeys(("bug", "warning", "kernel", "rip", "watchdog", "rcu", "general", "oops", "info"), "kernel"),
}
OTHER = "other"
_FIRST_WORD = re.compile(r"\s*(\[?[A-Za-z][A-Za-z0-9_./+-]*)")  # plain re: run on the catch-all's few records only


def subsystem_of(message: str) -> str:
    """The reason suffix of a message: its first word (a driver's name where ``dev_err`` put it there, a
    ``pr_fmt`` tag such as ``iommu:``), looked up in :data:`SUBSYSTEMS`; ``other`` for any other."""
    match = _FIRST_WORD.match(message)
    if match is None:
        return OTHER
    word = match.group(1).lower().rstrip(":")
    found = SUBSYSTEMS.get(word)
    if found is None and word.startswith(("nvidia", "ata", "dm-", "mlx5")):
        found = SUBSYSTEMS.get({"n": "nvidia", "a": "ata", "d": "device-mapper", "m": "mlx5_core"}[word[0]])
    return found or OTHER


def subsystems() -> tuple[str, ...]:
    """Every subsystem the catch-all names (the metric's label values)."""
    return tuple(sorted({*SUBSYSTEMS.values(), OTHER}))


def reasons() -> tuple[str, ...]:
    """Every reason the catch-all can give."""
    return tuple(REASON_PREFIX + s for s in subsystems())


@dataclass(frozen=True, kw_only=True, slots=True)
class NoiseEntry:
    """One entry of the platform-noise list: records it describes are benign, whatever their level."""

    name: str
    pattern: RulePattern  # anchored at the end of the message, as rule patterns are
    why: str
    provenance: tuple[str, ...]  # the print sites: "path:line: format"


@dataclass(frozen=True, kw_only=True, slots=True)
class CatchAllConfig:
    enabled: bool = True
    max_level: int = 3  # err
    window: float = 3600.0
    max_reasons: int = 3  # distinct reasons (so Events) per window
    benign: tuple[NoiseEntry, ...] = ()
    files: tuple[str, ...] = ()


DEFAULT = CatchAllConfig()
MAX_REASONS_LIMIT = 16
MAX_WINDOW = 7 * 86400.0
_KEYS = frozenset({"enabled", "maxLevel", "window", "maxReasons", "benign"})
_ENTRY_KEYS = frozenset({"name", "pattern", "why", "provenance"})
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")


def compile_catch_all(files: Sequence[tuple[Path, Document]]) -> CatchAllConfig:
    """The catch-all from ``catchAll:`` files in order: a setting given later wins, benign lists add up
    (a name given twice: the later entry replaces the earlier). Raises ConfigError naming file, field, line."""
    problems: list[ConfigProblem] = []
    settings: dict[str, Any] = {}
    entries: dict[str, NoiseEntry] = {}
    for path, doc in files:
        col = Problems(file=str(path), doc=doc)
        _read(col, settings, entries)
        problems.extend(col.problems)
    if problems:
        raise ConfigError(problems)
    return CatchAllConfig(**settings, benign=tuple(entries.values()), files=tuple(str(p) for p, _ in files))


def _read(col: Problems, settings: dict[str, Any], entries: dict[str, NoiseEntry]) -> None:
    body = col.doc.data.get("catchAll") if isinstance(col.doc.data, dict) else None
    if not isinstance(body, dict):
        col.add(("catchAll",), "must be a mapping (enabled, maxLevel, window, maxReasons, benign)")
        return
    for key in body:
        if key not in _KEYS:
            col.add(("catchAll", key), f"unknown key {key!r} (known: {', '.join(sorted(_KEYS))})")
    if "enabled" in body:
        if isinstance(body["enabled"], bool):
            settings["enabled"] = body["enabled"]
        else:
            col.add(("catchAll", "enabled"), "must be true or false")
    if "maxLevel" in body:
        level = body["maxLevel"]
        if isinstance(level, str) and level in LEVEL_NAMES:
            level = LEVEL_NAMES.index(level)
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 3:
            col.add(("catchAll", "maxLevel"), f"must be 0-3 or one of {', '.join(LEVEL_NAMES)}, got {level!r}")
        else:
            settings["max_level"] = level
    if "window" in body:
        try:
            window = parse_duration(body["window"])
        except ValueError as exc:
            col.add(("catchAll", "window"), str(exc))
        else:
            if not 60 <= window <= MAX_WINDOW:
                col.add(("catchAll", "window"), "must be between 1m and 168h")
            else:
                settings["window"] = window
    if "maxReasons" in body:
        n = body["maxReasons"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REASONS_LIMIT:
            col.add(("catchAll", "maxReasons"), f"must be an integer between 1 and {MAX_REASONS_LIMIT}, got {n!r}")
        else:
            settings["max_reasons"] = n
    benign = body.get("benign", [])
    if not isinstance(benign, list):
        col.add(("catchAll", "benign"), "must be a list of {name, pattern, why, provenance}")
        return
    for i, raw in enumerate(benign):
        entry = _entry(col, ("catchAll", "benign", i), raw)
        if entry is not None:
            entries.pop(entry.name, None)
            entries[entry.name] = entry


def _entry(col: Problems, path: tuple, raw: object) -> NoiseEntry | None:
    if not isinstance(raw, dict):
        col.add(path, "must be a mapping with name, pattern, why and provenance")
        return None
    ok = True
    for key in raw:
        if key not in _ENTRY_KEYS:
            col.add((*path, key), f"unknown key {key!r} (known: {', '.join(sorted(_ENTRY_KEYS))})")
            ok = False
    name, pattern, why = raw.get("name"), raw.get("pattern"), raw.get("why")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        col.add((*path, "name"), "must be 1-64 characters of A-Z a-z 0-9 _ . : / -")
        ok = False
    if not isinstance(why, str) or not why.strip():
        col.add((*path, "why"), "must say why these records are benign (a non-empty string)")
        ok = False
    provenance = raw.get("provenance", [])
    if not isinstance(provenance, list) or not all(isinstance(p, str) for p in provenance):
        col.add((*path, "provenance"), "must be a list of strings (the print sites)")
        ok = False
    compiled = None
    if not isinstance(pattern, str) or not pattern:
        col.add((*path, "pattern"), "must be a non-empty string (an RE2 pattern)")
        ok = False
    else:
        try:
            compiled = compile_anchored(pattern)
        except PatternError as exc:
            col.add((*path, "pattern"), str(exc))
            ok = False
    if not ok or compiled is None:
        return None
    return NoiseEntry(name=str(name), pattern=compiled, why=str(why), provenance=tuple(provenance))


@dataclass(frozen=True, kw_only=True, slots=True)
class Leveled:
    """A record the rules did not match, with the kernel level it was printed at."""

    message: str
    level: int
    timestamp: float
    line: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """What the catch-all made of one record: ``event`` (its finding), ``held`` (the window's bounds held it
    back: counted, told by the next finding of its reason) or ``benign`` (``noise`` names the entry)."""

    outcome: str
    subsystem: str
    noise: str | None = None
    finding: Finding | None = None


class CatchAll:
    """The catch-all stage: one per stream (its window and counts), not thread-safe."""

    def __init__(self, *, config: CatchAllConfig) -> None:
        self.config = config
        self._window_start: float | None = None
        self._told: set[str] = set()  # reasons given a finding in the current window
        self._pending: Counter[str] = Counter()  # reason -> records since its last finding
        self.unmatched: Counter[str] = Counter()  # subsystem -> records at error level no rule or entry knew
        self.benign: Counter[str] = Counter()  # noise entry -> records it silenced
        self.held: Counter[str] = Counter()  # subsystem -> records the window's bounds held back
        self.events = 0

    @property
    def max_level(self) -> int:
        return self.config.max_level

    def judge(self, records: Iterable[Leveled]) -> list[Verdict]:
        """A verdict per record at ``maxLevel`` or worse (others are not the catch-all's)."""
        verdicts: list[Verdict] = []
        if not self.config.enabled:
            return verdicts
        for record in records:
            if record.level > self.config.max_level:
                continue
            verdicts.append(self._one(record))
        return verdicts

    def findings(self, records: Iterable[Leveled]) -> list[Finding]:
        return [v.finding for v in self.judge(records) if v.finding is not None]

    def _one(self, record: Leveled) -> Verdict:
        message = record.message.strip()
        for entry in self.config.benign:
            if entry.pattern.search(message) is not None:
                self.benign[entry.name] += 1
                return Verdict(outcome="benign", subsystem=subsystem_of(message), noise=entry.name)
        subsystem = subsystem_of(message)
        reason = REASON_PREFIX + subsystem
        self.unmatched[subsystem] += 1
        self._pending[reason] += 1
        start = self._window_start
        if start is None or record.timestamp >= start + self.config.window:
            self._window_start = record.timestamp
            self._told = set()
        if reason in self._told or len(self._told) >= self.config.max_reasons:
            self.held[subsystem] += 1
            return Verdict(outcome="held", subsystem=subsystem)
        self._told.add(reason)
        count = self._pending.pop(reason)
        self.events += 1
        level = LEVEL_NAMES[record.level] if 0 <= record.level < len(LEVEL_NAMES) else str(record.level)
        more = f"; {count - 1} more such records since the last" if count > 1 else ""
        finding = Finding(
            rule=RULE,
            type=RuleType.TEMPORARY,
            condition=None,
            reason=reason,
            severity=Severity.WARNING,
            message=bounded_message(f"{message} (kernel level {level}, no rule knows it{more})"),
            timestamp=record.timestamp,
            source=SOURCE,
            fields={"subsystem": subsystem, "level": record.level, "records": count},
            line=record.line,
            status=Status.TRUE,
        )
        return Verdict(outcome="event", subsystem=subsystem, finding=finding)
