"""`rlflow train-wm --data DATA_DIR --out RUN_DIR`: the world model (VAE, then MDN-RNN).

Writes TensorBoard events, `config.yaml` (kind: world_model), per-epoch checkpoints a rerun
resumes from, and `progress.json` (the real env steps and measurements behind the data).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rlflow.commands.common import check_output_dir, print_json, stderr
from rlflow.commands.wm_settings import add_common_options, settings_from

FLAGS = [
    "latent",
    "vae_epochs",
    "rnn_epochs",
    "rnn_hidden",
    "mixtures",
    "cost_head",
    "ensemble",
    "seed",
]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-wm", help="train the world model (graph VAE + MDN-RNN) on collected rollouts"
    )
    parser.add_argument("--data", required=True, metavar="DATA_DIR", help="from rlflow collect")
    parser.add_argument("--out", required=True, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--latent", type=int, help="size of z (32)")
    parser.add_argument("--vae-epochs", type=int, help="VAE epochs (30)")
    parser.add_argument("--rnn-epochs", type=int, help="MDN-RNN epochs (40)")
    parser.add_argument("--rnn-hidden", type=int, help="MDN-RNN LSTM size (256)")
    parser.add_argument("--mixtures", type=int, help="Gaussians per latent dimension (8)")
    parser.add_argument(
        "--cost-head",
        choices=("step", "level"),
        help="M predicts the cost's change from the current cost (step, default) or its level",
    )
    parser.add_argument(
        "--ensemble",
        type=int,
        help="Ms trained on the data, all but the first on bootstraps (5); their disagreement is "
        "what train-controller --uncertainty charges",
    )
    parser.add_argument("--seed", type=int, help="seed (0)")
    add_common_options(parser, run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rlflow.config import write_run_config
    from rlflow.worldmodel.data import read_manifest

    started = time.perf_counter()
    # A bad --out or DATA_DIR fails before torch loads and before RUN_DIR is made.
    check_output_dir("--out", args.out)
    read_manifest(Path(args.data))

    from rlflow.worldmodel.train import WorldModelSettings, train_world_model, training_data

    settings = settings_from(args, WorldModelSettings, "train_wm", FLAGS)
    settings.validate()
    data = training_data(args.data, args.out)  # every shard read: still nothing written
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"data": str(Path(args.data).resolve()), **asdict(settings)}
    write_run_config(
        out, "world_model", config, may_change=("vae_epochs", "rnn_epochs", "ensemble")
    )
    stderr(f"tensorboard --logdir {out}")
    summary = train_world_model(args.data, out, settings, progress=not args.quiet, data=data)
    summary["wall_s"] = time.perf_counter() - started
    if args.json:
        print_json(summary)
    else:
        vae, rnn = summary["vae"], summary["mdnrnn_val"]
        print(
            f"world model in {out}: {summary['episodes']} episodes "
            f"({summary['val_episodes']} held out), {summary['active_rules']} active rules"
        )
        print(
            f"held out: VAE recon {vae['recon']:.3f} kl {vae['kl']:.2f}; MDN-RNN nll "
            f"{rnn['mdn_nll']:.2f} cost mse {rnn['cost_mse']:.3f} done bce "
            f"{rnn['done_bce']:.3f} mask bce {rnn['mask_bce']:.3f}"
        )
        dreams = summary["dream_steps"]
        print(
            f"dreams under a uniform policy: {dreams['mean']:.1f} steps on the mean (the data's "
            f"longest episode: {dreams['longest_episode']}; a dream ends when M predicts no "
            "rule applicable)"
        )
        print(
            f"real env steps {summary['real_env_steps']}, real measurements "
            f"{summary['real_measurements']}; wall {summary['wall_s']:.1f} s"
        )
    return 0
