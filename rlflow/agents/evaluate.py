"""Roll a trained policy out on one model: the sessions `rlflow optimize --agent` chooses from.

Generic over the `Policy` protocol, so PPO and the world model's controller are evaluated by
the same code: the first rollout is greedy, the others sample, and the caller measures the
graphs end to end (e.g. with `rlflow.search.base.finish`). Each episode also keeps the
cheapest graph it passed (by the env's own cost, priced anyway for the reward): an agent that
overshoots loses nothing it had found, as a search keeps the best graph it expanded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

import rlflow.envs  # noqa: F401  (registers rlflow/GraphRewrite-v0)
from rlflow.agents.policy import Policy
from rlflow.envs import GRAPH_REWRITE_ID, MAX_EPISODE_STEPS
from rlflow.errors import RlflowError
from rlflow.graph import Graph
from rlflow.rewrite.session import RewriteSession


@dataclass
class Rollout:
    """One episode: where it ended, and the cheapest point it passed if cheaper than the end."""

    final: RewriteSession
    best: RewriteSession | None = None

    @property
    def sessions(self) -> list[RewriteSession]:
        return [self.final] if self.best is None else [self.final, self.best]


def policy_rollouts(policy: Policy, model: str | Graph, **options: Any) -> list[RewriteSession]:
    """Each episode's final session of `agent_rollouts(policy, model, **options)`."""
    return [rollout.final for rollout in agent_rollouts(policy, model, **options)]


def agent_rollouts(
    policy: Policy,
    model: str | Graph,
    *,
    episodes: int = 4,
    seed: int = 0,
    size: str = "small",
    env_overrides: dict[str, Any] | None = None,
) -> list[Rollout]:
    """Run `episodes` episodes of `policy` on `model`: each one's final and cheapest session.

    The env is `policy.env_config` with `size` and then `env_overrides` applied (e.g. a
    larger `max_nodes` for a full-size model, or `cost="analytic"` to roll out without
    measuring); episodes last at most its `horizon` steps (a controller's: its data's episode
    limit, `policy.max_episode_steps`). Rollout 0 is greedy, the others sample with
    `np.random.default_rng(seed)`.
    """
    if episodes < 1:
        raise RlflowError(f"episodes must be at least 1, got {episodes}")
    kwargs = {**policy.env_config, "size": size, **(env_overrides or {})}
    kwargs.pop("models", None)
    # A controller acts in the env its data came from: its limit may be longer than the
    # default, and the step fraction it observes depends on it.
    limit = getattr(policy, "max_episode_steps", None)
    horizon = kwargs.get("horizon") or limit or MAX_EPISODE_STEPS
    env = gym.make(
        GRAPH_REWRITE_ID,
        models=[model],
        max_episode_steps=horizon,
        disable_env_checker=True,
        **kwargs,
    )
    rng = np.random.default_rng(seed)
    rollouts: list[Rollout] = []
    try:
        for episode in range(episodes):
            observation, _ = env.reset(seed=seed + episode)
            done, best, best_cost, cost = False, None, float("inf"), float("inf")
            while not done:
                action = policy.act(
                    observation, deterministic=episode == 0, rng=rng, env=env.unwrapped
                )
                observation, _, terminated, truncated, info = env.step(action)
                done = terminated or truncated
                cost = float(info["cost"])
                if not done and cost < best_cost:
                    best, best_cost = env.unwrapped.session.fork(), cost
            final = env.unwrapped.session.fork()
            rollouts.append(Rollout(final, best if best_cost < cost else None))
    finally:
        env.close()
    return rollouts
