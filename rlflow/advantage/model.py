"""The local advantage network: the k-hop subgraph around a candidate's site, encoded by
`rlflow.nn`'s shared `GraphEncoder`, and the candidate's rule, regressed onto the relative
cost change that applying the candidate makes.

Local on purpose (Wu et al.): a rewrite changes its site and what the site's tensors feed,
so what it is worth depends on a neighbourhood, not on the whole graph; a model that sees only
neighbourhoods carries over to larger graphs it never saw. The node features are those of
the whole graph's observation (`rlflow.nn.features`), sliced to the neighbourhood.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data import Batch, Data

from rlflow.errors import RlflowError
from rlflow.nn import GraphEncoder

DEFAULT_HOPS = 2
PERCENT = 100.0
"""The network regresses percentages of the current cost: changes are mostly a few percent,
and unit-scale targets train better than hundredths."""


def khop_nodes(
    num_nodes: int, edge_index: np.ndarray, site: Sequence[int], hops: int
) -> np.ndarray:
    """The sorted node indices within `hops` edges of any site node, edges taken both ways
    (a rewrite touches both what its site reads and what reads it).

    Shapes: edge_index (2, m) of node indices below `num_nodes`; site of any length.
    """
    inside = np.zeros(num_nodes, dtype=bool)
    inside[np.asarray(site, dtype=np.int64)] = True
    sources, targets = edge_index[0], edge_index[1]
    for _ in range(hops):
        touched = inside[sources] | inside[targets]
        grown = inside.copy()
        grown[sources[touched]] = True
        grown[targets[touched]] = True
        if np.array_equal(grown, inside):
            break
        inside = grown
    return np.flatnonzero(inside)


def subgraph_data(
    node_features: np.ndarray,
    edge_index: np.ndarray,
    edge_features: np.ndarray,
    site: Sequence[int],
    rule: int,
    *,
    hops: int,
    max_site_nodes: int,
) -> Data:
    """One candidate as the network reads it: the k-hop subgraph around its first
    `max_site_nodes` site nodes (`x`, `edge_index`, `edge_attr`), `site (1, K)` holding their
    positions in the subgraph (-1 pad), and `rule (1,)` (its id; -1 for a rule the network was
    not trained with)."""
    site = [int(node) for node in site[:max_site_nodes]]
    if not site:
        raise RlflowError("a candidate has an empty site")
    num_nodes = len(node_features)
    nodes = khop_nodes(num_nodes, edge_index, site, hops)
    position = np.full(num_nodes, -1, dtype=np.int64)
    position[nodes] = np.arange(len(nodes))
    kept = (position[edge_index[0]] >= 0) & (position[edge_index[1]] >= 0)
    local_site = np.full((1, max_site_nodes), -1, dtype=np.int64)
    local_site[0, : len(site)] = position[site]
    return Data(
        x=torch.as_tensor(node_features[nodes], dtype=torch.float32),
        edge_index=torch.as_tensor(position[edge_index[:, kept]], dtype=torch.long),
        edge_attr=torch.as_tensor(edge_features[kept], dtype=torch.float32),
        site=torch.as_tensor(local_site),
        rule=torch.tensor([int(rule)], dtype=torch.long),
        num_nodes=len(nodes),
    )


def collate_subgraphs(items: Sequence[Data]) -> Batch:
    """A batch of `subgraph_data` items; `site (B, K)` then indexes the batch's node rows."""
    if not items:
        raise RlflowError("collate_subgraphs needs at least one subgraph")
    batch = Batch.from_data_list(list(items))
    offsets = batch.ptr[:-1].view(-1, 1)
    batch.site = torch.where(batch.site >= 0, batch.site + offsets, batch.site)
    return batch


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))


class AdvantageModel(nn.Module):
    r"""The predicted change, in percent, of a graph's cost when a candidate is applied.

    With :math:`\mathbf{h}` the node embeddings and :math:`\mathbf{g}` the graph embedding of
    the candidate's k-hop subgraph (`GraphEncoder`, no global features: the subgraph is all it
    sees), :math:`s` its anchor, :math:`S` its site nodes and :math:`\mathbf{R}_r` its rule's
    embedding:

    .. math::
        \hat{\Delta} = \mathrm{MLP}\big(\mathbf{R}_r \,\Vert\, \mathbf{h}_s \,\Vert\,
        \tfrac{1}{|S|}\textstyle\sum_{i \in S} \mathbf{h}_i \,\Vert\, \mathbf{g}\big)

    the layout of `rlflow.nn.CandidateScorer`'s local score, here regressed onto
    :math:`100\,(C_{\text{after}} - C_{\text{now}}) / C_{\text{now}}`.

    Args:
        num_rules (int): size of the rule vocabulary (the data's `rule_names`).
        hidden (int, optional): embedding size of the encoder and the head. (default: `64`)
        layers (int, optional): GATv2 layers of the encoder. (default: `3`)
        heads (int, optional): attention heads of the encoder. (default: `4`)

    Shapes:
        - **input:** a batch from `collate_subgraphs` (B candidates).
        - **output:** predicted changes in percent :math:`(B)`.
    """

    def __init__(self, num_rules: int, *, hidden: int = 64, layers: int = 3, heads: int = 4):
        super().__init__()
        self.num_rules = num_rules
        self.encoder = GraphEncoder(global_dim=0, hidden=hidden, layers=layers, heads=heads)
        # Row 0 stands for a rule the network was not trained with (id -1).
        self.rule_embedding = nn.Embedding(num_rules + 1, hidden, padding_idx=0)
        self.head = _mlp(4 * hidden, hidden, 1)

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()
        self.rule_embedding.reset_parameters()
        for module in self.head:
            if isinstance(module, nn.Linear):
                module.reset_parameters()

    def forward(self, batch: Batch) -> Tensor:
        nodes, graph = self.encoder(batch)
        sites = batch.site  # (B, K), batch node rows, -1 pad
        present = (sites >= 0).unsqueeze(-1).to(nodes.dtype)
        site_nodes = nodes[sites.clamp(min=0)] * present  # (B, K, H)
        anchor = site_nodes[:, 0]
        site_mean = site_nodes.sum(dim=1) / present.sum(dim=1).clamp(min=1.0)
        rules = self.rule_embedding(batch.rule.clamp(min=-1) + 1)
        features = torch.cat([rules, anchor, site_mean, graph], dim=-1)
        return self.head(features).squeeze(-1)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(num_rules={self.num_rules}, encoder={self.encoder!r})"


__all__ = [
    "DEFAULT_HOPS",
    "PERCENT",
    "AdvantageModel",
    "collate_subgraphs",
    "khop_nodes",
    "subgraph_data",
]
