"""Analytic cost: FLOPs and bytes moved per operator, and the roofline time they imply.

This is the physical floor reported beside measured latency, and the cheap cost model the
environment calls at every step on graphs of ~1000 nodes. So the cost of a node is a pure
function of its signature (operator, shapes, dtypes and the few attributes that matter),
memoised; a graph's cost is the sum over its nodes.

Roofline time of a node = max(flops / peak FLOP/s, bytes / peak bandwidth), with the peaks of
this machine measured once through onnxruntime (see peaks.py); an operator whose bytes fit in
the last-level cache is charged the in-cache bandwidth, others DRAM bandwidth. Operators
that only relabel a buffer (Reshape, Squeeze, Identity, ...) cost nothing: an executor can
alias them; pure data movement (Transpose, Concat, ReorderInput, ...) moves its inputs and
outputs once and does no arithmetic.

onnxruntime's own operators, which its optimised graphs hold and offline mode runs as written,
share the formula of the operator they generalise, so formulas go by operator type, whatever
the domain: FusedConv and the nchwc Conv are a Conv plus their fused activation and optional
Sum input (an nchwc Conv's shapes are its blocked ones, channels padded to the block, so the
padding's work is counted as the kernel does it); FusedMatMul a MatMul with its transposes and
scale; the nchwc pools the pools; SkipLayerNormalization a LayerNormalization of a sum;
Attention its Q, K, V projection, the heads' two products and their Softmax.

An operator with no formula (`has_formula` says which) is priced as data movement and named in
`AnalyticReport.unmodelled`, so that a gap in the formulas shows rather than hides.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from onnx import helper

from rlflow.cost.peaks import MachinePeaks, machine_peaks
from rlflow.cost.session import OrtSettings
from rlflow.cost.source import ModelLike
from rlflow.graph import Graph, Node, load_model

Shape = tuple[int, ...]
Tensor = tuple[Shape, int] | None  # (shape, ONNX element type), None for an absent input


@dataclass(frozen=True)
class OpCost:
    """Arithmetic and memory traffic of one node."""

    flops: float
    bytes: float


@dataclass(frozen=True)
class AnalyticReport:
    """A graph's analytic cost: totals, roofline floor and its split by operator type."""

    flops: float
    bytes: float
    floor_ms: float
    ms_by_op: dict[str, float]
    unmodelled: dict[str, int] = field(default_factory=dict)
    """Nodes per operator type that no formula covers (priced as data movement)."""


# fmt: off
# Arithmetic per output element of elementwise operators (rough counts: a transcendental is a
# few FLOPs). They are memory-bound at these intensities, so the counts rarely decide a time.
_UNARY_FLOPS = {
    "Relu": 1, "Neg": 1, "Abs": 1, "Sqrt": 1, "Reciprocal": 1, "Floor": 1, "Ceil": 1,
    "Round": 1, "Sign": 1, "Not": 1, "IsNaN": 1, "IsInf": 1, "Cast": 1, "CastLike": 1,
    "LeakyRelu": 2, "Clip": 2, "PRelu": 2, "ThresholdedRelu": 1, "HardSigmoid": 3,
    "HardSwish": 4, "Sigmoid": 4, "Exp": 4, "Log": 4, "Elu": 4, "Selu": 4, "Celu": 4,
    "Softplus": 5, "Softsign": 3, "Tanh": 5, "Erf": 5, "Sin": 5, "Cos": 5, "Tan": 5,
    "Atan": 5, "Asin": 5, "Acos": 5, "Sinh": 5, "Cosh": 5, "Mish": 10, "QuickGelu": 6,
}
# GELU per element: x/2 * (1 + erf(x / sqrt 2)), or its tanh form (FastGelu, Gelu with
# approximate="tanh") x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
_GELU_FLOPS = {"none": 9, "tanh": 12}
_BINARY_FLOPS = {
    "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Max": 1, "Min": 1, "Sum": 1, "Mean": 1,
    "Equal": 1, "Less": 1, "LessOrEqual": 1, "Greater": 1, "GreaterOrEqual": 1, "And": 1,
    "Or": 1, "Xor": 1, "Where": 1, "BitShift": 1, "Mod": 2, "Pow": 5,
}
_VARIADIC = frozenset({"Sum", "Mean", "Max", "Min"})
_NORM_FLOPS = {  # per element: statistics, normalise, scale and shift
    "BatchNormalization": 2, "LayerNormalization": 8, "SimplifiedLayerNormalization": 6,
    "InstanceNormalization": 8, "GroupNormalization": 8,
    "LpNormalization": 3, "MeanVarianceNormalization": 8, "LRN": 8,
    "Softmax": 5, "LogSoftmax": 6, "Hardmax": 2,
}
_REDUCE_FLOPS = {  # per input element
    "ReduceMean": 1, "ReduceSum": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceProd": 1,
    "ReduceL1": 2, "ReduceL2": 2, "ReduceSumSquare": 2, "ReduceLogSum": 1,
    "ReduceLogSumExp": 5, "GlobalAveragePool": 1, "GlobalMaxPool": 1, "GlobalLpPool": 2,
    "ArgMax": 1, "ArgMin": 1, "TopK": 2, "CumSum": 1,
}
# Operators that relabel their input's buffer: onnxruntime runs them in place inside a graph.
ALIASES = frozenset({
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Shape", "Size",
    "Constant", "Optional", "OptionalGetElement",
})
# Operators that read only as much input as they write: the rest of the input is untouched.
_PARTIAL_READS = frozenset({"Slice", "Gather", "GatherElements", "GatherND", "Compress"})
# Operators that only move data: no arithmetic, their inputs read and outputs written once
# (ReorderInput/ReorderOutput convert to and from the NCHWc blocked layout; a ReorderOutput
# reads whole blocks, padding included, since a block of one pixel shares its cache lines).
_DATA_MOVEMENT = _PARTIAL_READS | {
    "Transpose", "Concat", "Split", "Pad", "Tile", "Expand", "DepthToSpace", "SpaceToDepth",
    "ReorderInput", "ReorderOutput", "ScatterND", "ScatterElements",
}
# Attributes a node's cost depends on beyond its shapes, per operator type. A Conv's
# `activation` is the nchwc Conv's fused one (a standard Conv has none).
_COST_ATTRS = {
    "MaxPool": ("kernel_shape",), "AveragePool": ("kernel_shape",), "LpPool": ("kernel_shape",),
    "Gemm": ("transA", "alpha", "beta"), "FusedGemm": ("transA", "alpha", "beta", "activation"),
    "FusedMatMul": ("transA", "transBatchA", "alpha"), "Conv": ("activation",),
    "FusedConv": ("activation",), "Gelu": ("approximate",), "Einsum": ("equation",),
    "Attention": ("num_heads",),
}
# fmt: on


