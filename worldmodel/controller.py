"""C of World Models: a linear controller on [z, h], trained in the dream, acting in the real env.

Training never touches the real env: `train_controller` evaluates controllers on
`DreamBatch` rollouts only, by CMA-ES (World Models; default) or PPO (RLFlow), one controller
per dream temperature tau.

The controller picks a *rule* (or stop): logits = W [z_t, h_t] + b over the world model's
active rules and stop, masked to the applicable ones, argmax (sampled when not
deterministic). The dream has no sites, so in the real env a rule becomes a concrete
candidate this way (`ControllerPolicy.act`):

1. z_t is the VAE mean of the real observation; h_t is the MDN-RNN state carried through the
   episode (reset when the observation's step fraction is 0, or by `reset()`).
2. The real action mask decides which rules are applicable: an active rule with at least
   one candidate on offer, plus stop (rules the collected data never saw cannot be chosen).
3. Among the chosen rule's offered candidates, the one whose rewritten graph has the lowest
   analytic (roofline) cost is applied -- a free, deterministic site choice that needs no
   measurement. Without the env object (`env=None`), the rule's first offered slot is used.
4. h is advanced with (z_t, rule), exactly as in the dream.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlflow.errors import RlflowError
from rlflow.tensorboard import TensorBoard
from rlflow.worldmodel.dream import DreamBatch
from rlflow.worldmodel.model import (
    WorldModel,
    load_checkpoint,
    load_pickle,
    save_checkpoint,
    save_pickle,
)

METHODS = ("cmaes", "ppo")
WORLD_BUNDLE = "world_model.pt"
CONTROLLER_CHECKPOINT = "controller.pt"
STATE_FILE = "state.pkl"


def tau_dir(run_dir: Path, temperature: float) -> Path:
    """Where the controller trained at temperature tau lives inside a controller run."""
    return Path(run_dir) / f"tau-{temperature:g}"


@dataclass
class ControllerSettings:
    """Hyperparameters of `rlflow train-controller` (mirrored by configs/worldmodel.yaml)."""

    method: str = "cmaes"
    """cmaes (World Models) | ppo (RLFlow)."""
    temperature: float = 1.0
    """tau of the controller the run's policy uses (`load_controller_policy`)."""
    temperatures: list[float] = field(default_factory=lambda: [0.5, 1.0, 1.5])
    """Dream temperatures to train a controller at (the tau table); must hold `temperature`."""
    max_steps: int = 50
    """Dream episode truncation (the real env's max_episode_steps)."""
    generations: int = 40
    """CMA-ES generations."""
    population: int = 16
    """CMA-ES population size."""
    sigma0: float = 0.1
    """CMA-ES initial step size."""
    rollouts: int = 8
    """Dream episodes per controller evaluation (CMA-ES), common to the population."""
    diagonal_above: int = 2000
    """Use separable (diagonal) CMA-ES when the controller has more parameters than this."""
    ppo_iterations: int = 60
    """PPO: rollout-update iterations."""
    ppo_envs: int = 32
    """PPO: dream episodes per iteration."""
    ppo_epochs: int = 4
    """PPO: optimisation passes per iteration."""
    ppo_lr: float = 3e-3
    """PPO: Adam learning rate."""
    gamma: float = 0.99
    """PPO: discount."""
    gae_lambda: float = 0.95
    """PPO: GAE lambda."""
    clip_coef: float = 0.2
    """PPO: clipped-objective epsilon."""
    ent_coef: float = 0.01
    """PPO: entropy bonus."""
    eval_dream_episodes: int = 64
    """Dream episodes for the final dream return of each controller."""
    seed: int = 0
    """Seed of CMA-ES / PPO and of the dream draws."""

    def validate(self) -> None:
        if self.method not in METHODS:
            raise RlflowError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not self.temperatures or any(t <= 0 for t in self.temperatures):
            raise RlflowError("temperatures must be a non-empty list of positive numbers")
        if self.temperature not in self.temperatures:
            raise RlflowError(
                f"temperature {self.temperature} is not among temperatures {self.temperatures}"
            )
        small = min(self.generations, self.population, self.rollouts, self.max_steps)
        if small < 1 or min(self.ppo_iterations, self.ppo_envs, self.ppo_epochs) < 1:
            raise RlflowError("generations, population, rollouts, max_steps and ppo_* must be >= 1")
        if self.population < 2:
            raise RlflowError("CMA-ES needs a population of at least 2")

    def identity(self) -> dict[str, Any]:
        """What a rerun into the same RUN_DIR must keep (generations/iterations may grow)."""
        identity = asdict(self)
        for key in ("generations", "ppo_iterations", "eval_dream_episodes"):
            identity.pop(key)
        return identity


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


