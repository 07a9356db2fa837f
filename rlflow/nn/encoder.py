"""The one GNN encoder of rlflow (X-RLflow's): PPO, the world model and guided search share it.

It turns a batch of rewrite-env graphs into node embeddings (to score candidate sites) and
graph embeddings (to score whole graphs, and as the policy's and the value's state).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GATv2Conv
from torch_geometric.utils import scatter

from rlflow.nn.features import EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES


class GraphEncoder(nn.Module):
    r"""The graph encoder of X-RLflow (`"Transferable and Efficient Non-Factual Graph Rewriting
    with Reinforcement Learning" <https://arxiv.org/abs/2304.06543>`_): a node update from the
    incoming edges' features, :math:`k` GATv2 layers that attend with edge features, and a
    global update.

    Node update, with :math:`\mathcal{N}_{\text{in}}(i)` the producers feeding node :math:`i`:

    .. math::
        \mathbf{h}_i^{(0)} = \mathrm{ReLU}\Big(\mathbf{W}_x \mathbf{x}_i
        + \mathbf{W}_e \frac{1}{\max(1, |\mathcal{N}_{\text{in}}(i)|)}
        \sum_{j \in \mathcal{N}_{\text{in}}(i)} \mathbf{e}_{j,i}\Big)

    then, for :math:`l = 1 \ldots k`, a residual GATv2 layer (`Brody et al.
    <https://arxiv.org/abs/2105.14491>`_) over the edges in both directions (a flag appended to
    :math:`\mathbf{e}` tells a producer-to-consumer edge from its reverse), with layer norm:

    .. math::
        \mathbf{h}_i^{(l)} = \mathrm{LN}\Big(\mathbf{h}_i^{(l-1)} + \mathrm{ELU}\big(
        \big\Vert_{h=1}^{H} \sum_{j \in \mathcal{N}(i) \cup \{i\}} \alpha_{i,j}^{h}
        \mathbf{\Theta}_t^{h} \mathbf{h}_j^{(l-1)}\big)\Big)

    with :math:`\alpha_{i,j}^h = \mathrm{softmax}_j\big(\mathbf{a}^{h\top}\mathrm{LeakyReLU}(
    \mathbf{\Theta}_s^h \mathbf{h}_i + \mathbf{\Theta}_t^h \mathbf{h}_j +
    \mathbf{\Theta}_e^h \mathbf{e}_{j,i})\big)`. Global update, per graph :math:`G` with global
    features :math:`\mathbf{u}_G`:

    .. math::
        \mathbf{g}_G = \mathrm{MLP}\Big(\frac{1}{|G|}\sum_{i \in G} \mathbf{h}_i^{(k)}
        \,\Big\Vert\, \max_{i \in G} \mathbf{h}_i^{(k)} \,\Big\Vert\, \mathbf{W}_u \mathbf{u}_G
        \Big)

    Args:
        node_dim (int, optional): node feature size :math:`F`. (default: `len(NODE_FEATURES)`)
        edge_dim (int, optional): edge feature size :math:`E`. (default: `len(EDGE_FEATURES)`)
        global_dim (int, optional): global feature size :math:`G`; 0 for graphs without `u`.
            (default: `len(GLOBAL_FEATURES)`)
        hidden (int, optional): embedding size :math:`H`; a multiple of `heads`.
            (default: `64`)
        layers (int, optional): number of GATv2 layers :math:`k`. (default: `3`)
        heads (int, optional): attention heads per layer; their outputs are concatenated,
            :math:`H / \text{heads}` each. (default: `4`)

    Shapes:
        - **input:** a `Batch` (or one `Data`) with node features `x` :math:`(|\mathcal{V}|, F)`,
          `edge_index` :math:`(2, |\mathcal{E}|)`, `edge_attr` :math:`(|\mathcal{E}|, E)`,
          global features `u` :math:`(B, G)` (needed when `global_dim > 0`) and, for a batch,
          `batch` :math:`(|\mathcal{V}|)`; `rlflow.nn.collate` makes one from observations.
        - **output:** node embeddings :math:`(|\mathcal{V}|, H)` and graph embeddings
          :math:`(B, H)`.
    """

    def __init__(
        self,
        node_dim: int = len(NODE_FEATURES),
        edge_dim: int = len(EDGE_FEATURES),
        global_dim: int = len(GLOBAL_FEATURES),
        hidden: int = 64,
        layers: int = 3,
        heads: int = 4,
    ) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        if layers < 0:
            raise ValueError(f"layers must be at least 0, got {layers}")
        self.node_dim, self.edge_dim, self.global_dim = node_dim, edge_dim, global_dim
        self.hidden, self.layers, self.heads = hidden, layers, heads
        self.out_dim = hidden

        self.node_in = nn.Linear(node_dim, hidden)
        self.edge_in = nn.Linear(edge_dim, hidden, bias=False)
        # +1: the direction flag of each message (0 producer -> consumer, 1 the reverse).
        self.convs = nn.ModuleList(
            GATv2Conv(
                hidden,
                hidden // heads,
                heads=heads,
                edge_dim=edge_dim + 1,
                add_self_loops=True,
                fill_value="mean",
            )
            for _ in range(layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.global_in = nn.Linear(global_dim, hidden) if global_dim > 0 else None
        pooled = 3 * hidden if global_dim > 0 else 2 * hidden
        self.global_mlp = nn.Sequential(
            nn.Linear(pooled, hidden), nn.ReLU(), nn.Linear(hidden, hidden)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.node_in.reset_parameters()
        self.edge_in.reset_parameters()
        for conv, norm in zip(self.convs, self.norms):
            conv.reset_parameters()
            norm.reset_parameters()
        if self.global_in is not None:
            self.global_in.reset_parameters()
        for module in self.global_mlp:
            if isinstance(module, nn.Linear):
                module.reset_parameters()

    def forward(self, batch: Batch | Data) -> tuple[Tensor, Tensor]:
        x, edge_index, edge_attr = batch.x, batch.edge_index, batch.edge_attr
        num_nodes = x.size(0)
        node_batch = batch.batch if getattr(batch, "batch", None) is not None else None
        if node_batch is None:
            node_batch = torch.zeros(num_nodes, dtype=torch.long, device=x.device)
        num_graphs = int(batch.num_graphs) if hasattr(batch, "num_graphs") else 1

        incoming = scatter(edge_attr, edge_index[1], dim=0, dim_size=num_nodes, reduce="mean")
        h = torch.relu(self.node_in(x) + self.edge_in(incoming))

        # Messages both ways: a site's producers and consumers both matter to a rewrite.
        both_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        direction = torch.cat(
            [edge_attr.new_zeros(edge_attr.size(0), 1), edge_attr.new_ones(edge_attr.size(0), 1)]
        )
        both_attr = torch.cat([torch.cat([edge_attr, edge_attr]), direction], dim=1)
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + nn.functional.elu(conv(h, both_index, both_attr)))

        pooled = [
            scatter(h, node_batch, dim=0, dim_size=num_graphs, reduce="mean"),
            scatter(h, node_batch, dim=0, dim_size=num_graphs, reduce="max"),
        ]
        if self.global_in is not None:
            u = getattr(batch, "u", None)
            if u is None:
                raise ValueError("the batch has no global features `u` (global_dim > 0)")
            pooled.append(self.global_in(u.reshape(num_graphs, -1)))
        graph_emb = self.global_mlp(torch.cat(pooled, dim=-1))
        return h, graph_emb

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.node_dim}, {self.edge_dim}, {self.global_dim}, "
            f"hidden={self.hidden}, layers={self.layers}, heads={self.heads})"
        )
