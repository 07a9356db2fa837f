"""`rlflow train-advantage`: the local advantage network, supervised on collected cost changes.

The data is a `rlflow collect --candidate-samples S` directory: at every visited state, S
candidates drawn at random and the relative change in the env's cost each makes
(`rlflow.worldmodel.data`, `advantage_slots` / `advantage_targets`). Each (state, candidate)
becomes one example: the k-hop subgraph around the candidate's site and its rule
(`rlflow.advantage.model`), regressed onto the change in percent (Huber loss; targets clipped
to +-`clip`, since past a doubling "much worse" is all a search needs to know). Whole episodes
are held out, and the held-out error is reported against the error of always predicting the
training mean, with the rank correlation that a search ordering candidates cares about.

A run directory holds `config.yaml` (kind: advantage, the data's path and digest, the
settings), TensorBoard events and `checkpoints/latest.pt`, written atomically after every
epoch; a rerun continues from it (only `epochs` may change), a rerun with other settings or
grown data is refused unless forced (the command removes the run first).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from rlflow.advantage.model import (
    DEFAULT_HOPS,
    PERCENT,
    AdvantageModel,
    collate_subgraphs,
    subgraph_data,
)
from rlflow.config import read_yaml, save_run_config
from rlflow.errors import RlflowError, first_line
from rlflow.fileio import write_torch_atomic
from rlflow.tensorboard import TensorBoard
from rlflow.worldmodel.data import RolloutData

CHECKPOINT = Path("checkpoints") / "latest.pt"
CHECKPOINT_VERSION = 1
RUN_KIND = "advantage"
MAY_CHANGE = ("epochs",)
"""What a rerun may change and still continue the run: how long it trains."""


@dataclass
class AdvantageSettings:
    """Hyperparameters of `rlflow train-advantage`; `configs/advantage.yaml` mirrors them."""

    hops: int = DEFAULT_HOPS  # k of the k-hop subgraph around each candidate's site
    hidden: int = 64  # embedding size of the encoder and the head
    layers: int = 3  # GATv2 layers of the shared encoder
    heads: int = 4  # attention heads per GATv2 layer
    epochs: int = 30  # passes over the training examples (a rerun may raise it)
    batch: int = 64  # examples per minibatch
    lr: float = 0.001  # Adam learning rate
    holdout: float = 0.1  # fraction of episodes held out for the reported error
    holdout_models: list[str] = field(default_factory=list)  # else: hold out these models
    clip: float = 100.0  # targets clipped to +-clip percent of the current cost
    seed: int = 0  # split, initialisation and minibatch order

    def validate(self) -> None:
        for name in ("epochs", "batch", "hidden", "heads"):
            if getattr(self, name) < 1:
                raise RlflowError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.hops < 0 or self.layers < 0:
            raise RlflowError(f"hops and layers must be at least 0, got {self.hops}, {self.layers}")
        if self.hidden % self.heads:
            raise RlflowError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if not 0.0 <= self.holdout < 1.0:
            raise RlflowError(f"holdout must be in [0, 1), got {self.holdout}")
        if not self.lr > 0.0 or not self.clip > 0.0:
            raise RlflowError(f"lr and clip must be positive, got {self.lr}, {self.clip}")


@dataclass
class Examples:
    """Every (state, sampled candidate) of a data directory as the network reads it."""

    items: list[Data]
    targets: np.ndarray
    """(N,) float32: the cost change in percent, clipped."""
    episodes: np.ndarray
    """(N,) the episode each example comes from (for the held-out split)."""


def examples(data: RolloutData, settings: AdvantageSettings, where: str = "DATA_DIR") -> Examples:
    """The examples of collected rollouts; RlflowError if they hold no cost changes."""
    if "advantage_targets" not in data.arrays:
        raise RlflowError(
            f"{where} holds no per-candidate cost changes: collect it with "
            "`rlflow collect --candidate-samples S` (and --cost analytic or perop)"
        )
    arrays = data.arrays
    slots, targets = arrays["advantage_slots"], arrays["advantage_targets"]
    max_site_nodes = int(data.manifest["env"]["max_site_nodes"])
    steps = arrays["episode_steps"].astype(np.int64)
    obs_episode = np.repeat(np.arange(len(steps)), steps + 1)
    items: list[Data] = []
    kept_targets: list[float] = []
    kept_episodes: list[int] = []
    for obs in range(data.num_observations):
        wanted = [(int(s), float(t)) for s, t in zip(slots[obs], targets[obs]) if s >= 0]
        if not wanted:
            continue
        graph = data.graph(obs)
        for slot, target in wanted:
            if not np.isfinite(target):
                continue
            site = arrays["candidate_sites"][obs, slot]
            items.append(
                subgraph_data(
                    graph["node_features"],
                    graph["edge_index"],
                    graph["edge_features"],
                    site[site >= 0],
                    int(arrays["candidate_rules"][obs, slot]),
                    hops=settings.hops,
                    max_site_nodes=max_site_nodes,
                )
            )
            kept_targets.append(float(np.clip(PERCENT * target, -settings.clip, settings.clip)))
            kept_episodes.append(int(obs_episode[obs]))
    if not items:
        raise RlflowError(f"{where} holds no candidate with a cost change (no state had one)")
    return Examples(
        items, np.asarray(kept_targets, np.float32), np.asarray(kept_episodes, np.int64)
    )


# ---- checkpoints ---------------------------------------------------------------------------


def load_checkpoint(run_dir: str | Path) -> dict[str, Any]:
    """The checkpoint of an advantage run; RlflowError if missing or unreadable."""
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise RlflowError(f"no advantage checkpoint at {path} (train one: rlflow train-advantage)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a truncated or foreign file: pickle, zip or torch errors
        raise RlflowError(f"cannot read checkpoint {path}: {first_line(error)}") from None
    if not isinstance(state, dict) or state.get("kind") != RUN_KIND:
        raise RlflowError(f"{path} is not an rlflow advantage checkpoint")
    if state.get("version") != CHECKPOINT_VERSION:
        raise RlflowError(
            f"{path} has checkpoint version {state.get('version')}, this rlflow reads "
            f"{CHECKPOINT_VERSION}"
        )
    return state


def make_model(settings: AdvantageSettings, num_rules: int) -> AdvantageModel:
    return AdvantageModel(
        num_rules, hidden=settings.hidden, layers=settings.layers, heads=settings.heads
    )


def settings_of(state: dict[str, Any]) -> AdvantageSettings:
    """The settings a checkpoint was trained with."""
    return AdvantageSettings(**state["settings"])


# ---- the run directory ---------------------------------------------------------------------


def prepare_run(out: Path, config: dict[str, Any], *, force: bool = False) -> None:
    """Make RUN_DIR ready for a run with `config` (its config.yaml: the data and settings).

    A run there with other settings or other data (a digest of its shards: `rlflow collect`
    may have grown it) is refused, unless `force`, which starts it over; a run there of
    another kind (a PPO or world-model run) is always refused. Call it once the data has been
    read: nothing is written before.
    """
    path = out / "config.yaml"
    if path.exists():
        saved = read_yaml(path)
        if saved.get("kind") != RUN_KIND:
            raise RlflowError(
                f"{out} holds a {saved.get('kind')!r} run, not an advantage run; use a new --out"
            )
        keys = (set(saved) | set(config)) - set(MAY_CHANGE) - {"kind"}
        differ = sorted(key for key in keys if saved.get(key) != config.get(key))
        if differ and not force:
            details = ", ".join(
                f"{key} {saved.get(key)!r} -> {config.get(key)!r}" for key in differ
            )
            raise RlflowError(
                f"{out} holds an advantage run made with other settings or data ({details}); "
                "rerun with its settings, train into a new --out, or pass --force to start it over"
            )
    if force:
        start_over(out)
    out.mkdir(parents=True, exist_ok=True)
    save_run_config(out, RUN_KIND, config)


def start_over(out: Path) -> None:
    """Remove what an advantage run wrote into RUN_DIR (`--force`); other files stay."""
    from rlflow.tensorboard import EVENT_FILE_PREFIX

    for path in (out / CHECKPOINT, out / "config.yaml", *out.glob(f"{EVENT_FILE_PREFIX}*")):
        path.unlink(missing_ok=True)


# ---- training ------------------------------------------------------------------------------


def predict(model: AdvantageModel, items: list[Data], batch: int = 256) -> np.ndarray:
    """The model's predictions (percent) for `items`, in order."""
    model.eval()
    outputs = []
    with torch.no_grad():
        for begin in range(0, len(items), batch):
            outputs.append(model(collate_subgraphs(items[begin : begin + batch])).numpy())
    return np.concatenate(outputs) if outputs else np.zeros(0, np.float32)


