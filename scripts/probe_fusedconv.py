#!/usr/bin/env python
"""Conv+Relu against onnxruntime's FusedConv, alone and in chains: what the per-op model and a
whole graph say about the same fusion.

On an H200 the per-op timings priced a 64-channel 3x3 FusedConv at 56x56 at 50 us, against
23 us for its Conv and 1.3 us for its Relu, while fusing 17 such pairs made ResNet-18 12%
faster end to end (docs/BENCHMARKS.md, "GPU"). This builds chains of k blocks (Conv -> Relu,
or one FusedConv with activation Relu, the same weights) at one shape, run as written
(optimiser off), and prints for each k the per-op sum of each chain (`PerOpCostModel`, each
operator timed alone, net of onnxruntime's per-run overhead, which is counted once) beside
their end-to-end ratio (`Runner.compare`, interleaved in one run). JSON rows go to --out.

--model NAME asks the same of a zoo model: onnxruntime's graph of it for the provider (level
all, run as written), and that graph with its Relu(Conv) and Relu(Add(Conv, z)) sites fused
(each kind alone, then both), timed against the original under onnxruntime's defaults,
interleaved, with each graph's per-op sum and its largest difference from the original.

    python scripts/probe_fusedconv.py --provider cuda --out fusedconv.json
    python scripts/probe_fusedconv.py --provider cuda --model resnet-18 --out fc-resnet-18.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from rlflow import zoo
from rlflow.cost import OrtSettings, PerOpCostModel, Runner
from rlflow.cost.equivalence import check_equivalence
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import Graph, load_model
from rlflow.graph.shapes import max_ort_ir_version
from rlflow.rewrite.rule import Rule
from rlflow.rewrite.rules.fusedconv import ConvAddReluToFusedConv, ConvReluToFusedConv


def chain(blocks: int, channels: int, size: int, fused: bool) -> Graph:
    """`blocks` Conv(3x3, pad 1)+Relu blocks, or FusedConv(Relu) blocks, on one tensor."""
    rng = np.random.default_rng(0)
    nodes, weights, value = [], [], "x"
    for index in range(blocks):
        w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.05
        b = rng.standard_normal(channels).astype(np.float32) * 0.05
        weights += [
            numpy_helper.from_array(w, f"w{index}"),
            numpy_helper.from_array(b, f"b{index}"),
        ]
        out = f"y{index}"
        conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
        if fused:
            nodes.append(
                helper.make_node(
                    "FusedConv", [value, f"w{index}", f"b{index}"], [out],
                    domain="com.microsoft", activation="Relu", **conv,
                )
            )  # fmt: skip
        else:
            nodes.append(
                helper.make_node("Conv", [value, f"w{index}", f"b{index}"], [f"c{index}"], **conv)
            )
            nodes.append(helper.make_node("Relu", [f"c{index}"], [out]))
        value = out
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        nodes,
        f"{'fused' if fused else 'conv_relu'}_{blocks}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(value, TensorProto.FLOAT, shape)],
        weights,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, max_ort_ir_version())
    return load_model(model)


def fused_everywhere(graph: Graph, rules: list[Rule]) -> tuple[Graph, int]:
    """`graph` with every site of each of `rules` rewritten, and how many rewrites that took."""
    applied = 0
    for rule in rules:
        graph, sites = rule.apply_everywhere(graph)
        applied += sites
    return graph, applied


def probe_model(
    name: str, size: str, settings: OrtSettings, runner: Runner, perop: PerOpCostModel
) -> list[dict]:
    """The zoo model's onnxruntime graph (`ort:all`, BatchNorms folded, for this provider) with
    its Conv+Relu sites fused, by kind, against the original under onnxruntime's defaults."""
    original = load_model(zoo.cached_path(name, size))
    base = start_state(original, "ort:all", settings).graph
    kinds = {
        "conv-relu": [ConvReluToFusedConv()],
        "conv-add-relu": [ConvAddReluToFusedConv()],
        "both": [ConvAddReluToFusedConv(), ConvReluToFusedConv()],
    }
    graphs, fusions = {"original (defaults)": original, "ort:all as written": base}, {}
    for kind, rules in kinds.items():
        graphs[kind], fusions[kind] = fused_everywhere(base, rules)
    defaults = OrtSettings(threads=1, ort_level="all", provider=settings.provider).resolved()
    # None: the settings a graph declares (every graph but the original runs as written).
    comparison = runner.compare(
        list(graphs.values()), settings=[defaults] + [None] * (len(graphs) - 1)
    )
    rows = []
    print(f"{name}:{size} on {settings.provider}; speedups over the original under the defaults")
    print("graph | FusedConv added | per-op ms | e2e ms | speedup | max abs err")
    for index, (label, graph) in enumerate(graphs.items()):
        error = 0.0
        if index > 0:
            report = check_equivalence(original, graph, provider=settings.provider)
            if not report.equivalent:
                raise SystemExit(f"{label}: not equivalent to the original: {report.reason}")
            error = report.max_abs_err
        row = {
            "model": f"{name}:{size}",
            "graph": label,
            "fusedconv_added": fusions.get(label, 0),
            "perop_ms": None if index == 0 else perop.cost_ms(graph),
            "e2e_ms": comparison.scaled_ms[index],
            "speedup": comparison.speedups[index],
            "max_abs_error": error,
            "provider": settings.provider,
        }
        rows.append(row)
        perop_ms = "-" if row["perop_ms"] is None else f"{row['perop_ms']:.4f}"
        print(
            f"{label} | {row['fusedconv_added']} | {perop_ms} | {row['e2e_ms']:.4f} | "
            f"{row['speedup']:.3f}x | {error:.1e}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--size", type=int, default=56)
    parser.add_argument("--min-time", type=float, default=0.3, help="timed seconds per graph")
    parser.add_argument("--model", help="a zoo model whose Conv+Relu sites to fuse instead")
    parser.add_argument("--model-size", default="full", choices=("small", "medium", "full"))
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    settings = OrtSettings(threads=1, ort_level="disable", provider=args.provider).resolved()
    perop = PerOpCostModel(settings)
    runner = Runner(settings, min_time_s=args.min_time)
    if args.model:
        rows = probe_model(args.model, args.model_size, settings, runner, perop)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
        return
    rows = []
    print(f"provider {settings.provider}; 1x{args.channels}x{args.size}x{args.size}, 3x3 convs")
    print(
        "blocks | per-op Conv+Relu ms | per-op FusedConv ms | e2e Conv+Relu ms | e2e fused/unfused"
    )
    for blocks in args.blocks:
        plain = chain(blocks, args.channels, args.size, fused=False)
        fused = chain(blocks, args.channels, args.size, fused=True)
        comparison = runner.compare([plain, fused])
        row = {
            "blocks": blocks,
            "perop_plain_ms": perop.cost_ms(plain),
            "perop_fused_ms": perop.cost_ms(fused),
            "e2e_plain_ms": comparison.measurements[0].median_ms,
            "e2e_fused_ratio": comparison.ratios[1],
            "provider": settings.provider,
        }
        rows.append(row)
        print(
            f"{blocks} | {row['perop_plain_ms']:.4f} | {row['perop_fused_ms']:.4f} | "
            f"{row['e2e_plain_ms']:.4f} | {row['e2e_fused_ratio']:.3f}"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
