"""Winograd's minimal filtering for 3x3 convolutions, F(2x2, 3x3), written in plain ONNX ops.

- Conv / FusedConv(x, w, b) 3x3, stride 1, group 1 ->
  DepthToSpace(A . (U (x) (B . tiles(Pad(x))))) + b        (then the FusedConv's activation)
- nchwc.Conv(x, w, b, s?) 3x3, stride 1, group 1, x blocked ->
  ReorderInput(Winograd(ReorderOutput(x))) + s             (then the Conv's activation)

A direct 3x3 convolution spends 9 multiply-adds per output and input channel; Winograd's
F(2x2, 3x3) computes each 2x2 block of outputs from a 4x4 tile of inputs with 16: 2.25x fewer.
Written as a graph, every piece is an operator onnxruntime already runs well:

- tiles: the padded input through SpaceToDepth(2) and four shifted Slices, concatenated, so
  that the 16 elements of every 4x4 tile (overlapping by 2) lie along the first axis;
- B . d: the input transform, one MatMul with a constant 16x16 matrix (B^T d B of every tile);
- U (x) V: the work, one batched MatMul, per transform element a [Co, C] x [C, tiles] product
  with U = G w G^T precomputed from the constant weights;
- A . m: the output transform, a MatMul with a constant 4x16 matrix (A^T m A), and
  DepthToSpace(2) puts each tile's 2x2 outputs in place; a Slice crops an odd height or width.

Whether it pays is a matter of the machine and the shapes, which is why it is a rule the search
decides on site by site rather than a pass. On this project's CPU (AVX-512, one thread) it does
not pay against onnxruntime's blocked NCHWc Convs: on full ResNet-18 each site alone, with its
two reorders, is priced at 0.976-1.006x by the per-op model and measures 0.965-1.001x end to
end (docs/BENCHMARKS.md, "Winograd"). Inside onnxruntime's blocked graphs,
where a Conv reads and writes blocked tensors, the second rule takes one Conv out of the layout
and into Winograd form in one step, the two reorders included (`nchwc-reorder-cancel` removes
them between two such Convs); the filter is restored from its blocked format with the padded
channels (zero weights: whatever a blocked tensor holds there is multiplied by zero). Both are
CPU-only: on a GPU cuDNN picks its own Winograd kernels for a plain Conv.

Numerically it is not the same sum: the transforms add and subtract inputs before the products
(F(2x2, 3x3) has the smallest such error; outputs agree to about 1e-6 relative in float32), so
a model's equivalence check, at its usual tolerance, passes.

There is no reverse rule: the rewritten graph is a dozen operators whose pattern a search would
only ever undo to return to a graph it has already costed.
"""

from __future__ import annotations

import numpy as np
import onnx

from rlflow.graph import MS_DOMAIN, Graph, Value
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement
from rlflow.rewrite.rules.common import opset, pick, shape, shape_const
from rlflow.rewrite.rules.nchwc_format import ConvLayout
from rlflow.rewrite.rules.nchwc_layout import (
    NCHWC,
    N,
    NchwcPatternRule,
    activation_reason,
    blocked_conv,
    blocked_input,
    conv_out_of_layout,
    emit_activation,
    example_block,
    out_of_layout_reason,
)

_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


def input_transform() -> np.ndarray:
    """16x16: from a tile's elements in the order the tiles are gathered -- (row shift a, column
    shift b, row phase i, column phase j), the element at row 2a+i, column 2b+j -- to
    B^T d B, row-major."""
    matrix = np.zeros((16, 16))
    for r, s, a, b, i, j in np.ndindex(4, 4, 2, 2, 2, 2):
        matrix[r * 4 + s, ((a * 2 + b) * 2 + i) * 2 + j] = _BT[r, 2 * a + i] * _BT[s, 2 * b + j]
    return matrix.astype(np.float32)


def output_transform() -> np.ndarray:
    """4x16: A^T m A, row-major, the 2x2 outputs in DepthToSpace's (DCR) order."""
    matrix = np.zeros((4, 16))
    for i, j, r, s in np.ndindex(2, 2, 4, 4):
        matrix[i * 2 + j, r * 4 + s] = _AT[i, r] * _AT[j, s]
    return matrix.astype(np.float32)


def filter_transform(weight: np.ndarray) -> np.ndarray:
    """[16, Co, C]: G w G^T of every filter, per transform element (row-major)."""
    transformed = np.einsum("ik,ockl,jl->ijoc", _G, weight.astype(np.float64), _G)
    return transformed.reshape(16, *weight.shape[:2]).astype(np.float32)


