"""`rlflow collect --model M... --episodes N --out DATA_DIR`: real rollouts for the world model.

Shards are written atomically with a manifest; a rerun resumes and never rewrites a finished
shard. The manifest records the real env steps and real end-to-end measurements spent.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from rlflow.commands.backend import add_backend_arguments, check_backend
from rlflow.commands.common import (
    add_env_arguments,
    check_cost_table,
    check_output_dir,
    cost_type,
    env_provider,
    print_json,
)
from rlflow.commands.wm_settings import add_common_options, settings_from

FLAGS = [
    "episodes",
    "policy",
    "size",
    "cost",
    "deploy",
    "start",
    "seed",
    "episodes_per_shard",
    "stop_probability",
    "rule_repeat",
    "candidate_samples",
]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "collect", help="roll out a policy in the real env and store shards for the world model"
    )
    parser.add_argument(
        "--model",
        "--models",
        dest="model",
        nargs="+",
        required=True,
        metavar="MODEL",
        help="zoo names or .onnx paths",
    )
    parser.add_argument("--episodes", type=int, help="episodes wanted in DATA_DIR (default 64)")
    parser.add_argument(
        "--policy",
        help="random (default: uniform over candidates) | random-rule (uniform over rules, then "
        "sites) | random-rule-cheapest (uniform over rules, then the site a controller would "
        "take) | agent:RUN_DIR (a train-ppo or train-controller run) | demo:RESULT.json (a "
        "search's recorded path, `rlflow optimize --json`, then random-rule-cheapest)",
        metavar="POLICY",
    )
    parser.add_argument("--out", required=True, metavar="DATA_DIR", help="the data directory")
    parser.add_argument(
        "--workers", type=int, default=1, help="processes (default 1; in process only)"
    )
    add_backend_arguments(parser)
    parser.add_argument(
        "--size", choices=("small", "medium", "full"), help="zoo model size (small)"
    )
    parser.add_argument(
        "--cost",
        type=cost_type(("analytic", "perop", "e2e", "e2e-sparse", "perop-e2e")),
        metavar="COST",
        help="env reward cost: analytic, perop, e2e, e2e-sparse, perop-e2e or table:NAME|PATH "
        "(a cost table's per-op times: rlflow costs collect; default perop offline, analytic "
        "online)",
    )
    add_env_arguments(parser)
    add_candidates_argument(parser)
    parser.add_argument("--seed", type=int, help="seed of the shards (default 0)")
    parser.add_argument("--episodes-per-shard", type=int, help="episodes per shard (16)")
    parser.add_argument("--stop-probability", type=float, help="random agent's stop chance (0.2)")
    add_rule_repeat_argument(parser)
    parser.add_argument(
        "--candidate-samples",
        type=int,
        metavar="S",
        help="record the cost change of S candidates drawn at each state, the data of "
        "`rlflow train-advantage` (default 0: none; needs --cost analytic or perop)",
    )
    add_common_options(parser, run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    check_output_dir("--out", args.out)  # before torch loads
    check_cost_table(args.cost)  # a table that cannot be read: one line, before any work
    check_backend(args)
    provider = env_provider(args.provider)

    from rlflow.worldmodel.collect import CollectSettings, collect

    settings = with_env(
        settings_from(args, CollectSettings, "collect", FLAGS, models=args.model),
        provider,
        args.max_candidates,
    )
    before = _finished_shards(args.out)
    manifest = collect(
        settings,
        args.out,
        workers=args.workers,
        progress=not args.quiet,
        backend=args.backend,
        ray_address=args.ray_address,
    )
    totals = manifest["totals"]
    summary = {
        "out": str(args.out),
        "models": settings.models,
        "policy": settings.policy,
        "episodes": totals["episodes"],
        "steps": totals["steps"],
        "shards": len(manifest["shards"]),
        "new_shards": len(manifest["shards"]) - before,
        "real_env_steps": totals["real_env_steps"],
        "real_measurements": totals["real_measurements"],
        "backend": args.backend,
        "collect_s": totals["seconds"],
        "wall_s": time.perf_counter() - started,
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"{summary['out']}: {summary['episodes']} episodes, {summary['steps']} steps in "
            f"{summary['shards']} shards ({summary['new_shards']} new) of {summary['policy']} "
            f"on {', '.join(summary['models'])}"
        )
        print(
            f"real env steps {summary['real_env_steps']}, real measurements "
            f"{summary['real_measurements']}; wall {summary['wall_s']:.1f} s"
        )
    return 0


def add_candidates_argument(parser: argparse.ArgumentParser) -> None:
    """`--max-candidates` of the commands that collect (train-ppo has its own, a network
    setting there)."""
    parser.add_argument(
        "--max-candidates",
        type=int,
        metavar="A",
        help="the env's candidate slots (default 512): past them each state shares them "
        "round-robin over the rules, each rule's share spread evenly over its sites in graph "
        "order",
    )


def add_rule_repeat_argument(parser: argparse.ArgumentParser) -> None:
    """`--rule-repeat` of the commands whose random agent collects (collect, train-wm-loop)."""
    parser.add_argument(
        "--rule-repeat",
        type=float,
        metavar="P",
        help="a rule-level random agent draws its last rule again with chance P while it is on "
        "offer: runs of 1/(1-P) steps of one rule, so data reaches graphs that pay only after "
        "a run (default 0)",
    )


def with_env(settings: Any, provider: str | None, max_candidates: int | None = None) -> Any:
    """CollectSettings with `--provider` and `--max-candidates` (those given) among its env's
    arguments."""
    from rlflow.errors import RlflowError

    given: dict[str, Any] = {}
    if provider is not None:
        given["provider"] = provider
    if max_candidates is not None:
        if max_candidates < 1:
            raise RlflowError(f"--max-candidates must be at least 1, got {max_candidates}")
        given["max_candidates"] = max_candidates
    return replace(settings, env={**settings.env, **given}) if given else settings


def _finished_shards(out: str) -> int:
    import json
    from pathlib import Path

    try:
        return len(json.loads((Path(out) / "manifest.json").read_text())["shards"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
