"""C of World Models: a linear controller on [z, h], its settings, and its dream return.

The controller picks a *rule* (or stop) of the world model's dream: logits = W [z_t, h_t] + b
over the active rules and stop, masked to the applicable ones, argmax. It is trained in the
dream only, one controller per dream temperature tau (`rlflow.worldmodel.train_controller`,
by CMA-ES as in World Models, `cmaes`, or by PPO as in RLFlow, `dream_ppo`); how it then
acts in the real env, where a rule must become a candidate, is `rlflow.worldmodel.policy`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlflow.agents.update import UpdateConfig
from rlflow.errors import RlflowError
from rlflow.worldmodel.dream import DreamBatch
from rlflow.worldmodel.model import WorldModel

if TYPE_CHECKING:
    from rlflow.worldmodel.imitation import PathExamples

METHODS = ("cmaes", "ppo")
SELECTIONS = ("real-return", "speedup", "temperature")
SCORE_KEYS = {"real-return": "real_return", "speedup": "speedup"}
"""The eval-real column each scoring `select` ranks a run's temperatures by."""
HORIZONS = ("data", "max-steps")
WORLD_BUNDLE = "world_model.pt"
CONTROLLER_CHECKPOINT = "controller.pt"
EVAL_REPORT = "eval.json"  # the controllers in the real env (--eval-real, the loop)


