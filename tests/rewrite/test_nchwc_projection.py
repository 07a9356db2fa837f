"""Projections as 1x1 Convs in onnxruntime's blocked layout: both directions verified, every
projection of a zoo transformer's onnxruntime graph a site, the rewritten graph computing what
the original does, and the reverse taking every site back out of the layout."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from rlflow.cost import OrtSettings, check_equivalence, nchwc_block_size
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import NCHWC_DOMAIN, load_model
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules import nchwc_layout
from rlflow.rewrite.rules.nchwc import BlockedConvUnblock
from rlflow.rewrite.rules.nchwc_projection import ProjectionToNchwc
from rlflow.rewrite.verify import verify_rule
from rlflow.zoo import cached_path

FORWARD, REVERSE = ProjectionToNchwc(), ProjectionToNchwc(reverse=True)
pytestmark = pytest.mark.skipif(nchwc_block_size() is None, reason="onnxruntime does no NCHWc")


@pytest.mark.parametrize("rule", [FORWARD, REVERSE], ids=lambda rule: rule.name)
def test_both_directions_pass_verification(rule):
    result = verify_rule(rule)
    assert result.passed, result.reason


def _projections(graph):
    return [
        node
        for node in graph.nodes
        if node.op_type in ("Gemm", "MatMul") and graph.is_constant(node.inputs[1])
    ]


@pytest.mark.parametrize("model", ["bert", "transformer-transducer"])
def test_every_projection_of_onnxruntimes_graph_is_blocked_and_comes_back(model):
    original = load_model(cached_path(model, "small"))
    graph = start_state(original, "ort:all", OrtSettings()).graph
    projections = _projections(graph)
    assert projections

    blocked, count = FORWARD.apply_everywhere(graph)
    assert count == len(projections)
    ops = Counter(node.op_type for node in blocked.nodes if node.domain == NCHWC_DOMAIN)
    assert ops["Conv"] == ops["ReorderInput"] == ops["ReorderOutput"] == count
    assert not _projections(blocked)
    assert check_equivalence(graph, blocked).equivalent

    back, returned = REVERSE.apply_everywhere(blocked)
    assert returned == count
    assert not any(node.domain == NCHWC_DOMAIN for node in back.nodes)
    assert len(_projections(back)) == count
    assert check_equivalence(graph, back).equivalent


def test_the_recorded_shapes_are_the_ones_onnxruntime_computes(tmp_path):
    graph = FORWARD.example_graph(0)
    blocked, count = FORWARD.apply_everywhere(graph)
    assert count == 1
    path = tmp_path / "blocked.onnx"
    onnx.save(blocked.to_onnx(), path)
    reloaded = load_model(path)  # shapes of nchwc values come from running it in onnxruntime
    for node in blocked.nodes:
        for name in node.outputs:
            assert reloaded.value(name).shape == blocked.value(name).shape, node.op_type


def _projection(k: int, **gemm: object):
    b = ModelBuilder()
    weight = np.ones((k, 8), np.float32)
    return load_model(b.model(b.op("Gemm", [b.input((3, k)), b.const(weight)], **gemm)))


@pytest.mark.parametrize(
    ("k", "gemm", "reason"),
    [
        (6, {}, "6 inputs are not in fours (ReorderInput's unit)"),
        (8, {"alpha": 0.5}, "the Gemm transposes its input or scales"),
    ],
)
def test_a_projection_the_blocked_conv_cannot_run_is_refused(k, gemm, reason):
    graph = _projection(k, **gemm)
    match = next(iter(FORWARD.matches(graph, graph.nodes[0])))
    assert FORWARD.check(graph, match) == reason


def test_no_site_where_onnxruntime_does_no_nchwc(monkeypatch):
    graph = _projection(8)
    match = next(iter(FORWARD.matches(graph, graph.nodes[0])))
    assert FORWARD.check(graph, match) is None
    monkeypatch.setattr(nchwc_layout, "nchwc_block_size", lambda: None)
    assert FORWARD.check(graph, match) == "onnxruntime does no NCHWc on this machine"


def test_a_blocked_projection_is_not_unblocked_into_a_plain_conv():
    """nchwc-conv-unblock leaves a projection's m x 1 rows to nchwc-projection-reverse."""
    graph = load_model(FORWARD.example(1))
    blocked = FORWARD.apply(graph, next(iter(FORWARD.sites(graph))))
    unblock = BlockedConvUnblock()
    assert not list(unblock.sites(blocked))
    reasons = [
        unblock.reason(blocked, match)
        for anchor in blocked.nodes
        for match in unblock.matches(blocked, anchor)
    ]
    assert reasons and all("m x 1" in reason for reason in reasons)
    assert list(REVERSE.sites(blocked))