def out_size(x: tuple[int, ...], pads: list[int]) -> tuple[int, int]:
    """A 3x3, stride-1 convolution's output height and width."""
    top, left, bottom, right = pads
    return x[2] + top + bottom - 2, x[3] + left + right - 2


def conv_reason(graph: Graph, match: Match) -> str | None:
    """Why the matched Conv `y` of `x` by `w` (+ `b`) is no Winograd site (None: it is one);
    `w` is OIHW or blocked: only its shape counts."""
    conv = match.node("y")
    if opset(graph) < 11:
        return "Pad and Slice take their parameters as inputs from opset 11"
    weight = graph.constant(match["w"])
    if weight is None or weight.dtype != np.float32 or weight.shape[2:] != (3, 3):
        return "not a constant float 3x3 filter"
    if match["b"] and graph.constant(match["b"]) is None:
        return "the bias is not a constant"
    dims = shape(graph, match["x"])
    if len(dims) != 4 or dims[0] != 1 or any(not isinstance(d, int) or d < 1 for d in dims):
        return "Winograd tiles one 2-D image of known shape (batch 1)"
    if conv.attr("group", 1) != 1:
        return "grouped convolution"
    if any(step != 1 for step in conv.attr("strides", [1, 1])):
        return "strided convolution"
    if any(step != 1 for step in conv.attr("dilations", [1, 1])):
        return "dilated convolution"
    if conv.attr("auto_pad", "NOTSET") != "NOTSET":
        return "auto_pad"
    if min(out_size(dims, conv.attr("pads", [0, 0, 0, 0]))) < 1:
        return "no output"
    return None


def emit_winograd(
    emit: Emitter,
    x: str,
    dims: tuple[int, ...],
    weight: np.ndarray,
    bias: np.ndarray | None,
    pads: list[int],
) -> str:
    """The operators of F(2x2, 3x3) for the 3x3 convolution of `x` (NCHW, shape `dims`) by the
    OIHW `weight`, plus `bias`; returns the output's name (NCHW)."""
    out_channels, channels = weight.shape[:2]
    height, width = out_size(dims, pads)
    rows, cols = (height + 1) // 2, (width + 1) // 2  # tiles
    top, left = pads[:2]
    # Padded to whole tiles: 2 * tiles + 2 rows and columns (never less than the Conv's own).
    bottom, right = 2 * rows + 2 - dims[2] - top, 2 * cols + 2 - dims[3] - left
    padded = emit.op("Pad", [x, shape_const(emit, [0, 0, top, left, 0, 0, bottom, right])])
    blocks = emit.op("SpaceToDepth", [padded], blocksize=2)  # [1, 4C, rows+1, cols+1]
    axes = [2, 3]
    shifted = [
        emit.op(
            "Slice",
            [
                blocks,
                shape_const(emit, [a, b]),
                shape_const(emit, [a + rows, b + cols]),
                shape_const(emit, axes),
            ],
        )
        for a in (0, 1)
        for b in (0, 1)
    ]
    tiles = emit.op("Concat", shifted, axis=0)  # [4, 4C, rows, cols]: (a, b, i, j, c)
    flat = emit.op("Reshape", [tiles, shape_const(emit, [16, -1])])
    transformed = emit.op("MatMul", [emit.const(input_transform(), "winograd_b"), flat])
    per_element = emit.op("Reshape", [transformed, shape_const(emit, [16, channels, rows * cols])])
    filters = emit.const(filter_transform(weight), "winograd_u")
    products = emit.op("MatMul", [filters, per_element])  # [16, Co, tiles]
    products = emit.op("Reshape", [products, shape_const(emit, [16, -1])])
    outputs = emit.op("MatMul", [emit.const(output_transform(), "winograd_a"), products])
    outputs = emit.op("Reshape", [outputs, shape_const(emit, [1, 4 * out_channels, rows, cols])])
    y = emit.op("DepthToSpace", [outputs], blocksize=2, mode="DCR")
    if (2 * rows, 2 * cols) != (height, width):
        ends = shape_const(emit, [height, width])
        y = emit.op("Slice", [y, shape_const(emit, [0, 0]), ends, shape_const(emit, axes)])
    if bias is not None:
        y = emit.op("Add", [y, emit.const(bias.reshape(1, out_channels, 1, 1), "bias")])
    return y


