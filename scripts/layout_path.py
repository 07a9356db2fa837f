#!/usr/bin/env python
"""The blocked layout grown from a model as written, one rule at a time, as onnxruntime grows it.

onnxruntime's NCHWc transformer blocks a CNN in one sweep; rlflow's rules do it site by site,
so a search or a learner has to find the path. This walks one: from the original graph (run
as written), it applies at each step the first offered candidate of the first rule in GROW
order that has one (the joins first, so a region grows from its edge; `nchwc-conv` last, to
start one), until none is offered. It prints each step's rule and its per-op cost change
(positive: cheaper), the path's length, and the per-op cost of the original, of the path's
end and of onnxruntime's layout graph; with `--e2e`, the three timed end to end interleaved
against the original under onnxruntime's defaults. The path is one ordering, not a search:
it shows how long the way to the layout is and whether its steps lose on their own.

    python scripts/layout_path.py squeezenet-1.1 --size medium --e2e
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

from rlflow.cost import OrtSettings
from rlflow.cost.deploy import Deployment
from rlflow.cost.ort_optimizer import start_state
from rlflow.cost.perop import PerOpCostModel
from rlflow.graph import load_model
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.search import default_runner
from rlflow.zoo import cached_path

GROW = (
    "nchwc-activation-join",
    "nchwc-conv-join",
    "nchwc-pool-join",
    "nchwc-concat-move",
    "nchwc-reorder-cancel",
    "nchwc-global-pool",
    "nchwc-pool",
    "nchwc-binary-move",
    "nchwc-conv-sum-fusion",
    "nchwc-conv",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--size", default="medium", choices=("small", "medium", "full"))
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--e2e", action="store_true", help="time the graphs end to end too")
    parser.add_argument("--out", type=Path, help="write the path and costs as JSON here")
    args = parser.parse_args()
    settings = OrtSettings(threads=1).resolved()
    original = load_model(cached_path(args.model, args.size))
    perop = PerOpCostModel(Deployment("offline").settings(settings))
    graph = start_state(original, "original", settings).graph
    layout = start_state(original, "ort:layout", settings).graph
    rules = default_ruleset()
    steps = []
    while len(steps) < args.max_steps:
        offered = RewriteSession(graph, rules).candidates()
        by_rule = {name: [c for c in offered if c.rule.name == name] for name in GROW}
        rule = next((name for name in GROW if by_rule[name]), None)
        if rule is None:
            break
        before, graph = perop.cost_ms(graph), by_rule[rule][0].graph
        steps.append({"rule": rule, "gain_pct": 100 * (1 - perop.cost_ms(graph) / before)})
        print(f"{len(steps):3d} {rule:26s} {steps[-1]['gain_pct']:+.2f}%", flush=True)
    costs = {
        name: perop.cost_ms(g)
        for name, g in (("original", original), ("path end", graph), ("ort:layout", layout))
    }
    losses = sum(1 for step in steps if step["gain_pct"] < 0)
    print(f"{len(steps)} steps ({losses} losing alone): {dict(Counter(s['rule'] for s in steps))}")
    print("per-op ms: " + ", ".join(f"{name} {ms:.3f}" for name, ms in costs.items()))
    result = {"model": f"{args.model}:{args.size}", "steps": steps, "perop_ms": costs}
    if args.e2e:
        comparison = default_runner(settings).compare([original, graph, layout], use_cache=False)
        speedups = dict(zip(("path end", "ort:layout"), comparison.speedups[1:], strict=True))
        result["speedup"] = speedups
        result["loadavg"] = os.getloadavg()[0]
        print(
            "end to end against the original under onnxruntime's defaults: "
            + ", ".join(f"{name} {value:.3f}x" for name, value in speedups.items())
            + f" (load {result['loadavg']:.2f})"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
