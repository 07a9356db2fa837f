"""The canonical hash: invariant to node order and value names, sensitive to everything else."""

from __future__ import annotations

import numpy as np
from onnx import helper

from rlflow.graph import load_model
from tests.conftest import make_model

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 4)).astype(np.float32)
B = RNG.standard_normal(4).astype(np.float32)


def two_branch(names=("a", "b", "c"), order=(0, 1, 2, 3), w=W, axis=1, swap_edge=False):
    """x -> MatMul W -> a; x -> Relu -> b; Add(a, b) -> c; Softmax(c) -> y."""
    a, b, c = names
    nodes = [
        helper.make_node("MatMul", ["x", "w"], [a]),
        helper.make_node("Relu", ["x"], [b]),
        helper.make_node("Sub", [b, a] if swap_edge else [a, b], [c]),
        helper.make_node("Softmax", [c], ["y"], axis=axis),
    ]
    nodes = [nodes[i] for i in order]
    return load_model(make_model(nodes, [("x", [2, 4])], ["y"], [("w", w), ("bias", B)]))


def test_node_order_and_value_names_do_not_change_the_hash():
    base = two_branch().canonical_hash()
    assert two_branch(order=(1, 0, 2, 3)).canonical_hash() == base
    assert two_branch(names=("p", "q", "r")).canonical_hash() == base


def test_changed_attribute_weight_or_edge_changes_the_hash():
    base = two_branch().canonical_hash()
    assert two_branch(axis=0).canonical_hash() != base
    changed = W.copy()
    changed[0, 0] += 1e-3
    assert two_branch(w=changed).canonical_hash() != base
    assert two_branch(swap_edge=True).canonical_hash() != base


def test_commutative_inputs_hash_alike():
    def add(order):
        nodes = [helper.make_node("Add", order, ["y"])]
        return load_model(make_model(nodes, [("x", [4])], ["y"], [("b", B)]))

    assert add(["x", "b"]).canonical_hash() == add(["b", "x"]).canonical_hash()


def test_incremental_hash_of_derived_graphs_equals_a_fresh_hash():
    """Graph.replaced reuses the parent's value hashes; the result must match a full rehash."""
    from rlflow.graph import Graph
    from rlflow.rewrite import default_ruleset
    from rlflow.zoo import cached_path

    graph = load_model(cached_path("inception-v3", "small"))
    graph.canonical_hash()
    candidates = default_ruleset().candidates(graph)
    assert candidates
    for candidate in candidates[:3]:
        child = candidate.graph
        for grandchild in [c.graph for c in default_ruleset().candidates(child)[:5]] + [child]:
            fresh = Graph(
                grandchild.nodes,
                grandchild.inputs,
                grandchild.outputs,
                grandchild.initializers,
                dict(grandchild.values),
                grandchild.opset,
            )
            assert grandchild.canonical_hash() == fresh.canonical_hash()


def test_the_hash_is_the_plainly_written_definition():
    """hashing.py spells `digest` out for speed; the bytes hashed must stay exactly these."""
    from rlflow.graph.hashing import COMMUTATIVE, _node_digest, array_digest, digest
    from rlflow.zoo import cached_path

    def plain(graph) -> str:
        value_hash = {"": digest("absent")}
        for position, value in enumerate(graph.inputs):
            value_hash[value.name] = digest(
                "input", str(position), str(value.dtype), str(value.shape)
            )
        for name, array in graph.initializers.items():
            value_hash[name] = digest("const", array_digest(array))
        for node in graph.nodes:
            inputs = [value_hash[name] for name in node.inputs]
            if node.domain in ("", "ai.onnx") and node.op_type in COMMUTATIVE:
                inputs.sort()
            node_hash = digest(_node_digest(node), b"|", *inputs)
            for index, out in enumerate(node.outputs):
                if out:
                    value_hash[out] = digest(node_hash, str(index))
        return digest(*(value_hash[value.name] for value in graph.outputs)).hex()

    for name in ("bert", "inception-v3", "mini-dalle"):
        graph = load_model(cached_path(name, "small"))
        assert graph.canonical_hash() == plain(graph)
