"""GraphEncoder on a hand-made four-node graph (as PyG tests its convolutions)."""

from __future__ import annotations

import torch

from rlflow.nn import GraphEncoder, RewriteData
from rlflow.nn.data import collate_graphs
from rlflow.nn.features import EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES

F, E, G = len(NODE_FEATURES), len(EDGE_FEATURES), len(GLOBAL_FEATURES)


def four_node_graph(seed: int = 0) -> RewriteData:
    """0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3: a diamond (a residual block's shape)."""
    generator = torch.Generator().manual_seed(seed)
    edge_index = torch.tensor([[0, 0, 1, 2], [1, 2, 3, 3]])
    return RewriteData(
        x=torch.rand(4, F, generator=generator),
        edge_index=edge_index,
        edge_attr=torch.rand(4, E, generator=generator),
        u=torch.rand(1, G, generator=generator),
        num_nodes=4,
    )


def test_shapes_and_out_dim() -> None:
    torch.manual_seed(0)
    encoder = GraphEncoder(hidden=32, layers=2, heads=4)
    nodes, graphs = encoder(four_node_graph())
    assert encoder.out_dim == 32
    assert nodes.shape == (4, 32)
    assert graphs.shape == (1, 32)
    assert torch.isfinite(nodes).all() and torch.isfinite(graphs).all()


def test_batch_of_two_matches_each_alone() -> None:
    torch.manual_seed(0)
    encoder = GraphEncoder().eval()
    first, second = four_node_graph(0), four_node_graph(1)
    batch = collate_graphs([first, second])
    nodes, graphs = encoder(batch)
    assert nodes.shape == (8, encoder.out_dim) and graphs.shape == (2, encoder.out_dim)
    for index, data in enumerate((first, second)):
        alone_nodes, alone_graph = encoder(data)
        torch.testing.assert_close(nodes[4 * index : 4 * index + 4], alone_nodes)
        torch.testing.assert_close(graphs[index], alone_graph[0])


def test_two_calls_give_the_same_output() -> None:
    torch.manual_seed(0)
    encoder = GraphEncoder().eval()
    data = four_node_graph()
    first = encoder(data)
    second = encoder(data)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_permuting_nodes_permutes_embeddings() -> None:
    torch.manual_seed(0)
    encoder = GraphEncoder().eval()
    data = four_node_graph()
    permutation = torch.tensor([2, 0, 3, 1])  # new node i is old node permutation[i]
    inverse = torch.argsort(permutation)
    permuted = RewriteData(
        x=data.x[permutation],
        edge_index=inverse[data.edge_index],
        edge_attr=data.edge_attr,
        u=data.u,
        num_nodes=4,
    )
    nodes, graph = encoder(data)
    permuted_nodes, permuted_graph = encoder(permuted)
    torch.testing.assert_close(permuted_nodes, nodes[permutation], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(permuted_graph, graph, rtol=1e-5, atol=1e-5)


def test_edges_and_globals_matter() -> None:
    torch.manual_seed(0)
    encoder = GraphEncoder().eval()
    data = four_node_graph()
    _, graph = encoder(data)
    reversed_edges = data.clone()
    reversed_edges.edge_index = data.edge_index.flip(0)
    other_globals = data.clone()
    other_globals.u = data.u + 1.0
    assert not torch.allclose(encoder(reversed_edges)[1], graph)
    assert not torch.allclose(encoder(other_globals)[1], graph)


def test_reset_parameters_and_repr() -> None:
    torch.manual_seed(0)
    encoder = GraphEncoder(hidden=16, layers=1, heads=2)
    data = four_node_graph()
    before = encoder(data)[1]
    torch.manual_seed(1)
    encoder.reset_parameters()
    assert not torch.allclose(encoder(data)[1], before)
    assert repr(encoder) == f"GraphEncoder({F}, {E}, {G}, hidden=16, layers=1, heads=2)"
