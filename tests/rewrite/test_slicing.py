"""slice-hoist: a selection of rows moves above the ops that compute them, and the rewritten
graph computes what the original does; on ViT it shrinks the last layer to the class token's
row, and on models that read every row it finds nothing to do."""

from __future__ import annotations

import numpy as np
import pytest

from rlflow.cost import OrtSettings, check_equivalence
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import MS_DOMAIN, load_model
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules.slicing import Selection, SliceHoist, selection
from rlflow.rewrite.verify import verify_rule
from rlflow.zoo import cached_path

HOIST = SliceHoist()


def hoisted(model):
    """The graph before and after one slice-hoist at its first site, checked equivalent."""
    graph = load_model(model)
    match = next(iter(HOIST.sites(graph)))
    result = HOIST.apply(graph, match)
    report = check_equivalence(graph, result)
    assert report.equivalent, report.reason
    return graph, result


def row_counts(graph, op_types):
    """The number of rows (second to last axis) each op of these types computes, in order."""
    return [graph.value(n.outputs[0]).shape[-2] for n in graph.nodes if n.op_type in op_types]


def test_the_rule_passes_verification():
    result = verify_rule(HOIST)
    assert result.passed, result.reason
    assert result.settings == 11


def test_selections_are_read_from_slices_and_single_index_gathers():
    b = ModelBuilder()
    x = b.input((2, 5, 8))
    ints = [b.const(v, np.int64) for v in ([-2], [100], [1], [1])]
    slice_node = b.op("Slice", [x, *ints])
    stepped = b.op("Slice", [x, ints[0], ints[1], ints[2], b.const([2], np.int64)])
    gathered = b.op("Gather", [x, b.const(-1, np.int64)], axis=2)
    kept_axis = b.op("Gather", [x, b.const([3], np.int64)], axis=1)
    whole = b.op("Slice", [x, b.const([0], np.int64), b.const([5], np.int64), ints[2]])
    graph = load_model(b.model(slice_node, stepped, gathered, kept_axis, whole))
    found = [selection(graph, node) for node in graph.nodes]
    assert found == [
        Selection(1, 3, 5),
        None,  # a step of 2
        Selection(2, 7, 8, drop=True),
        Selection(1, 3, 4),  # a 1-D index keeps the axis
        None,  # the whole axis: nothing to move
    ]


def test_a_residual_block_moves_whole_in_one_step():
    b = ModelBuilder()
    x = b.input((1, 6, 8))
    a = b.op("Neg", [x])
    norm = b.op("LayerNormalization", [a, b.const((8,)), b.const((8,))], axis=-1)
    hidden = b.op("Relu", [b.op("Add", [b.op("MatMul", [norm, b.const((8, 16))]), b.const((16,))])])
    block = b.op("Add", [a, b.op("MatMul", [hidden, b.const((16, 8))])])
    graph, result = hoisted(b.model(b.op("Gather", [block, b.const(0, np.int64)], axis=1)))
    # One Slice of the input serves both paths; every op after it computes one row.
    assert [n.op_type for n in result.nodes].count("Slice") == 1
    assert result.nodes[0].op_type == "Slice"
    assert set(row_counts(result, {"Neg", "LayerNormalization", "MatMul", "Add", "Relu"})) == {1}
    assert len(result.nodes) == len(graph.nodes) + 1  # the Gather now a Slice and a Reshape


def test_an_op_also_read_elsewhere_stays_for_that_reader():
    b = ModelBuilder()
    norm = b.op("LayerNormalization", [b.input((1, 6, 8)), b.const((8,)), b.const((8,))])
    model = b.model(b.op("Gather", [norm, b.const(0, np.int64)], axis=1), b.op("Relu", [norm]))
    graph, result = hoisted(model)
    assert row_counts(result, {"LayerNormalization"}) == [6, 1]


def test_a_value_also_read_whole_is_sliced_where_it_is_computed():
    """Attention scores of a tensor with itself: the rows move into the MatMul, but the other
    operand needs every row, so the Neg computing both stays whole."""
    b = ModelBuilder()
    x = b.op("Neg", [b.input((1, 6, 8))])
    scores = b.op("FusedMatMul", [x, x], domain=MS_DOMAIN, transB=1, alpha=0.5)
    graph, result = hoisted(
        b.model(b.op("Softmax", [b.op("Slice", [scores, *_bounds(b, 2, 4, 1)])]))
    )
    assert row_counts(result, {"Neg"}) == [6]
    assert row_counts(result, {"FusedMatMul"}) == [2]


def test_a_normalised_axis_and_weight_columns_are_not_moved_through():
    b = ModelBuilder()
    x = b.input((1, 6, 8))
    norm = b.op("LayerNormalization", [x, b.const((8,)), b.const((8,))])
    product = b.op("MatMul", [b.op("Neg", [x]), b.const((8, 4))])
    graph = load_model(
        b.model(
            b.op("Slice", [norm, *_bounds(b, 0, 2, 2)]),
            b.op("Slice", [product, *_bounds(b, 0, 2, -1)]),
        )
    )
    assert list(HOIST.sites(graph)) == []


def _bounds(b: ModelBuilder, start: int, end: int, axis: int) -> list[str]:
    return [b.const([v], np.int64) for v in (start, end, axis)]


@pytest.mark.parametrize("start", ["original", "ort:all", "ort:all-SkipLayerNormFusion"])
def test_vit_computes_its_last_layer_for_the_class_token_alone(start):
    original = load_model(cached_path("vit-base", "small"))
    graph = start_state(original, start, OrtSettings()).graph
    matches = list(HOIST.sites(graph))
    assert len(matches) == 1  # the head's Gather of the class token
    result = HOIST.apply(graph, matches[0])
    products = {"MatMul", "Gemm", "FusedMatMul"}
    before, after = row_counts(graph, products), row_counts(result, products)
    assert len(after) == len(before)
    # The last layer's query, scores, output projection and feed-forward, and the head: one
    # row each; the keys and values, and every earlier layer, keep all 17 tokens.
    assert sum(rows == 1 for rows in after) - sum(rows == 1 for rows in before) >= 5
    report = check_equivalence(original, result)
    assert report.equivalent, report.reason


@pytest.mark.parametrize("model", ["bert", "resnet-18"])
def test_models_that_read_every_row_have_no_site(model):
    original = load_model(cached_path(model, "small"))
    for start in ("original", "ort:all"):
        assert list(HOIST.sites(start_state(original, start, OrtSettings()).graph)) == []
