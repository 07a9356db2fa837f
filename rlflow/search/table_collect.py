"""Collecting a cost table: time, on this device, every operator instance that rollouts reach.

A table is only as good as its coverage: a search or a learner that later ranks graphs by it
(`rlflow.cost.table`) asks about the operators of the graphs it visits and of the candidates
it weighs. So each model's start states (the original and, offline, onnxruntime's optimised
graphs of it) are recorded, and from the original and from onnxruntime's `all` graph two kinds
of rollout run for `steps` steps each: a random walk (uniform over the candidates, restarting
where none is left), which reaches the rewrites an exploring learner tries, and a greedy
descent by the per-op cost being recorded, which weighs (so records) every candidate of every
graph on its path, as greedy and TASO searches do.

Every operator is timed alone by `PerOpCostModel` under the deployment's settings (offline:
the optimiser off, as written), so its on-disk cache makes a rerun cheap; the table itself is
written atomically after each model, with the models done in its metadata, and a rerun with
the same settings resumes after them. A model that fails (say, a graph onnxruntime cannot
load on this provider) is listed under `models_failed` with its reason and does not stop the
others; the collection then ends with an RlflowError naming it, after the table is saved.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlflow import __version__
from rlflow.cost import Deployment, OrtSettings, PerOpCostModel
from rlflow.cost.cache import read_json
from rlflow.cost.deploy import declared_level
from rlflow.cost.device import device_info
from rlflow.cost.ort_optimizer import start_states
from rlflow.cost.perop import runs_in_place
from rlflow.cost.table import CostTable
from rlflow.errors import RlflowError, first_line
from rlflow.graph import Graph
from rlflow.rewrite import RuleSet, default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.search.base import NO_PROGRESS, Progress

FINGERPRINT = (
    "provider",
    "device",
    "onnxruntime",
    "threads",
    "deploy",
    "ort_level",
    "provider_options",
    "runs",
    "warmup",
    "steps",
    "seed",
)
"""The metadata a resumed table must share with the run resuming it."""


class TableRecorder:
    """Records into `table` every operator of every graph it is asked to cost, timed by
    `perop` (measured once per signature; in-place operators are not timed)."""

    def __init__(self, table: CostTable, perop: PerOpCostModel) -> None:
        self.table = table
        self.perop = perop

    def record(self, graph: Graph) -> None:
        level = declared_level(graph.metadata) or self.table.ort_level
        for node in graph.nodes:
            if runs_in_place(node):
                continue
            key = self.table.key(graph, node, level)
            if key in self.table.entries or key in self.table.failed:
                continue
            ms, error = self.perop.measured_ms(graph, node)
            if ms is None:
                self.table.failed[key] = {"op": node.op_type, "reason": error}
            else:
                self.table.add(key, graph, node, ms)

    def cost(self, graph: Graph) -> float:
        """The graph's per-op cost (what greedy descends by), its operators recorded."""
        self.record(graph)
        return self.perop.cost_ms(graph)


def table_meta(
    settings: OrtSettings, deploy: Deployment, perop: PerOpCostModel, steps: int, seed: int
) -> dict[str, Any]:
    """The metadata of a table collected under these settings (device facts included)."""
    level_settings = deploy.settings(settings).resolved()
    return {
        **device_info(level_settings.provider),
        "threads": level_settings.threads,
        "deploy": deploy.mode,
        "ort_level": level_settings.ort_level,
        "provider_options": level_settings.provider_options(),
        "runs": perop.runs,
        "warmup": perop.warmup,
        "steps": steps,
        "seed": seed,
        "rlflow": __version__,
    }