def progress_record(
    cost: Mapping[str, int],
    row: Mapping[str, Any] | None,
    episodes: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """A controller run's progress.json, what the sample-efficiency comparison with PPO reads
    (`rlflow bench`): the real steps and measurements behind it (`cost`: real_env_steps,
    real_measurements and their collect_/eval_ parts), none in the dream, and, where its
    controllers ran in the real env, the kept tau's `row` (speedup, real and dream return) and
    its real `episodes`. `train-controller` and the loop's rounds both write it."""
    progress: dict[str, Any] = {
        "kind": "controller",
        "global_step": cost["real_env_steps"],
        **cost,
        "dream_real_env_steps": 0,
        **extra,
    }
    if row is not None:
        progress.update(
            speedup=row["speedup"],
            real_return=row["real_return"],
            dream_return=row["dream_return"],
            episodes=episodes,
        )
    return progress


def tau_dir(run_dir: Path, temperature: float) -> Path:
    """Where the controller trained at temperature tau lives inside a controller run."""
    return Path(run_dir) / f"tau-{temperature:g}"


@dataclass
class ControllerSettings:
    """Hyperparameters of `rlflow train-controller` (mirrored by configs/worldmodel.yaml)."""

    method: str = "cmaes"  # cmaes (World Models) | ppo (RLFlow)
    temperature: float = 1.0  # tau of the controller the run's policy uses (see `select`)
    temperatures: list[float] = field(default_factory=lambda: [0.5, 1.0, 1.5])  # the tau table
    select: str = "real-return"
    """Which tau's controller the run's policy is: real-return (the best real return, once the
    controllers ran in the real env: --eval-real, or the loop; until then `temperature`) |
    speedup (the best end-to-end speedup of its cheapest graph, measured there: one timing per
    tau, for a reward whose per-op prices can rank graphs unlike end-to-end latency) |
    temperature (always `temperature`). World Models reads its tau table the same way: the
    dream trains, the real env picks."""
    max_steps: int = 50  # dream episode truncation (the real env's max_episode_steps)
    dream_horizon: str = "data"
    """How many steps a dream episode (and the controller's real one) may take: data (the
    longest episode of the world model's data, at most max_steps) | max-steps. Past the
    longest episode M has seen no step: with 5-step random episodes and a 50-step dream, BERT's
    dream returns were 28-63 against real -2 to 12, the controllers farming M's extrapolation."""
    uncertainty: float = 1.0
    """What a dream step's reward is charged per unit of the world model's ensemble
    disagreement on its cost (MOPO's lambda; 0: none): the controller is kept where its world
    model's members agree. Negative, the disagreement is a bonus: an exploring controller, sent
    to collect data where the world model is unsure, as optimism under uncertainty does. A world
    model of one M (`train-wm --ensemble 1`, or made before ensembles) has no disagreement."""
    generations: int = 40  # CMA-ES generations
    population: int = 16  # CMA-ES population size
    sigma0: float = 0.1  # CMA-ES initial step size
    rollouts: int = 8  # dream episodes per CMA-ES evaluation, common to the population
    diagonal_above: int = 2000  # separable CMA-ES above this many controller parameters
    ppo_iterations: int = 60  # PPO rollout-update iterations
    ppo_envs: int = 32  # PPO dream episodes per iteration
    ppo_epochs: int = 4  # PPO optimisation passes per iteration
    ppo_lr: float = 3e-3  # PPO Adam learning rate
    gamma: float = 0.99  # PPO discount
    gae_lambda: float = 0.95  # PPO GAE lambda
    clip_coef: float = UpdateConfig.clip_coef  # PPO clipped-objective epsilon
    ent_coef: float = UpdateConfig.ent_coef  # PPO entropy bonus
    eval_dream_episodes: int = 64  # dream episodes for each controller's final dream return
    eval_patience: int = 0
    """Real evaluation (--eval-real, the loop): a controller's episode ends after this many
    steps without a graph cheaper than its cheapest so far (0: at its stop or the horizon).
    The graph timed is the cheapest passed either way; the steps after it count against the
    world model's real-step budget and buy nothing unless a cheaper graph follows, which a path
    that loses for more than `eval_patience` steps before it gains never reaches."""
    imitation: float = 0.0
    """CMA-ES from a search's path (`rlflow.worldmodel.imitation`): the weight, per nat, of the
    path's log-likelihood in the fitness at the first generation, fading linearly to nothing by
    the last; the search starts at the controller cloned from the path. 0: from zero, none."""
    imitate: str | None = None
    """The `demo:` collection whose first walk is that path (`rlflow collect --policy
    demo:RESULT.json`; the loop's `--demo` fills it in)."""
    seed: int = 0  # seed of CMA-ES / PPO and of the dream draws

    def validate(self) -> None:
        if self.method not in METHODS:
            raise RlflowError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not self.temperatures or any(t <= 0 for t in self.temperatures):
            raise RlflowError("temperatures must be a non-empty list of positive numbers")
        if self.dream_horizon not in HORIZONS:
            raise RlflowError(
                f"unknown dream_horizon {self.dream_horizon!r}; choose one of {', '.join(HORIZONS)}"
            )
        if self.select not in SELECTIONS:
            raise RlflowError(
                f"unknown select {self.select!r}; choose one of {', '.join(SELECTIONS)}"
            )
        if self.temperature not in self.temperatures:
            raise RlflowError(
                f"temperature {self.temperature} is not among temperatures {self.temperatures}"
            )
        small = min(self.generations, self.population, self.rollouts, self.max_steps)
        if small < 1 or min(self.ppo_iterations, self.ppo_envs, self.ppo_epochs) < 1:
            raise RlflowError("generations, population, rollouts, max_steps and ppo_* must be >= 1")
        if self.population < 2:
            raise RlflowError("CMA-ES needs a population of at least 2")
        if self.eval_patience < 0:
            raise RlflowError(f"eval_patience must be at least 0, got {self.eval_patience}")
        if not math.isfinite(self.uncertainty):
            raise RlflowError(f"uncertainty must be a finite number, got {self.uncertainty}")
        if not (math.isfinite(self.imitation) and self.imitation >= 0):
            raise RlflowError(f"imitation must be a number >= 0, got {self.imitation}")
        if self.imitation > 0 and self.method != "cmaes":
            raise RlflowError(
                "imitation is for the cmaes method (PPO from a path: rlflow train-ppo --demo)"
            )
        if (self.imitation > 0) != (self.imitate is not None):
            raise RlflowError(
                "imitation needs both a weight above 0 (--imitation W) and the path's collection "
                "(--imitate DATA_DIR, or the loop's --demo)"
            )

    def check_world(self, world: WorldModel, asked: float | None) -> None:
        """RlflowError if `--uncertainty` was `asked` for (given on the command line) of a
        world model with no ensemble to disagree."""
        if asked and len(world.members) < 2:
            raise RlflowError(
                f"--uncertainty {asked:g} needs an ensemble of world models: train it with "
                "`rlflow train-wm --ensemble 5` (or more than 1)"
            )

    def dream_steps(self, world: WorldModel) -> int:
        """Steps a dream episode may take in this world model (`dream_horizon`)."""
        if self.dream_horizon == "max-steps" or world.longest_episode < 1:  # or made before
            return self.max_steps
        return min(self.max_steps, world.longest_episode)

    def dream_options(self, world: WorldModel) -> dict[str, Any]:
        """The `DreamBatch` / `dream_returns` arguments these settings fix, the same wherever a
        controller is trained or scored in the dream: its length and its uncertainty charge."""
        return {"max_steps": self.dream_steps(world), "penalty": self.uncertainty}

    def identity(self) -> dict[str, Any]:
        """The settings as a run's config.yaml records them; without the imitation's when it is
        off, so that runs made before it still resume."""
        values = asdict(self)
        if self.imitate is None:
            values.pop("imitate")
            values.pop("imitation")
        return values

    @property
    def budget(self) -> int:
        """Generations (CMA-ES) or iterations (PPO) a controller trains for."""
        return self.generations if self.method == "cmaes" else self.ppo_iterations


class LinearController:
    """logits = W x + b over dream actions, x = [z, h]; parameters as one flat vector
    (W row-major, then b), the vector CMA-ES searches."""

    def __init__(self, num_actions: int, input_dim: int, params: np.ndarray | None = None):
        self.num_actions, self.input_dim = num_actions, input_dim
        size = self.num_params(num_actions, input_dim)
        self.params = np.zeros(size) if params is None else np.asarray(params, dtype=np.float64)
        if self.params.shape != (size,):
            raise RlflowError(f"controller has {self.params.shape} parameters, expected {size}")

    @staticmethod
    def num_params(num_actions: int, input_dim: int) -> int:
        return num_actions * (input_dim + 1)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """(n, A) from x (n, D)."""
        return batched_logits(self.params[None], np.asarray(x)[None], self.num_actions)[0]


def selected_temperature(
    temperature: float, select: str, scores: dict[float, float] | None
) -> float:
    """The tau of a run's policy: `temperature`, unless `select` picks by a score (real-return,
    speedup) and the controllers' `scores` under it are known; then the best of them (ties:
    `temperature` first, then the lower tau)."""
    if select == "temperature" or not scores:
        return temperature
    best = max(scores.values())
    tied = [tau for tau, value in scores.items() if value == best]
    return temperature if temperature in tied else min(tied)


def batched_logits(params: np.ndarray, x: np.ndarray, num_actions: int) -> np.ndarray:
    """Logits (P, E, A) of P controllers (params (P, N)) on their inputs x (P, E, D)."""
    population, _, dim = x.shape
    weights = params[:, : num_actions * dim].reshape(population, num_actions, dim)
    bias = params[:, num_actions * dim :]
    return np.einsum("pad,ped->pea", weights, x) + bias[:, None, :]


def masked_argmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, logits, -np.inf).argmax(axis=-1)


