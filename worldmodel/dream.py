"""The dream: graph rewriting as the world model imagines it, with no real env anywhere.

`DreamBatch` runs many dream episodes at once (a controller's training loop); `DreamEnv` is
the same dynamics as a one-episode gymnasium env (`gymnasium.utils.env_checker.check_env`
passes). A dream starts from the VAE posterior of a real initial graph of the collected data
(its latent distribution, its recorded rule applicability and cost ratio, stored by train-wm);
after that the MDN-RNN predicts everything: the next latent (sampled at temperature tau), the
next cost ratio, the done flag and the next action mask. The reward is the real env's formula
on the predicted costs, r_t = 100 (c_{t-1} - c_t) with c = C / C_0, so a dream return is
100 (c_0 - c_T), as a real one is: a rule then its reverse earns what M says the graph is
worth after both, not two predicted gains. Nothing here imports or steps GraphRewrite-v0 --
RLFlow's code stepped the real env for masks; this one does not.

One thing the dream knows without M: a rule pair (`R` / `R-reverse`) goes one way per episode.
Once R has been applied, R-reverse is not offered for the rest of the episode, and the other
way round; the controller acts under the same rule in the real env (rlflow.worldmodel.policy).
The dream has no graphs to recognise, so without it M's small errors price a rule and its
reverse as two gains and CMA-ES learns the cycle (BERT: a SkipLayerNorm fused and unfused 50
times in a 50-step episode, dream return 73 against 16 real); masking only the reverse of the
last rule was not enough (R, X, R-reverse, Y, R, ...: dream returns 62 against 8-11 real).

Nor does M count sites: a rule is offered for as long as M's mask says so, and on
Transformer-Transducer (2 SkipLayerNorms at the start) CMA-ES learnt to un-fuse one 41 times
an episode, each priced as the data's +0.6 (dream returns 29-33 against -4 to 0.3 real). So a
rule is applied at most as many times an episode as it had sites in the most of any graph of
the data (`WorldModel.most_sites`): with its reverse blocked, more would need sites that other
rewrites create, which no episode of the data showed.

With an ensemble of Ms (`train-wm --ensemble K`) every member steps along: the latent, done
flag and mask still come from M (member 0), the cost is the members' mean, and the reward
is charged `penalty` times the members' disagreement on it (the standard deviation of their
predicted costs, in reward units), as MOPO does (Yu et al., 2020). Members trained on
bootstrap resamples of the episodes agree where many episodes decide a rule's effect and
drift apart where one or two do; M alone prices a rule by whatever it saw (on
Transformer-Transducer a Gemm un-fusion at +0.1 a step from data where it cost -0.2 but once
+3.4), and a controller trained on its dream goes where its errors are gains.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rlflow.errors import RlflowError
from rlflow.worldmodel.mdnrnn import sample_latent
from rlflow.worldmodel.model import WorldModel

MASK_THRESHOLD = 0.5
"""A rule counts as applicable in the dream when M gives it at least this probability."""


class DreamBatch:
    """`groups * episodes` dream episodes stepped together.

    Episode e of every group sees the same random draws (start graph, latent noise, done
    draws): comparing controllers, one per group, on common random numbers.

    Actions are dream actions: 0..A-2 the world model's active rules (`active_rules`), A-1
    stop. An action whose mask entry is 0 is a no-op, fed to M as such (as the real env's
    masked action). An episode ends (terminated) on stop, when M's done flag is drawn, or when
    M predicts no active rule applicable; it is truncated after `max_steps` steps. The
    reverse of every rule applied in the episode is masked, and so is a rule applied as many
    times as its most sites in the data (module docstring). `penalty`: what a unit of the
    ensemble's disagreement on a step's cost costs its reward (0: none; negative: a bonus, for
    a controller that explores; no effect with one member); `disagreement` holds the last
    step's, (n,) in reward units.
    """

    def __init__(
        self,
        world: WorldModel,
        *,
        episodes: int,
        groups: int = 1,
        temperature: float = 1.0,
        max_steps: int = 50,
        rng: np.random.Generator,
        starts: np.ndarray | None = None,
        penalty: float = 0.0,
    ) -> None:
        if episodes < 1 or groups < 1 or max_steps < 1:
            raise RlflowError("dream episodes, groups and max_steps must be at least 1")
        if not math.isfinite(penalty):
            raise RlflowError(f"the uncertainty penalty must be a finite number, got {penalty}")
        self.world, self.episodes, self.groups = world, episodes, groups
        self.penalty = float(penalty)
        self.temperature, self.max_steps, self.rng = temperature, max_steps, rng
        count = len(world.start["mu"])
        self.starts = np.arange(count) if starts is None else np.asarray(starts)
        if not len(self.starts):
            raise RlflowError("the world model has no initial graph to dream from")
        self.size = episodes * groups
        self.z = torch.zeros(self.size, world.latent)
        self.cost = np.ones(self.size)
        self.states: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(world.members)
        self.disagreement = np.zeros(self.size)
        self.mask = np.ones((self.size, world.num_actions), dtype=bool)
        self.reverse = world.reverse_actions
        self.blocked = np.zeros((self.size, world.num_actions), dtype=bool)  # reverses applied
        self.applied = np.zeros((self.size, world.num_actions), dtype=np.int64)
        self.sites = world.most_sites  # None: a world model made before they were recorded
        self.steps = 0

    def _shared(self, draw: np.ndarray) -> np.ndarray:
        """Draws made per episode, repeated for every group."""
        return np.tile(draw, (self.groups,) + (1,) * (draw.ndim - 1))

    @property
    def hidden(self) -> torch.Tensor:
        """M's (member 0's) LSTM output h_t, (n, H): the controller's view of the history."""
        if self.states[0] is None:
            return torch.zeros(self.size, self.world.hidden)
        return self.states[0][0][0]

    def observation(self) -> np.ndarray:
        """(n, Z + H) float32: the controller's input [z, h]."""
        return torch.cat([self.z, self.hidden], dim=1).numpy().astype(np.float32)

    def reset(self) -> tuple[np.ndarray, np.ndarray]:
        """Start every episode; returns the observation (n, Z + H) and mask (n, A)."""
        start = self.world.start
        chosen = self._shared(self.starts[self.rng.integers(len(self.starts), size=self.episodes)])
        noise = self._shared(self.rng.standard_normal((self.episodes, self.world.latent)))
        z = start["mu"][chosen] + np.exp(start["logsigma"][chosen]) * noise
        self.z = torch.as_tensor(z, dtype=torch.float32)
        self.cost = start_costs(start, chosen)
        self.states = [None] * len(self.world.members)
        self.disagreement[:] = 0.0
        applicable = start["applicable"][chosen][:, self.world.active_rules]
        self.mask = np.concatenate([applicable, np.ones((self.size, 1), bool)], axis=1)
        self.blocked[:] = False
        self.applied[:] = 0
        self.steps = 0
        return self.observation(), self.mask.copy()

    @torch.no_grad()
    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step all episodes; (observation, reward, terminated, truncated, mask), each (n, ...).

        Episodes that ended earlier are stepped too (the caller ignores them): keeping the
        batch whole keeps it one LSTM call.
        """
        actions = np.asarray(actions, dtype=np.int64).reshape(self.size)
        world = self.world
        stop = actions == world.num_actions - 1
        valid = self.mask[np.arange(self.size), np.clip(actions, 0, world.num_actions - 1)]
        rules = torch.as_tensor(np.where(valid, world.action_rules(actions), -1)).unsqueeze(1)
        steps, costs = [], []
        for member, rnn in enumerate(world.members):
            output, self.states[member] = rnn(
                self.z.unsqueeze(1),
                rules,
                self.states[member],
                cost=torch.as_tensor(self.cost).unsqueeze(1),
            )
            steps.append(_squeeze_time(output))
            costs.append(steps[-1].cost.numpy().astype(np.float64))
        latent = world.latent
        uniform = self._shared(self.rng.random((self.episodes, latent)))
        normal = self._shared(self.rng.standard_normal((self.episodes, latent)))
        step = steps[0]
        self.z = sample_latent(step, self.temperature, uniform, normal).float()
        cost = np.maximum(np.mean(costs, axis=0), 0.0)  # a cost is never negative
        self.disagreement = 100.0 * np.std(costs, axis=0)
        reward = 100.0 * (self.cost - cost) - self.penalty * self.disagreement
        self.cost = cost
        done_draw = self._shared(self.rng.random(self.episodes))
        done = done_draw < torch.sigmoid(step.done_logit).numpy()
        applicable = torch.sigmoid(step.mask_logits[:, world.active_rules]).numpy()
        applicable = applicable >= MASK_THRESHOLD
        clipped = np.clip(actions, 0, world.num_actions - 1)
        undo = np.where(valid & ~stop, self.reverse[clipped], -1)
        rows = np.flatnonzero(undo >= 0)  # a no-op or stop changes no graph
        self.blocked[rows, undo[rows]] = True
        applicable &= ~self.blocked[:, :-1]
        if self.sites is not None:
            rows = np.flatnonzero(valid & ~stop)
            self.applied[rows, clipped[rows]] += 1
            applicable &= self.applied[:, :-1] < self.sites[:-1]
        self.mask = np.concatenate([applicable, np.ones((self.size, 1), bool)], axis=1)
        self.steps += 1
        terminated = stop & valid | done | ~applicable.any(axis=1)
        truncated = ~terminated & (self.steps >= self.max_steps)
        return self.observation(), reward, terminated, truncated, self.mask.copy()


def default_dream_steps(world: WorldModel) -> int:
    """A dream episode's length unless told otherwise: the real env's `max_episode_steps` (else
    50), cut at the longest episode of the data, past which M has seen no step."""
    limit = world.max_episode_steps
    return min(limit, world.longest_episode) if world.longest_episode > 0 else limit


def uniform_dream_steps(world: WorldModel, episodes: int = 64, seed: int = 0) -> np.ndarray:
    """(episodes,) lengths of dreams under a uniform policy over the applicable dream actions,
    stopping only when nothing else is: how far M lets a controller go.

    A dream ends when M predicts no rule applicable, so dreams far shorter than the data's
    episodes say M's applicability head has not learnt: SqueezeNet's world models, trained on
    12-32 episodes, ended every dream after its first step, and their controllers learnt from
    one step's reward (docs/BENCHMARKS.md). `train-wm` reports the mean."""
    rng = np.random.default_rng(seed)
    batch = DreamBatch(world, episodes=episodes, max_steps=default_dream_steps(world), rng=rng)
    _, mask = batch.reset()
    stop = world.num_actions - 1
    alive = np.ones(episodes, dtype=bool)
    lengths = np.zeros(episodes, dtype=np.int64)
    while alive.any():
        actions = [
            rng.choice(np.flatnonzero(row[:stop])) if row[:stop].any() else stop for row in mask
        ]
        _, _, terminated, truncated, mask = batch.step(np.asarray(actions))
        lengths[alive] += 1
        alive &= ~(terminated | truncated)
    return lengths


