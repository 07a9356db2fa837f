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
  and the roofline floor against the time (1.0 = at the roofline).

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

from rlflow.cost import AnalyticCostModel, Deployment, MachinePeaks, OrtSettings
from rlflow.cost.deploy import declared_settings
from rlflow.cost.inputs import random_inputs
from rlflow.cost.ort_optimizer import start_state
from rlflow.cost.peaks import measure_peaks
from rlflow.cost.runner import kth_smallest
from rlflow.cost.session import kernel_times_ms, make_session, timed_run
from rlflow.cost.source import ModelSource
from rlflow.errors import RlflowError
from rlflow.graph import Graph, load_model
from rlflow.zoo import cached_path

WARMUP = 5
"""Runs left out of every statistic (the first runs allocate and prepack)."""

COMPUTE_BOUND = "compute-bound"
MEMORY_BOUND = "memory-bound"


@dataclass
class OpTypeRow:
    """One operator type's kernels in one graph."""

    op_type: str
    nodes: int
    inside_ms: float
    gflop: float
    floor_ms: float
    bound: str  # whether the floor of most of its time is the FLOP rate or the bandwidth


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

    def share_of_peak(self, bound: str) -> tuple[float, float]:
        """(share of the kernel time, FLOP rate or floor/time) of the operators with `bound`."""
        rows = [row for row in self.op_types if row.bound == bound]
        inside = sum(row.inside_ms for row in rows)
        if not inside:
            return 0.0, 0.0
        if bound == COMPUTE_BOUND:
            rate = sum(row.gflop for row in rows) / (inside * 1e-3) / self.peak_gflops
        else:
            rate = sum(row.floor_ms for row in rows) / inside
        return inside / self.kernels_ms, rate


def measure(graph: Graph, label: str, base: OrtSettings, runs: int) -> GraphRow:
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
    peaks = MachinePeaks(
        gflops=max(before.gflops, after.gflops),
        gbps=max(before.gbps, after.gbps),
        cache_gbps=max(before.cache_gbps or 0.0, after.cache_gbps or 0.0) or None,
        cache_bytes=after.cache_bytes,
    )
    analytic = AnalyticCostModel(peaks=peaks)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for node in graph.nodes:
        if node.name not in inside:
            continue  # an alias onnxruntime does not run as a kernel
        cost = analytic.node_cost(graph, node)
        floor = analytic.op_time_ms(cost, node.op_type)
        flop_ms = cost.flops * 1e3 / (peaks.gflops * 1e9)
        entry = totals[node.op_type]
        entry[0] += 1
        entry[1] += inside[node.name]
        entry[2] += cost.flops / 1e9
        entry[3] += floor
        entry[4] += inside[node.name] if 0 < floor <= flop_ms else 0.0
    op_types = [
        OpTypeRow(
            op_type,
            int(count),
            inside_ms,
            gflop,
            floor_ms,
            COMPUTE_BOUND if compute_ms >= inside_ms / 2 else MEMORY_BOUND,
        )
        for op_type, (count, inside_ms, gflop, floor_ms, compute_ms) in totals.items()
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
        "| most a rewrite keeping the work can gain | compute-bound ops: share of time, "
        "share of peak FLOP/s | memory-bound ops: share of time, floor / time "
        "| peak GFLOP/s | load | date |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|",
    ]
    for row in rows:
        compute_share, compute_rate = row.share_of_peak(COMPUTE_BOUND)
        memory_share, memory_rate = row.share_of_peak(MEMORY_BOUND)
        lines.append(
            f"| {row.label} | {row.e2e_ms:.3f} | {row.kernels_ms:.3f} | {row.floor_ms:.3f} "
            f"| {row.at_roofline:.0%} | {1 / row.at_roofline:.2f}x "
            f"| {compute_share:.0%}, **{compute_rate:.0%}** | {memory_share:.0%}, "
            f"{memory_rate:.0%} | {row.peak_gflops:.0f} | {row.load:.2f} | {row.date} |"
        )
    lines += ["", "Per operator type (the largest by time inside the graph):", ""]
    lines += [
        "| graph | operator | nodes | inside ms | share | GFLOP/s | share of peak FLOP/s "
        "| floor / time | bound |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        for op in row.op_types[:show]:
            rate = op.gflop / (op.inside_ms * 1e-3) if op.inside_ms else 0.0
            lines.append(
                f"| {row.label} | {op.op_type} | {op.nodes} | {op.inside_ms:.3f} "
                f"| {op.inside_ms / row.kernels_ms:.0%} | {rate:.0f} "
                f"| {rate / row.peak_gflops:.0%} | {op.floor_ms / op.inside_ms:.0%} | {op.bound} |"
            )
    return "\n".join(lines) + "\n"


def plot(rows: list[GraphRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row.label for row in rows]
    whole = [row.at_roofline for row in rows]
    compute = [row.share_of_peak(COMPUTE_BOUND)[1] for row in rows]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], whole, height=0.4, label="whole graph: roofline floor / time")
    ax.barh(
        [y - 0.2 for y in ys],
        compute,
        height=0.4,
        label="compute-bound operators: FLOP rate / peak",
    )
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlabel("share of this core's peak, measured beside each graph")
    ax.legend(loc="lower right", fontsize=8)
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
