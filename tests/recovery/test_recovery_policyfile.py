"""The recovery policy file (agent.recovery.policyfile): the defaults, a full file, and every
problem with its exact message (file:line: field path: message), all of a file at once."""

from __future__ import annotations

import textwrap
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from agent.core.docreader import LOADER
from agent.core.errors import ConfigError
from agent.core.types import Condition, Provenance, Status
from agent.recovery.budget import parse_max_unhealthy
from agent.recovery.model import (
    TRUSTED_FOR_BUILTIN,
    Action,
    BudgetSettings,
    CorrelationSettings,
    DrainSettings,
    GroupBudget,
    OnDeadline,
    PolicyRule,
    RecoveryPolicy,
    Remedy,
    Scope,
)
from agent.recovery.policyfile import DEFAULT_POLICY, load_policy, policy_summary, published, selector_problem

# libyaml's words where PyYAML has it (agent.core.docreader.LOADER), the pure-Python parser's otherwise
NO_NODE = (
    "did not find expected node content"
    if LOADER is getattr(yaml, "CSafeLoader", None)
    else "expected the node content, but found '<stream end>'"
)
CORDON, TAINT, DRAIN, MARK = Action.CORDON, Action.TAINT, Action.DRAIN, Action.MARK_UNHEALTHY
FENCE, DRAIN_DEVICE = Action.FENCE_DEVICE, Action.DRAIN_DEVICE
REBOOT_IS_A_REMEDY = "reboot is a remedy: put it in the rule's ladder, e.g. ladder: [reboot, replace]"


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    return [str(p).replace(str(path), "policy.yaml") for p in info.value.problems]


def condition(type_: str, reason: str, status: Status = Status.TRUE) -> Condition:
    return Condition(type=type_, status=status, reason=reason, message="", last_transition=0.0, last_update=0.0)


# ---- the defaults -------------------------------------------------------------------------------------


def test_default_policy():
    assert DEFAULT_POLICY.startup_delay == 60.0
    assert DEFAULT_POLICY.uncordon_after is None
    assert DEFAULT_POLICY.respect_grace_period is True
    assert DEFAULT_POLICY.drain == DrainSettings()
    assert DEFAULT_POLICY.budget == BudgetSettings(
        max_unhealthy="10%", max_unhealthy_cap=10, max_actions=10, window=600
    )
    # Neuron keeps the seed's replace; NVIDIA reboots first where the Xid catalog says reset/reboot,
    # replaces hardware faults, and only cordons and reports what it does not know (tests/test_recovery_ladder.py).
    ladder = (Remedy.REBOOT, Remedy.REPLACE)
    assert [(r.condition, bool(r.reasons), r.actions, r.ladder) for r in DEFAULT_POLICY.rules] == [
        ("NeuronHealth", True, (CORDON, MARK), ()),
        ("GpuXid", True, (CORDON, MARK), ()),
        ("GpuXid", True, (FENCE, DRAIN_DEVICE, CORDON), ladder),  # one GPU's reset: the device first
        ("GpuXid", True, (CORDON,), ladder),
        ("GpuXid", False, (CORDON,), ()),
        ("GpuDriverError", True, (CORDON,), ladder),
        ("GpuDriverError", False, (CORDON,), ()),
        ("GpuEcc", True, (CORDON, MARK), ()),
        ("GpuEcc", True, (CORDON,), ladder),
        ("GpuEcc", False, (CORDON,), ()),
        ("GpuCount", True, (CORDON,), ladder),
        ("GpuCount", False, (CORDON,), ()),
        ("NeuronDevices", False, (CORDON, MARK), ()),
    ]
    assert DEFAULT_POLICY.rules[0].reasons == ("NeuronHasError_*",)
    assert [r.scope for r in DEFAULT_POLICY.rules].count(Scope.DEVICE) == 1  # NeuronHealth keeps replace
    assert all(r.persist == 0.0 for r in DEFAULT_POLICY.rules)
    assert not any(DRAIN in r.actions for r in DEFAULT_POLICY.rules)


def test_an_empty_file_is_the_default_policy(tmp_path):
    assert load_policy(write(tmp_path, "")) == DEFAULT_POLICY
    assert load_policy(write(tmp_path, "{}\n")) == DEFAULT_POLICY


