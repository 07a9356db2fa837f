"""`rlflow <command>`: the command line. Each command lives in rlflow/commands/.

Errors a user can cause end as one line on stderr and exit code 2.

Only the command asked for is imported: the commands' modules pull in onnx, onnxruntime or
torch, and `rlflow zoo list` or a misspelt path must not wait seconds for all of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rlflow import __version__
from rlflow.errors import RlflowError

COMMANDS = {
    "zoo": "zoo_cmd",
    "inspect": "inspect",
    "measure": "measure",
    "rules": "rules_cmd",
    "search": "search",
    "collect": "collect",
    "train-wm": "train_wm",
    "train-wm-loop": "train_wm_loop",
    "train-ppo": "train_ppo",
    "train-controller": "train_controller",
    "train-regal": "train_regal",
    "train-advantage": "train_advantage",
    "optimize": "optimize",
    "bench": "bench",
    "costs": "costs",
}
"""Command name -> its module in rlflow/commands/, in the order `rlflow --help` lists them."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, given `command`, of that one only (the others are
    there by name, so that argparse still knows them)."""
    parser = argparse.ArgumentParser(
        prog="rlflow",
        description="Make ONNX models faster by learned, verified graph rewriting.",
    )
    parser.add_argument("--version", action="version", version=f"rlflow {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"rlflow.commands.{module}").add_parser(subparsers)
        else:
            subparsers.add_parser(name)
    return parser


def _command(argv: list[str]) -> str | None:
    """The command named in `argv` (the first word not an option: rlflow's own options take no
    value), or None when there is none or it is unknown (then argparse says so)."""
    word = next((arg for arg in argv if not arg.startswith("-")), None)
    return word if word in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command(argv)).parse_args(argv)
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
