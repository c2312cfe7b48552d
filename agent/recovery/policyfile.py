"""The recovery policy as data: the built-in default, and a YAML (or JSON) file that extends it.

Format (every key optional; camelCase like the rule packs; durations like ``30s``, ``5m``, ``1h30m``)::

    base: builtin              # builtin: the rules below are merged into the built-in rules (by condition
                               # and reason set: agent.recovery.policymerge); none: only the rules below
    startupDelay: 60s          # no recovery action in the first 60 s after the agent starts (0 = none)
    uncordonAfter: 10m         # uncordon a node WE cordoned once healthy this long; omit / null = never
    respectGracePeriod: true   # SetInstanceHealth(ShouldRespectGracePeriod=...) for mark-unhealthy
    rules:                     # omitted = the built-in rules; base: none and [] = no rule (never acts)
      - condition: NeuronHealth          # a condition type that is True while the problem is present
        reasons: ["NeuronHasError_*"]    # shell globs over the condition's reason; omitted / [] = any reason
        actions: [cordon, mark-unhealthy]   # of fence-device, drain-device (scope: device only), cordon,
                                         # taint, drain, mark-unhealthy (run in that order)
        persist: 0s                      # act only once the condition has been True this long
        sources: [kernel-log, builtin-check]  # whose problems it acts on: the condition's owner, of
                                         # kernel-log, log-monitor, builtin-check, check, custom-plugin;
                                         # omitted = these two for a built-in condition type, anyone else
      - condition: ScheduledMaintenance  # EC2 scheduled events (--scheduled-maintenance); not a built-in rule
        actions: [cordon, drain]
        leadTime: 1h                     # act this long before the event's NotBefore, not as soon as it is
                                         # scheduled (this condition only; default 1h)
      - condition: GpuXid                # act on the device the finding names first (agent.recovery.devicescope)
        reasons: [GpuXid119]
        scope: device                    # node (the default) | device
        actions: [fence-device, drain-device]  # the device's rung (both when none is listed)
        maxDevices: 2                    # more devices failing at once: the node's ladder (default 2)
        ladder: [reboot, replace]        # the climb: a device again within repeat.within (1 day without
                                         # repeat), more than maxDevices, or no fence possible
        validation:                      # proven before it goes back (agent.recovery.validationgate): the
          checks: [dcgm-diag]            # node stays cordoned, the fence stays, until each check passes
          timeout: 30m                   # after the remedy; no pass of each within this: failed for good
          onFail: climb                  # climb (the ladder's next rung) | hold (out of service, reported)
          maxAttempts: 2                 # requests per remedy (an inconclusive one is asked again)
    validation: null           # the same for every rule without its own; null = back on silence (the window)
    startupValidation:         # a new node proves itself once: NoSchedule node-health-agent.io/unvalidated
      checks: [dcgm-diag]      # is removed after the first pass (put it in Karpenter's startupTaints)
      taint: true
    drain:                     # how a rule's ``drain`` action drains
      podDeadline: 5m          # how long one pod may take to leave (evictions retried meanwhile)
      onDeadline: report       # report (leave it, stay cordoned) | delete (bypasses its PodDisruptionBudget)
      evictionsPerSecond: 5
      timeout: 30m             # the whole drain
      waitForDeletion: 2m      # after eviction, how long to wait for a pod to be gone
    budget:                    # the cluster-wide safety budget (agent.recovery.budget)
      maxUnhealthy: 10%        # failure domains disrupted at once: a count (3) or a percentage, rounded up
      maxUnhealthyCap: 10      # caps a percentage; null = no cap (not allowed with a count)
      maxActions: 10           # disruptive steps per window, cluster-wide
      maxDeviceActions: 20     # device steps (scope: device) per window, cluster-wide; they take no place
      window: 10m
      nodeSelector: ""         # label selector of the nodes the percentage counts; "" = every node
      groups:                  # limits per zone or pool too (default: none), each like the cluster's
        - label: topology.kubernetes.io/zone
          maxUnhealthy: 1      # failure domains disrupted at once among the nodes of this node's zone
      correlation:             # hold (report, never act) where a zone or pool fails together; null = off
        labels: [topology.kubernetes.io/zone, eks.amazonaws.com/nodegroup, karpenter.sh/nodepool, ...]
        share: 30%             # more than this share of the group's nodes show one condition type's problem
        minNodes: 3            # ... and at least this many
        newNodeWindow: 1h      # or nodes created this recently (replacements) ...
        newNodeRepeats: 2      # ... this many of them, show it

Refused, each as a problem naming ``file:line: field path`` (all problems of a file at once):
unknown keys (with a did-you-mean), a ``base`` other than builtin or none, ``rules: []`` without
``base: none`` (it would add nothing), wrong types, bad durations, unknown or repeated actions,
``uncordon`` as a rule action (it follows healing: ``uncordonAfter``), a rule that drains without
cordoning (the scheduler would put pods back onto the node being drained), a rule on a type others
own (``Ready``, ``AcceleratedHardwareReady``, ...: True means healthy there), unknown ``sources``, a rule that
can never match because an earlier rule takes all its reasons (the first matching rule governs a
condition; in the merged order, the built-in rules included), a ``podDeadline`` longer than the
drain ``timeout``, a ``maxUnhealthyCap`` with a count, a ``nodeSelector`` that is not a label selector, a
``scope`` other than node or device, device actions or ``maxDevices`` without ``scope: device``, a
``maxDevices`` below 1, and a ``validation`` or ``startupValidation`` without checks, with a check named
twice, an ``onFail`` other than climb or hold, a ``timeout`` of 0 or a ``maxAttempts`` below 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.configdoc import Problems, field_path, read_pack
from agent.core.durations import format_duration, parse_duration
from agent.core.errors import ConfigError
from agent.core.types import Condition, Provenance, Status, reserved_condition
from agent.recovery import xid
from agent.recovery.budget import parse_max_unhealthy
from agent.recovery.model import (
    ACTION_ORDER,
    BUILTIN_CONDITIONS,
    DEFAULT_LEAD_TIME,
    DEFAULT_MAX_DEVICES,
    DEFAULT_VALIDATION_ATTEMPTS,
    DEFAULT_VALIDATION_TIMEOUT,
    DEFAULT_WINDOW,
    DEVICE_ACTIONS,
    SCHEDULED_CONDITION,
    TRUSTED_FOR_BUILTIN,
    Action,
    BudgetSettings,
    CorrelationSettings,
    DrainSettings,
    GroupBudget,
    OnDeadline,
    OnFail,
    PolicyRule,
    RecoveryPolicy,
    Remedy,
    Scope,
    StartupValidation,
    ValidationSettings,
)
from agent.recovery.policy import rule_for
from agent.recovery.policymerge import covers, describe_rule, merge_rules

__all__ = ["DEFAULT_POLICY", "load_policy", "policy_summary", "published"]

_DEFAULT_ACTIONS = (Action.CORDON, Action.MARK_UNHEALTHY)  # replace
_REPORT = (Action.CORDON,)  # unknown reasons: cordon and report only
_REBOOT_FIRST = (Remedy.REBOOT, Remedy.REPLACE)
_LEMON = (3, 7 * 86400.0)  # the third incident of one reason on one instance within 7 days climbs


def _builtin(
    condition: str, reasons: tuple[str, ...], actions: tuple[Action, ...], ladder: tuple = (), scope: Scope = Scope.NODE
) -> PolicyRule:
    count, period = _LEMON if ladder else (0, 0.0)
    return PolicyRule(
        scope=scope,
        condition=condition,
        reasons=reasons,
        actions=actions,
        persist=0.0,
        source="built-in",
        sources=TRUSTED_FOR_BUILTIN,
        ladder=ladder,
        repeat_count=count,
        repeat_period=period,
    )


# NVIDIA: the Xid catalog's immediate action decides (agent.recovery.xid): a GPU reset's at the device first
# (then the reboot ladder), the rest at the node; Neuron keeps the seed's replace (a file opts into scope: device).
DEFAULT_RULES = (
    _builtin("NeuronHealth", ("NeuronHasError_*",), _DEFAULT_ACTIONS),
    _builtin("GpuXid", xid.reasons(xid.REPLACE), _DEFAULT_ACTIONS),
    _builtin("GpuXid", xid.reasons(xid.DEVICE_FIRST), (*DEVICE_ACTIONS, *_REPORT), _REBOOT_FIRST, Scope.DEVICE),
    _builtin("GpuXid", xid.reasons(xid.REBOOT_FIRST), _REPORT, _REBOOT_FIRST),
    _builtin("GpuXid", (), _REPORT),
    _builtin("GpuDriverError", ("GpuFallenOffBus", "GpuInitFailed", "GpuProbeFailed"), _REPORT, _REBOOT_FIRST),
    _builtin("GpuDriverError", (), _REPORT),
    _builtin("GpuEcc", ("GpuRowRemapFailure",), _DEFAULT_ACTIONS),
    _builtin("GpuEcc", ("GpuEccUncorrectable", "GpuRowRemapPending", "GpuRetiredPagesPending"), _REPORT, _REBOOT_FIRST),
    _builtin("GpuEcc", (), _REPORT),
    _builtin("GpuCount", ("GpuLost", "GpuResetRequired", "GpuMissing"), _REPORT, _REBOOT_FIRST),
    _builtin("GpuCount", (), _REPORT),
    _builtin("NeuronDevices", (), _DEFAULT_ACTIONS),
)
DEFAULT_POLICY = RecoveryPolicy(
    rules=DEFAULT_RULES,
    startup_delay=60.0,
    uncordon_after=None,
    respect_grace_period=True,
    drain=DrainSettings(),
    budget=BudgetSettings(),
)

BASE_BUILTIN, BASE_NONE = "builtin", "none"
BASES = (BASE_BUILTIN, BASE_NONE)
TOP_KEYS = (
    "base",
    "startupDelay",
    "uncordonAfter",
    "respectGracePeriod",
    "rules",
    "drain",
    "budget",
    "validation",
    "startupValidation",
)
RULE_KEYS = (
    "condition",
    "reasons",
    "actions",
    "persist",
    "sources",
    "leadTime",
    "ladder",
    "window",
    "repeat",
    "scope",
    "maxDevices",
    "validation",
)
VALIDATION_KEYS = ("checks", "timeout", "onFail", "maxAttempts")
STARTUP_VALIDATION_KEYS = ("checks", "taint")
ON_FAIL_NAMES = tuple(o.value for o in OnFail)
_CHECK_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")
SCOPE_NAMES = tuple(s.value for s in Scope)
REPEAT_KEYS = ("count", "within")
REMEDY_NAMES = tuple(r.value for r in Remedy)
SOURCE_NAMES = tuple(p.value for p in Provenance)
DRAIN_KEYS = ("podDeadline", "onDeadline", "evictionsPerSecond", "timeout", "waitForDeletion")
BUDGET_KEYS = (
    "maxUnhealthy",
    "maxUnhealthyCap",
    "maxActions",
    "maxDeviceActions",
    "window",
    "nodeSelector",
    "groups",
    "correlation",
)
GROUP_KEYS = ("label", "maxUnhealthy", "maxUnhealthyCap")
CORRELATION_KEYS = ("labels", "share", "minNodes", "newNodeWindow", "newNodeRepeats")
_PERCENT_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
# uncordon is not a rule action (it follows healing); reboot is a ladder's remedy (it comes with a window)
RULE_ACTIONS = tuple(a.value for a in ACTION_ORDER if a is not Action.REBOOT)
_CONDITION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")


# ---- loading ---------------------------------------------------------------------------------------


def load_policy(path: Path) -> RecoveryPolicy:
    """The policy in ``path`` (format in the module docstring). Raises ConfigError listing every problem."""
    doc, problems = read_pack(path)
    if doc is None:
        raise ConfigError(problems)
    col = Problems(file=str(path), doc=doc)
    policy = _check(col)
    if len(col):
        raise ConfigError(col.problems)
    assert policy is not None
    return policy


def _unknown_keys(value: Mapping[Any, Any], *, known: Iterable[str], path: tuple, col: Problems) -> None:
    known = tuple(known)
    for key in value:
        if key in known:
            continue
        text = str(key)
        squashed = {k.lower(): k for k in known}
        guess = squashed.get(text.lower().replace("_", "").replace("-", ""))
        if guess is None:
            import difflib  # only for a file with a mistake: not in the running agent's memory

            close = difflib.get_close_matches(text, known, n=1, cutoff=0.6)
            prefixed = [k for k in known if len(text) >= 3 and k.lower().startswith(text.lower())]
            guess = close[0] if close else prefixed[0] if len(prefixed) == 1 else None
        hint = f"did you mean {guess!r}?" if guess else f"known: {', '.join(known)}"
        col.add((*path, key), f"unknown key {key!r} ({hint})")


def _mapping(data: Mapping[str, Any], key: str, *, col: Problems, path: tuple = ()) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        col.add((*path, key), "must be a mapping")
        return {}
    return value


def _duration(
    data: Mapping[str, Any], key: str, default: float, *, col: Problems, path: tuple, positive: bool = False
) -> float:
    if key not in data:
        return default
    try:
        value = parse_duration(data[key])
    except ValueError as exc:
        col.add((*path, key), str(exc))
        return default
    if positive and value <= 0:
        col.add((*path, key), f"must be longer than 0, got {data[key]!r}")
        return default
    return value


def _integer(data: Mapping[str, Any], key: str, default: int, *, col: Problems, path: tuple) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        col.add((*path, key), f"must be an integer of at least 1, got {value!r}")
        return default
    return value


def _check(col: Problems) -> RecoveryPolicy | None:
    data = col.doc.data
    if not isinstance(data, dict):
        col.add((), "expected a mapping (base, startupDelay, uncordonAfter, respectGracePeriod, rules, drain, budget)")
        return None
    _unknown_keys(data, known=TOP_KEYS, path=(), col=col)
    startup_delay = _duration(data, "startupDelay", DEFAULT_POLICY.startup_delay, col=col, path=())
    uncordon_after = None
    if data.get("uncordonAfter") is not None:
        uncordon_after = _duration(data, "uncordonAfter", 0.0, col=col, path=())
    respect = data.get("respectGracePeriod", True)
    if not isinstance(respect, bool):
        col.add(("respectGracePeriod",), f"must be true or false, got {respect!r}")
        respect = True
    rules = _rules(data, col=col)
    return RecoveryPolicy(
        rules=rules,
        startup_delay=startup_delay,
        uncordon_after=uncordon_after,
        respect_grace_period=respect,
        drain=_check_drain(_mapping(data, "drain", col=col), col=col),
        budget=_check_budget(_mapping(data, "budget", col=col), col=col),
        validation=check_validation(data, col=col, path=()),
        startup_validation=_check_startup(data, col=col),
    )


def _rules(data: Mapping[str, Any], *, col: Problems) -> tuple[PolicyRule, ...]:
    """The rules in force: the file's merged into the built-in ones (agent.recovery.policymerge), or the
    file's alone with ``base: none``."""
    base = data.get("base", BASE_BUILTIN)
    if base not in BASES:
        col.add(
            ("base",),
            f"must be {BASE_BUILTIN} (the file's rules extend the built-in rules; the default) or {BASE_NONE} "
            f"(only the file's rules), got {base!r:.100}",
        )
        base = BASE_BUILTIN
    if "rules" not in data:
        return DEFAULT_RULES if base == BASE_BUILTIN else ()
    checked = _check_rules(data["rules"], col=col, base=base)
    if base == BASE_NONE:
        return tuple(rule for _, rule in checked)
    if data["rules"] == []:
        col.add(
            ("rules",),
            "[] adds no rule to the built-in rules; for no rule at all (recovery never acts) set base: none",
        )
    merged = merge_rules(DEFAULT_RULES, [rule for _, rule in checked])
    for path, rule in checked:  # a file rule the merge put behind one that takes all its reasons
        if rule not in merged:
            continue  # a second rule of one key: refused above already
        earlier = merged[: merged.index(rule)]
        hit = next((e for e in earlier if covers(e, rule)), None)
        if hit is not None and not any(covers(other, rule) for p, other in checked if p < path):
            where = "the built-in rule" if hit.source == "built-in" else col.where(_path_of(checked, hit))
            col.add(
                path,
                f"never matches: {where} ({describe_rule(hit)}) goes first and takes every reason listed here "
                "(a rule with the key of a built-in rule takes its place; other rules go ahead of the built-in "
                "rules; base: none starts from no rule)",
            )
    return merged