def test_a_full_file(tmp_path):
    path = write(
        tmp_path,
        """
        startupDelay: 2m
        uncordonAfter: 15m
        respectGracePeriod: false
        rules:
          - condition: NeuronHealth
            reasons: ["NeuronHasError_DMA_ERROR", "NeuronHasError_HBM_*"]
            actions: [mark-unhealthy, drain, cordon]
            persist: 30s
          - condition: GpuXid
            actions: [taint]
        drain:
          podDeadline: 2m
          onDeadline: delete
          evictionsPerSecond: 0.5
          timeout: 20m
          waitForDeletion: 0
        budget:
          maxUnhealthy: 25%
          maxUnhealthyCap: null
          maxActions: 4
          window: 1h
          nodeSelector: "node.kubernetes.io/instance-type in (trn2.48xlarge, trn2u.48xlarge), !excluded"
          groups:
            - {label: topology.kubernetes.io/zone, maxUnhealthy: 1}
            - {label: karpenter.sh/nodepool, maxUnhealthy: 20%, maxUnhealthyCap: 3}
          correlation:
            labels: [topology.kubernetes.io/zone]
            share: 50%
            minNodes: 4
            newNodeWindow: 2h
            newNodeRepeats: 3
        base: none
        """,
    )
    assert load_policy(path) == RecoveryPolicy(
        rules=(
            PolicyRule(
                condition="NeuronHealth",
                reasons=("NeuronHasError_DMA_ERROR", "NeuronHasError_HBM_*"),
                actions=(CORDON, DRAIN, MARK),
                persist=30.0,
                source=f"{path}:5",
                sources=TRUSTED_FOR_BUILTIN,  # a built-in condition: its built-in owners by default
            ),
            PolicyRule(
                condition="GpuXid",
                reasons=(),
                actions=(TAINT,),
                persist=0.0,
                source=f"{path}:9",
                sources=TRUSTED_FOR_BUILTIN,
            ),
        ),
        startup_delay=120.0,
        uncordon_after=900.0,
        respect_grace_period=False,
        drain=DrainSettings(
            pod_deadline=120.0,
            on_deadline=OnDeadline.DELETE,
            evictions_per_second=0.5,
            timeout=1200.0,
            wait_for_deletion=0.0,
        ),
        budget=BudgetSettings(
            max_unhealthy="25%",
            max_unhealthy_cap=None,
            max_actions=4,
            window=3600.0,
            node_selector="node.kubernetes.io/instance-type in (trn2.48xlarge, trn2u.48xlarge), !excluded",
            groups=(
                GroupBudget(label="topology.kubernetes.io/zone", max_unhealthy=1),
                GroupBudget(label="karpenter.sh/nodepool", max_unhealthy="20%", max_unhealthy_cap=3),
            ),
            correlation=CorrelationSettings(
                labels=("topology.kubernetes.io/zone",),
                share=0.5,
                min_nodes=4,
                new_node_window=7200.0,
                new_node_repeats=3,
            ),
        ),
    )


def test_correlation_null_turns_holds_off(tmp_path):
    assert load_policy(write(tmp_path, "budget:\n  correlation: null\n")).budget.correlation is None


def test_json_works_too(tmp_path):
    path = write(
        tmp_path, '{"budget": {"maxUnhealthy": 3, "maxUnhealthyCap": null}, "rules": [], "base": "none"}', "policy.json"
    )
    policy = load_policy(path)
    assert policy.rules == () and policy.budget.max_unhealthy == 3 and policy.budget.max_unhealthy_cap is None


def test_partial_sections_keep_their_defaults(tmp_path):
    policy = load_policy(write(tmp_path, "budget:\n  maxActions: 3\ndrain:\n  timeout: 1h\n"))
    assert policy.rules == DEFAULT_POLICY.rules
    assert policy.budget == BudgetSettings(max_actions=3)
    assert policy.drain == DrainSettings(timeout=3600.0)


# ---- every problem, with its exact message ----------------------------------------------------------------

