"""`rlflow train-ppo --model M1 M2 ... --out RUN_DIR`: train the PPO agent across graphs.

Hyperparameters come from `PPOConfig`'s defaults (mirrored by configs/ppo.yaml), then
`--config FILE` (or, when continuing a run without one, RUN_DIR/config.yaml), then the flags.
A rerun into the same RUN_DIR continues from its checkpoint and step count.

`--seeds 0,1,2` trains one run per seed, `RUN_DIR/seed-0`, `RUN_DIR/seed-1`, ... (each a run
directory of its own that a rerun continues), one after the other. Every run or run set ends
with its learning curves, `RUN_DIR/learning_curve.png` (each seed, and the mean over the
spread) and the points behind them, `RUN_DIR/learning_curve.csv`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
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
from rlflow.errors import RlflowError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-ppo", help="train the PPO agent (X-RLflow baseline) on one or more models"
    )
    parser.add_argument(
        "--model",
        "--models",
        dest="model",
        nargs="+",
        metavar="MODEL",
        help="zoo names or .onnx paths, one drawn per episode (default: RUN_DIR's config)",
    )
    parser.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory")
    parser.add_argument(
        "--config", metavar="FILE", help="YAML hyperparameters (e.g. configs/ppo.yaml)"
    )
    parser.add_argument("--size", choices=("small", "medium", "full"), help="zoo model size")
    parser.add_argument(
        "--cost",
        type=cost_type(("perop-e2e", "perop", "analytic", "e2e", "e2e-sparse")),
        metavar="COST",
        help="reward cost: perop-e2e (default: the per-op measured cost, an end-to-end check "
        "every --measure-every steps), an ablation such as analytic, or table:NAME|PATH (a "
        "cost table's per-op times, e.g. a GPU's: rlflow costs collect)",
    )
    parser.add_argument(
        "--measure-every", type=int, metavar="N", help="steps between end-to-end checks (10)"
    )
    add_env_arguments(parser)
    parser.add_argument(
        "--num-envs", type=int, metavar="E", help="envs stepped together (default 1)"
    )
    parser.add_argument(
        "--num-steps",
        type=int,
        metavar="T",
        help="steps per env per update (default: whole episodes, episodes_per_update of them)",
    )
    parser.add_argument(
        "--ort-level", choices=("all", "disable"), help="onnxruntime level of measurements"
    )
    parser.add_argument("--total-steps", type=int, metavar="N", help="env steps of the run")
    parser.add_argument("--scorer", choices=("local", "full"), help="candidate scoring")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, help="seed of torch, numpy and the env")
    seeds.add_argument(
        "--seeds",
        type=_seed_list,
        metavar="S,S,...",
        help="one run per seed, in RUN_DIR/seed-S, and their learning curves with the spread",
    )
    parser.add_argument("--max-candidates", type=int, metavar="A", help="candidate slots")
    parser.add_argument("--max-nodes", type=int, metavar="N", help="padded operator count")
    parser.add_argument("--max-edges", type=int, metavar="M", help="padded edge count")
    parser.add_argument("--horizon", type=int, metavar="T", help="steps per episode")
    parser.add_argument(
        "--revisit-penalty",
        type=float,
        metavar="R",
        help="subtract R from the reward of a step back to a graph the episode already "
        "visited (a rule, then its reverse), which X-RLflow's reward does not charge (default 0)",
    )
    parser.add_argument(
        "--mask-revisits",
        action="store_true",
        default=None,
        help="withhold the candidates that lead back to a graph the episode already visited "
        "(every graph reachable from the start stays reachable: a path without the cycle ends "
        "there too; what goes is a way back from a wrong turn)",
    )
    parser.add_argument(
        "--init-from",
        metavar="RUN_DIR",
        help="start the network from another train-ppo run's checkpoint (fine-tuning on "
        "--model; same rule set and network settings)",
    )
    parser.add_argument(
        "--demo",
        "--demos",
        dest="demo",
        nargs="+",
        metavar="RESULT.json",
        help="recorded episodes (rlflow optimize --json) the policy imitates before PPO starts "
        "(behaviour cloning; a fresh run only)",
    )
    parser.add_argument(
        "--demo-epochs", type=int, metavar="N", help="passes over the demos (default 500)"
    )
    parser.add_argument(
        "--demo-coef",
        type=float,
        metavar="W",
        help="keep imitating the demos during PPO: the cloning loss at weight W after each "
        "update, fading linearly to 0 over the run (default 0: imitate only before PPO)",
    )
    parser.add_argument(
        "--portable", action="store_true", default=None, help="only standard-ONNX rules"
    )
    rerun = parser.add_mutually_exclusive_group()
    rerun.add_argument(
        "--resume", action="store_true", help="require RUN_DIR to hold a checkpoint to continue"
    )
    rerun.add_argument(
        "--force",
        action="store_true",
        help="start RUN_DIR's run over (its checkpoint, progress, config and curves go); "
        "without it, a rerun continues the run and may change only --total-steps",
    )
    add_backend_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


FLAG_FIELDS = {
    "model": "models",
    "size": "size",
    "cost": "cost",
    "measure_every": "measure_every",
    "deploy": "deploy",
    "start": "start",
    "num_envs": "num_envs",
    "num_steps": "num_steps",
    "ort_level": "ort_level",
    "provider": "provider",
    "total_steps": "total_steps",
    "scorer": "scorer",
    "seed": "seed",
    "max_candidates": "max_candidates",
    "max_nodes": "max_nodes",
    "max_edges": "max_edges",
    "horizon": "horizon",
    "revisit_penalty": "revisit_penalty",
    "mask_revisits": "mask_revisits",
    "portable": "portable",
    "init_from": "init_from",
    "demo": "demos",
    "demo_epochs": "demo_epochs",
    "demo_coef": "demo_coef",
}
"""argparse destination -> PPOConfig field, for the flags that override the config."""


def _seed_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 0,1,2, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct seeds like 0,1,2, got {text!r}")
    return seeds


def resolve_config(args: argparse.Namespace, run_dir: Path | None = None) -> Any:
    """The run's PPOConfig: defaults, then the config file, then the flags."""
    from rlflow.agents.ppo import PPOConfig, saved_config
    from rlflow.config import read_yaml

    run_dir = Path(args.out) if run_dir is None else run_dir
    values: dict[str, Any] = {}
    if args.config:
        values = read_yaml(args.config)
    elif (run_dir / "config.yaml").is_file():
        values = saved_config(read_yaml(run_dir / "config.yaml"))
    values = {key: value for key, value in values.items() if key != "kind"}
    for dest, name in FLAG_FIELDS.items():
        value = getattr(args, dest, None)
        if value is not None:
            values[name] = value
    if not values.get("models"):
        raise RlflowError("give --model (one or more zoo names or .onnx paths)")
    try:
        return PPOConfig.from_dict(values)
    except TypeError as error:
        raise RlflowError(f"bad PPO config: {error}") from None


