"""`rlflow costs collect|list`: per-operator cost tables, measured once, used anywhere.

`collect` times on this machine's provider every operator instance that random and greedy
rollouts reach on each model (`rlflow.search.table_collect`) and writes a table; `--cost
table:PATH` (or `table:NAME` for one shipped with rlflow, which `list` shows) then ranks graphs
by it on any machine (`rlflow.cost.table`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from rlflow.commands.common import (
    add_model_options,
    add_provider_argument,
    check_number,
    check_output_file,
    chosen_provider,
    model_label,
    print_json,
)
from rlflow.cost.deploy import DEPLOY_MODES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("costs", help="per-operator cost tables: collect, list")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    collect = actions.add_parser(
        "collect", help="time every operator rollouts reach on each model into a cost table"
    )
    collect.add_argument(
        "--models",
        "--model",
        dest="models",
        nargs="+",
        required=True,
        metavar="MODEL",
        help="zoo names or .onnx paths",
    )
    add_model_options(collect)
    collect.add_argument(
        "--steps",
        type=int,
        default=20,
        help="env steps of each rollout (a random walk and a greedy descent) per start "
        "(default 20)",
    )
    collect.add_argument("--out", required=True, metavar="FILE", help="the table (.json)")
    add_provider_argument(collect)
    collect.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    collect.add_argument(
        "--deploy",
        choices=DEPLOY_MODES,
        default="offline",
        help="offline (default): operators timed as written, the optimiser off; online: at "
        "onnxruntime's level all",
    )
    collect.add_argument("--seed", type=int, default=0, help="seed of the random walks")
    collect.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="models collected at once, in worker processes that rewrite in parallel and time "
        "one at a time (default 1)",
    )
    collect.add_argument("--json", action="store_true", help="print one JSON object last")
    collect.set_defaults(run=run_collect)
    listing = actions.add_parser("list", help="the cost tables shipped with rlflow")
    listing.add_argument("--json", action="store_true", help="print one JSON object last")
    listing.set_defaults(run=run_list)


def run_collect(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    check_output_file("--out", args.out)
    check_number("--steps", args.steps, 1)
    check_number("--threads", args.threads, 1)
    check_number("--jobs", args.jobs, 1)
    provider = chosen_provider(args.provider, "costs collect")

    from rlflow.commands.common import resolve_model
    from rlflow.cost import Deployment, OrtSettings
    from rlflow.search.table_collect import collect_table, rollout_steps

    settings = OrtSettings(threads=args.threads, provider=provider).resolved()
    deploy = Deployment(args.deploy)
    models = [
        (model_label(name, args.size), resolve_model(name, args.size, args.input_shape))
        for name in args.models
    ]
    started = time.perf_counter()
    words = ["rlflow", "costs", "collect", "--provider", provider, "--models", *args.models]
    words += ["--size", args.size, "--steps", str(args.steps), "--deploy", args.deploy]
    words += ["--threads", str(args.threads), "--seed", str(args.seed), "--jobs", str(args.jobs)]
    words += ["--out", str(args.out)]
    command = shlex.join(words + [f"--input-shape={shape}" for shape in args.input_shape])
    with tqdm(
        total=len(models) * rollout_steps(deploy, args.steps),
        desc=f"costs collect ({provider})",
        unit="step",
        file=sys.stderr,
        mininterval=0.5,
    ) as bar:
        table = collect_table(
            models,
            args.out,
            settings=settings,
            deploy=deploy,
            steps=args.steps,
            seed=args.seed,
            meta={"size": args.size, "command": command},
            progress=bar,
            jobs=args.jobs,
        )
    summary = {
        "out": str(args.out),
        "models": table.meta["models"],
        "operators": len(table.entries),
        "failed": len(table.failed),
        "overhead_ms": table.overhead_ms,
        "provider": table.meta["provider"],
        "device": table.meta["device"],
        "driver": table.meta["driver"],
        "cuda": table.meta["cuda"],
        "onnxruntime": table.meta["onnxruntime"],
        "deploy": table.meta["deploy"],
        "ort_level": table.meta["ort_level"],
        "provider_options": table.meta["provider_options"],
        "steps": args.steps,
        "wall_s": time.perf_counter() - started,
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"{summary['out']}: {summary['operators']} operators timed on {summary['provider']} "
            f"({summary['device']}), {summary['failed']} that cannot run alone, over "
            f"{', '.join(summary['models'])}; deploy {summary['deploy']} (level "
            f"{summary['ort_level']}), onnxruntime {summary['onnxruntime']}"
        )
        print(f"use it with --cost table:{summary['out']}; wall {summary['wall_s']:.1f} s")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from rlflow.cost.table import load_table, table_names

    rows = []
    for name in table_names():
        table = load_table(name)
        meta = table.meta
        rows.append(
            {
                "name": name,
                "provider": meta.get("provider"),
                "device": meta.get("device"),
                "deploy": meta.get("deploy"),
                "operators": len(table.entries),
                "models": meta.get("models", []),
                "onnxruntime": meta.get("onnxruntime"),
            }
        )
    if args.json:
        print_json({"tables": rows})
        return 0
    if not rows:
        print("no cost tables are shipped with this rlflow; collect one with rlflow costs collect")
    for row in rows:
        print(
            f"table:{row['name']:<12} {row['provider']} on {row['device']}, deploy "
            f"{row['deploy']}, {row['operators']} operators of {', '.join(row['models'])} "
            f"(onnxruntime {row['onnxruntime']})"
        )
    return 0