KNOWN_ACTIONS = "(known: fence-device, drain-device, cordon, taint, drain, mark-unhealthy)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            """
            rules:
              - condition: NeuronHealth
                actions: [cordon]
              - condition: GpuXid
                actions: [reboot, cordon]
            """,
            [f"policy.yaml:5: rules[1].actions[0]: {REBOOT_IS_A_REMEDY}"],
        ),
        (
            "uncordonAftr: 5m\n",
            ["policy.yaml:1: uncordonAftr: unknown key 'uncordonAftr' (did you mean 'uncordonAfter'?)"],
        ),
        (
            "startup_delay: 5m\n",
            ["policy.yaml:1: startup_delay: unknown key 'startup_delay' (did you mean 'startupDelay'?)"],
        ),
        (
            "colour: blue\n",
            [
                "policy.yaml:1: colour: unknown key 'colour' (known: base, startupDelay, uncordonAfter, "
                "respectGracePeriod, rules, drain, budget, validation, startupValidation)"
            ],
        ),
        (
            "rules:\n  - condition: GpuXid\n    action: [cordon]\n",
            [
                f"policy.yaml:2: rules[0].actions: required: a non-empty list of actions {KNOWN_ACTIONS}",
                "policy.yaml:3: rules[0].action: unknown key 'action' (did you mean 'actions'?)",
            ],
        ),
        (
            "rules:\n  - condition: GpuXid\n    actions: [drain, mark-unhealthy]\n",
            [
                "policy.yaml:3: rules[0].actions: drain needs cordon in the same rule: without it the scheduler "
                "puts pods back onto the node being drained"
            ],
        ),
        (
            "rules:\n  - condition: GpuXid\n    actions: [cordon, uncordon]\n",
            [
                "policy.yaml:3: rules[0].actions[1]: uncordon is not a rule action: it follows healing "
                "(set uncordonAfter)"
            ],
        ),
        (
            "rules:\n  - condition: GpuXid\n    actions:\n      - cordon\n      - cordon\n",
            ["policy.yaml:5: rules[0].actions[1]: duplicate action 'cordon'"],
        ),
        (
            "rules:\n  - condition: GpuXid\n    actions: []\n",
            [f"policy.yaml:3: rules[0].actions: required: a non-empty list of actions {KNOWN_ACTIONS}"],
        ),
        (
            "rules:\n  - actions: [cordon]\n",
            ["policy.yaml:2: rules[0].condition: required: a condition type (letters, digits and _.:/-)"],
        ),
        (
            "rules:\n  - condition: AcceleratedHardwareReady\n    actions: [cordon]\n",
            [
                "policy.yaml:2: rules[0].condition: AcceleratedHardwareReady is True when the node is healthy; "
                "recovery acts on conditions that are True while a problem is present: name the underlying "
                "condition (NeuronHealth, GpuXid, ...)"
            ],
        ),
        (
            "rules:\n  - condition: GpuXid\n    reasons: GpuXid79\n    actions: [cordon]\n",
            [
                "policy.yaml:3: rules[0].reasons: must be a list of reason globs, e.g. ['NeuronHasError_*'] "
                "([] = any reason)"
            ],
        ),
        (
            "rules:\n  - condition: GpuXid\n    reasons: ['']\n    actions: [cordon]\n",
            ["policy.yaml:3: rules[0].reasons[0]: must be a non-empty reason or glob, got ''"],
        ),
        (
            "rules:\n  - condition: GpuXid\n    actions: [cordon]\n    persist: soon\n",
            ["policy.yaml:4: rules[0].persist: invalid duration 'soon' (use e.g. '30s', '5m', '1h30m')"],
        ),
        (
            "rules:\n  - condition: GpuXid\n    actions: [cordon]\n  - condition: GpuXid\n"
            "    reasons: [GpuXid79]\n    actions: [cordon, mark-unhealthy]\n",
            [
                "policy.yaml:4: rules[1]: never matches: rules[0], line 2 already takes every reason of GpuXid "
                "listed here (the first matching rule governs a condition)"
            ],
        ),
        (
            "rules:\n  - condition: NeuronHealth\n    reasons: ['NeuronHasError_*']\n    actions: [cordon]\n"
            "  - condition: NeuronHealth\n    reasons: [NeuronHasError_DMA_ERROR]\n    actions: [mark-unhealthy]\n",
            [
                "policy.yaml:5: rules[1]: never matches: rules[0], line 2 already takes every reason of "
                "NeuronHealth listed here (the first matching rule governs a condition)"
            ],
        ),
        (
            "rules: {condition: GpuXid}\n",
            ["policy.yaml:1: rules: must be a list of {condition, reasons, actions, persist}"],
        ),
        ("rules:\n  - cordon\n", ["policy.yaml:2: rules[0]: must be a mapping with condition and actions"]),
        (
            "rules:\n",
            [
                "policy.yaml:1: rules: must be a list of {condition, reasons, actions, persist} (leave the key out "
                "for the built-in rules; base: none and [] for no rule)"
            ],
        ),
        (
            "- a\n- b\n",
            [
                "policy.yaml:1: expected a mapping (base, startupDelay, uncordonAfter, respectGracePeriod, rules, "
                "drain, budget)"
            ],
        ),
        (
            "startupDelay: -5s\n",
            ["policy.yaml:1: startupDelay: invalid duration '-5s' (use e.g. '30s', '5m', '1h30m')"],
        ),
        ("uncordonAfter: true\n", ["policy.yaml:1: uncordonAfter: expected a duration like '5m', got True"]),
        (
            "respectGracePeriod: yes please\n",
            ["policy.yaml:1: respectGracePeriod: must be true or false, got 'yes please'"],
        ),
        ("drain: 5m\n", ["policy.yaml:1: drain: must be a mapping"]),
        (
            "drain:\n  onDeadline: kill\n  evictionsPerSecond: 0\n  podDeadline: 0s\n  wait: 1m\n",
            [
                "policy.yaml:2: drain.onDeadline: must be one of report, delete, got 'kill'",
                "policy.yaml:3: drain.evictionsPerSecond: must be a number above 0, got 0",
                "policy.yaml:4: drain.podDeadline: must be longer than 0, got '0s'",
                "policy.yaml:5: drain.wait: unknown key 'wait' (did you mean 'waitForDeletion'?)",
            ],
        ),
        (
            "drain:\n  podDeadline: 1h\n  timeout: 30m\n",
            ["policy.yaml:2: drain.podDeadline: 1h is longer than the whole drain's timeout (30m)"],
        ),
        (
            "budget:\n  maxUnhealthy: 0\n",
            ["policy.yaml:2: budget.maxUnhealthy: must be at least 1, got 0"],
        ),
        (
            "budget:\n  maxUnhealthy: 150%\n",
            ["policy.yaml:2: budget.maxUnhealthy: a percentage must be above 0% and at most 100%, got '150%'"],
        ),
        (
            "budget:\n  maxUnhealthy: ten\n",
            ["policy.yaml:2: budget.maxUnhealthy: must be a count like 3 or a percentage like '10%', got 'ten'"],
        ),
        (
            "budget:\n  maxUnhealthy: 3\n  maxUnhealthyCap: 2\n",
            [
                "policy.yaml:3: budget.maxUnhealthyCap: caps a percentage; maxUnhealthy is the count 3: "
                "remove maxUnhealthyCap"
            ],
        ),
        (
            "budget:\n  maxUnhealthyCap: 0\n  maxActions: many\n  window: 0s\n",
            [
                "policy.yaml:2: budget.maxUnhealthyCap: must be an integer of at least 1 or null (no cap), got 0",
                "policy.yaml:3: budget.maxActions: must be an integer of at least 1, got 'many'",
                "policy.yaml:4: budget.window: must be longer than 0, got '0s'",
            ],
        ),
        (
            "budget:\n  nodeSelector: 'role in gpu'\n",
            [
                "policy.yaml:2: budget.nodeSelector: 'role in gpu' is not a label selector requirement (key, !key, "
                "key=value, key!=value, key in (a,b), key notin (a,b))"
            ],
        ),
        (
            "budget:\n  MaxActions: 3\n",
            ["policy.yaml:2: budget.MaxActions: unknown key 'MaxActions' (did you mean 'maxActions'?)"],
        ),
        (
            """
            budget:
              groups:
                - label: topology.kubernetes.io/zone
                  maxUnhealthy: 1
                  maxUnhealthyCap: 2
                - {label: "not a label!", maxUnhealthy: 1}
                - {label: topology.kubernetes.io/zone, maxUnhealthy: 2}
                - {label: pool}
                - {lable: pool, maxUnhealthy: 1}
            """,
            [
                "policy.yaml:5: budget.groups[0].maxUnhealthyCap: caps a percentage; maxUnhealthy is the count 1: "
                "remove maxUnhealthyCap",
                "policy.yaml:6: budget.groups[1].label: must be a label key like topology.kubernetes.io/zone, "
                "got 'not a label!'",
                "policy.yaml:7: budget.groups[2].label: topology.kubernetes.io/zone has a budget already: one budget "
                "per label",
                "policy.yaml:8: budget.groups[3]: needs maxUnhealthy (a count like 1 or a percentage like '20%')",
                "policy.yaml:9: budget.groups[4].lable: unknown key 'lable' (did you mean 'label'?)",
                "policy.yaml:9: budget.groups[4].label: must be a label key like topology.kubernetes.io/zone, got None",
            ],
        ),
        (
            "budget:\n  groups: {label: zone}\n",
            ["policy.yaml:2: budget.groups: must be a list of {label, maxUnhealthy, maxUnhealthyCap}"],
        ),
        (
            """
            budget:
              correlation:
                labels: []
                share: 0.3
                minNodes: 0
                newNodeWindow: 0s
                newNodeRepeats: two
            """,
            [
                "policy.yaml:3: budget.correlation.labels: must be a non-empty list of label keys (zone, pools)",
                "policy.yaml:4: budget.correlation.share: must be a percentage above 0% and below 100% like '30%', "
                "got 0.3",
                "policy.yaml:5: budget.correlation.minNodes: must be an integer of at least 1, got 0",
                "policy.yaml:6: budget.correlation.newNodeWindow: must be longer than 0, got '0s'",
                "policy.yaml:7: budget.correlation.newNodeRepeats: must be an integer of at least 1, got 'two'",
            ],
        ),
        (
            "budget:\n  correlation: [zone]\n",
            [
                "policy.yaml:2: budget.correlation: must be a mapping (labels, share, minNodes, newNodeWindow, "
                "newNodeRepeats) or null (off)"
            ],
        ),
        ("rules: [\n", [f"policy.yaml:2: invalid YAML: {NO_NODE}"]),
    ],
)
def test_problems(tmp_path, text, expected):
    assert problems(tmp_path, textwrap.dedent(text).lstrip("\n")) == expected


def test_every_problem_of_a_file_at_once_in_line_order(tmp_path):
    found = problems(
        tmp_path,
        """
        startupDelay: later
        rules:
          - condition: GpuXid
            actions: [reboot]
            persist: 1 minute
          - condition: NeuronHealth
            actions: [drain]
        budget:
          maxUnhealthy: 0%
        """,
    )
    assert found == [
        "policy.yaml:1: startupDelay: invalid duration 'later' (use e.g. '30s', '5m', '1h30m')",
        f"policy.yaml:4: rules[0].actions[0]: {REBOOT_IS_A_REMEDY}",
        "policy.yaml:5: rules[0].persist: invalid duration '1 minute' (use e.g. '30s', '5m', '1h30m')",
        "policy.yaml:7: rules[1].actions: drain needs cordon in the same rule: without it the scheduler puts pods "
        "back onto the node being drained",
        "policy.yaml:9: budget.maxUnhealthy: a percentage must be above 0% and at most 100%, got '0%'",
    ]


def test_a_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_policy(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: cannot read file: no such file or directory"


# ---- pieces ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3), ("10%", Fraction(10)), (" 12.5 % ", Fraction(25, 2)), ("100%", Fraction(100))],
)
def test_parse_max_unhealthy(value, expected):
    assert parse_max_unhealthy(value) == expected


@pytest.mark.parametrize("value", [0, -1, True, "0%", "101%", "10", "%", 2.5, None])
def test_parse_max_unhealthy_refuses(value):
    with pytest.raises(ValueError):
        parse_max_unhealthy(value)


@pytest.mark.parametrize(
    ("selector", "ok"),
    [
        ("", True),
        ("role=gpu", True),
        ("role==gpu,zone!=a", True),
        ("example.com/pool in (a, b),!excluded", True),
        ("gpu", True),
        ("role notin (x)", True),
        ("role in ()", False),
        ("role in gpu", False),
        ("=gpu", False),
        ("role=gp u", False),
        ("Bad_Prefix.com/x=y", False),
    ],
)
def test_selector_problem(selector, ok):
    assert (selector_problem(selector) is None) is ok


def test_policy_summary_of_the_default():
    assert policy_summary(DEFAULT_POLICY) == [
        "recovery rules: 13",
        "  NeuronHealth [NeuronHasError_*, raised by kernel-log or builtin-check]: cordon, mark-unhealthy",
        "  GpuXid [GpuXid54, GpuXid64, GpuXid142, raised by kernel-log or builtin-check]: cordon, mark-unhealthy",
        "  GpuXid [GpuXid46, GpuXid62, GpuXid94, GpuXid109, GpuXid110, GpuXid119, GpuXid120, GpuXid136, "
        "GpuXid143, GpuXid155, GpuXid156, GpuXid158, raised by kernel-log or builtin-check]: scope device (at most "
        "2 at once): fence-device, drain-device, cordon; ladder reboot -> replace (window 20m, 3 within 168h climb)",
        "  GpuXid [GpuXid46, GpuXid48, GpuXid62, GpuXid74, GpuXid79, GpuXid95, GpuXid109, GpuXid110"
        ", GpuXid119, GpuXid120, GpuXid136, GpuXid140, GpuXid143, GpuXid144, GpuXid145, GpuXid146, "
        "GpuXid147, GpuXid148, GpuXid149, GpuXid150, GpuXid151, GpuXid154, GpuXid155, GpuXid156, Gp"
        "uXid158, raised by kernel-log or builtin-check]: cordon; ladder reboot -> replace (window "
        "20m, 3 within 168h climb)",
        "  GpuXid [any reason, raised by kernel-log or builtin-check]: cordon (no remedy)",
        "  GpuDriverError [GpuFallenOffBus, GpuInitFailed, GpuProbeFailed, raised by kernel-log or "
        "builtin-check]: cordon; ladder reboot -> replace (window 20m, 3 within 168h climb)",
        "  GpuDriverError [any reason, raised by kernel-log or builtin-check]: cordon (no remedy)",
        "  GpuEcc [GpuRowRemapFailure, raised by kernel-log or builtin-check]: cordon, mark-unhealthy",
        "  GpuEcc [GpuEccUncorrectable, GpuRowRemapPending, GpuRetiredPagesPending, raised by kerne"
        "l-log or builtin-check]: cordon; ladder reboot -> replace (window 20m, 3 within 168h climb"
        ")",
        "  GpuEcc [any reason, raised by kernel-log or builtin-check]: cordon (no remedy)",
        "  GpuCount [GpuLost, GpuResetRequired, GpuMissing, raised by kernel-log or builtin-check]:"
        " cordon; ladder reboot -> replace (window 20m, 3 within 168h climb)",
        "  GpuCount [any reason, raised by kernel-log or builtin-check]: cordon (no remedy)",
        "  NeuronDevices [any reason, raised by kernel-log or builtin-check]: cordon, mark-unhealthy",
        "validation: none (a rebooted node or unfenced device returns after its quiet window alone)",
        "startup delay: 1m",
        "uncordon: never (a node we cordoned stays cordoned until an operator uncordons it)",
        "mark-unhealthy: SetInstanceHealth respects the Auto Scaling health check grace period",
        "drain: 5 evictions/s, each pod 5m then report, wait 2m for deletion, whole drain 30m",
        "budget: 10% of the failure domains (rounded up, at least 1, at most 10) of all nodes disrupted at once; "
        "10 disruptive actions per 10m; 20 device actions per 10m",
        "correlated failure: held where more than 30% (at least 3) of a group's nodes, or 2 created within 1h, show "
        "one problem type; groups by topology.kubernetes.io/zone, eks.amazonaws.com/nodegroup, karpenter.sh/nodepool, "
        "cloud.google.com/gke-nodepool, kubernetes.azure.com/agentpool",
    ]


def test_policy_summary_of_a_file(tmp_path):
    policy = load_policy(
        write(
            tmp_path,
            """
            startupDelay: 0
            uncordonAfter: 10m
            rules:
              - {condition: GpuXid, actions: [cordon, drain], persist: 90s}
            budget:
              maxUnhealthy: 2
              maxUnhealthyCap: null
              nodeSelector: role=gpu
              groups: [{label: topology.kubernetes.io/zone, maxUnhealthy: 50%, maxUnhealthyCap: 2}]
              correlation: null
            base: none
            """,
        )
    )
    assert policy_summary(policy) == [
        "recovery rules: 1",
        "  GpuXid [any reason, raised by kernel-log or builtin-check]: cordon, drain, after 1m30s True",
        "validation: none (a rebooted node or unfenced device returns after its quiet window alone)",
        "startup delay: none",
        "uncordon: a node we cordoned, once healthy for 10m (never one marked unhealthy)",
        "mark-unhealthy: SetInstanceHealth respects the Auto Scaling health check grace period",
        "drain: 5 evictions/s, each pod 5m then report, wait 2m for deletion, whole drain 30m",
        "budget: 2 failure domain(s) of nodes matching 'role=gpu' disrupted at once; 10 disruptive actions per 10m; "
        "20 device actions per 10m",
        "  and 50%, at most 2 per topology.kubernetes.io/zone value",
        "correlated failure: never held",
    ]
    assert policy_summary(RecoveryPolicy(rules=()))[0] == "recovery rules: 0 (recovery never acts)"


KERNEL, BUILTIN, PLUGIN = Provenance.KERNEL_LOG, Provenance.BUILTIN_CHECK, Provenance.CHECK


@pytest.mark.parametrize(
    ("cond", "owner", "expected"),
    [
        (condition("NeuronHealth", "NeuronHasError_DMA_ERROR"), KERNEL, True),
        (condition("NeuronHealth", "NeuronHasNoError", Status.FALSE), KERNEL, False),
        (condition("NeuronHealth", "NeuronHasError_DMA_ERROR", Status.UNKNOWN), KERNEL, False),
        (condition("NeuronHealth", "SomethingElse"), KERNEL, False),
        (condition("GpuXid", "GpuXid79"), KERNEL, True),
        (condition("GpuNvlink", "GpuNvlinkBad"), BUILTIN, False),  # no default rule
        (condition("NeuronDevices", "NeuronDevicesMissing"), BUILTIN, True),
        # A third-party plugin (or an owner not known) raising a built-in condition is not trusted.
        (condition("NeuronHealth", "NeuronHasError_DMA_ERROR"), PLUGIN, False),
        (condition("NeuronHealth", "NeuronHasError_DMA_ERROR"), Provenance.CUSTOM_PLUGIN, False),
        (condition("NeuronHealth", "NeuronHasError_DMA_ERROR"), None, False),
    ],
)
def test_published(cond, owner, expected):
    assert published(DEFAULT_POLICY)(cond, owner) is expected


@pytest.mark.parametrize(
    ("rule", "sources"),
    [
        # Built-in condition types trust their built-in owners unless the rule says otherwise.
        ("{condition: NeuronHealth, actions: [cordon]}", TRUSTED_FOR_BUILTIN),
        ("{condition: GpuEcc, actions: [cordon]}", TRUSTED_FOR_BUILTIN),
        ("{condition: NeuronHealth, actions: [cordon], sources: [check]}", (Provenance.CHECK,)),
        # A type of the operator's own: whoever owns it in the configuration.
        ("{condition: MyFabric, actions: [cordon]}", ()),
        (
            "{condition: MyFabric, actions: [cordon], sources: [custom-plugin, custom-plugin]}",
            (Provenance.CUSTOM_PLUGIN,),
        ),
    ],
)
def test_rule_sources(tmp_path, rule, sources):
    (loaded,) = load_policy(write(tmp_path, f"rules:\n  - {rule}\nbase: none\n")).rules
    assert loaded.sources == sources


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ("{condition: GpuXid, actions: [cordon], sources: []}", "rules[0].sources: must be a non-empty list of"),
        ("{condition: GpuXid, actions: [cordon], sources: kernel-log}", "rules[0].sources: must be a non-empty list"),
        ("{condition: GpuXid, actions: [cordon], sources: [kernel]}", "rules[0].sources[0]: unknown source 'kernel'"),
        ("{condition: Ready, actions: [cordon]}", "rules[0].condition: Ready is True when the node is healthy"),
        ("{condition: StorageReady, actions: [cordon]}", "rules[0].condition: StorageReady is True when the node"),
    ],
)
def test_bad_rule_sources_and_reserved_types_exit_2_with_file_and_line(tmp_path, rule, problem):
    path = write(tmp_path, f"rules:\n  - {rule}\n")
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert f"{path}:2: {problem}" in str(err.value)