def _path_of(checked: list[tuple[tuple, PolicyRule]], rule: PolicyRule) -> tuple:
    return next(path for path, mine in checked if mine is rule)


def _check_rules(raw: Any, *, col: Problems, base: str) -> list[tuple[tuple, PolicyRule]]:
    if not isinstance(raw, list):
        hint = ""
        if raw is None:
            hint = " (leave the key out for the built-in rules; base: none and [] for no rule)"
        col.add(("rules",), f"must be a list of {{condition, reasons, actions, persist}}{hint}")
        return []
    rules: list[tuple[tuple, PolicyRule]] = []
    for i, item in enumerate(raw):
        path = ("rules", i)
        if not isinstance(item, dict):
            col.add(path, "must be a mapping with condition and actions")
            continue
        rule = _check_rule(item, col=col, path=path)
        if rule is None:
            continue
        for earlier_path, earlier in rules:
            if covers(earlier, rule):
                col.add(
                    path,
                    f"never matches: {col.where(earlier_path)} already takes every reason of {rule.condition} "
                    "listed here (the first matching rule governs a condition)",
                )
                break
        rules.append((path, rule))
    return rules


def _check_rule(item: Mapping[str, Any], *, col: Problems, path: tuple) -> PolicyRule | None:
    before = len(col)
    _unknown_keys(item, known=RULE_KEYS, path=path, col=col)
    condition = item.get("condition")
    if not isinstance(condition, str) or not _CONDITION_RE.match(condition):
        col.add((*path, "condition"), "required: a condition type (letters, digits and _.:/-)")
    elif reserved_condition(condition) is not None:
        col.add(
            (*path, "condition"),
            f"{condition} is True when the node is healthy; recovery acts on conditions that are True while a "
            "problem is present: name the underlying condition (NeuronHealth, GpuXid, ...)",
        )
    reasons: tuple[str, ...] = ()
    raw_reasons = item.get("reasons")
    if raw_reasons is not None:
        if not isinstance(raw_reasons, list):
            col.add((*path, "reasons"), "must be a list of reason globs, e.g. ['NeuronHasError_*'] ([] = any reason)")
        else:
            for j, glob in enumerate(raw_reasons):
                if not isinstance(glob, str) or not glob.strip():
                    col.add((*path, "reasons", j), f"must be a non-empty reason or glob, got {glob!r}")
            reasons = tuple(g for g in raw_reasons if isinstance(g, str) and g.strip())
    ladder = _check_ladder(item, col=col, path=path)
    scope, max_devices = _check_scope(item, col=col, path=path)
    if "actions" not in item and (ladder or scope is Scope.DEVICE):
        # the rungs bring their own actions; a device rule's are the device's, then cordon
        actions: tuple[Action, ...] = (*DEVICE_ACTIONS, Action.CORDON) if scope is Scope.DEVICE else (Action.CORDON,)
    else:
        actions = _check_actions(item.get("actions"), col=col, path=(*path, "actions"))
    if scope is not Scope.DEVICE and any(a.on_device for a in actions):
        col.add((*path, "actions"), "fence-device and drain-device act on a device: they need scope: device")
    if ladder and Action.MARK_UNHEALTHY in actions:
        col.add((*path, "actions"), "mark-unhealthy is the ladder's replace: leave it out of actions")
    persist = _duration(item, "persist", 0.0, col=col, path=path)
    sources = _check_sources(item, condition, col=col, path=path)
    lead_time = DEFAULT_LEAD_TIME if condition == SCHEDULED_CONDITION else None
    if "leadTime" in item:
        if condition != SCHEDULED_CONDITION:
            col.add(
                (*path, "leadTime"),
                f"only for {SCHEDULED_CONDITION} (its message names when the event begins); {condition} has no "
                "scheduled time: use persist",
            )
        else:
            lead_time = _duration(item, "leadTime", DEFAULT_LEAD_TIME, col=col, path=path)
    window = _duration(item, "window", DEFAULT_WINDOW, col=col, path=path, positive=True)
    if "window" in item and Remedy.REBOOT not in ladder:
        col.add((*path, "window"), "the observation window follows a reboot: it needs ladder with reboot")
    count, period = _check_repeat(item, ladder, col=col, path=path)
    validation = check_validation(item, col=col, path=path)
    if len(col) != before or not isinstance(condition, str):
        return None
    line = col.doc.line(path)
    return PolicyRule(
        condition=condition,
        reasons=reasons,
        actions=actions,
        persist=persist,
        source=f"{col.file}:{line}" if line is not None else f"{col.file}: {field_path(path)}",
        sources=sources,
        lead_time=lead_time,
        ladder=ladder,
        window=window,
        repeat_count=count,
        repeat_period=period,
        scope=scope,
        max_devices=max_devices,
        validation=validation,
    )


