"""The REGAL policy network: `rlflow.nn`'s shared GNN encoder over a start graph, then per-gene
heads giving each gene of the graph's BRKGA chromosome (`rlflow.search.brkga.Layout`) two Beta
distributions: one over the mean of its key, one over its probability of coming from the elite
parent in a crossover.

REGAL's action is these per-gene parameters (sampled while training, their means when the
policy is used), so a policy trained on some graphs biases BRKGA on an unseen one: which sites
its decoder applies first (high key means), which it leaves off (low ones), and which genes
a child keeps from its elite parent.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Beta

from rlflow.agents.regal import CHECKPOINT, RegalConfig
from rlflow.cost import AnalyticCostModel
from rlflow.errors import RlflowError, first_line
from rlflow.graph import Graph
from rlflow.nn import GraphEncoder, collate_graphs, graph_to_data
from rlflow.nn.features import count_edges, featurize
from rlflow.search.brkga import BrkgaConfig, GeneBiases, Layout

CHECKPOINT_VERSION = 1
MEAN_PRIOR = (8.0, 8.0)
"""The Beta over a key mean an untrained policy gives every gene: mean 0.5, plain BRKGA's, and
narrow (sd 0.12). A wide one (Beta(2, 2)) pins some tenth of the genes near 1 in every
chromosome of a run, so that all of them apply the same few rewrites first; the runs seen with
it rarely improved on the start graph at all while plain BRKGA did."""
INHERITANCE_PRIOR = (14.0, 6.0)
"""The Beta over an inheritance probability an untrained policy gives: mean 0.7, plain's."""
EDGE = 1e-4
"""Sampled probabilities are kept this far inside (0, 1), where Beta log-densities are finite."""


def _inverse_softplus(value: float) -> float:
    return math.log(math.expm1(value))


class RegalNetwork(nn.Module):
    r"""Per-gene Beta parameters of a start graph's chromosome.

    With :math:`\mathbf{h}` the node embeddings and :math:`\mathbf{g}` the graph embedding of
    `GraphEncoder` (no global features), a site gene (rule :math:`r`, site nodes :math:`S`,
    anchor :math:`s`) and a node gene :math:`v` get

    .. math::
        \boldsymbol{\theta}_{(r, S)} = \mathrm{softplus}\big(\mathrm{MLP}_s(\mathbf{R}_r
        \Vert \mathbf{h}_s \Vert \tfrac{1}{|S|}\textstyle\sum_{i \in S}\mathbf{h}_i \Vert
        \mathbf{g})\big), \qquad
        \boldsymbol{\theta}_v = \mathrm{softplus}\big(\mathrm{MLP}_n(\mathbf{h}_v \Vert
        \mathbf{g})\big)

    four positive numbers each: the (alpha, beta) of the key mean's Beta and of the
    inheritance probability's. The last layers start near zero weights, with biases at
    `MEAN_PRIOR` and `INHERITANCE_PRIOR` (CleanRL's small-std policy head), so an untrained
    policy is plain BRKGA on average.

    Args:
        num_rules (int): size of the rule vocabulary; rule id -1 (unknown) is padding.
        hidden (int, optional): embedding size. (default: `64`)
        layers (int, optional): GATv2 layers of the encoder. (default: `3`)
        heads (int, optional): attention heads of the encoder. (default: `4`)

    Shapes:
        - **input:** a batch of one graph (`rlflow.nn.collate_graphs`), site rules
          :math:`(K)` and site nodes :math:`(K, S)` (node indices, -1 pad).
        - **output:** :math:`(K + N, 4)`, site genes first, then one per node.
    """

    def __init__(self, num_rules: int, *, hidden: int = 64, layers: int = 3, heads: int = 4):
        super().__init__()
        self.num_rules = num_rules
        self.encoder = GraphEncoder(global_dim=0, hidden=hidden, layers=layers, heads=heads)
        self.rule_embedding = nn.Embedding(num_rules + 1, hidden, padding_idx=0)
        self.site_head = nn.Sequential(
            nn.Linear(4 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 4)
        )
        self.node_head = nn.Sequential(
            nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 4)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()
        self.rule_embedding.reset_parameters()
        prior = torch.tensor([_inverse_softplus(v) for v in (*MEAN_PRIOR, *INHERITANCE_PRIOR)])
        for head in (self.site_head, self.node_head):
            nn.init.orthogonal_(head[0].weight, math.sqrt(2))
            nn.init.zeros_(head[0].bias)
            nn.init.orthogonal_(head[2].weight, 0.01)
            with torch.no_grad():
                head[2].bias.copy_(prior)

    def forward(self, batch: Any, site_rules: Tensor, site_nodes: Tensor) -> Tensor:
        nodes, graph = self.encoder(batch)
        present = (site_nodes >= 0).unsqueeze(-1).to(nodes.dtype)
        gathered = nodes[site_nodes.clamp(min=0)] * present  # (K, S, H)
        anchor = gathered[:, 0]
        site_mean = gathered.sum(dim=1) / present.sum(dim=1).clamp(min=1.0)
        rules = self.rule_embedding(site_rules + 1)
        context = graph.expand(len(site_rules), -1)
        site = self.site_head(torch.cat([rules, anchor, site_mean, context], dim=-1))
        node = self.node_head(torch.cat([nodes, graph.expand(len(nodes), -1)], dim=-1))
        return nn.functional.softplus(torch.cat([site, node])) + 1e-3

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(num_rules={self.num_rules}, encoder={self.encoder!r})"


