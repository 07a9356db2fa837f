"""`rlflow search MODEL --method greedy|taso|random -o OUT`: optimise a model by search.

The search ranks graphs with a cost model, then times its best few against the original in
one interleaved run; OUT is written only once the chosen graph has passed the equivalence
check against the original (otherwise: exit 2, nothing written).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from rlflow.commands.common import (
    add_model_arguments,
    model_label,
    print_json,
    resolve_model,
    write_atomic,
)
from rlflow.commands.measure import add_ort_arguments
from rlflow.errors import RlflowError

METHOD_NAMES = ("greedy", "taso", "random")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("search", help="optimise a model with a search baseline")
    add_model_arguments(parser)
    parser.add_argument("--method", choices=METHOD_NAMES, required=True, help="search method")
    parser.add_argument(
        "--budget",
        type=int,
        help="expansions (greedy: steps, default to the local minimum; taso: 1000; random: 300)",
    )
    parser.add_argument(
        "--alpha", type=float, default=1.05, help="taso: keep graphs under alpha x best cost"
    )
    parser.add_argument(
        "--cost",
        choices=("analytic", "perop", "e2e"),
        default="analytic",
        help="cost model the search ranks graphs by (default analytic; e2e: small budgets only)",
    )
    parser.add_argument(
        "--portable", action="store_true", help="only rules that emit standard ONNX ops"
    )
    parser.add_argument("--seed", type=int, default=0, help="random: seed of the walks")
    parser.add_argument(
        "--top-k", type=int, default=3, help="best graphs timed against the original at the end"
    )
    add_ort_arguments(parser)
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="optimised .onnx")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rlflow.cost import OrtSettings, check_equivalence
    from rlflow.rewrite import default_ruleset
    from rlflow.rewrite.session import RewriteSession
    from rlflow.search import default_runner, make_cost, search

    started = time.perf_counter()
    if args.budget is not None and args.budget < 1:
        raise RlflowError(f"--budget must be at least 1, got {args.budget}")
    if args.top_k < 1:
        raise RlflowError(f"--top-k must be at least 1, got {args.top_k}")
    original = resolve_model(args.model, args.size, args.input_shape)
    label = model_label(args.model, args.size)
    settings = OrtSettings(threads=args.threads, ort_level=args.ort_level).resolved()
    cost = make_cost(args.cost, settings)
    session = RewriteSession(original, default_ruleset(portable=args.portable), model=label)

    options: dict[str, Any] = {"runner": default_runner(settings), "top_k": args.top_k}
    if args.budget is not None:
        options["budget"] = args.budget
    if args.method == "taso":
        options["alpha"] = args.alpha
    if args.method == "random":
        options["seed"] = args.seed
    total = options.get("budget", None if args.method == "greedy" else _default_budget(args))
    with tqdm(
        total=total, desc=f"{args.method} {label}", unit="exp", file=sys.stderr, mininterval=0.5
    ) as bar:
        result = search(args.method, session, cost, progress=bar, **options)

    model = result.graph.to_onnx()
    report = check_equivalence(original, model)
    if not report.equivalent:
        raise RlflowError(
            f"the optimised graph is not equivalent to the original ({report.reason}); "
            f"nothing written"
        )
    write_atomic(args.output, model.SerializeToString())
    wall_s = time.perf_counter() - started

    summary = {
        "model": label,
        "method": args.method,
        "output": str(args.output),
        "original_ms": result.original_ms,
        "optimized_ms": result.optimized_ms,
        "speedup": result.speedup,
        "ort_level": result.ort_level,
        "threads": result.threads,
        "provider": result.provider,
        "steps": len(result.actions),
        "rules_applied": result.rules_applied,
        "wall_s": wall_s,
        "search_s": result.search_s,
        "measure_s": result.measure_s,
        "max_abs_err": report.max_abs_err,
        "max_rel_err": report.max_rel_err,
        "equivalent": report.equivalent,
        "expansions": result.expansions,
        "evaluated": result.evaluated,
        "cost_model": result.cost_model,
        "original_cost": result.original_cost,
        "optimized_cost": result.cost,
        "budget": total,
        "alpha": args.alpha if args.method == "taso" else None,
        "seed": args.seed if args.method == "random" else None,
        "portable": args.portable,
        "original_nodes": len(original),
        "optimized_nodes": len(result.graph),
        "finalists": [vars(finalist) for finalist in result.finalists],
        "confirmed": result.confirmed,
        "episode": result.state.to_json(),
    }
    if args.json:
        print_json(summary)
    else:
        print_table(summary)
    return 0


def _default_budget(args: argparse.Namespace) -> int:
    from rlflow.search import random_walk, taso

    return taso.DEFAULT_BUDGET if args.method == "taso" else random_walk.DEFAULT_BUDGET


def _how_measured(summary: dict[str, Any]) -> str:
    finalists = len(summary["finalists"])
    if summary["confirmed"] is None:
        return f"the original was fastest of {finalists} graphs timed interleaved in one run"
    if summary["confirmed"]:
        return f"fastest of {finalists} graphs, confirmed in a second interleaved run"
    return f"the fastest of {finalists} graphs was not faster in a second run: original kept"


def print_table(summary: dict[str, Any]) -> None:
    print(f"{'':<14}{'original':>12}{'optimized':>12}")
    print(f"{'latency ms':<14}{summary['original_ms']:>12.3f}{summary['optimized_ms']:>12.3f}")
    print(f"{'nodes':<14}{summary['original_nodes']:>12}{summary['optimized_nodes']:>12}")
    cost_label = f"cost ({summary['cost_model']})"
    print(f"{cost_label:<14}{summary['original_cost']:>12.4g}{summary['optimized_cost']:>12.4g}")
    print(f"speedup {summary['speedup']:.3f}x ({_how_measured(summary)})")
    if summary["rules_applied"]:
        rules = ", ".join(f"{name} x{count}" for name, count in summary["rules_applied"].items())
        print(f"rules applied ({summary['steps']} steps): {rules}")
    else:
        print("rules applied: none (no rewritten graph measured faster than the original)")
    print(
        f"search: {summary['method']}, {summary['expansions']} expansions, "
        f"{summary['evaluated']} graphs costed; wall {summary['wall_s']:.1f} s "
        f"(search {summary['search_s']:.1f} s, measure {summary['measure_s']:.1f} s)"
    )
    print(
        f"settings: {summary['threads']} thread(s), ort-level {summary['ort_level']}, "
        f"provider {summary['provider']}"
    )
    print(f"equivalent: yes, max abs error {summary['max_abs_err']:.2e}")
    print(f"wrote {summary['output']}")
