#!/usr/bin/env python
"""How noisy is an end-to-end reward? The saving of one fixed rewrite path, measured two ways.

For each model, G is the graph reached from the original by `--steps` greedy steps on the
analytic cost (the candidate of lowest analytic cost each time). Then, `--reps` times, in
alternating order, the saving 100 (C_0 - C_G) / C_0 -- an episode's return -- is measured:

- separately (how the env's e2e rewards were first measured): the original and G each timed
  alone, one after the other (`Runner.measure`, their 3rd-smallest runs);
- interleaved (the env's e2e rewards now): both timed in one run (`Runner.compare`), saving
  100 (1 - ratio), the ratio being the median of per-pair ratios;

each with the env's fixed `REWARD_MEASURE_S` of timed runs per graph. The same is done with
G = the original (the true saving is 0). Prints the command and one markdown table: the
saving's mean, standard deviation, min and max over the repetitions, per method.

    python scripts/bench_reward.py squeezenet-1.1 resnet-18 --size full --reps 10
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

from rlflow.cost import AnalyticCostModel, OrtSettings, Runner
from rlflow.envs.graph_rewrite import REWARD_MEASURE_S
from rlflow.graph import Graph, load_model
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.zoo import cached_path


def greedy_path(graph: Graph, steps: int) -> tuple[Graph, list[str]]:
    """The graph after `steps` lowest-analytic-cost rewrites (fewer if none lowers it)."""
    analytic = AnalyticCostModel()
    session = RewriteSession(graph, default_ruleset())
    cost = analytic.cost_ms(graph)
    rules = []
    for _ in range(steps):
        scored = [(analytic.cost_ms(c.graph), c) for c in session.candidates()]
        if not scored:
            break
        best_cost, best = min(scored, key=lambda pair: pair[0])
        if best_cost >= cost:
            break
        session.apply_candidate(best)
        cost = best_cost
        rules.append(best.rule.name)
    return session.graph, rules


def separate_saving(runner: Runner, original: Graph, graph: Graph) -> float:
    c0 = runner.measure(original, use_cache=False).low_ms
    cg = runner.measure(graph, use_cache=False).low_ms
    return 100.0 * (c0 - cg) / c0


def interleaved_saving(runner: Runner, original: Graph, graph: Graph) -> float:
    return 100.0 * (1.0 - runner.compare([original, graph], use_cache=False).ratios[1])


def spread(values: list[float]) -> str:
    return (
        f"{statistics.mean(values):+.2f} | {statistics.stdev(values):.2f} "
        f"| {min(values):+.2f} | {max(values):+.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="zoo model names")
    parser.add_argument("--size", default="full", help="zoo model size (default full)")
    parser.add_argument("--steps", type=int, default=5, help="greedy rewrites from the original")
    parser.add_argument("--reps", type=int, default=10, help="measurements per method")
    parser.add_argument("--ort-level", default="all", help="onnxruntime level (default all)")
    args = parser.parse_args(argv)
    if args.reps < 2:
        parser.error("--reps must be at least 2 (the table gives a standard deviation)")

    runner = Runner(OrtSettings(threads=1, ort_level=args.ort_level), min_time_s=REWARD_MEASURE_S)
    load_start = os.getloadavg()
    rows = []
    for name in args.models:
        original = load_model(cached_path(name, args.size))
        graph, rules = greedy_path(original, args.steps)
        for label, target in ((f"{len(rules)} greedy steps", graph), ("itself", original)):
            savings: dict[str, list[float]] = {"separate": [], "interleaved": []}
            for rep in range(args.reps):
                order = ["separate", "interleaved"][:: 1 if rep % 2 == 0 else -1]
                for method in order:
                    measure = separate_saving if method == "separate" else interleaved_saving
                    savings[method].append(measure(runner, original, target))
                print(
                    f"[bench_reward {time.strftime('%H:%M:%S')}] {name} vs {label}: "
                    f"rep {rep + 1}/{args.reps}: separate {savings['separate'][-1]:+.2f}, "
                    f"interleaved {savings['interleaved'][-1]:+.2f} "
                    f"(load {os.getloadavg()[0]:.2f})",
                    file=sys.stderr,
                    flush=True,
                )
            for method, values in savings.items():
                rows.append(f"| {name} ({args.size}) | {label} | {method} | {spread(values)} |")
        print(f"[bench_reward] {name}: path {rules}", file=sys.stderr, flush=True)

    print(f"`{shlex.join(['python', 'scripts/bench_reward.py', *(argv or sys.argv[1:])])}`\n")
    print(
        f"ORT level {args.ort_level}, 1 thread, {REWARD_MEASURE_S} s of timed runs per graph; "
        f"load average (1/5/15 min) at start {' / '.join(f'{x:.2f}' for x in load_start)}, "
        f"at end {' / '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    print("| model | G = original after | measured | saving % mean | std | min | max |")
    print("|---|---|---|---:|---:|---:|---:|")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
