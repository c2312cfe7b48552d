"""The recovery policy in ``validate-config`` and at the agent's start.

``validate-config`` prints what recovery would do with the policy (agent.recovery.policyfile.policy_summary)
and each built-in rule the policy file leaves out or replaces; ``validate-config --print-policy`` prints
only the effective policy as a policy file (agent.recovery.policydump), after validating everything as
``validate-config`` does. ``run`` logs the built-in rules left out, once, at start.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
from collections.abc import Callable
from pathlib import Path

from agent.app.exitcodes import EXIT_OK
from agent.recovery.model import RecoveryPolicy

log = logging.getLogger(__name__)


def load(policy_file: str | Path | None) -> RecoveryPolicy:
    """The policy in ``policy_file`` (merged into the built-in one unless it says ``base: none``), or the
    built-in policy. Raises ConfigError (exit 2) naming file, line and field."""
    from agent.recovery.policyfile import DEFAULT_POLICY, load_policy

    return load_policy(Path(policy_file)) if policy_file else DEFAULT_POLICY


def left_out(policy: RecoveryPolicy) -> list[str]:
    """The built-in rules ``policy`` does not apply as they are, one line each, with what took their place."""
    from agent.recovery.policyfile import DEFAULT_RULES
    from agent.recovery.policymerge import not_in_force

    return not_in_force(policy, DEFAULT_RULES)


def report(args: argparse.Namespace) -> None:
    """The ``recovery policy`` section of ``validate-config``."""
    from agent.recovery.policyfile import policy_summary

    policy_file = getattr(args, "recovery_policy", None)
    policy = load(policy_file)
    print(f"recovery policy ({policy_file or 'built-in'}):")
    for line in policy_summary(policy):
        print(f"  {line}")
    for line in left_out(policy):
        print(f"  note: built-in rule {line}")
    print("  (validate-config --print-policy prints the effective policy as a policy file)")


def print_policy(args: argparse.Namespace, validate: Callable[[argparse.Namespace], int]) -> int:
    """``validate-config --print-policy``: everything validated by ``validate`` (its report discarded),
    then only the effective policy as YAML on stdout."""
    from agent.recovery.policydump import policy_yaml

    quiet = argparse.Namespace(**{**vars(args), "print_policy": False})
    with contextlib.redirect_stdout(io.StringIO()):
        code = validate(quiet)
    if code != EXIT_OK:
        return code
    policy_file = getattr(args, "recovery_policy", None)
    print(policy_yaml(load(policy_file), origin=f"from {policy_file}" if policy_file else "built-in"), end="")
    return EXIT_OK


def log_left_out(policy: RecoveryPolicy, policy_file: str | Path | None) -> None:
    """At start: a warning naming each built-in rule the policy file leaves out or replaces."""
    lines = left_out(policy)
    if not lines:
        return
    log.warning(
        "recovery policy %s: %d built-in rule(s) not in force as built in (validate-config --print-policy "
        "shows the effective policy): %s",
        policy_file,
        len(lines),
        "; ".join(lines),
    )