def held_out_error(
    predicted: np.ndarray, targets: np.ndarray, train_mean: float
) -> dict[str, float | None]:
    """Held-out mean absolute error (percentage points), the same for always predicting the
    training mean, and the Spearman rank correlation of predicted and true changes."""
    if targets.size == 0:
        return {"mae": None, "baseline_mae": None, "spearman": None, "examples": 0}
    spearman = None
    if targets.size > 1 and np.ptp(predicted) > 0 and np.ptp(targets) > 0:
        ranks_p = np.argsort(np.argsort(predicted)).astype(np.float64)
        ranks_t = np.argsort(np.argsort(targets)).astype(np.float64)
        spearman = float(np.corrcoef(ranks_p, ranks_t)[0, 1])
    return {
        "mae": float(np.mean(np.abs(predicted - targets))),
        "baseline_mae": float(np.mean(np.abs(train_mean - targets))),
        "spearman": spearman,
        "examples": int(targets.size),
    }


def held_out_episodes(data: RolloutData, settings: AdvantageSettings) -> np.ndarray:
    """The episodes whose examples measure the reported error: those of `holdout_models` when
    given (graphs the network never trains on, the question a guided search on an unseen model
    asks), else a seeded `holdout` fraction of all episodes. RlflowError for a model the data
    does not hold."""
    if not settings.holdout_models:
        return data.episodes_split(settings.holdout, settings.seed)[1]
    models = [str(model) for model in data.manifest["settings"]["models"]]
    unknown = [model for model in settings.holdout_models if model not in models]
    if unknown:
        raise RlflowError(
            f"--holdout-models {' '.join(unknown)}: not among the data's models "
            f"({', '.join(models)})"
        )
    held = [models.index(model) for model in settings.holdout_models]
    return np.flatnonzero(np.isin(data.arrays["episode_model"], held))


