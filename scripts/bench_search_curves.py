#!/usr/bin/env python
"""Search methods compared per cost evaluation (issue 19; docs/BENCHMARKS.md, "Search").

For each model, method and seed: run the search from a start state (`--start`: the original
graph by default, or one of onnxruntime's graphs, `ort:all`; zoo model at --size, offline
settings: graphs as written) and record the best cost seen relative to the start graph's -- the
speedup in cost-model terms, start cost / best cost -- after each evaluation. The cost
(`--cost`) is the analytic roofline (the default: deterministic, nothing timed) or the
offline environment's per-op measured cost (`perop`: each distinct operator timed once in
onnxruntime and cached on disk, then a fixed table: reruns reproduce the curves; searches then
run one at a time, `--jobs 1`). The search functions are stopped by their cost once the
evaluation budget is spent, so the end-to-end timing every search ends with
(`rlflow.search.base.finish`) never runs.

An evaluation is a distinct graph costed (`SearchResult.evaluated`'s unit; the start graph is
not counted): a graph costed again is a memoised lookup, as a measured cost would be. The
methods' own budgets count other things (taso: graphs popped; random and guided: steps; brkga
and regal: chromosomes, whose decodings repeat), so each gets more than enough of its own and
all are cut at the same number of evaluations. A search that ends first (an empty queue) keeps
its last best to the end of the curve. taso has no randomness: it runs once per model, and
that run stands for every seed.

Methods: random, taso, brkga, guided:RUN_DIR (`rlflow train-advantage`) and regal:RUN_DIR
(`rlflow train-regal`). The table (stdout and OUT.md) gives per model and method the final
speedup (mean, min-max over seeds) and the evaluations each seed needed to reach taso's final
speedup; OUT.json has every curve, OUT.png draws them (mean line, min-max band). Progress on
stderr.

A cost-model speedup is not a latency. `--e2e-at N...` keeps each search's best graph after N
evaluations (for each N given) and, once all searches of a model are done, times every distinct
one of them end to end in one interleaved run against the original under onnxruntime's defaults
(each graph as it deploys: offline, as written): the deployable speedup after N evaluations, a
second row of panels in OUT.png and a column of the table. `--e2e-min-time S` is the timed time
per graph of that run (default 1 s; the Runner's fixed protocol, which a few dozen graphs need
to fit in minutes).

    python scripts/bench_search_curves.py --models inception-v3 resnet-50 bert --size small \\
        --methods random taso guided:runs/adv brkga regal:runs/regal --seeds 0 1 2 \\
        --evaluations 400 --out runs/search-curves

`--merge A.json B.json ... --out OUT` searches nothing: it puts the runs of earlier outputs
made with the same size, cost, start, budget and seeds into one table and one plot (so methods
run at different times are counted against the same taso result). Their per-op costs come
from the same on-disk cache, so the cost curves compare; the end-to-end figures stay those of
each output's own timing run, which the table's head names.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rlflow.cost import Deployment, OrtSettings
from rlflow.cost.ort_optimizer import check_start_name, start_state
from rlflow.errors import RlflowError
from rlflow.fileio import write_json_atomic, write_text_atomic
from rlflow.graph import Graph, load_model
from rlflow.search.cost import SearchCost, make_cost
from rlflow.zoo import cached_path

OWN_BUDGET_FACTOR = 20
"""A method's own budget, per evaluation of the shared budget: enough that the shared
evaluation budget, not the method's own, is what stops it."""


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class BudgetSpent(Exception):
    """Raised by `CurveCost` when a search asks for one graph more than the budget."""


class CurveCost(SearchCost):
    """A cost (analytic or per-op), recording the best cost after each distinct graph costed
    and stopping the search (`BudgetSpent`) at the first graph beyond `budget`. The first graph
    asked for is the start graph: it sets `start_cost` and is not counted."""

    def __init__(
        self,
        name: str,
        cost_ms: Callable[[Graph], float],
        settings: OrtSettings,
        budget: int,
        keep_at: tuple[int, ...] = (),
    ) -> None:
        super().__init__(name, cost_ms, settings)
        self.budget = budget
        self.start_cost: float | None = None
        self.best = float("inf")
        self.curve: list[float] = []
        """Best cost after evaluation 1, 2, ... (the start graph excluded)."""
        self.keep_at = set(keep_at)
        self.best_graph: Graph | None = None
        self.kept: dict[int, Graph] = {}
        """The best graph after each evaluation count of `keep_at` reached so far."""

    def __call__(self, graph: Graph) -> float:
        if graph.canonical_hash() in self._asked:
            return super().__call__(graph)
        if self.start_cost is not None and len(self.curve) >= self.budget:
            raise BudgetSpent
        value = super().__call__(graph)
        if self.start_cost is None:
            self.start_cost = self.best = value
            self.best_graph = graph
        else:
            if value < self.best:
                self.best, self.best_graph = value, graph
            self.curve.append(self.best)
            if len(self.curve) in self.keep_at:
                self.kept[len(self.curve)] = self.best_graph
        return value

    def kept_graphs(self) -> dict[int, Graph]:
        """The best graph after each count of `keep_at`; a search that ended before a count
        keeps its last best for it."""
        assert self.best_graph is not None
        return {count: self.kept.get(count, self.best_graph) for count in sorted(self.keep_at)}


