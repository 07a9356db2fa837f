"""`rlflow inspect MODEL`: load a model into the IR and summarise it (nodes, ops, shapes, hash)."""

from __future__ import annotations

import argparse
import time

from rlflow.commands.common import add_model_arguments, model_path, parse_input_shapes, print_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("inspect", help="load a model and summarise its graph")
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rlflow.graph import load_model

    shapes = parse_input_shapes(args.input_shape)
    path = model_path(args.model, args.size)
    start = time.perf_counter()
    graph = load_model(path, shapes)
    load_s = time.perf_counter() - start
    weight_bytes = int(sum(array.nbytes for array in graph.initializers.values()))
    summary = {
        "model": args.model,
        "path": str(path),
        "nodes": len(graph.nodes),
        "constants": len(graph.initializers),
        "weight_mb": round(weight_bytes / 2**20, 2),
        "inputs": {v.name: describe_value(v) for v in graph.inputs},
        "outputs": {v.name: describe_value(v) for v in graph.outputs},
        "op_counts": dict(sorted(graph.op_counts().items(), key=lambda kv: -kv[1])),
        "hash": graph.canonical_hash(),
        "load_s": round(load_s, 3),
    }
    if args.json:
        print_json(summary)
        return 0
    print(
        f"{summary['model']}: {summary['nodes']} nodes, {summary['constants']} constants "
        f"({summary['weight_mb']} MB), loaded in {summary['load_s']} s"
    )
    for kind in ("inputs", "outputs"):
        for name, text in summary[kind].items():
            print(f"  {kind[:-1]:<6} {name}: {text}")
    ops = ", ".join(f"{op} {count}" for op, count in summary["op_counts"].items())
    print(f"  ops    {ops}")
    print(f"  hash   {summary['hash']}")
    return 0


def describe_value(value) -> str:
    """A value as users read it: `float32[1x3x224x224]`."""
    import numpy as np
    from onnx import helper

    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(value.dtype)).name
    return f"{dtype}[{'x'.join(map(str, value.shape))}]"
