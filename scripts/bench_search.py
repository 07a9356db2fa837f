#!/usr/bin/env python
"""Search baselines against onnxruntime's own optimiser (docs/BENCHMARKS.md, "Search").

For each model: (1) onnxruntime's optimisation levels on the original — each level's optimised
graph is saved by onnxruntime and all of them are then timed interleaved in one run with the
optimiser off, so their ratios come from one run; (2) under each ORT level given, greedy, taso
and random search (analytic cost, as `rlflow search`), each result verified equivalent to the
original, with its measured speedup (interleaved confirmation run), wall time and expansions.

    python scripts/bench_search.py --size full --taso-budget 300 squeezenet-1.1 resnet-18
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile

import onnx
import onnxruntime as ort

from rlflow import zoo
from rlflow.cost import ORT_LEVELS, OrtSettings, Runner, check_equivalence
from rlflow.graph import Graph, load_model
from rlflow.report import format_rules
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.search import default_runner, make_cost, search

ORT_OWN_LEVELS = ("disable", "basic", "extended", "all")


def ort_optimized(graph: Graph, level: str) -> onnx.ModelProto:
    """The graph as onnxruntime's optimiser leaves it at `level` (saved by onnxruntime)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        options = ort.SessionOptions()
        options.graph_optimization_level = ORT_LEVELS[level]
        options.optimized_model_filepath = path
        options.intra_op_num_threads = 1
        options.log_severity_level = 3  # the "hardware specific" warning: we run it right here
        ort.InferenceSession(
            graph.to_onnx().SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return onnx.load(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(zoo.MODEL_NAMES))
    parser.add_argument("--size", choices=zoo.SIZES, default="full")
    parser.add_argument("--levels", default="disable,all")
    parser.add_argument("--methods", default="greedy,taso,random")
    parser.add_argument("--taso-budget", type=int, default=1000)
    parser.add_argument("--random-budget", type=int, default=300)
    args = parser.parse_args(argv)

    print(f"`{shlex.join(['python', 'scripts/bench_search.py', *(argv or sys.argv[1:])])}`\n")
    print(
        "onnxruntime's own levels on the original (1 thread; graphs optimised by onnxruntime,"
        " then timed interleaved in one run with its optimiser off; speedup over `disable`):\n"
    )
    print("| model | disable ms | basic | extended | all |")
    print("|---|---:|---:|---:|---:|")
    graphs = {}
    for name in args.models:
        graph = load_model(zoo.cached_path(name, args.size))
        graphs[name] = graph
        optimised = [ort_optimized(graph, level) for level in ORT_OWN_LEVELS]
        comparison = Runner(OrtSettings(ort_level="disable"), min_time_s=1.0).compare(optimised)
        speedups = " | ".join(f"{s:.3f}x" for s in comparison.speedups[1:])
        print(f"| {name} | {comparison.scaled_ms[0]:.2f} | {speedups} |", flush=True)

    print(
        "\nSearch baselines (analytic cost; speedup = original / result under the same ORT "
        "level, from the interleaved confirmation run; every result checked equivalent):\n"
    )
    print(
        "| model | ort-level | method | original ms | result ms | speedup | steps "
        "| expansions | wall s | equivalent (max abs err) | rules applied |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    ruleset = default_ruleset()
    for name, graph in graphs.items():
        for level in args.levels.split(","):
            settings = OrtSettings(ort_level=level).resolved()
            for method in args.methods.split(","):
                options = {"runner": default_runner(settings)}
                if method == "taso":
                    options["budget"] = args.taso_budget
                if method == "random":
                    options["budget"] = args.random_budget
                session = RewriteSession(graph, ruleset, model=name)
                result = search(method, session, make_cost("analytic", settings), **options)
                report = check_equivalence(graph, result.graph)
                verdict = f"{'yes' if report.equivalent else 'NO'} ({report.max_abs_err:.1e})"
                print(
                    f"| {name} | {level} | {method} | {result.original_ms:.2f} "
                    f"| {result.optimized_ms:.2f} | {result.speedup:.3f} "
                    f"| {len(result.actions)} | {result.expansions} | {result.wall_s:.1f} "
                    f"| {verdict} | {format_rules(result.rules_applied)} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
