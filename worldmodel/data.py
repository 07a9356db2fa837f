"""Rollout shards for the world model: the format `rlflow collect` writes and `train-wm` reads.

A data directory holds `manifest.json` and shards `shard-00000.npz`, ... Each shard is a
handful of whole episodes. An episode of T steps keeps its T + 1 observations in order, so
the observation after step t is observation t + 1 of the same episode. Graph arrays are stored
unpadded (ragged, with per-observation node and edge counts) -- a padded GraphRewrite-v0
observation is 150 kB, nearly all zeros -- and `RolloutData.observation(i)` pads them back.

Per observation: `num_nodes`, `num_edges`, `global_features (G,)`, `candidate_rules (A,)`,
`candidate_sites (A, K)`, `action_mask (A + 1,)`, `rule_applicable (R,)` (1 for each rule with
a candidate on offer), `obs_model` (index into the manifest's models); ragged
`node_features (sum n, F)`, `edge_index (2, sum m)` (node indices local to the graph),
`edge_features (sum m, E)`.
Per step: `action` (the env's action slot), `action_rule` (rule id; R for stop, -1 for a
masked no-op), `action_site (K,)`, `reward`, `terminated`, `truncated`, `next_action_mask`,
`next_rule_applicable`. Per episode: `episode_steps`, `episode_model`, `episode_return`.
Optional, per observation, when collected with `candidate_samples` S > 0 (the targets of the
learned local advantage, `rlflow train-advantage`): `advantage_slots (S,)` (action slots of the
candidates sampled, -1 pad) and `advantage_targets (S,)` (each one's relative change in the
env's cost, (C(after) - C(now)) / C(now); NaN pad).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlflow.errors import RlflowError, first_line
from rlflow.fileio import write_bytes_atomic, write_json_atomic

SHARD_FORMAT = 1
MANIFEST = "manifest.json"
SHARD_PATTERN = "shard-{index:05d}.npz"

OBSERVATION_KEYS = (
    "num_nodes",
    "num_edges",
    "global_features",
    "candidate_rules",
    "candidate_sites",
    "action_mask",
    "rule_applicable",
    "obs_model",
)
RAGGED_KEYS = ("node_features", "edge_index", "edge_features")
STEP_KEYS = (
    "action",
    "action_rule",
    "action_site",
    "reward",
    "terminated",
    "truncated",
    "next_action_mask",
    "next_rule_applicable",
)
EPISODE_KEYS = ("episode_steps", "episode_model", "episode_return")
ADVANTAGE_KEYS = ("advantage_slots", "advantage_targets")
"""Optional per-observation keys: sampled candidates' cost changes (`candidate_samples`)."""


def rule_applicability(observation: Mapping[str, np.ndarray], num_rules: int) -> np.ndarray:
    """(R,) bool: which rules have at least one candidate offered in the observation."""
    rules = np.asarray(observation["candidate_rules"])
    applicable = np.zeros(num_rules, dtype=bool)
    applicable[rules[rules >= 0]] = True
    return applicable


