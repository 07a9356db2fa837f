"""RLFlow's way to train the controller: PPO on batched dream episodes.

The actor is the linear controller itself (logits = W [z, h] + b, masked to the applicable
dream actions), beside a linear value head. Each iteration rolls `ppo_envs` dream episodes
out at once, computes GAE advantages over them, and takes the PPO update of
`rlflow.agents.update` (X-RLflow's loss, coefficients and step): on the whole rollout at
once, as RLFlow did, without value clipping or a KL stop. Iteration i draws its dreams and
samples from (seed, i, tau), so a resumed run trains as an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from rlflow.agents.update import Evaluate, Rollout, UpdateConfig, ppo_update
from rlflow.nn import MASKED_LOGIT
from rlflow.worldmodel.controller import ControllerTrainer
from rlflow.worldmodel.dream import DreamBatch


class ActorCritic(nn.Module):
    """The linear controller as actor (zero-initialised, as CMA-ES starts), a linear critic."""

    def __init__(self, input_dim: int, num_actions: int) -> None:
        super().__init__()
        self.actor = nn.Linear(input_dim, num_actions)
        self.critic = nn.Linear(input_dim, 1)
        nn.init.zeros_(self.actor.weight)
        nn.init.zeros_(self.actor.bias)

    def policy(self, x: torch.Tensor, mask: torch.Tensor) -> Categorical:
        """The masked categorical over dream actions of inputs x (n, D), mask (n, A)."""
        return Categorical(logits=self.actor(x).masked_fill(~mask, MASKED_LOGIT))

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def params(self) -> np.ndarray:
        """The actor as `LinearController` parameters (W row-major, then b)."""
        weight = self.actor.weight.detach().numpy().astype(np.float64)
        return np.concatenate([weight.reshape(-1), self.actor.bias.detach().numpy()])


class DreamPPOTrainer(ControllerTrainer):
    """One controller's PPO, a rollout and update per step."""

    name, unit = "PPO", "iter"
    postfix = "dream return {dream_return_mean:.2f}"

    def setup(self, state: dict[str, Any] | None) -> None:
        world, settings = self.world, self.settings
        torch.manual_seed(settings.seed)
        self.agent = ActorCritic(world.latent + world.hidden, world.num_actions)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=settings.ppo_lr)
        self.update_config = UpdateConfig(
            update_epochs=settings.ppo_epochs,
            minibatch_size=None,
            clip_coef=settings.clip_coef,
            clip_vloss=False,
            ent_coef=settings.ent_coef,
            target_kl=None,
        )
        if state is not None:
            self.agent.load_state_dict(state["agent"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.done = state["iteration"]

    def step(self) -> dict[str, float]:
        rng = self.dream_rng()
        torch.manual_seed(int(rng.integers(2**31)))
        evaluate, rollout, episode_return = self._rollout(rng)
        stats = ppo_update(evaluate, rollout, self.agent, self.optimizer, self.update_config)
        self.done += 1
        return {
            "dream_return_mean": episode_return.mean(),
            "losses/policy_loss": stats.policy_loss,
            "losses/value_loss": stats.value_loss,
            "losses/entropy": stats.entropy,
        }

    def state(self) -> dict[str, Any]:
        return {
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "iteration": self.done,
        }

    def params(self) -> np.ndarray:
        return self.agent.params()

    @torch.no_grad()
    def _rollout(self, rng: np.random.Generator) -> tuple[Evaluate, Rollout, np.ndarray]:
        """`ppo_envs` dream episodes with the current policy: the update's view of their
        steps, the rollout, and each episode's return."""
        settings, agent = self.settings, self.agent
        batch = DreamBatch(
            self.world,
            episodes=settings.ppo_envs,
            temperature=self.temperature,
            rng=rng,
            **settings.dream_options(self.world),
        )
        obs, mask = batch.reset()
        b_obs, b_masks, b_actions, b_logprobs, b_rewards, b_alive, b_values = ([] for _ in range(7))
        alive = np.ones(batch.size, dtype=bool)
        episode_return = np.zeros(batch.size)
        for _ in range(batch.max_steps):
            x, valid = torch.as_tensor(obs), torch.as_tensor(mask)
            dist = agent.policy(x, valid)
            action = dist.sample()
            b_obs.append(x)
            b_masks.append(valid)
            b_actions.append(action)
            b_logprobs.append(dist.log_prob(action))
            b_values.append(agent.value(x))
            b_alive.append(torch.as_tensor(alive.copy()))
            obs, reward, terminated, truncated, mask = batch.step(action.numpy())
            b_rewards.append(torch.as_tensor(np.where(alive, reward, 0.0), dtype=torch.float32))
            episode_return += np.where(alive, reward, 0.0)
            alive &= ~(terminated | truncated)
            if not alive.any():
                break
        alive_t = torch.stack(b_alive)  # (T, n): step t taken while the episode was running
        values = torch.stack(b_values)
        rewards = torch.stack(b_rewards)
        advantages = gae(rewards, values, alive_t, settings.gamma, settings.gae_lambda)
        keep = alive_t.reshape(-1)
        states = torch.stack(b_obs).reshape(-1, agent.actor.in_features)[keep]
        masks = torch.stack(b_masks).reshape(-1, agent.actor.out_features)[keep]
        actions = torch.stack(b_actions).reshape(-1)[keep]
        rollout = Rollout(
            logprobs=torch.stack(b_logprobs).reshape(-1)[keep],
            values=values.reshape(-1)[keep],
            advantages=advantages.reshape(-1)[keep],
            returns=(advantages + values).reshape(-1)[keep],
        )

        def evaluate(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            dist = agent.policy(states[indices], masks[indices])
            return dist.log_prob(actions[indices]), dist.entropy(), agent.value(states[indices])

        return evaluate, rollout, episode_return


def gae(
    rewards: torch.Tensor, values: torch.Tensor, alive: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """GAE advantages (T, n) of n episodes stepped together; `alive[t]`: step t was taken
    while the episode ran (an ended episode's later steps are padding, bootstrapped from 0)."""
    steps, size = rewards.shape
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros(size)
    for t in reversed(range(steps)):
        next_alive = alive[t + 1].float() if t + 1 < steps else torch.zeros(size)
        next_value = values[t + 1] if t + 1 < steps else torch.zeros(size)
        delta = rewards[t] + gamma * next_value * next_alive - values[t]
        lastgaelam = delta + gamma * lam * next_alive * lastgaelam
        advantages[t] = lastgaelam
    return advantages
