#!/usr/bin/env python
"""The world model's benchmark: dream controller vs PPO vs taso search on full models.

One script of ~620 lines on purpose: the benchmark is one fixed sequence of commands and one
report, and splitting its steps over modules would hide that sequence.

Runs a fixed sequence of `rlflow` CLI commands (each printed before it runs) and reads their
JSON:

1. for each data budget B (episodes of the random agent, RLFlow's): `rlflow collect` into
   OUT/data-B (the shards of the smaller budget are copied in first: budgets are nested, shard k
   of every budget is the same draw), `rlflow train-wm`, then `rlflow train-controller
   --eval-real`: the controller's one deterministic real episode per model, its final graph
   timed end to end against the original (interleaved, ORT level of the data, 1 thread);
2. PPO: `runs/ppo-targets/progress.json` (its per-episode training speedups against real env
   steps), waiting for the run to finish if asked, then `rlflow optimize --agent` for its
   measured speedup;
3. taso: `rlflow search --method taso` per model.

Rewards while learning are analytic (the env's roofline cost) for both learners, so the
sample-efficiency curve compares analytic speedups C_0 / C_T at equal real env steps; the
reported speedups are end-to-end measurements. "95% of PPO's final speedup" is read as 95% of
its gain, 1 + 0.95 (s_PPO - 1): 95% of a 1.01x speedup taken literally (0.96x) is reached by
doing nothing. Every step's JSON is kept under OUT/results, so a rerun skips finished steps.

    python scripts/bench_worldmodel.py --out runs/wm-bench --budgets 32 64 128 --wait-ppo
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlflow.config import read_yaml
from rlflow.cost import geometric_mean

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("bert", "vit-base", "inception-v3")
PLOT = ROOT / "docs" / "img" / "worldmodel_sample_efficiency.png"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.results = self.out / "results"
        self.results.mkdir(parents=True, exist_ok=True)
        self.commands: list[str] = []

    def rlflow(self, name: str, *argv: str) -> dict[str, Any]:
        """Run `rlflow ARGV --json` once; its JSON is kept as results/NAME.json."""
        cached = self.results / f"{name}.json"
        command = [sys.executable, "-m", "rlflow.cli", *argv, "--json"]
        shown = shlex.join(["rlflow", *argv, "--json"])
        self.commands.append(shown)
        if cached.is_file():
            print(f"[cached] {shown}", flush=True)
            return json.loads(cached.read_text())
        print(f"$ {shown}", flush=True)
        started = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            sys.stderr.write(result.stderr[-4000:])
            raise SystemExit(f"command failed ({result.returncode}): {shown}")
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        summary["bench_wall_s"] = time.perf_counter() - started
        summary["bench_load"] = load_average()
        cached.write_text(json.dumps(summary, indent=1))
        print(f"  done in {summary['bench_wall_s']:.0f} s (load {summary['bench_load']})")
        return summary

    # ---- the world model ------------------------------------------------------------------

    def world_model(self, budget: int, previous: int | None) -> dict[str, Any]:
        args = self.args
        data = self.out / f"data-{budget}"
        if previous is not None and not data.exists():
            shutil.copytree(self.out / f"data-{previous}", data)  # nested budgets: resume
        collect = self.rlflow(
            f"collect-{budget}",
            "collect",
            "--model",
            *args.models,
            "--size",
            args.size,
            "--episodes",
            str(budget),
            "--cost",
            "analytic",
            "--seed",
            str(args.seed),
            "--out",
            str(data),
            "--quiet",
        )
        wm = self.out / f"wm-{budget}"
        train_wm = self.rlflow(
            f"train-wm-{budget}",
            "train-wm",
            "--data",
            str(data),
            "--out",
            str(wm),
            "--vae-epochs",
            str(args.vae_epochs),
            "--rnn-epochs",
            str(args.rnn_epochs),
            "--seed",
            str(args.seed),
            "--quiet",
        )
        controller = self.rlflow(
            f"train-controller-{budget}",
            "train-controller",
            "--wm",
            str(wm),
            "--out",
            str(self.out / f"controller-{budget}"),
            "--temperatures",
            ",".join(f"{t:g}" for t in args.temperatures),
            "--temperature",
            f"{args.temperatures[0]:g}",
            "--generations",
            str(args.generations),
            "--random-episodes",
            "0",
            "--eval-real",
            "--seed",
            str(args.seed),
            "--quiet",
        )
        evaluation = controller["eval"]
        tau = args.temperatures[0]
        rows = [row for row in evaluation["per_model"] if row["temperature"] == tau]
        eval_steps = sum(row["steps"] for row in rows)
        return {
            "budget": budget,
            "collect_steps": int(collect["real_env_steps"]),
            "collect_measurements": int(collect["real_measurements"]),
            "eval_steps_all_taus": int(evaluation["real_env_steps"]),
            "eval_steps": eval_steps,
            "eval_measurements": int(evaluation["real_measurements"]),
            "real_env_steps": int(collect["real_env_steps"]) + int(evaluation["real_env_steps"]),
            "real_measurements": int(collect["real_measurements"])
            + int(evaluation["real_measurements"]),
            "mdnrnn_val": train_wm["mdnrnn_val"],
            "per_model": {row["model"]: row for row in rows},
            "tau_table": evaluation["temperatures"],
            "analytic_speedup": geometric_mean([row["env_speedup"] for row in rows]),
            "measured_speedup": geometric_mean([row["speedup"] for row in rows]),
            "wall_s": collect["bench_wall_s"]
            + train_wm["bench_wall_s"]
            + controller["bench_wall_s"],
        }

    # ---- PPO --------------------------------------------------------------------------------

    def ppo(self) -> dict[str, Any]:
        args = self.args
        run = Path(args.ppo)
        progress_path = run / "progress.json"
        config = read_yaml(run / "config.yaml")
        total = int(config.get("total_steps", 0))
        while True:
            progress = json.loads(progress_path.read_text())
            if progress["global_step"] >= total or not args.wait_ppo:
                break
            print(f"waiting for PPO: step {progress['global_step']}/{total}", flush=True)
            time.sleep(60)
        episodes = progress["episodes"]
        curve = ppo_curve(episodes, args.models, args.window)
        final = curve[-1]["speedup"] if curve else float("nan")
        measured = {}
        if not args.skip_ppo_measure:
            for model in args.models:
                measured[model] = self.rlflow(
                    f"ppo-optimize-{model}",
                    "optimize",
                    model,
                    "--size",
                    args.size,
                    "--agent",
                    str(run),
                    "--episodes",
                    "1",
                    "--ort-level",
                    "all",
                    "--threads",
                    "1",
                    "-o",
                    str(self.out / f"ppo-{model}.onnx"),
                )
        return {
            "global_step": int(progress["global_step"]),
            "total_steps": total,
            "finished": progress["global_step"] >= total,
            "real_measurements": int(progress.get("real_measurements", 0)),
            "curve": curve,
            "episodes_raw": episodes,
            "final_analytic_speedup": final,
            "measured": measured,
        }

    def taso(self) -> dict[str, Any]:
        args = self.args
        return {
            model: self.rlflow(
                f"taso-{model}",
                "search",
                model,
                "--size",
                args.size,
                "--method",
                "taso",
                "--budget",
                str(args.taso_budget),
                "--ort-level",
                "all",
                "--threads",
                "1",
                "-o",
                str(self.out / f"taso-{model}.onnx"),
            )
            for model in args.models
        }

    def remeasure(self, budget: int, repeats: int) -> dict[str, Any]:
        """Every method's final graph per model, timed together: `repeats` interleaved runs of
        [original, original again, world model, PPO, taso] (ORT level all, 1 thread); the
        median speedup over runs. The second original is the noise floor: its speedup should
        be 1. The learners' graphs are their own final graphs, not `optimize`'s choice (which
        keeps the original when a result does not time faster): one deterministic real episode
        each (seed 0; the world model's is its eval episode replayed); taso's is its -o file."""
        from rlflow.cost import OrtSettings, Runner
        from rlflow.graph import load_model
        from rlflow.worldmodel.collect import CollectSettings, load_policy, make_env
        from rlflow.worldmodel.evaluate import real_env, run_episode
        from rlflow.worldmodel.policy import load_controller_policy
        from rlflow.zoo import cached_path

        cached = self.results / f"remeasure-{budget}.json"
        if cached.is_file():
            return json.loads(cached.read_text())
        args = self.args
        runner = Runner(OrtSettings(threads=1, ort_level="all"))
        policy = load_controller_policy(self.out / f"controller-{budget}")
        ppo_policy = load_policy(f"agent:{args.ppo}")
        ppo_horizon = int(read_yaml(Path(args.ppo) / "config.yaml").get("horizon", 50))
        table: dict[str, Any] = {}
        for model in args.models:
            env = real_env(policy.world, model)
            try:
                episode = run_episode(env, policy, seed=args.seed, deterministic=True)
            finally:
                env.close()
            graphs = {
                "original": episode["original"],
                "original again": load_model(cached_path(model, args.size)),
                "world model": episode["graph"],
            }
            ppo_env = make_env(
                CollectSettings(
                    models=[model],
                    size=args.size,
                    cost="analytic",
                    max_episode_steps=ppo_horizon,
                ),
                ppo_policy.env_config,
            )
            try:
                ppo_episode = run_episode(ppo_env, ppo_policy, seed=args.seed, deterministic=True)
            finally:
                ppo_env.close()
            graphs["ppo"] = ppo_episode["graph"]
            taso_path = self.out / f"taso-{model}.onnx"
            if taso_path.is_file():
                graphs["taso"] = load_model(taso_path)
            print(f"remeasure {model}: {', '.join(graphs)} x {repeats} (load {load_average()})")
            runs = []
            for _ in range(repeats):
                comparison = runner.compare(list(graphs.values()), use_cache=False)
                runs.append(dict(zip(graphs, comparison.speedups)))
            table[model] = {
                "speedups": {
                    name: sorted(run[name] for run in runs)[len(runs) // 2] for name in graphs
                },
                "runs": runs,
                "original_ms": comparison.scaled_ms[0],  # the last run's median
                "world_model_steps": episode["steps"],
                "world_model_env_speedup": episode["env_speedup"],
                "ppo_steps": ppo_episode["steps"],
                "ppo_env_speedup": ppo_episode["env_speedup"],
                "load": load_average(),
            }
            del graphs
        cached.write_text(json.dumps(table, indent=1))
        return table


def load_range(results: Path) -> str:
    loads = []
    for path in results.glob("*.json"):
        entry = json.loads(path.read_text())
        for value in _loads(entry):
            loads.append(value)
    return f"{min(loads):.2f}-{max(loads):.2f}" if loads else "?"


def _loads(entry: Any) -> list[float]:
    """The first (1-minute) figure of every `load` / `bench_load` string in a result."""
    found = []
    if isinstance(entry, dict):
        for key, value in entry.items():
            if key in ("load", "bench_load") and isinstance(value, str) and value != "?":
                found.append(float(value.split()[0]))
            else:
                found.extend(_loads(value))
    return found


def step_wall(results: Path) -> float:
    return sum(
        json.loads(path.read_text()).get("bench_wall_s", 0.0) for path in results.glob("*.json")
    )


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def ppo_curve(episodes: list[dict[str, Any]], models: list[str], window: int) -> list[dict]:
    """PPO's training speedup against real env steps: after each episode, the geometric mean
    over models of each model's mean analytic speedup over its last `window` episodes (a model
    not seen yet counts as 1.0x)."""
    recent: dict[str, list[float]] = {model: [] for model in models}
    curve, measurements = [], 0
    for episode in episodes:
        recent.setdefault(episode["model"], []).append(float(episode["speedup"]))
        measurements += int(episode.get("real_measurements", 0))
        means = [
            sum(recent[m][-window:]) / len(recent[m][-window:]) if recent[m] else 1.0
            for m in models
        ]
        curve.append(
            {
                "global_step": int(episode["global_step"]),
                "real_measurements": measurements,
                "speedup": geometric_mean(means),
            }
        )
    return curve


def first_reaching(points: list[tuple[int, int, float]], target: float) -> tuple[Any, Any]:
    """(steps, measurements) of the first point (steps, measurements, speedup) at target."""
    for steps, measurements, speedup in points:
        if speedup >= target:
            return steps, measurements
    return None, None


def plot(wm_rows: list[dict], ppo: dict, target: float, remeasured: dict, path: Path) -> None:
    """Left: analytic speedup against real env steps (the sample-efficiency curve). Right, when
    the graphs were timed together: each method's measured end-to-end speedup per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if remeasured else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    ax = axes[0][0]
    curve = ppo["curve"]
    ax.plot(
        [p["global_step"] for p in curve],
        [p["speedup"] for p in curve],
        label="PPO (training episodes)",
        color="tab:blue",
    )
    ax.plot(
        [row["real_env_steps"] for row in wm_rows],
        [row["analytic_speedup"] for row in wm_rows],
        "o-",
        label="world model (random data + eval episode)",
        color="tab:orange",
    )
    for row in wm_rows:
        ax.annotate(
            f"{row['budget']} ep",
            (row["real_env_steps"], row["analytic_speedup"]),
            textcoords="offset points",
            xytext=(4, -12),
            fontsize=8,
        )
    ax.axhline(target, color="gray", linestyle=":", label="95% of PPO's final gain")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("real env steps")
    ax.set_ylabel("analytic speedup C_0 / C_T (geomean over models)")
    ax.set_title("sample efficiency (analytic cost, the training reward)", fontsize=10)
    ax.legend(fontsize=8)
    if remeasured:
        ax = axes[0][1]
        names = ["original again", "world model", "ppo", "taso"]
        models = list(remeasured)
        width = 0.8 / len(names)
        for index, name in enumerate(names):
            values = [remeasured[m]["speedups"].get(name, float("nan")) for m in models]
            ax.bar(
                [i + (index - (len(names) - 1) / 2) * width for i in range(len(models))],
                values,
                width,
                label=name,
            )
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_xticks(range(len(models)), models)
        low = min(min(e["speedups"].values()) for e in remeasured.values())
        high = max(max(e["speedups"].values()) for e in remeasured.values())
        ax.set_ylim(min(low, 1.0) - 0.02, max(high, 1.0) + 0.02)
        ax.set_ylabel("measured speedup (median of interleaved runs)")
        ax.set_title("end to end, ORT level all, 1 thread", fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("bert, vit-base, inception-v3 (full)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--size", default="full")
    parser.add_argument("--budgets", nargs="+", type=int, default=[32, 64, 128])
    parser.add_argument("--out", default=str(ROOT / "runs" / "wm-bench"))
    parser.add_argument("--ppo", default=str(ROOT / "runs" / "ppo-targets"))
    parser.add_argument("--wait-ppo", action="store_true", help="wait for PPO to finish")
    parser.add_argument("--skip-ppo-measure", action="store_true")
    parser.add_argument("--skip-taso", action="store_true")
    parser.add_argument("--taso-budget", type=int, default=200)
    parser.add_argument("--temperatures", nargs="+", type=float, default=[1.0])
    parser.add_argument("--generations", type=int, default=40)
    parser.add_argument("--vae-epochs", type=int, default=30)
    parser.add_argument("--rnn-epochs", type=int, default=40)
    parser.add_argument("--window", type=int, default=5, help="PPO curve: episodes per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=str(PLOT))
    parser.add_argument(
        "--remeasure",
        type=int,
        default=0,
        metavar="N",
        help="finally time every method's graph together, N interleaved runs per model",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load_before = load_average()
    bench = Bench(args)

    wm_rows, previous = [], None
    for budget in sorted(args.budgets):
        wm_rows.append(bench.world_model(budget, previous))
        previous = budget
    taso = {} if args.skip_taso else bench.taso()
    ppo = bench.ppo()

    final = ppo["final_analytic_speedup"]
    target = 1.0 + 0.95 * (final - 1.0)
    ppo_steps, ppo_meas = first_reaching(
        [(p["global_step"], p["real_measurements"], p["speedup"]) for p in ppo["curve"]], target
    )
    wm_steps, wm_meas = first_reaching(
        [(r["real_env_steps"], r["real_measurements"], r["analytic_speedup"]) for r in wm_rows],
        target,
    )
    remeasured = bench.remeasure(wm_rows[-1]["budget"], args.remeasure) if args.remeasure else {}
    plot(wm_rows, ppo, target, remeasured, Path(args.plot))

    best = wm_rows[-1]
    command = shlex.join(["python", "scripts/bench_worldmodel.py", *(argv or sys.argv[1:])])
    plot_path = Path(args.plot).resolve()
    shown_plot = plot_path.relative_to(ROOT) if plot_path.is_relative_to(ROOT) else plot_path
    lines = [
        f"Command: `{command}`",
        "",
        f"2 cores, shared. 1-minute load at the end of each step: {load_range(bench.results)}; "
        f"wall of all steps {step_wall(bench.results):.0f} s (this invocation "
        f"{time.perf_counter() - started:.0f} s, load before {load_before}).",
        "",
        "### Real measured speedup (end to end, original vs result interleaved, ORT level all, "
        "1 thread)",
        "",
        "World model: its eval episode's graph vs the original (one interleaved run). PPO and "
        "taso: `rlflow optimize --agent` / `rlflow search`, which time their best graphs and "
        "keep the original (0 steps) unless one is faster, confirmed by a second run.",
        "",
        f"| model | world model ({best['budget']} ep, tau {args.temperatures[0]:g}) | "
        "PPO (ppo-targets) | taso "
        f"(budget {args.taso_budget}) | WM analytic | PPO analytic (last {args.window} ep) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for model in args.models:
        row = best["per_model"].get(model, {})
        ppo_m = ppo["measured"].get(model, {})
        taso_m = taso.get(model, {})
        lines.append(
            f"| {model} | {fmt(row.get('speedup'))} ({fmt(row.get('original_ms'), '.1f')} -> "
            f"{fmt(row.get('optimized_ms'), '.1f')} ms, {row.get('steps', '-')} steps) | "
            f"{fmt(ppo_m.get('speedup'))} ({ppo_m.get('steps', '-')} steps) | "
            f"{fmt(taso_m.get('speedup'))} ({taso_m.get('steps', '-')} steps) | "
            f"{fmt(row.get('env_speedup'))} | "
            f"{fmt(_ppo_model_final(ppo, model, args.window))} |"
        )
    lines.append(
        f"| geomean | {fmt(best['measured_speedup'])} | "
        f"{fmt(geometric_mean([m.get('speedup') for m in ppo['measured'].values()]))} | "
        f"{fmt(geometric_mean([m.get('speedup') for m in taso.values()]))} | "
        f"{fmt(best['analytic_speedup'])} | {fmt(final)} |"
    )
    if remeasured:
        names = ["original again", "world model", "ppo", "taso"]
        lines += [
            "",
            f"### All final graphs timed together (median of {args.remeasure} interleaved runs; "
            "ORT level all, 1 thread; 'original again' is the noise floor)",
            "",
            "| model | original ms | " + " | ".join(names) + " | load |",
            "|---|---:|" + "---:|" * len(names) + "---|",
        ]
        for model, entry in remeasured.items():
            cells = [fmt(entry["speedups"].get(name)) for name in names]
            lines.append(
                f"| {model} | {fmt(entry['original_ms'], '.1f')} | "
                + " | ".join(cells)
                + f" | {entry['load']} |"
            )
        lines.append(
            "| geomean | | "
            + " | ".join(
                fmt(geometric_mean([e["speedups"].get(n) for e in remeasured.values()]))
                for n in names
            )
            + " | |"
        )
    lines += [
        "",
        "### World model by data budget (random-agent episodes)",
        "",
        "| episodes | collect steps | eval steps | real env steps | real measurements | "
        "held-out cost mse | analytic speedup | measured speedup | wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in wm_rows:
        lines.append(
            f"| {row['budget']} | {row['collect_steps']} | {row['eval_steps_all_taus']} | "
            f"{row['real_env_steps']} | {row['real_measurements']} | "
            f"{fmt(row['mdnrnn_val']['cost_mse'])} | {fmt(row['analytic_speedup'])} | "
            f"{fmt(row['measured_speedup'])} | {row['wall_s']:.0f} |"
        )
    lines += [
        "",
        f"### Sample efficiency: to reach 95% of PPO's final gain (analytic speedup "
        f"{fmt(target, '.4f')}; PPO final {fmt(final, '.4f')})",
        "",
        "| learner | real env steps | real latency measurements | note |",
        "|---|---:|---:|---|",
        f"| PPO | {ppo_steps if ppo_steps is not None else 'not reached'} | "
        f"{ppo_meas if ppo_meas is not None else '-'} | training curve, {ppo['global_step']}"
        f"/{ppo['total_steps']} steps{'' if ppo['finished'] else ' (unfinished)'} |",
        f"| world model | {wm_steps if wm_steps is not None else 'not reached'} | "
        f"{wm_meas if wm_meas is not None else '-'} | collect + eval steps; measurements: "
        "eval's end-to-end comparisons |",
        "",
        f"Plot: `{shown_plot}`",
        "",
        "Commands run:",
        "",
        *[f"    {command}" for command in bench.commands],
    ]
    report = "\n".join(lines)
    print("\n" + report)
    (bench.out / "report.md").write_text(report + "\n")
    (bench.out / "report.json").write_text(
        json.dumps(
            {
                "world_model": wm_rows,
                "ppo": {k: v for k, v in ppo.items() if k not in ("curve", "episodes_raw")},
                "ppo_curve": ppo["curve"],
                "taso": taso,
                "remeasured": remeasured,
                "target": target,
                "ppo_steps_to_target": ppo_steps,
                "wm_steps_to_target": wm_steps,
            },
            indent=1,
            default=str,
        )
    )
    return 0


def _ppo_model_final(ppo: dict, model: str, window: int) -> float | None:
    speedups = [e["speedup"] for e in ppo.get("episodes_raw", []) if e["model"] == model]
    return sum(speedups[-window:]) / len(speedups[-window:]) if speedups else None


if __name__ == "__main__":
    raise SystemExit(main())
