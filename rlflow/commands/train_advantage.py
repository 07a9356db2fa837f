"""`rlflow train-advantage --data DATA_DIR --out RUN_DIR`: the model of `--method guided`.

DATA_DIR comes from `rlflow collect --candidate-samples S`. Settings: `AdvantageSettings`'
defaults (mirrored by configs/advantage.yaml), then `--config FILE`'s `train_advantage` section,
then the flags. Writes TensorBoard events, `config.yaml` (kind: advantage) and a checkpoint
after every epoch, which a rerun continues from; prints the held-out error.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

from rlflow.commands.common import (
    add_threads_argument,
    check_output_dir,
    print_json,
    set_torch_threads,
    stderr,
)

FLAGS = [
    "hops",
    "hidden",
    "layers",
    "heads",
    "epochs",
    "batch",
    "lr",
    "holdout",
    "holdout_models",
    "clip",
    "seed",
]
CONFIG_SECTION = "train_advantage"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-advantage",
        help="train the local advantage model of --method guided on collected cost changes",
    )
    parser.add_argument(
        "--data",
        required=True,
        metavar="DATA_DIR",
        help="from rlflow collect --candidate-samples S",
    )
    parser.add_argument("--out", required=True, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--hops", type=int, metavar="K", help="k-hop subgraph per site (2)")
    parser.add_argument("--epochs", type=int, help="passes over the examples (30)")
    parser.add_argument("--hidden", type=int, help="encoder embedding size (64)")
    parser.add_argument("--layers", type=int, help="encoder GATv2 layers (3)")
    parser.add_argument("--heads", type=int, help="encoder attention heads (4)")
    parser.add_argument("--batch", type=int, help="examples per minibatch (64)")
    parser.add_argument("--lr", type=float, help="Adam learning rate (0.001)")
    parser.add_argument("--holdout", type=float, help="fraction of episodes held out (0.1)")
    parser.add_argument(
        "--holdout-models",
        nargs="+",
        metavar="MODEL",
        help="hold out these models' episodes instead: the error on graphs never trained on",
    )
    parser.add_argument("--clip", type=float, help="targets clipped to +-clip percent (100)")
    parser.add_argument("--seed", type=int, help="seed (0)")
    parser.add_argument("--config", metavar="FILE", help="YAML config (configs/advantage.yaml)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="start RUN_DIR's run over (its checkpoint, config and curves go); without it, a "
        "rerun continues the run and may change only --epochs",
    )
    add_threads_argument(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rlflow import config
    from rlflow.worldmodel.data import read_manifest

    started = time.perf_counter()
    # A bad --out, DATA_DIR or setting fails before torch loads and before RUN_DIR is made.
    check_output_dir("--out", args.out)
    read_manifest(Path(args.data))
    path = args.config if args.config is not None else config.CONFIGS / "advantage.yaml"
    values = {**config.section(path, CONFIG_SECTION), **config.overrides(args, FLAGS)}

    from rlflow.advantage.train import (
        AdvantageSettings,
        examples,
        held_out_episodes,
        prepare_run,
        train_advantage,
    )
    from rlflow.worldmodel.data import RolloutData

    settings = config.build(AdvantageSettings, values, f"{CONFIG_SECTION} settings")
    settings.validate()
    set_torch_threads(args.threads)
    data = RolloutData.load(args.data)
    found = examples(data, settings, args.data)  # every shard read: still nothing written
    held_out_episodes(data, settings)  # a model the data lacks fails here, before RUN_DIR
    out = Path(args.out)
    run_config = {
        "data": str(Path(args.data).resolve()),
        "data_digest": data.digest,
        **asdict(settings),
    }
    prepare_run(out, run_config, force=args.force)
    stderr(f"tensorboard --logdir {out}")
    summary = train_advantage(data, found, out, settings, progress=not args.quiet)
    summary["wall_s"] = time.perf_counter() - started
    if args.json:
        print_json(summary)
        return 0
    held = summary["held_out"]
    print(
        f"advantage model in {out}: {summary['epochs']} epochs on {summary['train_examples']} "
        f"of {summary['examples']} candidates ({summary['cost']} cost changes, k={settings.hops})"
    )
    if held.get("mae") is None:
        print("held out: nothing (fewer than two episodes)")
    else:
        spearman = "n/a" if held["spearman"] is None else f"{held['spearman']:.3f}"
        models = summary["held_out_models"]
        which = f"{', '.join(models)}: " if models else ""
        print(
            f"held out ({which}{held['examples']} candidates): mean abs error {held['mae']:.3f} "
            f"percentage points (predicting the mean: {held['baseline_mae']:.3f}), rank "
            f"correlation {spearman}"
        )
    print(f"use it: --method guided:{out}; wall {summary['wall_s']:.1f} s")
    return 0
