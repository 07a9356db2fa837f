"""common-subexpression-elim: a twin goes with every node below it that computes what the
earlier twin's readers do, in one step; and on a transformer whose projections are blocked,
the query, key and value projections then share one reshape and one reorder of their input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rlflow.cost import OrtSettings, check_equivalence, nchwc_block_size
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import load_model
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules.nchwc_projection import ProjectionToNchwc
from rlflow.rewrite.rules.simplify import CommonSubexpressionElim
from rlflow.zoo import cached_path
from tests.conftest import random_feeds, run_onnx

CSE = CommonSubexpressionElim()


def test_a_twin_takes_the_twins_below_it_along():
    b = ModelBuilder()
    x = b.input((4, 6))
    first = b.op("Relu", [b.op("Reshape", [x, b.const([2, 12], np.int64)])])
    twin = b.op("Relu", [b.op("Reshape", [x, b.const([2, 12], np.int64)])])
    other = b.op("Reshape", [x, b.const([12, 2], np.int64)])  # another shape: stays
    model = b.model(b.op("Sigmoid", [first]), b.op("Tanh", [twin]), other)
    graph = load_model(model)

    (site,) = CSE.sites(graph)
    assert [node.op_type for node in site.nodes] == ["Reshape", "Relu"]
    merged = CSE.apply(graph, site)
    assert Counter(node.op_type for node in merged.nodes) == {
        "Reshape": 2,
        "Relu": 1,
        "Sigmoid": 1,
        "Tanh": 1,
    }
    assert list(CSE.sites(merged)) == []
    feeds = random_feeds(model, seed=0)
    for want, got in zip(run_onnx(model, feeds), run_onnx(merged.to_onnx(), feeds), strict=True):
        np.testing.assert_allclose(got, want)


@pytest.mark.skipif(nchwc_block_size() is None, reason="onnxruntime does no NCHWc")
def test_blocked_query_key_and_value_projections_share_one_reorder():
    graph = start_state(load_model(cached_path("bert", "small")), "ort:all", OrtSettings()).graph
    blocked, _ = ProjectionToNchwc().apply_everywhere(graph)
    layers = sum(node.op_type == "Gelu" for node in graph.nodes)

    shared, steps = CSE.apply_everywhere(blocked)
    assert steps == 2 * layers  # key and value onto the query's, in each layer
    reorders = Counter(n.op_type for n in shared.nodes)["ReorderInput"]
    assert reorders == Counter(n.op_type for n in blocked.nodes)["ReorderInput"] - 2 * layers
    assert check_equivalence(graph, shared).equivalent