def collect_table(
    models: Sequence[tuple[str, Graph]],
    out: str | Path,
    *,
    settings: OrtSettings,
    deploy: Deployment,
    steps: int,
    seed: int = 0,
    meta: Mapping[str, Any] | None = None,
    ruleset: RuleSet | None = None,
    progress: Progress = NO_PROGRESS,
    jobs: int = 1,
) -> CostTable:
    """Collect (or resume) the table at `out` for `models` (label, original graph); see the
    module docstring. `settings` are the user's (threads, provider); operators are timed at
    `deploy`'s level. `meta` entries (the command line, the zoo size) are recorded too.
    `jobs` > 1 runs the models' rollouts in that many processes, their timings one at a time
    (`_collect_in_parallel`). RlflowError if `out` holds a table made under other settings, or
    (after the others are collected and the table saved) if a model failed."""
    if steps < 1:
        raise RlflowError(f"--steps must be at least 1, got {steps}")
    if jobs < 1:
        raise RlflowError(f"--jobs must be at least 1, got {jobs}")
    settings = settings.resolved()
    level_settings = deploy.settings(settings)
    perop = PerOpCostModel(level_settings)
    wanted = {**table_meta(settings, deploy, perop, steps, seed), **(meta or {})}
    table = _resume(Path(out), wanted)
    if table is None:
        table = CostTable(meta=wanted, overhead_ms=perop.overhead_ms(level_settings))
        table.meta["models_done"] = []
    table.meta.update({key: value for key, value in wanted.items() if key not in FINGERPRINT})
    table.meta["models"] = list(dict.fromkeys([*table.meta.get("models", []), *dict(models)]))
    table.meta["complete"] = False
    table.meta["models_failed"] = {}
    rules = ruleset if ruleset is not None else default_ruleset()
    table.meta["rules"] = rules.names  # what a search elsewhere may use (`CostTable.rules`)
    run = (settings, deploy, steps, seed, rules)
    try:
        if jobs > 1:
            _collect_in_parallel(table, models, out, run, progress, jobs)
        else:
            _collect_models(table, TableRecorder(table, perop), models, out, run, progress)
    finally:
        perop.close()
    table.meta["complete"] = set(table.meta["models"]) <= set(table.meta["models_done"])
    table.save(out)
    failed = table.meta["models_failed"]
    if failed:
        label, reason = next(iter(failed.items()))
        raise RlflowError(
            f"{len(failed)} of {len(table.meta['models'])} models failed (the others are in "
            f"{out}): {label}: {reason}"
        )
    return table


def _collect_models(
    table: CostTable,
    recorder: TableRecorder,
    models: Sequence[tuple[str, Graph]],
    out: str | Path,
    run: tuple[OrtSettings, Deployment, int, int, RuleSet],
    progress: Progress,
) -> None:
    """The rollouts of each model not done yet (`run`: settings, deployment, steps, seed,
    rules); the table is saved after each."""
    _, deploy, steps, _, _ = run
    done = set(table.meta["models_done"])
    for label, original in models:
        if label in done:
            progress.update(rollout_steps(deploy, steps))
            continue
        started = time.perf_counter()
        try:
            _rollouts(recorder, label, original, run, progress)
        except RlflowError as error:
            _model_failed(table, label, error, out)
            continue
        _model_done(table, label, time.perf_counter() - started, out, progress)


def _rollouts(
    recorder: TableRecorder,
    label: str,
    original: Graph,
    run: tuple[OrtSettings, Deployment, int, int, RuleSet],
    progress: Progress,
) -> None:
    """Record one model's start states and the operators of its rollouts."""
    settings, deploy, steps, seed, rules = run
    starts = [original]
    if deploy.mode == "offline":
        states = {state.name: state.graph for state in start_states(original, settings)}
        for graph in states.values():
            recorder.record(graph)
        # ORT's `all` graph equal to the original is listed under the original's name.
        starts.append(states.get("ort:all", original))
    for number, start in enumerate(starts):
        # Seeded by the model's name, not its place: a resumed run walks the same way.
        rng = np.random.default_rng([seed, zlib.crc32(label.encode()), number])
        _random_walk(recorder, RewriteSession(start, rules, model=label), steps, rng, progress)
        _greedy(recorder, RewriteSession(start, rules, model=label), steps, progress)


def _model_done(
    table: CostTable, label: str, seconds: float, out: str | Path, progress: Progress
) -> None:
    """Mark `label` done in the table's metadata and save the table (atomically)."""
    table.meta["models_done"] = [*table.meta["models_done"], label]
    table.meta.setdefault("seconds", {})[label] = round(seconds, 1)
    table.meta["complete"] = len(table.meta["models_done"]) >= len(table.meta["models"])
    table.save(out)
    progress.set_postfix_str(f"{label} done, {len(table.entries)} operators", refresh=True)


def _model_failed(table: CostTable, label: str, error: RlflowError, out: str | Path) -> None:
    """Record why `label` failed and save the table: the operators of the other models stay."""
    table.meta["models_failed"][label] = first_line(error)
    table.save(out)


