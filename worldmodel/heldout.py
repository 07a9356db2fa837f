"""How good a world model is on rollouts it did not train on, and how well its dream ranks
controllers.

`heldout_report` runs M along real episodes (teacher forcing: z = V's mean of each real
observation, the real actions) and scores each prediction of the next step against what the
real env did: the latent NLL (M's mixture density of the next z), the cost-ratio error
(|C_{t+1}/C_0 predicted - real|), and the accuracy of the done flag and of the next action
mask (per rule, and whole masks right), and for an ensemble of Ms the members' disagreement
on the next cost (the standard deviation of their predictions, in reward units: what the
dream's uncertainty penalty charges). `rank_correlation` is Spearman's rho, for how well
dream returns order controllers as their real returns do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlflow.errors import RlflowError
from rlflow.worldmodel.data import RolloutData
from rlflow.worldmodel.mdnrnn import mdnrnn_losses
from rlflow.worldmodel.model import WorldModel
from rlflow.worldmodel.train import encode_all, episode_sequences, rnn_predictions


@torch.no_grad()
def heldout_report(
    world: WorldModel, data: RolloutData, episodes: Sequence[int] | None = None
) -> dict[str, Any]:
    """M's one-step predictions along `episodes` of `data` (default: all), scored against
    the real next step. `data` must come from an env with the world model's rule list."""
    if data.rule_names != world.rule_names:
        raise RlflowError(
            "the held-out rollouts were collected with another rule list than the world "
            "model's; collect them with the same rlflow and env settings"
        )
    episodes = np.arange(data.num_episodes) if episodes is None else np.asarray(episodes)
    if not len(episodes):
        raise RlflowError("no held-out episode to evaluate the world model on")
    mu, _ = encode_all(world.vae, data)
    sequences = episode_sequences(data, episodes)
    output, targets = rnn_predictions(world.rnn, data, sequences, mu)
    losses = mdnrnn_losses(output, **targets)
    valid, stopped = targets["valid"], targets["stopped"]
    cost_error = (output.cost - targets["next_cost"]).abs()[valid]
    # Stop ends an episode by construction: done is scored where it is news (as M learns it).
    news = valid & ~stopped
    done_right = ((output.done_logit > 0) == targets["done"].bool())[news]
    mask_right = (output.mask_logits > 0) == targets["next_applicable"].bool()
    disagreement = None
    if len(world.members) > 1:
        costs = [output.cost]
        for member in world.members[1:]:
            costs.append(rnn_predictions(member, data, sequences, mu)[0].cost)
        disagreement = float((100.0 * torch.stack(costs).std(dim=0, unbiased=False))[valid].mean())
    return {
        "episodes": len(episodes),
        "steps": int(valid.sum()),
        "latent_nll": float(losses["mdn_nll"]),
        "cost_ratio_mae": float(cost_error.mean()),
        "cost_ratio_max_error": float(cost_error.max()),
        "done_accuracy": float(done_right.float().mean()) if len(done_right) else None,
        "mask_accuracy": float(mask_right[valid].float().mean()),
        "mask_exact": float(mask_right.all(dim=-1)[valid].float().mean()),
        "cost_disagreement": disagreement,
    }


def ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of `values`, ties sharing their mean rank."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranked = np.empty(len(values))
    ranked[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranked[tied] = ranked[tied].mean()
    return ranked


def rank_correlation(dream: Sequence[float], real: Sequence[float]) -> float | None:
    """Spearman's rho of paired returns; None for fewer than 3 pairs or a constant side."""
    if len(dream) != len(real):
        raise ValueError("dream and real returns must pair up")
    if len(dream) < 3:
        return None
    a, b = ranks(dream), ranks(real)
    if a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])