def batched_logits(params: np.ndarray, x: np.ndarray, num_actions: int) -> np.ndarray:
    """Logits (P, E, A) of P controllers (params (P, N)) on their inputs x (P, E, D)."""
    population, _, dim = x.shape
    weights = params[:, : num_actions * dim].reshape(population, num_actions, dim)
    bias = params[:, num_actions * dim :]
    return np.einsum("pad,ped->pea", weights, x) + bias[:, None, :]


def masked_argmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, logits, -np.inf).argmax(axis=-1)


def dream_returns(
    world: WorldModel,
    params: np.ndarray,
    *,
    episodes: int,
    temperature: float,
    max_steps: int,
    rng: np.random.Generator,
    starts: np.ndarray | None = None,
) -> np.ndarray:
    """Mean dream return (P,) of P linear controllers (params (P, N)), each over the same
    `episodes` dream episodes (common random numbers), acting by masked argmax."""
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


# ---- training ---------------------------------------------------------------------------------


def train_cmaes(
    world: WorldModel,
    out: Path,
    settings: ControllerSettings,
    temperature: float,
    log: TensorBoard,
    progress: bool = True,
) -> np.ndarray:
    """CMA-ES on dream returns; resumes from `out/state.pkl`. Returns the final mean."""
    import cma
    from tqdm import tqdm

    size = LinearController.num_params(world.num_actions, world.latent + world.hidden)
    state_path = out / STATE_FILE
    if state_path.exists():
        state = load_pickle(state_path, "controller state")
        es, generation = state["es"], state["generation"]
        np.random.set_state(state["numpy_rng"])
    else:
        options = {
            "popsize": settings.population,
            "seed": settings.seed + 1,
            "verbose": -9,
            "CMA_diagonal": size > settings.diagonal_above,
        }
        es, generation = cma.CMAEvolutionStrategy(np.zeros(size), settings.sigma0, options), 0
    tag = f"controller/tau{temperature:g}"
    bar = tqdm(
        total=settings.generations,
        initial=min(generation, settings.generations),
        desc=f"train-controller CMA-ES tau {temperature:g}",
        unit="gen",
        file=sys.stderr,
        disable=not progress,
    )
    while generation < settings.generations:
        candidates = np.asarray(es.ask())
        rng = np.random.default_rng([settings.seed, generation, int(temperature * 1000)])
        fitness = dream_returns(
            world,
            candidates,
            episodes=settings.rollouts,
            temperature=temperature,
            max_steps=settings.max_steps,
            rng=rng,
        )
        es.tell(list(candidates), list(-fitness))  # cma minimises
        generation += 1
        log.scalar(f"{tag}/dream_return_mean", fitness.mean(), generation)
        log.scalar(f"{tag}/dream_return_best", fitness.max(), generation)
        log.scalar(f"{tag}/sigma", es.sigma, generation)
        save_pickle(
            state_path,
            {"es": es, "generation": generation, "numpy_rng": np.random.get_state()},
        )
        bar.update(1)
        bar.set_postfix_str(f"dream return best {fitness.max():.2f} mean {fitness.mean():.2f}")
    bar.close()
    return np.asarray(es.result.xfavorite, dtype=np.float64)


