"""`rlflow collect --backend ray`: each shard a Ray task, its measurements on a timer actor.

A shard is the unit of work in process and on Ray alike (`rlflow.worldmodel.collect.run_shard`,
seeded from (seed, shard index)), so a Ray run writes the same shards as an in-process one: a
shard's episodes depend on its seed and, for measured costs, on the cached per-op timings,
never on where it ran. A worker sends its shard back and the driver writes it (no file system
shared with the workers is needed) and enters it in the manifest, so a killed run resumes like
an in-process one; an `agent:RUN_DIR` policy must be readable at that path on every machine.
Measurements go to the timer actors of `rlflow.agents.ray_workers` (one per machine offering
`rlflow_timer`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlflow.agents.ray_workers import get, init, pick_timers, remote_measurers
from rlflow.fileio import write_bytes_atomic


def run_shard_with_timer(job: Any, timer: Any) -> tuple[dict[str, Any], bytes]:
    """`run_shard` in a Ray worker, its env's measurements sent to `timer` (None: the env
    measures nothing); the shard's manifest entry and its bytes, for the driver to write (the
    worker's machine need not see DATA_DIR)."""
    from rlflow.worldmodel.collect import CollectSettings, run_shard

    if timer is not None:
        settings = CollectSettings(**job.settings)
        measurers = remote_measurers(env_arguments(settings), timer)
        job = replace(job, settings={**job.settings, "env": {**settings.env, **measurers}})
    with tempfile.TemporaryDirectory(prefix="rlflow-shard-") as scratch:
        local = replace(job, path=str(Path(scratch) / Path(job.path).name))
        entry = run_shard(local)
        return entry, Path(local.path).read_bytes()


def env_arguments(settings: Any) -> dict[str, Any]:
    """The env arguments of `settings` that say whether it measures: cost and deploy."""
    policy = settings.make_policy()
    return {**policy.env_config, **settings.env_kwargs()}


def collect_on_ray(
    settings: Any,
    jobs: list[Any],
    finished: Callable[[dict[str, Any]], None],
    on_steps: Callable[[int], object],
    address: str | None = None,
) -> None:
    """Run the shard `jobs` as Ray tasks (one CPU each), calling `finished` with each shard's
    manifest entry as it comes back."""
    ray = init(address)
    task = ray.remote(num_cpus=1)(run_shard_with_timer)
    timers = pick_timers(ray, env_arguments(settings), len(jobs))
    paths = {}
    for job, timer in zip(jobs, timers, strict=True):
        paths[task.remote(job, timer)] = Path(job.path)
    pending = list(paths)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            entry, payload = get(ray, done[0])
            write_bytes_atomic(paths[done[0]], payload)
            on_steps(entry["steps"])
            finished(entry)
    finally:
        for reference in pending:  # a failed or interrupted run leaves no task running
            ray.cancel(reference, force=True)
