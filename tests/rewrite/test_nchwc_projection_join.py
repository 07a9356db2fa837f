"""The ops between two blocked projections run blocked: both directions verified, every
feed-forward of a zoo transformer's graph joined once its projections are blocked (Gelu, Relu
and a GEGLU's Split and Mul), the result computing what onnxruntime's graph does, the reverse
taking every join back, the refusals that keep padded channels out of the ops between, and a
projection's bias left between (its MatMul blocked alone) folded into the Conv so that the
ops between can join."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from rlflow.cost import OrtSettings, check_equivalence, nchwc_block_size
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import NCHWC_DOMAIN, Graph, Node, Value, load_model
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules.nchwc_blocked import ConvActivationFusion
from rlflow.rewrite.rules.nchwc_format import ConvLayout
from rlflow.rewrite.rules.nchwc_layout import blocked_conv
from rlflow.rewrite.rules.nchwc_projection import ProjectionToNchwc
from rlflow.rewrite.rules.nchwc_projection_join import ProjectionBias, ProjectionJoin
from rlflow.rewrite.verify import verify_rule
from rlflow.zoo import cached_path

JOIN, SPLIT, BIAS = ProjectionJoin(), ProjectionJoin(reverse=True), ProjectionBias()
pytestmark = pytest.mark.skipif(nchwc_block_size() is None, reason="onnxruntime does no NCHWc")


@pytest.mark.parametrize("rule", [JOIN, SPLIT, BIAS], ids=lambda rule: rule.name)
def test_both_directions_pass_verification(rule):
    result = verify_rule(rule)
    assert result.passed, result.reason


def _reorders(graph) -> int:
    return sum(node.domain == NCHWC_DOMAIN and "Reorder" in node.op_type for node in graph.nodes)


@pytest.mark.parametrize(
    ("model", "between"),
    [("bert", "Gelu"), ("transformer-transducer", "Relu"), ("mini-dalle", "Split")],
)
def test_every_feed_forward_runs_blocked_and_comes_back(model, between):
    graph = start_state(load_model(cached_path(model, "small")), "ort:all", OrtSettings()).graph
    blocked, _ = ProjectionToNchwc().apply_everywhere(graph)
    layers = sum(node.op_type == between for node in blocked.nodes)
    assert layers

    joined, count = JOIN.apply_everywhere(blocked)
    assert count == layers  # one feed-forward per layer, its activation (or Split) between
    assert _reorders(joined) == _reorders(blocked) - 2 * count
    readers = [joined.consumers(n.outputs[0]) for n in joined.nodes if n.op_type == between]
    assert all(r.domain == NCHWC_DOMAIN for group in readers for r in group if r.op_type != "Mul")
    assert check_equivalence(graph, joined).equivalent

    back, returned = SPLIT.apply_everywhere(joined)
    assert returned == count
    assert _reorders(back) == _reorders(blocked)
    assert check_equivalence(graph, back).equivalent


def test_a_relu_between_is_then_fused_into_the_up_projection():
    original = load_model(cached_path("transformer-transducer", "small"))
    graph = start_state(original, "ort:all", OrtSettings()).graph
    joined, count = JOIN.apply_everywhere(ProjectionToNchwc().apply_everywhere(graph)[0])
    fused, fusions = ConvActivationFusion().apply_everywhere(joined)
    assert fusions == count
    assert not any(node.op_type == "Relu" for node in fused.nodes)
    convs = Counter(n.attr("activation") for n in fused.nodes if n.domain == NCHWC_DOMAIN)
    assert convs["Relu"] == count
    assert check_equivalence(graph, fused).equivalent


def _rows_between(split: list[int], channels: int, residual: bool = False, regroup=False):
    """Blocked rows out to rows, split (if `split`), a Gelu, and blocked again; with
    `residual` the Gelu's result is also read as rows, by a Relu; with `regroup` the Gelu
    runs on the rows regrouped as twice as many rows of half the channels."""
    b = ModelBuilder()
    x = b.op("ReorderInput", [b.input((1, 6, 1, channels))], domain=NCHWC_DOMAIN, channels_last=1)
    x = b.op("ReorderOutput", [x], domain=NCHWC_DOMAIN, channels=channels, channels_last=1)
    if split:
        x = b.op("Split", [x, b.const(split, np.int64)], outputs=len(split), axis=3)[0]
    if regroup:
        x = b.op("Reshape", [x, b.const([1, 12, channels // 2], np.int64)])
    y = b.op("Gelu", [x], domain="com.microsoft")
    if regroup:
        y = b.op("Reshape", [y, b.const([1, 6, 1, channels], np.int64)])
    again = b.op("ReorderInput", [y], domain=NCHWC_DOMAIN, channels_last=1)
    out = b.op(
        "ReorderOutput",
        [again],
        domain=NCHWC_DOMAIN,
        channels=split[0] if split else channels,
        channels_last=1,
    )
    return load_model(b.model(out, b.op("Relu", [y])) if residual else b.model(out))


def _reasons(graph):
    anchors = [n for n in graph.nodes if n.op_type == "ReorderInput" and n.attr("channels_last")]
    return [JOIN.reason(graph, match) for match in JOIN.matches(graph, anchors[-1])]


def test_the_ops_between_need_whole_blocks_of_whole_rows_and_no_reader_outside():
    block = nchwc_block_size()
    assert _reasons(_rows_between([], 2 * block)) == [None]
    assert _reasons(_rows_between([], 2 * block + 8)) == [
        "the channels between are not whole blocks (the ReorderInput pads them)"
    ]
    assert _reasons(_rows_between([block, 4, block - 4], 2 * block))[0].endswith(
        "is not 6 rows of whole blocks of channels"  # a Split's other parts
    )
    assert _reasons(_rows_between([], 4 * block, regroup=True))[0].endswith(
        "is not 6 rows of whole blocks of channels"
    )
    assert "read outside the pattern" in _reasons(_rows_between([], 2 * block, True))[0]


def _bias_between(gelu_reads_rows_too: bool = False):
    """An up-projection blocked without its bias Add (as greedy leaves BERT's), the Add and a
    Gelu between it and the down-projection; or the Gelu's result added to the projection's
    rows as well, which then have a reader besides the Add."""
    block = nchwc_block_size()
    rng = np.random.default_rng(0)
    layout = ConvLayout(per_output=False, reorder_input=True)
    b = ModelBuilder()
    x = b.op("ReorderInput", [b.input((1, 6, 1, block))], domain=NCHWC_DOMAIN, channels_last=1)
    weight = rng.standard_normal((2 * block, block, 1, 1)).astype(np.float32)
    rows = b.op(
        "ReorderOutput",
        [blocked_conv(b, x, weight, layout)],
        domain=NCHWC_DOMAIN,
        channels=2 * block,
        channels_last=1,
    )
    rows = b.op("Reshape", [rows, b.const([1, 6, 2 * block], np.int64)])
    y = b.op("Gelu", [b.op("Add", [rows, b.const((2 * block,))])], domain="com.microsoft")
    if gelu_reads_rows_too:
        y = b.op("Mul", [y, rows])
    y = b.op("Reshape", [y, b.const([1, 6, 1, 2 * block], np.int64)])
    y = b.op("ReorderInput", [y], domain=NCHWC_DOMAIN, channels_last=1)
    weight = rng.standard_normal((block, 2 * block, 1, 1)).astype(np.float32)
    down = blocked_conv(b, y, weight, layout)
    out = b.op("ReorderOutput", [down], domain=NCHWC_DOMAIN, channels=block, channels_last=1)
    return load_model(b.model(out))


def test_a_bias_between_goes_into_the_up_projection_as_the_ops_between_join():
    """In one step, so that a search ranking each step alone (greedy) takes it: the bias
    alone in the Conv is priced about as the Add it saves."""
    graph = _bias_between()
    joined, joins = JOIN.apply_everywhere(graph)
    assert joins == 1
    kinds = [node.op_type for node in joined.nodes]
    assert kinds == ["ReorderInput", "Conv", "Gelu", "Conv", "ReorderOutput"]
    assert check_equivalence(graph, joined).equivalent

    folded, folds = BIAS.apply_everywhere(graph)  # the bias alone, then the join: the same
    assert folds == 1
    again, _ = JOIN.apply_everywhere(folded)
    assert again.canonical_hash() == joined.canonical_hash()


def test_a_bias_whose_rows_are_read_again_stays_between():
    assert _reasons(_bias_between(gelu_reads_rows_too=True)) == [
        "the projection's rows are read by more than the Add"
    ]


def _scaled_by_a_constant_expression(blocked: bool):
    """A Relu between, scaled by Mul(0.25, 2.0): an op of two scalar constants, whose result
    is a scalar computed between (load_model folds such an op; a rewrite may leave one); the
    rows out to rows and blocked again, or all blocked."""
    block = nchwc_block_size()
    b = ModelBuilder()
    x = b.op("ReorderInput", [b.input((1, 6, 1, block))], domain=NCHWC_DOMAIN, channels_last=1)
    if not blocked:
        x = b.op("ReorderOutput", [x], domain=NCHWC_DOMAIN, channels=block, channels_last=1)
    y = b.op("Mul", [b.op("Relu", [x]), b.const(np.float32(0.5))])
    if not blocked:
        y = b.op("ReorderInput", [y], domain=NCHWC_DOMAIN, channels_last=1)
    out = b.op("ReorderOutput", [y], domain=NCHWC_DOMAIN, channels=block, channels_last=1)
    graph = load_model(b.model(out))
    ((scale, _),) = graph.initializers.items()
    factors = {"quarter": np.float32(0.25), "two": np.float32(2.0)}
    return Graph(
        [*graph.nodes, Node.make("Mul", list(factors), [scale])],
        graph.inputs,
        graph.outputs,
        factors,
        {**graph.values, **{n: Value(n, onnx.TensorProto.FLOAT, ()) for n in factors}},
        graph.opset,
    )


@pytest.mark.parametrize("rule", [JOIN, SPLIT], ids=lambda rule: rule.name)
def test_a_scalar_computed_between_is_refused_not_an_error(rule):
    # A scalar has no channels to block: the check read its channels and raised IndexError.
    # An IndexError there stopped a PPO run on mini-DALL-E (2026-12-07); this case fits its
    # traceback, the run's own graph was not kept.
    graph = _scaled_by_a_constant_expression(blocked=rule.reverse)
    reasons = [rule.reason(graph, m) for anchor in graph.nodes for m in rule.matches(graph, anchor)]
    scale = next(node.outputs[0] for node in graph.nodes if node.inputs == ["quarter", "two"])
    assert reasons == [f"{scale!r} is not " + ("a blocked image" if rule.reverse else "rows")]
