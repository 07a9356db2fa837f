"""`rlflow train-wm`: fit V (the graph VAE), then M (the MDN-RNN) on collected rollouts.

Both stages checkpoint after every epoch (atomically) and a rerun resumes from the last one;
a finished stage is skipped. Epoch e draws its randomness from (seed, stage, e), so a resumed
run trains exactly as an uninterrupted one. Scalars go to TensorBoard under RUN_DIR:
`wm/recon`, `wm/kl` (VAE), `wm/mdn_nll`, `wm/cost_mse` (M's cost head, in reward units),
`wm/done_bce`, `wm/mask_bce` (MDN-RNN), each also as `wm/val_*` on the held-out episodes;
the further members of an ensemble (`--ensemble K`) under `wm/memberK/`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Batch

from rlflow.errors import RlflowError
from rlflow.fileio import write_json_atomic, write_torch_atomic
from rlflow.nn import graph_to_data
from rlflow.tensorboard import TensorBoard
from rlflow.worldmodel.data import RolloutData
from rlflow.worldmodel.dream import uniform_dream_steps
from rlflow.worldmodel.mdnrnn import COST_HEADS, MDNRNN, MDNOutput, mdnrnn_losses
from rlflow.worldmodel.model import (
    DREAM_START,
    DYNAMICS,
    LATENTS,
    PROGRESS,
    VAE_CHECKPOINT,
    WorldModel,
    load_checkpoint,
    load_npz,
    member_checkpoint,
    save_npz,
)
from rlflow.worldmodel.vae import GraphVAE, vae_losses


@dataclass
class WorldModelSettings:
    """Hyperparameters of `rlflow train-wm` (mirrored by configs/worldmodel.yaml, train_wm)."""

    latent: int = 32  # size of z (World Models: 32)
    encoder_hidden: int = 64  # GraphEncoder embedding size
    encoder_layers: int = 3  # GraphEncoder GATv2 layers
    encoder_heads: int = 4  # GraphEncoder attention heads
    decoder_hidden: int = 128  # width of the VAE decoder
    beta: float = 1.0  # weight of the KL term
    kl_tolerance: float = 0.5  # free nats per latent dimension before KL counts (World Models: 0.5)
    vae_epochs: int = 30  # passes over the training observations
    vae_batch: int = 64  # graphs per VAE minibatch
    vae_lr: float = 1e-3  # Adam learning rate of the VAE
    rnn_hidden: int = 256  # LSTM size of the MDN-RNN (World Models: 256)
    mixtures: int = 8  # Gaussians per latent dimension (World Models: 5; RLFlow: 8)
    action_embedding: int = 32  # size of the learned rule embedding fed to the LSTM
    rnn_epochs: int = 40  # passes over the training episodes
    rnn_batch: int = 16  # episodes per MDN-RNN minibatch (fewer on small data: rnn_batch_size)
    rnn_lr: float = 1e-3  # Adam learning rate of the MDN-RNN
    cost_head: str = "step"  # M's cost output: step (the change from C_t) | level (C_{t+1} / C_0)
    ensemble: int = 5
    """How many Ms to train on the data (a deep ensemble): member 0 on all of it, as a
    one-member run's M; the others on bootstrap resamples of the episodes, from their own
    initialisations. The dream's cost is their mean, and `train-controller --uncertainty`
    charges their disagreement. On Transformer-Transducer M alone priced a Gemm un-fusion at
    +0.1 (the data: -0.2 mostly, one +3.4); the five members' mean at -0.05."""
    grad_clip: float = 10.0  # gradient-norm clip of both stages
    holdout: float = 0.1  # fraction of episodes held out for the wm/val_* scalars
    seed: int = 0  # seed of the split, the initialisations and the minibatch order

    def validate(self) -> None:
        if min(self.latent, self.vae_epochs, self.rnn_epochs, self.rnn_hidden, self.ensemble) < 1:
            raise RlflowError(
                "latent, vae_epochs, rnn_epochs, rnn_hidden and ensemble must be at least 1"
            )
        if self.cost_head not in COST_HEADS:
            raise RlflowError(
                f"unknown cost head {self.cost_head!r}; choose one of {', '.join(COST_HEADS)}"
            )