class ControllerMemory:
    """What a controller carries through one real episode: M's recurrent state h, advanced with
    (z_t, rule) as in the dream, and the reverses of the rules it applied (a rule pair goes one
    way per episode). `ControllerPolicy` acts with it and `rlflow.worldmodel.imitation` walks a
    search's path with it, so the clone is fitted to the very inputs and choices the acting
    controller will meet."""

    def __init__(self, world: WorldModel) -> None:
        self.world = world
        self.state: tuple[torch.Tensor, torch.Tensor] | None = None
        self.reverse = world.reverse_actions  # a property that loops over the rules: once
        self.blocked = np.zeros(world.num_actions, dtype=bool)

    def inputs(self, mu: torch.Tensor) -> np.ndarray:
        """(1, Z + H) float64: x_t = [z_t, h_t] for `mu`, the (1, Z) VAE mean of the graph."""
        hidden = self.state[0][0] if self.state is not None else torch.zeros(1, self.world.hidden)
        return torch.cat([mu, hidden], dim=1).numpy().astype(np.float64)

    def allowed(self, valid: np.ndarray) -> np.ndarray:
        """`valid` (A,) bool without the reverses of the rules applied this episode."""
        return valid & ~self.blocked

    @torch.no_grad()
    def advance(self, mu: torch.Tensor, rule: int, action: int = -1) -> None:
        """Past a step that applied rule id `rule` (R for stop) at the graph of `mu`; `action`,
        the dream action the controller chose (-1: none), blocks its reverse from now on."""
        if action >= 0 and self.reverse[action] >= 0:
            self.blocked[self.reverse[action]] = True
        _, self.state = self.world.rnn(
            mu.unsqueeze(1), torch.tensor([[rule]], dtype=torch.long), self.state
        )


