#!/usr/bin/env python
"""What one rule does at each of its sites: the analytic and the per-op measured cost change.

A world model whose action is a rule (not its site) learns a rule's effect as the average over
the sites its data applied it to, and a controller applies a rule at the site whose rewritten
graph the env prices lowest (`rlflow.worldmodel.policy.cheapest_site`: offline, the per-op
cost; the analytic cost until 2026-11-27). This prints, for every site of RULE on a model's
start state (all of them, not only those within the env's candidate slots), both costs'
change in percent of the start's (positive: cheaper), and marks the site a controller takes
now (per-op) and the one the analytic choice took, so one can see where the two part
(docs/BENCHMARKS.md, "Learners against search": `nchwc-conv-unblock` on ResNet-18 and
ResNet-50). With `--max-candidates A` it also marks the sites an env of A slots offers
(`rlflow.envs.graph_rewrite.capped_indices`), and the controller's choice is among those.

    python scripts/probe_rule_sites.py resnet-18 --size medium --start ort:all \\
        --rule nchwc-conv-unblock
"""

from __future__ import annotations

import argparse
import json

from rlflow import zoo
from rlflow.cost import AnalyticCostModel, OrtSettings
from rlflow.cost.deploy import Deployment
from rlflow.cost.ort_optimizer import start_state
from rlflow.cost.perop import PerOpCostModel
from rlflow.envs.graph_rewrite import capped_indices
from rlflow.graph.onnx_io import load_model
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import RewriteSession


def rule_sites(
    model: str, size: str, start: str, rule: str, max_candidates: int | None = None
) -> dict:
    """Per site of `rule` on the start state: the first node it rewrites, both changes and,
    given `max_candidates`, whether an env of that many slots offers it."""
    settings = OrtSettings(provider="cpu")
    graph = start_state(load_model(zoo.cached_path(model, size)), start, settings).graph
    analytic = AnalyticCostModel()
    perop = PerOpCostModel(Deployment("offline").settings(settings))
    analytic_ms, perop_ms = analytic.cost_ms(graph), perop.cost_ms(graph)
    candidates = RewriteSession(graph, default_ruleset()).candidates()
    names = [candidate.rule.name for candidate in candidates]
    offered = set(capped_indices(names, max_candidates or len(names)))
    sites = []
    for index, candidate in enumerate(candidates):
        if candidate.rule.name != rule:
            continue
        rewritten = candidate.graph
        sites.append(
            {
                "site": list(candidate.site),
                "node": graph.nodes[candidate.site[0]].name,
                "analytic_pct": 100 * (1 - analytic.cost_ms(rewritten) / analytic_ms),
                "perop_pct": 100 * (1 - perop.cost_ms(rewritten) / perop_ms),
                "offered": index in offered,
            }
        )
    within = [site for site in sites if site["offered"]]
    if within:
        max(within, key=lambda site: site["perop_pct"])["controller_takes"] = True
        max(within, key=lambda site: site["analytic_pct"])["analytic_takes"] = True
    return {
        "model": f"{model}:{size}",
        "start": start,
        "rule": rule,
        "candidates": len(candidates),
        "max_candidates": max_candidates,
        "sites": sites,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--size", default="medium")
    parser.add_argument("--start", default="ort:all")
    parser.add_argument("--rule", required=True)
    parser.add_argument(
        "--max-candidates", type=int, metavar="A", help="mark the sites an env of A slots offers"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.max_candidates is not None and args.max_candidates < 1:
        parser.error("--max-candidates must be at least 1")
    result = rule_sites(args.model, args.size, args.start, args.rule, args.max_candidates)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.rule} on {result['model']} from {args.start} ({result['candidates']} "
        "candidates): cost change, % of the start's"
    )
    for site in result["sites"]:
        marks = [name for name in ("controller", "analytic") if site.get(f"{name}_takes")]
        mark = f"  <- {' and '.join(marks)} choice" if marks else ""
        slot = "" if args.max_candidates is None else f"{'offered' if site['offered'] else '':8s}"
        print(
            f"{site['node'][-60:]:60s} {slot}analytic {site['analytic_pct']:+6.2f}%  "
            f"per-op {site['perop_pct']:+6.2f}%{mark}"
        )


if __name__ == "__main__":
    main()
