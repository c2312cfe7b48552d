"""How well the built-in rule packs do on real, labelled kernel lines (../shared/testdata).

Each line of ``kernel-lines.jsonl`` is matched alone, as ``simulate`` would. Figures:

- recall: lines labelled as a problem that yield a finding (context lines of a multi-line incident,
  which only need to follow a detected line, are left out), overall and per family (a row's
  ``family``, else its ``category``);
- false positives: lines labelled healthy that yield a finding;
- Xid node-impact agreement: Xid lines whose finding sets condition ``GpuXid`` exactly when the
  catalog says the node (not the application) needs action.

The file is a check, not the specification: rules come from the code that prints the messages
(see docs/rule-packs.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CONTEXT_EVENTS = frozenset({"gsp_rpc_dump_context", "stack_dump_header", "panic_context", "hung_task_context"})


@dataclass(frozen=True, kw_only=True)
class Accuracy:
    problems: int
    caught: int
    healthy: int
    false_positives: int
    xid_lines: int
    xid_agree: int
    by_category: dict[str, tuple[int, int]]  # family (else category) -> (caught, problems)
    missed: tuple[str, ...]
    false_alarms: tuple[str, ...]


def score(path: Path) -> Accuracy:
    from agent.app.cli import simulate_lines
    from agent.app.config import load_rule_set
    from agent.app.settings import builtin_packs
    from agent.core.paths import builtin_plugins_dir

    rule_set = load_rule_set([builtin_plugins_dir() / p for p in builtin_packs()])
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    caught = Counter()
    total = Counter()
    missed, false_alarms = [], []
    healthy = fp = xid_lines = xid_agree = 0
    for row in rows:
        label = row.get("label", {})
        if label.get("event") in CONTEXT_EVENTS:
            continue
        found = list(simulate_lines(rule_set=rule_set, lines=iter([row["text"]])))
        if not row["expect_problem"]:
            healthy += 1
            if found:
                fp += 1
                false_alarms.append(row["text"])
            continue
        family = row.get("family") or row["category"]
        total[family] += 1
        if found:
            caught[family] += 1
        else:
            missed.append(row["text"])
        if "xid" in label:
            xid_lines += 1
            permanent = any(f["type"] == "permanent" and f["condition"] == "GpuXid" for f in found)
            if permanent == (label.get("expected_node_impact") == "node"):
                xid_agree += 1
    return Accuracy(
        problems=sum(total.values()),
        caught=sum(caught.values()),
        healthy=healthy,
        false_positives=fp,
        xid_lines=xid_lines,
        xid_agree=xid_agree,
        by_category={c: (caught[c], total[c]) for c in sorted(total)},
        missed=tuple(missed),
        false_alarms=tuple(false_alarms),
    )


def main(argv: list[str] | None = None) -> int:
    """``python bench/accuracy.py FILE.jsonl ...``: the figures for other labelled files (same format)."""
    import sys

    for name in argv if argv is not None else sys.argv[1:]:
        acc = score(Path(name))
        print(f"{name}: recall {acc.caught}/{acc.problems}, false positives {acc.false_positives}/{acc.healthy}")
        for family, (caught, total) in acc.by_category.items():
            print(f"  {family}: {caught}/{total}")
        for text in acc.missed:
            print(f"  missed: {text[:150]}")
        for text in acc.false_alarms:
            print(f"  false alarm: {text[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


@dataclass(frozen=True, kw_only=True)
class SiteCoverage:
    subsystem: str
    sites: int
    covered: int
    excluded: int
    uncovered: tuple[str, ...]  # "path:line text" of each site neither covered nor excluded


def rule_finder(rule_set: object) -> Callable[[list[str]], bool]:
    """``finds`` for printsites.coverage: whether the rules give a finding for any of a message's records.

    The records of one message are fed together, as the kernel logs them; time 0, so thresholds count
    each match (as ``simulate`` does).
    """
    from agent.detectors.rules import RuleEngine

    def finds(lines: list[str]) -> bool:
        engine = RuleEngine(rule_set=rule_set)  # fresh per message: no state carried between sites
        return any(True for _ in engine.feed(list(lines), times=0.0, line_numbers=list(range(1, len(lines) + 1))))

    return finds


def print_site_coverage(plugins_dir: Path | None = None) -> list[SiteCoverage]:
    """Per subsystem: error-level print sites the built-in rules speak for or exclude (plugins/*/generate_*.py)."""
    import sys

    from agent.app.config import load_rule_set
    from agent.core.paths import builtin_plugins_dir

    root = plugins_dir or builtin_plugins_dir()
    sys.path.insert(0, str(root / "kernel"))
    try:
        import printsites
    finally:
        sys.path.remove(str(root / "kernel"))
    finds = rule_finder(load_rule_set([root]))
    out = []
    for path in printsites.generators(root):
        gen = printsites.load_generator(path)
        sites = printsites.read_extract(Path(gen.EXTRACT).read_text())
        cov = printsites.coverage(
            gen.SPEC.name, sites, finds=finds, exclusions=gen.EXCLUSIONS, driver=getattr(gen, "DRIVER", "nvme")
        )
        out.append(
            SiteCoverage(
                subsystem=cov.subsystem,
                sites=cov.sites,
                covered=cov.covered,
                excluded=cov.excluded,
                uncovered=tuple(f"{s.where} {s.text}" for s in cov.uncovered),
            )
        )
    return out