@dataclass
class GeneDistributions:
    """The policy's distributions over one chromosome's biases."""

    means: Beta
    inheritance: Beta
    concentration: float

    def sample(self) -> tuple[GeneBiases, Tensor, Tensor]:
        """Sampled biases, their log-probability and the entropy (both averaged over genes,
        so that the step size does not grow with the graph)."""
        means = self.means.sample().clamp(EDGE, 1 - EDGE)
        inheritance = self.inheritance.sample().clamp(EDGE, 1 - EDGE)
        logprob = (self.means.log_prob(means) + self.inheritance.log_prob(inheritance)).mean()
        entropy = (self.means.entropy() + self.inheritance.entropy()).mean()
        biases = GeneBiases(
            means.double().numpy(), inheritance.double().numpy(), self.concentration
        )
        return biases, logprob, entropy

    def mean(self) -> GeneBiases:
        """The distributions' means as biases (what a trained policy hands BRKGA)."""
        return GeneBiases(
            self.means.mean.detach().double().numpy(),
            self.inheritance.mean.detach().double().numpy(),
            self.concentration,
        )


class RegalPolicy:
    """A REGAL network with the rule vocabulary and BRKGA parameters it was trained with.

    `biases` is an `rlflow.search.brkga.BiasSource`: `brkga.search(..., biases=policy.biases)`.
    """

    def __init__(
        self,
        network: RegalNetwork,
        rule_names: list[str],
        brkga_config: BrkgaConfig,
        concentration: float,
    ) -> None:
        self.network = network
        self.rule_names = list(rule_names)
        self._rule_ids = {name: index for index, name in enumerate(self.rule_names)}
        self.brkga_config = brkga_config
        self.concentration = concentration
        self._analytic = AnalyticCostModel()

    def __repr__(self) -> str:
        return f"RegalPolicy(rules={len(self.rule_names)}, brkga={self.brkga_config})"

    def distributions(self, graph: Graph, layout: Layout) -> GeneDistributions:
        """The per-gene Beta distributions for `graph`'s chromosome (with gradients)."""
        if layout.num_nodes != len(graph.nodes):
            raise RlflowError(f"a layout of {layout.num_nodes} nodes for {len(graph)} nodes")
        observation = featurize(
            graph,
            self._analytic,
            max_nodes=max(1, len(graph.nodes)),
            max_edges=max(1, count_edges(graph)),
        )
        batch = collate_graphs([graph_to_data(observation)])
        width = max((len(site) for _, site in layout.sites), default=1)
        site_nodes = torch.full((len(layout.sites), width), -1, dtype=torch.long)
        for row, (_, site) in enumerate(layout.sites):
            site_nodes[row, : len(site)] = torch.as_tensor(site, dtype=torch.long)
        site_rules = torch.tensor(
            [self._rule_ids.get(rule, -1) for rule, _ in layout.sites], dtype=torch.long
        )
        params = self.network(batch, site_rules, site_nodes)
        return GeneDistributions(
            Beta(params[:, 0], params[:, 1]),
            Beta(params[:, 2], params[:, 3]),
            self.concentration,
        )

    def biases(self, graph: Graph, layout: Layout) -> GeneBiases:
        """The mean biases for `graph`'s chromosome (no gradients)."""
        if layout.size == 0:
            return GeneBiases(np.zeros(0), np.zeros(0), self.concentration)
        with torch.no_grad():
            return self.distributions(graph, layout).mean()


def make_policy(config: RegalConfig, rule_names: list[str]) -> RegalPolicy:
    """A fresh policy for a run's config and rule vocabulary."""
    network = RegalNetwork(
        len(rule_names), hidden=config.hidden, layers=config.layers, heads=config.heads
    )
    return RegalPolicy(network, rule_names, config.brkga(), config.concentration)


def load_checkpoint(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The latest checkpoint of a REGAL run directory; RlflowError if missing or unreadable."""
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise RlflowError(f"no REGAL checkpoint at {path} (train one with `rlflow train-regal`)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a truncated or foreign file: pickle, zip or torch errors
        raise RlflowError(f"cannot read checkpoint {path}: {first_line(error)}") from None
    if not isinstance(state, dict) or state.get("kind") != "regal":
        raise RlflowError(f"{path} is not an rlflow REGAL checkpoint")
    if state.get("version") != CHECKPOINT_VERSION:
        raise RlflowError(
            f"{path} has checkpoint version {state.get('version')}, this rlflow reads "
            f"{CHECKPOINT_VERSION}"
        )
    return state


def load_regal_policy(run_dir: str | os.PathLike) -> RegalPolicy:
    """The policy of a REGAL run directory's latest checkpoint (RlflowError if there is none
    or it does not match this rlflow's network)."""
    state = load_checkpoint(run_dir)
    try:
        config = RegalConfig.from_dict(state["config"])
        policy = make_policy(config, list(state["rule_names"]))
        policy.network.load_state_dict(state["model"])
    except (KeyError, TypeError, RuntimeError) as error:
        raise RlflowError(
            f"checkpoint in {run_dir} does not match this rlflow's REGAL network: "
            f"{type(error).__name__}: {first_line(error)}"
        ) from None
    policy.network.eval()
    return policy


__all__ = [
    "GeneDistributions",
    "RegalNetwork",
    "RegalPolicy",
    "load_checkpoint",
    "load_regal_policy",
    "make_policy",
]
