"""The PPO update: clipped surrogate, value loss and entropy bonus, one copy for both learners.

X-RLflow's PPO over the env (`rlflow.agents.ppo`) and RLFlow's PPO in the world model's dream
(`rlflow.worldmodel.dream_ppo`) differ in how they act and collect, not in how they learn from
a rollout: each hands `ppo_update` its rollout and a way to re-evaluate the taken actions,
with its coefficients in an `UpdateConfig`, whose defaults are X-RLflow's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class UpdateConfig:
    """How one PPO update uses a rollout (CleanRL's names)."""

    update_epochs: int = 4  # passes over the rollout
    minibatch_size: int | None = 16  # states per gradient step; None: the whole rollout
    norm_adv: bool = True  # normalise advantages within each minibatch
    clip_coef: float = 0.2  # the surrogate's clipping coefficient
    clip_vloss: bool = True  # clip the value loss as the surrogate is clipped
    ent_coef: float = 0.01  # coefficient of the entropy bonus
    vf_coef: float = 0.5  # coefficient of the value loss
    max_grad_norm: float = 0.5  # global gradient-norm clip
    target_kl: float | None = 0.05  # stop the epochs once the approximate KL passes this


@dataclass(frozen=True)
class Rollout:
    """What the update needs of N collected steps, as (N,) tensors."""

    logprobs: Tensor  # log-probability of each action when it was taken
    values: Tensor  # the value estimate of each state then
    advantages: Tensor
    returns: Tensor  # advantages + values: the value target


@dataclass(frozen=True)
class UpdateStats:
    """The last minibatch's losses and KL estimates, and the clip fraction over the update."""

    policy_loss: float
    value_loss: float
    entropy: float
    old_approx_kl: float
    approx_kl: float
    clipfrac: float


Evaluate = Callable[[np.ndarray], tuple[Tensor, Tensor, Tensor]]
"""Steps' indices -> (log-probability of their taken actions, entropy, value) under the
current network, with gradients."""


def ppo_update(
    evaluate: Evaluate,
    rollout: Rollout,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: UpdateConfig,
) -> UpdateStats:
    """Clipped-objective gradient steps on `model` over `rollout`: `config.update_epochs`
    passes in shuffled minibatches (numpy's global RNG, which the caller seeds), or the whole
    rollout in order when `minibatch_size` is None."""
    steps = len(rollout.logprobs)
    indices = np.arange(steps)
    size = steps if config.minibatch_size is None else config.minibatch_size
    clipfracs: list[float] = []
    pg_loss = v_loss = entropy_loss = approx_kl = old_approx_kl = torch.tensor(0.0)
    for _epoch in range(config.update_epochs):
        if config.minibatch_size is not None:
            np.random.shuffle(indices)
        for start in range(0, steps, size):
            mb_inds = indices[start : start + size]
            newlogprob, entropy, newvalue = evaluate(mb_inds)
            logratio = newlogprob - rollout.logprobs[mb_inds]
            ratio = logratio.exp()
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs.append(((ratio - 1.0).abs() > config.clip_coef).float().mean().item())

            mb_advantages = rollout.advantages[mb_inds]
            if config.norm_adv and len(mb_inds) > 1:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                    mb_advantages.std() + 1e-8
                )

            # Policy loss
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(
                ratio, 1 - config.clip_coef, 1 + config.clip_coef
            )
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()

            # Value loss
            mb_returns = rollout.returns[mb_inds]
            if config.clip_vloss:
                mb_values = rollout.values[mb_inds]
                v_loss_unclipped = (newvalue - mb_returns) ** 2
                v_clipped = mb_values + torch.clamp(
                    newvalue - mb_values, -config.clip_coef, config.clip_coef
                )
                v_loss_clipped = (v_clipped - mb_returns) ** 2
                v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
            else:
                v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()

            entropy_loss = entropy.mean()
            loss = pg_loss - config.ent_coef * entropy_loss + v_loss * config.vf_coef

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()

        if config.target_kl is not None and approx_kl > config.target_kl:
            break
    return UpdateStats(
        policy_loss=pg_loss.item(),
        value_loss=v_loss.item(),
        entropy=entropy_loss.item(),
        old_approx_kl=old_approx_kl.item(),
        approx_kl=approx_kl.item(),
        clipfrac=float(np.mean(clipfracs)),
    )
