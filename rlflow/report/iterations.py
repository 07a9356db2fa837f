"""The World Models loop's curves: per iteration, the controllers' dream and real returns and
the world model's held-out errors (from LOOP_DIR/loop.json, `rlflow train-wm-loop`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlflow.report.plots import _pyplot, _save

HELD_OUT = (("heldout", "own held-out", "o"), ("heldout_next", "next data", "s"))
"""The iteration report's held-out entries: (key, legend label, marker)."""


def plot_loop_iterations(summary: Mapping[str, Any], path: str | os.PathLike) -> Path | None:
    """Two panels: returns by iteration (dream dashed, real solid, one colour per tau), and
    the held-out latent NLL and cost-ratio error of each iteration's world model."""
    iterations = list(summary.get("iterations", []))
    if not iterations:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    figure, (returns, errors) = plt.subplots(1, 2, figsize=(11, 3.8))
    for axis in (returns, errors):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    taus = sorted({row["temperature"] for entry in iterations for row in entry["controllers"]})
    for index, tau in enumerate(taus):
        points = [
            (entry["iteration"], row)
            for entry in iterations
            for row in entry["controllers"]
            if row["temperature"] == tau
        ]
        steps = [step for step, _ in points]
        color = f"C{index}"
        real = [math.nan if r["real_return"] is None else r["real_return"] for _, r in points]
        returns.plot(steps, real, color=color, marker="o", label=f"real, tau {tau:g}")
        returns.plot(steps, [r["dream_return"] for _, r in points], color=color, marker="x",
                     linestyle="--", label=f"dream, tau {tau:g}")  # fmt: skip
    rho = summary.get("dream_real_rank_correlation")
    title = "controller returns" + (f" (Spearman dream-real {rho:.2f})" if rho is not None else "")
    returns.set_title(title)
    returns.set_xlabel("iteration")
    returns.set_ylabel("return (% of the cost saved)")
    returns.legend(fontsize="small")
    for key, label, marker in HELD_OUT:
        points = [(e["iteration"], e[key]) for e in iterations if e.get(key)]
        if points:
            steps = [step for step, _ in points]
            errors.plot(steps, [r["latent_nll"] for _, r in points], marker=marker,
                        label=f"latent NLL, {label}")  # fmt: skip
    errors.set_xlabel("iteration")
    errors.set_ylabel("latent NLL (nats)")
    cost_axis = errors.twinx()
    for key, label, marker in HELD_OUT:
        points = [(e["iteration"], e[key]) for e in iterations if e.get(key)]
        if points:
            steps = [step for step, _ in points]
            maes = [r["cost_ratio_mae"] for _, r in points]
            cost_axis.plot(steps, maes, color="0.4", marker=marker, linestyle=":",
                           label=f"cost-ratio MAE, {label}")  # fmt: skip
    cost_axis.set_ylabel("cost-ratio mean abs. error")
    errors.set_title("world model on held-out rollouts")
    lines = errors.get_legend_handles_labels()
    more = cost_axis.get_legend_handles_labels()
    if lines[0] or more[0]:
        errors.legend(lines[0] + more[0], lines[1] + more[1], fontsize="small")
    return _save(figure, path)
