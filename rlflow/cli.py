"""`rlflow <command>`: the command line. Each command lives in rlflow/commands/.

Errors a user can cause end as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rlflow import __version__
from rlflow.errors import RlflowError

# Command modules, in the order `rlflow --help` lists them.
COMMANDS = (
    "zoo_cmd",
    "inspect",
    "measure",
    "rules_cmd",
    "search",
    "collect",
    "train_wm",
    "train_ppo",
    "train_controller",
    "optimize",
    "bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlflow",
        description="Make ONNX models faster by learned, verified graph rewriting.",
    )
    parser.add_argument("--version", action="version", version=f"rlflow {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"rlflow.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except RlflowError as error:
        print(f"rlflow: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlflow: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