def _check_names(raw: object, *, col: Problems, path: tuple) -> tuple[str, ...]:
    """A non-empty list of check names, each once."""
    if not isinstance(raw, list) or not raw:
        col.add(path, "must be a non-empty list of check names, e.g. [dcgm-diag, nccl-loopback]")
        return ()
    names: list[str] = []
    for j, name in enumerate(raw):
        if not isinstance(name, str) or not _CHECK_NAME_RE.match(name):
            col.add((*path, j), f"must be a check name (letters, digits and _.-), got {name!r:.100}")
        elif name in names:
            col.add((*path, j), f"{name} is listed twice")
        else:
            names.append(name)
    return tuple(names)


def check_validation(data: Mapping[str, Any], *, col: Problems, path: tuple) -> ValidationSettings | None:
    """``validation: {checks, timeout, onFail, maxAttempts}`` (absent or null: None)."""
    raw = data.get("validation")
    if raw is None:
        return None
    where = (*path, "validation")
    if not isinstance(raw, dict):
        col.add(where, "must be a mapping: {checks: [...], timeout: 30m, onFail: climb | hold, maxAttempts: 2}")
        return None
    _unknown_keys(raw, known=VALIDATION_KEYS, path=where, col=col)
    checks = _check_names(raw.get("checks"), col=col, path=(*where, "checks"))
    on_fail = raw.get("onFail", OnFail.CLIMB.value)
    if not isinstance(on_fail, str) or on_fail not in ON_FAIL_NAMES:
        col.add((*where, "onFail"), f"must be one of {', '.join(ON_FAIL_NAMES)}, got {on_fail!r:.100}")
        on_fail = OnFail.CLIMB.value
    return ValidationSettings(
        checks=checks,
        timeout=_duration(raw, "timeout", DEFAULT_VALIDATION_TIMEOUT, col=col, path=where, positive=True),
        on_fail=OnFail(on_fail),
        max_attempts=_integer(raw, "maxAttempts", DEFAULT_VALIDATION_ATTEMPTS, col=col, path=where),
    )


