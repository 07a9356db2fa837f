"""PPO over GraphRewrite-v0: the model-free X-RLflow baseline, trained across many graphs.

Read top to bottom like CleanRL's `ppo.py`: the hyperparameters (`PPOConfig`, mirrored by
`configs/ppo.yaml`), then `train`, which steps `num_envs` envs at once (a gymnasium vector env,
in process or on Ray: `rlflow.agents.vector`) with the current policy (a masked categorical
over each env's candidates plus stop, scored by the shared GNN) for `num_steps` steps each
(CleanRL's rollout) or until `episodes_per_update` episodes have ended, computes GAE
advantages env by env, and takes the clipped-objective minibatch steps of
`rlflow.agents.update` (shared with the dream controller's PPO). The reward is the offline
per-op measured cost with an end-to-end check every `measure_every` steps (`perop-e2e`, as
X-RLflow); `cost: analytic` is the ablation. A run directory holds
`config.yaml`, TensorBoard event files, `progress.json` (what the sample-efficiency
comparisons read) and `checkpoints/latest.pt`, from which a rerun continues.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributions import Categorical
from torch_geometric.data import Data

from rlflow.agents.rollout import EnvRollout
from rlflow.agents.update import Evaluate, Rollout, UpdateConfig, ppo_update
from rlflow.agents.vector import make_env as make_one_env
from rlflow.agents.vector import make_vector_env, unbatch
from rlflow.config import save_run_config
from rlflow.cost.cache import read_json, write_json_atomic
from rlflow.envs.graph_rewrite import GraphRewriteEnv
from rlflow.errors import RlflowError, first_line
from rlflow.fileio import write_torch_atomic
from rlflow.nn import (
    SCORER_MODES,
    CandidateScorer,
    candidate_batch,
    candidate_data,
    collate,
    observation_to_data,
)
from rlflow.tensorboard import TensorBoard

CHECKPOINT_VERSION = 1
CHECKPOINT = Path("checkpoints") / "latest.pt"
MAY_CHANGE = ("total_steps", "torch_threads")
"""The only settings a rerun may change when it continues a run: how far it trains and how many
threads it trains with. Any other change would make the run's checkpoint, curves and
config.yaml describe two different trainings."""
PRE_VECTOR_DEFAULTS: dict[str, Any] = {
    "deploy": "online",
    "start": "original",
    "num_envs": 1,
    "num_steps": None,
}
"""What a run saved before these settings existed ran with: its saved config reads as such."""
PRE_DEMO_DEFAULTS: dict[str, Any] = {
    "demos": [],
    "demo_epochs": 500,
    "demo_coef": 0.0,
    "revisit_penalty": 0.0,
    "mask_revisits": False,
}
"""A run saved before demonstrations existed imitated none; one saved before the revisit
penalty or mask existed was neither charged for revisits nor kept from them."""
ENV_FIELDS = (
    "size",
    "cost",
    "deploy",
    "start",
    "measure_every",
    "ort_level",
    "provider",
    "portable",
    "max_nodes",
    "max_edges",
    "max_candidates",
    "max_site_nodes",
    "horizon",
    "revisit_penalty",
    "mask_revisits",
)
"""The PPOConfig fields that are GraphRewriteEnv keyword arguments (besides `models`)."""
EPISODE_INFO = ("model", "speedup", "step", "revisits")
"""What an episode's entry in progress.json reads from the env's last info of it."""


@dataclass
class PPOConfig:
    """Hyperparameters of a PPO run (X-RLflow's defaults); `configs/ppo.yaml` mirrors them."""

    # ---- the environment
    models: list[str] = field(default_factory=lambda: ["squeezenet-1.1"])  # one per episode
    size: str = "small"  # zoo model size: small | full
    cost: str = "perop-e2e"  # reward cost: perop-e2e | perop | analytic | e2e | e2e-sparse
    measure_every: int = 10  # perop-e2e, e2e-sparse: env steps between end-to-end checks
    deploy: str = "offline"  # offline (graphs run as written) | online (ORT optimises them)
    start: str = "original"  # where episodes begin: original | ort:all | ort:extended | ...
    ort_level: str = "all"  # onnxruntime optimisation level of measurements: all | disable
    provider: str = "auto"  # where measurements run: auto (CUDA where available) | cpu | cuda
    portable: bool = False  # only rules that emit standard ONNX ops
    max_nodes: int = 512  # padded operator count of an observation
    max_edges: int = 1024  # padded edge count of an observation
    max_candidates: int = 512  # candidate action slots (plus stop; 128 until 2026-11-27)
    max_site_nodes: int = 4  # node indices kept per candidate site
    horizon: int = 100  # steps per episode before truncation
    revisit_penalty: float = 0.0  # charged for a step back to a graph the episode visited
    mask_revisits: bool = False  # withhold the candidates that lead back to such a graph

    # ---- the network
    scorer: str = "local"  # local (one GNN pass per state) | full (one per candidate graph)
    hidden: int = 64  # embedding size of the GNN and the heads
    layers: int = 3  # GATv2 layers of the encoder
    heads: int = 4  # attention heads per GATv2 layer
    init_from: str | None = None  # a PPO run whose network this one starts from (fine-tuning)
    demos: list[str] = field(default_factory=list)  # recorded episodes imitated first
    demo_epochs: int = 500  # behaviour-cloning passes over the demos before the first rollout
    demo_coef: float = 0.0  # weight of the cloning loss kept during PPO, fading to 0 over the run

    # ---- the algorithm (the update's knobs: rlflow.agents.update.UpdateConfig)
    seed: int = 0  # seed of torch, numpy and the env's model draws
    total_steps: int = 20000  # env steps of the whole run (a rerun continues to this count)
    learning_rate: float = 5e-4  # Adam learning rate
    anneal_lr: bool = False  # decay the learning rate linearly to 0 over total_steps
    num_envs: int = 1  # envs stepped together (a gymnasium vector env)
    num_steps: int | None = None  # steps per env per update; null: episodes_per_update
    episodes_per_update: int = 10  # episodes ended per update when num_steps is null
    gamma: float = 0.99  # discount factor
    gae_lambda: float = 0.95  # lambda of generalised advantage estimation
    minibatch_size: int = 16  # states per gradient step
    update_epochs: int = UpdateConfig.update_epochs
    norm_adv: bool = UpdateConfig.norm_adv
    clip_coef: float = UpdateConfig.clip_coef
    clip_vloss: bool = UpdateConfig.clip_vloss
    ent_coef: float = UpdateConfig.ent_coef
    vf_coef: float = UpdateConfig.vf_coef
    max_grad_norm: float = UpdateConfig.max_grad_norm
    target_kl: float | None = UpdateConfig.target_kl  # null: never stop an update early
    torch_threads: int = 1  # torch intra-op threads (the env measures with one thread too)

    def env_kwargs(self) -> dict[str, Any]:
        """The GraphRewriteEnv keyword arguments of this config, without `models`."""
        return {name: getattr(self, name) for name in ENV_FIELDS}

    def update_config(self) -> UpdateConfig:
        """This run's knobs of the PPO update."""
        names = [knob.name for knob in dataclasses.fields(UpdateConfig)]
        return UpdateConfig(**{name: getattr(self, name) for name in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PPOConfig:
        """A config from a mapping (YAML); unknown keys are an error, missing ones default."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in values.items() if key != "kind"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise RlflowError(f"unknown PPO config keys: {', '.join(unknown)}")
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if isinstance(self.models, str):
            self.models = [self.models]
        self.models = [str(model) for model in self.models]
        if not self.models:
            raise RlflowError("give at least one model to train on")
        if self.scorer not in SCORER_MODES:
            raise RlflowError(f"unknown scorer {self.scorer!r}; choose {' or '.join(SCORER_MODES)}")
        if self.num_steps is not None and self.num_steps < 1:
            raise RlflowError(f"num_steps must be at least 1 (or null), got {self.num_steps}")
        if self.deploy not in ("offline", "online"):
            raise RlflowError(f"unknown deploy {self.deploy!r}; choose offline or online")
        names = ("total_steps", "num_envs", "episodes_per_update", "minibatch_size")
        for name in (*names, "update_epochs"):
            if getattr(self, name) < 1:
                raise RlflowError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.horizon < 1:
            raise RlflowError(f"horizon must be at least 1, got {self.horizon}")
        if self.demo_epochs < 0:
            raise RlflowError(f"demo_epochs must be at least 0, got {self.demo_epochs}")
        if self.revisit_penalty < 0:
            raise RlflowError(f"revisit_penalty must be at least 0, got {self.revisit_penalty}")
        if self.demo_coef < 0:
            raise RlflowError(f"demo_coef must be at least 0, got {self.demo_coef}")
        if self.demo_coef and not self.demos:
            raise RlflowError("demo_coef keeps imitating demos: give them (--demo RESULT.json)")
        self.demos = [str(path) for path in self.demos]
        if self.hidden % self.heads:
            raise RlflowError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")


def saved_config(values: dict[str, Any]) -> dict[str, Any]:
    """A config a run saved (config.yaml, a checkpoint), with the settings it predates read
    as what it ran with (`PRE_VECTOR_DEFAULTS`, `PRE_DEMO_DEFAULTS`), not as today's defaults."""
    if "num_envs" in values:
        return {**PRE_DEMO_DEFAULTS, **values}
    return {**PRE_VECTOR_DEFAULTS, **PRE_DEMO_DEFAULTS, **values}


def make_env(config: PPOConfig) -> GraphRewriteEnv:
    """One env of the config: all of its models, one drawn per episode."""
    return make_one_env(config.models, config.horizon, config.env_kwargs())


def make_scorer(config: PPOConfig, num_rules: int) -> CandidateScorer:
    return CandidateScorer(
        num_rules,
        mode=config.scorer,
        hidden=config.hidden,
        layers=config.layers,
        heads=config.heads,
    )


# ---- checkpoints ---------------------------------------------------------------------------


def load_checkpoint(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The latest checkpoint of a PPO run directory; RlflowError if missing or unreadable."""
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise RlflowError(f"no PPO checkpoint at {path} (train one with `rlflow train-ppo`)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a truncated or foreign file: pickle, zip or torch errors
        raise RlflowError(f"cannot read checkpoint {path}: {first_line(error)}") from None
    if not isinstance(state, dict) or state.get("kind") != "ppo":
        raise RlflowError(f"{path} is not an rlflow PPO checkpoint")
    if state.get("version") != CHECKPOINT_VERSION:
        raise RlflowError(
            f"{path} has checkpoint version {state.get('version')}, this rlflow reads "
            f"{CHECKPOINT_VERSION}"
        )
    return state


# ---- acting --------------------------------------------------------------------------------


def policy_inputs(
    scorer: CandidateScorer, env: GraphRewriteEnv, observation: dict[str, np.ndarray]
) -> tuple[Data, list[Data]]:
    """What the scorer needs of one state: its graph data and, for `full`, the candidates'."""
    data = observation_to_data(observation)
    if not scorer.needs_candidate_graphs:
        return data, []
    return data, candidate_data(env.unwrapped.candidate_observations())


def scorer_outputs(
    scorer: CandidateScorer,
    states: Sequence[Data | Mapping[str, np.ndarray]],
    candidates: Sequence[list[Data]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scorer's masked action logits and state values for B states (graph data or raw
    observations), batched; `candidates` matter only to the `full` scorer."""
    batch = collate(states)
    graphs = (
        candidate_batch(candidates, batch.candidate_rules.shape[1])
        if scorer.needs_candidate_graphs
        else None
    )
    return scorer(batch, graphs)


def evaluate_actions(
    scorer: CandidateScorer,
    states: list[Data],
    candidates: list[list[Data]],
    actions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """CleanRL's `get_action_and_value`: (action, log-prob, entropy, value) of B states;
    samples the actions when none are given."""
    logits, value = scorer_outputs(scorer, states, candidates)
    probs = Categorical(logits=logits)
    if actions is None:
        actions = probs.sample()
    return actions, probs.log_prob(actions), probs.entropy(), value


def replay(
    scorer: CandidateScorer,
    states: list[Data],
    candidates: list[list[Data]],
    actions: torch.Tensor,
) -> Evaluate:
    """The update's view of a rollout: the taken actions of the steps it picks, re-evaluated
    by the scorer as it is now."""

    def evaluate(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _, logprob, entropy, value = evaluate_actions(
            scorer,
            [states[i] for i in indices],
            [candidates[i] for i in indices],
            actions[indices],
        )
        return logprob, entropy, value

    return evaluate


# ---- training ------------------------------------------------------------------------------


def train(
    config: PPOConfig,
    run_dir: str | os.PathLike,
    *,
    progress: bool = True,
    backend: str = "inprocess",
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Train (or continue training) a PPO agent into `run_dir`; returns a summary. `backend`:
    where the envs step, `inprocess` or `ray` (`rlflow.agents.vector`); it is no part of the
    run's settings, so a rerun may change it."""
    config.validate()
    run_dir = Path(run_dir)
    checkpoint_path = run_dir / CHECKPOINT
    resumed = load_checkpoint(run_dir) if checkpoint_path.exists() else None
    if resumed is not None:
        _check_resumable(resumed["config"], config, run_dir)
    initial = initial_network(config) if resumed is None and config.init_from else None
    torch.set_num_threads(config.torch_threads)
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)

    envs = make_vector_env(
        config.models,
        config.horizon,
        config.env_kwargs(),
        num_envs=config.num_envs,
        backend=backend,
        ray_address=ray_address,
    )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)  # once the envs are up (Ray reached)
        return _train_in(envs, config, run_dir, resumed, initial, progress=progress)
    finally:
        envs.close()


def _train_in(
    envs: Any,
    config: PPOConfig,
    run_dir: Path,
    resumed: dict[str, Any] | None,
    initial: dict[str, Any] | None,
    *,
    progress: bool,
) -> dict[str, Any]:
    """The training loop of `train`, stepping `envs` (which the caller closes), from the
    `initial` checkpoint's network if given (a fresh run fine-tuning another)."""
    from tqdm import tqdm

    checkpoint_path = run_dir / CHECKPOINT
    rule_names = list(envs.get_attr("rule_names")[0])
    scorer = make_scorer(config, len(rule_names))
    optimizer = torch.optim.Adam(scorer.parameters(), lr=config.learning_rate, eps=1e-5)
    global_step, update, episode, real_measurements_before, wall_before = 0, 0, 0, 0, 0.0
    progress_log: dict[str, Any] = {"kind": "ppo", "episodes": [], "updates": []}
    if initial is not None:
        remedy = "fine-tune with the rlflow version that trained it"
        _load_network(scorer, initial, rule_names, f"--init-from {config.init_from}", remedy)
    if resumed is not None:
        remedy = "resume it with the same rlflow version, or train into a new --out"
        _load_network(scorer, resumed, rule_names, str(checkpoint_path), remedy)
        optimizer.load_state_dict(resumed["optimizer"])
        global_step, update = resumed["global_step"], resumed["update"]
        episode = resumed["episodes"]
        real_measurements_before, wall_before = resumed["real_measurements"], resumed["wall_s"]
        torch.set_rng_state(resumed["torch_rng"])
        np.random.set_state(resumed["numpy_rng"])
        progress_log = _progress_until(read_json(run_dir / "progress.json"), global_step)

    demos = None  # walked again on a rerun only to keep imitating them (demo_coef)
    if config.demos and (resumed is None or config.demo_coef > 0):
        from rlflow.agents.demos import gather, imitate

        demos = gather(scorer, config)
        if resumed is None:
            progress_log["demos"] = imitate(scorer, demos, config)
    demo_rng = np.random.default_rng(config.seed + global_step)
    save_run_config(run_dir, "ppo", config.to_dict())
    # purge_step: TensorBoard drops what a killed run logged after its last checkpoint.
    writer = TensorBoard(run_dir, purge_step=global_step + 1 if resumed else None)
    writer.text("hyperparameters", _hyperparameter_table(config), global_step)
    if resumed is None and "demos" in progress_log:
        writer.scalar("demos/accuracy", progress_log["demos"]["accuracy"], 0)
        writer.scalar("demos/mean_logprob", progress_log["demos"]["mean_logprob"], 0)
    print(f"tensorboard --logdir {run_dir}", file=sys.stderr)
    if resumed is not None:
        print(f"resuming {run_dir} at step {global_step} (update {update})", file=sys.stderr)

    started = time.perf_counter()
    start_step = global_step
    # A resumed run reseeds the envs from its step count: a fresh but reproducible stream
    # (env i draws from seed + step + i).
    batched, _ = envs.reset(seed=config.seed + global_step)
    observations = unbatch(batched, config.num_envs)
    running_returns = np.zeros(config.num_envs)
    bar = tqdm(
        total=config.total_steps,
        initial=global_step,
        desc=f"ppo {'+'.join(config.models)}",
        unit="step",
        disable=not progress,
        file=sys.stderr,
        mininterval=0.5,
    )

    def real_measurements() -> int:
        """End-to-end measurements of the whole run, earlier runs of it included."""
        return real_measurements_before + int(sum(envs.get_attr("real_measurements")))

    def values_of(states: list[dict[str, np.ndarray]]) -> list[float]:
        with torch.no_grad():
            return [float(v) for v in scorer.value(collate(states)).reshape(-1)]

    while global_step < config.total_steps:
        remaining = 1.0 - global_step / config.total_steps  # of the run, at this update's start
        if config.anneal_lr:
            optimizer.param_groups[0]["lr"] = remaining * config.learning_rate

        # ---- rollout: num_steps steps of every env (or until enough episodes have ended)
        rollouts = [EnvRollout() for _ in range(config.num_envs)]
        episodes_done, steps_done = 0, 0
        scorer.eval()
        while global_step < config.total_steps and (
            steps_done < config.num_steps
            if config.num_steps is not None
            else episodes_done < config.episodes_per_update
        ):
            states = [observation_to_data(observation) for observation in observations]
            candidates: list[list[Data]] = [[] for _ in observations]
            if scorer.needs_candidate_graphs:
                candidates = [candidate_data(c) for c in envs.call("candidate_observations")]
            with torch.no_grad():
                action, logprob, _, value = evaluate_actions(scorer, states, candidates)
            batched, rewards, terminations, truncations, infos = envs.step(action.numpy())
            following = unbatch(batched, config.num_envs)
            global_step += config.num_envs
            steps_done += 1
            bar.update(config.num_envs)
            truncated_states = [
                index
                for index in range(config.num_envs)
                if truncations[index] and not terminations[index]
            ]
            final_observations = infos.get("final_obs")
            bootstrap = dict(
                zip(
                    truncated_states,
                    values_of([final_observations[i] for i in truncated_states])
                    if truncated_states
                    else [],
                )
            )
            for index, rollout in enumerate(rollouts):
                reward = float(rewards[index])
                ended = bool(terminations[index] or truncations[index])
                rollout.add(
                    states[index],
                    candidates[index],
                    int(action[index]),
                    float(logprob[index]),
                    reward,
                    float(value[index]),
                    ended=ended,
                    next_value=0.0 if terminations[index] else bootstrap.get(index),
                )
                running_returns[index] += reward
                if not ended:
                    continue
                episode += 1
                episodes_done += 1
                final = {key: infos["final_info"][key][index] for key in EPISODE_INFO}
                entry = {
                    "episode": episode,
                    "global_step": global_step,
                    "model": str(final["model"]),
                    "return": float(running_returns[index]),
                    "speedup": float(final["speedup"]),
                    "length": int(final["step"]),
                    "revisits": int(final["revisits"]),
                    "real_measurements": real_measurements(),
                    "wall_s": wall_before + time.perf_counter() - started,
                }
                running_returns[index] = 0.0
                progress_log["episodes"].append(entry)
                writer.scalar("charts/episodic_return", entry["return"], global_step)
                writer.scalar("charts/speedup", entry["speedup"], global_step)
                writer.scalar("charts/episodic_length", entry["length"], global_step)
                bar.set_postfix_str(f"return {entry['return']:.2f} speedup {entry['speedup']:.3f}")
            observations = following

        # ---- advantages: GAE env by env; a rollout cut mid-episode bootstraps from V(s_T)
        cut = [index for index, rollout in enumerate(rollouts) if rollout.open]
        for index, next_value in zip(cut, values_of([observations[i] for i in cut]) if cut else []):
            rollouts[index].close(next_value)
        pieces = [rollout.advantages(config.gamma, config.gae_lambda) for rollout in rollouts]
        advantages = torch.cat([piece[0] for piece in pieces])
        b_values = torch.cat([piece[1] for piece in pieces])
        returns = advantages + b_values
        obs = [state for rollout in rollouts for state in rollout.states]
        cands = [candidate for rollout in rollouts for candidate in rollout.candidates]
        b_actions = torch.tensor([a for rollout in rollouts for a in rollout.actions])
        b_logprobs = torch.tensor([p for rollout in rollouts for p in rollout.logprobs])

        # ---- optimise the policy and value network
        scorer.train()
        rollout = Rollout(b_logprobs, b_values, advantages, returns)
        evaluate = replay(scorer, obs, cands, b_actions)
        stats = ppo_update(evaluate, rollout, scorer, optimizer, config.update_config())
        demo_loss = None
        if demos is not None and config.demo_coef > 0:
            from rlflow.agents.demos import demo_pass

            weight = config.demo_coef * remaining
            demo_loss = demo_pass(
                scorer,
                optimizer,
                demos,
                demo_rng,
                config.minibatch_size,
                weight=weight,
                max_grad_norm=config.max_grad_norm,
            )
            writer.scalar("losses/demo", demo_loss, global_step)
            writer.scalar("charts/demo_weight", weight, global_step)
        update += 1

        y_pred, y_true = b_values.numpy(), returns.numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
        elapsed = time.perf_counter() - started
        sps = int((global_step - start_step) / elapsed) if elapsed > 0 else 0
        writer.scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.scalar("losses/value_loss", stats.value_loss, global_step)
        writer.scalar("losses/policy_loss", stats.policy_loss, global_step)
        writer.scalar("losses/entropy", stats.entropy, global_step)
        writer.scalar("losses/old_approx_kl", stats.old_approx_kl, global_step)
        writer.scalar("losses/approx_kl", stats.approx_kl, global_step)
        writer.scalar("losses/clipfrac", stats.clipfrac, global_step)
        writer.scalar("losses/explained_variance", explained_var, global_step)
        writer.scalar("charts/SPS", sps, global_step)
        writer.scalar("charts/real_measurements", real_measurements(), global_step)
        progress_log["updates"].append(
            {
                "update": update,
                "global_step": global_step,
                "value_loss": stats.value_loss,
                "policy_loss": stats.policy_loss,
                "entropy": stats.entropy,
                "approx_kl": stats.approx_kl,
                "clipfrac": stats.clipfrac,
                "sps": sps,
                **({} if demo_loss is None else {"demo_loss": demo_loss}),
            }
        )

        # ---- checkpoint: progress first, so a kill in between leaves progress ahead of the
        # checkpoint, which a rerun trims back to it
        wall_s = wall_before + time.perf_counter() - started
        progress_log.update(
            global_step=global_step,
            updates_done=update,
            episodes_done=episode,
            real_measurements=real_measurements(),
            wall_s=wall_s,
        )
        write_json_atomic(run_dir / "progress.json", progress_log)
        write_torch_atomic(
            checkpoint_path,
            {
                "kind": "ppo",
                "version": CHECKPOINT_VERSION,
                "config": config.to_dict(),
                "rule_names": rule_names,
                "model": scorer.state_dict(),
                "optimizer": optimizer.state_dict(),
                "global_step": global_step,
                "update": update,
                "episodes": episode,
                "real_measurements": real_measurements(),
                "wall_s": wall_s,
                "torch_rng": torch.get_rng_state(),
                "numpy_rng": np.random.get_state(),
            },
        )
        writer.flush()

    bar.close()
    writer.close()
    recent = progress_log["episodes"][-config.episodes_per_update :]
    return {
        "run_dir": str(run_dir),
        "global_step": global_step,
        "updates": update,
        "episodes": episode,
        "real_measurements": real_measurements(),
        "wall_s": wall_before + time.perf_counter() - started,
        "mean_return": float(np.mean([e["return"] for e in recent])) if recent else None,
        "mean_speedup": float(np.mean([e["speedup"] for e in recent])) if recent else None,
        "resumed": resumed is not None,
    }


# ---- run-directory helpers -----------------------------------------------------------------


def _load_network(
    scorer: CandidateScorer,
    checkpoint: dict[str, Any],
    rule_names: list[str],
    what: str,
    remedy: str,
) -> None:
    """Load a checkpoint's network into `scorer`, refusing one trained on another rule set
    (its candidate slots would mean other rules)."""
    if checkpoint["rule_names"] != rule_names:
        raise RlflowError(f"{what} was trained on another rule set; {remedy}")
    scorer.load_state_dict(checkpoint["model"])


NETWORK_FIELDS = ("scorer", "hidden", "layers", "heads", "max_candidates", "max_site_nodes")
"""The PPOConfig fields that shape the network: a run fine-tunes another only if they agree."""


def initial_network(config: PPOConfig) -> dict[str, Any]:
    """The checkpoint of the run `config.init_from` names, whose network a fresh run starts
    from; RlflowError if it is missing or its network has another shape."""
    source = load_checkpoint(str(config.init_from))
    theirs = saved_config(source["config"])
    differ = [n for n in NETWORK_FIELDS if theirs.get(n) != getattr(config, n)]
    if differ:
        details = ", ".join(
            f"{n} {theirs.get(n)!r}, this run {getattr(config, n)!r}" for n in differ
        )
        raise RlflowError(
            f"--init-from {config.init_from}: its network has another shape ({details}); "
            "give the same network settings"
        )
    return source


def _check_resumable(saved: dict[str, Any], config: PPOConfig, run_dir: Path) -> None:
    """RlflowError when a rerun asks for other settings than the run it would continue."""
    saved = saved_config(saved)
    wanted = config.to_dict()
    changed = [n for n in wanted if n not in MAY_CHANGE and saved.get(n) != wanted[n]]
    if changed:
        details = ", ".join(f"{n} {saved.get(n)!r} -> {wanted[n]!r}" for n in changed)
        raise RlflowError(
            f"{run_dir} holds a PPO run made with other settings ({details}); rerun with its "
            "settings, train into a new --out, or pass --force to start it over"
        )


def _hyperparameter_table(config: PPOConfig) -> str:
    rows = "\n".join(f"|{key}|{value}|" for key, value in config.to_dict().items())
    return f"|param|value|\n|-|-|\n{rows}"


def _progress_until(progress: dict[str, Any], global_step: int) -> dict[str, Any]:
    """A progress log trimmed to what a checkpoint at `global_step` had seen."""
    progress = progress or {}
    progress.setdefault("kind", "ppo")
    for key in ("episodes", "updates"):
        progress[key] = [
            entry for entry in progress.get(key, []) if entry.get("global_step", 0) <= global_step
        ]
    return progress
