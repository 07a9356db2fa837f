"""The trained world model as one object (V + M + where dreams start), and atomic checkpoints.

`WorldModel.load(run_dir)` reads a `rlflow train-wm` run: `vae.pt`, `mdnrnn.pt` (and
`mdnrnn-K.pt` for the further members of an ensemble of Ms) and `dream_start.npz`.
`WorldModel.save_bundle(path)` / `WorldModel.from_bundle(path)` keep all of it in one file, so
a controller run carries the exact world model it was trained in.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlflow.envs import MAX_EPISODE_STEPS
from rlflow.errors import RlflowError, first_line
from rlflow.fileio import write_bytes_atomic, write_torch_atomic
from rlflow.nn import collate_graphs, graph_to_data
from rlflow.worldmodel.data import observation_record
from rlflow.worldmodel.mdnrnn import MDNRNN
from rlflow.worldmodel.vae import GraphVAE

VAE_CHECKPOINT = "vae.pt"
MDNRNN_CHECKPOINT = "mdnrnn.pt"
LATENTS = "latents.npz"
DREAM_START = "dream_start.npz"
CONFIG = "config.yaml"
PROGRESS = "progress.json"
DYNAMICS = "cost-ratio"
"""What M's scalar head predicts (`meta["dynamics"]`): the next cost ratio C_{t+1} / C_0. World
models of an older rlflow, whose M predicted the reward itself, are refused."""


def member_checkpoint(member: int) -> str:
    """The checkpoint file of M's ensemble member `member` (0: M itself, `mdnrnn.pt`)."""
    return MDNRNN_CHECKPOINT if member == 0 else f"mdnrnn-{member}.pt"


def load_checkpoint(path: str | Path, what: str = "checkpoint") -> dict[str, Any]:
    """A checkpoint saved by `rlflow.fileio.write_torch_atomic`; RlflowError if missing or
    unreadable."""
    path = Path(path)
    if not path.is_file():
        raise RlflowError(f"{what} {path} is missing")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle, zip and runtime errors all mean a damaged file
        raise RlflowError(f"{what} {path} is unreadable ({first_line(error)})") from None
    if not isinstance(payload, dict):
        raise RlflowError(f"{what} {path} is not an rlflow checkpoint")
    return payload


def save_pickle(path: str | Path, value: Any) -> None:
    """Pickle atomically (for optimiser objects torch.save cannot hold, e.g. a CMA-ES state)."""
    write_bytes_atomic(Path(path), pickle.dumps(value))


def load_pickle(path: str | Path, what: str) -> Any:
    path = Path(path)
    try:
        return pickle.loads(path.read_bytes())
    except FileNotFoundError:
        raise RlflowError(f"{what} {path} is missing") from None
    except Exception as error:
        raise RlflowError(f"{what} {path} is unreadable ({first_line(error)})") from None


def load_npz(path: str | Path, what: str) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise RlflowError(f"{what} {path} is missing")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except Exception as error:
        raise RlflowError(f"{what} {path} is unreadable ({first_line(error)})") from None


