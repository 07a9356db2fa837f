"""PNG plots of a benchmark report (matplotlib, Agg backend: no display needed).

Each function draws one figure and writes it atomically; it returns the path, or None when
there was nothing to draw (e.g. no learning curves without agent runs).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlflow.fileio import write_bytes_atomic

Row = Mapping[str, Any]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: str | os.PathLike) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(figure)
    return write_bytes_atomic(path, buffer.getvalue())


def _ordered(rows: Sequence[Row], key: str) -> list[str]:
    return list(dict.fromkeys(str(row[key]) for row in rows))


def _grouped_bars(
    rows: Sequence[Row],
    value_key: str,
    ylabel: str,
    path: str | os.PathLike,
    *,
    origin: float = 0.0,
    log: bool = False,
    label: str = "{:.2f}",
) -> Path | None:
    """Bars of `row[value_key]` grouped by model, one colour per method, a panel per
    deploy mode; bars start at `origin` (1.0 for speedups: up is faster, down is slower)."""
    rows = [row for row in rows if row.get(value_key) is not None]
    if not rows:
        return None
    plt = _pyplot()
    levels, models, methods = (_ordered(rows, k) for k in ("deploy", "model", "method"))
    figure, axes = plt.subplots(
        1,
        len(levels),
        figsize=(max(5.0, 1.3 * len(models) * len(levels) + 2.5), 4),
        squeeze=False,
    )
    width = 0.8 / len(methods)
    by_key = {(row["deploy"], row["model"], row["method"]): row for row in rows}
    values = [float(row[value_key]) for row in rows]
    for axis, level in zip(axes[0], levels, strict=True):
        for index, method in enumerate(methods):
            xs, heights, texts = [], [], []
            for position, model in enumerate(models):
                row = by_key.get((level, model, method))
                if row is not None:
                    xs.append(position - 0.4 + width * (index + 0.5))
                    heights.append(float(row[value_key]) - origin)
                    texts.append(label.format(row[value_key]))
            bars = axis.bar(xs, heights, width, bottom=origin, label=method, color=f"C{index}")
            axis.bar_label(bars, labels=texts, fontsize="x-small", padding=2)
        if origin:
            axis.axhline(origin, color="black", linewidth=0.8)
            spread = max(abs(v - origin) for v in values) or 0.01
            axis.set_ylim(origin - 1.3 * spread, origin + 1.3 * spread)
        if log:
            axis.set_yscale("log")
            axis.set_ylim(min(values) / 2, max(values) * 2)
        axis.set_xticks(range(len(models)), models, rotation=20, ha="right")
        axis.set_title(f"deploy {level}")
        if axis is axes[0][0]:
            axis.set_ylabel(ylabel)
    axes[0][-1].legend(fontsize="small")
    return _save(figure, path)


def plot_speedup_bars(rows: Sequence[Row], path: str | os.PathLike) -> Path | None:
    """Speedup per model (groups) and method (bars) from 1.0, one panel per deploy mode."""
    usable = [row for row in rows if row.get("equivalent", True)]
    return _grouped_bars(
        usable, "speedup", "speedup over the original (x)", path, origin=1.0, label="{:.3f}"
    )


def plot_wall_time(rows: Sequence[Row], path: str | os.PathLike) -> Path | None:
    """Optimisation wall time per model and method, one panel per deploy mode (log scale)."""
    return _grouped_bars(
        rows, "wall_s", "optimisation wall time (s)", path, log=True, label="{:.1f}"
    )


def plot_learning_curves(
    curves: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
    path: str | os.PathLike,
    tags: Sequence[str] = ("charts/episodic_return", "charts/speedup"),
) -> Path | None:
    """One panel per tag, one line per run: `curves[run][tag] = [(step, value), ...]`."""
    present = [tag for tag in tags if any(tag in run for run in curves.values())]
    if not present:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(present), figsize=(5 * len(present), 3.6), squeeze=False)
    for axis, tag in zip(axes[0], present, strict=True):
        for run, run_curves in curves.items():
            points = run_curves.get(tag)
            if points:
                steps, values = zip(*points, strict=True)
                axis.plot(steps, values, label=run, linewidth=1.2)
        axis.set_title(tag)
        axis.set_xlabel("env steps")
        axis.legend(fontsize="small")
    return _save(figure, path)


@dataclass
class EfficiencyPanel:
    """One model's sample-efficiency panel (see `plot_speedup_vs_env_steps`)."""

    training: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """agent run -> (real env steps so far, speedup) of its training episodes on the model"""
    finals: dict[str, tuple[int, float]] = field(default_factory=dict)
    """agent run -> (real env steps it trained with, its benchmarked speedup)"""
    baselines: dict[str, float] = field(default_factory=dict)
    """search method -> its benchmarked speedup (drawn as a horizontal line)"""


def plot_speedup_vs_env_steps(
    panels: Mapping[str, EfficiencyPanel], path: str | os.PathLike, *, title: str = ""
) -> Path | None:
    """Sample efficiency, one panel per model: per agent run, the speedup of its training
    episodes against the real env steps taken so far (line) and its benchmarked speedup at its
    final step count (star); the search baselines' speedups as dashed lines."""
    panels = {name: panel for name, panel in panels.items() if panel.training or panel.finals}
    if not panels:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for axis, (model, panel) in zip(axes[0], panels.items(), strict=True):
        runs = dict.fromkeys([*panel.training, *panel.finals])
        colors = {run: f"C{index}" for index, run in enumerate(runs)}
        for run, points in panel.training.items():
            if points:
                steps, values = zip(*points, strict=True)
                axis.plot(steps, values, color=colors[run], linewidth=1.0, alpha=0.6)
        for run, (steps, speedup) in panel.finals.items():
            axis.plot([steps], [speedup], color=colors[run], marker="*", markersize=13,
                      linestyle="", label=run)  # fmt: skip
        for index, (method, speedup) in enumerate(panel.baselines.items()):
            color = f"C{(index + 5) % 10}"
            axis.axhline(speedup, linestyle="--", linewidth=0.9, color=color, label=method)
        axis.set_title(f"{title} {model}".strip())
        axis.set_xlabel("real env steps")
        axis.set_ylabel("speedup (x)")
        axis.legend(fontsize="small")
    return _save(figure, path)