def _check_startup(data: Mapping[str, Any], *, col: Problems) -> StartupValidation | None:
    """``startupValidation: {checks, taint}`` (absent or null: None)."""
    raw = data.get("startupValidation")
    if raw is None:
        return None
    where = ("startupValidation",)
    if not isinstance(raw, dict):
        col.add(where, "must be a mapping: {checks: [...], taint: true}")
        return None
    _unknown_keys(raw, known=STARTUP_VALIDATION_KEYS, path=where, col=col)
    taint = raw.get("taint", True)
    if not isinstance(taint, bool):
        col.add((*where, "taint"), f"must be true or false, got {taint!r:.100}")
        taint = True
    return StartupValidation(checks=_check_names(raw.get("checks"), col=col, path=(*where, "checks")), taint=taint)


def _check_scope(item: Mapping[str, Any], *, col: Problems, path: tuple) -> tuple[Scope, int]:
    """``scope: node | device`` and, with device, ``maxDevices`` (at least 1)."""
    raw = item.get("scope", Scope.NODE.value)
    if not isinstance(raw, str) or raw not in SCOPE_NAMES:
        col.add((*path, "scope"), f"must be one of {', '.join(SCOPE_NAMES)}, got {raw!r:.100}")
        raw = Scope.NODE.value
    scope = Scope(raw)
    if "maxDevices" in item and scope is not Scope.DEVICE:
        col.add((*path, "maxDevices"), "counts the devices failing at once of a device rule: it needs scope: device")
        return scope, DEFAULT_MAX_DEVICES
    return scope, _integer(item, "maxDevices", DEFAULT_MAX_DEVICES, col=col, path=path)


