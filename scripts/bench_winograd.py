#!/usr/bin/env python
"""What Winograd's F(2x2, 3x3) is worth at each 3x3 Convolution of a model, and where it pays.

For each zoo model's start state (`--start`, default onnxruntime's `ort:all`, whose Convs are
in its blocked NCHWc layout), every Winograd site (`conv-winograd` on a plain Conv,
`nchwc-conv-winograd` on a blocked one, reorders included) is rewritten alone, and one last
graph rewrites every site that came out faster alone. Each graph is priced by the offline per-op
model (the cost that ranks a search's graphs) and all are timed end to end with the start in one
interleaved offline run (`Runner.compare`, every graph as written). Prints the command and a
markdown table per model: each site's Conv (its output), input shape and output channels, and
its per-op and end-to-end ratio against the start.

    python scripts/bench_winograd.py resnet-18 resnet-50 --size full

It times things: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from rlflow.cost import OrtSettings, PerOpCostModel, Runner
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import Graph, load_model
from rlflow.rewrite.rules.winograd import RULES
from rlflow.zoo import cached_path


def sites_of(graph: Graph) -> dict[str, tuple[tuple[int, ...], int]]:
    """Every Winograd site of `graph` by the name of the Conv's output: its input shape and its
    output channels."""
    found = {}
    for rule in RULES:
        for match in rule.sites(graph):
            channels = graph.value(match.outputs[0]).shape[1]
            found[match.outputs[0]] = (graph.value(match["x"]).shape, channels)
    return found


def rewritten(graph: Graph, convs: list[str]) -> Graph:
    """`graph` with the Convs whose outputs are `convs` in Winograd form (found again after
    each rewrite: the other names stay)."""
    for conv in convs:
        rule, match = next(
            (rule, match)
            for rule in RULES
            for match in rule.sites(graph)
            if match.outputs[0] == conv
        )
        graph = rule.apply(graph, match)
    return graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--size", default="full", choices=("small", "medium", "full"))
    parser.add_argument("--start", default="ort:all", help="start state (default ort:all)")
    args = parser.parse_args()
    offline = OrtSettings(ort_level="disable").resolved()
    runner, perop = Runner(offline), PerOpCostModel(offline)
    print("`python scripts/bench_winograd.py " + shlex.join(sys.argv[1:]) + "`")
    for name in args.models:
        original = load_model(cached_path(name, args.size))
        start = start_state(original, args.start, OrtSettings()).graph
        sites = sites_of(start)
        alone = [rewritten(start, [conv]) for conv in sites]
        speedups = runner.compare([start, *alone]).speedups[1:]
        paying = [conv for conv, speedup in zip(sites, speedups, strict=True) if speedup > 1.0]
        combined = rewritten(start, paying) if paying else None
        together = runner.compare([start, combined]).speedups[1] if combined is not None else None
        before = perop.cost_ms(start)
        print(
            f"\n{name}:{args.size} from {args.start}: {len(sites)} sites "
            f"({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
            f"1-min load {os.getloadavg()[0]:.2f})\n"
        )
        print("| Conv (its output) | input shape | output channels | per-op ratio | end to end |")
        print("|---|---|---:|---:|---:|")
        for (conv, (shape, channels)), graph, speedup in zip(
            sites.items(), alone, speedups, strict=True
        ):
            ratio = before / perop.cost_ms(graph)
            dims = "x".join(map(str, shape))
            print(f"| {conv} | {dims} | {channels} | {ratio:.3f}x | {speedup:.3f}x |")
        if combined is not None:
            ratio = before / perop.cost_ms(combined)
            print(
                f"| the {len(paying)} sites faster alone, together | | | {ratio:.3f}x "
                f"| {together:.3f}x |"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
