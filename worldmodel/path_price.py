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

`price_path_forced` asks the other question: M fed the real path -- V's latent of each real
graph on it and its real cost ratio, as M is trained (teacher forced) -- so each step is
priced from where the path really is. A step priced right there and wrong in the dream is an
error M compounds over its own predictions; a step priced wrong even there is one M never
learnt. `real_path_observations` replays a recorded path in the real env for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rlflow.errors import RlflowError
from rlflow.nn.features import GLOBAL_FEATURES
from rlflow.rewrite.session import EpisodeState, recorded_candidate
from rlflow.worldmodel.dream import MASK_THRESHOLD, DreamBatch
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


def known_actions(world: WorldModel, rules: Sequence[str]) -> dict[str, int]:
    """The world model's rule-name to dream-action map; RlflowError if the path has a rule the
    data never applied (M has no action for it)."""
    action_of = world.action_of_rule
    unknown = sorted(set(rules) - set(action_of))
    if unknown:
        raise RlflowError(
            f"the world model's data never applied {', '.join(unknown)}: it cannot price the path"
        )
    return action_of


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
    action_of = known_actions(world, rules)
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


@torch.no_grad()
def price_path_forced(
    world: WorldModel,
    observations: Sequence[dict[str, np.ndarray]],
    rules: Sequence[str],
    *,
    penalty: float = 1.0,
) -> PathPrice:
    """M's price of each step of a real path from where the path really is (module docstring):
    `observations` are the real env's T + 1 observations along it (start first), `rules` the T
    rules applied. `reward` is 100 (c_t - c'_{t+1}) with c_t the real cost ratio and c' the
    members' mean prediction, `charge` their disagreement times `penalty`, `masked` whether M's
    mask had the rule off before its step (never at the start: that mask is the real one),
    `ended` the chance that M's done flag ended the episode by each step, and `cost` the real
    cost ratios (T + 1) M was fed."""
    rules = list(rules)
    if len(observations) != len(rules) + 1:
        raise RlflowError(f"{len(rules)} rules need {len(rules) + 1} observations")
    action_of = known_actions(world, rules)
    mu, _ = world.encode(list(observations))
    column = GLOBAL_FEATURES.index("cost_ratio")
    ratios = np.array([obs["global_features"][column] for obs in observations], dtype=np.float64)
    rule_ids = world.action_rules(np.array([action_of[rule] for rule in rules], dtype=np.int64))
    z = mu.unsqueeze(0)[:, :-1]
    actions = torch.as_tensor(rule_ids).unsqueeze(0)
    current = torch.as_tensor(ratios[:-1], dtype=torch.float32).unsqueeze(0)
    outputs = [rnn(z, actions, cost=current)[0] for rnn in world.members]
    predicted = np.stack([output.cost[0].numpy().astype(np.float64) for output in outputs])
    reward = 100.0 * (ratios[:-1] - np.maximum(predicted.mean(axis=0), 0.0))
    charge = penalty * 100.0 * predicted.std(axis=0)
    steps = len(rules)
    masked = np.zeros(steps)
    if steps > 1:  # the mask of step t is M's prediction after step t - 1
        logits = outputs[0].mask_logits[0, :-1].numpy()
        chance = 1.0 / (1.0 + np.exp(-logits[np.arange(steps - 1), rule_ids[1:]]))
        masked[1:] = chance < MASK_THRESHOLD
    done = torch.sigmoid(outputs[0].done_logit[0]).numpy().astype(np.float64)
    ended = 1.0 - np.cumprod(1.0 - done)
    return PathPrice(rules, reward, charge, masked, ended, ratios)


def real_path_observations(env, state: EpisodeState) -> list[dict[str, np.ndarray]]:
    """The real env's observations along a recorded path (start first): `env`, made on the
    path's model alone (`rlflow.worldmodel.evaluate.real_env`), is reset and stepped through
    the candidate slot of each recorded rewrite. RlflowError where the env does not offer a
    step (another start state, or a candidate cap that left it out)."""
    observation, _ = env.reset()
    observations = [observation]
    unwrapped = env.unwrapped
    for step, action in enumerate(state.actions):
        offered = unwrapped.offered_candidates()
        candidate = recorded_candidate(offered, action)
        if candidate is None:
            raise RlflowError(
                f"step {step} of the path ({action.rule}) is not among the env's "
                f"{len(offered)} candidates there: not the start state or the env the path had"
            )
        observation, *_ = env.step(offered.index(candidate))
        observations.append(observation)
    return observations
