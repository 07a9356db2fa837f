"""`train-controller --eval-real`: the dream controllers in the real env, measured end to end.

For every temperature's controller and every model: one deterministic real episode (the
return is the env's, 100 (C_0 - C_T) / C_0 in its cost source), then the cheapest graph the
episode passed -- the one `rlflow optimize --agent` and `bench` hand back for it -- timed
against the original in one interleaved onnxruntime run (`Runner.compare`, the search
baselines' way) for the real measured speedup; the dream return of the same controller at the
same tau gives the dream-vs-real gap (World Models' temperature table). RLFlow's random agent
gives the baseline return. Real env steps and real measurements are counted throughout.

With `eval_patience` an episode ends once that many steps have passed without a cheaper graph:
past its cheapest graph a controller only spends real steps, which the world model's budget
counts (on SqueezeNet one controller found its best graph at step 52 and ran on to the
horizon, 100). It is off by default because it also cuts a path that loses before it gains:
on SqueezeNet patience 10 stopped a controller at step 26 whose best graph, 1.19x against
its start where the others reached 1.10-1.14x, came at step 72 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlflow.errors import RlflowError
from rlflow.worldmodel.collect import RandomPolicy
from rlflow.worldmodel.controller import (
    CONTROLLER_CHECKPOINT,
    SCORE_KEYS,
    ControllerSettings,
    dream_returns,
    selected_temperature,
    tau_dir,
)
from rlflow.worldmodel.model import WorldModel
from rlflow.worldmodel.policy import env_config, policy_from_checkpoint


def real_env(world: WorldModel, model: str) -> Any:
    """GraphRewrite-v0 on one model, with the settings of the world model's data, its start
    state and deploy mode included (`env_config`, as the controller's own rollouts use)."""
    import gymnasium as gym

    from rlflow.envs import GRAPH_REWRITE_ID

    steps = world.max_episode_steps
    return gym.make(GRAPH_REWRITE_ID, models=[model], max_episode_steps=steps, **env_config(world))


def run_episode(
    env: Any, policy: Any, *, seed: int, deterministic: bool, patience: int = 0
) -> dict[str, Any]:
    """One real episode: its return, steps, rules, the env's final graph and the cheapest one
    it passed (by the env's cost; the start counts), ended early after `patience` steps
    without a cheaper graph (0: never)."""
    rng = np.random.default_rng(seed)
    observation, info = env.reset(seed=seed)
    if hasattr(policy, "reset"):
        policy.reset()
    unwrapped = env.unwrapped
    total, steps, rules = 0.0, 0, []
    best_cost, best_graph, best_step = float(info["cost"]), unwrapped.current_graph(), 0
    best_speedup = float(info["speedup"])
    while True:
        action = policy.act(observation, deterministic=deterministic, rng=rng, env=unwrapped)
        observation, reward, terminated, truncated, info = env.step(action)
        total += reward
        steps += 1
        if info.get("rule"):
            rules.append(info["rule"])
        if float(info["cost"]) < best_cost:
            best_cost, best_step = float(info["cost"]), steps
            best_graph, best_speedup = unwrapped.current_graph(), float(info["speedup"])
        if terminated or truncated or (patience and steps - best_step >= patience):
            break
    return {
        "return": float(total),
        "steps": steps,
        "rules": rules,
        "graph": unwrapped.current_graph(),
        "original": unwrapped.session.original,
        "env_speedup": float(info["speedup"]),
        "best_graph": best_graph,
        "best_step": best_step,
        "best_env_speedup": best_speedup,
    }


def check_measured(settings: ControllerSettings, measure: bool, how: str = "") -> None:
    """Refuse `select: speedup` where the controllers' graphs will not be timed."""
    if settings.select == "speedup" and not measure:
        raise RlflowError(
            "select speedup picks the temperature by measured end-to-end speedup"
            + (f": {how}" if how else ", and nothing is measured here")
        )


def evaluate_real(
    run_dir: str | Path,
    world: WorldModel,
    settings: ControllerSettings,
    models: Sequence[str],
    *,
    random_episodes: int = 8,
    seed: int = 0,
    measure: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """The temperature table: per tau, dream return, real return, gap and measured speedup;
    `selected_temperature` is the tau the run's policy uses from now on (`settings.select`)."""
    from tqdm import tqdm

    from rlflow.cost import OrtSettings, Runner, geometric_mean

    if not models:
        raise RlflowError("give at least one model to evaluate on")
    check_measured(settings, measure)
    run_dir = Path(run_dir)
    ort_level = str(world.meta["env"].get("ort_level", "all"))
    provider = str(world.meta["env"].get("provider", "auto"))  # the data's, if it named one
    runner = (
        Runner(OrtSettings(threads=1, ort_level=ort_level, provider=provider)) if measure else None
    )
    policies = {
        tau: policy_from_checkpoint(world, tau_dir(run_dir, tau) / CONTROLLER_CHECKPOINT)
        for tau in settings.temperatures
    }
    rows: dict[str, dict[str, Any]] = {}
    per_model: list[dict[str, Any]] = []
    real_steps = 0
    env_measurements = 0
    random_returns: dict[str, float] = {}
    total = len(models) * (len(policies) + random_episodes)
    bar = tqdm(total=total, desc="eval-real", unit="ep", file=sys.stderr, disable=not progress)
    starts_by_model = _starts_by_model(world, models)
    for model in models:
        env = real_env(world, model)
        try:
            returns = []
            random_policy = RandomPolicy()
            for episode in range(random_episodes):
                result = run_episode(env, random_policy, seed=seed + episode, deterministic=False)
                returns.append(result["return"])
                real_steps += result["steps"]
                bar.update(1)
            random_returns[model] = float(np.mean(returns)) if returns else float("nan")
            for tau, policy in policies.items():
                result = run_episode(
                    env, policy, seed=seed, deterministic=True, patience=settings.eval_patience
                )
                real_steps += result["steps"]
                speedup, original_ms, optimized_ms = None, None, None
                if runner is not None:
                    graphs = [result["original"], result["best_graph"]]
                    comparison = runner.compare(graphs)
                    speedup = comparison.speedups[1]
                    original_ms, optimized_ms = comparison.scaled_ms
                rng = np.random.default_rng([seed, int(tau * 1000)])
                dream = float(
                    dream_returns(
                        world,
                        policy.controller.params[None],
                        episodes=settings.eval_dream_episodes,
                        temperature=tau,
                        rng=rng,
                        starts=starts_by_model.get(model),
                        **settings.dream_options(world),
                    )[0]
                )
                per_model.append(
                    {
                        "model": model,
                        "temperature": tau,
                        "dream_return": dream,
                        "real_return": result["return"],
                        "gap": dream - result["return"],
                        "speedup": speedup,
                        "env_speedup": result["env_speedup"],
                        "best_env_speedup": result["best_env_speedup"],
                        "original_ms": original_ms,
                        "optimized_ms": optimized_ms,
                        "steps": result["steps"],
                        "best_step": result["best_step"],
                        "rules_applied": _count(result["rules"]),
                        "random_return": random_returns[model],
                    }
                )
                bar.update(1)
            env_measurements += env.unwrapped.real_measurements
        finally:
            env.close()
    bar.close()
    for tau in policies:
        entries = [entry for entry in per_model if entry["temperature"] == tau]
        dream = float(np.mean([entry["dream_return"] for entry in entries]))
        real = float(np.mean([entry["real_return"] for entry in entries]))
        rows[f"{tau:g}"] = {
            "temperature": tau,
            "dream_return": dream,
            "real_return": real,
            "gap": dream - real,
            "speedup": (
                geometric_mean([entry["speedup"] for entry in entries]) if measure else None
            ),
            "random_return": float(np.mean(list(random_returns.values()))),
        }
    measurements = env_measurements + (runner.sessions_built if runner is not None else 0)
    score = SCORE_KEYS.get(settings.select, "real_return")  # select temperature ignores it
    scores = {row["temperature"]: row[score] for row in rows.values()}
    return {
        "temperatures": rows,
        "selected_temperature": selected_temperature(settings.temperature, settings.select, scores),
        "per_model": per_model,
        "random_returns": random_returns,
        "real_env_steps": real_steps,
        "real_measurements": measurements,
        "measured": measure,
        "ort_level": ort_level,
        "threads": 1,
    }


def _starts_by_model(world: WorldModel, models: Sequence[str]) -> dict[str, np.ndarray]:
    """Dream starts of each evaluated model that the data has (else: all starts)."""
    known = list(world.meta.get("models", []))
    starts = {}
    for model in models:
        if model in known:
            indices = np.flatnonzero(world.start["model"] == known.index(model))
            if len(indices):
                starts[model] = indices
    return starts


def _count(rules: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rule in rules:
        counts[rule] = counts.get(rule, 0) + 1
    return counts


def temperature_table(report: dict[str, Any]) -> str:
    """The World Models tau table as text."""
    lines = [
        f"{'tau':>6} {'dream return':>13} {'real return':>12} {'gap':>8} "
        f"{'speedup':>8} {'random':>8}"
    ]
    for row in report["temperatures"].values():
        speedup = f"{row['speedup']:>7.3f}x" if row["speedup"] is not None else f"{'-':>8}"
        lines.append(
            f"{row['temperature']:>6g} {row['dream_return']:>13.3f} {row['real_return']:>12.3f} "
            f"{row['gap']:>8.3f} {speedup} {row['random_return']:>8.3f}"
        )
    lines.append(
        "returns: 100 (C_0 - C_T) / C_0 in the env's cost; speedup: measured end to end, the "
        "episode's start vs the cheapest graph it passed, interleaved, each under the settings "
        f"it declares (offline: as written), else ort-level {report['ort_level']}; 1 thread"
    )
    return "\n".join(lines)