MIN_RNN_BATCHES = 4
"""Minibatches per epoch of M at least (see `rnn_batch_size`)."""


def few_episodes(settings: WorldModelSettings, episodes: int) -> bool:
    """Whether `episodes` make fewer than `MIN_RNN_BATCHES` minibatches of `rnn_batch`: the data
    on which M is trained with smaller minibatches (`rnn_batch_size`) and its applicability
    head started at each rule's frequency (`mask_prior_logits`)."""
    return math.ceil(episodes / settings.rnn_batch) < MIN_RNN_BATCHES


def rnn_batch_size(settings: WorldModelSettings, episodes: int) -> int:
    """Episodes per minibatch of M: `rnn_batch`, or on `few_episodes` as many as make
    `MIN_RNN_BATCHES` minibatches an epoch.

    Few long episodes (SqueezeNet's data: 11 training episodes of up to 100 steps) fit in one
    minibatch of 16, so 40 epochs were 40 updates of M, where 64 episodes give 160. M needs
    updates, not passes; data with `MIN_RNN_BATCHES` minibatches or more is split as before."""
    if not few_episodes(settings, episodes):
        return settings.rnn_batch
    return max(1, math.ceil(episodes / MIN_RNN_BATCHES))


MASK_PRIOR_FLOOR = 1e-3
"""The rarest applicability (and 1 - the commonest) a rule's prior logit is set from."""


def mask_prior_logits(data: RolloutData, episodes: Sequence[int]) -> np.ndarray:
    """(R,) log-odds of each rule being applicable after a step of `episodes`: where M's
    applicability head starts, instead of "not applicable" for every rule.

    A dream goes on only while M predicts some rule applicable. Started at "no" for every rule,
    an M trained on few episodes (SqueezeNet's 11) said "no" to every rule after the first step
    of every episode, where the data had 7 applicable, so every dream ended there and the
    controllers learnt from one step's reward; more updates alone (`rnn_batch_size`) left one
    seed of three so. Started at each rule's frequency, the rules applicable most of the time
    begin so, and M learns where they are not. `train_rnn` starts M here only on
    `few_episodes`: on the test pipeline's 32 (four minibatches of 8), where
    the uniform start learns, this one left M's cost head worse on the held-out episodes in three
    seeds of three (squared error 36, 64 and 10, against 16, 57 and 7 from the uniform start)."""
    sequences = episode_sequences(data, episodes)
    steps = sequences.steps[sequences.valid]
    if not len(steps):
        return np.full(data.num_rules, np.log(MASK_PRIOR_FLOOR / (1 - MASK_PRIOR_FLOOR)))
    frequency = data.arrays["next_rule_applicable"][steps].mean(axis=0)
    frequency = np.clip(frequency, MASK_PRIOR_FLOOR, 1 - MASK_PRIOR_FLOOR)
    return np.log(frequency / (1 - frequency))


def _generator(seed: int, stage: int, epoch: int, *member: int) -> tuple[np.random.Generator, int]:
    """The draws of one epoch of one stage (of one ensemble member past the first)."""
    sequence = np.random.SeedSequence([seed, stage, epoch, *member])
    numpy_seed, torch_seed = sequence.generate_state(2)
    return np.random.default_rng(numpy_seed), int(torch_seed)


def episode_observations(data: RolloutData, episodes: np.ndarray) -> np.ndarray:
    """Observation indices of the given episodes (all T + 1 of each)."""
    steps = data.arrays["episode_steps"]
    return (
        np.concatenate(
            [np.arange(data.obs_start[e], data.obs_start[e] + steps[e] + 1) for e in episodes]
        )
        if len(episodes)
        else np.zeros(0, dtype=np.int64)
    )