def _check_ladder(item: Mapping[str, Any], *, col: Problems, path: tuple) -> tuple[Remedy, ...]:
    """The remedies tried in turn: each known, each once (a rung repeated would loop), replace last."""
    if "ladder" not in item:
        return ()
    raw = item["ladder"]
    known = ", ".join(REMEDY_NAMES)
    if not isinstance(raw, list) or not raw:
        col.add((*path, "ladder"), f"must be a non-empty list of remedies, e.g. [reboot, replace] (known: {known})")
        return ()
    found: list[Remedy] = []
    for j, name in enumerate(raw):
        if not isinstance(name, str) or name not in REMEDY_NAMES:
            col.add((*path, "ladder", j), f"unknown remedy {name!r} (known: {known})")
        elif Remedy(name) in found:
            col.add(
                (*path, "ladder", j),
                f"the ladder loops: {name} is already rung {found.index(Remedy(name)) + 1} (each remedy once, "
                "climbing only up)",
            )
        elif found and found[-1] is Remedy.REPLACE:
            col.add((*path, "ladder", j), f"nothing can follow replace (the instance is gone), got {name!r}")
        else:
            found.append(Remedy(name))
    return tuple(found)


def _check_repeat(
    item: Mapping[str, Any], ladder: tuple[Remedy, ...], *, col: Problems, path: tuple
) -> tuple[int, float]:
    """``repeat: {count: N, within: DUR}``: the N-th incident of one reason within DUR climbs a rung."""
    if "repeat" not in item:
        return 0, 0.0
    raw = item["repeat"]
    where = (*path, "repeat")
    if not ladder:
        col.add(where, "repeat climbs a ladder: it needs ladder")
        return 0, 0.0
    if not isinstance(raw, dict):
        col.add(where, "must be a mapping {count: N, within: DURATION}")
        return 0, 0.0
    _unknown_keys(raw, known=REPEAT_KEYS, path=where, col=col)
    count = raw.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 2:
        col.add((*where, "count"), f"must be an integer of at least 2, got {count!r}")
        count = 0
    if "within" not in raw:
        col.add((*where, "within"), "required: the period the incidents are counted in, e.g. 7d or 24h")
        return 0, 0.0
    return count, _duration(raw, "within", 0.0, col=col, path=where, positive=True)


