"""`rlflow train-wm-loop --model M... --out LOOP_DIR --iterations K`: World Models' loop.

Collect with the random agent, train the world model and a controller in its dream, collect
with that controller, retrain on all the data, ... K times (`rlflow.worldmodel.loop`). Each
stage takes its settings from its section of configs/worldmodel.yaml (collect, train_wm,
train_controller; `--config FILE` for another file), then the flags. Prints, per iteration, the
world model's held-out accuracy and the controllers' dream and real returns, and the rank
correlation between them; writes LOOP_DIR/loop.json and LOOP_DIR/iterations.png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rlflow.commands import collect
from rlflow.commands.backend import add_backend_arguments, check_backend
from rlflow.commands.common import (
    add_env_arguments,
    check_cost_table,
    check_output_dir,
    cost_type,
    env_provider,
    print_json,
    stderr,
)
from rlflow.commands.wm_settings import add_common_options

COLLECT_FLAGS = [flag for flag in collect.FLAGS if flag not in ("policy", "candidate_samples")]
"""collect's flags but the policy (the loop's own: random, then its controllers) and the
candidate samples (guided search's data, not the world model's)."""
WM_FLAGS = ["latent", "vae_epochs", "rnn_epochs", "cost_head", "ensemble", "seed"]
CONTROLLER_FLAGS = [
    "method",
    "generations",
    "population",
    "ppo_iterations",
    "uncertainty",
    "imitation",
    "seed",
]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-wm-loop",
        help="World Models' loop: collect, train the world model and controller, collect "
        "with the controller, repeat",
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
    parser.add_argument("--out", required=True, metavar="LOOP_DIR", help="the loop directory")
    parser.add_argument("--iterations", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--episodes", type=int, help="episodes collected per round (64)")
    parser.add_argument(
        "--controller-episodes",
        type=int,
        help="episodes collected with each controller, in the rounds after the first "
        "(default: --episodes)",
    )
    parser.add_argument("--size", choices=("small", "medium", "full"), help="zoo model size")
    parser.add_argument(
        "--cost",
        type=cost_type(("analytic", "perop", "e2e", "e2e-sparse", "perop-e2e")),
        metavar="COST",
        help="env reward cost: analytic, perop, e2e, e2e-sparse, perop-e2e or table:NAME|PATH "
        "(a cost table's per-op times, e.g. a GPU's; default perop offline, analytic online)",
    )
    add_env_arguments(parser)
    collect.add_candidates_argument(parser)
    parser.add_argument("--episodes-per-shard", type=int, help="episodes per shard (16)")
    parser.add_argument("--stop-probability", type=float, help="random agent's stop chance")
    collect.add_rule_repeat_argument(parser)
    parser.add_argument(
        "--random-policy",
        choices=("random", "random-rule", "random-rule-cheapest"),
        default="random",
        help="the first round's agent: uniform over candidates (random, RLFlow's) or over "
        "rules, then sites (random-rule: rules with few sites drawn as often as the others; "
        "random-rule-cheapest: then the site a controller would take, the cheapest by the env's "
        "own cost, per-op offline)",
    )
    parser.add_argument("--latent", type=int, help="size of z (32)")
    parser.add_argument("--vae-epochs", type=int, help="VAE epochs per round (30)")
    parser.add_argument("--rnn-epochs", type=int, help="MDN-RNN epochs per round (40)")
    parser.add_argument(
        "--cost-head",
        choices=("step", "level"),
        help="M predicts the cost's change from the current cost (step, default) or its level",
    )
    parser.add_argument("--ensemble", type=int, help="Ms per world model (5)")
    parser.add_argument("--method", choices=("cmaes", "ppo"), help="controller trainer")
    parser.add_argument("--generations", type=int, help="CMA-ES generations per round (40)")
    parser.add_argument("--population", type=int, help="CMA-ES population (16)")
    parser.add_argument("--ppo-iterations", type=int, help="dream PPO iterations per round")
    parser.add_argument(
        "--uncertainty",
        type=float,
        help="dream reward charged per unit of the ensemble's disagreement (1)",
    )
    parser.add_argument(
        "--explore-uncertainty",
        type=float,
        metavar="U",
        help="rounds after the first collect with an explorer, a controller trained with this "
        "charge (negative: a bonus where the ensemble disagrees), not the round's controller",
    )
    parser.add_argument(
        "--demo",
        metavar="RESULT.json",
        help="the first round also walks this search's recorded path (rlflow optimize --json) "
        "and explores from it; part of every round's data",
    )
    parser.add_argument(
        "--demo-episodes", type=int, default=4, metavar="N", help="episodes on --demo's path (4)"
    )
    parser.add_argument(
        "--imitation",
        type=float,
        metavar="W",
        help="the controllers start from --demo's path, cloned, and keep W x its log-likelihood "
        "in their fitness, fading to nothing (CMA-ES; 0: off, default)",
    )
    parser.add_argument("--seed", type=int, help="seed of every stage (0)")
    parser.add_argument(
        "--eval-real",
        choices=("every", "last"),
        default="every",
        help="rounds whose controllers run in the real env (their steps count): every (the "
        "real-return curve, default) or last (the earlier ones collect at their main tau)",
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="time each controller's cheapest graph against the original end to end",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="collection processes (in process only)"
    )
    add_backend_arguments(parser)
    add_common_options(parser, run)


def run(args: argparse.Namespace) -> int:
    from rlflow.errors import RlflowError

    started = time.perf_counter()
    check_output_dir("--out", args.out)  # before torch loads
    check_cost_table(args.cost, args.start, args.provider)
    check_backend(args)
    if args.iterations < 1:
        raise RlflowError(f"--iterations must be at least 1, got {args.iterations}")
    if args.workers < 1:
        raise RlflowError(f"--workers must be at least 1, got {args.workers}")
    if args.controller_episodes is not None and args.controller_episodes < 1:
        raise RlflowError(
            f"--controller-episodes must be at least 1, got {args.controller_episodes}"
        )

    provider = env_provider(args.provider)

    from rlflow import config
    from rlflow.commands.common import set_torch_threads
    from rlflow.worldmodel.collect import CollectSettings
    from rlflow.worldmodel.controller import ControllerSettings
    from rlflow.worldmodel.loop import LoopSettings, run_loop
    from rlflow.worldmodel.train import WorldModelSettings

    set_torch_threads(args.threads)

    def settings(cls: type, section: str, flags: list[str], **given: Any) -> Any:
        values = {**config.section(args.config, section), **config.overrides(args, flags)}
        return config.build(cls, {**values, **given}, f"{section} settings")

    collect_settings = collect.with_env(
        settings(CollectSettings, "collect", COLLECT_FLAGS, models=args.model),
        provider,
        args.max_candidates,
    )
    wm_settings = settings(WorldModelSettings, "train_wm", WM_FLAGS)
    controller_settings = settings(ControllerSettings, "train_controller", CONTROLLER_FLAGS)
    for flag, value in (
        ("--uncertainty", args.uncertainty),
        ("--explore-uncertainty", args.explore_uncertainty),
    ):
        if value and wm_settings.ensemble < 2:
            raise RlflowError(f"{flag} needs an ensemble of world models: add --ensemble 5")
    loop = LoopSettings(
        iterations=args.iterations,
        backend=args.backend,
        ray_address=args.ray_address,
        workers=args.workers,
        measure=args.measure,
        random_policy=args.random_policy,
        controller_episodes=args.controller_episodes,
        explore_uncertainty=args.explore_uncertainty,
        demo=args.demo,
        demo_episodes=args.demo_episodes,
        eval_real=args.eval_real,
    )
    out = Path(args.out)
    stderr(f"tensorboard --logdir {out}")
    summary = run_loop(
        list(args.model),
        out,
        loop,
        collect_settings,
        wm_settings,
        controller_settings,
        progress=not args.quiet,
    )
    from rlflow.report.iterations import plot_loop_iterations

    plot = plot_loop_iterations(summary, out / "iterations.png")
    summary["plot"] = str(plot) if plot else None
    summary["wall_s"] = time.perf_counter() - started
    if args.json:
        print_json(summary)
    else:
        print(loop_table(summary))
        if plot:
            print(f"wrote {out / 'loop.json'} and {plot}")
    return 0


def loop_table(summary: dict[str, Any]) -> str:
    """Per iteration: data, the world model's held-out accuracy, the best controller's returns."""
    lines = [
        f"{'iter':>4} {'episodes':>8} {'nll':>8} {'cost err':>8} {'done acc':>8} "
        f"{'mask acc':>8} {'next nll':>8} {'dream':>7} {'real':>7}"
    ]

    def number(value: Any, width: int, digits: int = 3) -> str:
        if isinstance(value, int | float):
            return f"{value:>{width}.{digits}f}"
        return f"{'-':>{width}}"

    for entry in summary["iterations"]:
        held = entry.get("heldout") or {}
        following = entry.get("heldout_next") or {}
        best = max(entry["controllers"], key=lambda row: row["dream_return"])
        lines.append(
            f"{entry['iteration']:>4} {entry['data_episodes']:>8} "
            f"{number(held.get('latent_nll'), 8, 2)} {number(held.get('cost_ratio_mae'), 8)} "
            f"{number(held.get('done_accuracy'), 8)} {number(held.get('mask_accuracy'), 8)} "
            f"{number(following.get('latent_nll'), 8, 2)} "
            f"{number(best['dream_return'], 7, 2)} {number(best['real_return'], 7, 2)}"
        )
    rho = summary["dream_real_rank_correlation"]
    lines.append(
        f"dream vs real returns of {summary['controllers_ranked']} controllers: Spearman rho "
        + (f"{rho:.3f}" if rho is not None else "- (too few, or all equal)")
    )
    lines.append(
        "held out: latent NLL, cost-ratio mean abs. error, done and mask accuracy of the "
        "round's world model on its held-out episodes; next nll: on the next round's data; "
        "dream/real: the controller the dream rates best"
    )
    lines.append(
        f"real env steps {summary['real_env_steps']}, real measurements "
        f"{summary['real_measurements']}; wall {summary['wall_s']:.1f} s"
    )
    return "\n".join(lines)
