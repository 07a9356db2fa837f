#!/usr/bin/env python
"""What world models say a bench path is worth, rule by rule, beside what it paid for real.

Takes one method's path from a bench (`results.json` records each result's rewrites), prices
every graph on it with the env's cost (`trajectory_costs.cost_curve`: per-op offline, as the
env's reward) and feeds its rules to each world model's dream
(`rlflow.worldmodel.path_price.price_path`). Prints per rule the real reward and, per world
model, the dream's reward, its charge for the ensemble's disagreement and how often M's mask
had the rule off; draws the cumulative returns against step. Where a controller misses a graph
another run found, this says which steps its world model gets wrong. With `--feed real`, M is
fed the real path instead (V's latent of each real graph on it and its real cost ratio, the
path replayed in the world model's own env), so a step priced right there but wrong in the
dream is an error M compounds over its own predictions, and one priced wrong there too is one
it never learnt.

    python scripts/dream_path.py runs/l49/bench-squeezenet-repeat/results.json \\
        --model squeezenet-1.1:medium --method e16-repeat-more-ctrl/seed-0-c10 \\
        --wm seed-0=runs/l49/e16-repeat-loop/seed-0/iter-0/wm ... \\
        [--png docs/img/dream_path.png] [--json] [--cost perop|analytic] [--uncertainty 1] \\
        [--feed dream|real]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from trajectory_costs import cost_curve  # noqa: E402  (scripts/, beside this one)

from rlflow.cost import OrtSettings  # noqa: E402
from rlflow.cost.deploy import Deployment  # noqa: E402
from rlflow.errors import RlflowError  # noqa: E402
from rlflow.rewrite.session import EpisodeState  # noqa: E402
from rlflow.search.cost import make_cost  # noqa: E402
from rlflow.worldmodel.evaluate import real_env  # noqa: E402
from rlflow.worldmodel.model import WorldModel  # noqa: E402
from rlflow.worldmodel.path_price import (  # noqa: E402
    PathPrice,
    price_path,
    price_path_forced,
    real_path_observations,
)


def find_cell(results: dict, model: str, method: str) -> dict:
    """The one offline cell of `model` whose method contains `method`, with its path."""
    cells = [
        cell
        for cell in results.get("cells", {}).values()
        if cell.get("model") == model
        and cell.get("deploy") == "offline"
        and cell.get("episode")
        and method in cell.get("method", "")
    ]
    if len(cells) != 1:
        names = sorted(cell["method"] for cell in cells)
        raise RlflowError(
            f"--method {method!r} matches {len(cells)} offline results of {model} with a path"
            + (f" ({', '.join(names)})" if names else "")
            + "; give a part of one method's name"
        )
    return cells[0]


def labelled(spec: str) -> tuple[str, str]:
    """`LABEL=DIR` or `DIR` (labelled by itself)."""
    label, equals, directory = spec.partition("=")
    return (label, directory) if equals else (spec, spec)


def real_rewards(costs: list[float]) -> np.ndarray:
    """The env's reward per step, r_t = 100 (C_{t-1} - C_t) / C_0."""
    costs_array = np.asarray(costs, dtype=float)
    return 100.0 * (costs_array[:-1] - costs_array[1:]) / costs_array[0]


def report(rules: list[str], real: np.ndarray, prices: dict[str, PathPrice]) -> dict:
    """The JSON summary: per rule and in total, real against each world model's dream."""
    per_rule: dict[str, dict] = {}
    for step, rule in enumerate(rules):
        row = per_rule.setdefault(rule, {"steps": 0, "real": 0.0, "dream": {}})
        row["steps"] += 1
        row["real"] += float(real[step])
    for label, price in prices.items():
        for rule, row in price.by_rule().items():
            per_rule[rule]["dream"][label] = {key: row[key] for key in ("reward", "charge")}
            per_rule[rule]["dream"][label]["masked_share"] = row["masked"] / row["steps"]
    return {
        "steps": len(rules),
        "real_return": float(real.sum()),
        "dream": {
            label: {
                "return": price.dream_return,
                "return_without_charge": float(price.reward.sum()),
                "ended_by_last_step": float(price.ended[-1]) if len(rules) else 0.0,
            }
            for label, price in prices.items()
        },
        "per_rule": per_rule,
    }


