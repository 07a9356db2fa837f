"""One env's steps of a PPO rollout, and their GAE advantages.

With several envs stepped together (`rlflow.agents.vector`), each env's steps form their own
chain: GAE runs along one env's steps, cut at each episode end, and a rollout that stops
mid-episode bootstraps from the value of the state reached (CleanRL's `next_value`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch_geometric.data import Data


@dataclass
class EnvRollout:
    """One env's steps of a rollout, in order, with what GAE needs at each episode end."""

    states: list[Data] = field(default_factory=list)
    candidates: list[list[Data]] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    ends: list[bool] = field(default_factory=list)
    next_values: list[float] = field(default_factory=list)
    """At an episode end: 0 when terminated, V(s_T) when truncated; NaN elsewhere."""

    @property
    def open(self) -> bool:
        """Whether the last step left an episode running (its value is bootstrapped)."""
        return bool(self.ends) and not self.ends[-1]

    def add(
        self,
        state: Data,
        candidates: list[Data],
        action: int,
        logprob: float,
        reward: float,
        value: float,
        *,
        ended: bool,
        next_value: float | None,
    ) -> None:
        self.states.append(state)
        self.candidates.append(candidates)
        self.actions.append(action)
        self.logprobs.append(logprob)
        self.rewards.append(reward)
        self.values.append(value)
        self.ends.append(ended)
        self.next_values.append(float("nan") if next_value is None else next_value)

    def close(self, next_value: float) -> None:
        """End the rollout mid-episode: its last step bootstraps from V(s_T) = next_value."""
        self.ends[-1] = True
        self.next_values[-1] = next_value

    def advantages(self, gamma: float, gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(GAE advantages, values) of the steps, each episode's chain cut at its end."""
        steps = len(self.rewards)
        values = torch.tensor(self.values, dtype=torch.float32)
        rewards = torch.tensor(self.rewards, dtype=torch.float32)
        advantages = torch.zeros(steps)
        lastgaelam = 0.0
        for t in reversed(range(steps)):
            nextvalue = self.next_values[t] if self.ends[t] else self.values[t + 1]
            delta = rewards[t] + gamma * nextvalue - values[t]
            carry = 0.0 if self.ends[t] else lastgaelam
            lastgaelam = delta + gamma * gae_lambda * carry
            advantages[t] = lastgaelam
        return advantages, values