def _numel(shape: Shape) -> int:
    return math.prod(shape)


@functools.cache
def _itemsize(dtype: int) -> int:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).itemsize
    except (KeyError, TypeError, ValueError):  # strings, 4-bit types: count a byte
        return 1


def _nbytes(tensors: tuple[Tensor, ...]) -> int:
    return sum(_numel(t[0]) * _itemsize(t[1]) for t in tensors if t is not None)


def _present(ins: tuple[Tensor, ...], slot: int) -> bool:
    return len(ins) > slot and ins[slot] is not None


def _scales(factor: object) -> bool:
    """Whether an alpha or beta attribute multiplies (absent means 1)."""
    return factor is not None and factor != 1.0


def _activation(outs: tuple[Tensor, ...], attrs: dict) -> float:
    """The fused activation of a FusedConv, nchwc Conv or FusedGemm, over its output (an
    activation we have no count for is charged one FLOP an element)."""
    name = attrs.get("activation")
    return _UNARY_FLOPS.get(name, 1) * _numel(outs[0][0]) if name else 0.0


def _matmul(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    # K is A's last dim, or with FusedMatMul's transA the one it is swapped with: the second
    # to last, or with transBatchA (A's first dim moved behind its batch dims) the first.
    a_shape = ins[0][0]
    if not a_shape:
        k = 1
    elif not attrs.get("transA"):
        k = a_shape[-1]
    else:
        k = a_shape[0] if attrs.get("transBatchA") else a_shape[-2]
    out = _numel(outs[0][0])
    return 2.0 * out * k + (out if _scales(attrs.get("alpha")) else 0)


def _gemm(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    a_shape = ins[0][0]
    k = a_shape[0] if attrs.get("transA") else a_shape[-1]
    out = _numel(outs[0][0])
    scale = out if _scales(attrs.get("alpha")) else 0
    bias = out * (1 + _scales(attrs.get("beta"))) if _present(ins, 2) else 0
    return 2.0 * out * k + scale + bias + _activation(outs, attrs)


def _conv(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    # W is (M, C/group, k...): each output element is a dot product over C/group * k... taps,
    # so grouped and depthwise convolutions need no special case. A fourth input is the Sum
    # (nchwc Conv) or Z (FusedConv) added to the result, e.g. a residual.
    out = _numel(outs[0][0])
    taps = _numel(ins[1][0][1:])
    added = out * (_present(ins, 2) + _present(ins, 3))
    return 2.0 * out * taps + added + _activation(outs, attrs)


def _conv_transpose(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    # W is (C, M/group, k...): every input element scatters into M/group * k... outputs.
    bias = _numel(outs[0][0]) if _present(ins, 2) else 0
    return 2.0 * _numel(ins[0][0]) * _numel(ins[1][0][1:]) + bias


def _pool(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    kernel = attrs.get("kernel_shape") or ()
    return float(_numel(outs[0][0]) * _numel(tuple(kernel)))


def _gelu(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    # Gelu (com.microsoft's, or ONNX's with `approximate`) and BiasGelu, whose second input is
    # a bias added first.
    per_element = _GELU_FLOPS[attrs.get("approximate") or "none"] + _present(ins, 1)
    return float(per_element * _numel(outs[0][0]))


def _fast_gelu(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    return float((_GELU_FLOPS["tanh"] + _present(ins, 1)) * _numel(outs[0][0]))


def _skip_layer_norm(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    # LayerNormalization of input + skip (+ bias, the optional fifth input).
    per_element = _NORM_FLOPS["LayerNormalization"] + 1 + _present(ins, 4)
    return float(per_element * _numel(ins[0][0]))


def _attention(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    # onnxruntime's fused self-attention: x (B, S, E) times the (E, 3 * hidden) Q, K, V
    # weights plus bias, then per head Q K^T, a Softmax over (S, S) and the product with V.
    batch, seq, embed = ins[0][0]
    width = ins[1][0][-1]
    hidden = width // 3
    heads = attrs.get("num_heads") or 1
    projection = 2.0 * batch * seq * embed * width + batch * seq * width
    products = 2 * 2.0 * batch * seq * seq * hidden
    return projection + products + _NORM_FLOPS["Softmax"] * batch * heads * seq * seq


def _einsum(ins: tuple[Tensor, ...], outs: tuple[Tensor, ...], attrs: dict) -> float:
    # Every combination of the distinct index letters is one multiply-add.
    equation = (attrs.get("equation") or "").replace(" ", "")
    operands = equation.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for letters, tensor in zip(operands, ins, strict=False):
        if tensor is None or "..." in letters or len(letters) != len(tensor[0]):
            return float(_numel(outs[0][0]))  # broadcast dims: too rare here to model
        sizes.update(zip(letters, tensor[0], strict=True))
    return 2.0 * math.prod(sizes.values())


# fmt: off
_FLOP_FORMULAS: dict[str, Callable[[tuple[Tensor, ...], tuple[Tensor, ...], dict], float]] = {
    "MatMul": _matmul, "MatMulInteger": _matmul, "FusedMatMul": _matmul, "Gemm": _gemm,
    "FusedGemm": _gemm, "Conv": _conv, "ConvInteger": _conv, "FusedConv": _conv,
    "ConvTranspose": _conv_transpose, "MaxPool": _pool, "AveragePool": _pool, "LpPool": _pool,
    "Einsum": _einsum, "Gelu": _gelu, "BiasGelu": _gelu, "FastGelu": _fast_gelu,
    "SkipLayerNormalization": _skip_layer_norm, "Attention": _attention,
}
# fmt: on


_MODELLED = frozenset().union(
    ALIASES,
    _DATA_MOVEMENT,
    _FLOP_FORMULAS,
    _UNARY_FLOPS,
    _BINARY_FLOPS,
    _NORM_FLOPS,
    _REDUCE_FLOPS,
)


def has_formula(op_type: str) -> bool:
    """Whether `op_type` is priced by a formula of its own (data movement and aliases count),
    rather than by the generic fallback for operators we know nothing about."""
    return op_type in _MODELLED


@functools.lru_cache(maxsize=65536)
def op_cost(
    op_type: str,
    inputs: tuple[Tensor, ...],
    outputs: tuple[Tensor, ...],
    attrs: tuple[tuple[str, object], ...] = (),
) -> OpCost:
    """FLOPs and bytes of one operator from its signature (a pure function, memoised).

    Args:
        op_type: the ONNX operator type.
        inputs: (shape, ONNX element type) per input, None for an absent optional one.
        outputs: the same for the outputs.
        attrs: (name, value) of the attributes listed in _COST_ATTRS for this op_type.
    """
    if op_type in ALIASES:
        return OpCost(0.0, 0.0)
    present_outputs = tuple(t for t in outputs if t is not None)
    out_elements = sum(_numel(t[0]) for t in present_outputs)
    moved = float(_nbytes(inputs) + _nbytes(present_outputs))
    formula = _FLOP_FORMULAS.get(op_type)
    if formula is not None:
        flops = formula(inputs, outputs, dict(attrs))
    elif op_type in _UNARY_FLOPS:
        flops = _UNARY_FLOPS[op_type] * out_elements
    elif op_type in _BINARY_FLOPS:
        operands = sum(t is not None for t in inputs) if op_type in _VARIADIC else 2
        flops = _BINARY_FLOPS[op_type] * out_elements * max(1, operands - 1)
    elif op_type in _NORM_FLOPS:
        flops = _NORM_FLOPS[op_type] * out_elements
    elif op_type in _REDUCE_FLOPS:
        flops = _REDUCE_FLOPS[op_type] * _numel(inputs[0][0]) if inputs[0] else 0.0
    else:
        flops = 0.0  # data movement, or an operator without a formula (see has_formula)
    if op_type in _PARTIAL_READS:
        # Read what is written, plus the small index/start tensors.
        moved = 2.0 * _nbytes(present_outputs) + _nbytes(inputs[1:])
    elif op_type == "Expand":
        moved = float(_nbytes(inputs[:1]) + _nbytes(present_outputs))
    return OpCost(float(flops), moved)


def node_signature(graph: Graph, node: Node) -> tuple:
    """The arguments of op_cost for `node` in `graph` (hashable)."""
    values = graph.values

    def tensor(name: str) -> Tensor:
        value = values.get(name) if name else None  # unknown: an unused optional output
        return None if value is None else (value.shape, value.dtype)

    op_type = node.op_type
    attrs: tuple[tuple[str, object], ...] = ()
    names = _COST_ATTRS.get(op_type)
    if names:
        attrs = tuple((name, _hashable(node.attr(name))) for name in names)
    return (
        op_type,
        tuple(tensor(name) for name in node.inputs),
        tuple(tensor(name) for name in node.outputs),
        attrs,
    )


def _hashable(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


class AnalyticCostModel:
    """Roofline cost of graphs on this machine.

    Args:
        peaks: peak FLOP/s and bandwidth; None measures them (once, cached on disk) under
            `settings`' threads and provider.
        settings: whose threads and provider the peaks are measured with.
        overhead_ms: a fixed time added per node that is not an alias, e.g. a kernel launch
            cost; 0 keeps the result a physical floor.
    """

    def __init__(
        self,
        peaks: MachinePeaks | None = None,
        settings: OrtSettings | None = None,
        overhead_ms: float = 0.0,
    ) -> None:
        self.peaks = peaks or machine_peaks(settings or OrtSettings())
        self.overhead_ms = overhead_ms
        self._flop_ms = 1e3 / (self.peaks.gflops * 1e9)
        self._byte_ms = 1e3 / (self.peaks.gbps * 1e9)
        cache_gbps = self.peaks.cache_gbps or self.peaks.gbps
        self._cache_byte_ms = 1e3 / (cache_gbps * 1e9)

    def op_time_ms(self, cost: OpCost, op_type: str = "") -> float:
        """Roofline time of one operator with these peaks."""
        # Bytes that fit in the last-level cache may never reach DRAM.
        in_cache = cost.bytes <= self.peaks.cache_bytes
        byte_ms = self._cache_byte_ms if in_cache else self._byte_ms
        time_ms = max(cost.flops * self._flop_ms, cost.bytes * byte_ms)
        if self.overhead_ms and op_type not in ALIASES:
            time_ms += self.overhead_ms
        return time_ms

    def node_cost(self, graph: Graph, node: Node) -> OpCost:
        return op_cost(*node_signature(graph, node))

    def node_time_ms(self, graph: Graph, node: Node) -> float:
        return self.op_time_ms(self.node_cost(graph, node), node.op_type)

    def cost_ms(self, model: ModelLike) -> float:
        """The graph's roofline floor in ms: the sum of its nodes' times."""
        graph = _as_graph(model)
        return sum(self.node_time_ms(graph, node) for node in graph.nodes)

    def report(self, model: ModelLike) -> AnalyticReport:
        """Totals and per-operator-type split of the graph's analytic cost."""
        graph = _as_graph(model)
        flops = moved = floor = 0.0
        by_op: dict[str, float] = {}
        unmodelled: dict[str, int] = {}
        for node in graph.nodes:
            cost = self.node_cost(graph, node)
            time_ms = self.op_time_ms(cost, node.op_type)
            flops, moved, floor = flops + cost.flops, moved + cost.bytes, floor + time_ms
            by_op[node.op_type] = by_op.get(node.op_type, 0.0) + time_ms
            if not has_formula(node.op_type):
                unmodelled[node.op_type] = unmodelled.get(node.op_type, 0) + 1
        return AnalyticReport(flops, moved, floor, by_op, unmodelled)


def _as_graph(model: ModelLike) -> Graph:
    return model if isinstance(model, Graph) else load_model(model)
