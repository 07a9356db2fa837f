#!/usr/bin/env python
"""Learners beside the searches, per model: deployable speedup over seeds and what training cost.

Reads `rlflow bench` report directories whose methods include trained agents (`agent:RUN_DIR`,
one run per seed: `.../NAME/seed-S`). Every result of a model was timed in one interleaved run
against the original under onnxruntime's defaults, so the speedups compare directly. Agents are
grouped by NAME (the seeds' parent directory) into mean, min and max; beside them, what their
training spent in the real environment: env steps and end-to-end measurements (a PPO run's
progress.json; a controller's from the data directory its world model was trained on, plus the
real episodes that chose its temperature when it was chosen by them, and all the candidates'
for a controller picked among runs by `scripts/pick_controller.py`; a fine-tuned run adds the
run it started from, `init_from`).

`--share-of GROUP` adds the world model's target as a column: each group's gain as a share of
GROUP's (log(speedup / S0) / log(GROUP's / S0), S0 the start the learners began from, given per
model by `--start-speedup MODEL=S0`, 1.0 if not) and its real env steps as a share of GROUP's.

    python scripts/learners_table.py runs/l18/bench-bert runs/l18/bench-squeezenet \\
        --png docs/img/learners_medium.png [--name ppo-bert=PPO] > learners.md
    python scripts/learners_table.py runs/l55/bench-pool --name ppo-pool-squeezenet=PPO \\
        --share-of PPO --start-speedup squeezenet-1.1:medium=0.760
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def training_cost(run_dir: Path) -> tuple[int, int]:
    """(real env steps, end-to-end measurements) that training the agent in `run_dir` took."""
    config = read_yaml(run_dir / "config.yaml")
    if config.get("kind") == "controller":  # the dream is free; the data it learnt from is not
        data = Path(read_yaml(Path(config["wm"]) / "config.yaml")["data"])
        totals = json.loads((data / "manifest.json").read_text())["totals"]
        steps, measurements = int(totals["real_env_steps"]), int(totals["real_measurements"])
        picked = run_dir / "picked.json"  # scripts/pick_controller.py: all candidates' episodes
        chosen_by = picked if picked.is_file() else run_dir / "eval.json"
        if config.get("select", "temperature") != "temperature" and chosen_by.is_file():
            report = json.loads(chosen_by.read_text())  # the real episodes that picked its tau
            steps += int(report["real_env_steps"])
            measurements += int(report["real_measurements"])
        return steps, measurements
    progress = json.loads((run_dir / "progress.json").read_text())
    steps, measurements = int(progress["global_step"]), int(progress["real_measurements"])
    if config.get("init_from"):
        before = training_cost(Path(config["init_from"]))
        steps, measurements = steps + before[0], measurements + before[1]
    return steps, measurements


def rows_of(results: dict) -> dict[str, dict[str, list]]:
    """model -> method group -> [(speedup, steps, measurements, label)] of one bench's results:
    the methods of its newest timing (a bench run again with fewer methods keeps the cells of
    the others, which that timing did not measure)."""
    rows: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for cell in results["cells"].values():
        if cell.get("deploy") != "offline":
            continue
        comparison = results["comparisons"][f"{cell['model']}|offline"]
        if cell["method"] not in comparison.get("members", {cell["method"]: None}):
            continue
        # a graph the timing holds no entry for is the start itself (an agent that stopped)
        speedup = comparison["speedup"].get(cell["graph_hash"], 1.0)
        spec = cell["method_spec"]
        if spec.startswith("agent:"):
            run_dir = Path(spec[len("agent:") :])
            group = run_dir.parent.name if run_dir.name.startswith("seed-") else run_dir.name
            steps, measurements = training_cost(run_dir)
            rows[cell["model"]][group].append((speedup, steps, measurements, run_dir.name))
        else:
            rows[cell["model"]][spec].append((speedup, 0, 0, spec))
    return rows


def peers_of(results: dict) -> dict[str, tuple[float, str]]:
    return {model: (peer["speedup"], peer["knob"]) for model, peer in results["peers"].items()}


def ordered(groups: dict[str, list]) -> list[tuple[str, list]]:
    """The searches first (in bench order), then the trained agents by name."""
    searches = [(name, entries) for name, entries in groups.items() if not entries[0][1]]
    agents = sorted((name, entries) for name, entries in groups.items() if entries[0][1])
    return searches + agents


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def share(mean: float, steps: int, reference: list | None, start: float) -> str:
    """`mean`'s gain from `start` as a share of `reference`'s (a group's entries), and `steps`
    as a share of its steps: "92% (18%)"; empty where there is no gain to share."""
    if not reference:
        return ""
    gain = math.log(geomean([entry[0] for entry in reference]) / start)
    if gain <= 0:
        return ""
    text = f"{100 * math.log(mean / start) / gain:.0f}%"
    reference_steps = sum(entry[1] for entry in reference) / len(reference)
    return f"{text} ({100 * steps / reference_steps:.0f}%)" if steps and reference_steps else text


def markdown(
    rows: dict, peers: dict, share_of: str | None = None, starts: dict | None = None
) -> str:
    header = (
        "| model | method | seeds | speedup (mean) | min - max | / peer | real env steps "
        "(training) | end-to-end measurements (training) |"
    )
    rule = "|---|---|---:|---:|---|---:|---:|---:|"
    if share_of:
        header += f" share of {share_of}'s gain (its steps) |"
        rule += "---:|"
    lines = [header, rule]
    for model in sorted(rows):
        peer, knob = peers.get(model, (None, ""))
        reference = rows[model].get(share_of) if share_of else None
        start = (starts or {}).get(model, 1.0)
        for group, entries in ordered(rows[model]):
            speedups = [entry[0] for entry in entries]
            mean = geomean(speedups)
            spread = f"{min(speedups):.3f} - {max(speedups):.3f}" if len(entries) > 1 else ""
            ratio = f"{mean / peer:.3f}" if peer else ""
            steps = sum(entry[1] for entry in entries) // len(entries)
            measured = sum(entry[2] for entry in entries) // len(entries)
            line = (
                f"| {model} | {group} | {len(entries)} | **{mean:.3f}x** | {spread} | {ratio} "
                f"| {steps or ''} | {measured if steps else ''} |"
            )
            if share_of:
                line += f" {share(mean, steps, reference, start)} |"
            lines.append(line)
        if peer:
            line = f"| {model} | tuning peer ({knob}) | | {peer:.3f}x | | 1.000 | | |"
            lines.append(line + (" |" if share_of else ""))
    return "\n".join(lines)


def plot(rows: dict, peers: dict, path: Path) -> None:
    models = sorted(rows)
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        groups = [group for group, _ in ordered(rows[model])]
        for x, group in enumerate(groups):
            speedups = [entry[0] for entry in rows[model][group]]
            ax.bar(x, geomean(speedups), color="#9ecae1" if len(speedups) > 1 else "#c7c7c7")
            ax.scatter([x] * len(speedups), speedups, color="black", s=12, zorder=3)
        if model in peers:
            ax.axhline(peers[model][0], color="#d62728", ls="--", lw=1, label="tuning peer")
            ax.legend(fontsize=7, loc="lower right")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_xticks(range(len(groups)), groups, rotation=35, ha="right", fontsize=7)
        ax.set_title(model, fontsize=9)
        ax.set_ylabel("speedup vs ORT defaults (offline)")
        low = min(entry[0] for entries in rows[model].values() for entry in entries)
        ax.set_ylim(min(0.95, low - 0.02), None)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def group_label(text: str) -> tuple[str, str]:
    """`--name GROUP=LABEL` as (GROUP, LABEL); argparse reports anything else in one line."""
    group, sep, label = text.partition("=")
    if not sep or not group:
        raise argparse.ArgumentTypeError(f"expected GROUP=LABEL, got {text!r}")
    return group, label


def model_start(text: str) -> tuple[str, float]:
    """`--start-speedup MODEL=S0` as (MODEL, S0), S0 a positive number."""
    model, sep, value = text.partition("=")
    try:
        start = float(value)
    except ValueError:
        start = 0.0
    if not sep or not model or not start > 0:
        raise argparse.ArgumentTypeError(f"expected MODEL=SPEEDUP (positive), got {text!r}")
    return model, start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="rlflow bench report directories")
    parser.add_argument("--png", type=Path, help="also draw the speedups (seeds as dots)")
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        type=group_label,
        metavar="GROUP=LABEL",
        help="show a method group (a run directory's name, e.g. ppo-resnet-18) as LABEL",
    )
    parser.add_argument(
        "--share-of",
        metavar="GROUP",
        help="add each group's gain and real env steps as a share of GROUP's (its --name label)",
    )
    parser.add_argument(
        "--start-speedup",
        action="append",
        default=[],
        type=model_start,
        metavar="MODEL=S0",
        help="the speedup the learners started from on MODEL (e.g. squeezenet-1.1:medium=0.76; "
        "default 1.0): gains are counted from it",
    )
    args = parser.parse_args(argv)
    names = dict(args.name)
    rows: dict = {}
    peers: dict = {}
    try:
        for report in args.reports:
            results = json.loads((report / "results.json").read_text())
            for model, groups in rows_of(results).items():
                rows[model] = defaultdict(list)  # groups named alike are drawn as one
                for group, entries in groups.items():
                    rows[model][names.get(group, group)].extend(entries)
            peers.update(peers_of(results))
    except (OSError, KeyError, json.JSONDecodeError, yaml.YAMLError) as error:
        print(f"error: cannot read the reports: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    missing = [model for model in rows if args.share_of and args.share_of not in rows[model]]
    if missing:
        print(f"error: no group {args.share_of!r} for {', '.join(missing)}", file=sys.stderr)
        return 2
    print(markdown(rows, peers, args.share_of, dict(args.start_speedup)))
    if args.png:
        plot(rows, peers, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
