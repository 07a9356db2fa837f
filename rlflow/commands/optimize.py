"""`rlflow optimize MODEL -o OUT [--method NAME | --agent RUN_DIR]`: make a model faster.

Runs a search baseline (default: taso) or a trained agent (a PPO run or a world-model
controller run) on the model, times the best graphs found against the original in one
interleaved run, checks the chosen graph for equivalence, and only then writes OUT.
"""

from __future__ import annotations

import argparse
import sys
import time

from rlflow.commands.common import add_model_arguments, model_label, print_json, resolve_model
from rlflow.commands.measure import add_ort_arguments
from rlflow.commands.pipeline import COST_CHOICES, DEFAULT_METHOD, SEARCH_METHODS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "optimize", help="optimise a model (search or trained agent), verified, to OUT"
    )
    add_model_arguments(parser)
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--method", choices=SEARCH_METHODS, help=f"search baseline (default {DEFAULT_METHOD})"
    )
    how.add_argument(
        "--agent", metavar="RUN_DIR", help="a trained run: train-ppo or train-controller RUN_DIR"
    )
    parser.add_argument("--budget", type=int, help="search expansions (default: the method's)")
    parser.add_argument(
        "--cost",
        choices=COST_CHOICES,
        help="cost model ranking graphs (default analytic; an agent: its env's reward source)",
    )
    parser.add_argument(
        "--episodes", type=int, default=4, help="agent: rollouts on the model (default 4)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random walks / agent rollouts")
    parser.add_argument(
        "--top-k", type=int, default=3, help="best graphs timed against the original at the end"
    )
    parser.add_argument(
        "--min-time",
        type=float,
        metavar="S",
        help="timed seconds per graph in the final measurements (default: adaptive, 1-10 s "
        "until every graph's 3rd-smallest run settles)",
    )
    add_ort_arguments(parser)
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="optimised .onnx")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rlflow.commands.pipeline import (
        AGENT_PREFIX,
        SearchOptions,
        check_options,
        check_result,
        expansion_total,
        print_summary,
        run_method,
        summarize,
        validate_method,
        write_model,
    )
    from rlflow.cost import OrtSettings
    from rlflow.errors import RlflowError
    from rlflow.search import default_runner

    started = time.perf_counter()
    if args.min_time is not None and args.min_time < 0:
        raise RlflowError(f"--min-time must be at least 0, got {args.min_time}")
    if args.agent is not None:
        method, chosen = AGENT_PREFIX + args.agent, f"agent {args.agent}"
    elif args.method is not None:
        method, chosen = args.method, f"method {args.method}"
    else:
        method, chosen = DEFAULT_METHOD, f"method {DEFAULT_METHOD} (the default)"
    options = SearchOptions(
        budget=args.budget,
        cost=args.cost,
        seed=args.seed,
        top_k=args.top_k,
        episodes=args.episodes,
        size=args.size,
    )
    check_options(options)
    validate_method(method)  # a bad --agent fails before the model is loaded
    original = resolve_model(args.model, args.size, args.input_shape)
    label = model_label(args.model, args.size)
    settings = OrtSettings(threads=args.threads, ort_level=args.ort_level).resolved()
    print(f"rlflow optimize: {label} with {chosen}", file=sys.stderr)
    total = None if args.agent else expansion_total(method, args.budget)
    with tqdm(
        total=total,
        desc=f"{method.split(':')[0]} {label}",
        unit="step" if args.agent else "exp",
        file=sys.stderr,
        mininterval=0.5,
    ) as bar:
        result = run_method(
            method,
            original,
            label,
            settings,
            options,
            runner=default_runner(settings, args.min_time),
            progress=bar,
        )
    report = check_result(original, result)
    write_model(args.output, result.graph)
    summary = summarize(
        result,
        report,
        original,
        method=method,
        output=args.output,
        wall_s=time.perf_counter() - started,
        extra={
            "chosen_by_default": args.agent is None and args.method is None,
            "episodes": args.episodes if args.agent else None,
            "min_time_s": args.min_time,
        },
    )
    if args.json:
        print_json(summary)
    else:
        print_summary(summary)
    return 0