def vae_kwargs(data: RolloutData, settings: WorldModelSettings) -> dict[str, Any]:
    manifest = data.manifest
    return {
        "num_rules": data.num_rules,
        "summary_dim": 2 * (len(manifest["op_types"]) + 1) + len(manifest["global_features"]),
        "node_dim": len(manifest["node_features"]),
        "edge_dim": len(manifest["edge_features"]),
        "global_dim": len(manifest["global_features"]),
        "latent": settings.latent,
        "hidden": settings.encoder_hidden,
        "layers": settings.encoder_layers,
        "heads": settings.encoder_heads,
        "decoder_hidden": settings.decoder_hidden,
    }


def rnn_kwargs(data: RolloutData, settings: WorldModelSettings) -> dict[str, Any]:
    return {
        "latent": settings.latent,
        "num_rules": data.num_rules,
        "hidden": settings.rnn_hidden,
        "mixtures": settings.mixtures,
        "action_embedding": settings.action_embedding,
        "cost_head": settings.cost_head,
    }


SUMMARY_STD_FLOOR = 0.05
"""Summary features varying less than this over the data are scaled by it instead of by their
standard deviation: near-constant features must not turn into amplified noise."""


def standardized_summaries(
    data: RolloutData, reference: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The VAE's targets: graph summaries standardized by their mean and standard deviation
    over the `reference` observations (the training split), so that every feature weighs alike
    in the squared error: consecutive graphs differ by one rewrite, a tiny change in raw terms.
    Returns (standardized (O, S), mean (S,), scale (S,)): decoded * scale + mean is a summary."""
    summaries = data.summaries()
    rows = summaries[reference] if len(reference) else summaries
    mean, scale = rows.mean(axis=0), np.maximum(rows.std(axis=0), SUMMARY_STD_FLOOR)
    return ((summaries - mean) / scale).astype(np.float32), mean, scale


# ---- V ----------------------------------------------------------------------------------------


def _vae_pass(
    vae: GraphVAE,
    graphs: list[Any],
    summaries: torch.Tensor,
    applicable: torch.Tensor,
    indices: np.ndarray,
    settings: WorldModelSettings,
    optimizer: torch.optim.Optimizer | None,
) -> dict[str, float]:
    totals = {"recon": 0.0, "kl": 0.0}
    for start in range(0, len(indices), settings.vae_batch):
        chunk = indices[start : start + settings.vae_batch]
        batch = Batch.from_data_list([graphs[i] for i in chunk])
        if optimizer is None:
            with torch.no_grad():
                losses = vae_losses(vae(batch, sample=False), summaries[chunk], applicable[chunk])
        else:
            losses = vae_losses(
                vae(batch),
                summaries[chunk],
                applicable[chunk],
                settings.beta,
                settings.kl_tolerance,
            )
            optimizer.zero_grad()
            losses["loss"].backward()
            torch.nn.utils.clip_grad_norm_(vae.parameters(), settings.grad_clip)
            optimizer.step()
        for key in totals:
            totals[key] += losses[key].item() * len(chunk)
    return {key: value / max(len(indices), 1) for key, value in totals.items()}


def train_vae(
    data: RolloutData,
    run_dir: Path,
    settings: WorldModelSettings,
    train_episodes: np.ndarray,
    val_episodes: np.ndarray,
    logger: TensorBoard,
    progress: bool = True,
) -> GraphVAE:
    """Train (or resume) V; a finished checkpoint is loaded as is."""
    from tqdm import tqdm

    path = run_dir / VAE_CHECKPOINT
    kwargs = vae_kwargs(data, settings)
    torch.manual_seed(settings.seed)
    vae = GraphVAE(**kwargs)
    optimizer = torch.optim.Adam(vae.parameters(), lr=settings.vae_lr)
    epoch = 0
    if path.exists():
        checkpoint = load_checkpoint(path, "VAE checkpoint")
        vae.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        epoch = int(checkpoint["epoch"])
    if epoch >= settings.vae_epochs:
        return vae.eval()

    graphs = [graph_to_data(data.graph(i)) for i in range(data.num_observations)]
    train_obs = episode_observations(data, train_episodes)
    val_obs = episode_observations(data, val_episodes)
    standardized, summary_mean, summary_scale = standardized_summaries(data, train_obs)
    summaries = torch.as_tensor(standardized)
    applicable = torch.as_tensor(data.arrays["rule_applicable"])
    bar = tqdm(
        total=settings.vae_epochs,
        initial=epoch,
        desc="train-wm V (graph VAE)",
        unit="epoch",
        file=sys.stderr,
        disable=not progress,
    )
    while epoch < settings.vae_epochs:
        rng, torch_seed = _generator(settings.seed, 1, epoch)
        torch.manual_seed(torch_seed)
        vae.train()
        train = _vae_pass(
            vae, graphs, summaries, applicable, rng.permutation(train_obs), settings, optimizer
        )
        vae.eval()
        val = _vae_pass(vae, graphs, summaries, applicable, val_obs, settings, None)
        epoch += 1
        logger.scalar("wm/recon", train["recon"], epoch)
        logger.scalar("wm/kl", train["kl"], epoch)
        if len(val_obs):
            logger.scalar("wm/val_recon", val["recon"], epoch)
            logger.scalar("wm/val_kl", val["kl"], epoch)
        write_torch_atomic(
            path,
            {
                "epoch": epoch,
                "finished": epoch >= settings.vae_epochs,
                "kwargs": kwargs,
                "model": vae.state_dict(),
                "optimizer": optimizer.state_dict(),
                "train": train,
                "val": val,
                "summary_mean": torch.as_tensor(summary_mean),
                "summary_scale": torch.as_tensor(summary_scale),
                "data_digest": data.digest,
            },
        )
        bar.update(1)
        bar.set_postfix_str(f"recon {train['recon']:.3f} kl {train['kl']:.2f}")
    bar.close()
    return vae.eval()


@torch.no_grad()
def encode_all(vae: GraphVAE, data: RolloutData, batch_size: int = 256) -> tuple[np.ndarray, ...]:
    """mu and log sigma (O, Z) of every observation."""
    vae.eval()
    mus, logsigmas = [], []
    for start in range(0, data.num_observations, batch_size):
        indices = range(start, min(start + batch_size, data.num_observations))
        batch = Batch.from_data_list([graph_to_data(data.graph(i)) for i in indices])
        mu, logsigma = vae.encode(batch)
        mus.append(mu.numpy())
        logsigmas.append(logsigma.numpy())
    return np.concatenate(mus), np.concatenate(logsigmas)


# ---- M ----------------------------------------------------------------------------------------


@dataclass
class Sequences:
    """Episodes as padded (B, T) tensors for the MDN-RNN."""

    obs: np.ndarray  # (B, T + 1) observation indices (the last padded ones repeat)
    steps: np.ndarray  # (B, T) step indices
    valid: np.ndarray  # (B, T) bool


def episode_sequences(data: RolloutData, episodes: Sequence[int]) -> Sequences:
    lengths = data.arrays["episode_steps"][list(episodes)]
    horizon = int(lengths.max()) if len(lengths) else 1
    obs = np.zeros((len(lengths), horizon + 1), dtype=np.int64)
    steps = np.zeros((len(lengths), horizon), dtype=np.int64)
    valid = np.zeros((len(lengths), horizon), dtype=bool)
    for row, (episode, length) in enumerate(zip(episodes, lengths)):
        t = np.arange(horizon + 1)
        obs[row] = data.obs_start[episode] + np.minimum(t, length)
        steps[row] = data.step_start[episode] + np.minimum(t[:-1], length - 1)
        valid[row, :length] = True
    return Sequences(obs, steps, valid)


def rnn_predictions(
    rnn: MDNRNN, data: RolloutData, sequences: Sequences, latents: np.ndarray
) -> tuple[MDNOutput, dict[str, torch.Tensor]]:
    """M's one-step predictions along `sequences`, teacher forced (the true latent, given one
    per observation, and the true current cost for the step head), and the real next steps
    they are scored against: `mdnrnn_losses`' keyword arguments."""
    z = torch.as_tensor(latents[sequences.obs], dtype=torch.float32)  # (B, T + 1, Z)
    arrays = data.arrays
    actions = torch.as_tensor(arrays["action_rule"][sequences.steps], dtype=torch.long)
    costs = torch.as_tensor(cost_ratios(data)[sequences.obs], dtype=torch.float32)
    output, _ = rnn(z[:, :-1], actions, cost=costs[:, :-1])
    targets = {
        "next_z": z[:, 1:],
        "next_cost": costs[:, 1:],
        "done": torch.as_tensor(arrays["terminated"][sequences.steps]),
        "next_applicable": torch.as_tensor(arrays["next_rule_applicable"][sequences.steps]),
        "valid": torch.as_tensor(sequences.valid),
        "stopped": actions == rnn.stop_action,
    }
    return output, targets