CHECKPOINT = Path("checkpoints") / "latest.pt"
"""Where a run keeps its checkpoint (rlflow.agents.ppo.CHECKPOINT), known here without
importing torch, so that the quick errors stay quick."""


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_output_dir("--out", out)
    check_cost_table(args.cost)  # a table that cannot be read: one line, before any work
    check_backend(args)
    args.provider = env_provider(args.provider)
    for name in ("num_envs", "num_steps", "measure_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise RlflowError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    seeds: list[int | None] = list(args.seeds) if args.seeds else [None]
    run_dirs = {
        (f"seed {seed}" if seed is not None else "run"): (
            out / f"seed-{seed}" if seed is not None else out
        )
        for seed in seeds
    }
    for run_dir in run_dirs.values():
        if args.resume and not (run_dir / CHECKPOINT).is_file():
            raise RlflowError(f"--resume: no PPO checkpoint at {run_dir / CHECKPOINT}")
        if not args.model and not args.config and not (run_dir / "config.yaml").is_file():
            raise RlflowError("give --model (one or more zoo names or .onnx paths)")
    if args.init_from and not (Path(args.init_from) / CHECKPOINT).is_file():
        raise RlflowError(f"--init-from: no PPO checkpoint at {Path(args.init_from) / CHECKPOINT}")

    if args.demo:
        from rlflow.agents.demos import read_demos

        read_demos(args.demo)  # a file without an episode: one line, before any work
    from rlflow.agents.ppo import load_checkpoint, train

    configs = {}
    for seed, (label, run_dir) in zip(seeds, run_dirs.items(), strict=True):
        config = resolve_config(args, run_dir)
        if seed is not None:
            config.seed = seed
        configs[label] = config
        if not args.force and (run_dir / CHECKPOINT).exists():
            load_checkpoint(run_dir)  # refuse a corrupt checkpoint before any work
    summaries = {}
    for label, run_dir in run_dirs.items():
        if args.force:
            start_over(run_dir)
        summaries[label] = summary = train(
            configs[label],
            run_dir,
            progress=not args.no_progress,
            backend=args.backend,
            ray_address=args.ray_address,
        )
        if not args.json:
            print(
                f"{f'{label}: ' if args.seeds else ''}trained {summary['global_step']} steps "
                f"({summary['episodes']} episodes, {summary['updates']} updates) in "
                f"{summary['wall_s']:.1f} s; last episodes: return "
                f"{summary['mean_return'] or 0.0:.2f}, speedup "
                f"{summary['mean_speedup'] or 1.0:.3f}; checkpoint {run_dir / CHECKPOINT}"
            )
    curves = draw_curves(out, run_dirs)
    if args.json:
        result = dict(summaries["run"]) if not args.seeds else {"runs": summaries}
        result["learning_curve"] = str(curves) if curves else None
        print_json(result)
    elif curves:
        print(f"learning curves: {curves}")
    return 0


def draw_curves(out: Path, run_dirs: dict[str, Path]) -> Path | None:
    """`out/learning_curve.png` (and its CSV) of the runs; None before any episode ended."""
    from rlflow.report.seeds import plot_run_set, write_run_set_csv

    write_run_set_csv(run_dirs, out / "learning_curve.csv")
    return plot_run_set(run_dirs, out / "learning_curve.png", title=out.name)


def start_over(run_dir: Path) -> None:
    """Remove what a PPO run wrote into RUN_DIR (`--force`), so that training starts afresh
    there; other files in RUN_DIR are left alone."""
    from rlflow.tensorboard import EVENT_FILE_PREFIX

    for path in (
        run_dir / CHECKPOINT,
        run_dir / "progress.json",
        run_dir / "config.yaml",
        *run_dir.glob(f"{EVENT_FILE_PREFIX}*"),
    ):
        path.unlink(missing_ok=True)
