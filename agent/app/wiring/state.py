"""The node state at start: the state directory, the conditions the agent owns, what a restart keeps.

A new boot drops the kernel-log problems of the last one; the Node's own conditions seed the state in
Kubernetes mode when it was read at start."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.app.config import provenance_of
from agent.app.settings import Settings
from agent.checks.model import ScheduledCheck
from agent.core.state import NodeState
from agent.core.statedir import ClearStore, ConditionStore, StateDirHealth
from agent.core.types import Condition, ConditionSpec, Provenance, Severity, Status
from agent.detectors.rulepack import RuleSet
from agent.sources.kmsg.boot import read_boot_id
from agent.sources.replay import Cursor, CursorStore, ReplayPolicy

log = logging.getLogger(__name__)


def current_boot_id(path: Path | None = None) -> str:
    """This boot's id: ``path`` (--boot-id-file) when given, else /proc's."""
    try:
        if path is None:
            return read_boot_id()
        text = path.read_text(encoding="ascii", errors="replace").strip()
        if not text:
            raise ValueError(f"the boot id file {path} is empty")
        return text
    except (OSError, ValueError) as exc:
        log.warning("cannot read the boot id (%s); restart replay falls back to lookback", exc)
        return "unknown"


def severity_lookup(rule_set: RuleSet) -> Callable[[str, str], Severity | None]:
    """Severity of a (condition, reason) read back from a Node: that of the rule producing it, else None.

    A templated reason (``NeuronHasError_{type}``) produces every reason of its shape.
    """
    exact: dict[tuple[str, str], Severity] = {}
    shapes: list[tuple[str, re.Pattern[str], Severity]] = []
    for rule in rule_set.rules:
        if not rule.condition:
            continue
        if "{" in rule.reason:
            parts = re.split(r"\{[^}]*\}", rule.reason)
            shapes.append((rule.condition, re.compile(".+".join(map(re.escape, parts))), rule.severity))
        else:
            key = (rule.condition, rule.reason)
            if key not in exact or rule.severity.rank > exact[key].rank:
                exact[key] = rule.severity

    def lookup(type_: str, reason: str) -> Severity | None:
        if (type_, reason) in exact:
            return exact[(type_, reason)]
        found = [sev for cond, shape, sev in shapes if cond == type_ and shape.fullmatch(reason)]
        return max(found, key=lambda s: s.rank) if found else None

    return lookup


def _owned_by(spec: ConditionSpec, provenance: Provenance) -> ConditionSpec:
    return spec if spec.provenance is not None else dataclasses.replace(spec, provenance=provenance)


def owned_conditions(
    rule_set: RuleSet, checks: Sequence[ScheduledCheck], extra: Sequence[ConditionSpec]
) -> dict[str, ConditionSpec]:
    """``extra`` (every source's, with its provenance), then the rule set's and the checks' own types."""
    conditions: dict[str, ConditionSpec] = {spec.type: spec for spec in extra}
    for spec in rule_set.conditions:
        conditions.setdefault(spec.type, _owned_by(spec, Provenance.KERNEL_LOG))
    for check in checks:
        for spec in getattr(check.check, "conditions", ()) or ():
            conditions.setdefault(spec.type, _owned_by(spec, provenance_of(check)))
    return conditions


def _load_cursor(store: CursorStore, health: StateDirHealth) -> Cursor | None:
    if store.path.exists() and not store.path.is_file():
        health.report("cursor", f"{store.path} is not a regular file; every restart replays by --lookback")
        return None
    return store.load()


@dataclass(frozen=True, kw_only=True)
class StartState:
    """The state directory and its stores, the node state as restored, and the replay from the cursor."""

    state_dir: StateDirHealth
    cursor_store: CursorStore
    condition_store: ConditionStore
    clear_store: ClearStore
    state: NodeState
    replay: ReplayPolicy
    declared: tuple[ConditionSpec, ...]  # every condition the agent owns


def start_state(
    settings: Settings,
    *,
    rule_set: RuleSet,
    conditions: dict[str, ConditionSpec],
    node: dict | None,  # the Node read at start (Kubernetes mode), else None
    standalone: bool,
    clock: Callable[[], float],
) -> StartState:
    """The state as a restart finds it: kept conditions of this boot, then the Node's (when read)."""
    state_dir = StateDirHealth(path=settings.state_dir)
    state_dir.check()
    cursor_store = CursorStore(state_dir=settings.state_dir)
    condition_store = ConditionStore(health=state_dir)
    clear_store = ClearStore(health=state_dir)
    state = NodeState(
        conditions=tuple(conditions.values()),
        clock=clock,
        reasons=rule_set.reasons,
        problem_pairs=[(r.condition, r.reason) for r in rule_set.rules if r.condition and "{" not in r.reason],
        aggregate=settings.aggregate_condition,
        seeded=standalone,
    )
    cursor, boot_id = _load_cursor(cursor_store, state_dir), current_boot_id(settings.boot_id_file)
    # A new boot (the cursor is of another): the kernel log that raised our kernel-log problems is gone, and
    # this boot's log rebuilds those still there. Keeping them would hold a rebooted node broken forever.
    last_boot = {t for t, spec in conditions.items() if spec.provenance is Provenance.KERNEL_LOG}
    new_boot = cursor is not None and boot_id != "unknown" and cursor.boot_id != boot_id

    def this_boot(found: Sequence[Condition]) -> list[Condition]:
        return [c for c in found if not (new_boot and c.type in last_boot and c.status is Status.TRUE)]

    kept = condition_store.load()
    if kept is not None:
        state.restore(this_boot(kept))
    if node is not None:
        from agent.sources.nodeseed import node_conditions, node_uid

        found = node_conditions(node, types=state.owned_types, severity=severity_lookup(rule_set), now=clock())
        state.seed(this_boot(found), node_uid=node_uid(node))
    _keep_clears(state, clear_store, node)
    return StartState(
        state_dir=state_dir,
        cursor_store=cursor_store,
        condition_store=condition_store,
        clear_store=clear_store,
        state=state,
        replay=ReplayPolicy(cursor=cursor, boot_id=boot_id, lookback=settings.lookback),
        declared=tuple(conditions.values()),
    )


def _keep_clears(state: NodeState, store: ClearStore, node: dict | None) -> None:
    """The clears kept (their boundaries) before any record is folded: the state directory's, then the Node's
    (a fresh state directory still holds back what an operator cleared)."""
    state.keep_clears(store.load())
    if node is not None:
        from agent.sources.clearwatch import node_clears

        state.keep_clears(node_clears(node).records)