def _check_sources(item: Mapping[str, Any], condition: object, *, col: Problems, path: tuple) -> tuple[Provenance, ...]:
    """The owners whose problems the rule acts on: as given; else the built-in owners for a built-in
    condition type (a plugin raising NeuronHealth is not trusted), anyone's for other types."""
    if "sources" not in item:
        return TRUSTED_FOR_BUILTIN if condition in BUILTIN_CONDITIONS else ()
    raw = item["sources"]
    if not isinstance(raw, list) or not raw:
        col.add((*path, "sources"), f"must be a non-empty list of {', '.join(SOURCE_NAMES)} (omit it for the default)")
        return ()
    found: list[Provenance] = []
    for j, name in enumerate(raw):
        if not isinstance(name, str) or name not in SOURCE_NAMES:
            col.add((*path, "sources", j), f"unknown source {name!r} (known: {', '.join(SOURCE_NAMES)})")
        elif Provenance(name) not in found:
            found.append(Provenance(name))
    return tuple(found)


def _check_actions(raw: Any, *, col: Problems, path: tuple) -> tuple[Action, ...]:
    known = ", ".join(RULE_ACTIONS)
    if not isinstance(raw, list) or not raw:
        col.add(path, f"required: a non-empty list of actions (known: {known})")
        return ()
    found: list[Action] = []
    for j, name in enumerate(raw):
        if name == Action.UNCORDON.value:
            col.add((*path, j), "uncordon is not a rule action: it follows healing (set uncordonAfter)")
        elif name == Action.REBOOT.value:
            col.add((*path, j), "reboot is a remedy: put it in the rule's ladder, e.g. ladder: [reboot, replace]")
        elif not isinstance(name, str) or name not in RULE_ACTIONS:
            col.add((*path, j), f"unknown action {name!r} (known: {known})")
        elif Action(name) in found:
            col.add((*path, j), f"duplicate action {name!r}")
        else:
            found.append(Action(name))
    if Action.DRAIN in found and Action.CORDON not in found:
        col.add(
            path,
            "drain needs cordon in the same rule: without it the scheduler puts pods back onto the node being drained",
        )
    return tuple(a for a in ACTION_ORDER if a in found)


def _check_drain(data: Mapping[str, Any], *, col: Problems) -> DrainSettings:
    path = ("drain",)
    _unknown_keys(data, known=DRAIN_KEYS, path=path, col=col)
    default = DrainSettings()
    on_deadline = default.on_deadline
    if "onDeadline" in data:
        try:
            on_deadline = OnDeadline(data["onDeadline"])
        except ValueError:
            col.add(
                (*path, "onDeadline"),
                f"must be one of {', '.join(o.value for o in OnDeadline)}, got {data['onDeadline']!r}",
            )
    rate = data.get("evictionsPerSecond", default.evictions_per_second)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
        col.add((*path, "evictionsPerSecond"), f"must be a number above 0, got {rate!r}")
        rate = default.evictions_per_second
    drain = DrainSettings(
        pod_deadline=_duration(data, "podDeadline", default.pod_deadline, col=col, path=path, positive=True),
        on_deadline=on_deadline,
        evictions_per_second=float(rate),
        timeout=_duration(data, "timeout", default.timeout, col=col, path=path, positive=True),
        wait_for_deletion=_duration(data, "waitForDeletion", default.wait_for_deletion, col=col, path=path),
    )
    if drain.pod_deadline > drain.timeout:
        col.add(
            (*path, "podDeadline"),
            f"{format_duration(drain.pod_deadline)} is longer than the whole drain's timeout "
            f"({format_duration(drain.timeout)})",
        )
    return drain


def _check_budget(data: Mapping[str, Any], *, col: Problems) -> BudgetSettings:
    path = ("budget",)
    _unknown_keys(data, known=BUDGET_KEYS, path=path, col=col)
    default = BudgetSettings()
    max_unhealthy, cap = _limit(data, path=path, default=(default.max_unhealthy, default.max_unhealthy_cap), col=col)
    selector = data.get("nodeSelector", "")
    if selector is None:
        selector = ""
    if not isinstance(selector, str):
        col.add((*path, "nodeSelector"), f"must be a label selector string, got {selector!r}")
        selector = ""
    else:
        problem = selector_problem(selector)
        if problem:
            col.add((*path, "nodeSelector"), problem)
    return BudgetSettings(
        max_unhealthy=max_unhealthy,
        max_unhealthy_cap=cap,
        max_actions=_integer(data, "maxActions", default.max_actions, col=col, path=path),
        max_device_actions=_integer(data, "maxDeviceActions", default.max_device_actions, col=col, path=path),
        window=_duration(data, "window", default.window, col=col, path=path, positive=True),
        node_selector=selector.strip(),
        groups=_check_groups(data.get("groups"), col=col),
        correlation=_check_correlation(data, col=col),
    )


def _limit(
    data: Mapping[str, Any], *, path: tuple, default: tuple[int | str, int | None], col: Problems
) -> tuple[int | str, int | None]:
    """``maxUnhealthy`` (a count or a percentage) and ``maxUnhealthyCap`` (caps a percentage only)."""
    max_unhealthy = data.get("maxUnhealthy", default[0])
    try:
        is_count = isinstance(parse_max_unhealthy(max_unhealthy), int)
        if isinstance(max_unhealthy, str):
            max_unhealthy = max_unhealthy.strip()
    except ValueError as exc:
        col.add((*path, "maxUnhealthy"), str(exc))
        max_unhealthy, is_count = default[0], isinstance(default[0], int)
    cap: int | None = default[1]
    if "maxUnhealthyCap" in data:
        raw_cap = data["maxUnhealthyCap"]
        if raw_cap is None:
            cap = None
        elif isinstance(raw_cap, bool) or not isinstance(raw_cap, int) or raw_cap < 1:
            col.add((*path, "maxUnhealthyCap"), f"must be an integer of at least 1 or null (no cap), got {raw_cap!r}")
        elif is_count:
            col.add(
                (*path, "maxUnhealthyCap"),
                f"caps a percentage; maxUnhealthy is the count {max_unhealthy}: remove maxUnhealthyCap",
            )
        else:
            cap = raw_cap
    return max_unhealthy, cap