def train_advantage(
    data: RolloutData,
    found: Examples,
    out: str | Path,
    settings: AdvantageSettings,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Train (or continue) the advantage network of `out` on `found` (the examples of `data`)
    to `settings.epochs`; its summary, with the held-out error."""
    from tqdm import tqdm

    settings.validate()
    out = Path(out)
    checkpoint_path = out / CHECKPOINT
    resumed = load_checkpoint(out) if checkpoint_path.exists() else None
    rule_names = data.rule_names
    torch.manual_seed(settings.seed)
    model = make_model(settings, len(rule_names))
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    epoch = 0
    if resumed is not None:
        if resumed["rule_names"] != rule_names:
            raise RlflowError(f"{checkpoint_path} was trained with another rule set")
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        epoch = int(resumed["epoch"])
        torch.set_rng_state(resumed["torch_rng"])

    val_episodes = held_out_episodes(data, settings)
    in_val = np.isin(found.episodes, val_episodes)
    train_index, val_index = np.flatnonzero(~in_val), np.flatnonzero(in_val)
    if train_index.size == 0:
        raise RlflowError("no training example left after holding episodes out")
    train_mean = float(found.targets[train_index].mean())
    val_items = [found.items[i] for i in val_index]
    val_targets = found.targets[val_index]
    batches = -(-train_index.size // settings.batch)
    writer = TensorBoard(out, purge_step=epoch * batches + 1 if resumed else None)
    started = time.perf_counter()
    seen = 0
    held: dict[str, Any] = resumed.get("held_out", {}) if resumed else {}
    bar = tqdm(
        total=settings.epochs * batches,
        initial=epoch * batches,
        desc="advantage",
        unit="batch",
        disable=not progress,
        file=sys.stderr,
        mininterval=0.5,
    )
    while epoch < settings.epochs:
        model.train()
        # Seeded by epoch: a resumed run draws the minibatches an uninterrupted one would.
        order = np.random.default_rng([settings.seed, epoch]).permutation(train_index)
        losses = []
        for begin in range(0, order.size, settings.batch):
            chosen = order[begin : begin + settings.batch]
            batch = collate_subgraphs([found.items[i] for i in chosen])
            target = torch.as_tensor(found.targets[chosen])
            loss = torch.nn.functional.smooth_l1_loss(model(batch), target)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
            losses.append(loss.item())
            seen += chosen.size
            bar.update(1)
        epoch += 1
        step = epoch * batches
        held = held_out_error(predict(model, val_items), val_targets, train_mean)
        elapsed = time.perf_counter() - started
        writer.scalar("advantage/train_loss", float(np.mean(losses)), step)
        writer.scalar("charts/examples_per_s", seen / elapsed if elapsed > 0 else 0.0, step)
        for key in ("mae", "baseline_mae", "spearman"):
            if held[key] is not None:
                writer.scalar(f"advantage/val_{key}", held[key], step)
        if held["mae"] is not None:
            bar.set_postfix_str(f"held-out MAE {held['mae']:.3f} (mean {held['baseline_mae']:.3f})")
        write_torch_atomic(
            checkpoint_path,
            {
                "kind": RUN_KIND,
                "version": CHECKPOINT_VERSION,
                "settings": dataclasses.asdict(settings),
                "rule_names": rule_names,
                "max_site_nodes": int(data.manifest["env"]["max_site_nodes"]),
                "cost": data.manifest["env"].get("cost"),
                "data_digest": data.digest,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
                "torch_rng": torch.get_rng_state(),
                "held_out": held,
            },
        )
        writer.flush()
    bar.close()
    writer.close()
    return {
        "run_dir": str(out),
        "epochs": epoch,
        "examples": int(found.targets.size),
        "train_examples": int(train_index.size),
        "held_out": held,
        "held_out_models": list(settings.holdout_models),
        "cost": data.manifest["env"].get("cost"),
        "resumed": resumed is not None,
    }


__all__ = [
    "CHECKPOINT",
    "AdvantageSettings",
    "Examples",
    "examples",
    "held_out_episodes",
    "held_out_error",
    "load_checkpoint",
    "make_model",
    "predict",
    "prepare_run",
    "settings_of",
    "train_advantage",
]
