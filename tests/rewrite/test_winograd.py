"""Winograd F(2x2, 3x3) for 3x3 convolutions: the transforms are the textbook ones, and the rules
find exactly the 3x3 stride-1 ungrouped Convs of the zoo's CNNs, plain and in onnxruntime's
blocked graph, where every rewritten graph computes what the original does."""

from __future__ import annotations

import numpy as np
import pytest

from rlflow.cost import OrtSettings, check_equivalence, nchwc_block_size
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import load_model
from rlflow.rewrite.rules.winograd import (
    BlockedConvToWinograd,
    ConvToWinograd,
    filter_transform,
    input_transform,
    output_transform,
)
from rlflow.rewrite.verify import verify_rule
from rlflow.zoo import cached_path

WINOGRAD, BLOCKED = ConvToWinograd(), BlockedConvToWinograd()
needs_nchwc = pytest.mark.skipif(
    nchwc_block_size() is None, reason="onnxruntime does no NCHWc here"
)


def test_one_tile_gives_the_2x2_correlation_of_its_4x4_inputs():
    rng = np.random.default_rng(0)
    tile = rng.standard_normal((4, 4))
    weight = rng.standard_normal((1, 1, 3, 3))
    # The tile's elements in the order the rule gathers them: (row shift, column shift, row
    # phase, column phase), the element at row 2a+i, column 2b+j.
    gathered = np.array([tile[2 * a + i, 2 * b + j] for a, b, i, j in np.ndindex(2, 2, 2, 2)])
    products = filter_transform(weight)[:, 0, 0] * (input_transform() @ gathered)
    outputs = (output_transform() @ products).reshape(2, 2)
    direct = [
        [np.sum(tile[r : r + 3, c : c + 3] * weight[0, 0]) for c in range(2)] for r in range(2)
    ]
    np.testing.assert_allclose(outputs, direct, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "rule", [WINOGRAD, pytest.param(BLOCKED, marks=needs_nchwc)], ids=lambda rule: rule.name
)
def test_the_rules_pass_verification(rule):
    result = verify_rule(rule)
    assert result.passed, result.reason


@pytest.mark.parametrize(
    ("model", "sites"), [("resnet-18", 5), ("squeezenet-1.1", 8), ("resnext-50", 0)]
)
def test_every_3x3_stride_1_conv_of_a_zoo_cnn_is_a_site(model, sites):
    graph = load_model(cached_path(model, "small"))
    eligible = [
        node
        for node in graph.nodes
        if node.op_type == "Conv"
        and graph.constant(node.inputs[1]).shape[2:] == (3, 3)
        and node.attr("strides", [1, 1]) == [1, 1]
        and node.attr("group", 1) == 1
    ]
    assert len(eligible) == sites  # ResNeXt's 3x3 Convs are grouped
    rewritten, count = WINOGRAD.apply_everywhere(graph)
    assert count == sites
    if sites:
        assert check_equivalence(graph, rewritten).equivalent


@needs_nchwc
def test_in_onnxruntime_blocked_graph_every_blocked_3x3_conv_is_a_site():
    original = load_model(cached_path("resnet-18", "medium"))
    graph = start_state(original, "ort:all", OrtSettings()).graph
    assert list(WINOGRAD.sites(graph)) == []  # every Conv is blocked
    # ResNet-18's 3x3 stride-1 Convs: 4 in the first stage, 3 in each other.
    rewritten, count = BLOCKED.apply_everywhere(graph)
    assert count == 13
    assert sum(node.op_type == "DepthToSpace" for node in rewritten.nodes) == 13
    assert check_equivalence(original, rewritten).equivalent


@needs_nchwc
def test_a_blocked_conv_reading_nchw_directly_is_refused_with_its_reason():
    original = load_model(cached_path("resnet-18", "small"))
    graph = start_state(original, "ort:all", OrtSettings()).graph
    reasons = {
        BLOCKED.reason(graph, match)
        for node in graph.nodes
        if node.op_type == "Conv"
        for match in BLOCKED.matches(graph, node)
    }
    assert "the Conv reads NCHW (fewer input channels than a block)" in reasons
