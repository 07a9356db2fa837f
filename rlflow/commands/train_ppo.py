"""`rlflow train-ppo --model M1 M2 ... --out RUN_DIR`: train the PPO agent across graphs.

Hyperparameters come from `PPOConfig`'s defaults (mirrored by configs/ppo.yaml), then
`--config FILE` (or, when continuing a run without one, RUN_DIR/config.yaml), then the flags.
A rerun into the same RUN_DIR continues from its checkpoint and step count.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rlflow.commands.common import check_output_dir, print_json
from rlflow.errors import RlflowError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-ppo", help="train the PPO agent (X-RLflow baseline) on one or more models"
    )
    parser.add_argument(
        "--model",
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
        "--cost", choices=("analytic", "perop", "e2e", "e2e-sparse"), help="reward cost source"
    )
    parser.add_argument(
        "--ort-level", choices=("all", "disable"), help="onnxruntime level of measurements"
    )
    parser.add_argument("--total-steps", type=int, metavar="N", help="env steps of the run")
    parser.add_argument("--scorer", choices=("local", "full"), help="candidate scoring")
    parser.add_argument("--seed", type=int, help="seed of torch, numpy and the env")
    parser.add_argument("--max-candidates", type=int, metavar="A", help="candidate slots")
    parser.add_argument("--max-nodes", type=int, metavar="N", help="padded operator count")
    parser.add_argument("--max-edges", type=int, metavar="M", help="padded edge count")
    parser.add_argument("--horizon", type=int, metavar="T", help="steps per episode")
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
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


FLAG_FIELDS = {
    "model": "models",
    "size": "size",
    "cost": "cost",
    "ort_level": "ort_level",
    "total_steps": "total_steps",
    "scorer": "scorer",
    "seed": "seed",
    "max_candidates": "max_candidates",
    "max_nodes": "max_nodes",
    "max_edges": "max_edges",
    "horizon": "horizon",
    "portable": "portable",
}
"""argparse destination -> PPOConfig field, for the flags that override the config."""


def resolve_config(args: argparse.Namespace) -> Any:
    """The run's PPOConfig: defaults, then the config file, then the flags."""
    from rlflow.agents.ppo import PPOConfig
    from rlflow.config import read_yaml

    run_dir = Path(args.out)
    values: dict[str, Any] = {}
    if args.config:
        values = read_yaml(args.config)
    elif (run_dir / "config.yaml").is_file():
        values = read_yaml(run_dir / "config.yaml")
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
    run_dir = Path(args.out)
    check_output_dir("--out", run_dir)
    if args.resume and not (run_dir / CHECKPOINT).is_file():
        raise RlflowError(f"--resume: no PPO checkpoint at {run_dir / CHECKPOINT}")
    if not args.model and not args.config and not (run_dir / "config.yaml").is_file():
        raise RlflowError("give --model (one or more zoo names or .onnx paths)")

    from rlflow.agents.ppo import load_checkpoint, train

    config = resolve_config(args)
    if args.force:
        start_over(run_dir)
    elif (run_dir / CHECKPOINT).exists():
        load_checkpoint(run_dir)  # refuse a corrupt checkpoint before any work
    summary = train(config, run_dir, progress=not args.no_progress)
    if args.json:
        print_json(summary)
    else:
        print(
            f"trained {summary['global_step']} steps ({summary['episodes']} episodes, "
            f"{summary['updates']} updates) in {summary['wall_s']:.1f} s; last episodes: "
            f"return {summary['mean_return'] or 0.0:.2f}, speedup "
            f"{summary['mean_speedup'] or 1.0:.3f}; checkpoint {run_dir / CHECKPOINT}"
        )
    return 0


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
