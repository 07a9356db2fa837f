#!/usr/bin/env python
"""Does onnxruntime run a transformer's projection faster in another layout? Y = X W + b.

At full size the transformers' time is their projections' Gemms (`bench_headroom.py`), which
run at 71-87% of this core's peak inside the graph. The rules can write a projection several
ways; if one ran faster, a rule between them would be worth the search. Each shape (M rows of
activations, K inputs, N outputs: the zoo's full-size projections by default) as:

- `matmul+add`: MatMul on the 3-D activations, then Add (as exported; the reference);
- `gemm`: Gemm with the bias between two Reshapes (onnxruntime's MatMulAddFusion);
- `transposed`: Y^T = W^T X^T, the weights as Gemm's left operand and the activations
  transposed in Gemm (`transB`), the bias as a column, then a Transpose back;
- `nchwc-w` / `nchwc-h`: a 1x1 Conv in onnxruntime's blocked layout (MLAS's NCHWc pointwise
  kernel, which runs the CNNs' Convs near the core's peak): the rows read as the pixels of a
  1 x M (`-w`) or M x 1 (`-h`) channels-last image by `ReorderInput(channels_last=1)`, and
  written back by `ReorderOutput(channels_last=1)`; only Reshapes around it, no Transpose
  (`nchwc-h` is what the rule `nchwc-projection` writes). Left out where onnxruntime does no
  NCHWc, or K is not a multiple of 4 (ReorderInput's unit).

All of them are checked to compute the same Y (`check_equivalence`, as every rewrite is), then
timed interleaved in one run as written (`Runner.compare`, optimiser off, 1 thread); a speedup
above 1 is faster than `matmul+add`.

    python scripts/probe_gemm_layouts.py --shapes 64x1024x1024 16x768x2048 --json

It times things: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlflow.cost import OrtSettings, Runner
from rlflow.cost.equivalence import check_equivalence
from rlflow.cost.target import nchwc_block_size
from rlflow.graph import NCHWC_DOMAIN as NCHWC
from rlflow.rewrite.rules.nchwc_format import pad_channels, reorder_filter

ZOO_FULL_PROJECTIONS = {
    "bert": ["64x1024x1024", "64x1024x4096", "64x4096x1024"],
    "vit-base": ["65x768x768", "65x768x3072", "65x3072x768"],
    "mini-dalle": ["16x768x768", "16x768x4096", "16x2048x768", "16x768x16384"],
    "transformer-transducer": ["80x512x512", "80x512x2048", "80x2048x512"],
}
VARIANTS = ("matmul+add", "gemm", "transposed", "nchwc-w", "nchwc-h")


def variants(k: int) -> tuple[str, ...]:
    """The layouts this machine runs for a projection of k inputs."""
    if nchwc_block_size() is None or k % 4:
        return VARIANTS[:3]
    return VARIANTS


def projection(variant: str, m: int, k: int, n: int, rng: np.random.Generator) -> onnx.ModelProto:
    """Y (1, m, n) = X (1, m, k) W + b written as `variant`; the same W and b for every variant
    of a shape (`rng` seeded alike)."""
    weights = (rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    flat, back = np.array([m, k], np.int64), np.array([1, m, n], np.int64)
    node = helper.make_node
    if variant == "matmul+add":
        nodes = [node("MatMul", ["x", "w"], ["xw"]), node("Add", ["xw", "b"], ["y"])]
        constants = {"w": weights, "b": bias}
    elif variant == "gemm":
        nodes = [
            node("Reshape", ["x", "flat"], ["x2"]),
            node("Gemm", ["x2", "w", "b"], ["y2"]),
            node("Reshape", ["y2", "back"], ["y"]),
        ]
        constants = {"w": weights, "b": bias, "flat": flat, "back": back}
    elif variant == "transposed":
        nodes = [
            node("Reshape", ["x", "flat"], ["x2"]),
            node("Gemm", ["wt", "x2", "bt"], ["yt"], transB=1),
            node("Transpose", ["yt"], ["y2"], perm=[1, 0]),
            node("Reshape", ["y2", "back"], ["y"]),
        ]
        constants = {
            "wt": np.ascontiguousarray(weights.T),
            "bt": bias.reshape(n, 1),
            "flat": flat,
            "back": back,
        }
    elif variant in ("nchwc-w", "nchwc-h"):
        block = nchwc_block_size()
        image = [1, 1, m, k] if variant == "nchwc-w" else [1, m, 1, k]
        nodes = [
            node("Reshape", ["x", "image"], ["x4"]),
            node("ReorderInput", ["x4"], ["xb"], domain=NCHWC, channels_last=1),
            node("Conv", ["xb", "wb", "bb"], ["yb"], domain=NCHWC, kernel_shape=[1, 1]),
            node("ReorderOutput", ["yb"], ["y4"], domain=NCHWC, channels=n, channels_last=1),
            node("Reshape", ["y4", "back"], ["y"]),
        ]
        filters = weights.T.reshape(n, k, 1, 1)
        constants = {
            "wb": reorder_filter(filters, block, per_output=False),
            "bb": pad_channels(bias, block),
            "image": np.array(image, np.int64),
            "back": back,
        }
    else:
        raise ValueError(variant)
    graph = helper.make_graph(
        nodes,
        f"projection-{variant}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
        [numpy_helper.from_array(array, name) for name, array in constants.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(NCHWC, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, k, n = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: expected MxKxN, e.g. 64x1024x1024") from None
    if min(m, k, n) < 1:
        raise argparse.ArgumentTypeError(f"{text}: every size must be positive")
    return m, k, n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        metavar="MxKxN",
        help="default: the full-size zoo transformers' projections",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    shapes = args.shapes or [
        parse_shape(shape) for shapes in ZOO_FULL_PROJECTIONS.values() for shape in shapes
    ]
    runner = Runner(OrtSettings(threads=1, ort_level="disable").resolved())
    rows = []
    for m, k, n in shapes:
        layouts = variants(k)
        models = [projection(variant, m, k, n, np.random.default_rng(0)) for variant in layouts]
        if not all(check_equivalence(models[0], model).equivalent for model in models[1:]):
            print(f"probe_gemm_layouts: {m}x{k}x{n}: the layouts disagree", file=sys.stderr)
            return 1
        comparison = runner.compare(models, use_cache=False)
        flops = 2.0 * m * k * n
        rows.append(
            {
                "shape": f"{m}x{k}x{n}",
                "speedups": dict(zip(layouts, comparison.speedups, strict=True)),
                "gflops": {
                    variant: flops / (measurement.low_ms * 1e-3) / 1e9
                    for variant, measurement in zip(layouts, comparison.measurements, strict=True)
                },
                "load": os.getloadavg()[0],
                "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            }
        )
        if not args.json:
            row = rows[-1]
            cells = "  ".join(
                f"{variant} {row['speedups'][variant]:.3f}x ({row['gflops'][variant]:.0f} GF/s)"
                for variant in row["speedups"]
            )
            print(f"{row['shape']:>14s}  {cells}  load {row['load']:.2f}", flush=True)
    if args.json:
        print(json.dumps({"reference": VARIANTS[0], "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
