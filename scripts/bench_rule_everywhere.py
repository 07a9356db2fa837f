#!/usr/bin/env python
"""What one rule is worth on a whole model: applied at every site of a start state, end to end
against the per-op cost model's estimate.

For each model, the start state (`original`, `ort:all`, `ort:all-PASS`, ...) is rewritten by
`--rule` at its first site until it has none, or `--max-sites` times (slice-hoist's result has
a site again one op further up, and would otherwise go on); the result and the start are timed
interleaved in one offline run (`Runner.compare`, both run as written), and priced by the
offline per-op model (the cost that ranks a search's graphs). A rule the per-op model prices
as a loss but that wins end to end is one no search ranked by it will keep. Prints the command
and one markdown table.

    python scripts/bench_rule_everywhere.py mini-dalle bert --size medium \
        --start ort:all-MatMulScaleFusion --rule attention-fusion
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
    parser.add_argument("models", nargs="+")
    parser.add_argument("--size", default="medium", choices=("small", "medium", "full"))
    parser.add_argument("--start", default="ort:all", help="start state (default ort:all)")
    parser.add_argument("--rule", required=True, help="a built-in rule's name")
    parser.add_argument(
        "--max-sites", type=int, default=None, help="apply the rule at most this many times"
    )
    args = parser.parse_args()
    rules = {rule.name: rule for rule in builtin_rules()}
    if args.rule not in rules:
        sys.exit(f"unknown rule {args.rule!r}")
    rule = rules[args.rule]
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
        start = start_state(load_model(cached_path(name, args.size)), args.start, OrtSettings())
        graph, sites = rule.apply_everywhere(start.graph, args.max_sites)
        before, after = perop.cost_ms(start.graph), perop.cost_ms(graph)
        speedup = runner.compare([start.graph, graph]).speedups[1]
        print(
            f"| {name}:{args.size} | {args.start} | {sites} | {before:.3f} | {after:.3f} "
            f"| {before / after:.3f}x | {speedup:.3f}x | {os.getloadavg()[0]:.2f} "
            f"| {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
