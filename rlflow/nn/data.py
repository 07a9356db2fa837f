"""GraphRewrite-v0 observations as torch_geometric data: unpad one observation, batch many.

The env pads every array to fixed sizes (gymnasium needs fixed spaces); the GNN wants the real
nodes and edges only, and a batch of graphs of different sizes whose candidate sites still
point at the right nodes. This module is the one place that conversion happens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Batch, Data

from rlflow.errors import RlflowError

CANDIDATE_KEYS = ("candidate_rules", "candidate_sites", "action_mask")
"""Per-graph candidate fields: stacked along a new batch dimension, not concatenated."""

GRAPH_KEYS = ("node_features", "node_mask", "edge_index", "edge_features", "edge_mask")
"""The graph part of an observation (what `rlflow.nn.features.featurize` returns)."""


class RewriteData(Data):
    """One unpadded observation; a `Batch` of these stacks the candidate fields per graph.

    Attributes: `x (n, F)`, `edge_index (2, m)`, `edge_attr (m, E)`, `u (1, G)`,
    `candidate_rules (A,)`, `candidate_sites (A, K)` (node indices of this graph, -1 pad) and
    `action_mask (A + 1,)` bool. In a batch made by `collate` they become
    `candidate_rules (B, A)`, `candidate_sites (B, A, K)` with indices into the batch's nodes,
    and `action_mask (B, A + 1)`.
    """

    def __cat_dim__(self, key: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if key in CANDIDATE_KEYS:
            return None  # stack: (B, A), (B, A, K), (B, A + 1)
        return super().__cat_dim__(key, value, *args, **kwargs)

    def __inc__(self, key: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if key in CANDIDATE_KEYS:
            # -1 padding must stay -1, so `collate` offsets the sites itself.
            return 0
        return super().__inc__(key, value, *args, **kwargs)


def graph_to_data(observation: Mapping[str, np.ndarray]) -> RewriteData:
    """The graph part of an observation, unpadded: `x`, `edge_index`, `edge_attr`, and `u` if
    the observation has `global_features`. Real nodes and edges are the masks' leading rows
    (the env's layout)."""
    for key in GRAPH_KEYS:
        if key not in observation:
            raise RlflowError(f"observation has no {key!r}: not a GraphRewrite-v0 observation")
    num_nodes = int(np.asarray(observation["node_mask"]).sum())
    num_edges = int(np.asarray(observation["edge_mask"]).sum())
    x = torch.as_tensor(np.asarray(observation["node_features"])[:num_nodes], dtype=torch.float32)
    edge_index = torch.as_tensor(
        np.asarray(observation["edge_index"])[:, :num_edges], dtype=torch.long
    )
    edge_attr = torch.as_tensor(
        np.asarray(observation["edge_features"])[:num_edges], dtype=torch.float32
    )
    data = RewriteData(x=x, edge_index=edge_index, edge_attr=edge_attr, num_nodes=num_nodes)
    if "global_features" in observation:
        data.u = torch.as_tensor(
            np.asarray(observation["global_features"]), dtype=torch.float32
        ).reshape(1, -1)
    return data


def observation_to_data(observation: Mapping[str, np.ndarray]) -> RewriteData:
    """One padded GraphRewrite-v0 observation as an unpadded `RewriteData`.

    Shapes: `x (n, F)`, `edge_index (2, m)`, `edge_attr (m, E)`, `u (1, G)`,
    `candidate_rules (A,)`, `candidate_sites (A, K)`, `action_mask (A + 1,)` bool; n and m are
    the real node and edge counts, A and K the env's `max_candidates` and `max_site_nodes`.
    """
    for key in ("global_features", *CANDIDATE_KEYS):
        if key not in observation:
            raise RlflowError(f"observation has no {key!r}: not a GraphRewrite-v0 observation")
    data = graph_to_data(observation)
    data.candidate_rules = torch.as_tensor(
        np.asarray(observation["candidate_rules"]), dtype=torch.long
    )
    data.candidate_sites = torch.as_tensor(
        np.asarray(observation["candidate_sites"]), dtype=torch.long
    )
    data.action_mask = torch.as_tensor(np.asarray(observation["action_mask"]) != 0)
    return data


def collate(observations: Sequence[Mapping[str, np.ndarray] | Data]) -> Batch:
    """A batch of B observations (padded dicts, or `observation_to_data` results).

    Besides PyG's `x`, `edge_index` (offset per graph), `edge_attr`, `batch` and `ptr`, the
    batch has `u (B, G)`, `candidate_rules (B, A)`, `action_mask (B, A + 1)` and
    `candidate_sites (B, A, K)` holding indices into the batch's node rows (`x`), -1 where
    padded. All observations must come from envs with the same A and K.
    """
    if not observations:
        raise RlflowError("collate needs at least one observation")
    data_list = [
        item if isinstance(item, Data) else observation_to_data(item) for item in observations
    ]
    shapes = {tuple(data.candidate_sites.shape) for data in data_list}
    if len(shapes) > 1:
        raise RlflowError(
            f"observations disagree on (max_candidates, max_site_nodes): {sorted(shapes)}"
        )
    batch = Batch.from_data_list(data_list)
    offsets = batch.ptr[:-1].view(-1, 1, 1)
    sites = batch.candidate_sites
    batch.candidate_sites = torch.where(sites >= 0, sites + offsets, sites)
    return batch


def collate_graphs(observations: Sequence[Mapping[str, np.ndarray] | Data]) -> Batch:
    """A plain batch of graphs (no candidate fields): for encoding many candidate graphs."""
    if not observations:
        raise RlflowError("collate_graphs needs at least one graph")
    data_list = [item if isinstance(item, Data) else graph_to_data(item) for item in observations]
    return Batch.from_data_list(data_list)