@dataclass
class EpisodeRecord:
    """One episode as it is collected: T + 1 observations and T steps."""

    model: int
    observations: list[dict[str, np.ndarray]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def episode_return(self) -> float:
        return float(sum(step["reward"] for step in self.steps))


def observation_record(observation: Mapping[str, np.ndarray], num_rules: int, model: int) -> dict:
    """The stored (unpadded) form of one padded env observation."""
    num_nodes = int(np.asarray(observation["node_mask"]).sum())
    num_edges = int(np.asarray(observation["edge_mask"]).sum())
    return {
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "global_features": np.asarray(observation["global_features"], dtype=np.float32),
        "candidate_rules": np.asarray(observation["candidate_rules"], dtype=np.int16),
        "candidate_sites": np.asarray(observation["candidate_sites"], dtype=np.int16),
        "action_mask": np.asarray(observation["action_mask"]).astype(bool),
        "rule_applicable": rule_applicability(observation, num_rules),
        "obs_model": model,
        "node_features": np.asarray(observation["node_features"], dtype=np.float32)[:num_nodes],
        "edge_index": np.asarray(observation["edge_index"], dtype=np.int32)[:, :num_edges],
        "edge_features": np.asarray(observation["edge_features"], dtype=np.float32)[:num_edges],
    }


def step_record(
    observation: Mapping[str, np.ndarray],
    action: int,
    reward: float,
    terminated: bool,
    truncated: bool,
    next_record: Mapping[str, Any],
    num_rules: int,
) -> dict[str, Any]:
    """The stored form of one step taken from `observation` (padded) with `action` (a slot)."""
    rules = np.asarray(observation["candidate_rules"])
    sites = np.asarray(observation["candidate_sites"])
    mask = np.asarray(observation["action_mask"])
    stop = len(mask) - 1
    if action == stop:
        rule, site = num_rules, np.full(sites.shape[1], -1, dtype=np.int16)
    elif mask[action]:
        rule, site = int(rules[action]), sites[action].astype(np.int16)
    else:
        rule, site = -1, np.full(sites.shape[1], -1, dtype=np.int16)
    return {
        "action": int(action),
        "action_rule": rule,
        "action_site": site,
        "reward": float(reward),
        "terminated": bool(terminated),
        "truncated": bool(truncated),
        "next_action_mask": next_record["action_mask"],
        "next_rule_applicable": next_record["rule_applicable"],
    }


def shard_arrays(episodes: Sequence[EpisodeRecord]) -> dict[str, np.ndarray]:
    """The npz arrays of a shard holding `episodes`."""
    if not episodes:
        raise ValueError("a shard holds at least one episode")
    observations = [obs for episode in episodes for obs in episode.observations]
    steps = [step for episode in episodes for step in episode.steps]
    arrays: dict[str, np.ndarray] = {}
    for key in OBSERVATION_KEYS:
        arrays[key] = np.stack([np.asarray(obs[key]) for obs in observations])
    arrays["num_nodes"] = arrays["num_nodes"].astype(np.int32)
    arrays["num_edges"] = arrays["num_edges"].astype(np.int32)
    arrays["obs_model"] = arrays["obs_model"].astype(np.int16)
    for key in ADVANTAGE_KEYS:
        if key in observations[0]:
            arrays[key] = np.stack([np.asarray(obs[key]) for obs in observations])
    arrays["node_features"] = np.concatenate([obs["node_features"] for obs in observations])
    arrays["edge_index"] = np.concatenate([obs["edge_index"] for obs in observations], axis=1)
    arrays["edge_features"] = np.concatenate([obs["edge_features"] for obs in observations])
    if not steps:
        raise ValueError("an episode takes at least one step (stop is a step)")
    for key in STEP_KEYS:
        arrays[key] = np.stack([np.asarray(step[key]) for step in steps])
    arrays["action"] = arrays["action"].astype(np.int32)
    arrays["action_rule"] = arrays["action_rule"].astype(np.int32)
    arrays["reward"] = arrays["reward"].astype(np.float32)
    arrays["episode_steps"] = np.array([len(e.steps) for e in episodes], dtype=np.int32)
    arrays["episode_model"] = np.array([e.model for e in episodes], dtype=np.int16)
    arrays["episode_return"] = np.array([e.episode_return for e in episodes], dtype=np.float32)
    return arrays


def write_shard(path: Path, episodes: Sequence[EpisodeRecord], meta: Mapping[str, Any]) -> None:
    """Write a shard atomically (temporary file, then rename); `meta` is stored inside it."""
    buffer = io.BytesIO()
    arrays = shard_arrays(episodes)
    np.savez_compressed(buffer, meta=np.array(json.dumps(dict(meta))), **arrays)
    write_bytes_atomic(path, buffer.getvalue())


def read_shard(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A shard's arrays and its stored meta; RlflowError if it is missing or unreadable."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise RlflowError(f"shard {path} is missing: rerun `rlflow collect` to redo it") from None
    except Exception as error:  # zipfile, ValueError, OSError: all mean a damaged file
        raise RlflowError(
            f"shard {path} is unreadable ({first_line(error)}); delete it and rerun "
            "`rlflow collect` to redo it"
        ) from None
    meta_array = arrays.pop("meta", None)
    missing = [
        key
        for key in (*OBSERVATION_KEYS, *RAGGED_KEYS, *STEP_KEYS, *EPISODE_KEYS)
        if key not in arrays
    ]
    if meta_array is None or missing:
        raise RlflowError(f"shard {path} is not an rlflow rollout shard (missing {missing})")
    return arrays, json.loads(str(meta_array))


def read_manifest(data_dir: Path) -> dict[str, Any]:
    """The manifest of a data directory; RlflowError if the directory or manifest is bad."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise RlflowError(f"no such data directory: {data_dir} (make one with `rlflow collect`)")
    path = data_dir / MANIFEST
    if not path.is_file():
        raise RlflowError(f"{data_dir} has no {MANIFEST}: not a `rlflow collect` data directory")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise RlflowError(f"{path} is unreadable ({first_line(error)})") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != "rollouts":
        raise RlflowError(f"{path} is not a rollout manifest (kind != 'rollouts')")
    return manifest


def write_manifest(data_dir: Path, manifest: dict[str, Any]) -> None:
    write_json_atomic(Path(data_dir) / MANIFEST, manifest)


@dataclass
class RolloutData:
    """All shards of a data directory, concatenated in shard order.

    Observation arrays are indexed by observation, step arrays by step, episode arrays by
    episode; `obs_start[e]` and `step_start[e]` locate episode e, whose step t goes from
    observation `obs_start[e] + t` to `obs_start[e] + t + 1`.
    """

    manifest: dict[str, Any]
    arrays: dict[str, np.ndarray]
    node_offsets: np.ndarray  # (O + 1,) row of each observation's first node
    edge_offsets: np.ndarray  # (O + 1,)
    obs_start: np.ndarray  # (E,)
    step_start: np.ndarray  # (E,)

    @classmethod
    def load(cls, data_dir: str | Path) -> RolloutData:
        data_dir = Path(data_dir)
        manifest = read_manifest(data_dir)
        names = sorted(manifest.get("shards", {}))
        if not names:
            raise RlflowError(f"{data_dir} holds no finished shard: run `rlflow collect` first")
        parts = [read_shard(data_dir / name)[0] for name in names]
        arrays: dict[str, np.ndarray] = {}
        for key in (*OBSERVATION_KEYS, *STEP_KEYS, *EPISODE_KEYS, "node_features"):
            arrays[key] = np.concatenate([part[key] for part in parts])
        arrays["edge_features"] = np.concatenate([part["edge_features"] for part in parts])
        arrays["edge_index"] = np.concatenate([part["edge_index"] for part in parts], axis=1)
        if all(key in part for part in parts for key in ADVANTAGE_KEYS):
            for key in ADVANTAGE_KEYS:
                arrays[key] = np.concatenate([part[key] for part in parts])
        steps = arrays["episode_steps"].astype(np.int64)
        step_start = np.concatenate([[0], np.cumsum(steps)[:-1]]).astype(np.int64)
        obs_start = step_start + np.arange(len(steps))
        if obs_start[-1] + steps[-1] + 1 != len(arrays["num_nodes"]):
            raise RlflowError(f"shards in {data_dir} disagree with their episode lengths")
        return cls(
            manifest=manifest,
            arrays=arrays,
            node_offsets=np.concatenate([[0], np.cumsum(arrays["num_nodes"])]).astype(np.int64),
            edge_offsets=np.concatenate([[0], np.cumsum(arrays["num_edges"])]).astype(np.int64),
            obs_start=obs_start,
            step_start=step_start,
        )

    # ---- sizes ------------------------------------------------------------------------------

    @property
    def num_observations(self) -> int:
        return len(self.arrays["num_nodes"])

    @property
    def num_steps(self) -> int:
        return len(self.arrays["action"])

    @property
    def num_episodes(self) -> int:
        return len(self.arrays["episode_steps"])

    @property
    def rule_names(self) -> list[str]:
        return list(self.manifest["rule_names"])

    @property
    def num_rules(self) -> int:
        return len(self.manifest["rule_names"])

    @property
    def digest(self) -> str:
        """What identifies these rollouts: a digest of the manifest's finished shards. A world
        model records it, so that a rerun on a directory `rlflow collect` has grown since is
        told so instead of resuming with indices into other data."""
        shards = json.dumps(self.manifest.get("shards", {}), sort_keys=True)
        return hashlib.sha256(shards.encode("utf-8")).hexdigest()[:16]

    # ---- observations -----------------------------------------------------------------------

    def graph(self, index: int) -> dict[str, np.ndarray]:
        """Observation `index`'s graph, unpadded, as `rlflow.nn.data.graph_to_data` reads
        it (masks of ones over the real rows)."""
        n0, n1 = self.node_offsets[index], self.node_offsets[index + 1]
        e0, e1 = self.edge_offsets[index], self.edge_offsets[index + 1]
        return {
            "node_features": self.arrays["node_features"][n0:n1],
            "node_mask": np.ones(n1 - n0, dtype=np.int8),
            "edge_index": self.arrays["edge_index"][:, e0:e1].astype(np.int64),
            "edge_features": self.arrays["edge_features"][e0:e1],
            "edge_mask": np.ones(e1 - e0, dtype=np.int8),
            "global_features": self.arrays["global_features"][index],
        }

    def observation(self, index: int) -> dict[str, np.ndarray]:
        """Observation `index` padded back to the env's fixed sizes (as the env returned it)."""
        env = self.manifest["env"]
        max_nodes, max_edges = env["max_nodes"], env["max_edges"]
        graph = self.graph(index)
        n, m = len(graph["node_mask"]), len(graph["edge_mask"])
        node_features = np.zeros((max_nodes, graph["node_features"].shape[1]), np.float32)
        node_features[:n] = graph["node_features"]
        edge_features = np.zeros((max_edges, graph["edge_features"].shape[1]), np.float32)
        edge_features[:m] = graph["edge_features"]
        edge_index = np.zeros((2, max_edges), np.int64)
        edge_index[:, :m] = graph["edge_index"]
        node_mask = np.zeros(max_nodes, np.int8)
        node_mask[:n] = 1
        edge_mask = np.zeros(max_edges, np.int8)
        edge_mask[:m] = 1
        return {
            "node_features": node_features,
            "node_mask": node_mask,
            "edge_index": edge_index,
            "edge_features": edge_features,
            "edge_mask": edge_mask,
            "global_features": graph["global_features"].copy(),
            "candidate_rules": self.arrays["candidate_rules"][index].astype(np.int64),
            "candidate_sites": self.arrays["candidate_sites"][index].astype(np.int64),
            "action_mask": self.arrays["action_mask"][index].astype(np.int8),
        }

    def summaries(self) -> np.ndarray:
        """(O, S) float32: the fixed-size graph summary the VAE reconstructs (`graph_summary`)."""
        op_columns = len(self.manifest["op_types"]) + 1
        cost_share = self.manifest["node_features"].index("cost_share")
        return graph_summary(
            self.arrays["node_features"],
            self.node_offsets,
            self.arrays["global_features"],
            op_columns=op_columns,
            cost_share_column=cost_share,
            max_nodes=self.manifest["env"]["max_nodes"],
        )

    def most_sites(self) -> np.ndarray:
        """(R,) int: per rule, the most candidates (sites) it had in any observed graph."""
        rules = self.arrays["candidate_rules"].astype(np.int64)
        offered = self.arrays["action_mask"][:, : rules.shape[1]].astype(bool)
        counts = np.zeros((len(rules), self.num_rules), dtype=np.int64)
        rows = np.broadcast_to(np.arange(len(rules))[:, None], rules.shape)
        np.add.at(counts, (rows[offered], rules[offered]), 1)
        return counts.max(axis=0) if len(counts) else counts.sum(axis=0)

    def episodes_split(self, holdout: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Episode indices (train, held out): a seeded shuffle, at least one in each when there
        are two or more episodes."""
        order = np.random.default_rng(seed).permutation(self.num_episodes)
        held = int(round(holdout * len(order)))
        if len(order) >= 2:
            held = min(max(held, 1), len(order) - 1)
        else:
            held = 0
        return np.sort(order[held:]), np.sort(order[:held])


def graph_summary(
    node_features: np.ndarray,
    node_offsets: np.ndarray,
    global_features: np.ndarray,
    *,
    op_columns: int,
    cost_share_column: int,
    max_nodes: int,
) -> np.ndarray:
    """Per graph: log op-type counts (scaled to [0, 1] by max_nodes), the analytic cost share
    of each op type, and the global features (cost ratios, step fraction, ...).

    Shapes: node_features (sum n, F), node_offsets (O + 1,), global_features (O, G)
    -> (O, 2 * op_columns + G).
    """
    onehot = node_features[:, :op_columns].astype(np.float64)
    share = onehot * node_features[:, cost_share_column : cost_share_column + 1]
    counts = np.add.reduceat(onehot, node_offsets[:-1], axis=0) if len(onehot) else onehot
    shares = np.add.reduceat(share, node_offsets[:-1], axis=0) if len(share) else share
    empty = node_offsets[1:] == node_offsets[:-1]
    counts[empty] = 0.0  # reduceat gives the next row for an empty slice
    shares[empty] = 0.0
    counts = np.log1p(counts) / math.log1p(max_nodes)
    return np.concatenate([counts, shares, global_features], axis=1).astype(np.float32)
