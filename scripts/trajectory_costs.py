#!/usr/bin/env python
"""The cost curve of every path a bench found on one model: where a step worse on its own paid.

`rlflow bench` records, per result, the rewrites on the path from its start state to the graph
it returned (rule, site and the hash each produced). This replays each path from the same start
state (`RewriteSession.replay`, hash by hash) and prices every graph on it with the per-op cost
model of offline mode (operators as written, timings cached by signature: a bench's own graphs
are mostly in the cache already), then draws cost relative to the start against step, one line
per method, with each method's steps that did not lower the cost on their own counted. Greedy
never takes such a step; a path that did and ended lower reached a graph greedy cannot.

    python scripts/trajectory_costs.py runs/l18/bench-squeezenet/results.json \\
        --model squeezenet-1.1:medium --out docs/img/trajectories.png [--csv FILE] [--json] \\
        [--methods greedy taso ppo-squeezenet/seed-0]
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rlflow.commands.common import resolve_model  # noqa: E402
from rlflow.cost import OrtSettings  # noqa: E402
from rlflow.cost.deploy import Deployment  # noqa: E402
from rlflow.cost.ort_optimizer import start_state  # noqa: E402
from rlflow.errors import RlflowError  # noqa: E402
from rlflow.graph import Graph  # noqa: E402
from rlflow.rewrite import default_ruleset  # noqa: E402
from rlflow.rewrite.session import EpisodeState, RewriteSession  # noqa: E402
from rlflow.search.cost import make_cost  # noqa: E402


@functools.cache
def start_graph(label: str, start: str, settings: OrtSettings, size: str) -> Graph:
    """The start state a bench's cells of one model began from (onnxruntime's graph is built
    once per model, not once per method)."""
    return start_state(resolve_model(label.rsplit(":", 1)[0], size), start, settings).graph


def cost_curve(cell: dict, settings: OrtSettings, size: str, cost) -> list[float]:
    """Per-op cost (ms) of the start state and of every graph on the cell's path."""
    start = start_graph(cell["model"], cell["start_state"], settings, size)
    state = EpisodeState.from_json(cell["episode"])
    costs = [cost(start)]
    RewriteSession.replay(
        start, state, default_ruleset(), on_step=lambda s: costs.append(cost(s.graph))
    )
    return costs


def idle_steps(costs: list[float], tolerance: float = 1e-9) -> int:
    """Steps that did not lower the cost by more than `tolerance` (relative) on their own: a
    greedy search never takes one (it stops where no step improves)."""
    return sum(after > before * (1 - tolerance) for before, after in zip(costs, costs[1:]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a bench's results.json")
    parser.add_argument("--model", required=True, help="the cells' model label, e.g. bert:medium")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to draw")
    parser.add_argument("--csv", type=Path, help="also write method,step,cost_ms,relative")
    parser.add_argument("--json", action="store_true", help="print a summary object")
    parser.add_argument(
        "--methods", nargs="+", help="draw only the cells whose method contains one of these"
    )
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
    except (OSError, json.JSONDecodeError) as error:
        print(f"error: cannot read {args.results}: {error}", file=sys.stderr)
        return 2
    cells = {
        cell["method"]: cell
        for cell in results["cells"].values()
        if cell["model"] == args.model
        and cell.get("deploy") == "offline"
        and cell.get("episode")
        and (not args.methods or any(part in cell["method"] for part in args.methods))
    }
    if not cells:
        print(
            f"error: no offline result with a path for {args.model} (--methods?)", file=sys.stderr
        )
        return 2
    run = results["settings"]
    settings = Deployment("offline").settings(OrtSettings(threads=run.get("threads", 1)))
    cost = make_cost("perop", settings)
    curves, summary = {}, {}
    try:
        for method, cell in cells.items():
            curves[method] = cost_curve(cell, settings, run["size"], cost)
    except RlflowError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    fig, ax = plt.subplots(figsize=(8, 4.5))
    rows = []
    for method, costs in curves.items():
        relative = [c / costs[0] for c in costs]
        idle = idle_steps(costs)
        summary[method] = {
            "steps": len(costs) - 1,
            "steps_not_improving": idle,
            "final_relative_cost": relative[-1],
            "highest_relative_cost": max(relative),
            "measured_speedup": cells[method].get("method_speedup"),
        }
        label = f"{method}: {len(costs) - 1} steps, {idle} not improving on their own"
        greedy = method == "greedy"  # dashed on top: taso's path often starts as greedy's
        ax.plot(relative, label=label, lw=2.2 if greedy else 1.4, ls="--" if greedy else "-",
                zorder=3 if greedy else 2)  # fmt: skip
        rows += [(method, step, c, r) for step, (c, r) in enumerate(zip(costs, relative))]
    ax.set_xlabel("rewrite applied (step)")
    ax.set_ylabel("per-op cost / start state's")
    ax.set_title(f"{args.model}: cost along each method's path (offline, per-op)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    if args.csv:
        with args.csv.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["method", "step", "cost_ms", "relative"])
            writer.writerows(rows)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for method, entry in summary.items():
            print(
                f"{method}: {entry['steps']} steps, {entry['steps_not_improving']} not improving, "
                f"final {entry['final_relative_cost']:.3f}, "
                f"peak {entry['highest_relative_cost']:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
