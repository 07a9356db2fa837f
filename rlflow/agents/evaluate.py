"""Roll a trained policy out on one model: the sessions `rlflow optimize --agent` chooses from.

Generic over the `Policy` protocol, so PPO and the world model's controller are evaluated by
the same code: the first rollout is greedy, the others sample, and the caller measures the
final graphs end to end (e.g. with `rlflow.search.base.finish`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

import rlflow.envs  # noqa: F401  (registers rlflow/GraphRewrite-v0)
from rlflow.agents.policy import Policy
from rlflow.envs import GRAPH_REWRITE_ID, MAX_EPISODE_STEPS
from rlflow.errors import RlflowError
from rlflow.graph import Graph
from rlflow.rewrite.session import RewriteSession


def policy_rollouts(
    policy: Policy,
    model: str | Graph,
    *,
    episodes: int = 4,
    seed: int = 0,
    size: str = "small",
    env_overrides: dict[str, Any] | None = None,
) -> list[RewriteSession]:
    """Run `episodes` episodes of `policy` on `model` and return each episode's final session.

    The env is `policy.env_config` with `size` and then `env_overrides` applied (e.g. a
    larger `max_nodes` for a full-size model, or `cost="analytic"` to roll out without
    measuring); episodes last at most its `horizon` steps. Rollout 0 is greedy, the others
    sample with `np.random.default_rng(seed)`.
    """
    if episodes < 1:
        raise RlflowError(f"episodes must be at least 1, got {episodes}")
    kwargs = {**policy.env_config, "size": size, **(env_overrides or {})}
    kwargs.pop("models", None)
    horizon = kwargs.get("horizon") or MAX_EPISODE_STEPS
    env = gym.make(
        GRAPH_REWRITE_ID,
        models=[model],
        max_episode_steps=horizon,
        disable_env_checker=True,
        **kwargs,
    )
    rng = np.random.default_rng(seed)
    sessions: list[RewriteSession] = []
    try:
        for episode in range(episodes):
            observation, _ = env.reset(seed=seed + episode)
            done = False
            while not done:
                action = policy.act(
                    observation, deterministic=episode == 0, rng=rng, env=env.unwrapped
                )
                observation, _, terminated, truncated, _ = env.step(action)
                done = terminated or truncated
            sessions.append(env.unwrapped.session.fork())
    finally:
        env.close()
    return sessions
