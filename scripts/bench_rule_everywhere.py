#!/usr/bin/env python
"""What one rule is worth on a whole model: applied at every site of a start state, end to end
against the per-op cost model's estimate.

For each model, the start state (`original`, `ort:all`, `ort:all-PASS`, ..., or a saved
`.onnx` graph such as a search's result) is rewritten by `--rule` at its first site until it
has none, or `--max-sites` times (slice-hoist's result has a site again one op further up, and
would otherwise go on), then by the next `--rule` if one is given again; the result and the
start are timed interleaved in one offline run (`Runner.compare`, both run as written), and
priced by the offline per-op model (the cost that ranks a search's graphs). A rule the per-op
model prices as a loss but that wins end to end is one no search ranked by it will keep.
Prints the command and one markdown table.

    python scripts/bench_rule_everywhere.py mini-dalle bert --size medium \
        --start ort:all-MatMulScaleFusion --rule attention-fusion
    python scripts/bench_rule_everywhere.py runs/x/models/bert_full.taso.offline.onnx \
        --rule nchwc-projection-join --rule nchwc-conv-activation-fusion
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from rlflow.cost import OrtSettings, PerOpCostModel, Runner
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import load_model
from rlflow.rewrite.rules import builtin_rules
from rlflow.zoo import cached_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="zoo models, or .onnx files to start from")
    parser.add_argument("--size", default="medium", choices=("small", "medium", "full"))
    parser.add_argument("--start", default="ort:all", help="start state (default ort:all)")
    parser.add_argument(
        "--rule",
        required=True,
        action="append",
        help="a built-in rule's name; given again, the next rule applied after it",
    )
    parser.add_argument(
        "--max-sites", type=int, default=None, help="apply the rule at most this many times"
    )
    args = parser.parse_args()
    known = {rule.name: rule for rule in builtin_rules()}
    unknown = [name for name in args.rule if name not in known]
    if unknown:
        sys.exit(f"unknown rule {unknown[0]!r}")
    offline = OrtSettings(ort_level="disable").resolved()
    runner, perop = Runner(offline), PerOpCostModel(offline)

    print("`python scripts/bench_rule_everywhere.py " + shlex.join(sys.argv[1:]) + "`")
    print()
    print(
        "| model | start state | sites | per-op ms before | after | per-op ratio "
        "| end-to-end speedup | 1-min load | date |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for name in args.models:
        if name.endswith(".onnx"):
            if not os.path.isfile(name):
                sys.exit(f"no such model file: {name}")
            start, label, state = load_model(name), os.path.basename(name), "the file"
        else:
            start = start_state(load_model(cached_path(name, args.size)), args.start, OrtSettings())
            start, label, state = start.graph, f"{name}:{args.size}", args.start
        graph, counts = start, []
        for rule in args.rule:
            graph, sites = known[rule].apply_everywhere(graph, args.max_sites)
            counts.append(str(sites))
        before, after = perop.cost_ms(start), perop.cost_ms(graph)
        speedup = runner.compare([start, graph]).speedups[1]
        print(
            f"| {label} | {state} | {' + '.join(counts)} | {before:.3f} | {after:.3f} "
            f"| {before / after:.3f}x | {speedup:.3f}x | {os.getloadavg()[0]:.2f} "
            f"| {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
