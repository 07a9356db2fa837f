"""A projection (Gemm, MatMul) run as a 1x1 Conv in onnxruntime's blocked NCHWc layout.

- Gemm(x, w, c?) / Add(MatMul(x, w), c) / MatMul(x, w), w a constant matrix ->
  Reshape(ReorderOutput(nchwc.Conv(ReorderInput(Reshape(x, [1, m, 1, k])), w', c'),
  channels_last), [..., n])                                                          and back

At full size the transformers' time is their projections, which onnxruntime runs with MLAS's
SGEMM at 73-88% of the core's peak, where its NCHWc Conv kernels run the CNNs' Convs at 94-97%
(docs/BENCHMARKS.md, "What is left at full size"). A projection of m rows is a 1x1 Conv over
an image of m pixels with k channels, and the activations' row-major layout is already that
image channels-last: `ReorderInput(channels_last=1)` blocks it with no Transpose, and
`ReorderOutput(channels_last=1)` writes the result back row-major. Timed alone
(`scripts/probe_gemm_layouts.py`), the blocked form runs BERT's full-size projections 8-10%
faster and the feed-forward down-projections (k = 2048-4096) of every transformer 5-9% faster,
and loses 1-5% where k is 512-768: a site-by-site choice, so a rule rather than a pass.

The image is m x 1 (`H = m`), which measured a little faster than 1 x m. The filter is the
weight transposed into OIHWBiBo, input channels padded to whole blocks (k must come in fours,
ReorderInput's unit), the bias padded; ReorderOutput drops the padded output channels.
The reverse restores the weight and writes a Gemm for a matrix input, else MatMul and Add.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from rlflow.cost import nchwc_block_size
from rlflow.graph import Graph
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, Replacement, both_ways
from rlflow.rewrite.rules.common import pick, shape, shape_const
from rlflow.rewrite.rules.nchwc_format import pad_channels, padded, reorder_filter, restore_filter
from rlflow.rewrite.rules.nchwc_layout import (
    NCHWC,
    N,
    NchwcPatternRule,
    example_block,
    float_tensor,
    typed,
)

_FORWARD = ("y=Gemm(x, w, c?)", "Add(y=MatMul(x, w), c)", "y=MatMul(x, w)")
_REVERSE = f"Reshape(o={N}ReorderOutput(v={N}Conv(i={N}ReorderInput(Reshape(x, s1)), w, c?)), s2)"
_CONV_DEFAULTS = {"group": 1, "strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0]}


def _matrix_weight(graph: Graph, match: Match) -> np.ndarray | None:
    """The projection's (k, n) weight, if it is a float constant matrix (transposed if the
    Gemm says so)."""
    weight = graph.constant(match["w"])
    if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
        return None
    return weight.T if match.node("y").attr("transB", 0) else weight


def _bias(graph: Graph, match: Match, n: int) -> np.ndarray | None | str:
    """The bias as a vector of n (None: no bias), or why it cannot be the Conv's."""
    name = match.bindings.get("c", "")  # the plain MatMul's pattern has no bias
    if not name:
        return None
    bias = graph.constant(name)
    if bias is None or bias.dtype != np.float32:
        return "the bias is not a float constant"
    if bias.size != n or bias.shape[-1:] != (n,):
        return "the bias is not a vector over the projection's outputs"
    return bias.reshape(n)


def _forward_reason(graph: Graph, match: Match) -> str | None:
    x, y = match["x"], match.node("y")
    if not float_tensor(graph, x):
        return "the input is not float32"
    weight = _matrix_weight(graph, match)
    if weight is None:
        return "the weight is not a float32 constant matrix"
    dims = shape(graph, x)
    if len(dims) < 2 or dims[-1] != weight.shape[0]:
        return "the input is not rows of the weight's inputs"
    if dims[-1] % 4:
        return f"{dims[-1]} inputs are not in fours (ReorderInput's unit)"
    if y.op_type == "Gemm":
        if y.attr("transA", 0) or y.attr("alpha", 1.0) != 1.0 or y.attr("beta", 1.0) != 1.0:
            return "the Gemm transposes its input or scales"
    bias = _bias(graph, match, weight.shape[1])
    if isinstance(bias, str):
        return bias
    if shape(graph, match.outputs[0]) != (*dims[:-1], weight.shape[1]):
        return "the bias broadcasts the result to another shape"
    return None


def _reverse_reason(graph: Graph, match: Match, block: int) -> str | None:
    into, out, conv = match.node("i"), match.node("o"), match.node("v")
    if into.attr("channels_last", 0) != 1 or out.attr("channels_last", 0) != 1:
        return "not a projection's reorders (channels-last in and out)"
    attrs = {key: conv.attr(key, value) for key, value in _CONV_DEFAULTS.items()}
    if attrs != _CONV_DEFAULTS or conv.attr("activation") or len(conv.inputs) > 3:
        return "the Conv does more than a projection"
    if match["c"] and graph.constant(match["c"]) is None:
        return "the bias is not a constant"
    weight = graph.constant(match["w"])
    image, rows = shape(graph, into.inputs[0]), shape(graph, match["x"])
    if weight is None or weight.shape[2:] != (1, 1) or len(image) != 4 or image[2] != 1:
        return "not a 1x1 Conv over an m x 1 image"
    m, k = image[1], image[3]
    if rows[-1] != k or math.prod(rows[:-1]) != m or weight.shape[1] != padded(k, block):
        return "the image is not the input's rows"
    n = out.attr("channels")
    if weight.shape[0] != padded(n, block) or shape(graph, match.outputs[0])[-1:] != (n,):
        return "the result is not the Conv's channels"
    return None