def _label_key(value: object, *, path: tuple, col: Problems) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(_KEY, value.strip()) or len(value.strip()) > 316:
        col.add(path, f"must be a label key like topology.kubernetes.io/zone, got {value!r:.100}")
        return None
    return value.strip()


def _check_groups(data: object, *, col: Problems) -> tuple[GroupBudget, ...]:
    path = ("budget", "groups")
    if data is None:
        return ()
    if not isinstance(data, list):
        col.add(path, "must be a list of {label, maxUnhealthy, maxUnhealthyCap}")
        return ()
    groups: list[GroupBudget] = []
    seen: set[str] = set()
    for index, item in enumerate(data):
        where = (*path, index)
        if not isinstance(item, dict):
            col.add(where, "must be a mapping with label and maxUnhealthy")
            continue
        _unknown_keys(item, known=GROUP_KEYS, path=where, col=col)
        if "maxUnhealthy" not in item:
            col.add(where, "needs maxUnhealthy (a count like 1 or a percentage like '20%')")
            continue
        label = _label_key(item.get("label"), path=(*where, "label"), col=col)
        if label is None:
            continue
        if label in seen:
            col.add((*where, "label"), f"{label} has a budget already: one budget per label")
            continue
        seen.add(label)
        max_unhealthy, cap = _limit(item, path=where, default=(1, None), col=col)
        groups.append(GroupBudget(label=label, max_unhealthy=max_unhealthy, max_unhealthy_cap=cap))
    return tuple(groups)


def _check_correlation(budget: Mapping[str, Any], *, col: Problems) -> CorrelationSettings | None:
    path = ("budget", "correlation")
    default = CorrelationSettings()
    if "correlation" not in budget:
        return default
    data = budget["correlation"]
    if data is None or data is False:
        return None  # never hold for a correlated failure
    if not isinstance(data, dict):
        col.add(path, "must be a mapping (labels, share, minNodes, newNodeWindow, newNodeRepeats) or null (off)")
        return default
    _unknown_keys(data, known=CORRELATION_KEYS, path=path, col=col)
    labels = default.labels
    if "labels" in data:
        raw = data["labels"]
        if not isinstance(raw, list) or not raw:
            col.add((*path, "labels"), "must be a non-empty list of label keys (zone, pools)")
        else:
            keys = [_label_key(v, path=(*path, "labels", i), col=col) for i, v in enumerate(raw)]
            labels = tuple(dict.fromkeys(k for k in keys if k is not None))
    share = default.share
    if "share" in data:
        raw_share = data["share"]
        match = _PERCENT_TEXT.match(raw_share) if isinstance(raw_share, str) else None
        if match is None or not 0 < float(match.group(1)) < 100:
            col.add((*path, "share"), f"must be a percentage above 0% and below 100% like '30%', got {raw_share!r}")
        else:
            share = float(match.group(1)) / 100
    return CorrelationSettings(
        labels=labels,
        share=share,
        min_nodes=_integer(data, "minNodes", default.min_nodes, col=col, path=path),
        new_node_window=_duration(data, "newNodeWindow", default.new_node_window, col=col, path=path, positive=True),
        new_node_repeats=_integer(data, "newNodeRepeats", default.new_node_repeats, col=col, path=path),
    )


# ---- label selectors (k8s.io/apimachinery/pkg/labels, the string form) -------------------------------

_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
_KEY = rf"(?:{_PREFIX}/)?{_NAME}"
_VALUE = rf"(?:{_NAME})?"
_REQUIREMENT = re.compile(
    rf"^\s*(?:!\s*(?P<absent>{_KEY})"
    rf"|(?P<key>{_KEY})\s*(?:(?P<op>==|!=|=)\s*(?P<value>{_VALUE})"
    rf"|(?P<cmp>[<>])\s*(?P<number>-?\d+)"
    rf"|\s(?P<set>in|notin)\s*\(\s*(?P<values>[^()]*)\)"
    rf")?)\s*$"
)


def selector_problem(selector: str) -> str | None:
    """Why ``selector`` is not a valid label selector (None when it is; "" selects everything)."""
    if not selector.strip():
        return None
    for part in _split_requirements(selector):
        m = _REQUIREMENT.match(part)
        if m is None:
            return (
                f"{part.strip()!r} is not a label selector requirement (key, !key, key=value, key!=value, "
                "key in (a,b), key notin (a,b))"
            )
        key = m.group("absent") or m.group("key")
        if "/" in key and len(key.split("/", 1)[0]) > 253:
            return f"{key!r}: the key's prefix is longer than 253 characters"
        if m.group("set"):
            values = [v.strip() for v in m.group("values").split(",")]
            bad = [v for v in values if not re.fullmatch(_VALUE, v)]
            if bad or values == [""]:
                return f"{part.strip()!r}: {m.group('set')} needs a list of label values"
    return None


