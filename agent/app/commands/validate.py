"""The ``validate-config`` command: validate every configuration file (and the recovery policy) without
running anything; exit 0 with a summary or 2 with every problem."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from agent.app.exitcodes import EXIT_OK
from agent.app.flags import add_flag, flag
from agent.app.flagvalues import builtin_packs
from agent.app.settings import rule_paths
from agent.core.errors import ConfigProblem
from agent.core.paths import builtin_plugins_dir
from agent.core.types import RuleType
from agent.detectors.rulepack import RuleSet


def add_parser(sub: argparse._SubParsersAction, *, parents: Sequence[argparse.ArgumentParser]) -> None:
    val = sub.add_parser(
        "validate-config",
        parents=list(parents),
        help="check rule packs",
        description="Validate the rule packs (the plugins plus FILEs); exit 0 with a summary or 2 with every problem.",
    )
    add_flag(val, flag("plugins-dir"), help="directory of rule packs; repeatable")
    add_flag(val, flag("pack"), help=f"built-in packs to use ({', '.join(builtin_packs())})")
    add_flag(
        val,
        flag("recovery-policy"),
        help="also validate this recovery policy and print it (env NHA_RECOVERY_POLICY; default: the built-in one)",
    )
    val.add_argument(
        "--print-policy",
        action="store_true",
        help="print only the effective recovery policy, as a policy file (base: none) you can copy",
    )
    val.add_argument("files", nargs="*", metavar="FILE", help="rule pack files to validate")


def validate(args: argparse.Namespace) -> int:
    if getattr(args, "print_policy", False):
        from agent.app.commands.policy import print_policy

        return print_policy(args, validate)
    from agent.app.config import load_agent_config

    paths = rule_paths(args, args.files)
    config = load_agent_config(paths)
    # Build every check too (nothing runs): bad options are configuration errors here as in `run`.
    import tempfile

    from agent.app.config import build_scheduled_checks
    from agent.checks.model import CheckContext

    with tempfile.TemporaryDirectory(prefix="node-health-agent-validate-") as scratch:
        build_scheduled_checks(config, context=CheckContext(state_dir=Path(scratch)))
    rule_set = config.rule_set
    temporary = sum(1 for r in rule_set.rules if r.type is RuleType.TEMPORARY)
    print(
        f"OK: {len(config.files)} file(s), {len(rule_set.rules)} rules ({temporary} temporary, "
        f"{len(rule_set.rules) - temporary} permanent), {len(rule_set.conditions)} conditions, "
        f"{sum(1 for d in config.check_decls if d.enabled)} checks, "
        f"{sum(len(p.checks) for p in config.custom_plugins)} custom plugin checks, "
        f"{len(config.log_monitors)} log monitors"
    )
    for f in config.files:
        print(f"  file: {f.path} ({f.kind.value})")
    for cond in rule_set.conditions:
        print(f"  condition: {cond.type} (healthy reason {cond.reason})")
    slow = [r.name for r in rule_set.rules if r.literals is None]
    if slow:
        print(f"  note: these rules have no required literal and run on every line: {', '.join(slow)}")
    replaced: dict[str, list[str]] = {}
    for name, by in rule_set.replaced:
        replaced.setdefault(by, []).append(name)
    for by, names in replaced.items():
        print(
            f"  note: {by} replaces {len(names)} earlier rule(s) of the same type, condition and reason "
            f"(its rules have no name; name a rule to add it instead): {', '.join(names)}"
        )
    for rule, by in rule_set.covered:
        print(
            f"  note: {rule} is not loaded: the built-in rule {by} already gives its reason (no problem twice); "
            "load the file without that rule's pack (--pack) to use its rule instead"
        )
    for warning in [*config.warnings, *npd_warnings(rule_set)]:
        print(f"  warning: {warning}")
    from agent.app.commands.policy import report

    report(args)  # the recovery policy: summary, built-in rules left out
    return EXIT_OK


def npd_warnings(rule_set: RuleSet) -> list[ConfigProblem]:
    """Patterns of the user's files that node-problem-detector would match differently (docs/rule-packs.md)."""
    from agent.core.configdoc import read_pack
    from agent.core.regex import npd_differences

    builtin = builtin_plugins_dir().resolve()
    docs: dict[str, object] = {}
    found = []
    for rule in rule_set.rules:
        if Path(rule.file).resolve().is_relative_to(builtin):
            continue
        for message in npd_differences(rule.pattern):
            if rule.file not in docs:
                docs[rule.file] = read_pack(Path(rule.file))[0]
            doc = docs[rule.file]
            path = ("rules", rule.index, "pattern")
            line = doc.line(path) if doc is not None else None  # type: ignore[attr-defined]
            found.append(
                ConfigProblem(file=rule.file, field=f"rules[{rule.index}].pattern", message=message, line=line)
            )
    return found
