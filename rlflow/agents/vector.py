"""Several GraphRewrite-v0 envs stepped together, in process or as Ray actors.

PPO steps `num_envs` envs per policy call (CleanRL's `num_envs x num_steps` rollouts). Both
backends give the same gymnasium `VectorEnv`: batched observations, and an episode that ends
is reset in the same step (`AutoresetMode.SAME_STEP`), its last observation and info kept in
`infos["final_obs"]` and `infos["final_info"]`, so a truncated episode can be bootstrapped
from the state it reached. `inprocess` is gymnasium's `SyncVectorEnv`; `ray` runs each env in
a Ray actor, with its latency measurements sent to the machine's timer actor
(`rlflow.agents.ray_workers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

import rlflow.envs  # noqa: F401  (registers rlflow/GraphRewrite-v0)
from rlflow.envs import GRAPH_REWRITE_ID
from rlflow.errors import RlflowError

BACKENDS = ("inprocess", "ray")


def make_env(models: Sequence[str], horizon: int, env_kwargs: dict[str, Any]) -> gym.Env:
    """One training env: all of `models`, one drawn per episode, truncated at `horizon`."""
    return gym.make(
        GRAPH_REWRITE_ID,
        models=list(models),
        max_episode_steps=horizon,
        disable_env_checker=True,
        **env_kwargs,
    )


def make_vector_env(
    models: Sequence[str],
    horizon: int,
    env_kwargs: dict[str, Any],
    *,
    num_envs: int = 1,
    backend: str = "inprocess",
    ray_address: str | None = None,
) -> VectorEnv:
    """`num_envs` envs of the same settings as one vector env on `backend`."""
    if backend not in BACKENDS:
        raise RlflowError(f"unknown backend {backend!r}; choose {' or '.join(BACKENDS)}")
    if num_envs < 1:
        raise RlflowError(f"num_envs must be at least 1, got {num_envs}")
    if backend == "ray":
        from rlflow.agents.ray_workers import RayVectorEnv

        return RayVectorEnv(list(models), horizon, dict(env_kwargs), num_envs, ray_address)
    return SyncVectorEnv(
        [lambda: make_env(models, horizon, env_kwargs) for _ in range(num_envs)],
        copy=False,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


def unbatch(observations: dict[str, np.ndarray], num_envs: int) -> list[dict[str, np.ndarray]]:
    """A vector env's batched Dict observation as one observation per env (copies, so that
    the next step's batch does not overwrite what a rollout keeps)."""
    return [
        {key: np.array(value[index]) for key, value in observations.items()}
        for index in range(num_envs)
    ]