def speedups(start_cost: float, curve: list[float], budget: int) -> list[float]:
    """Start cost / best cost after each evaluation, the last value carried to `budget`
    (a search that stopped early) and 1.0 before any evaluation."""
    values = [start_cost / cost for cost in curve] or [1.0]
    return values + [values[-1]] * (budget - len(values))


def evaluations_to_reach(curve: list[float], target: float, tolerance: float = 1e-9) -> int | None:
    """The first evaluation (1-based) whose speedup reaches `target` (within a relative
    tolerance: equal graphs, costed alike); 0 if the target is no gain; None if never."""
    if target <= 1.0 + tolerance:
        return 0
    for index, value in enumerate(curve):
        if value >= target * (1.0 - tolerance):
            return index + 1
    return None


def method_label(method: str) -> str:
    """`guided:RUN_DIR` -> `guided`; plain names unchanged."""
    return method.split(":", 1)[0]


def run_one(task: dict[str, Any]) -> dict[str, Any]:
    """One search of one model with one seed, cut at the evaluation budget (runs in a worker
    process: everything it needs is in `task`)."""
    from rlflow.rewrite import default_ruleset
    from rlflow.rewrite.session import RewriteSession
    from rlflow.search import brkga, guided, random_walk, taso

    model, method, seed, budget = task["model"], task["method"], task["seed"], task["budget"]
    settings = Deployment("offline").settings(OrtSettings()).resolved()
    original = load_model(cached_path(model, task["size"]))
    graph = start_state(original, task["start"], settings).graph
    keep_at = tuple(task.get("e2e_at", ()))
    cost = CurveCost(task["cost"], make_cost(task["cost"], settings), settings, budget, keep_at)
    session = RewriteSession(graph, default_ruleset(), model=model)
    own = budget * OWN_BUDGET_FACTOR
    label, _, run_dir = method.partition(":")
    started = time.perf_counter()
    try:
        if label == "taso":
            taso.search(session, cost, budget=own)
        elif label == "random":
            random_walk.search(session, cost, budget=own, seed=seed)
        elif label == "brkga":
            brkga.search(session, cost, budget=own, seed=seed)
        elif label == "regal":
            from rlflow.agents.regal_policy import load_regal_policy

            policy = load_regal_policy(run_dir)
            brkga.search(
                session,
                cost,
                budget=own,
                seed=seed,
                biases=policy.biases,
                config=policy.brkga_config,
                label="regal",
            )
        elif label == "guided":
            from rlflow.advantage.guide import load_guide

            guided.search(session, cost, advantage=load_guide(run_dir), budget=own, seed=seed)
        else:
            raise RlflowError(f"unknown method {method!r}")
        stopped = "search ended"
    except BudgetSpent:
        stopped = "budget"
    assert cost.start_cost is not None
    return {
        "model": model,
        "method": method_label(method),
        "spec": method,
        "seed": seed,
        "start_cost_ms": cost.start_cost,
        "evaluations": len(cost.curve),
        "stopped": stopped,
        "wall_s": round(time.perf_counter() - started, 2),
        "speedup": speedups(cost.start_cost, cost.curve, budget),
        # Graphs for the end-to-end timing (`time_kept_graphs`), dropped before any JSON.
        "kept": cost.kept_graphs() if keep_at else {},
    }


