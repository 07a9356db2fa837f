#!/usr/bin/env python
"""What a first step from a model's start state is worth, per rule, by the env's per-op cost.

PPO from scratch pays for exploring: if most of the slots the env offers at the start are
losses and the gains are small, a policy that samples learns that stopping (a return of 0)
beats moving before it ever finds a path whose gain comes later (docs/BENCHMARKS.md, "Learners
against search": ResNeXt-50 on one machine, where 100 of the 154 offered first steps lose and
the three group merges gain 0.1% each; on another, with the same rules, onnxruntime's start
graph differs, 71 of 150 gain and PPO learns). This prints, for every rule with a slot at the
start, how many slots it fills and how many of them gain or lose more than `--flat` percent,
and the mean change of a uniformly random first step: numbers of the machine it runs on.

    python scripts/first_step_values.py resnext-50 --size medium --start ort:all
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

from rlflow.envs.graph_rewrite import GraphRewriteEnv
from rlflow.errors import RlflowError


def first_step_values(model: str, size: str, start: str, max_candidates: int, flat: float) -> dict:
    """Per rule offered at the start: slots, gains, losses and the spread of the per-op
    change in percent (positive: faster), in the order of the most slots first."""
    env = GraphRewriteEnv(
        model,
        size=size,
        deploy="offline",
        cost="perop",
        start=start,
        max_candidates=max_candidates,
    )
    try:
        env.reset(seed=0)
        offered = env.offered_candidates()
        changes = env.candidate_cost_changes(range(len(offered)))
    finally:
        env.close()
    faster = [float(-100.0 * change) for change in changes]
    by_rule: dict[str, list[float]] = defaultdict(list)
    for candidate, pct in zip(offered, faster):
        by_rule[candidate.rule.name].append(pct)
    rules = [
        {
            "rule": rule,
            "slots": len(pcts),
            "gains": sum(pct > flat for pct in pcts),
            "losses": sum(pct < -flat for pct in pcts),
            "mean_pct": statistics.mean(pcts),
            "best_pct": max(pcts),
            "worst_pct": min(pcts),
        }
        for rule, pcts in sorted(by_rule.items(), key=lambda item: -len(item[1]))
    ]
    return {
        "model": f"{model}:{size}",
        "start": start,
        "offered": len(offered),
        "gains": sum(row["gains"] for row in rules),
        "losses": sum(row["losses"] for row in rules),
        "random_step_pct": statistics.mean(faster) if faster else 0.0,
        "rules": rules,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo name")
    parser.add_argument("--size", default="medium")
    parser.add_argument("--start", default="ort:all")
    parser.add_argument("--max-candidates", type=int, default=512, help="the env's slots")
    parser.add_argument(
        "--flat", type=float, default=0.1, help="changes within this percent count as neither"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.max_candidates < 1:
        parser.error("--max-candidates must be at least 1")
    if args.flat < 0:
        parser.error("--flat must be at least 0")
    try:
        result = first_step_values(
            args.model, args.size, args.start, args.max_candidates, args.flat
        )
    except (RlflowError, KeyError, ValueError, OSError) as error:
        print(f"first_step_values: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['model']} from {args.start}: {result['offered']} slots offered, "
        f"{result['gains']} gain and {result['losses']} lose more than {args.flat}%; "
        f"a random first step {result['random_step_pct']:+.2f}% on average"
    )
    print("| rule | slots | gains | losses | mean % faster | best | worst |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in result["rules"]:
        print(
            f"| `{row['rule']}` | {row['slots']} | {row['gains']} | {row['losses']} | "
            f"{row['mean_pct']:+.2f} | {row['best_pct']:+.2f} | {row['worst_pct']:+.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
