"""Every built-in rule, onnxscript style: a tiny model, the op types after the rewrite, the same
outputs in onnxruntime (fixed seed), a result that passes the full checker, and a negative case
with the reason the rule gives (None: the pattern does not even match)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from rlflow.graph import is_standard, load_model
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules import builtin_rules
from tests.conftest import random_feeds, run_onnx
from tests.rewrite import nchwc_cases

RULES = {rule.name: rule for rule in builtin_rules()}

# Op types of each rule's example (shape setting 0) after the rewrite at its first site.
EXPECTED_OPS = {
    "identity-elim": ["Neg", "Relu"],
    "dropout-elim": ["Neg", "Relu"],
    "reshape-reshape-fold": ["Reshape"],
    "reshape-noop-elim": ["Neg"],
    "transpose-transpose-fold": ["Neg", "Transpose"],
    "transpose-noop-elim": ["Neg"],
    "cast-cast-elim": ["Neg", "Relu"],
    "cast-noop-elim": ["Neg", "Relu"],
    "split-concat-elim": ["Neg", "Relu"],
    "split-unary-hoist": ["Neg", "Relu", "Split", "Concat"],
    "constant-fold": ["Relu", "Add"],
    "common-subexpression-elim": ["Reshape", "Relu", "Sigmoid"],
    "matmul-transpose-weight-fold": ["MatMul"],
    "matmul-add-to-gemm": ["Gemm"],
    "matmul-add-to-gemm-reverse": ["MatMul", "Add"],
    "matmul-scale-to-fusedmatmul": ["FusedMatMul"],
    "matmul-transpose-a-to-fusedmatmul": ["FusedMatMul"],
    "matmul-transpose-b-to-fusedmatmul": ["FusedMatMul"],
    "conv-relu-to-fusedconv": ["FusedConv"],
    "conv-add-relu-to-fusedconv": ["Conv", "Neg", "FusedConv"],
    "conv-batchnorm-fold": ["Conv"],
    "conv-mul-fold": ["Conv"],
    "conv-add-bias-fold": ["Conv"],
    "conv-siblings-merge": ["Neg", "Conv", "Split", "Relu", "Relu"],
    "conv-siblings-merge-reverse": ["Neg", "Conv", "Conv"],
    "conv-enlarge-kernel": ["Neg", "Conv", "Conv"],
    "conv-groups-halve": ["Conv"],
    "concat-convs-to-group-conv": ["Concat", "Conv"],
    "gelu-fusion": ["Neg", "Gelu"],
    "bias-gelu-fusion": ["BiasGelu"],
    "fastgelu-fusion": ["Neg", "FastGelu"],
    "layernorm-fusion": ["LayerNormalization"],
    "skip-layernorm-fusion": ["Neg", "SkipLayerNormalization"],
    "matmul-siblings-merge": ["Neg", "MatMul", "Add", "Split", "Relu", "Relu"],
    "matmul-siblings-merge-reverse": ["Neg", "MatMul", "Add", "MatMul", "Add"],
    "softmax-scale-fold": ["MatMul", "Add", "Reshape", "Transpose"] * 2 + ["MatMul", "Softmax"],
    "matmul-add-to-reshaped-gemm": ["Reshape", "Gemm", "Reshape"],
    "matmul-add-to-reshaped-gemm-reverse": ["MatMul", "Add"],
    "matmul-input-scale-to-fusedmatmul": ["FusedMatMul"],
    "fusedmatmul-to-matmul": ["MatMul", "Mul"],
    "conv-activation-to-fusedconv": ["FusedConv"],
    "fusedconv-to-conv": ["Conv", "Relu"],
    "skip-layernorm-bias-fusion": ["Neg", "SkipLayerNormalization"],
    "skip-layernorm-fusion-reverse": ["Neg", "Add", "LayerNormalization"],
    "gelu-fusion-reverse": ["Neg", "Div", "Erf", "Add", "Mul", "Mul"],
    "bias-gelu-fusion-reverse": ["Add", "Gelu"],
    "fastgelu-fusion-reverse": ["Neg", "Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"],
    "reshape-unsqueeze-fold": ["Reshape"],
    "reshape-squeeze-fold": ["Reshape"],
    "attention-fusion": ["Neg", "Attention", "Relu"],
    "conv-winograd": ["Pad", "SpaceToDepth", "Slice", "Slice", "Slice", "Slice", "Concat"]
    + ["Reshape", "MatMul"] * 3
    + ["Reshape", "DepthToSpace", "Add"],
    "slice-hoist": ["Slice", "Add", "Neg", "Add", "Reshape"],
    "attention-fusion-reverse": ["Neg"]
    + ["MatMul", "Add", "Reshape", "Transpose"] * 3
    + ["MatMul", "Mul", "Softmax", "MatMul", "Transpose", "Reshape", "Relu"],
}
EXPECTED_OPS.update(nchwc_cases.EXPECTED_OPS)


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_rule_rewrites_its_example(name):
    rule = RULES[name]
    model = rule.example(0)
    graph = load_model(model)
    match = next(iter(rule.sites(graph)))
    result = rule.apply(graph, match)
    assert [node.op_type for node in result.nodes] == EXPECTED_OPS[name]
    exported = result.to_onnx()
    onnx.checker.check_model(exported, full_check=True)
    feeds = random_feeds(model, seed=0)
    for want, got in zip(run_onnx(model, feeds), run_onnx(exported, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ---- negative cases ----------------------------------------------------------------------------

NEGATIVE: dict[str, tuple[Callable[[], onnx.ModelProto], str | None]] = {**nchwc_cases.NEGATIVE}


def negative(name: str, reason: str | None):
    def register(build: Callable[[], onnx.ModelProto]) -> Callable[[], onnx.ModelProto]:
        NEGATIVE[name] = (build, reason)
        return build

    return register


def _conv(b: ModelBuilder, x: str, out: int, cin: int, k: int, **attrs) -> str:
    return b.op("Conv", [x, b.const((out, cin, k, k))], pads=[k // 2] * 4, **attrs)


@negative("identity-elim", "graph output")
def _():
    b = ModelBuilder()
    return b.model(b.op("Identity", [b.input((2, 3))]))


@negative("dropout-elim", "training_mode")
def _():
    b = ModelBuilder()
    x = b.op("Neg", [b.input((2, 3))])
    training = b.const(True, np.bool_)
    return b.model(b.op("Relu", [b.op("Dropout", [x, b.const(0.5), training])]))


@negative("reshape-reshape-fold", "read outside the pattern")
def _():
    b = ModelBuilder()
    flat = b.op("Reshape", [b.input((2, 3)), b.const([6], np.int64)])
    return b.model(b.op("Reshape", [flat, b.const([3, 2], np.int64)]), b.op("Relu", [flat]))


@negative("reshape-noop-elim", "changes the shape")
def _():
    b = ModelBuilder()
    return b.model(b.op("Reshape", [b.op("Neg", [b.input((2, 3))]), b.const([3, 2], np.int64)]))


@negative("transpose-transpose-fold", "graph output")
def _():
    b = ModelBuilder()
    once = b.op("Transpose", [b.input((2, 3))], perm=[1, 0])
    return b.model(b.op("Transpose", [once], perm=[1, 0]))


@negative("transpose-noop-elim", "not the identity")
def _():
    b = ModelBuilder()
    return b.model(b.op("Transpose", [b.op("Neg", [b.input((2, 3))])], perm=[1, 0]))


@negative("cast-cast-elim", "loses information")
def _():
    b = ModelBuilder()
    half = b.op("Cast", [b.op("Neg", [b.input((2, 3))])], to=TensorProto.FLOAT16)
    return b.model(b.op("Cast", [half], to=TensorProto.FLOAT))


@negative("cast-noop-elim", "changes the type")
def _():
    b = ModelBuilder()
    return b.model(b.op("Cast", [b.op("Neg", [b.input((2, 3))])], to=TensorProto.DOUBLE))


@negative("split-concat-elim", "graph output")
def _():
    b = ModelBuilder()
    parts = b.op("Split", [b.input((2, 6)), b.const([2, 4], np.int64)], outputs=2, axis=1)
    return b.model(b.op("Concat", parts, axis=1))


@negative("split-unary-hoist", None)
def _():
    b = ModelBuilder()
    parts = b.op("Split", [b.input((2, 6)), b.const([2, 4], np.int64)], outputs=2, axis=1)
    return b.model(b.op("Relu", [parts[0]]), b.op("Sigmoid", [parts[1]]))


@negative("constant-fold", "graph output")
def _():
    b = ModelBuilder()
    return b.model(b.op("Transpose", [b.const((70, 80))]), b.op("Relu", [b.input((2,))]))


@negative("common-subexpression-elim", None)
def _():
    b = ModelBuilder()  # two Reshapes of one input to different shapes: not twins
    x = b.input((4, 6))
    twins = [b.op("Reshape", [x, b.const(s, np.int64)]) for s in ([2, 12], [12, 2])]
    return b.model(b.op("Relu", [twins[0]]), b.op("Sigmoid", [twins[1]]))


@negative("matmul-transpose-weight-fold", "not a constant")
def _():
    b = ModelBuilder()
    weight = b.op("Transpose", [b.input((4, 3))], perm=[1, 0])
    return b.model(b.op("MatMul", [b.input((2, 3)), weight]))


@negative("matmul-add-to-gemm", "rank 3; Gemm needs rank 2")
def _():
    b = ModelBuilder()
    product = b.op("MatMul", [b.input((2, 3, 4)), b.const((4, 5))])
    return b.model(b.op("Add", [product, b.const((5,))]))


@negative("matmul-add-to-gemm-reverse", "alpha or beta")
def _():
    b = ModelBuilder()
    return b.model(b.op("Gemm", [b.input((2, 3)), b.const((3, 4)), b.const((4,))], alpha=2.0))


@negative("matmul-scale-to-fusedmatmul", "not a constant scalar")
def _():
    b = ModelBuilder()
    product = b.op("MatMul", [b.input((2, 3)), b.input((3, 4))])
    return b.model(b.op("Mul", [product, b.const((4,))]))


def _transposed_3d(side: str) -> onnx.ModelProto:
    b = ModelBuilder()
    a, c = b.input((2, 3, 4)), b.input((2, 4, 5))
    if side == "a":
        a = b.op("Transpose", [b.input((3, 2, 4))], perm=[1, 0, 2])
    else:
        c = b.op("Transpose", [b.input((4, 2, 5))], perm=[1, 0, 2])
    return b.model(b.op("MatMul", [a, c]))


negative("matmul-transpose-a-to-fusedmatmul", "last axis to the second last")(
    lambda: _transposed_3d("a")
)
negative("matmul-transpose-b-to-fusedmatmul", "last axis to the second last")(
    lambda: _transposed_3d("b")
)


@negative("conv-relu-to-fusedconv", "rank-4")
def _():
    b = ModelBuilder()
    conv = b.op("Conv", [b.input((1, 3, 8)), b.const((4, 3, 3))], pads=[1, 1])
    return b.model(b.op("Relu", [conv]))


@negative("conv-add-relu-to-fusedconv", "output shape")
def _():
    b = ModelBuilder()
    conv = _conv(b, b.input((1, 3, 6, 6)), 4, 3, 3)
    return b.model(b.op("Relu", [b.op("Add", [conv, b.const((1, 4, 1, 1))])]))


@negative("conv-batchnorm-fold", "not a constant")
def _():
    b = ModelBuilder()
    conv = b.op("Conv", [b.input((1, 3, 6, 6)), b.input((4, 3, 3, 3))])
    params = [b.const((4,)) for _ in range(3)] + [b.const(np.ones(4))]
    return b.model(b.op("BatchNormalization", [conv, *params]))


@negative("conv-mul-fold", "per-channel")
def _():
    b = ModelBuilder()
    conv = _conv(b, b.input((1, 3, 6, 6)), 4, 3, 3)
    return b.model(b.op("Mul", [conv, b.const((1, 1, 6, 6))]))


@negative("conv-add-bias-fold", "per-channel")
def _():
    b = ModelBuilder()
    conv = _conv(b, b.input((1, 3, 6, 6)), 4, 3, 3)
    return b.model(b.op("Add", [conv, b.input((1, 4, 6, 6))]))


@negative("conv-siblings-merge", None)
def _():
    b = ModelBuilder()
    x = b.op("Neg", [b.input((1, 3, 6, 6))])
    return b.model(_conv(b, x, 4, 3, 3), _conv(b, x, 4, 3, 3, strides=[2, 2]))


@negative("conv-siblings-merge-reverse", None)
def _():
    b = ModelBuilder()
    conv = _conv(b, b.input((1, 3, 6, 6)), 4, 3, 3)
    return b.model(*b.op("Split", [conv, b.const([2, 4], np.int64)], outputs=2, axis=2))


@negative("conv-enlarge-kernel", "dilated")
def _():
    b = ModelBuilder()
    x = b.op("Neg", [b.input((1, 3, 8, 8))])
    small = b.op("Conv", [x, b.const((4, 3, 1, 1))], dilations=[2, 2])
    large = b.op("Conv", [x, b.const((4, 3, 3, 3))], dilations=[2, 2], pads=[1, 1, 1, 1])
    return b.model(small, large)


@negative("conv-groups-halve", "not an even number")
def _():
    b = ModelBuilder()
    return b.model(b.op("Conv", [b.input((1, 6, 5, 5)), b.const((6, 2, 1, 1))], group=3))


@negative("conv-winograd", "strided convolution")
def _():
    b = ModelBuilder()
    return b.model(b.op("Conv", [b.input((1, 4, 8, 8)), b.const((4, 4, 3, 3))], strides=[2, 2]))


@negative("slice-hoist", None)
def _():
    b = ModelBuilder()
    normed = b.op("Softmax", [b.input((2, 5, 8))], axis=1)
    return b.model(b.op("Gather", [normed, b.const(0, np.int64)], axis=1))


@negative("concat-convs-to-group-conv", None)
def _():
    b = ModelBuilder()
    left = _conv(b, b.input((1, 3, 6, 6)), 4, 3, 3)
    right = _conv(b, b.input((1, 3, 6, 6)), 4, 3, 1)
    return b.model(b.op("Concat", [left, right], axis=1))


@negative("gelu-fusion", "sqrt(2)")
def _():
    b = ModelBuilder()
    x = b.op("Neg", [b.input((2, 8))])
    erf = b.op("Erf", [b.op("Div", [x, b.const(2.0)])])
    inner = b.op("Add", [erf, b.const(1.0)])
    return b.model(b.op("Mul", [b.op("Mul", [x, inner]), b.const(0.5)]))


@negative("bias-gelu-fusion", "not a vector")
def _():
    b = ModelBuilder()
    biased = b.op("Add", [b.input((2, 3, 4)), b.const((3, 4))])
    return b.model(b.op("Gelu", [biased], domain="com.microsoft"))


@negative("fastgelu-fusion", "constant c1")
def _():
    b = ModelBuilder()
    x = b.op("Neg", [b.input((2, 8))])
    cube = b.op("Mul", [b.op("Pow", [x, b.const(3.0)]), b.const(0.05)])
    inner = b.op("Mul", [b.op("Add", [x, cube]), b.const(math.sqrt(2 / math.pi))])
    plus = b.op("Add", [b.op("Tanh", [inner]), b.const(1.0)])
    return b.model(b.op("Mul", [b.op("Mul", [x, b.const(0.5)]), plus]))


@negative("layernorm-fusion", "last axis")
def _():
    b = ModelBuilder()
    x = b.input((4, 6))
    centred = b.op("Sub", [x, b.op("ReduceMean", [x], axes=[0])])
    var = b.op("ReduceMean", [b.op("Pow", [centred, b.const(2.0)])], axes=[0])
    normed = b.op("Div", [centred, b.op("Sqrt", [b.op("Add", [var, b.const(1e-5)])])])
    return b.model(b.op("Add", [b.op("Mul", [normed, b.const((6,))]), b.const((6,))]))


@negative("skip-layernorm-fusion", "3-D")
def _():
    b = ModelBuilder()
    total = b.op("Add", [b.input((4, 8)), b.input((4, 8))])
    return b.model(b.op("LayerNormalization", [total, b.const((8,)), b.const((8,))]))


@negative("matmul-siblings-merge", None)
def _():
    b = ModelBuilder()
    x = b.op("Neg", [b.input((2, 4))])
    return b.model(b.op("MatMul", [x, b.input((4, 3))]), b.op("MatMul", [x, b.input((4, 5))]))


@negative("matmul-siblings-merge-reverse", None)
def _():
    b = ModelBuilder()
    product = b.op("MatMul", [b.input((4, 3)), b.const((3, 6))])
    return b.model(*b.op("Split", [product, b.const([2, 2], np.int64)], outputs=2, axis=0))


@negative("softmax-scale-fold", "scalar")
def _():
    b = ModelBuilder()
    x = b.input((1, 4, 6))
    q = b.op("MatMul", [x, b.const((6, 6))])
    k = b.op("Transpose", [b.op("MatMul", [x, b.const((6, 6))])], perm=[0, 2, 1])
    scores = b.op("Mul", [b.op("MatMul", [q, k]), b.const((4,))])
    return b.model(b.op("Softmax", [scores], axis=-1))


@negative("matmul-add-to-reshaped-gemm", "matrix")
def _():
    b = ModelBuilder()
    product = b.op("MatMul", [b.input((2, 3)), b.const((3, 4))])
    return b.model(b.op("Add", [product, b.const((4,))]))


@negative("matmul-add-to-reshaped-gemm-reverse", "alpha or beta")
def _():
    b = ModelBuilder()
    rows = b.op("Reshape", [b.input((1, 2, 3)), b.const([2, 3], np.int64)])
    product = b.op("Gemm", [rows, b.const((3, 4)), b.const((4,))], beta=0.5)
    return b.model(b.op("Reshape", [product, b.const([1, 2, 4], np.int64)]))


@negative("matmul-input-scale-to-fusedmatmul", "not a constant scalar")
def _():
    b = ModelBuilder()
    scaled = b.op("Mul", [b.input((2, 3)), b.const((3,))])
    return b.model(b.op("MatMul", [scaled, b.input((3, 4))]))


@negative("fusedmatmul-to-matmul", "batch axes")
def _():
    b = ModelBuilder()
    a, c = b.input((3, 2, 4)), b.input((2, 4, 5))
    return b.model(b.op("FusedMatMul", [a, c], domain="com.microsoft", transBatchA=1))


@negative("conv-activation-to-fusedconv", "bounds are not constants")
def _():
    b = ModelBuilder()
    conv = _conv(b, b.input((1, 3, 6, 6)), 4, 3, 3)
    return b.model(b.op("Clip", [conv, b.input(())]))


@negative("fusedconv-to-conv", "opset 11")
def _():
    b = ModelBuilder(opset=10)
    inputs = [b.input((1, 3, 6, 6)), b.const((4, 3, 3, 3))]
    fused = b.op(
        "FusedConv", inputs, domain="com.microsoft", activation="Clip", activation_params=[0.0, 6.0]
    )
    return b.model(fused)


@negative("skip-layernorm-bias-fusion", "not a constant vector")
def _():
    b = ModelBuilder()
    biased = b.op("Add", [b.input((1, 4, 8)), b.input((8,))])
    inputs = [biased, b.input((1, 4, 8)), b.const((8,))]
    return b.model(b.op("SkipLayerNormalization", inputs, domain="com.microsoft"))


@negative("skip-layernorm-fusion-reverse", "opset 17")
def _():
    b = ModelBuilder(opset=16)
    inputs = [b.input((1, 4, 8)), b.input((1, 4, 8)), b.const((8,))]
    return b.model(b.op("SkipLayerNormalization", inputs, domain="com.microsoft"))


@negative("gelu-fusion-reverse", None)  # ONNX's own Gelu (opset 20) is not onnxruntime's
def _():
    b = ModelBuilder(opset=20)
    return b.model(b.op("Gelu", [b.input((2, 8))]))


@negative("bias-gelu-fusion-reverse", None)  # a Gelu without a bias: gelu-fusion-reverse's
def _():
    b = ModelBuilder()
    return b.model(b.op("Gelu", [b.input((2, 8))], domain="com.microsoft"))


@negative("fastgelu-fusion-reverse", None)  # the exact Gelu is not the tanh approximation
def _():
    b = ModelBuilder()
    return b.model(b.op("Gelu", [b.input((2, 8))], domain="com.microsoft"))


@negative("reshape-unsqueeze-fold", "read outside the pattern")
def _():
    b = ModelBuilder()
    flat = b.op("Reshape", [b.input((2, 3)), b.const([6], np.int64)])
    return b.model(b.op("Unsqueeze", [flat, b.const([0], np.int64)]), b.op("Relu", [flat]))


@negative("reshape-squeeze-fold", "read outside the pattern")
def _():
    b = ModelBuilder()
    flat = b.op("Reshape", [b.input((2, 3)), b.const([1, 6], np.int64)])
    return b.model(b.op("Squeeze", [flat, b.const([0], np.int64)]), b.op("Relu", [flat]))


@negative("attention-fusion", None)  # a mask that is not causal: not the operator's own
def _():
    b = ModelBuilder()
    x = b.input((1, 4, 6))
    heads = []
    for perm in ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]):
        h = b.op("Add", [b.op("MatMul", [x, b.const((6, 6))]), b.const((6,))])
        h = b.op("Reshape", [h, b.const([1, 4, 2, 3], np.int64)])
        heads.append(b.op("Transpose", [h], perm=perm))
    scores = b.op("Add", [b.op("MatMul", heads[:2]), b.const((4, 4))])
    context = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), heads[2]])
    merged = b.op("Transpose", [context], perm=[0, 2, 1, 3])
    return b.model(b.op("Reshape", [merged, b.const([1, 4, 6], np.int64)]))


@negative("attention-fusion-reverse", None)  # a mask input the written-out form does not take
def _():
    b = ModelBuilder()
    x = b.input((1, 4, 6))
    mask = b.input((1, 4), TensorProto.INT32)
    weights = [b.const((6, 18)), b.const((18,))]
    return b.model(b.op("Attention", [x, *weights, mask], domain="com.microsoft", num_heads=2))


def _reasons(rule, graph) -> list[str | None]:
    anchors = (
        graph.nodes
        if rule.anchor_ops is None
        else [node for node in graph.nodes if node.op_type in rule.anchor_ops]
    )
    return [rule.reason(graph, match) for node in anchors for match in rule.matches(graph, node)]


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_rule_rejects_its_negative_case_with_a_reason(name):
    build, expected = NEGATIVE[name]
    rule = RULES[name]
    graph = load_model(build())
    assert list(rule.sites(graph)) == []
    reasons = _reasons(rule, graph)
    if expected is None:
        assert reasons == []
    else:
        assert reasons and all(reasons), reasons
        assert any(expected in reason for reason in reasons), reasons


def test_every_builtin_rule_has_a_positive_and_a_negative_case():
    assert set(EXPECTED_OPS) == set(RULES) == set(NEGATIVE)


def test_rule_names_are_kebab_case_and_contrib_rules_are_not_portable():
    for rule in RULES.values():
        assert rule.name == rule.name.lower() and " " not in rule.name and "_" not in rule.name
        example = load_model(rule.example(0))
        result = rule.apply(example, next(iter(rule.sites(example))))
        emits_contrib = any(not is_standard(node.domain) for node in result.nodes)
        assert rule.portable == (not emits_contrib), rule.name


# ---- behaviour beyond the examples ---------------------------------------------------------


def test_gemm_matches_the_bias_on_either_side():
    b = ModelBuilder()
    product = b.op("MatMul", [b.input((2, 3)), b.const((3, 4))])
    graph = load_model(b.model(b.op("Add", [b.const((4,)), product])))
    assert len(list(RULES["matmul-add-to-gemm"].sites(graph))) == 1


def test_gemm_reverse_folds_a_constant_transposed_weight():
    rule = RULES["matmul-add-to-gemm-reverse"]
    graph = load_model(rule.example(0))  # Gemm(x, W, b, transB=1)
    result = rule.apply(graph, next(iter(rule.sites(graph))))
    weight = result.constant(result.nodes[0].inputs[1])
    assert weight.shape == (3, 4)


def test_skip_layernorm_keeps_a_sum_that_is_read_again():
    rule = RULES["skip-layernorm-fusion"]
    model = rule.example(1)  # the Add's result also feeds a later Add
    graph = load_model(model)
    result = rule.apply(graph, next(iter(rule.sites(graph))))
    fused = result.nodes[1]
    assert fused.op_type == "SkipLayerNormalization" and fused.outputs[3]
    assert result.consumers(fused.outputs[3])[0].op_type == "Add"
    feeds = random_feeds(model, seed=1)
    np.testing.assert_allclose(
        run_onnx(result.to_onnx(), feeds)[0], run_onnx(model, feeds)[0], rtol=1e-4, atol=1e-5
    )


def test_matmul_merge_then_split_gives_back_the_same_graph():
    merge, split = RULES["matmul-siblings-merge"], RULES["matmul-siblings-merge-reverse"]
    graph = load_model(merge.example(0))
    merged = merge.apply(graph, next(iter(merge.sites(graph))))
    restored = split.apply(merged, next(iter(split.sites(merged))))
    assert restored.canonical_hash() == graph.canonical_hash()


def test_softmax_scale_moves_into_the_query_weight():
    rule = RULES["softmax-scale-fold"]
    graph = load_model(rule.example(0))
    match = next(iter(rule.sites(graph)))
    old_weight = graph.constant(match.nodes[-1].inputs[1])
    result = rule.apply(graph, match)
    assert "Mul" not in result.op_counts()
    scaled = [w for w in result.initializers.values() if w.shape == old_weight.shape]
    assert any(np.allclose(w, old_weight * 3**-0.5) for w in scaled)


def test_a_fire_module_becomes_one_conv_in_four_rewrites():
    """TASO's sequence on SqueezeNet's Fire module: enlarge the 1x1 expand conv to 3x3, merge
    it with its 3x3 sibling, hoist the Relu above the Split, cancel Split against Concat."""
    b = ModelBuilder()
    squeeze = b.op("Relu", [b.op("Conv", [b.input((1, 4, 6, 6)), b.const((3, 4, 1, 1))])])
    left = b.op("Relu", [b.op("Conv", [squeeze, b.const((5, 3, 1, 1)), b.const((5,))])])
    right = b.op("Relu", [_conv(b, squeeze, 6, 3, 3)])
    model = b.model(b.op("Concat", [left, right], axis=1))
    graph = load_model(model)
    for name in (
        "conv-enlarge-kernel",
        "conv-siblings-merge",
        "split-unary-hoist",
        "split-concat-elim",
    ):
        graph = RULES[name].apply(graph, next(iter(RULES[name].sites(graph))))
    assert [node.op_type for node in graph.nodes] == ["Conv", "Relu", "Conv", "Relu"]
    feeds = random_feeds(model, seed=2)
    np.testing.assert_allclose(
        run_onnx(graph.to_onnx(), feeds)[0], run_onnx(model, feeds)[0], rtol=1e-4, atol=1e-5
    )


def test_removing_a_node_before_a_graph_output_keeps_the_output_name():
    b = ModelBuilder()
    model = b.model(b.op("Identity", [b.op("Neg", [b.input((2, 3))])]))
    graph = load_model(model)
    rule = RULES["identity-elim"]
    result = rule.apply(graph, next(iter(rule.sites(graph))))
    assert [node.op_type for node in result.nodes] == ["Neg"]
    assert result.nodes[0].outputs == [graph.outputs[0].name] == [result.outputs[0].name]


def test_equal_parts_are_split_by_num_outputs_at_opset_18_and_split_back():
    b = ModelBuilder(opset=18)
    x = b.op("Neg", [b.input((1, 8))])
    model = b.model(*[b.op("MatMul", [x, b.const((8, 4))]) for _ in range(3)])
    graph = load_model(model)
    merge, split = RULES["matmul-siblings-merge"], RULES["matmul-siblings-merge-reverse"]
    merged = merge.apply(graph, next(iter(merge.sites(graph))))
    (node,) = [n for n in merged.nodes if n.op_type == "Split"]
    assert node.attr("num_outputs") == 3 and len(node.inputs) == 1
    restored = split.apply(merged, next(iter(split.sites(merged))))
    assert restored.canonical_hash() == graph.canonical_hash()
    onnx.checker.check_model(merged.to_onnx(), full_check=True)
