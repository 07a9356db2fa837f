"""Learning curves of a run set: the same training at several seeds, drawn with its spread.

A run set is a directory of run directories, one per seed (`rlflow train-ppo --seeds 0,1,2`
writes `seed-0/`, `seed-1/`, ...). Each seed's episodic curves are read from its progress log
(every episode, where TensorBoard keeps one value per step and several envs can end episodes
at the same step; its scalars serve runs without a log), smoothed over a window of episodes,
and drawn thin; their mean on a common step grid
is drawn bold over the band between the lowest and the highest seed (the spread). The points
are also written as CSV, for plotting elsewhere.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rlflow.fileio import write_bytes_atomic
from rlflow.report.plots import _pyplot, _save
from rlflow.report.runs import CURVE_TAGS, read_progress, read_scalars

Curve = list[tuple[int, float]]


def smooth(points: Curve, window: int) -> Curve:
    """A trailing moving average over `window` points (fewer at the start)."""
    if not points:
        return []
    steps = [step for step, _ in points]
    values = np.array([value for _, value in points], dtype=np.float64)
    sums = np.concatenate([[0.0], np.cumsum(values)])
    starts = np.maximum(np.arange(len(values)) + 1 - window, 0)
    means = (sums[1:] - sums[starts]) / (np.arange(len(values)) + 1 - starts)
    return list(zip(steps, means.tolist(), strict=True))


PROGRESS_KEYS = {"charts/episodic_return": "return", "charts/speedup": "speedup"}
"""Curve tag -> the key of each episode's entry in progress.json that holds it."""


def episode_curves(run_dir: str | os.PathLike, tags: Sequence[str]) -> dict[str, Curve]:
    """tag -> [(global step, value), ...] of every logged episode of a run, in order; from
    TensorBoard's scalars for what the progress log lacks."""
    episodes = [e for e in read_progress(run_dir).get("episodes", []) if isinstance(e, dict)]
    curves: dict[str, Curve] = {}
    for tag in tags:
        key = PROGRESS_KEYS.get(tag)
        points = [
            (int(e["global_step"]), float(e[key]))
            for e in episodes
            if key is not None and isinstance(e.get(key), int | float) and "global_step" in e
        ]
        if points:
            curves[tag] = sorted(points, key=lambda point: point[0])
    missing = tuple(tag for tag in tags if tag not in curves)
    if missing:
        curves.update(read_scalars(run_dir, missing))
    return curves


def run_set_curves(
    run_dirs: Mapping[str, str | os.PathLike], tags: Sequence[str] = CURVE_TAGS
) -> dict[str, dict[str, Curve]]:
    """tag -> seed label -> [(step, value), ...] of each run's episodes."""
    curves: dict[str, dict[str, Curve]] = {tag: {} for tag in tags}
    for label, run_dir in run_dirs.items():
        for tag, points in episode_curves(run_dir, tags).items():
            curves[tag][label] = points
    return {tag: runs for tag, runs in curves.items() if runs}


def spread(runs: Mapping[str, Curve], points: int = 100) -> tuple[np.ndarray, ...]:
    """(steps, mean, low, high) of the runs on a common grid over the steps all of them
    reached (each run interpolated linearly); empty arrays when they share no step range."""
    curves = [run for run in runs.values() if run]
    if not curves:
        return (np.array([]),) * 4
    first = max(run[0][0] for run in curves)
    last = min(run[-1][0] for run in curves)
    if last < first:
        return (np.array([]),) * 4
    grid = np.linspace(first, last, points) if last > first else np.array([float(first)])
    stacked = np.stack(
        [np.interp(grid, [s for s, _ in run], [v for _, v in run]) for run in curves]
    )
    return grid, stacked.mean(axis=0), stacked.min(axis=0), stacked.max(axis=0)


def plot_run_set(
    run_dirs: Mapping[str, str | os.PathLike],
    path: str | os.PathLike,
    *,
    tags: Sequence[str] = CURVE_TAGS,
    window: int = 20,
    title: str = "",
) -> Path | None:
    """The run set's learning curves as one PNG (a panel per tag); None without episodes."""
    curves = run_set_curves(run_dirs, tags)
    if not curves:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 3.8), squeeze=False)
    for axis, (tag, runs) in zip(axes[0], curves.items(), strict=True):
        smoothed = {label: smooth(points, window) for label, points in runs.items()}
        for index, (label, points) in enumerate(smoothed.items()):
            steps, values = zip(*points, strict=True)
            axis.plot(steps, values, color=f"C{index}", linewidth=0.9, alpha=0.7, label=label)
        if len(smoothed) > 1:
            grid, mean, low, high = spread(smoothed)
            if len(grid):
                axis.fill_between(grid, low, high, color="0.6", alpha=0.3, label="spread")
                axis.plot(grid, mean, color="black", linewidth=1.8, label="mean")
        axis.set_title(f"{title} {tag}".strip())
        axis.set_xlabel("env steps")
        axis.set_ylabel(f"{tag.split('/')[-1]} (mean of {window} episodes)")
        axis.legend(fontsize="small")
    return _save(figure, path)


def write_run_set_csv(
    run_dirs: Mapping[str, str | os.PathLike],
    path: str | os.PathLike,
    *,
    tags: Sequence[str] = CURVE_TAGS,
    window: int = 20,
) -> Path | None:
    """The points behind `plot_run_set`: tag, run, step, value, smoothed; None if empty."""
    curves = run_set_curves(run_dirs, tags)
    if not curves:
        return None
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["tag", "run", "step", "value", "smoothed"])
    for tag, runs in curves.items():
        for label, points in runs.items():
            for (step, value), (_, mean) in zip(points, smooth(points, window), strict=True):
                writer.writerow([tag, label, step, f"{value:.6g}", f"{mean:.6g}"])
    return write_bytes_atomic(path, buffer.getvalue().encode("utf-8"))