def rnn_batch_losses(
    rnn: MDNRNN, data: RolloutData, sequences: Sequences, latents: np.ndarray
) -> dict[str, torch.Tensor]:
    """The MDN-RNN losses of a batch of sequences, given one latent per observation."""
    output, targets = rnn_predictions(rnn, data, sequences, latents)
    return mdnrnn_losses(output, **targets)


def cost_ratios(data: RolloutData) -> np.ndarray:
    """(O,) C_t / C_0 of every observation (its `cost_ratio` global feature): M's cost target."""
    column = list(data.manifest["global_features"]).index("cost_ratio")
    return data.arrays["global_features"][:, column].astype(np.float32)


RNN_SCALARS = ("mdn_nll", "cost_mse", "done_bce", "mask_bce")


@torch.no_grad()
def evaluate_rnn(
    rnn: MDNRNN, data: RolloutData, episodes: np.ndarray, mu: np.ndarray
) -> dict[str, float]:
    """Mean per-step losses on `episodes` with z = mu (no sampling): e.g. held-out NLL."""
    if not len(episodes):
        return {key: float("nan") for key in RNN_SCALARS}
    rnn.eval()
    sequences = episode_sequences(data, episodes)
    losses = rnn_batch_losses(rnn, data, sequences, mu)
    return {key: float(losses[key]) for key in RNN_SCALARS}


