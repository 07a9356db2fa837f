#!/usr/bin/env python
"""Can the rule library speed models up on this backend? (docs/BENCHMARKS.md, "Rules")

For each model: the number of distinct candidates (all rules, and the portable set) and the
time to enumerate them; then, under each ORT level, every candidate is measured once,
interleaved with the original in batches of --batch graphs (original first), and the best
single rewrite is measured again against the original alone, with more runs, to report its
speedup without the winner's curse of picking a maximum among noisy numbers.

    python scripts/bench_rules.py --size full [MODEL ...]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from tqdm import tqdm

from rlflow import zoo
from rlflow.cost import OrtSettings, Runner
from rlflow.graph import load_model
from rlflow.rewrite import default_ruleset


def screen(graph, candidates, settings: OrtSettings, batch: int, runs: int, bar) -> list[float]:
    """Speedup of each candidate over the original, each measured once in an interleaved batch."""
    runner = Runner(settings, runs=runs, min_time_s=0.0, warmup=2)
    speedups: list[float] = []
    for start in range(0, len(candidates), batch):
        chunk = candidates[start : start + batch]
        comparison = runner.compare([graph, *(c.graph for c in chunk)], use_cache=False)
        speedups += list(comparison.speedups[1:])
        bar.update(len(chunk))
    return speedups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(zoo.MODEL_NAMES))
    parser.add_argument("--size", choices=zoo.SIZES, default="full")
    parser.add_argument("--levels", default="all,disable")
    parser.add_argument("--batch", type=int, default=6, help="candidates per interleaved run")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per graph when screening")
    parser.add_argument("--confirm-runs", type=int, default=40, help="runs to confirm the best")
    args = parser.parse_args(argv)

    ruleset, portable = default_ruleset(), default_ruleset(portable=True)
    counts, results = [], []
    graphs = {}
    for name in args.models:
        graph = load_model(zoo.cached_path(name, args.size))
        graph.canonical_hash()
        started = time.perf_counter()
        candidates = ruleset.candidates(graph)
        enumerate_s = time.perf_counter() - started
        rules_used = len({c.rule.name for c in candidates})
        counts.append((name, len(graph), len(candidates), len(portable.candidates(graph)),
                       rules_used, enumerate_s))
        graphs[name] = (graph, candidates)

    total = sum(len(c) for _, c in graphs.values()) * len(args.levels.split(","))
    with tqdm(total=total, desc="bench_rules", unit="cand", file=sys.stderr) as bar:
        for name, (graph, candidates) in graphs.items():
            for level in args.levels.split(","):
                settings = OrtSettings(ort_level=level)
                speedups = screen(graph, candidates, settings, args.batch, args.runs, bar)
                best = max(range(len(candidates)), key=speedups.__getitem__)
                confirm = Runner(settings, runs=args.confirm_runs).compare(
                    [graph, candidates[best].graph], use_cache=False
                )
                improving = sum(s > 1.02 for s in speedups)
                results.append((name, level, len(candidates), improving,
                                candidates[best].rule.name, speedups[best],
                                confirm.speedups[1], confirm.measurements[0].min_ms))

    print(f"`{shlex.join(['python', 'scripts/bench_rules.py', *(argv or sys.argv[1:])])}`\n")
    print("Candidates (distinct rewritten graphs, deduplicated by canonical hash):\n")
    print("| model | nodes | candidates | portable candidates | rules with a site "
          "| enumerate (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, nodes, n_all, n_portable, rules_used, enumerate_s in counts:
        print(f"| {name} | {nodes} | {n_all} | {n_portable} | {rules_used} | {enumerate_s:.2f} |")
    print("\nBest single rewrite, 1 thread (speedup = original / rewritten, min over runs):\n")
    print("| model | ort-level | original ms | candidates | screened > 1.02x | best rule "
          "| screened speedup | confirmed speedup |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for name, level, n, improving, rule, screened, confirmed, original_ms in results:
        print(f"| {name} | {level} | {original_ms:.2f} | {n} | {improving} | {rule} "
              f"| {screened:.3f} | {confirmed:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
