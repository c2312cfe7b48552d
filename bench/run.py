"""Benchmarks: each figure printed beside its target, measured side by side in one run.

Usage (from the checkout, with the package installed)::

    python bench/run.py [NAME ...] [--json FILE]

NAME selects benchmarks by prefix (e.g. ``rules``); ``--json`` writes a flat object of
figure name -> number. Exit status 1 when a figure misses its target.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.corpus import kernel_lines  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class Figure:
    name: str
    value: float
    target: str  # e.g. ">= 1000000"
    unit: str = ""

    def ok(self) -> bool:
        if not self.target:
            return True
        op, bound = self.target.split()
        return self.value >= float(bound) if op == ">=" else self.value <= float(bound)


def bench_rules() -> list[Figure]:
    """Fast matcher vs the per-rule reference matcher over the built-in packs."""
    from agent.detectors.rulepack import load_rule_set
    from agent.detectors.rules import ReferenceEngine, RuleEngine
    from agent.settings import builtin_plugins_dir

    rule_set = load_rule_set([builtin_plugins_dir()])
    lines = kernel_lines(1_000_000, fault_rate=0.001)
    batch = 4096

    def run_fast(sample: list[str]) -> tuple[float, int]:
        engine = RuleEngine(rule_set=rule_set)
        start = time.perf_counter()
        found = 0
        for i in range(0, len(sample), batch):
            found += len(engine.feed(sample[i : i + batch], times=0.0))
        return time.perf_counter() - start, found

    # The reference (every rule on every line's buffer, as node-problem-detector does) is ~1000x
    # slower, so it runs on a 20,000-line prefix of the same stream; rates are per line.
    ref_sample = lines[:20_000]
    ref_engine = ReferenceEngine(rule_set=rule_set)
    start = time.perf_counter()
    ref_findings = ref_engine.feed(ref_sample, times=0.0)
    ref_seconds = time.perf_counter() - start
    fast_engine = RuleEngine(rule_set=rule_set)
    fast_findings = fast_engine.feed(ref_sample, times=0.0)
    if [(f.line, f.rule, f.message) for f in fast_findings] != [(f.line, f.rule, f.message) for f in ref_findings]:
        raise SystemExit("fast and reference matchers disagree on the benchmark stream")

    best = min(run_fast(lines)[0] for _ in range(3))
    fast_rate = len(lines) / best
    ref_rate = len(ref_sample) / ref_seconds
    return [
        Figure(name="rules.lines_per_s", value=fast_rate, target=">= 1000000", unit="lines/s"),
        Figure(name="rules.reference_lines_per_s", value=ref_rate, target="", unit="lines/s"),
        Figure(name="rules.ratio", value=fast_rate / ref_rate, target=">= 10", unit="x"),
    ]


BENCHMARKS: dict[str, Callable[[], list[Figure]]] = {"rules": bench_rules}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="benchmarks to run (prefixes); default: all")
    parser.add_argument("--json", metavar="FILE", help="write figure name -> value as a flat JSON object")
    args = parser.parse_args(argv)
    selected = [n for n in BENCHMARKS if not args.names or any(n.startswith(p) for p in args.names)]
    if not selected:
        parser.error(f"no benchmark matches {args.names}; available: {', '.join(BENCHMARKS)}")
    figures: list[Figure] = []
    for name in selected:
        print(f"== {name}", flush=True)
        for fig in BENCHMARKS[name]():
            figures.append(fig)
            verdict = "" if not fig.target else ("  ok" if fig.ok() else "  MISSED")
            target = f"(target {fig.target})" if fig.target else ""
            print(f"{fig.name:32} {fig.value:16,.1f} {fig.unit:8} {target}{verdict}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({f.name: round(f.value, 3) for f in figures}, indent=2) + "\n")
    return 0 if all(f.ok() for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