def train_rnn(
    data: RolloutData,
    run_dir: Path,
    settings: WorldModelSettings,
    train_episodes: np.ndarray,
    val_episodes: np.ndarray,
    mu: np.ndarray,
    logsigma: np.ndarray,
    logger: TensorBoard,
    meta: dict[str, Any],
    vae_epoch: int,
    progress: bool = True,
    member: int = 0,
) -> MDNRNN:
    """Train (or resume) M, or ensemble member `member` of it, on sequences of latents
    sampled from V's posterior each epoch."""
    from tqdm import tqdm

    path = run_dir / member_checkpoint(member)
    kwargs = rnn_kwargs(data, settings)
    extra = (member,) if member else ()  # member 0 draws what a one-member run draws
    torch.manual_seed(settings.seed + 1 + 7919 * member)
    rnn = MDNRNN(**kwargs)
    if few_episodes(settings, len(train_episodes)):
        rnn.set_mask_prior(torch.as_tensor(mask_prior_logits(data, train_episodes)))
    optimizer = torch.optim.Adam(rnn.parameters(), lr=settings.rnn_lr)
    epoch = 0
    checkpoint = load_checkpoint(path, "MDN-RNN checkpoint") if path.exists() else None
    # An M trained on the latents of an earlier V (more VAE epochs asked since) starts over.
    if (
        checkpoint is not None
        and checkpoint.get("vae_epoch") == vae_epoch
        and checkpoint.get("meta", {}).get("dynamics") == DYNAMICS
    ):
        rnn.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        epoch = int(checkpoint["epoch"])
        if epoch >= settings.rnn_epochs and checkpoint.get("meta") != meta:
            # finished, rerun with another ensemble size: the weights stay, the meta follows
            write_torch_atomic(path, {**checkpoint, "meta": meta})
    bar = tqdm(
        total=settings.rnn_epochs,
        initial=min(epoch, settings.rnn_epochs),
        desc="train-wm M (MDN-RNN)" + (f" member {member}" if member else ""),
        unit="epoch",
        file=sys.stderr,
        disable=not progress,
    )
    sigma = np.exp(logsigma)
    if member:  # a bootstrap of the episodes: members differ most where few episodes decide
        resample = np.random.default_rng([settings.seed, 3, member])
        train_episodes = resample.choice(train_episodes, size=len(train_episodes))
    finished = epoch >= settings.rnn_epochs
    while not finished:
        rng, torch_seed = _generator(settings.seed, 2, epoch, *extra)
        torch.manual_seed(torch_seed)
        latents = (mu + sigma * rng.standard_normal(mu.shape)).astype(np.float32)
        order = rng.permutation(train_episodes)
        rnn.train()
        totals = dict.fromkeys(RNN_SCALARS, 0.0)
        count = 0
        batch = rnn_batch_size(settings, len(order))
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            sequences = episode_sequences(data, chunk)
            losses = rnn_batch_losses(rnn, data, sequences, latents)
            optimizer.zero_grad()
            losses["loss"].backward()
            torch.nn.utils.clip_grad_norm_(rnn.parameters(), settings.grad_clip)
            optimizer.step()
            weight = int(sequences.valid.sum())
            count += weight
            for key in RNN_SCALARS:
                totals[key] += losses[key].item() * weight
        train = {key: value / max(count, 1) for key, value in totals.items()}
        val = evaluate_rnn(rnn, data, val_episodes, mu)
        epoch += 1
        finished = epoch >= settings.rnn_epochs
        tag = f"wm/member{member}/" if member else "wm/"
        for key in RNN_SCALARS:
            logger.scalar(f"{tag}{key}", train[key], epoch)
            if len(val_episodes):
                logger.scalar(f"{tag}val_{key}", val[key], epoch)
        write_torch_atomic(
            path,
            {
                "epoch": epoch,
                "finished": finished,
                "kwargs": kwargs,
                "model": rnn.state_dict(),
                "optimizer": optimizer.state_dict(),
                "train": train,
                "val": val,
                "meta": meta,
                "vae_epoch": vae_epoch,
            },
        )
        bar.update(1)
        bar.set_postfix_str(f"nll {train['mdn_nll']:.2f} cost {train['cost_mse']:.3f}")
    bar.close()
    return rnn.eval()


