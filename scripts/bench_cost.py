#!/usr/bin/env python
"""How good are the cost models, and how stable is the latency measurement, on given models?

For each model and ORT level it prints, as one markdown table: the end-to-end latency (min,
low -- the k-th smallest run, k = --low-rank -- and median over interleaved runs), the per-op
measured sum and its error against the minimum, the analytic roofline floor, and the
stability of the method: the ratio of the model measured against itself, repeated (min /
median / max over the repetitions; the target is 1 +- 0.03), as the median of per-pair ratios
(what comparisons use), by the low statistic and by the minimum (what they used before); plus
the 1-minute load average seen during those repetitions. Progress goes to stderr.

    python scripts/bench_cost.py resnet-18 bert path/to/model.onnx --size small
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from rlflow.cost import AnalyticCostModel, OrtSettings, PerOpCostModel, Runner, machine_peaks
from rlflow.cost.runner import LOW_RANK
from rlflow.errors import RlflowError
from rlflow.graph import Graph, load_model


@dataclass
class Row:
    model: str
    nodes: int
    ort_level: str
    threads: int
    e2e_min_ms: float
    e2e_low_ms: float
    e2e_median_ms: float
    perop_ms: float
    perop_fallbacks: int
    floor_ms: float
    self_pair_ratios: list[float]
    """The median of per-pair ratios (`Comparison.ratios`, what comparisons use)."""
    self_low_ratios: list[float]
    self_min_ratios: list[float]
    loads: list[float]
    """The 1-minute load average after each repetition."""

    @property
    def perop_error_pct(self) -> float:
        return 100.0 * (self.perop_ms - self.e2e_min_ms) / self.e2e_min_ms

    def markdown(self) -> str:
        return (
            f"| {self.model} | {self.nodes} | {self.ort_level} | {self.threads} "
            f"| {self.e2e_min_ms:.3f} | {self.e2e_low_ms:.3f} | {self.e2e_median_ms:.3f} "
            f"| {self.perop_ms:.3f} | {self.perop_error_pct:+.1f} | {self.perop_fallbacks} "
            f"| {self.floor_ms:.3f} | {100 * self.floor_ms / self.e2e_min_ms:.1f} "
            f"| {_spread(self.self_pair_ratios)} | {_spread(self.self_low_ratios)} "
            f"| {_spread(self.self_min_ratios)} | {min(self.loads):.1f}-{max(self.loads):.1f} |"
        )


def header(low_rank: int) -> str:
    low = _ordinal(low_rank)
    return (
        f"| model | nodes | ort-level | threads | e2e min ms | e2e {low}-smallest ms "
        "| e2e median ms | per-op sum ms | per-op err % vs min | per-op fallbacks "
        "| analytic floor ms | floor % of e2e min "
        "| self-ratio, median of pairs (compared): min / median / max "
        f"| self-ratio of {low}-smallest: min / median / max "
        "| self-ratio of mins: min / median / max | load (1-min avg) |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _spread(ratios: list[float]) -> str:
    return f"{min(ratios):.3f} / {statistics.median(ratios):.3f} / {max(ratios):.3f}"


def _loads(loads: tuple[float, float, float]) -> str:
    return " / ".join(f"{load:.2f}" for load in loads)


def progress(message: str) -> None:
    print(f"[bench_cost {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load(name: str, size: str) -> Graph:
    """A zoo model by name (exported once and cached) or an .onnx file by path."""
    if name.endswith(".onnx") or Path(name).exists():
        return load_model(name)
    from rlflow.zoo import MODEL_NAMES, cached_path

    if name not in MODEL_NAMES:
        raise RlflowError(f"{name!r} is neither an .onnx file nor a zoo model ({MODEL_NAMES})")
    return load_model(cached_path(name, size))


def bench(label: str, graph: Graph, settings: OrtSettings, args: argparse.Namespace) -> Row:
    runner = Runner(
        settings,
        warmup=args.warmup,
        runs=args.runs,
        min_time_s=args.min_time,
        block=args.block,
        low_rank=args.low_rank,
    )
    pair_ratios, low_ratios, min_ratios, minima, lows, medians, loads = [], [], [], [], [], [], []
    for rep in range(args.reps):
        comparison = runner.compare([graph, graph], use_cache=False)
        first, second = comparison.measurements
        pair_ratios.append(comparison.ratios[1])
        low_ratios.append(comparison.low_ratios[1])
        min_ratios.append(second.min_ms / first.min_ms)
        minima += [m.min_ms for m in comparison.measurements]
        lows += [m.low_ms for m in comparison.measurements]
        medians += [m.median_ms for m in comparison.measurements]
        loads.append(os.getloadavg()[0])
        progress(
            f"{label} {settings.ort_level}: self-ratio {rep + 1}/{args.reps}: "
            f"pairs {pair_ratios[-1]:.3f}, low {low_ratios[-1]:.3f}, min {min_ratios[-1]:.3f} "
            f"({first.runs} runs/graph, load {loads[-1]:.2f})"
        )
    started = time.perf_counter()
    perop_model = PerOpCostModel(settings, runs=args.perop_runs, cache_path=args.perop_cache)
    try:
        perop = perop_model.report(graph)
    finally:
        perop_model.close()
    progress(
        f"{label} {settings.ort_level}: per-op {perop.total_ms:.3f} ms, {perop.measured_now} ops "
        f"measured in {time.perf_counter() - started:.1f} s, {perop.fallback_nodes} fallbacks "
        f"{sorted(perop.fallback_reasons)}"
    )
    floor = AnalyticCostModel(settings=settings).report(graph).floor_ms
    return Row(
        model=label,
        nodes=len(graph.nodes),
        ort_level=settings.ort_level,
        threads=settings.threads,
        e2e_min_ms=min(minima),
        e2e_low_ms=statistics.median(lows),
        e2e_median_ms=statistics.median(medians),
        perop_ms=perop.total_ms,
        perop_fallbacks=perop.fallback_nodes,
        floor_ms=floor,
        self_pair_ratios=pair_ratios,
        self_low_ratios=low_ratios,
        self_min_ratios=min_ratios,
        loads=loads,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="zoo model names or .onnx paths")
    parser.add_argument("--size", default="small", help="zoo model size: small or full")
    parser.add_argument("--levels", default="all,disable", help="ORT levels, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--reps", type=int, default=10, help="self-comparisons per model")
    parser.add_argument("--runs", type=int, default=30, help="least timed runs per graph")
    parser.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="least timed seconds per graph and compare (default: the Runner's adaptive stop)",
    )
    parser.add_argument("--block", type=int, default=5, help="runs per interleaved block")
    parser.add_argument(
        "--low-rank",
        type=int,
        default=LOW_RANK,
        help=f"the low statistic: the k-th smallest run (default {LOW_RANK}; 1: the minimum)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per graph")
    parser.add_argument("--perop-runs", type=int, default=10, help="timed runs per operator")
    parser.add_argument(
        "--perop-cache",
        metavar="FILE",
        help="per-op cache (sqlite) to use, e.g. a new file to time every operator now "
        "(default: the shared rlflow cache, whose times may come from another day's load)",
    )
    parser.add_argument(
        "--refresh-peaks",
        action="store_true",
        help="measure the machine peaks again first (the best of old and new is kept)",
    )
    args = parser.parse_args(argv)

    load_at_start = os.getloadavg()
    try:
        levels = [
            OrtSettings(threads=args.threads, ort_level=level) for level in args.levels.split(",")
        ]
        progress("machine peaks" + (" (measuring again)" if args.refresh_peaks else ""))
        peaks = machine_peaks(levels[0], refresh=args.refresh_peaks)
        rows = []
        for name in args.models:
            progress(f"loading {name}")
            graph = load(name, args.size)
            label = name if name.endswith(".onnx") else f"{name} ({args.size})"
            for settings in levels:
                rows.append(bench(label, graph, settings, args))
    except RlflowError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    print(f"`{shlex.join(['python', *sys.argv])}`\n")
    print(
        f"onnxruntime {ort.__version__}, provider {levels[0].resolved().provider}; "
        f"peaks at {args.threads} thread(s): {peaks.gflops:.1f} GFLOP/s fp32 matmul, "
        f"{peaks.gbps:.1f} GB/s DRAM, {peaks.cache_gbps or peaks.gbps:.1f} GB/s in cache "
        f"(operators moving up to {peaks.cache_bytes / 2**20:.0f} MiB); "
        f"load average (1/5/15 min) at start {_loads(load_at_start)}, "
        f"at end {_loads(os.getloadavg())}\n"
    )
    print(header(args.low_rank))
    for row in rows:
        print(row.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
