#!/usr/bin/env python
"""How much any rewrite that keeps a graph's arithmetic could still gain: its kernels against
this core's roofline, measured in the same minute.

A rewrite that neither removes arithmetic nor moves fewer bytes can at best make every operator
run at the machine's peak. So the roofline floor of a graph (each operator's FLOPs at the peak
FLOP rate, or its bytes at the peak bandwidth, whichever is longer: `AnalyticCostModel`) bounds
what fusions, layouts and reorderings can gain: at most end to end / floor. Where a graph
already runs close to its floor, only rules that remove work (Winograd, `slice-hoist`) can move
it. For each graph, run as it declares (offline: as written):

- the peaks measured right before and right after it (`measure_peaks`; the better of the two,
  a peak being a best case), since this machine's speed moves by up to 2x between days;
- its end-to-end time (3rd-smallest of `--runs`) and each kernel's time inside the graph
  (onnxruntime's profiler, median of `--runs`);
- per operator type: time inside the graph, GFLOP/s reached, that rate as a share of the peak,
  and the roofline floor against the time (1.0 = at the roofline); for the matrix operators
  together (Conv, Gemm, MatMul and onnxruntime's fused kinds), their FLOP rate over the peak:
  how much a faster schedule of the same multiply-adds could gain.

    python scripts/bench_headroom.py --graphs resnet-18:ort:all bert:ort:all --out runs/hr-full
    python scripts/bench_headroom.py --files runs/bench/models/MODEL.onnx --out runs/hr-result

The table goes to stdout and OUT.md, the numbers to OUT.json, a bar chart to OUT.png; it times
things, so run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from rlflow.cost import AnalyticCostModel, Deployment, OrtSettings
from rlflow.cost.deploy import declared_settings
from rlflow.cost.inputs import random_inputs
from rlflow.cost.ort_optimizer import start_state
from rlflow.cost.peaks import best_of, measure_peaks
from rlflow.cost.runner import kth_smallest
from rlflow.cost.session import kernel_times_ms, make_session, timed_run
from rlflow.cost.source import ModelSource
from rlflow.errors import RlflowError
from rlflow.graph import Graph, load_model
from rlflow.zoo import cached_path

WARMUP = 5
"""Runs left out of every statistic (the first runs allocate and prepack)."""

MATRIX_OPS = frozenset(
    {"Conv", "FusedConv", "ConvTranspose", "Gemm", "MatMul", "FusedMatMul", "Attention", "Einsum"}
)
"""Operators whose time is their multiply-adds: their FLOP rate against the peak says how much a
faster schedule of the same work could still gain."""


@dataclass
class OpTypeRow:
    """One operator type's kernels in one graph."""

    op_type: str
    nodes: int
    inside_ms: float
    gflop: float
    floor_ms: float

    @property
    def matrix(self) -> bool:
        return self.op_type in MATRIX_OPS


@dataclass
class GraphRow:
    label: str
    e2e_ms: float
    kernels_ms: float
    floor_ms: float
    peak_gflops: float
    peak_gbps: float
    op_types: list[OpTypeRow]
    load: float
    date: str

    @property
    def at_roofline(self) -> float:
        """Floor over end to end: 1.0 would leave a rewrite that keeps the work nothing."""
        return self.floor_ms / self.e2e_ms

    def matrix_share(self) -> tuple[float, float]:
        """(share of the kernel time, FLOP rate over the peak) of the matrix operators."""
        rows = [row for row in self.op_types if row.matrix]
        inside = sum(row.inside_ms for row in rows)
        if not inside:
            return 0.0, 0.0
        rate = sum(row.gflop for row in rows) / (inside * 1e-3) / self.peak_gflops
        return inside / self.kernels_ms, rate

    def others_at_floor(self) -> float:
        """The other operators' roofline floor over their time inside the graph."""
        rows = [row for row in self.op_types if not row.matrix]
        inside = sum(row.inside_ms for row in rows)
        return sum(row.floor_ms for row in rows) / inside if inside else 0.0


def measure(graph: Graph, label: str, base: OrtSettings, runs: int) -> GraphRow:
    """Time `graph` as it declares, end to end and per kernel inside it, and price each kernel's
    operator against the peaks measured right before and after."""
    settings = declared_settings(graph.metadata, base).resolved()
    source = ModelSource(graph)
    feeds = random_inputs(source.inputs, source.metadata, 0)
    before = measure_peaks(settings)
    run = timed_run(make_session(source.model_bytes(), settings), feeds)
    for _ in range(WARMUP):
        run()
    e2e = kth_smallest([run() for _ in range(runs)])
    inside = kernel_times_ms(source.model_bytes(), settings, feeds, runs, WARMUP)
    after = measure_peaks(settings)
    peaks = best_of(before, after)
    analytic = AnalyticCostModel(peaks=peaks)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for node in graph.nodes:
        if node.name not in inside:
            continue  # an alias onnxruntime does not run as a kernel
        cost = analytic.node_cost(graph, node)
        entry = totals[node.op_type]
        entry[0] += 1
        entry[1] += inside[node.name]
        entry[2] += cost.flops / 1e9
        entry[3] += analytic.op_time_ms(cost, node.op_type)
    op_types = [
        OpTypeRow(op_type, int(count), inside_ms, gflop, floor_ms)
        for op_type, (count, inside_ms, gflop, floor_ms) in totals.items()
    ]
    op_types.sort(key=lambda row: -row.inside_ms)
    return GraphRow(
        label,
        e2e,
        sum(inside.values()),
        sum(row.floor_ms for row in op_types),
        peaks.gflops,
        peaks.gbps,
        op_types,
        os.getloadavg()[0],
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    )