def time_kept_graphs(
    model: str, runs: list[dict[str, Any]], size: str, min_time_s: float
) -> dict[str, float]:
    """Time every distinct graph kept by `model`'s runs, in one interleaved run against the
    original under onnxruntime's defaults (each kept graph under the settings it declares:
    offline, as written); their deployable speedups by canonical hash."""
    from rlflow.cost import Runner

    graphs: dict[str, Graph] = {}
    for run in runs:
        if run["model"] != model:
            continue
        for graph in run["kept"].values():
            graphs.setdefault(graph.canonical_hash(), graph)
    original = load_model(cached_path(model, size))
    defaults = OrtSettings()  # onnxruntime's defaults: level all
    runner = Runner(defaults, runs=10, min_time_s=min_time_s)
    comparison = runner.compare(
        [original, *graphs.values()],
        settings=[defaults, *[None] * len(graphs)],
        use_cache=False,
    )
    return dict(zip(graphs, comparison.speedups[1:], strict=True))


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and method: final speedups per seed and the evaluations to reach taso's."""
    rows = []
    for model in dict.fromkeys(run["model"] for run in runs):
        of_model = [run for run in runs if run["model"] == model]
        taso_final = [run["speedup"][-1] for run in of_model if run["method"] == "taso"]
        target = max(taso_final) if taso_final else None
        for method in dict.fromkeys(run["method"] for run in of_model):
            of_method = [run for run in of_model if run["method"] == method]
            finals = [run["speedup"][-1] for run in of_method]
            reach = (
                [evaluations_to_reach(run["speedup"], target) for run in of_method]
                if target is not None
                else []
            )
            rows.append(
                {
                    "model": model,
                    "method": method,
                    "seeds": [run["seed"] for run in of_method],
                    "final": finals,
                    "taso_final": target,
                    "to_reach_taso": reach,
                    "stopped_early": sum(run["stopped"] != "budget" for run in of_method),
                    # The deployable speedup of each seed's best graph at the last count timed.
                    "e2e_final": [last_e2e(run) for run in of_method if run.get("e2e")],
                }
            )
    return rows


def last_e2e(run: dict[str, Any]) -> float:
    """A run's end-to-end speedup at the largest evaluation count timed."""
    return run["e2e"][max(run["e2e"], key=int)]


def format_reach(reach: list[int | None]) -> str:
    if not reach:
        return "-"
    if all(value is None for value in reach):
        return "not reached"
    shown = ", ".join("not reached" if value is None else str(value) for value in reach)
    hit = [value for value in reach if value is not None]
    return f"{shown} (mean of {len(hit)}: {statistics.mean(hit):.0f})"