class ProjectionToNchwc(NchwcPatternRule):
    """A projection with a constant weight into the blocked layout as a 1x1 Conv, its rows
    the pixels of a channels-last image (module docstring: why it can pay)."""

    name = "nchwc-projection"
    description = (
        "Gemm(x, w, c) -> Reshape(ReorderOutput(nchwc.Conv(ReorderInput(Reshape(x, [1, m, 1, k])),"
        " w', c'), channels_last), [m, n])  (also MatMul and Add; w' blocked, c' padded)"
    )
    reverse_description = (
        "Reshape(ReorderOutput(nchwc.Conv(ReorderInput(Reshape(x)), w', c'))) -> Gemm(x, w, c)"
        "  (MatMul and Add for an input that is not a matrix)"
    )
    pattern = _FORWARD
    reverse_pattern = _REVERSE
    target_ops = {"Reshape": 2, "ReorderInput": 1, "Conv": 1, "ReorderOutput": 1}
    settings = 4

    def __init__(self, reverse: bool = False) -> None:
        super().__init__(reverse)
        self.portable = reverse  # the reverse writes standard operators only

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if self.reverse:
            return _reverse_reason(graph, match, block)
        return _forward_reason(graph, match)

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        block = nchwc_block_size()
        emit = Emitter(graph)
        if self.reverse:
            return emit.result(_unblocked(emit, graph, match, block))
        weight = _matrix_weight(graph, match)
        (k, n), dims = weight.shape, shape(graph, match["x"])
        m = math.prod(dims[:-1])
        bias = _bias(graph, match, n)
        image = emit.op("Reshape", [match["x"], shape_const(emit, [1, m, 1, k])])
        blocked = emit.op("ReorderInput", [image], domain=NCHWC, channels_last=1)
        dtype = graph.value(match["x"]).dtype
        typed(emit, blocked, (1, padded(k, block), m, 1), dtype)
        filters = reorder_filter(weight.T.reshape(n, k, 1, 1), block, per_output=False)
        inputs = [blocked, emit.const(filters, "weight")]
        if bias is not None:
            inputs.append(emit.const(pad_channels(bias, block), "bias"))
        product = emit.op("Conv", inputs, domain=NCHWC, kernel_shape=[1, 1])
        typed(emit, product, (1, padded(n, block), m, 1), dtype)
        rows = emit.op("ReorderOutput", [product], domain=NCHWC, channels=n, channels_last=1)
        typed(emit, rows, (1, m, 1, n), dtype)
        out = shape(graph, match.outputs[0])
        return emit.result(emit.op("Reshape", [rows, shape_const(emit, list(out))]))

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        # input shape, outputs, form (gemm, gemm-transposed, matmul+add, matmul)
        dims, n, form = pick(
            setting,
            [
                ((5, block + 4), block - 3, "gemm"),  # both channel counts padded
                ((1, 6, 2 * block), block, "matmul+add"),
                ((2, 3, 8), 2 * block + 1, "matmul"),
                ((7, block), 3, "gemm-transposed"),
            ],
        )
        k = dims[-1]
        rng = np.random.default_rng(setting)
        weight = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        b = ModelBuilder()
        x = b.input(dims)
        if self.reverse:
            m = math.prod(dims[:-1])
            image = b.op("Reshape", [x, b.const([1, m, 1, k], np.int64)])
            blocked = b.op("ReorderInput", [image], domain=NCHWC, channels_last=1)
            filters = reorder_filter(weight.T.reshape(n, k, 1, 1), block, per_output=False)
            inputs = [blocked, b.const(filters)]
            if form != "matmul":
                inputs.append(b.const(pad_channels(bias, block)))
            product = b.op("Conv", inputs, domain=NCHWC, kernel_shape=[1, 1])
            rows = b.op("ReorderOutput", [product], domain=NCHWC, channels=n, channels_last=1)
            return b.model(b.op("Reshape", [rows, b.const([*dims[:-1], n], np.int64)]))
        if form == "gemm":
            return b.model(b.op("Gemm", [x, b.const(weight), b.const(bias)]))
        if form == "gemm-transposed":
            return b.model(b.op("Gemm", [x, b.const(weight.T.copy()), b.const(bias)], transB=1))
        product = b.op("MatMul", [x, b.const(weight)])
        return b.model(b.op("Add", [product, b.const(bias)]) if form == "matmul+add" else product)


def _unblocked(emit: Emitter, graph: Graph, match: Match, block: int) -> str:
    """The projection the blocked Conv stands for: Gemm on a matrix input, else MatMul (and
    Add), reshaped to the result's shape if the rows were given another."""
    x = match["x"]
    rows, out = shape(graph, x), shape(graph, match.outputs[0])
    n, k = match.node("o").attr("channels"), rows[-1]
    weight = restore_filter(graph.constant(match["w"]), block, False, n, k)[:, :, 0, 0].T
    inputs = [x, emit.const(np.ascontiguousarray(weight), "weight")]
    bias = graph.constant(match["c"]) if match["c"] else None  # bound, maybe "", in the reverse
    if bias is not None:
        inputs.append(emit.const(bias[:n], "bias"))
    if len(rows) == 2:
        product = emit.op("Gemm", inputs)
    else:
        product = emit.op("MatMul", inputs[:2])
        if bias is not None:
            product = emit.op("Add", [product, inputs[2]])
    if (*rows[:-1], n) != out:
        product = emit.op("Reshape", [product, shape_const(emit, list(out))])
    return product


RULES = both_ways(ProjectionToNchwc)