def markdown(rows: list[GraphRow], show: int) -> str:
    lines = [
        "| graph | end to end ms | kernels ms | roofline floor ms | floor / end to end "
        "| most a rewrite keeping the work can gain | matrix operators: share of the time, "
        "FLOP rate / peak | the others: floor / time | peak GFLOP/s | load | date |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|",
    ]
    for row in rows:
        matrix_share, matrix_rate = row.matrix_share()
        lines.append(
            f"| {row.label} | {row.e2e_ms:.3f} | {row.kernels_ms:.3f} | {row.floor_ms:.3f} "
            f"| {row.at_roofline:.0%} | {1 / row.at_roofline:.2f}x "
            f"| {matrix_share:.0%}, **{matrix_rate:.0%}** | {row.others_at_floor():.0%} "
            f"| {row.peak_gflops:.0f} | {row.load:.2f} | {row.date} |"
        )
    lines += ["", "Per operator type (the largest by time inside the graph):", ""]
    lines += [
        "| graph | operator | nodes | inside ms | share | GFLOP/s | share of peak FLOP/s "
        "| floor / time |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for op in row.op_types[:show]:
            rate = op.gflop / (op.inside_ms * 1e-3) if op.inside_ms else 0.0
            lines.append(
                f"| {row.label} | {op.op_type} | {op.nodes} | {op.inside_ms:.3f} "
                f"| {op.inside_ms / row.kernels_ms:.0%} | {rate:.0f} "
                f"| {rate / row.peak_gflops:.0%} | {op.floor_ms / op.inside_ms:.0%} |"
            )
    return "\n".join(lines) + "\n"


def plot(rows: list[GraphRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row.label for row in rows]
    whole = [row.at_roofline for row in rows]
    matrix = [row.matrix_share()[1] for row in rows]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    ys = range(len(rows))
    ax.barh([y - 0.2 for y in ys], whole, height=0.4, label="whole graph: roofline floor / time")
    ax.barh([y + 0.2 for y in ys], matrix, height=0.4, label="matrix operators: FLOP rate / peak")
    for y, share in zip(ys, whole, strict=True):
        ax.text(share + 0.01, y - 0.2, f"at most {1 / share:.2f}x", va="center", fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(0, 1.15)
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlabel("share of this core's peak, measured beside each graph")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def load_graphs(args: argparse.Namespace, base: OrtSettings) -> list[tuple[str, Graph]]:
    graphs = []
    for spec in args.graphs or []:
        name, _, state = spec.partition(":")
        if not state:
            raise RlflowError(f"{spec}: expected MODEL:STATE, e.g. {spec}:ort:all")
        original = load_model(cached_path(name, args.size))
        graphs.append((f"{name}:{args.size} {state}", start_state(original, state, base).graph))
    for path in args.files or []:
        graphs.append((Path(path).stem, load_model(path)))
    return graphs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="full", help="zoo size of --graphs (full)")
    parser.add_argument("--graphs", nargs="+", metavar="MODEL:STATE", help="e.g. bert:ort:all")
    parser.add_argument("--files", nargs="+", metavar="ONNX", help="models as rlflow wrote them")
    parser.add_argument("--runs", type=int, default=40, help="timed runs per graph (40)")
    parser.add_argument("--show", type=int, default=6, help="operator types per graph (6)")
    parser.add_argument("--out", required=True, help="writes OUT.md, OUT.json, OUT.png")
    args = parser.parse_args(argv)
    if not args.graphs and not args.files:
        parser.error("give --graphs or --files")

    base = Deployment("offline").settings(OrtSettings(threads=1)).resolved()
    try:
        graphs = load_graphs(args, base)
    except (RlflowError, KeyError, ValueError, OSError) as error:
        print(f"bench_headroom: {error}", file=sys.stderr)
        return 2
    rows = []
    for index, (label, graph) in enumerate(graphs, 1):
        print(f"[{index}/{len(graphs)}] {label}", file=sys.stderr, flush=True)
        rows.append(measure(graph, label, base, args.runs))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, args.show)
    print(table)
    out.with_suffix(".md").write_text(table)
    out.with_suffix(".json").write_text(json.dumps([asdict(row) for row in rows], indent=1))
    plot(rows, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