# ---- the whole of train-wm ----------------------------------------------------------------------


def training_data(data_dir: str | Path, run_dir: str | Path) -> RolloutData:
    """The rollouts of DATA_DIR, every shard read and checked for training into RUN_DIR:
    RlflowError for a damaged shard, too few episodes, or a RUN_DIR trained on other data (a
    directory that `rlflow collect` has grown since, or another one), whose checkpoints,
    latents and episode indices would be mixed with these. Nothing is written."""
    data = RolloutData.load(data_dir)
    if data.num_episodes < 2:
        raise RlflowError(
            f"{data_dir} holds {data.num_episodes} episode; the world model needs at least 2 "
            "(one is held out)"
        )
    path = Path(run_dir) / VAE_CHECKPOINT
    if path.exists() and load_checkpoint(path, "VAE checkpoint").get("data_digest") != data.digest:
        raise RlflowError(
            f"--data {data_dir} is not what {run_dir} was trained on (it has changed since, "
            f"and holds {data.num_episodes} episodes now); train into a new --out"
        )
    return data


def train_world_model(
    data_dir: str | Path,
    run_dir: str | Path,
    settings: WorldModelSettings,
    *,
    progress: bool = True,
    data: RolloutData | None = None,
) -> dict[str, Any]:
    """V, then the latents of every observation, then M; returns the run's summary. `data`:
    DATA_DIR's rollouts if already read by `training_data`."""
    settings.validate()
    run_dir = Path(run_dir)
    if data is None:
        data = training_data(data_dir, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    train_episodes, val_episodes = data.episodes_split(settings.holdout, settings.seed)
    with TensorBoard(run_dir) as logger:
        vae = train_vae(data, run_dir, settings, train_episodes, val_episodes, logger, progress)
        latents_path = run_dir / LATENTS
        vae_epoch = int(load_checkpoint(run_dir / VAE_CHECKPOINT)["epoch"])
        latents = load_npz(latents_path, "latents") if latents_path.exists() else {}
        if int(latents.get("vae_epoch", -1)) != vae_epoch:
            mu, logsigma = encode_all(vae, data)
            save_npz(latents_path, mu=mu, logsigma=logsigma, vae_epoch=np.array(vae_epoch))
        else:
            mu, logsigma = latents["mu"], latents["logsigma"]

        applicable = data.arrays["rule_applicable"]
        active = np.flatnonzero(applicable.any(axis=0))
        initial = data.obs_start
        save_npz(
            run_dir / DREAM_START,
            mu=mu[initial],
            logsigma=logsigma[initial],
            applicable=applicable[initial],
            cost=cost_ratios(data)[initial],
            model=data.arrays["episode_model"].astype(np.int64),
        )
        totals = data.manifest.get("totals", {})
        lengths = np.diff(np.append(data.step_start, data.num_steps))
        meta = {
            "dynamics": DYNAMICS,
            "rule_names": data.rule_names,
            "active_rules": [int(rule) for rule in active],
            "models": list(data.manifest["settings"]["models"]),
            "env": dict(data.manifest["env"]),
            "data": str(Path(data_dir).resolve()),
            "collect_totals": dict(totals),
            "longest_episode": int(lengths.max()) if len(lengths) else 0,
            "most_sites": [int(count) for count in data.most_sites()],
            "vae_kwargs": vae_kwargs(data, settings),
            "rnn_kwargs": rnn_kwargs(data, settings),
            "ensemble": settings.ensemble,
        }
        members = [
            train_rnn(
                data,
                run_dir,
                settings,
                train_episodes,
                val_episodes,
                mu,
                logsigma,
                logger,
                meta,
                vae_epoch,
                progress,
                member,
            )
            for member in range(settings.ensemble)
        ]
        val = evaluate_rnn(members[0], data, val_episodes, mu)
        dreams = uniform_dream_steps(WorldModel.load(run_dir))
        summary = {
            "run_dir": str(run_dir),
            "episodes": data.num_episodes,
            "observations": data.num_observations,
            "train_episodes": len(train_episodes),
            "val_episodes": len(val_episodes),
            "active_rules": len(active),
            "real_env_steps": int(totals.get("real_env_steps", 0)),
            "real_measurements": int(totals.get("real_measurements", 0)),
            "vae": load_checkpoint(run_dir / VAE_CHECKPOINT)["val"],
            "mdnrnn_val": val,
            "dream_steps": {
                "mean": float(dreams.mean()),
                "longest_episode": meta["longest_episode"],
            },
        }
        write_json_atomic(run_dir / PROGRESS, summary)
        return summary
