"""`rlflow train-regal --models M1 M2 ... --out RUN_DIR`: train REGAL's BRKGA-biasing policy.

Hyperparameters come from `RegalConfig`'s defaults (mirrored by configs/regal.yaml), then
`--config FILE` (or, when continuing a run without one, RUN_DIR/config.yaml), then the flags.
A rerun into the same RUN_DIR continues from its checkpoint and run count; only
--total-runs may change, unless --force starts the run over.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rlflow.commands.common import check_output_dir, print_json
from rlflow.errors import RlflowError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-regal",
        help="train REGAL's policy (GNN biases for BRKGA) with REINFORCE on some models",
    )
    parser.add_argument(
        "--models",
        "--model",
        dest="models",
        nargs="+",
        metavar="MODEL",
        help="zoo names or .onnx paths, taken in turn (default: RUN_DIR's config)",
    )
    parser.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory")
    parser.add_argument(
        "--config", metavar="FILE", help="YAML hyperparameters (e.g. configs/regal.yaml)"
    )
    parser.add_argument("--size", choices=("small", "medium", "full"), help="zoo model size")
    parser.add_argument(
        "--start",
        metavar="STATE",
        help="where BRKGA starts on each model: original (default), ort:all, ...",
    )
    parser.add_argument(
        "--cost", choices=("analytic", "perop"), help="search cost of the decoded graphs"
    )
    parser.add_argument("--budget", type=int, metavar="N", help="BRKGA evaluations per run")
    parser.add_argument("--population", type=int, metavar="P", help="BRKGA population")
    parser.add_argument("--total-runs", type=int, metavar="N", help="biased BRKGA runs in all")
    parser.add_argument(
        "--runs-per-update", type=int, metavar="N", help="runs per policy-gradient step"
    )
    parser.add_argument("--seeds", type=int, metavar="N", help="BRKGA seeds per model")
    parser.add_argument("--seed", type=int, help="seed of torch and of the BRKGA seeds")
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
        help="start RUN_DIR's run over (its checkpoint, progress, config and curves go), also "
        "over another kind of run; without it, a rerun continues the run and may change only "
        "--total-runs",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


FLAG_FIELDS = {
    "models": "models",
    "size": "size",
    "start": "start",
    "cost": "cost",
    "budget": "budget",
    "population": "population",
    "total_runs": "total_runs",
    "runs_per_update": "runs_per_update",
    "seeds": "seeds",
    "seed": "seed",
    "portable": "portable",
}
"""argparse destination -> RegalConfig field, for the flags that override the config."""

CHECKPOINT = Path("checkpoints") / "latest.pt"
"""rlflow.agents.regal.CHECKPOINT, known here without importing it (the quick errors)."""


def resolve_config(args: argparse.Namespace) -> Any:
    """The run's RegalConfig: defaults, then the config file, then the flags."""
    from rlflow.agents.regal import RegalConfig
    from rlflow.config import read_yaml

    run_dir = Path(args.out)
    values: dict[str, Any] = {}
    if args.config:
        values = read_yaml(args.config)
    elif (run_dir / "config.yaml").is_file() and not args.force:
        values = read_yaml(run_dir / "config.yaml")
    values = {key: value for key, value in values.items() if key != "kind"}
    for dest, name in FLAG_FIELDS.items():
        value = getattr(args, dest, None)
        if value is not None:
            values[name] = value
    if not values.get("models"):
        raise RlflowError("give --models (one or more zoo names or .onnx paths)")
    return RegalConfig.from_dict(values)


def run(args: argparse.Namespace) -> int:
    from rlflow.config import read_yaml

    run_dir = Path(args.out)
    check_output_dir("--out", run_dir)
    if args.resume and not (run_dir / CHECKPOINT).is_file():
        raise RlflowError(f"--resume: no REGAL checkpoint at {run_dir / CHECKPOINT}")
    config_path = run_dir / "config.yaml"
    if config_path.is_file() and not args.force:
        kind = read_yaml(config_path).get("kind")
        if kind != "regal":
            raise RlflowError(
                f"{run_dir} holds a {kind!r} run, not a REGAL run; train into a new --out, or "
                "pass --force to replace it"
            )
    if not args.models and not args.config and not config_path.is_file():
        raise RlflowError("give --models (one or more zoo names or .onnx paths)")
    config = resolve_config(args)

    from rlflow.agents.regal_policy import load_checkpoint
    from rlflow.agents.regal_train import train

    if args.force:
        start_over(run_dir)
    elif (run_dir / CHECKPOINT).exists():
        load_checkpoint(run_dir)  # refuse a corrupt checkpoint before any work
    summary = train(config, run_dir, progress=not args.no_progress)
    if args.json:
        print_json(summary)
    else:
        reward = summary["mean_reward"]
        print(
            f"trained {summary['runs']} runs ({summary['updates']} updates) in "
            f"{summary['wall_s']:.1f} s; last runs: {reward or 0.0:+.2f}% of the start cost "
            f"better than plain BRKGA; checkpoint {run_dir / CHECKPOINT}"
        )
    return 0


def start_over(run_dir: Path) -> None:
    """Remove what a training run wrote into RUN_DIR (`--force`), so that training starts
    afresh there; other files in RUN_DIR are left alone."""
    from rlflow.tensorboard import EVENT_FILE_PREFIX

    for path in (
        run_dir / CHECKPOINT,
        run_dir / "progress.json",
        run_dir / "config.yaml",
        *run_dir.glob(f"{EVENT_FILE_PREFIX}*"),
    ):
        path.unlink(missing_ok=True)
