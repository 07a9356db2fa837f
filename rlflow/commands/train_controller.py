"""`rlflow train-controller --wm RUN_DIR --out RUN_DIR [--eval-real]`: a controller trained in
the world model's dream (no real env step), then optionally checked in the real env.

`--eval-real` runs every temperature's controller on the models, measures the cheapest graphs
against the originals end to end, and prints the dream-vs-real table (also `eval.json`).
`progress.json` adds up the real env steps and measurements behind the run (collect + eval).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rlflow.commands.common import check_output_dir, print_json, stderr
from rlflow.commands.wm_settings import add_common_options, settings_from

FLAGS = [
    "method",
    "generations",
    "population",
    "ppo_iterations",
    "temperature",
    "temperatures",
    "select",
    "uncertainty",
    "eval_patience",
    "imitation",
    "imitate",
    "seed",
]


def _temperatures(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 0.5,1,1.5, got {text!r}") from None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-controller", help="train a controller in the world model's dream (CMA-ES or PPO)"
    )
    parser.add_argument("--wm", required=True, metavar="RUN_DIR", help="from rlflow train-wm")
    parser.add_argument("--out", required=True, metavar="RUN_DIR", help="the run directory")
    parser.add_argument("--method", choices=("cmaes", "ppo"), help="cmaes (default) | ppo")
    parser.add_argument("--generations", type=int, help="CMA-ES generations (40)")
    parser.add_argument("--population", type=int, help="CMA-ES population (16)")
    parser.add_argument("--ppo-iterations", type=int, help="PPO iterations (60)")
    parser.add_argument("--temperature", type=float, help="tau of the run's policy (1.0)")
    parser.add_argument(
        "--temperatures", type=_temperatures, help="taus to train at, e.g. 0.5,1,1.5"
    )
    parser.add_argument(
        "--select",
        choices=("real-return", "speedup", "temperature"),
        help="the run's policy: the tau with the best --eval-real return (default), or end-to-end"
        " speedup (timed there, not with --no-measure) | --temperature",
    )
    parser.add_argument(
        "--uncertainty",
        type=float,
        help="dream reward charged per unit of the world-model ensemble's disagreement (1; "
        "negative: a bonus, for a controller that collects data where the world model is unsure)",
    )
    parser.add_argument(
        "--imitation",
        type=float,
        metavar="W",
        help="CMA-ES from a search's path: start at the controller cloned from it and add W x "
        "its log-likelihood to the dream return, fading to nothing (needs --imitate)",
    )
    parser.add_argument(
        "--imitate",
        metavar="DATA_DIR",
        help="the path: a collection made with --policy demo:RESULT.json (its first walk)",
    )
    parser.add_argument("--seed", type=int, help="seed (0)")
    parser.add_argument(
        "--eval-real", action="store_true", help="then run the controllers in the real env"
    )
    parser.add_argument(
        "--models",
        "--model",
        dest="models",
        nargs="+",
        metavar="MODEL",
        help="--eval-real models (default: the data's)",
    )
    parser.add_argument(
        "--random-episodes", type=int, default=8, help="--eval-real random-agent episodes (8)"
    )
    parser.add_argument(
        "--eval-patience",
        type=int,
        metavar="STEPS",
        help="--eval-real: end a controller's episode after STEPS steps without a cheaper graph"
        " (0: never)",
    )
    parser.add_argument(
        "--no-measure", action="store_true", help="--eval-real without end-to-end timing"
    )
    add_common_options(parser, run)


def run(args: argparse.Namespace) -> int:
    from rlflow.config import write_run_config
    from rlflow.errors import RlflowError
    from rlflow.fileio import write_json_atomic

    started = time.perf_counter()
    check_output_dir("--out", args.out)  # before torch loads

    from rlflow.worldmodel.controller import EVAL_REPORT, ControllerSettings
    from rlflow.worldmodel.model import WorldModel
    from rlflow.worldmodel.train_controller import train_controller

    settings = settings_from(args, ControllerSettings, "train_controller", FLAGS)
    settings.validate()
    if args.eval_real:
        from rlflow.worldmodel.evaluate import check_measured

        check_measured(settings, not args.no_measure, "drop --no-measure")
    if args.random_episodes < 0:
        raise RlflowError(f"--random-episodes must be at least 0, got {args.random_episodes}")
    world = WorldModel.load(args.wm)  # a bad --wm fails before RUN_DIR is made
    settings.check_world(world, args.uncertainty)
    if settings.imitate is not None:  # a collection with no path refused before RUN_DIR is made
        from rlflow.worldmodel.imitation import demo_spec

        demo_spec(settings.imitate, world)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"wm": str(Path(args.wm).resolve()), **settings.identity()}
    write_run_config(
        out,
        "controller",
        config,
        may_change=("generations", "ppo_iterations", "eval_dream_episodes"),
    )
    stderr(f"tensorboard --logdir {out}")
    trained = train_controller(args.wm, out, settings, progress=not args.quiet)
    world = WorldModel.from_bundle(out / "world_model.pt")
    collected = world.meta.get("collect_totals", {})
    summary: dict[str, Any] = {
        "out": str(out),
        "method": settings.method,
        "temperature": settings.temperature,
        "controllers": trained,
        "dream_real_env_steps": 0,
        "collect_real_env_steps": int(collected.get("real_env_steps", 0)),
        "collect_real_measurements": int(collected.get("real_measurements", 0)),
    }
    report = None
    if args.eval_real:
        from rlflow.worldmodel.evaluate import evaluate_real, temperature_table

        models = args.models or list(world.meta["models"])
        report = evaluate_real(
            out,
            world,
            settings,
            models,
            random_episodes=args.random_episodes,
            seed=settings.seed,
            measure=not args.no_measure,
            progress=not args.quiet,
        )
        write_json_atomic(out / EVAL_REPORT, report)
        summary["eval"] = report
        summary["temperature"] = report["selected_temperature"]
    summary["real_env_steps"] = summary["collect_real_env_steps"] + (
        report["real_env_steps"] if report else 0
    )
    summary["real_measurements"] = summary["collect_real_measurements"] + (
        report["real_measurements"] if report else 0
    )
    summary["wall_s"] = time.perf_counter() - started
    write_json_atomic(out / "progress.json", _progress(summary, report, summary["temperature"]))
    if args.json:
        print_json(summary)
    else:
        for row in trained.values():
            imitated = ""
            if "path_agreement" in row:
                imitated = f"; its argmax takes {row['path_agreement']:.0%} of the path's steps"
            print(
                f"tau {row['temperature']:g}: dream return {row['dream_return']:.3f} "
                f"({row['parameters']} controller parameters, {settings.method}{imitated})"
            )
        if report is not None:
            print(temperature_table(report))
            print(
                f"the run's policy: tau {summary['temperature']:g} ({settings.select}); "
                f"wrote {out / EVAL_REPORT}"
            )
        print(
            f"real env steps {summary['real_env_steps']} (collect "
            f"{summary['collect_real_env_steps']}, dream training 0), real measurements "
            f"{summary['real_measurements']}; wall {summary['wall_s']:.1f} s"
        )
    return 0


def _progress(
    summary: dict[str, Any], report: dict[str, Any] | None, temperature: float
) -> dict[str, Any]:
    """What the sample-efficiency comparison with PPO reads: real steps and measurements spent,
    and the speedup reached at that cost (the run's main temperature)."""
    from rlflow.worldmodel.controller import progress_record

    cost = {
        key: summary[key]
        for key in (
            "real_env_steps",
            "real_measurements",
            "collect_real_env_steps",
            "collect_real_measurements",
        )
    }
    if report is None:
        return progress_record(cost, None, [], wall_s=summary["wall_s"])
    cost.update(
        eval_real_env_steps=report["real_env_steps"],
        eval_real_measurements=report["real_measurements"],
    )
    episodes = [
        {
            "global_step": summary["collect_real_env_steps"],
            "model": entry["model"],
            "return": entry["real_return"],
            "speedup": entry["speedup"],
            "length": entry["steps"],
            "real_measurements": summary["collect_real_measurements"],
        }
        for entry in report["per_model"]
        if entry["temperature"] == temperature
    ]
    row = report["temperatures"][f"{temperature:g}"]
    return progress_record(cost, row, episodes, wall_s=summary["wall_s"])