class ConvToWinograd(PatternRule):
    name = "conv-winograd"
    description = (
        "Conv(x, w, b) 3x3 -> DepthToSpace(A . (U (x) (B . tiles(Pad(x))))) + b"
        "  (Winograd F(2x2, 3x3); a FusedConv's activation after)"
    )
    pattern = ("y=Conv(x, w, b?)", "y=com.microsoft.FusedConv(x, w, b?)")
    target_ops = {"MatMul": 3, "DepthToSpace": 1}
    settings = 4
    cpu_only = True

    def check(self, graph: Graph, match: Match) -> str | None:
        conv = match.node("y")
        if conv.domain == MS_DOMAIN:
            if len(conv.inputs) > 3:
                return "the FusedConv adds a sum input"
            if (reason := activation_reason(conv)) is not None:
                return reason
        return conv_reason(graph, match)

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        conv = match.node("y")
        emit = Emitter(graph)
        bias = graph.constant(match["b"]) if match["b"] else None
        dims = shape(graph, match["x"])
        pads = conv.attr("pads", [0, 0, 0, 0])
        y = emit_winograd(emit, match["x"], dims, graph.constant(match["w"]), bias, pads)
        if conv.domain == MS_DOMAIN:
            y = emit_activation(emit, conv, y)
        return emit.result(y)

    def example(self, setting: int) -> onnx.ModelProto:
        # input channels, output channels, height, width, pads, bias, FusedConv activation
        cin, cout, h, w, pads, with_bias, fused = pick(
            setting,
            [
                (8, 12, 6, 6, [1, 1, 1, 1], True, None),
                (5, 4, 7, 9, [1, 1, 1, 1], False, None),  # odd sizes: cropped
                (6, 6, 8, 5, [0, 2, 1, 0], True, ("Relu", [])),  # uneven pads, FusedConv
                (4, 8, 5, 5, [0, 0, 0, 0], True, ("LeakyRelu", [0.1])),
            ],
        )
        b = ModelBuilder()
        x = b.input((1, cin, h, w))
        inputs = [x, b.const((cout, cin, 3, 3))] + ([b.const((cout,))] if with_bias else [])
        if fused:
            attrs = {"activation": fused[0]}
            if fused[1]:
                attrs["activation_params"] = fused[1]
            return b.model(b.op("FusedConv", inputs, domain=MS_DOMAIN, pads=pads, **attrs))
        return b.model(b.op("Conv", inputs, pads=pads))


class BlockedConvToWinograd(NchwcPatternRule):
    """A blocked Conv out of onnxruntime's layout and into Winograd form, in one step."""

    name = "nchwc-conv-winograd"
    description = (
        "nchwc.Conv(x, w, b, s?) 3x3 -> ReorderInput(Winograd(ReorderOutput(x))) + s"
        "  (x blocked; the Conv's activation after)"
    )
    pattern = f"y={N}Conv(x, w, b?, s?)"
    target_ops = {"ReorderOutput": 1, "MatMul": 3, "ReorderInput": 1}
    settings = 4

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        return out_of_layout_reason(graph, match) or conv_reason(graph, match)

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        bias = graph.constant(match["b"]) if match["b"] else None
        pads = match.node("y").attr("pads", [0, 0, 0, 0])

        def winograd(emit: Emitter, x: Value, weight: np.ndarray, fuse: bool) -> str:
            return emit_winograd(emit, x.name, x.shape, weight, bias, pads)

        return conv_out_of_layout(graph, match, winograd, fuse_activation=False)

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        # input channels, output channels, size, activation, Sum input
        cin, cout, size, activation, with_sum = pick(
            setting,
            [
                (block, block, 6, None, False),
                (2 * block, block, 7, ("Relu", []), False),  # odd size: cropped
                (block, 2 * block, 6, None, True),
                (block + 4, block, 5, ("LeakyRelu", [0.1]), True),  # padded input channels
            ],
        )
        b = ModelBuilder()
        rng = np.random.default_rng(setting)
        weight = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
        bias = rng.standard_normal(cout).astype(np.float32)
        source = b.op("ReorderInput", [b.input((1, cin, size, size))], domain=NCHWC)
        total = blocked_input(b, (1, cout, size, size)) if with_sum else None
        attrs: dict[str, object] = {"pads": [1] * 4}
        if activation:
            attrs["activation"] = activation[0]
            if activation[1]:
                attrs["activation_params"] = activation[1]
        layout = ConvLayout(per_output=False, reorder_input=True)
        conv = blocked_conv(b, source, weight, layout, bias, total, **attrs)
        return b.model(b.op("ReorderOutput", [conv], domain=NCHWC, channels=cout))


RULES = [ConvToWinograd(), BlockedConvToWinograd()]
