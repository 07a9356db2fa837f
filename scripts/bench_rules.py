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
    levels = args.levels.split(",")
    print(f"`{shlex.join(['python', 'scripts/bench_rules.py', *(argv or sys.argv[1:])])}`\n")
    print(
        "One row per model and ORT level, 1 thread; speedup = original / rewritten (median of "
        "per-pair ratios in one interleaved run); candidates are distinct rewritten graphs "
        "(deduplicated by canonical hash).\n"
    )
    print(
        "| model | nodes | candidates | portable | rules with a site | enumerate (s) "
        "| ort-level | original ms | screened > 1.02x | best rule | screened speedup "
        "| confirmed speedup |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|", flush=True)
    # One model at a time: candidate graphs of a full model hold their own new weights.
    for name in args.models:
        graph = load_model(zoo.cached_path(name, args.size))
        graph.canonical_hash()
        started = time.perf_counter()
        candidates = ruleset.candidates(graph)
        enumerate_s = time.perf_counter() - started
        n_portable = len(portable.candidates(graph))
        rules_used = len({c.rule.name for c in candidates})
        with tqdm(
            total=len(candidates) * len(levels), desc=name, unit="cand", file=sys.stderr
        ) as bar:
            for level in levels:
                settings = OrtSettings(ort_level=level)
                speedups = screen(graph, candidates, settings, args.batch, args.runs, bar)
                best = max(range(len(candidates)), key=speedups.__getitem__)
                confirm = Runner(settings, runs=args.confirm_runs).compare(
                    [graph, candidates[best].graph], use_cache=False
                )
                improving = sum(s > 1.02 for s in speedups)
                print(
                    f"| {name} | {len(graph)} | {len(candidates)} | {n_portable} "
                    f"| {rules_used} | {enumerate_s:.2f} | {level} "
                    f"| {confirm.scaled_ms[0]:.2f} | {improving} "
                    f"| {candidates[best].rule.name} | {speedups[best]:.3f} "
                    f"| {confirm.speedups[1]:.3f} |",
                    flush=True,
                )
        del candidates
    return 0


if __name__ == "__main__":
    sys.exit(main())