def dream_returns(
    world: WorldModel,
    params: np.ndarray,
    *,
    episodes: int,
    temperature: float,
    max_steps: int,
    rng: np.random.Generator,
    starts: np.ndarray | None = None,
    penalty: float = 0.0,
) -> np.ndarray:
    """Mean dream return (P,) of P linear controllers (params (P, N)), each over the same
    `episodes` dream episodes (common random numbers), acting by masked argmax; `penalty`: the
    charge for the ensemble's disagreement (`DreamBatch`)."""
    params = np.atleast_2d(params)
    population = len(params)
    batch = DreamBatch(
        world,
        episodes=episodes,
        groups=population,
        temperature=temperature,
        max_steps=max_steps,
        rng=rng,
        starts=starts,
        penalty=penalty,
    )
    obs, mask = batch.reset()
    returns = np.zeros(batch.size)
    alive = np.ones(batch.size, dtype=bool)
    shape = (population, episodes)
    for _ in range(max_steps):
        logits = batched_logits(params, obs.reshape(*shape, -1), world.num_actions)
        actions = masked_argmax(logits, mask.reshape(*shape, -1)).reshape(-1)
        obs, reward, terminated, truncated, mask = batch.step(actions)
        returns += np.where(alive, reward, 0.0)
        alive &= ~(terminated | truncated)
        if not alive.any():
            break
    return returns.reshape(shape).mean(axis=1)


class ControllerTrainer(ABC):
    """The training of one controller at dream temperature tau, a generation or iteration per
    `step`: `rlflow.worldmodel.train_controller` runs it, saves `state()` after every step and
    hands it back to a rerun. CMA-ES (`cmaes`) and PPO (`dream_ppo`) implement it."""

    name: str  # for the progress bar
    unit: str  # what a step is called there
    postfix: str  # the bar's postfix: a format string over the step's scalars

    def __init__(
        self,
        world: WorldModel,
        settings: ControllerSettings,
        temperature: float,
        state: dict[str, Any] | None = None,
        path: PathExamples | None = None,
    ) -> None:
        self.world, self.settings, self.temperature = world, settings, temperature
        self.path = path  # the path to imitate (`settings.imitation`), None: none
        self.done = 0  # steps taken, by earlier runs too
        self.setup(state)

    def dream_rng(self) -> np.random.Generator:
        """The draws of the next step, from (seed, step, tau): a resumed run draws what an
        uninterrupted one would."""
        return np.random.default_rng([self.settings.seed, self.done, int(self.temperature * 1000)])

    @abstractmethod
    def setup(self, state: dict[str, Any] | None) -> None:
        """Start training, or resume it from a `state()` of an earlier run (sets `done`)."""

    @abstractmethod
    def step(self) -> dict[str, float]:
        """One generation or iteration; its scalars for TensorBoard."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """All a rerun needs to continue as if never stopped."""

    @abstractmethod
    def params(self) -> np.ndarray:
        """The controller as `LinearController` parameters."""
