"""`rlflow search MODEL --method greedy|taso|random|brkga|regal:RUN_DIR -o OUT`: optimise a
model by search.

The search ranks graphs with a cost model, then times its best few against the original in
one interleaved run; OUT is written only once the chosen graph has passed the equivalence
check against the original (otherwise: exit 2, nothing written). The same run as
`rlflow optimize --method` (`rlflow.commands.optimize.optimize_to_file`).
"""

from __future__ import annotations

import argparse

from rlflow.commands.common import add_model_arguments
from rlflow.commands.optimize import add_method_arguments, optimize_to_file
from rlflow.optimize import SEARCH_METHODS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("search", help="optimise a model with a search baseline")
    add_model_arguments(parser)
    parser.add_argument(
        "--method",
        required=True,
        metavar="METHOD",
        help=f"search method: {', '.join(SEARCH_METHODS)}, regal:RUN_DIR, guided:RUN_DIR or "
        "replay:RESULT.json",
    )
    add_method_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return optimize_to_file(args, args.method)
