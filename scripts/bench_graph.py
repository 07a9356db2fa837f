#!/usr/bin/env python
"""Load and export time of the graph IR on each zoo model (docs/BENCHMARKS.md, "Graph IR").

Usage: .venv/bin/python scripts/bench_graph.py [--size full] [--repeat 3] [MODEL ...]

Load = onnx.load + validation + shape inference + folding into a Graph; export =
Graph.to_onnx + SerializeToString. Each is the minimum over --repeat runs (the machine
is shared; the minimum is the least disturbed run). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time

from tqdm import tqdm

from rlflow import zoo
from rlflow.graph import load_model


def timed(fn, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(zoo.MODEL_NAMES))
    parser.add_argument("--size", choices=zoo.SIZES, default="full")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    rows = []
    for name in tqdm(args.models, desc="bench_graph", unit="model", file=sys.stderr):
        path = zoo.cached_path(name, args.size)
        load_s, graph = timed(lambda: load_model(path), args.repeat)
        export_s, _ = timed(lambda: graph.to_onnx().SerializeToString(), args.repeat)
        weights_mb = sum(a.nbytes for a in graph.initializers.values()) / 2**20
        rows.append((name, len(graph.nodes), weights_mb, load_s, export_s))

    print(f"`{' '.join(['python', 'scripts/bench_graph.py', *(argv or sys.argv[1:])])}`\n")
    print("| model | size | nodes | weights (MB) | load (s) | export (s) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, nodes, weights_mb, load_s, export_s in rows:
        print(f"| {name} | {args.size} | {nodes} | {weights_mb:.0f} | {load_s:.3f} | "
              f"{export_s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