def spread_of(values: list[float]) -> str:
    """`1.234x (1.200-1.250)`: the mean and the range over seeds."""
    spread = f"{min(values):.3f}-{max(values):.3f}" if len(values) > 1 else "one run"
    return f"{statistics.mean(values):.3f}x ({spread})"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    timed = meta.get("e2e_at")
    e2e_head = (
        f" end-to-end speedup after {max(timed)} evaluations, mean (min-max) |" if timed else ""
    )
    lines = [
        f"`{meta['command']}` ({meta['date']}; {meta['cost']}; start {meta['start']}; "
        f"{meta['evaluations']} evaluations = distinct graphs costed; seeds "
        f"{', '.join(map(str, meta['seeds']))}; taso deterministic, run once)",
        "",
        "| model | method | cost-model speedup, mean (min-max) | evaluations to reach taso's "
        f"final, per seed |{e2e_head}",
        "|---|---|---:|---|" + ("---:|" if timed else ""),
    ]
    if timed:
        lines[0] += (
            f"; end to end: the best graph after {', '.join(map(str, timed))} evaluations "
            "timed against the original under onnxruntime's defaults, as it deploys"
        )
    for row in rows:
        early = f"; {row['stopped_early']} ended early" if row["stopped_early"] else ""
        e2e = (
            (f" {spread_of(row['e2e_final'])} |" if row.get("e2e_final") else " - |")
            if timed
            else ""
        )
        lines.append(
            f"| {row['model']} | {row['method']} | {spread_of(row['final'])} "
            f"| {format_reach(row['to_reach_taso'])}{early} |{e2e}"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Speedup against evaluations, one panel per model: each method's mean over seeds as a
    line, its min-max over seeds as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    models = list(dict.fromkeys(run["model"] for run in runs))
    timed = bool(meta.get("e2e_at"))
    rows = 2 if timed else 1
    fig, axes = plt.subplots(
        rows, len(models), figsize=(max(7.0, 4.6 * len(models)), 4.0 * rows), squeeze=False
    )
    for ax, model in zip(axes[0], models):
        of_model = [run for run in runs if run["model"] == model]
        for method in dict.fromkeys(run["method"] for run in of_model):
            curves = np.array([run["speedup"] for run in of_model if run["method"] == method])
            x = np.arange(1, curves.shape[1] + 1)
            (line,) = ax.plot(x, curves.mean(axis=0), label=method, linewidth=1.4)
            ax.fill_between(
                x, curves.min(axis=0), curves.max(axis=0), alpha=0.18, color=line.get_color()
            )
        ax.set_title(model, fontsize=10)
        ax.set_xlabel("evaluations (distinct graphs costed)")
        ax.set_ylabel("cost-model speedup (start / best)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax, model in zip(axes[1] if timed else [], models):
        of_model = [run for run in runs if run["model"] == model and run.get("e2e")]
        for method in dict.fromkeys(run["method"] for run in of_model):
            of_method = [run for run in of_model if run["method"] == method]
            counts = sorted(int(count) for count in of_method[0]["e2e"])
            values = np.array([[run["e2e"][str(count)] for count in counts] for run in of_method])
            (line,) = ax.plot(counts, values.mean(axis=0), marker="o", label=method, linewidth=1.4)
            ax.fill_between(
                counts, values.min(axis=0), values.max(axis=0), alpha=0.18, color=line.get_color()
            )
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xscale("log")
        ax.set_title(f"{model}: end to end", fontsize=10)
        ax.set_xlabel("evaluations (log)")
        ax.set_ylabel("speedup vs original at onnxruntime's defaults")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{meta['cost']}; start {meta['start']}; zoo {meta['size']}; seeds "
        f"{', '.join(map(str, meta['seeds']))}; {meta['date']}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _model_done(
    model: str, runs: list[dict[str, Any]], tasks: list[dict[str, Any]], seeds: list[int]
) -> bool:
    """Whether every search of `model` has come back (taso's one run counts for all seeds)."""
    wanted = sum(
        len(seeds) for task in tasks if task["model"] == model and task["seed"] == seeds[0]
    )
    return sum(run["model"] == model for run in runs) == wanted


def jsonable(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs without the graphs kept for timing (not JSON; timed once a model is done)."""
    return [{key: value for key, value in run.items() if key != "kept"} for run in runs]


MERGED_KEYS = ("size", "cost", "start", "evaluations", "seeds")
"""What outputs must share to be merged: their curves then count the same thing."""


def merge_outputs(
    paths: list[Path], argv: list[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The runs of several earlier outputs and one meta for them (see the module doc)."""
    outputs = []
    for path in paths:
        try:
            outputs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            raise RlflowError(f"cannot read {path}: {error}") from error
        if not isinstance(outputs[-1], dict) or not {"meta", "runs"} <= outputs[-1].keys():
            raise RlflowError(f"{path} is not an output of this script")
    first = outputs[0]["meta"]
    for path, output in zip(paths, outputs, strict=True):
        differ = [key for key in MERGED_KEYS if output["meta"].get(key) != first.get(key)]
        if differ:
            raise RlflowError(f"{path} differs from {paths[0]} in {', '.join(differ)}")
    runs = [run for output in outputs for run in output["runs"]]
    seen = set()
    for run in runs:
        key = (run["model"], run["method"], run["seed"])
        if key in seen:
            raise RlflowError(
                f"{run['model']} {run['method']} seed {run['seed']} is in two outputs"
            )
        seen.add(key)
    e2e_at = sorted({int(count) for run in runs for count in run.get("e2e", {})})
    meta = {
        **{key: first[key] for key in MERGED_KEYS},
        "command": " and ".join(output["meta"]["command"] for output in outputs)
        + " merged by "
        + shlex.join(["python", "scripts/bench_search_curves.py", *argv]),
        "date": ", ".join(dict.fromkeys(output["meta"]["date"] for output in outputs)),
        "e2e_at": e2e_at,
    }
    return runs, meta


def write_outputs(runs: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    """OUT.json (every curve and the summary), OUT.md (the table, also printed), OUT.png."""
    paths = {suffix: out.with_name(f"{out.name}.{suffix}") for suffix in ("json", "md", "png")}
    rows = summarise(runs)
    write_json_atomic(paths["json"], {"meta": meta, "runs": jsonable(runs), "summary": rows})
    table = markdown(rows, meta)
    write_text_atomic(paths["md"], table)
    plot(runs, meta, paths["png"])
    print(table)
    progress(f"wrote {paths['md']}, {paths['json'].name} and {paths['png'].name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", help="zoo models")
    parser.add_argument(
        "--merge", nargs="+", type=Path, metavar="JSON", help="merge earlier outputs (no search)"
    )
    parser.add_argument("--size", default="small", help="zoo size: small, medium or full")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["random", "taso", "brkga"],
        help="random, taso, brkga, guided:RUN_DIR, regal:RUN_DIR",
    )
    parser.add_argument(
        "--cost",
        choices=("analytic", "perop"),
        default="analytic",
        help="analytic (nothing timed) or perop (the offline env's measured per-op cost)",
    )
    parser.add_argument(
        "--start", default="original", help="start state: original (default) or ort:LEVEL[-PASS]"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--evaluations", type=int, default=400, help="budget per search")
    parser.add_argument(
        "--jobs", type=int, default=1, help="searches run at once (1: in this process)"
    )
    parser.add_argument("--out", default="runs/search-curves", help="output path, no suffix")
    parser.add_argument(
        "--e2e-at",
        nargs="+",
        type=int,
        default=[],
        metavar="N",
        help="time each search's best graph after N evaluations end to end (see above)",
    )
    parser.add_argument(
        "--e2e-min-time", type=float, default=1.0, help="timed seconds per graph end to end"
    )
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    if args.merge:
        try:
            runs, meta = merge_outputs(args.merge, given)
        except RlflowError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        write_outputs(runs, meta, Path(args.out))
        return 0
    if not args.models:
        print("error: give --models (or --merge earlier outputs)", file=sys.stderr)
        return 2
    if args.evaluations < 1:
        print("error: --evaluations must be at least 1", file=sys.stderr)
        return 2
    if any(not 1 <= count <= args.evaluations for count in args.e2e_at):
        print("error: --e2e-at counts must lie in 1..--evaluations", file=sys.stderr)
        return 2
    if args.cost == "perop" and args.jobs > 1:
        print(
            "error: --cost perop times operators: searches run one at a time (--jobs 1)",
            file=sys.stderr,
        )
        return 2
    try:
        check_start_name(args.start)
    except RlflowError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for method in args.methods:
        if method_label(method) not in ("random", "taso", "brkga", "guided", "regal"):
            print(f"error: unknown method {method!r}", file=sys.stderr)
            return 2
        if method_label(method) in ("guided", "regal") and ":" not in method:
            print(f"error: {method} needs its run: {method}:RUN_DIR", file=sys.stderr)
            return 2

    tasks = [
        {
            "model": model,
            "method": method,
            "seed": seed,
            "budget": args.evaluations,
            "size": args.size,
            "cost": args.cost,
            "start": args.start,
            "e2e_at": sorted(set(args.e2e_at)),
        }
        for model in args.models
        for method in args.methods
        for seed in (args.seeds[:1] if method == "taso" else args.seeds)
    ]
    meta = {
        "command": shlex.join(["python", "scripts/bench_search_curves.py", *given]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "size": args.size,
        "seeds": args.seeds,
        "evaluations": args.evaluations,
        "cost": {"analytic": "analytic cost, nothing timed", "perop": "per-op measured cost"}[
            args.cost
        ],
        "start": args.start,
        "e2e_at": sorted(set(args.e2e_at)),
    }
    out = Path(args.out)
    paths = {suffix: out.with_name(f"{out.name}.{suffix}") for suffix in ("json", "md", "png")}
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        with ProcessPoolExecutor(max_workers=args.jobs) if args.jobs > 1 else nullcontext() as pool:
            results = pool.map(run_one, tasks) if pool is not None else map(run_one, tasks)
            for done, run in enumerate(results, 1):
                # taso stands for every seed (it has no randomness).
                copies = args.seeds if run["method"] == "taso" else [run["seed"]]
                runs += [{**run, "seed": seed} for seed in copies]
                if args.e2e_at and _model_done(run["model"], runs, tasks, args.seeds):
                    progress(f"{run['model']}: timing the kept graphs end to end")
                    e2e = time_kept_graphs(run["model"], runs, args.size, args.e2e_min_time)
                    for done_run in runs:
                        if done_run["model"] == run["model"]:
                            done_run["e2e"] = {
                                str(count): e2e[graph.canonical_hash()]
                                for count, graph in done_run.pop("kept").items()
                            }
                elapsed = time.perf_counter() - started
                eta = elapsed / done * (len(tasks) - done)
                progress(
                    f"[{done}/{len(tasks)}] {run['model']} {run['method']} seed {run['seed']}: "
                    f"{run['speedup'][-1]:.3f}x after {run['evaluations']} evaluations "
                    f"({run['stopped']}, {run['wall_s']:.0f} s); {elapsed / done:.0f} s/run, "
                    f"ETA {eta / 60:.1f} min"
                )
                write_json_atomic(paths["json"], {"meta": meta, "runs": jsonable(runs)})
    except RlflowError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_outputs(runs, meta, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