def save_npz(path: str | Path, **arrays: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomic(Path(path), buffer.getvalue())


class WorldModel:
    """V (GraphVAE), M (MDNRNN), the metadata of the data they learned from, and the latent
    distributions of real initial graphs that dreams start from.

    `meta` holds `rule_names`, `active_rules` (rule ids with a candidate somewhere in the
    data: the only rules a controller can choose), `models`, `env` (the GraphRewriteEnv
    settings of the data), `dynamics` (`DYNAMICS`) and the data's real-env totals. `start`
    holds `mu`, `logsigma` (N0, Z), `applicable` (N0, R) bool, `cost` (N0,) (C_0 / C_0, 1) and
    `model` (N0,) of the data's first observations. `members` are the ensemble of Ms (`rnn`
    first, the only one unless trained with `--ensemble`): the dream follows `rnn` and
    averages the members' costs (rlflow.worldmodel.dream).
    """

    def __init__(
        self,
        vae: GraphVAE,
        rnn: MDNRNN,
        meta: dict[str, Any],
        start: dict[str, np.ndarray],
        others: list[MDNRNN] | None = None,
    ) -> None:
        self.vae, self.rnn, self.meta, self.start = vae.eval(), rnn.eval(), meta, start
        self.members = [rnn] + [other.eval() for other in others or []]
        self.active_rules = np.asarray(meta["active_rules"], dtype=np.int64)

    @property
    def rule_names(self) -> list[str]:
        return list(self.meta["rule_names"])

    @property
    def latent(self) -> int:
        return self.vae.latent

    @property
    def hidden(self) -> int:
        return self.rnn.hidden

    @property
    def num_actions(self) -> int:
        """Active rules plus stop: the dream's and the controller's action count."""
        return len(self.active_rules) + 1

    def action_rules(self, actions: np.ndarray) -> np.ndarray:
        """Dream actions (0..A-1 active rules, A stop) as rule ids (R for stop)."""
        actions = np.asarray(actions, dtype=np.int64)
        stop = actions >= len(self.active_rules)
        rules = self.active_rules[np.minimum(actions, len(self.active_rules) - 1)]
        return np.where(stop, self.rnn.num_rules, rules)

    @property
    def max_episode_steps(self) -> int:
        """The real env's episode limit when the data was collected (its TimeLimit; the env's
        default if not recorded): the env a controller acts in gets the same, so that the step
        fraction it observes is the one its world model learnt from."""
        return int(self.meta["env"].get("max_episode_steps", MAX_EPISODE_STEPS))

    @property
    def longest_episode(self) -> int:
        """Steps of the data's longest episode, past which M has seen no step (0: unknown, a
        world model made before it was recorded)."""
        return int(self.meta.get("longest_episode", 0))

    @property
    def most_sites(self) -> np.ndarray | None:
        """(A,) int64: per dream action, the most sites its rule had in any graph of the data
        (stop: unbounded); None for a world model made before it was recorded."""
        sites = self.meta.get("most_sites")
        if sites is None:
            return None
        bound = np.asarray(sites, dtype=np.int64)[self.active_rules]
        return np.append(bound, np.iinfo(np.int64).max)

    @property
    def action_of_rule(self) -> dict[str, int]:
        """Rule name -> its dream action, for the active rules (those the data applied)."""
        names = self.rule_names
        return {names[rule]: action for action, rule in enumerate(self.active_rules)}

    @property
    def reverse_actions(self) -> np.ndarray:
        """(A,) int64: for each dream action, the dream action of its reverse rule (`R` and
        `R-reverse`, as rules declare a reversible pair), -1 where none is active and for stop."""
        action_of = self.action_of_rule
        reverse = np.full(self.num_actions, -1, dtype=np.int64)
        for name, action in action_of.items():
            pair = name.removesuffix("-reverse") if name.endswith("-reverse") else f"{name}-reverse"
            reverse[action] = action_of.get(pair, -1)
        return reverse

    @torch.no_grad()
    def encode(self, observations: list[dict[str, np.ndarray]]) -> tuple[Tensor, Tensor]:
        """mu and log sigma (B, Z) of padded env observations."""
        batch = collate_graphs([graph_to_data(obs) for obs in observations])
        return self.vae.encode(batch)

    def applicable_actions(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        """(A,) bool over dream actions: the active rules with a real candidate, and stop."""
        record = observation_record(observation, len(self.rule_names), 0)
        return np.append(record["rule_applicable"][self.active_rules], True)

    # ---- persistence ------------------------------------------------------------------------

    @classmethod
    def load(cls, run_dir: str | Path) -> WorldModel:
        """The world model of a finished `rlflow train-wm` run."""
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise RlflowError(f"no such world-model run directory: {run_dir}")
        vae_ckpt = load_checkpoint(run_dir / VAE_CHECKPOINT, "world-model checkpoint")
        rnn_ckpt = load_checkpoint(run_dir / MDNRNN_CHECKPOINT, "world-model checkpoint")
        members = {
            member_checkpoint(member): load_checkpoint(
                run_dir / member_checkpoint(member), "world-model checkpoint"
            )
            for member in range(1, int(rnn_ckpt.get("meta", {}).get("ensemble", 1)))
        }
        checkpoints = {VAE_CHECKPOINT: vae_ckpt, MDNRNN_CHECKPOINT: rnn_ckpt, **members}
        for name, ckpt in checkpoints.items():
            if not ckpt.get("finished"):
                raise RlflowError(
                    f"{run_dir / name} is from an unfinished run: rerun `rlflow train-wm` "
                    f"with --out {run_dir} to finish it"
                )
        start = load_npz(run_dir / DREAM_START, "world-model file")
        others = [ckpt["model"] for ckpt in members.values()]
        return cls._build(vae_ckpt, rnn_ckpt, rnn_ckpt["meta"], start, others)

    @classmethod
    def _build(
        cls,
        vae_ckpt: dict[str, Any],
        rnn_ckpt: dict[str, Any],
        meta: dict[str, Any],
        start: dict[str, np.ndarray],
        others: list[dict[str, Any]] | None = None,
    ) -> WorldModel:
        """The world model from checkpoint payloads; `others`: the state dicts of the ensemble's
        further members (same kwargs as `rnn_ckpt`)."""
        if meta.get("dynamics") != DYNAMICS:
            raise RlflowError(
                "world model made by an older rlflow (its M predicts rewards, not the cost "
                "ratio): rerun `rlflow train-wm` into a new --out"
            )
        try:
            vae = GraphVAE(**vae_ckpt["kwargs"])
            vae.load_state_dict(vae_ckpt["model"])
            rnn = MDNRNN(**rnn_ckpt["kwargs"])
            rnn.load_state_dict(rnn_ckpt["model"])
            members = []
            for state in others or []:
                members.append(MDNRNN(**rnn_ckpt["kwargs"]))
                members[-1].load_state_dict(state)
        except (KeyError, RuntimeError, TypeError) as error:
            raise RlflowError(
                f"world-model checkpoint does not fit ({first_line(error)})"
            ) from None
        return cls(vae, rnn, meta, start, members)

    def save_bundle(self, path: str | Path) -> None:
        write_torch_atomic(
            path,
            {
                "vae": {"kwargs": self.vae_kwargs, "model": self.vae.state_dict()},
                "rnn": {"kwargs": self.rnn_kwargs, "model": self.rnn.state_dict()},
                "others": [member.state_dict() for member in self.members[1:]],
                "meta": self.meta,
                "start": {key: torch.as_tensor(value) for key, value in self.start.items()},
            },
        )

    @classmethod
    def from_bundle(cls, path: str | Path) -> WorldModel:
        payload = load_checkpoint(path, "world-model bundle")
        try:
            start = {key: value.numpy() for key, value in payload["start"].items()}
            others = payload.get("others", [])  # bundles made before ensembles have none
            return cls._build(payload["vae"], payload["rnn"], payload["meta"], start, others)
        except (KeyError, AttributeError) as error:
            raise RlflowError(f"world-model bundle {path} is incomplete ({error})") from None

    @property
    def vae_kwargs(self) -> dict[str, Any]:
        return dict(self.meta["vae_kwargs"])

    @property
    def rnn_kwargs(self) -> dict[str, Any]:
        return dict(self.meta["rnn_kwargs"])