def start_costs(start: dict[str, np.ndarray], chosen: np.ndarray) -> np.ndarray:
    """C_0 / C_0 of the chosen start graphs: 1, unless the data recorded otherwise."""
    if "cost" not in start:
        return np.ones(len(chosen))
    return start["cost"][chosen].astype(np.float64)


def _squeeze_time(output: Any) -> Any:
    """An MDNOutput of one time step, without the time axis."""
    return type(output)(**{key: value[:, 0] for key, value in vars(output).items()})


class DreamEnv(gym.Env):
    """Rewrite a graph inside the world model: the controller's training ground.

    ## Action Space

    `Discrete(A)`: actions 0..A-2 apply one of the world model's active rules (`rule_names`,
    the rules that had a candidate somewhere in the collected data), A-1 stops. Which site a
    rule is applied at does not exist in the dream (see rlflow.worldmodel.policy).

    ## Observation Space

    A `Dict`: `latent` (Z + H,) float32, the controller's input [z_t, h_t] (the VAE latent
    and the MDN-RNN's hidden state), and `action_mask` (A,) int8, the rules M predicts
    applicable (probability >= 0.5) plus stop. The mask is also in `info["action_mask"]`.

    ## Rewards

    The real env's r_t = 100 (C_{t-1} - C_t) / C_0 on M's predicted cost ratios C_t / C_0
    (trained on the real env's): the return telescopes to 100 (C_0 - C_T) / C_0, as in the
    real env. `info["cost_ratio"]` is the predicted C_t / C_0.

    ## Starting State

    The VAE posterior of a real initial graph of the collected data, drawn with
    `self.np_random`, and that graph's recorded rule applicability.

    ## Episode End

    Terminated on stop, when M's done flag is drawn (probability sigmoid of its logit), or
    when M predicts no rule applicable; truncated after `max_steps`. A masked action is a
    no-op step, fed to M as such. Once a rule is applied, its reverse is masked for the rest of
    the episode.

    ## Arguments

    - `world`: a `WorldModel` (`WorldModel.load(run_dir)`).
    - `temperature`: tau of the next-latent mixture (default 1.0).
    - `max_steps`: truncation (default: the data's `max_episode_steps`, else 50, cut at the
      data's longest episode).
    - `penalty`: the reward's charge per unit of an ensemble's disagreement on the step's cost
      (default 0; see `DreamBatch`). `info["disagreement"]` is that disagreement.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        world: WorldModel,
        *,
        temperature: float = 1.0,
        max_steps: int | None = None,
        render_mode: str | None = None,
        penalty: float = 0.0,
    ) -> None:
        if temperature <= 0:
            raise RlflowError(f"temperature must be positive, got {temperature}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise RlflowError(f"unknown render mode {render_mode!r}; choose None or 'ansi'")
        if not math.isfinite(penalty):
            raise RlflowError(f"the uncertainty penalty must be a finite number, got {penalty}")
        self.world, self.temperature, self.render_mode = world, temperature, render_mode
        self.penalty = penalty
        self.max_steps = max_steps or default_dream_steps(world)
        self.rule_names = [world.rule_names[rule] for rule in world.active_rules]
        size = world.latent + world.hidden
        self.action_space = spaces.Discrete(world.num_actions)
        self.observation_space = spaces.Dict(
            {
                "latent": spaces.Box(-np.inf, np.inf, (size,), dtype=np.float32),
                "action_mask": spaces.MultiBinary(world.num_actions),
            }
        )
        self._batch: DreamBatch | None = None
        self._return = 0.0

    def _observation(self, latent: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        return {"latent": latent[0], "action_mask": mask[0].astype(np.int8)}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self._batch = DreamBatch(
            self.world,
            episodes=1,
            temperature=self.temperature,
            max_steps=self.max_steps,
            rng=self.np_random,
            penalty=self.penalty,
        )
        latent, mask = self._batch.reset()
        self._return = 0.0
        return self._observation(latent, mask), {"action_mask": mask[0].astype(np.int8), "step": 0}

    def step(
        self, action: int | np.integer
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if self._batch is None:
            raise RlflowError("call reset() before step()")
        if not self.action_space.contains(action):
            raise RlflowError(f"action {action!r} is outside Discrete({self.action_space.n})")
        valid = bool(self._batch.mask[0, int(action)])
        latent, reward, terminated, truncated, mask = self._batch.step(np.array([int(action)]))
        self._return += float(reward[0])
        rule = self.rule_names[int(action)] if int(action) < len(self.rule_names) else None
        info = {
            "action_mask": mask[0].astype(np.int8),
            "step": self._batch.steps,
            "rule": rule,
            "invalid_action": not valid,
            "cost_ratio": float(self._batch.cost[0]),
            "disagreement": float(self._batch.disagreement[0]),
        }
        return (
            self._observation(latent, mask),
            float(reward[0]),
            bool(terminated[0]),
            bool(truncated[0]),
            info,
        )

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._batch is None:
            return None
        offered = [n for n, ok in zip(self.rule_names, self._batch.mask[0]) if ok]
        return (
            f"dream step {self._batch.steps} (tau {self.temperature}), return "
            f"{self._return:.3f}, applicable: {', '.join(offered) or 'none'}"
        )
