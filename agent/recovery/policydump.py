"""The effective recovery policy as a policy file (``validate-config --print-policy``).

:func:`policy_yaml` writes every setting and every rule in force, in force order, with ``base: none``
at the top: loaded back (agent.recovery.policyfile.load_policy), it is the same policy, whatever
built-in rules and file it came from. Each rule is preceded by a comment saying where it came from.
Durations are written as whole-second strings (``20m``) where exact, else as seconds (``0.5``).
"""

from __future__ import annotations

from typing import Any

from agent.core.durations import format_duration
from agent.recovery.model import (
    SCHEDULED_CONDITION,
    BudgetSettings,
    PolicyRule,
    RecoveryPolicy,
    Remedy,
    Scope,
    ValidationSettings,
)

__all__ = ["policy_document", "policy_yaml"]


def _duration(seconds: float) -> str | float:
    return format_duration(seconds) if float(seconds).is_integer() else float(seconds)


def _rule(rule: PolicyRule) -> dict[str, Any]:
    out: dict[str, Any] = {"condition": rule.condition}
    if rule.reasons:
        out["reasons"] = list(rule.reasons)
    out["actions"] = [a.value for a in rule.actions]
    out["persist"] = _duration(rule.persist)
    if rule.sources:
        out["sources"] = [p.value for p in rule.sources]
    if rule.condition == SCHEDULED_CONDITION and rule.lead_time is not None:
        out["leadTime"] = _duration(rule.lead_time)
    if rule.ladder:
        out["ladder"] = [r.value for r in rule.ladder]
        if Remedy.REBOOT in rule.ladder:
            out["window"] = _duration(rule.window)
        if rule.repeat_count:
            out["repeat"] = {"count": rule.repeat_count, "within": _duration(rule.repeat_period)}
    if rule.scope is Scope.DEVICE:
        out |= {"scope": rule.scope.value, "maxDevices": rule.max_devices}
    if rule.validation is not None:
        out["validation"] = _validation(rule.validation)
    return out


def _validation(v: ValidationSettings) -> dict[str, Any]:
    return {
        "checks": list(v.checks),
        "timeout": _duration(v.timeout),
        "onFail": v.on_fail.value,
        "maxAttempts": v.max_attempts,
    }


def _percent(share: float) -> str:
    return f"{share * 100:.12g}%"


def _budget(b: BudgetSettings) -> dict[str, Any]:
    out: dict[str, Any] = {"maxUnhealthy": b.max_unhealthy}
    if not isinstance(b.max_unhealthy, int):
        out["maxUnhealthyCap"] = b.max_unhealthy_cap
    out |= {"maxActions": b.max_actions, "maxDeviceActions": b.max_device_actions}
    out |= {"window": _duration(b.window), "nodeSelector": b.node_selector}
    groups = []
    for g in b.groups:
        group: dict[str, Any] = {"label": g.label, "maxUnhealthy": g.max_unhealthy}
        if not isinstance(g.max_unhealthy, int):
            group["maxUnhealthyCap"] = g.max_unhealthy_cap
        groups.append(group)
    out["groups"] = groups
    c = b.correlation
    out["correlation"] = (
        None
        if c is None
        else {
            "labels": list(c.labels),
            "share": _percent(c.share),
            "minNodes": c.min_nodes,
            "newNodeWindow": _duration(c.new_node_window),
            "newNodeRepeats": c.new_node_repeats,
        }
    )
    return out


def policy_document(policy: RecoveryPolicy) -> dict[str, Any]:
    """The policy as the data of a policy file (``base: none``: nothing left to merge)."""
    d = policy.drain
    return {
        "base": "none",
        "startupDelay": _duration(policy.startup_delay),
        "uncordonAfter": None if policy.uncordon_after is None else _duration(policy.uncordon_after),
        "respectGracePeriod": policy.respect_grace_period,
        "rules": [_rule(rule) for rule in policy.rules],
        "drain": {
            "podDeadline": _duration(d.pod_deadline),
            "onDeadline": d.on_deadline.value,
            "evictionsPerSecond": d.evictions_per_second,
            "timeout": _duration(d.timeout),
            "waitForDeletion": _duration(d.wait_for_deletion),
        },
        "budget": _budget(policy.budget),
        "validation": None if policy.validation is None else _validation(policy.validation),
        "startupValidation": _startup(policy),
    }


def _startup(policy: RecoveryPolicy) -> dict[str, Any] | None:
    s = policy.startup_validation
    return None if s is None else {"checks": list(s.checks), "taint": s.taint}


def policy_yaml(policy: RecoveryPolicy, *, origin: str = "") -> str:
    """The policy file text: a header, then :func:`policy_document` with each rule's origin as a comment."""
    import yaml  # validate-config only: not in the running agent's memory

    text = yaml.safe_dump(policy_document(policy), sort_keys=False, default_flow_style=None, width=100)
    lines = [
        "# The effective recovery policy"
        + (f" ({origin})" if origin else "")
        + ": every rule in force, in the order they are matched",
        "# (the first rule matching a condition governs it). Load it as --recovery-policy: base: none",
        "# keeps exactly these rules (drop that line and it would merge them into the built-in rules).",
    ]
    rules = iter(policy.rules)
    for line in text.splitlines():
        if line.startswith("- condition: "):
            source = next(rules).source
            lines.append(f"  # {source}" if source else "  #")
        lines.append(line)
    return "\n".join(lines) + "\n"
