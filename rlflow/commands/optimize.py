"""`rlflow optimize MODEL -o OUT [--method NAME | --agent RUN_DIR]`: make a model faster.

Runs a search baseline (default: taso) or a trained agent (a PPO run or a world-model
controller run) on the model, times the best graphs found against the original in one
interleaved run, checks the chosen graph for equivalence, and only then writes OUT.
"""

from __future__ import annotations

import argparse

from rlflow.commands.common import add_model_arguments
from rlflow.commands.pipeline import (
    AGENT_PREFIX,
    DEFAULT_METHOD,
    SEARCH_METHODS,
    add_method_arguments,
    optimize_to_file,
)


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
    add_method_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.agent is not None:
        method, chosen = AGENT_PREFIX + args.agent, f"agent {args.agent}"
    elif args.method is not None:
        method, chosen = args.method, f"method {args.method}"
    else:
        method, chosen = DEFAULT_METHOD, f"method {DEFAULT_METHOD} (the default)"
    default = args.agent is None and args.method is None
    return optimize_to_file(args, method, chosen=chosen, extra={"chosen_by_default": default})