def _split_requirements(selector: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(selector):
        depth += c == "("
        depth -= c == ")"
        if c == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    return parts


# ---- summary and the CloudWatch predicate ----------------------------------------------------------


def policy_summary(policy: RecoveryPolicy) -> list[str]:
    """Lines for ``validate-config``: what recovery would do with this policy."""
    lines = [f"recovery rules: {len(policy.rules)}" + ("" if policy.rules else " (recovery never acts)")]
    for rule in policy.rules:
        reasons = ", ".join(rule.reasons) if rule.reasons else "any reason"
        wait = f", after {format_duration(rule.persist)} True" if rule.persist else ""
        if rule.lead_time is not None:
            wait += f", {format_duration(rule.lead_time)} before the scheduled time"
        trusted = f", raised by {' or '.join(p.value for p in rule.sources)}" if rule.sources else ""
        what = ", ".join(a.value for a in rule.actions)
        if rule.scope is Scope.DEVICE:
            what = f"scope device (at most {rule.max_devices} at once): {what}"
        if rule.ladder:
            what += "; ladder " + " -> ".join(r.value for r in rule.ladder)
            if Remedy.REBOOT in rule.ladder:
                what += f" (window {format_duration(rule.window)}"
                if rule.repeat_count:
                    what += f", {rule.repeat_count} within {format_duration(rule.repeat_period)} climb"
                what += ")"
        elif rule.actions == (Action.CORDON,):
            what += " (no remedy)"
        lines.append(f"  {rule.condition} [{reasons}{trusted}]: {what}{wait}")
    lines += _validation_lines(policy)
    lines.append(
        f"startup delay: {format_duration(policy.startup_delay)}" if policy.startup_delay else "startup delay: none"
    )
    if policy.uncordon_after is None:
        lines.append("uncordon: never (a node we cordoned stays cordoned until an operator uncordons it)")
    else:
        lines.append(
            f"uncordon: a node we cordoned, once healthy for {format_duration(policy.uncordon_after)} "
            "(never one marked unhealthy)"
        )
    lines.append(
        "mark-unhealthy: SetInstanceHealth "
        + ("respects" if policy.respect_grace_period else "ignores")
        + " the Auto Scaling health check grace period"
    )
    d = policy.drain
    if any(Action.DRAIN in r.actions or Remedy.REBOOT in r.ladder for r in policy.rules):
        lines.append(
            f"drain: {d.evictions_per_second:g} evictions/s, each pod {format_duration(d.pod_deadline)} then "
            f"{d.on_deadline.value}, wait {format_duration(d.wait_for_deletion)} for deletion, whole drain "
            f"{format_duration(d.timeout)}"
        )
    else:
        lines.append("drain: no rule drains")
    b = policy.budget
    if isinstance(b.max_unhealthy, int):
        places = f"{b.max_unhealthy} failure domain(s)"
    else:
        cap = f", at most {b.max_unhealthy_cap}" if b.max_unhealthy_cap is not None else ""
        places = f"{b.max_unhealthy} of the failure domains (rounded up, at least 1{cap})"
    scope = f"nodes matching {b.node_selector!r}" if b.node_selector else "all nodes"
    lines.append(
        f"budget: {places} of {scope} disrupted at once; {b.max_actions} disruptive actions per "
        f"{format_duration(b.window)}; {b.max_device_actions} device actions per {format_duration(b.window)}"
    )
    for group in b.groups:
        cap = f", at most {group.max_unhealthy_cap}" if group.max_unhealthy_cap is not None else ""
        lines.append(f"  and {group.max_unhealthy}{cap} per {group.label} value")
    c = b.correlation
    if c is None:
        lines.append("correlated failure: never held")
    else:
        lines.append(
            f"correlated failure: held where more than {c.share:.0%} (at least {c.min_nodes}) of a group's nodes, or "
            f"{c.new_node_repeats} created within {format_duration(c.new_node_window)}, show one problem type; "
            f"groups by {', '.join(c.labels)}"
        )
    return lines


def _validation_lines(policy: RecoveryPolicy) -> list[str]:
    """What goes back into service how: after its validation set passed, or on silence."""
    own = [r for r in policy.rules if r.validation is not None]
    v = policy.validation
    if v is None and not own:
        lines = ["validation: none (a rebooted node or unfenced device returns after its quiet window alone)"]
    else:
        lines = [f"validation: {_validation_text(v)}" if v else "validation: only the rules that set their own"]
        lines += [f"  {r.condition}: {_validation_text(r.validation)}" for r in own if r.validation is not None]
    s = policy.startup_validation
    if s is not None:
        taint = " (NoSchedule node-health-agent.io/unvalidated until then)" if s.taint else ""
        lines.append(f"startup validation: {', '.join(s.checks)} pass once on a new node{taint}")
    return lines


def _validation_text(v: ValidationSettings) -> str:
    return (
        f"{', '.join(v.checks)} pass within {format_duration(v.timeout)} of the remedy, else {v.on_fail.value} "
        f"(at most {v.max_attempts} requests)"
    )


@dataclass(frozen=True, slots=True)
class _Published:
    policy: RecoveryPolicy

    def __call__(self, condition: Condition, owner: Provenance | None) -> bool:
        return condition.status is Status.TRUE and rule_for(self.policy, condition, owner) is not None


def published(policy: RecoveryPolicy) -> Callable[[Condition, Provenance | None], bool]:
    """Whether a condition (owned by ``owner``) is an unrecoverable problem per the policy: True and
    matched by a rule that trusts its owner (its ``persist`` is not waited for). The CloudWatch sink
    publishes those, whether or not recovery is enabled."""
    return _Published(policy)