def _collect_in_parallel(
    table: CostTable,
    models: Sequence[tuple[str, Graph]],
    out: str | Path,
    run: tuple[OrtSettings, Deployment, int, int, RuleSet],
    progress: Progress,
    jobs: int,
) -> None:
    """`_collect_models` with one model per worker process, `jobs` at a time.

    Rewriting and rule matching (most of a rollout's time on large graphs) run in parallel;
    every timing holds the machine's timing lock (`rlflow.cost.timing_lock`, a temporary
    lock file unless `$RLFLOW_TIMING_LOCK` already names one), so operators are still timed
    one at a time, as in one process. Each finished model's operators are merged into the
    table, which is saved after each as in the serial loop (a killed run keeps them)."""
    import multiprocessing
    import os
    import tempfile
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from rlflow.cost.timing_lock import ENV_VAR

    _, deploy, steps, _, _ = run
    done = set(table.meta["models_done"])
    todo = [(label, graph) for label, graph in models if label not in done]
    progress.update(rollout_steps(deploy, steps) * (len(models) - len(todo)))
    lock_dir = None
    if not os.environ.get(ENV_VAR):
        lock_dir = tempfile.TemporaryDirectory(prefix="rlflow-timing-")
        os.environ[ENV_VAR] = os.path.join(lock_dir.name, "lock")
    try:
        context = multiprocessing.get_context("spawn")  # no forked ORT or torch thread pools
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {
                pool.submit(_collect_one, label, graph, run, table.meta, table.overhead_ms): label
                for label, graph in todo
            }
            for future in as_completed(futures):
                try:
                    part, seconds = future.result()
                except RlflowError as error:
                    _model_failed(table, futures[future], error, out)
                    continue
                table.entries.update(part.entries)
                table.failed.update(part.failed)
                progress.update(rollout_steps(deploy, steps))
                _model_done(table, futures[future], seconds, out, progress)
    finally:
        if lock_dir is not None:
            del os.environ[ENV_VAR]
            lock_dir.cleanup()


def _collect_one(
    label: str,
    original: Graph,
    run: tuple[OrtSettings, Deployment, int, int, RuleSet],
    meta: dict[str, Any],
    overhead_ms: float,
) -> tuple[CostTable, float]:
    """A worker of `_collect_in_parallel`: one model's operators, as a table of their own."""
    settings, deploy, _, _, _ = run
    started = time.perf_counter()
    part = CostTable(meta=dict(meta), overhead_ms=overhead_ms)
    perop = PerOpCostModel(deploy.settings(settings))
    try:
        _rollouts(TableRecorder(part, perop), label, original, run, NO_PROGRESS)
    finally:
        perop.close()
    return part, time.perf_counter() - started


def rollout_steps(deploy: Deployment, steps: int) -> int:
    """Env steps collected per model (for a progress bar): a random walk and a greedy descent
    of `steps` from each rollout start (offline two: the original and ORT's `all` graph)."""
    return (2 if deploy.mode == "offline" else 1) * 2 * steps


def _random_walk(
    recorder: TableRecorder,
    session: RewriteSession,
    steps: int,
    rng: np.random.Generator,
    progress: Progress,
) -> None:
    root = session.fork()
    recorder.record(session.graph)
    for _ in range(steps):
        candidates = session.candidates()
        if not candidates:
            session = root.fork()  # a dead end: start the walk over
            candidates = session.candidates()
            if not candidates:
                progress.update(1)
                continue
        session.apply_candidate(candidates[int(rng.integers(len(candidates)))])
        recorder.record(session.graph)
        progress.update(1)
        progress.set_postfix_str(f"{len(recorder.table.entries)} operators", refresh=False)


def _greedy(
    recorder: TableRecorder, session: RewriteSession, steps: int, progress: Progress
) -> None:
    current = recorder.cost(session.graph)
    for taken in range(steps):
        best_index, best_cost = -1, current
        candidates = session.candidates()
        for index, candidate in enumerate(candidates):
            cost = recorder.cost(candidate.graph)
            if cost < best_cost:
                best_index, best_cost = index, cost
        progress.update(1)
        progress.set_postfix_str(f"{len(recorder.table.entries)} operators", refresh=False)
        if best_index < 0:
            progress.update(steps - taken - 1)  # a local minimum: the rest is not needed
            return
        session.apply_candidate(candidates[best_index])
        current = best_cost


def _resume(out: Path, wanted: Mapping[str, Any]) -> CostTable | None:
    """The table at `out` to continue, None when there is none; RlflowError when it was
    collected under other settings."""
    if not out.exists():
        return None
    table = CostTable.from_json(read_json(out), str(out))
    differ = [
        f"{key} {table.meta.get(key)!r} -> {wanted.get(key)!r}"
        for key in FINGERPRINT
        if table.meta.get(key) != wanted.get(key)
    ]
    if differ:
        raise RlflowError(
            f"{out} holds a table collected with other settings ({'; '.join(differ)}): "
            "give another --out, or remove it to start over"
        )
    return table


__all__ = ["FINGERPRINT", "TableRecorder", "collect_table", "rollout_steps", "table_meta"]
