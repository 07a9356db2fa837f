#!/usr/bin/env python
"""Load and export time of the graph IR on each zoo model (docs/BENCHMARKS.md, "Graph IR").

Usage: .venv/bin/python scripts/bench_graph.py [--size full] [--repeat 3] [MODEL ...]

Besides the zoo, `synthetic-1000` is a 1,000-node MLP with small weights: zoo load times
are dominated by reading weights (0.1-0.5 GB), this one by the per-node work.

Load = onnx.load + validation + shape inference + folding into a Graph; export =
Graph.to_onnx + SerializeToString. Each is the minimum over --repeat runs (the machine
is shared; the minimum is the least disturbed run). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
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


def synthetic_model(path: str, blocks: int = 250, width: int = 64) -> str:
    """A chain of `blocks` x (MatMul, Add, Relu, Mul): 4 * blocks nodes, width x width weights."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        w, b, s = f"w{i}", f"b{i}", f"s{i}"
        inits += [
            numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), w),
            numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), b),
            numpy_helper.from_array(np.float32(0.1) * np.ones(width, np.float32), s),
        ]
        nodes += [
            helper.make_node("MatMul", [x, w], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", b], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
            helper.make_node("Mul", [f"r{i}", s], [f"y{i}"]),
        ]
        x = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "synthetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])],
        initializer=inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=[*zoo.MODEL_NAMES, "synthetic-1000"])
    parser.add_argument("--size", choices=zoo.SIZES, default="full")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    rows = []
    for name in tqdm(args.models, desc="bench_graph", unit="model", file=sys.stderr):
        if name == "synthetic-1000":
            path = synthetic_model(str(zoo.cache_dir() / "synthetic-1000.onnx"))
        else:
            path = zoo.cached_path(name, args.size)
        load_s, graph = timed(lambda path=path: load_model(path), args.repeat)
        export_s, _ = timed(lambda graph=graph: graph.to_onnx().SerializeToString(), args.repeat)
        weights_mb = sum(a.nbytes for a in graph.initializers.values()) / 2**20
        rows.append((name, len(graph.nodes), weights_mb, load_s, export_s))

    print(f"`{' '.join(['python', 'scripts/bench_graph.py', *(argv or sys.argv[1:])])}`\n")
    print("| model | size | nodes | weights (MB) | load (s) | export (s) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, nodes, weights_mb, load_s, export_s in rows:
        print(
            f"| {name} | {args.size} | {nodes} | {weights_mb:.0f} | {load_s:.3f} | {export_s:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
