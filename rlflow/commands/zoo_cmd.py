"""`rlflow zoo list | zoo export NAME -o FILE [--size small|medium|full]`."""

from __future__ import annotations

import argparse
import shutil

from rlflow.commands.common import check_output_file, print_json, write_atomic


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("zoo", help="the built-in benchmark models")
    actions = parser.add_subparsers(dest="zoo_action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list the zoo models")
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    export = actions.add_parser("export", help="export a zoo model to an ONNX file")
    export.add_argument("name", metavar="NAME")
    export.add_argument("-o", "--output", required=True, metavar="FILE")
    export.add_argument("--size", choices=("small", "medium", "full"), default="small")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rlflow import zoo

    if args.zoo_action == "list":
        if args.json:
            print_json({"models": {name: zoo.describe(name) for name in zoo.MODEL_NAMES}})
        else:
            width = max(len(name) for name in zoo.MODEL_NAMES)
            for name in zoo.MODEL_NAMES:
                print(f"{name:<{width}}  {zoo.describe(name)}")
        return 0
    check_output_file("-o", args.output)
    source = zoo.cached_path(args.name, args.size)
    with open(source, "rb") as handle:
        write_atomic(args.output, handle.read())
    shutil.copymode(source, args.output)
    print(f"wrote {args.output} ({args.name}, size {args.size})")
    return 0
