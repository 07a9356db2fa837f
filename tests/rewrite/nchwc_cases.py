"""The NCHWc rules' entries in the table every built-in rule has (test_rewrite_rules.py): the op
types of its example after the rewrite, and a negative case with the reason the rule gives
(None: the pattern does not even match)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from rlflow.graph import NCHWC_DOMAIN
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules.nchwc_format import ConvLayout
from rlflow.rewrite.rules.nchwc_layout import blocked_conv, blocked_input, example_block

RI, RO = "ReorderInput", "ReorderOutput"

EXPECTED_OPS = {
    "nchwc-conv": [RI, "Conv", RO],
    "nchwc-conv-reverse": ["FusedConv"],
    "nchwc-conv-merge-groups": [RI, "Conv", RO],
    "nchwc-pool": [RI, "MaxPool", RO],
    "nchwc-pool-reverse": [RI, "MaxPool", "GlobalMaxPool", RO],
    "nchwc-global-pool": [RI, "GlobalAveragePool", RO],
    "nchwc-global-pool-reverse": [RI, RO, "GlobalAveragePool"],
    "nchwc-batchnorm": [RI, "Conv", RO],
    "nchwc-reorder-cancel": [RI, "Relu", RO],
    "nchwc-reorder-cancel-reverse": [RI, "Relu", RO, RI, "MaxPool", RO],
    "nchwc-reorder-roundtrip": [RI, "GlobalAveragePool", RO, "Relu"],
    "nchwc-reorder-share": [RI, "GlobalAveragePool", "GlobalMaxPool", RO, RO],
    "nchwc-activation-move": [RI, "Relu", RO],
    "nchwc-activation-move-reverse": [RI, RO, "Relu"],
    "nchwc-binary-move": [RI, RI, "Add", RO],
    "nchwc-binary-move-reverse": [RI, RI, RO, RO, "Add"],
    "nchwc-concat-move": [RI, RI, "Concat", RO],
    "nchwc-concat-move-reverse": [RI, RI, RO, RO, "Concat"],
    "nchwc-conv-sum-fusion": [RI, RI, "Conv", RO],
    "nchwc-conv-sum-fusion-reverse": [RI, RI, "Conv", "Add", RO],
    "nchwc-conv-activation-fusion": [RI, "Conv", RO],
    "nchwc-conv-activation-fusion-reverse": [RI, "Conv", "Relu", RO],
    "nchwc-conv-unblock": [RI, RO, "Conv", RI, RO],
    "nchwc-conv-winograd": [RI, RO, "Pad", "SpaceToDepth", "Slice", "Slice", "Slice", "Slice"]
    + ["Concat"]
    + ["Reshape", "MatMul"] * 3
    + ["Reshape", "DepthToSpace", "Add", RI, RO],
    "nchwc-conv-join": [RI, "Relu", "Conv", RO],
    "nchwc-activation-join": [RI, "Conv", RO],
    "nchwc-pool-join": [RI, "Relu", "MaxPool", RO],
    "nchwc-projection": ["Reshape", RI, "Conv", RO, "Reshape"],
    "nchwc-projection-reverse": ["Gemm"],
    "nchwc-projection-join": [RI, "Gelu", "Conv", RO],
    "nchwc-projection-join-reverse": [RI, RO, "Gelu", RI, "Conv", RO],
    "nchwc-projection-bias": [RI, "Conv", RO, "Reshape"],
}

NEGATIVE: dict[str, tuple[Callable[[], onnx.ModelProto], str | None]] = {}


def negative(name: str, reason: str | None):
    def register(build: Callable[[], onnx.ModelProto]) -> Callable[[], onnx.ModelProto]:
        NEGATIVE[name] = (build, reason)
        return build

    return register


B = example_block()


def _op(b: ModelBuilder, op: str, inputs: list[str], **attrs) -> str:
    return b.op(op, inputs, domain=NCHWC_DOMAIN, **attrs)


def _blocked_conv(b: ModelBuilder, x: str, **attrs) -> str:
    """A 1x1 nchwc Conv of a blocked tensor of B channels, to B channels."""
    weight = np.random.default_rng(0).standard_normal((B, B, 1, 1)).astype(np.float32)
    return blocked_conv(b, x, weight, ConvLayout(per_output=False, reorder_input=True), **attrs)


@negative("nchwc-conv", "nor in fours")
def _():
    b = ModelBuilder()
    return b.model(b.op("Conv", [b.input((1, B + 2, 5, 5)), b.const((8, B + 2, 3, 3))]))


@negative("nchwc-conv-merge-groups", "onnxruntime blocks this Conv as it is")
def _():
    b = ModelBuilder()  # two groups of a whole block each: nchwc-conv's site
    return b.model(b.op("Conv", [b.input((1, 2 * B, 5, 5)), b.const((2 * B, B, 3, 3))], group=2))


@negative("nchwc-conv-reverse", "reorder it out first")
def _():
    b = ModelBuilder()
    conv = _blocked_conv(b, b.op("Relu", [blocked_input(b, (1, B, 4, 4))]))
    return b.model(_op(b, RO, [conv], channels=B))


@negative("nchwc-conv-winograd", "not a constant float 3x3 filter")
def _():
    b = ModelBuilder()
    conv = _blocked_conv(b, blocked_input(b, (1, B, 4, 4)))
    return b.model(_op(b, RO, [conv], channels=B))


@negative("nchwc-conv-unblock", "reads NCHW")
def _():
    b = ModelBuilder()
    weight = np.random.default_rng(0).standard_normal((B, 3, 3, 3)).astype(np.float32)
    layout = ConvLayout(per_output=True, reorder_input=False)
    conv = blocked_conv(b, b.input((1, 3, 4, 4)), weight, layout, pads=[1] * 4)
    return b.model(_op(b, RO, [conv], channels=B))


@negative("nchwc-pool", "not whole blocks")
def _():
    b = ModelBuilder()
    return b.model(b.op("MaxPool", [b.input((1, 12, 6, 6))], kernel_shape=[2, 2]))


@negative("nchwc-pool-reverse", "drops or reorders channels")
def _():
    b = ModelBuilder()
    pooled = _op(b, "MaxPool", [blocked_input(b, (1, B, 6, 6))], kernel_shape=[2, 2])
    return b.model(_op(b, RO, [pooled], channels=B - 4))


@negative("nchwc-global-pool", "not whole blocks")
def _():
    b = ModelBuilder()
    nchw = _op(b, RO, [blocked_input(b, (1, 12, 3, 3))], channels=12)
    return b.model(b.op("GlobalAveragePool", [nchw]))


@negative("nchwc-global-pool-reverse", "not whole blocks")
def _():
    b = ModelBuilder()
    pooled = _op(b, "GlobalAveragePool", [blocked_input(b, (1, 12, 3, 3))])
    return b.model(_op(b, RO, [pooled], channels=12))


@negative("nchwc-batchnorm", "not a constant float vector")
def _():
    b = ModelBuilder()
    nchw = _op(b, RO, [blocked_input(b, (1, B, 3, 3))], channels=B)
    params = [b.input((B,)), *[b.const((B,)) for _ in range(2)], b.const(np.ones(B))]
    return b.model(b.op("BatchNormalization", [nchw, *params]))


@negative("nchwc-reorder-cancel", "needs the zeros")
def _():
    b = ModelBuilder()
    nchw = _op(b, RO, [blocked_input(b, (1, 12, 3, 3))], channels=12)
    joined = b.op("Concat", [_op(b, RI, [nchw]), blocked_input(b, (1, B, 3, 3))], axis=1)
    return b.model(_op(b, RO, [joined], channels=16 + B))


@negative("nchwc-reorder-cancel-reverse", None)
def _():
    b = ModelBuilder()
    return b.model(_op(b, RO, [b.op("Relu", [blocked_input(b, (1, B, 3, 3))])], channels=B))


@negative("nchwc-reorder-roundtrip", "another channel count")
def _():
    b = ModelBuilder()
    return b.model(b.op("Relu", [_op(b, RO, [blocked_input(b, (1, 12, 3, 3))], channels=16)]))


@negative("nchwc-reorder-share", None)
def _():
    b = ModelBuilder()
    blocked = blocked_input(b, (1, B, 3, 3))
    return b.model(_op(b, RO, [blocked], channels=B), _op(b, RO, [blocked], channels=B - 4))


@negative("nchwc-activation-move", "NHWC")
def _():
    b = ModelBuilder()
    nhwc = _op(b, RO, [blocked_input(b, (1, B, 3, 3))], channels=B, channels_last=1)
    return b.model(b.op("Relu", [nhwc]))


@negative("nchwc-activation-move-reverse", "NHWC")
def _():
    b = ModelBuilder()
    inner = b.op("Relu", [blocked_input(b, (1, B, 3, 3))])
    return b.model(_op(b, RO, [inner], channels=B, channels_last=1))


@negative("nchwc-binary-move", "broadcast")
def _():
    b = ModelBuilder()
    nchw = [
        _op(b, RO, [blocked_input(b, dims)], channels=B) for dims in ((1, B, 3, 3), (1, B, 1, 1))
    ]
    return b.model(b.op("Add", nchw))


@negative("nchwc-binary-move-reverse", "not blocked")
def _():
    b = ModelBuilder()
    mixed = b.op("Add", [blocked_input(b, (1, B, 3, 3)), b.input((1, B, 3, 3))])
    return b.model(_op(b, RO, [mixed], channels=B))


@negative("nchwc-concat-move", "drops padded channels")
def _():
    b = ModelBuilder()
    nchw = [_op(b, RO, [blocked_input(b, (1, c, 3, 3))], channels=c) for c in (12, B)]
    return b.model(b.op("Concat", nchw, axis=1))


@negative("nchwc-concat-move-reverse", "not blocked")
def _():
    b = ModelBuilder()
    joined = b.op("Concat", [blocked_input(b, (1, B, 3, 3)), b.input((1, B, 3, 3))], axis=1)
    return b.model(_op(b, RO, [joined], channels=2 * B))


@negative("nchwc-conv-sum-fusion", "applies Relu")
def _():
    b = ModelBuilder()
    conv = _blocked_conv(b, blocked_input(b, (1, B, 3, 3)), activation="Relu")
    added = b.op("Add", [conv, blocked_input(b, (1, B, 3, 3))])
    return b.model(_op(b, RO, [added], channels=B))


@negative("nchwc-conv-sum-fusion-reverse", "applies Relu")
def _():
    b = ModelBuilder()
    x, total = blocked_input(b, (1, B, 3, 3)), blocked_input(b, (1, B, 3, 3))
    weight = np.random.default_rng(0).standard_normal((B, B, 1, 1)).astype(np.float32)
    layout = ConvLayout(per_output=False, reorder_input=True)
    conv = blocked_conv(b, x, weight, layout, None, total, activation="Relu")
    return b.model(_op(b, RO, [conv], channels=B))


@negative("nchwc-conv-activation-fusion", "applies Tanh")
def _():
    b = ModelBuilder()
    conv = _blocked_conv(b, blocked_input(b, (1, B, 3, 3)), activation="Tanh")
    return b.model(_op(b, RO, [b.op("Relu", [conv])], channels=B))


@negative("nchwc-conv-activation-fusion-reverse", "applies Clip")
def _():
    b = ModelBuilder()
    conv = _blocked_conv(
        b, blocked_input(b, (1, B, 3, 3)), activation="Clip", activation_params=[0.0, 6.0]
    )
    return b.model(_op(b, RO, [conv], channels=B))


@negative("nchwc-conv-join", "would read NCHW directly")
def _():
    b = ModelBuilder()  # four input channels: nchwc-conv blocks it, reading NCHW
    nchw = _op(b, RO, [blocked_input(b, (1, 4, 4, 4))], channels=4)
    return b.model(b.op("Conv", [nchw, b.const((B, 4, 3, 3))], pads=[1] * 4))


@negative("nchwc-activation-join", "applies Tanh already")
def _():
    b = ModelBuilder()
    conv = _blocked_conv(b, blocked_input(b, (1, B, 3, 3)), activation="Tanh")
    return b.model(b.op("Relu", [_op(b, RO, [conv], channels=B)]))


@negative("nchwc-pool-join", "drops padded channels")
def _():
    b = ModelBuilder()  # B + 4 channels padded to 2B: the pool would pool the padding too
    nchw = _op(b, RO, [blocked_input(b, (1, 2 * B, 4, 4))], channels=B + 4)
    return b.model(b.op("MaxPool", [nchw], kernel_shape=[2, 2]))


@negative("nchwc-projection", "not in fours")
def _():
    b = ModelBuilder()
    return b.model(b.op("Gemm", [b.input((3, 6)), b.const((6, 8))]))


@negative("nchwc-projection-reverse", "channels-last in and out")
def _():
    b = ModelBuilder()  # the rows blocked as an NCHW image: not what the rule writes
    image = b.op("Reshape", [b.input((5, B)), b.const([1, B, 5, 1], np.int64)])
    conv = _blocked_conv(b, _op(b, RI, [image]))
    return b.model(b.op("Reshape", [_op(b, RO, [conv], channels=B), b.const([5, B], np.int64)]))


@negative("nchwc-projection-join", "not whole blocks")
def _():
    b = ModelBuilder()  # B + 4 channels between: the Gelu would compute on padded channels
    rows = _op(b, RI, [b.input((1, 5, 1, B + 4))], channels_last=1)
    rows = _op(b, RO, [rows], channels=B + 4, channels_last=1)
    again = _op(b, RI, [b.op("Gelu", [rows], domain="com.microsoft")], channels_last=1)
    return b.model(_op(b, RO, [again], channels=B + 4, channels_last=1))


@negative("nchwc-projection-join-reverse", "not the rows of a projection")
def _():
    b = ModelBuilder()  # a CNN's blocked activation (an image 4 x 4): left to the CNN rules
    return b.model(
        _op(b, RO, [_blocked_conv(b, b.op("Relu", [blocked_input(b, (1, B, 4, 4))]))], channels=B)
    )


@negative("nchwc-projection-bias", "an activation")
def _():
    b = ModelBuilder()  # the Conv applies a Relu before the Add: the bias cannot go inside it
    rows = _op(b, RI, [b.input((1, 5, 1, B))], channels_last=1)
    conv = _blocked_conv(b, rows, activation="Relu")
    rows = b.op(
        "Reshape", [_op(b, RO, [conv], channels=B, channels_last=1), b.const([1, 5, B], np.int64)]
    )
    return b.model(b.op("Add", [rows, b.const((B,))]))
