"""M of World Models: an LSTM over (z_t, a_t) predicting a mixture of Gaussians over z_{t+1},
the next cost ratio C_{t+1} / C_0, the done flag and the next step's per-rule applicability
(the next action mask).

The cost is predicted one of two ways (`cost_head`); the dream derives r_t = 100 (c_t - c_{t+1})
from the costs either way, so a dream return telescopes to 100 (c_0 - c_T) like the real one.

- `"step"` (what `train-wm` trains by default): M predicts the step's change 100 (c_t - c_{t+1})
  from (z_t, a_t) and adds it to the current cost (the true one in training, the dream's own
  in a dream). A rule's effect is learnt as an effect, alike at every site and depth of an
  episode. On BERT's loop data its held-out cost error was 7x lower than the level head's, and
  its controllers held up over the loop's rounds where the level head's fell back (SqueezeNet
  0.829x against 0.744x after one controller round; docs/BENCHMARKS.md). The price: a rule and
  its reverse can both be predicted as gains.
- `"level"` (world models trained before the option; the module's default, so they load as
  they were): M predicts the level c_{t+1} itself, which the LSTM must carry through the
  episode; it extrapolates the trend of the episodes it saw (on BERT it priced an un-fusion
  that slows the graph as a gain after six that sped it up).

The squared error of the cost is reported as `cost_mse`, scaled by 100 as rewards are (so it
is also the error of the reward derived from it, given the true c_t).

Following Ha & Schmidhuber (2018), each latent dimension has its own K-component mixture;
sampling at temperature tau divides the mixture logits by tau and scales sigma by sqrt(tau).
Actions are rule ids: 0..R-1 apply a rule, R stops, R+1 is a masked no-op (never chosen by
the policies here, but representable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
MASK_PRIOR_LOGIT = -4.0
COST_SCALE = 100.0
"""The cost head's raw output is in reward units: 100 (1 - C_{t+1} / C_0) (level head, 0 at
the start) or 100 (C_t - C_{t+1}) / C_0 (step head, the reward)."""
COST_HEADS = ("level", "step")


@dataclass
class MDNOutput:
    log_pi: Tensor  # (..., K, Z) log mixture weights (normalised over K)
    mu: Tensor  # (..., K, Z)
    logsigma: Tensor  # (..., K, Z)
    cost: Tensor  # (...,) predicted next cost ratio C_{t+1} / C_0 (NaN: step head, no C_t given)
    done_logit: Tensor  # (...,)
    mask_logits: Tensor  # (..., R)


class MDNRNN(nn.Module):
    """LSTM over [z_t, embed(a_t)] with a mixture-density head.

    Args:
        latent: Z (default 32).
        num_rules: R; actions are 0..R+1 (see the module docstring).
        hidden: LSTM size (default 256).
        mixtures: K, Gaussians per latent dimension (default 8).
        action_embedding: size of the learned action embedding (default 32).
        cost_head: "level" (default here, for older checkpoints) or "step" (see the module
            docstring).

    Shapes: z (B, T, Z), actions (B, T) long, and for the step head the current cost ratios
    C_t / C_0 (B, T) -> `MDNOutput` with leading dims (B, T), and the LSTM state (h, c), each
    (1, B, hidden).
    """

    def __init__(
        self,
        latent: int = 32,
        num_rules: int = 1,
        hidden: int = 256,
        mixtures: int = 8,
        action_embedding: int = 32,
        cost_head: str = "level",
    ) -> None:
        super().__init__()
        if cost_head not in COST_HEADS:
            raise ValueError(f"cost_head must be one of {COST_HEADS}, got {cost_head!r}")
        self.cost_head = cost_head
        self.latent, self.num_rules = latent, num_rules
        self.hidden, self.mixtures = hidden, mixtures
        self.embed = nn.Embedding(num_rules + 2, action_embedding)
        self.lstm = nn.LSTM(latent + action_embedding, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 3 * mixtures * latent + 2 + num_rules)
        with torch.no_grad():  # most rules are never applicable: start their logits at "no"
            self.head.bias[3 * mixtures * latent + 2 :] = MASK_PRIOR_LOGIT

    @torch.no_grad()
    def set_mask_prior(self, logits: Tensor) -> None:
        """Start the applicability head at `logits` (R,) per rule (with no evidence from h)."""
        self.head.bias[3 * self.mixtures * self.latent + 2 :] = logits.to(self.head.bias.dtype)

    @property
    def stop_action(self) -> int:
        return self.num_rules

    def action_index(self, action_rule: Tensor) -> Tensor:
        """Map stored rule ids (-1 for a no-op) to embedding rows."""
        noop = torch.full_like(action_rule, self.num_rules + 1)
        return torch.where(action_rule < 0, noop, action_rule)

    def forward(
        self,
        z: Tensor,
        actions: Tensor,
        state: tuple[Tensor, Tensor] | None = None,
        cost: Tensor | None = None,
    ) -> tuple[MDNOutput, tuple[Tensor, Tensor]]:
        inputs = torch.cat([z, self.embed(self.action_index(actions))], dim=-1)
        out, state = self.lstm(inputs, state)
        return self.head_output(out, cost), state

    def head_output(self, h: Tensor, cost: Tensor | None = None) -> MDNOutput:
        """The predictions from LSTM outputs h (..., hidden), given the current cost ratios
        (...,) for the step head (without them its `cost` is NaN)."""
        k, z = self.mixtures, self.latent
        raw = self.head(h)
        lead = raw.shape[:-1]
        mixture = raw[..., : 3 * k * z].reshape(*lead, 3, k, z)
        log_pi = torch.log_softmax(mixture[..., 0, :, :], dim=-2)
        logsigma = mixture[..., 2, :, :].clamp(-7.0, 3.0)
        rest = raw[..., 3 * k * z :]
        change = rest[..., 0] / COST_SCALE
        if self.cost_head == "level":
            next_cost = 1.0 - change
        elif cost is None:
            next_cost = torch.full_like(change, float("nan"))
        else:
            next_cost = cost.to(change.dtype) - change
        return MDNOutput(
            log_pi=log_pi,
            mu=mixture[..., 1, :, :],
            logsigma=logsigma,
            cost=next_cost,
            done_logit=rest[..., 1],
            mask_logits=rest[..., 2:],
        )


def mdn_nll(output: MDNOutput, target: Tensor) -> Tensor:
    """-log p(target) per step, summed over latent dims: (...,) from target (..., Z)."""
    target = target.unsqueeze(-2)  # (..., 1, Z) against (..., K, Z)
    log_normal = (
        -0.5 * ((target - output.mu) / output.logsigma.exp()).pow(2)
        - output.logsigma
        - LOG_SQRT_2PI
    )
    return -torch.logsumexp(output.log_pi + log_normal, dim=-2).sum(dim=-1)


def mdnrnn_losses(
    output: MDNOutput,
    next_z: Tensor,
    next_cost: Tensor,
    done: Tensor,
    next_applicable: Tensor,
    valid: Tensor,
    stopped: Tensor | None = None,
) -> dict[str, Tensor]:
    """Mean over valid steps of: `mdn_nll` (per step, summed over z), `cost_mse` (the squared
    error of the cost head in reward units, (100 (c_pred - c_next))^2: the error of the reward
    derived from it given the true current cost), `done_bce` (over the steps that did not stop,
    given `stopped` (B, T)), `mask_bce` (summed over rules); `loss` is their sum. `valid` (B, T)
    masks padding; `next_cost` (B, T) is C_{t+1} / C_0."""
    weight = valid.float()
    count = weight.sum().clamp(min=1.0)
    nll = (mdn_nll(output, next_z) * weight).sum() / count
    cost_error = COST_SCALE * (output.cost - next_cost)
    cost_mse = (cost_error.pow(2) * weight).sum() / count
    # Stop ends a dream episode by construction: done is learnt where it is news, on the
    # steps that applied a rule (the episode ends when no candidate is left).
    done_weight = weight if stopped is None else weight * (~stopped).float()
    done_bce = (
        nn.functional.binary_cross_entropy_with_logits(
            output.done_logit, done.float(), reduction="none"
        )
        * done_weight
    ).sum() / done_weight.sum().clamp(min=1.0)
    mask_bce = (
        nn.functional.binary_cross_entropy_with_logits(
            output.mask_logits, next_applicable.float(), reduction="none"
        ).sum(dim=-1)
        * weight
    ).sum() / count
    return {
        "mdn_nll": nll,
        "cost_mse": cost_mse,
        "done_bce": done_bce,
        "mask_bce": mask_bce,
        "loss": nll + cost_mse + done_bce + mask_bce,
    }


def sample_latent(
    output: MDNOutput, temperature: float, uniform: np.ndarray, normal: np.ndarray
) -> Tensor:
    """Draw z_{t+1} (..., Z) from the mixture at temperature tau, given uniform and standard
    normal draws of shape (..., Z) (numpy, so a seeded gymnasium env stays reproducible): per
    dimension, pick a component from softmax(log_pi / tau), then add sqrt(tau) sigma noise to
    its mean."""
    tau = max(float(temperature), 1e-6)
    weights = torch.softmax(output.log_pi / tau, dim=-2)  # (..., K, Z)
    cumulative = weights.cumsum(dim=-2)
    draw = torch.as_tensor(uniform, dtype=weights.dtype).unsqueeze(-2)
    component = (draw > cumulative).sum(dim=-2).clamp(max=weights.shape[-2] - 1)
    index = component.unsqueeze(-2)
    mu = output.mu.gather(-2, index).squeeze(-2)
    sigma = output.logsigma.gather(-2, index).squeeze(-2).exp()
    noise = torch.as_tensor(normal, dtype=mu.dtype)
    return mu + math.sqrt(tau) * sigma * noise
