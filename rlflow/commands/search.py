"""`rlflow search MODEL --method greedy|taso|random -o OUT`: optimise a model by search.

The search ranks graphs with a cost model, then times its best few against the original in
one interleaved run; OUT is written only once the chosen graph has passed the equivalence
check against the original (otherwise: exit 2, nothing written).
"""

from __future__ import annotations

import argparse
import sys
import time

from rlflow.commands.common import add_model_arguments, model_label, print_json, resolve_model
from rlflow.commands.measure import add_ort_arguments
from rlflow.commands.pipeline import SEARCH_METHODS as METHOD_NAMES


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

    from rlflow.commands.pipeline import (
        SearchOptions,
        check_options,
        check_result,
        expansion_total,
        print_summary,
        run_search,
        summarize,
        write_model,
    )
    from rlflow.cost import OrtSettings
    from rlflow.search import default_runner

    started = time.perf_counter()
    options = SearchOptions(
        budget=args.budget,
        cost=args.cost,
        alpha=args.alpha,
        seed=args.seed,
        top_k=args.top_k,
        portable=args.portable,
    )
    check_options(options)
    original = resolve_model(args.model, args.size, args.input_shape)
    label = model_label(args.model, args.size)
    settings = OrtSettings(threads=args.threads, ort_level=args.ort_level).resolved()
    total = expansion_total(args.method, args.budget)
    with tqdm(
        total=total, desc=f"{args.method} {label}", unit="exp", file=sys.stderr, mininterval=0.5
    ) as bar:
        result = run_search(
            args.method,
            original,
            label,
            settings,
            options,
            runner=default_runner(settings),
            progress=bar,
        )
    report = check_result(original, result)
    write_model(args.output, result.graph)
    summary = summarize(
        result,
        report,
        original,
        method=args.method,
        output=args.output,
        wall_s=time.perf_counter() - started,
        extra={
            "budget": total,
            "alpha": args.alpha if args.method == "taso" else None,
            "seed": args.seed if args.method == "random" else None,
            "portable": args.portable,
        },
    )
    if args.json:
        print_json(summary)
    else:
        print_summary(summary)
    return 0