class _ActorCritic(nn.Module):
    """PPO in the dream: the linear controller as actor, a linear value head as critic."""

    def __init__(self, input_dim: int, num_actions: int) -> None:
        super().__init__()
        self.actor = nn.Linear(input_dim, num_actions)
        self.critic = nn.Linear(input_dim, 1)
        nn.init.zeros_(self.actor.weight)
        nn.init.zeros_(self.actor.bias)

    def params(self) -> np.ndarray:
        weight = self.actor.weight.detach().numpy().astype(np.float64)
        return np.concatenate([weight.reshape(-1), self.actor.bias.detach().numpy()])


def train_ppo(
    world: WorldModel,
    out: Path,
    settings: ControllerSettings,
    temperature: float,
    log: TensorBoard,
    progress: bool = True,
) -> np.ndarray:
    """PPO (clipped objective, GAE) on batched dream episodes; resumes from `out/state.pkl`."""
    from tqdm import tqdm

    dim, actions_n = world.latent + world.hidden, world.num_actions
    torch.manual_seed(settings.seed)
    agent = _ActorCritic(dim, actions_n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=settings.ppo_lr)
    state_path = out / STATE_FILE
    iteration = 0
    if state_path.exists():
        state = load_pickle(state_path, "controller state")
        agent.load_state_dict(state["agent"])
        optimizer.load_state_dict(state["optimizer"])
        iteration = state["iteration"]
    tag = f"controller/tau{temperature:g}"
    bar = tqdm(
        total=settings.ppo_iterations,
        initial=min(iteration, settings.ppo_iterations),
        desc=f"train-controller PPO tau {temperature:g}",
        unit="iter",
        file=sys.stderr,
        disable=not progress,
    )
    while iteration < settings.ppo_iterations:
        rng = np.random.default_rng([settings.seed, iteration, int(temperature * 1000)])
        torch.manual_seed(int(rng.integers(2**31)))
        batch = DreamBatch(
            world,
            episodes=settings.ppo_envs,
            temperature=temperature,
            max_steps=settings.max_steps,
            rng=rng,
        )
        obs, mask = batch.reset()
        b_obs, b_masks, b_actions, b_logprobs, b_rewards, b_alive, b_values = ([] for _ in range(7))
        alive = np.ones(batch.size, dtype=bool)
        episode_return = np.zeros(batch.size)
        with torch.no_grad():
            for _ in range(settings.max_steps):
                x = torch.as_tensor(obs)
                logits = agent.actor(x).masked_fill(~torch.as_tensor(mask), -1e9)
                dist = torch.distributions.Categorical(logits=logits)
                action = dist.sample()
                b_obs.append(x)
                b_masks.append(torch.as_tensor(mask))
                b_actions.append(action)
                b_logprobs.append(dist.log_prob(action))
                b_values.append(agent.critic(x).squeeze(-1))
                b_alive.append(torch.as_tensor(alive.copy()))
                obs, reward, terminated, truncated, mask = batch.step(action.numpy())
                b_rewards.append(torch.as_tensor(np.where(alive, reward, 0.0), dtype=torch.float32))
                episode_return += np.where(alive, reward, 0.0)
                alive &= ~(terminated | truncated)
                if not alive.any():
                    break
        steps = len(b_rewards)
        alive_t = torch.stack(b_alive)  # (T, n): step t taken while the episode was running
        values = torch.stack(b_values)
        rewards = torch.stack(b_rewards)
        advantages = torch.zeros_like(rewards)
        lastgaelam = torch.zeros(batch.size)
        for t in reversed(range(steps)):
            next_alive = alive_t[t + 1].float() if t + 1 < steps else torch.zeros(batch.size)
            next_value = values[t + 1] if t + 1 < steps else torch.zeros(batch.size)
            delta = rewards[t] + settings.gamma * next_value * next_alive - values[t]
            lastgaelam = delta + settings.gamma * settings.gae_lambda * next_alive * lastgaelam
            advantages[t] = lastgaelam
        returns = advantages + values
        keep = alive_t.reshape(-1)
        flat_obs = torch.stack(b_obs).reshape(-1, dim)[keep]
        flat_masks = torch.stack(b_masks).reshape(-1, actions_n)[keep]
        flat_actions = torch.stack(b_actions).reshape(-1)[keep]
        flat_logprobs = torch.stack(b_logprobs).reshape(-1)[keep]
        flat_adv = advantages.reshape(-1)[keep]
        if len(flat_adv) > 1:
            flat_adv = (flat_adv - flat_adv.mean()) / (flat_adv.std() + 1e-8)
        flat_returns = returns.reshape(-1)[keep]
        for _ in range(settings.ppo_epochs):
            logits = agent.actor(flat_obs).masked_fill(~flat_masks, -1e9)
            dist = torch.distributions.Categorical(logits=logits)
            ratio = (dist.log_prob(flat_actions) - flat_logprobs).exp()
            pg_loss1 = -flat_adv * ratio
            pg_loss2 = -flat_adv * ratio.clamp(1 - settings.clip_coef, 1 + settings.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            v_loss = 0.5 * (agent.critic(flat_obs).squeeze(-1) - flat_returns).pow(2).mean()
            entropy = dist.entropy().mean()
            loss = pg_loss + 0.5 * v_loss - settings.ent_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()
        iteration += 1
        log.scalar(f"{tag}/dream_return_mean", episode_return.mean(), iteration)
        log.scalar(f"{tag}/losses/policy_loss", pg_loss.item(), iteration)
        log.scalar(f"{tag}/losses/value_loss", v_loss.item(), iteration)
        log.scalar(f"{tag}/losses/entropy", entropy.item(), iteration)
        save_pickle(
            state_path,
            {
                "agent": agent.state_dict(),
                "optimizer": optimizer.state_dict(),
                "iteration": iteration,
            },
        )
        bar.update(1)
        bar.set_postfix_str(f"dream return {episode_return.mean():.2f}")
    bar.close()
    return agent.params()


def train_controller(
    wm_dir: str | Path,
    run_dir: str | Path,
    settings: ControllerSettings,
    *,
    progress: bool = True,
    log: bool = True,
) -> dict[str, Any]:
    """Train one controller per temperature in the world model's dream; never steps a real
    env. Returns {temperature: {"dream_return": ..., "params": ...}} summaries."""
    settings.validate()
    run_dir = Path(run_dir)
    bundle = run_dir / WORLD_BUNDLE
    if bundle.exists():
        world = WorldModel.from_bundle(bundle)  # a resumed run keeps the world it started in
    else:
        world = WorldModel.load(wm_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        world.save_bundle(bundle)
    results: dict[str, Any] = {}
    with TensorBoard(run_dir, enabled=log) as scalars:
        for temperature in settings.temperatures:
            out = tau_dir(run_dir, temperature)
            out.mkdir(parents=True, exist_ok=True)
            checkpoint_path = out / CONTROLLER_CHECKPOINT
            done = None
            if checkpoint_path.exists():
                done = load_checkpoint(checkpoint_path, "controller checkpoint")
                target = (
                    settings.generations if settings.method == "cmaes" else settings.ppo_iterations
                )
                if done.get("trained_for", -1) != target:
                    done = None  # more generations asked for: continue from state.pkl
            if done is None:
                train = train_cmaes if settings.method == "cmaes" else train_ppo
                params = train(world, out, settings, temperature, scalars, progress)
                rng = np.random.default_rng([settings.seed, 999_983, int(temperature * 1000)])
                dream_return = float(
                    dream_returns(
                        world,
                        params[None],
                        episodes=settings.eval_dream_episodes,
                        temperature=temperature,
                        max_steps=settings.max_steps,
                        rng=rng,
                    )[0]
                )
                done = {
                    "params": torch.as_tensor(params),
                    "num_actions": world.num_actions,
                    "input_dim": world.latent + world.hidden,
                    "temperature": temperature,
                    "method": settings.method,
                    "dream_return": dream_return,
                    "trained_for": (
                        settings.generations
                        if settings.method == "cmaes"
                        else settings.ppo_iterations
                    ),
                }
                save_checkpoint(checkpoint_path, done)
                scalars.scalar(f"controller/tau{temperature:g}/final_dream_return", dream_return, 0)
            results[f"{temperature:g}"] = {
                "temperature": temperature,
                "dream_return": float(done["dream_return"]),
                "parameters": int(done["params"].numel()),
            }
    return results
