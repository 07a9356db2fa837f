"""What a report reads from a training run directory: scalars from its TensorBoard event files
and its sample-efficiency log (`progress.json`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CURVE_TAGS: tuple[str, ...] = ("charts/episodic_return", "charts/speedup")
"""The learning-curve scalars every learner writes (STYLE.md, after CleanRL)."""


def read_scalars(
    run_dir: str | os.PathLike, tags: tuple[str, ...] = CURVE_TAGS
) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] in step order, from the event files directly in `run_dir`.

    Tags the run never wrote are left out; a directory without event files gives {}. A step
    written twice (a resumed run re-doing steps after its last checkpoint) keeps the later
    value, as TensorBoard shows it.
    """
    path = Path(run_dir)
    if not any(path.glob("events.out.tfevents.*")):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    accumulator = EventAccumulator(str(path), size_guidance={SCALARS: 0})
    accumulator.Reload()
    available = set(accumulator.Tags().get("scalars", []))
    curves: dict[str, list[tuple[int, float]]] = {}
    for tag in tags:
        if tag in available:
            by_step = {event.step: float(event.value) for event in accumulator.Scalars(tag)}
            curves[tag] = sorted(by_step.items())
    return curves


def read_progress(run_dir: str | os.PathLike) -> dict[str, Any]:
    """RUN_DIR/progress.json, or {} when the run has none (or it cannot be read)."""
    try:
        data = json.loads((Path(run_dir) / "progress.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _env_steps(entry: dict[str, Any]) -> int | None:
    # A world-model run counts the real steps it took (collection, real evaluation) apart from
    # its dream steps; a PPO run's every step is real.
    for key in ("real_env_steps", "global_step"):
        value = entry.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


def real_env_steps(progress: dict[str, Any]) -> int | None:
    """Real environment steps a training run took, from its progress log (None: unknown)."""
    return _env_steps(progress)


def speedup_by_env_steps(progress: dict[str, Any]) -> list[tuple[int, float]]:
    """(real env steps so far, episode speedup) per logged training episode, in order."""
    points = []
    for entry in progress.get("episodes", []):
        if not isinstance(entry, dict):
            continue
        steps, speedup = _env_steps(entry), entry.get("speedup")
        if steps is not None and isinstance(speedup, int | float):
            points.append((steps, float(speedup)))
    return sorted(points)
