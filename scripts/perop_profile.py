#!/usr/bin/env python
"""Where the per-op model's error comes from: each operator's time inside its graph against alone.

The per-op model prices a graph as the sum of its operators timed one at a time. Whether that
sum can track end-to-end latency at all depends on two things this script measures, for a zoo
model's start state run as written (offline):

- onnxruntime's own profiler (`enable_profiling`) gives every kernel's time *inside* the graph;
  if the kernels add up to the end-to-end time, there is no executor overhead between
  operators left to model (the profiler adds a few microseconds a node of its own);
- beside each node, the per-op model's time for it *alone* (timed now if not in the cache), so
  that a difference shows per operator type and per node.

    python scripts/perop_profile.py --size medium --graphs resnet-18:ort:all mini-dalle:original

A diagnostic, printed to stdout; it times things, so run it alone on the machine. The per-op
cache defaults to a fresh temporary file, so operators are timed in the same process as the
graphs (`--perop-cache` to use another, e.g. the shared one).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict

from rlflow.cost import Deployment, OrtSettings, PerOpCostModel
from rlflow.cost.inputs import random_inputs
from rlflow.cost.ort_optimizer import start_state
from rlflow.cost.runner import kth_smallest
from rlflow.cost.session import kernel_times_ms, make_session, timed_run
from rlflow.cost.source import ModelSource
from rlflow.errors import RlflowError
from rlflow.graph import Graph, load_model
from rlflow.zoo import cached_path

WARMUP = 5
"""Runs left out of every statistic (the first runs allocate and prepack)."""


def profile(graph: Graph, label: str, perop: PerOpCostModel, runs: int, show: int) -> None:
    """Print the graph's end-to-end time, its kernels' in-graph sum and the per-op estimate,
    by operator type and for the nodes that differ most."""
    settings = perop.settings_for(graph)
    source = ModelSource(graph)
    feeds = random_inputs(source.inputs, source.metadata, 0)
    run = timed_run(make_session(source.model_bytes(), settings), feeds)
    for _ in range(WARMUP):
        run()
    e2e = kth_smallest([run() for _ in range(runs)])  # the per-op bench's statistic
    inside = kernel_times_ms(source.model_bytes(), settings, feeds, runs, WARMUP)
    estimate = perop.report(graph).total_ms
    by_type: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    rows = []
    for node in graph.nodes:
        if node.name not in inside:
            continue
        alone = perop.node_cost_ms(graph, node)
        entry = by_type[node.op_type]
        entry[0] += 1
        entry[1] += inside[node.name]
        entry[2] += alone
        rows.append((inside[node.name] - alone, node.op_type, inside[node.name], alone, node.name))
    kernels = sum(inside.values())
    print(f"== {label}: {len(graph.nodes)} nodes, {len(inside)} profiled")
    print(
        f"  end to end {e2e:.3f} ms; kernels inside the graph {kernels:.3f} ms "
        f"({1000 * (e2e - kernels) / len(graph.nodes):+.1f} us a node beyond them); "
        f"per-op estimate {estimate:.3f} ms ({100 * (estimate - e2e) / e2e:+.1f}%)"
    )
    print("  op type: nodes, inside ms, alone ms, inside - alone")
    for op_type, (count, inside_ms, alone_ms) in sorted(
        by_type.items(), key=lambda item: -abs(item[1][1] - item[1][2])
    ):
        print(
            f"    {op_type:26s} {count:4d} {inside_ms:9.3f} {alone_ms:9.3f} "
            f"{inside_ms - alone_ms:+9.3f}"
        )
    print(f"  the {show} nodes slower inside than alone by the most:")
    for diff, op_type, inside_ms, alone_ms, name in sorted(rows, reverse=True)[:show]:
        print(f"    {op_type:22s} {inside_ms:8.3f} {alone_ms:8.3f} {diff:+8.3f}  {name[:60]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="medium", help="zoo size (medium)")
    parser.add_argument(
        "--graphs",
        nargs="+",
        required=True,
        metavar="MODEL:STATE",
        help="zoo model and start state, e.g. resnet-18:ort:all or bert:original",
    )
    parser.add_argument("--runs", type=int, default=60, help="timed runs per graph (60)")
    parser.add_argument("--show", type=int, default=8, help="nodes listed per graph (8)")
    parser.add_argument("--perop-cache", metavar="FILE", help="default: a fresh temporary file")
    args = parser.parse_args(argv)

    settings = Deployment("offline").settings(OrtSettings(threads=1)).resolved()
    with tempfile.TemporaryDirectory() as scratch:
        cache = args.perop_cache or os.path.join(scratch, "perop.sqlite")
        perop = PerOpCostModel(settings, cache_path=cache)
        try:
            for spec in args.graphs:
                name, _, state = spec.partition(":")
                if not state:
                    parser.error(f"{spec}: expected MODEL:STATE, e.g. {spec}:original")
                try:
                    original = load_model(cached_path(name, args.size))
                    graph = start_state(original, state, settings).graph
                except (RlflowError, KeyError, ValueError) as error:
                    print(f"perop_profile: {spec}: {error}", file=sys.stderr)
                    return 2
                profile(graph, f"{name} {state} ({args.size})", perop, args.runs, args.show)
        finally:
            perop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
