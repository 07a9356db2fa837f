"""Candidate scoring: the policy logits over (candidates + stop) and the value of a state.

Two ways to score a candidate rewrite, behind one interface:

- `local` (the default, for speed): encode the current graph once; a candidate's score comes
  from its rule's embedding and the embeddings of the nodes at its site, against the graph's
  embedding. One GNN pass per state, whatever the number of candidates.
- `full` (X-RLflow): encode every candidate's rewritten graph and score its graph embedding
  (against the current one's). One GNN pass per candidate: A times the work, but it sees the
  whole result of a rewrite rather than where it happens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data import Batch, Data

from rlflow.errors import RlflowError
from rlflow.nn.data import collate_graphs, graph_to_data
from rlflow.nn.encoder import GraphEncoder

SCORER_MODES = ("local", "full")
MASKED_LOGIT = -1e8
"""The logit of an action the mask forbids: finite, so a masked entropy stays a number."""


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))


class CandidateScorer(nn.Module):
    r"""Policy logits over the candidates of a rewrite-env state plus stop, and its value.

    With :math:`\mathbf{g}` the current graph's embedding and :math:`\mathbf{h}` its node
    embeddings (`GraphEncoder`), candidate :math:`a` (rule :math:`r_a`, site nodes
    :math:`S_a`, anchor :math:`s_a`, rewritten graph embedding :math:`\mathbf{g}_a`) scores

    .. math::
        \ell_a = \begin{cases}
        \mathrm{MLP}\big(\mathbf{R}_{r_a} \,\Vert\, \mathbf{h}_{s_a} \,\Vert\,
        \tfrac{1}{|S_a|}\textstyle\sum_{i \in S_a} \mathbf{h}_i \,\Vert\, \mathbf{g}\big)
        & \text{local} \\
        \mathrm{MLP}\big(\mathbf{g}_a \,\Vert\, \mathbf{g}_a - \mathbf{g}\big) & \text{full}
        \end{cases}

    the stop action :math:`\ell_{\text{stop}} = \mathbf{w}^\top\mathbf{g} + b`, and the value
    :math:`V = \mathrm{MLP}(\mathbf{g})`. Masked actions get the logit `MASKED_LOGIT`.

    Args:
        num_rules (int): size of the rule vocabulary (`env.rule_names`).
        mode (str, optional): `"local"` or `"full"`. (default: `"local"`)
        hidden (int, optional): embedding size of the encoder and the heads. (default: `64`)
        layers (int, optional): GATv2 layers of the encoder. (default: `3`)
        heads (int, optional): attention heads of the encoder. (default: `4`)

    Shapes:
        - **input:** a batch from `rlflow.nn.collate` (B states, A candidates each);
          for `full`, also `candidate_graphs` from `candidate_batch` (C rewritten graphs with
          their flat slot :math:`b A + a`).
        - **output:** logits :math:`(B, A + 1)` (stop last) and values :math:`(B)`.
    """

    def __init__(
        self,
        num_rules: int,
        *,
        mode: str = "local",
        hidden: int = 64,
        layers: int = 3,
        heads: int = 4,
    ) -> None:
        super().__init__()
        if mode not in SCORER_MODES:
            raise RlflowError(f"unknown scorer {mode!r}; choose one of {', '.join(SCORER_MODES)}")
        self.num_rules, self.mode = num_rules, mode
        self.encoder = GraphEncoder(hidden=hidden, layers=layers, heads=heads)
        if mode == "local":
            # Row 0 is padding (rule id -1) and any rule the checkpoint does not know.
            self.rule_embedding = nn.Embedding(num_rules + 1, hidden, padding_idx=0)
            self.candidate_head = _mlp(4 * hidden, hidden, 1)
        else:
            self.rule_embedding = None
            self.candidate_head = _mlp(2 * hidden, hidden, 1)
        self.stop_head = nn.Linear(hidden, 1)
        self.value_head = _mlp(hidden, hidden, 1)

    @property
    def needs_candidate_graphs(self) -> bool:
        """Whether `forward` needs the rewritten graphs of the candidates (`full`)."""
        return self.mode == "full"

    def forward(self, batch: Batch, candidate_graphs: Batch | None = None) -> tuple[Tensor, Tensor]:
        nodes, graph = self.encoder(batch)
        mask = batch.action_mask.bool()
        num_graphs, slots = batch.candidate_rules.shape
        if self.mode == "local":
            scores = self._local_scores(batch, nodes, graph)
        else:
            scores = self._full_scores(graph, candidate_graphs, num_graphs, slots, mask)
        logits = torch.cat([scores, self.stop_head(graph)], dim=1)
        logits = logits.masked_fill(~mask, MASKED_LOGIT)
        return logits, self.value_head(graph).squeeze(-1)

    def value(self, batch: Batch) -> Tensor:
        """The value head alone (no candidate scoring): :math:`(B)`."""
        return self.value_head(self.encoder(batch)[1]).squeeze(-1)

    def _local_scores(self, batch: Batch, nodes: Tensor, graph: Tensor) -> Tensor:
        assert self.rule_embedding is not None
        rules = self.rule_embedding(batch.candidate_rules.clamp(min=-1) + 1)  # (B, A, H)
        sites = batch.candidate_sites  # (B, A, K), batch node indices, -1 pad
        present = (sites >= 0).unsqueeze(-1).to(nodes.dtype)
        site_nodes = nodes[sites.clamp(min=0)] * present  # (B, A, K, H)
        anchor = site_nodes[:, :, 0]
        site_mean = site_nodes.sum(dim=2) / present.sum(dim=2).clamp(min=1.0)
        context = graph.unsqueeze(1).expand_as(anchor)
        features = torch.cat([rules, anchor, site_mean, context], dim=-1)
        return self.candidate_head(features).squeeze(-1)

    def _full_scores(
        self,
        graph: Tensor,
        candidate_graphs: Batch | None,
        num_graphs: int,
        slots: int,
        mask: Tensor,
    ) -> Tensor:
        scores = graph.new_zeros(num_graphs * slots)
        if candidate_graphs is None:
            if bool(mask[:, :-1].any()):
                raise RlflowError("the full scorer needs the candidates' rewritten graphs")
            return scores.view(num_graphs, slots)
        _, candidate_emb = self.encoder(candidate_graphs)
        slot = candidate_graphs.slot
        current = graph[torch.div(slot, slots, rounding_mode="floor")]
        features = torch.cat([candidate_emb, candidate_emb - current], dim=-1)
        scores = scores.index_put((slot,), self.candidate_head(features).squeeze(-1))
        return scores.view(num_graphs, slots)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(num_rules={self.num_rules}, mode={self.mode!r}, "
            f"encoder={self.encoder!r})"
        )


def candidate_data(observations: Sequence[Mapping[str, np.ndarray]]) -> list[Data]:
    """The unpadded graphs of `env.candidate_observations()`, one per offered slot."""
    return [graph_to_data(observation) for observation in observations]


def candidate_batch(candidates: Sequence[Sequence[Data]], slots: int) -> Batch | None:
    """The rewritten graphs of B states' candidates as one batch, each with its flat slot
    `b * slots + a` (`slot`, shape (C,)); None if no state has a candidate."""
    flat: list[Data] = []
    slot_ids: list[int] = []
    for state, graphs in enumerate(candidates):
        if len(graphs) > slots:
            raise RlflowError(f"{len(graphs)} candidate graphs for {slots} action slots")
        for slot, data in enumerate(graphs):
            flat.append(data)
            slot_ids.append(state * slots + slot)
    if not flat:
        return None
    batch = collate_graphs(flat)
    batch.slot = torch.tensor(slot_ids, dtype=torch.long)
    return batch