def print_table(summary: dict, labels: list[str]) -> None:
    head = " | ".join(f"{label[-24:]:>24s}" for label in labels)
    print(f"{'rule (steps)':44s} {'real':>7s} | {head}")
    print(f"{'':44s} {'':7s} | " + " | ".join(f"{'dream  charge masked':>24s}" for _ in labels))
    for rule, row in summary["per_rule"].items():
        cells = " | ".join(
            f"{d['reward']:7.1f} {d['charge']:7.1f} {100 * d['masked_share']:7.0f}%"
            for d in (row["dream"][label] for label in labels)
        )
        print(f"{rule[:36] + ' (' + str(row['steps']) + ')':44s} {row['real']:7.1f} | {cells}")
    totals = []
    for label in labels:
        dream = summary["dream"][label]
        charge = dream["return_without_charge"] - dream["return"]
        ended = 100 * dream["ended_by_last_step"]
        totals.append(f"{dream['return_without_charge']:7.1f} {charge:7.1f} {ended:6.0f}%e")
    total = f"total ({summary['steps']} steps)"
    print(f"{total:44s} {summary['real_return']:7.1f} | {' | '.join(totals)}")
    print("(masked: M's mask had the rule off; %e: dreams that would have ended by the last step)")


def draw(path: Path, title: str, real: np.ndarray, prices: dict[str, PathPrice]) -> None:
    figure, axis = plt.subplots(figsize=(10, 4.5))
    steps = np.arange(len(real) + 1)
    axis.plot(steps, np.concatenate([[0.0], np.cumsum(real)]), color="black", lw=2.2,
              label="real (the env's cost)")  # fmt: skip
    for index, (label, price) in enumerate(prices.items()):
        color = plt.get_cmap("tab10")(index)
        axis.plot(steps, np.concatenate([[0.0], np.cumsum(price.reward)]), color=color,
                  label=f"{label}: dream")  # fmt: skip
        axis.plot(steps, np.concatenate([[0.0], np.cumsum(price.reward - price.charge)]),
                  color=color, ls="--", label=f"{label}: dream, charge taken off")  # fmt: skip
    axis.set_xlabel("step of the path")
    axis.set_ylabel("return so far (100 x cost saved / start's)")
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def priced(args: argparse.Namespace, directory: str, state: EpisodeState, model: str) -> PathPrice:
    """One world model's price of the path: dreamt (`price_path`) or fed the real path
    (`price_path_forced`, replayed in the world model's env on `model`)."""
    world = WorldModel.load(directory)
    rules = [action.rule for action in state.actions]
    if args.feed == "dream":
        return price_path(
            world, rules, episodes=args.episodes, temperature=args.temperature,
            penalty=args.uncertainty,
        )  # fmt: skip
    env = real_env(world, model)
    try:
        observations = real_path_observations(env, state)
    finally:
        env.close()
    return price_path_forced(world, observations, rules, penalty=args.uncertainty)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a bench's results.json")
    parser.add_argument("--model", required=True, help="the cell's model label, e.g. bert:medium")
    parser.add_argument("--method", required=True, help="a part of one method's name")
    parser.add_argument(
        "--wm", nargs="+", required=True, help="train-wm run dirs, each as DIR or LABEL=DIR"
    )
    parser.add_argument("--episodes", type=int, default=64, help="dream episodes (64)")
    parser.add_argument("--temperature", type=float, default=1.0, help="dream tau (1)")
    parser.add_argument("--uncertainty", type=float, default=1.0, help="charge per unit (1)")
    parser.add_argument(
        "--cost",
        default="perop",
        choices=["perop", "analytic"],
        help="the real cost: perop (the env's reward) or analytic",
    )
    parser.add_argument(
        "--feed",
        default="dream",
        choices=["dream", "real"],
        help="what M is fed: its own dream (default) or the real path's graphs and costs",
    )
    parser.add_argument("--png", type=Path, help="draw the cumulative returns here")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        run = results["settings"]
        size = run["size"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        print(f"error: cannot read {args.results} as a bench's results: {error}", file=sys.stderr)
        return 2
    try:
        cell = find_cell(results, args.model, args.method)
        state = EpisodeState.from_json(cell["episode"])
        rules = [action.rule for action in state.actions]
        settings = Deployment("offline").settings(OrtSettings(threads=run.get("threads", 1)))
        costs = cost_curve(cell, settings, size, make_cost(args.cost, settings))
        model = args.model.rsplit(":", 1)[0]
        prices = {
            label: priced(args, directory, state, model)
            for label, directory in map(labelled, args.wm)
        }
    except RlflowError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    real = real_rewards(costs)
    summary = report(rules, real, prices)
    if args.png:
        fed = "in its dream" if args.feed == "dream" else "fed the real path"
        title = f"{args.model}, {cell['method']}: the path as each world model prices it, {fed}"
        draw(args.png, title, real, prices)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_table(summary, list(prices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
