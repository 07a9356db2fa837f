"""A real path fed to the dream: what a world model says each rewrite of it is worth.

A controller goes only where its dream says it pays. When the controllers of one world model
miss a graph that another run found (SqueezeNet's blocked layout: every Conv blocked, the
activations moved into the layout and fused, the reorder pairs between them cancelled), the
first question is whether that world model prices the path at all, and which of its steps it
gets wrong. `price_path` feeds a recorded path's rules, one per step, to the MDN-RNN from the
data's start graphs, in many dream episodes at once (as a controller's rollouts see it), and
keeps per step the mean reward without the ensemble's charge, the charge (MOPO's penalty, what
`train-controller --uncertainty` sets), the share of dreams whose M had the rule's mask off
there, and the share that would have ended by then (done drawn, or no rule left on M's mask).

Every step is fed whatever M says -- the mask forced open, done ignored, no reverse or site
bound -- so this prices the path; whether a controller could follow it in the dream is what the
masked and ended shares say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlflow.errors import RlflowError
from rlflow.worldmodel.dream import DreamBatch
from rlflow.worldmodel.model import WorldModel


@dataclass
class PathPrice:
    """Per step of the path (T steps), means over the dream episodes: `reward` (what M's
    predicted cost change pays, r = 100 (c_{t-1} - c_t), before the charge), `charge` (taken
    off it for the ensemble's disagreement), `masked` (share whose M had the rule's mask off),
    `ended` (share that would have ended by this step); `cost` (T + 1,) the mean predicted cost
    ratio from the start."""

    rules: list[str]
    reward: np.ndarray
    charge: np.ndarray
    masked: np.ndarray
    ended: np.ndarray
    cost: np.ndarray

    @property
    def dream_return(self) -> float:
        """What the dream pays for the whole path, the charge taken off."""
        return float(np.sum(self.reward - self.charge))

    def by_rule(self) -> dict[str, dict[str, float]]:
        """Per rule, in order of first use: its steps, and the sums of reward, charge and
        masked share over them."""
        table: dict[str, dict[str, float]] = {}
        for step, rule in enumerate(self.rules):
            row = table.setdefault(rule, {"steps": 0, "reward": 0.0, "charge": 0.0, "masked": 0.0})
            row["steps"] += 1
            row["reward"] += float(self.reward[step])
            row["charge"] += float(self.charge[step])
            row["masked"] += float(self.masked[step])
        return table


def price_path(
    world: WorldModel,
    rules: Sequence[str],
    *,
    episodes: int = 64,
    temperature: float = 1.0,
    penalty: float = 1.0,
    seed: int = 0,
) -> PathPrice:
    """The dream's price of applying `rules` in order (module docstring). Raises RlflowError
    for a rule the world model's data never applied: M has no action for it."""
    rules = list(rules)
    action_of = world.action_of_rule
    unknown = sorted(set(rules) - set(action_of))
    if unknown:
        raise RlflowError(
            f"the world model's data never applied {', '.join(unknown)}: it cannot price the path"
        )
    batch = DreamBatch(
        world,
        episodes=episodes,
        temperature=temperature,
        max_steps=len(rules) + 1,  # never truncated
        rng=np.random.default_rng(seed),
        penalty=penalty,
    )
    batch.reset()
    steps = len(rules)
    reward, charge, masked, ended = (np.zeros(steps) for _ in range(4))
    cost = np.zeros(steps + 1)
    cost[0] = float(np.mean(batch.cost))
    over = np.zeros(episodes, dtype=bool)
    for step, rule in enumerate(rules):
        action = action_of[rule]
        masked[step] = float(np.mean(~batch.mask[:, action]))
        batch.mask[:, action] = True  # fed whatever M says
        _, charged, terminated, _, _ = batch.step(np.full(episodes, action))
        charge[step] = float(np.mean(batch.penalty * batch.disagreement))
        reward[step] = float(np.mean(charged)) + charge[step]
        over |= terminated
        ended[step] = float(np.mean(over))
        cost[step + 1] = float(np.mean(batch.cost))
    return PathPrice(rules, reward, charge, masked, ended, cost)
