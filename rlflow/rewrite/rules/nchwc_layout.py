"""Blocked tensors in the IR, and what every NCHWc rule shares.

A blocked tensor is an ordinary value of shape (N, C', H, W), C' a whole number of blocks, whose
memory is in onnxruntime's NCHWc order (`nchwc_format`). Nothing in its type says so: a value is
blocked because of where it comes from (`is_blocked`). Elementwise ops and channel Concats do
not care about the order, which is why they can run on blocked tensors unchanged. Its channels
past the logical count (padding) may hold any finite value: no result depends on them, and
`needed_channels` tells how many channels some result does depend on.

ONNX shape inference knows nothing of the `com.microsoft.nchwc` ops, so the rules give each new
nchwc value its shape themselves (`typed`), the shapes onnxruntime's own graphs have.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import onnx

from rlflow.cost import nchwc_block_size
from rlflow.graph import NCHWC_DOMAIN, Graph, Node, Value
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement
from rlflow.rewrite.rules import nchwc_format
from rlflow.rewrite.rules.nchwc_format import (
    ConvLayout,
    conv_layout,
    pad_channels,
    padded,
    reorder_filter,
    restore_filter,
    used_input_channels,
)

NCHWC = NCHWC_DOMAIN
N = f"{NCHWC}."
"""How patterns name an nchwc op: f"{N}Conv(x, w, b?)"."""

ACTIVATIONS: dict[str, tuple[tuple[str, float], ...]] = {
    "Relu": (),
    "Sigmoid": (),
    "Tanh": (),
    "LeakyRelu": (("alpha", 0.01),),
    "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)),
}
"""Activations an nchwc Conv can apply itself, with their attributes in the order of its
`activation_params` (and their ONNX defaults): the ones MLAS's fused activation implements and
ONNX has as a plain op with attributes only."""


def activation_reason(conv: Node) -> str | None:
    """Why a Conv's fused `activation` cannot be written as its own op (None: it can); no
    `activation_params` means the op's defaults, as in MLAS."""
    activation = conv.attr("activation", "")
    if activation not in ACTIVATIONS:
        return f"the Conv applies {activation or 'no activation'}"
    if len(conv.attr("activation_params", [])) not in (0, len(ACTIVATIONS[activation])):
        return f"{activation} needs {len(ACTIVATIONS[activation])} activation_params"
    return None


def fused_activation(act: Node) -> dict[str, object]:
    """The nchwc Conv attributes that apply the activation node `act` itself (`Emitter.copy`
    keywords: its attributes, with their ONNX defaults, in `activation_params` order)."""
    params = [act.attr(name, default) for name, default in ACTIVATIONS[act.op_type]]
    return {"activation": act.op_type, "activation_params": params or None}


def emit_activation(emit: Emitter, conv: Node, y: str, like: str = "") -> str:
    """The Conv's fused activation as its own operator (`activation_params` as attributes)."""
    activation = conv.attr("activation")
    names = [name for name, _ in ACTIVATIONS[activation]]
    params = dict(zip(names, conv.attr("activation_params", []), strict=False))
    return emit.op(activation, [y], like=[like] if like else (), **params)


LAYOUT_FREE = frozenset({*ACTIVATIONS, "Add", "Mul", "Concat"})
"""Plain ops that compute the same on blocked tensors as on NCHW ones (elementwise on equal
shapes; Concat on channels joins whole blocks)."""

BLOCKED_READERS = (
    "Conv",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Upsample",
    *sorted(LAYOUT_FREE),
)
"""The op types of nodes that may read a blocked tensor (besides ReorderOutput)."""


def is_nchwc(node: Node | None, op_type: str) -> bool:
    return node is not None and node.domain == NCHWC and node.op_type == op_type


def channels_first(node: Node) -> bool:
    """A reorder to or from NCHW (not NHWC, which the rules leave alone)."""
    return node.attr("channels_last", 0) == 0


def is_blocked(graph: Graph, name: str) -> bool:
    """Whether a value is a blocked tensor: made by an nchwc op other than ReorderOutput, or by
    a layout-free op from blocked tensors (its first input says which)."""
    while True:
        node = graph.producer(name)
        if node is None:
            return False
        if node.domain == NCHWC:
            return node.op_type != "ReorderOutput"
        if node.domain or node.op_type not in LAYOUT_FREE:
            return False
        name = node.inputs[0]


_PER_CHANNEL = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Upsample")


def needed_channels(graph: Graph, name: str, block: int) -> int:
    """How many leading channels of a blocked tensor some result may depend on; the channels
    after them may hold anything.

    A ReorderOutput keeps its `channels`; an nchwc Conv with an OIHWBiBo filter reads up to its
    last non-zero input column; per-channel readers (elementwise ops, pools, a depthwise Conv,
    a Conv's Sum input) need what their own output needs; anything else (a Concat, a graph
    output) needs every channel.
    """
    memo: dict[str, int] = {}

    def need(value: str) -> int:
        if value not in memo:
            total = graph.value(value).shape[1]
            if graph.is_output(value):
                memo[value] = total
            else:
                reads = (reader_needs(node, value, total) for node in graph.consumers(value))
                memo[value] = min(total, max(reads, default=0))
        return memo[value]

    def reader_needs(reader: Node, value: str, total: int) -> int:
        if reader.domain == NCHWC:
            if reader.op_type == "ReorderOutput" and channels_first(reader):
                return reader.attr("channels")
            if reader.op_type in _PER_CHANNEL:
                return need(reader.outputs[0])
            if reader.op_type == "Conv":
                return conv_needs(reader, value, total)
        elif not reader.domain and reader.op_type in LAYOUT_FREE - {"Concat"}:
            return need(reader.outputs[0])
        return total

    def conv_needs(conv: Node, value: str, total: int) -> int:
        result = need(conv.outputs[0]) if value in conv.inputs[3:] else 0
        if conv.inputs[0] != value:
            return result
        weight = graph.constant(conv.inputs[1])
        group = conv.attr("group", 1)
        layout = None if weight is None else conv_layout(weight.shape, group, block)
        if isinstance(layout, ConvLayout) and layout.depthwise:
            return max(result, need(conv.outputs[0]))
        if isinstance(layout, ConvLayout) and not layout.per_output and group == 1:
            return max(result, used_input_channels(weight, block))
        return total

    return need(name)


def typed(emit: Emitter, name: str, shape: Sequence[int], dtype: int) -> str:
    """Give a new nchwc value its type and shape (ONNX cannot infer them)."""
    emit.values[name] = Value(name, dtype, tuple(shape))
    return name


def reorder_input(emit: Emitter, value: Value, block: int) -> str:
    """ReorderInput of an NCHW value: its channels padded to whole blocks."""
    n, channels, *spatial = value.shape
    name = emit.op("ReorderInput", [value.name], domain=NCHWC)
    return typed(emit, name, (n, padded(channels, block), *spatial), value.dtype)


def reorder_output(emit: Emitter, value: Value, channels: int) -> str:
    """ReorderOutput of a blocked value to NCHW with its first `channels` channels."""
    n, _, *spatial = value.shape
    name = emit.op("ReorderOutput", [value.name], domain=NCHWC, channels=channels)
    return typed(emit, name, (n, channels, *spatial), value.dtype)


def reorder_output_for(emit: Emitter, blocked: str, nchw: str, channels: int) -> str:
    """ReorderOutput of a new blocked value, standing for the existing NCHW value `nchw` (its
    type and shape)."""
    return emit.op("ReorderOutput", [blocked], domain=NCHWC, like=[nchw], channels=channels)


def out_of_layout_reason(graph: Graph, match: Match) -> str | None:
    """Why the matched blocked Conv `y` cannot leave the layout by `conv_out_of_layout` (None:
    it can): it must read a blocked tensor, and its activation be one a plain op writes."""
    conv = match.node("y")
    if not is_blocked(graph, match["x"]):
        return "the Conv reads NCHW (fewer input channels than a block)"
    if conv.attr("activation") is not None:
        return activation_reason(conv)
    return None


def conv_out_of_layout(
    graph: Graph,
    match: Match,
    nchw_conv: Callable[[Emitter, Value, np.ndarray, bool], str],
    fuse_activation: bool,
) -> Replacement:
    """A matched blocked Conv `y` of a blocked `x` (filter `w`, Sum `s`) out of the layout:
    `x` reordered to NCHW, `nchw_conv(emit, x_nchw, filter, fuse)` in the Conv's place (the OIHW
    filter restored with its padded channels, whose zero weights ignore whatever the padding
    holds; `fuse`: it applies the Conv's activation itself, allowed where `fuse_activation` and
    there is no Sum), reordered back to blocks, then the Sum and the activation if not fused."""
    block = nchwc_block_size()
    conv = match.node("y")
    blocked = graph.constant(match["w"])
    out_channels, channels = blocked.shape[:2]  # both padded to whole blocks
    weight = restore_filter(blocked, block, False, out_channels, channels)
    emit = Emitter(graph)
    nchw = reorder_output(emit, graph.value(match["x"]), channels)
    activation = conv.attr("activation") is not None
    fuse = fuse_activation and activation and not match["s"]
    y = nchw_conv(emit, emit.values[nchw], weight, fuse)
    out = graph.value(match.outputs[0])
    y = reorder_input(emit, Value(y, out.dtype, out.shape), block)
    if match["s"]:
        y = emit.op("Add", [y, match["s"]], like=[match.outputs[0]])
    if activation and not fuse:
        y = emit_activation(emit, conv, y, like=match.outputs[0])
    return emit.result(y)


def keep_shared_reorders(graph: Graph, match: Match) -> Match:
    """The match with its reorder nodes that are also read elsewhere moved to `keep`.

    A reorder shared with other readers (onnxruntime shares one per tensor) stays for them
    instead of barring the site; the rewrite reads its input, which stays too.
    """
    inside = {id(node) for node in match.nodes}
    shared = [
        node
        for node in match.nodes[1:]
        if node.domain == NCHWC
        and node.op_type in ("ReorderInput", "ReorderOutput")
        and (
            graph.is_output(node.outputs[0])
            or any(id(reader) not in inside for reader in graph.consumers(node.outputs[0]))
        )
    ]
    if not shared:
        return match
    kept = {id(node) for node in shared}
    nodes = tuple(node for node in match.nodes if id(node) not in kept)
    return dataclasses.replace(match, nodes=nodes, keep=(*match.keep, *shared))


class NchwcRule:
    """What every NCHWc rule shares: not offered where onnxruntime does no NCHWc (the layout
    is onnxruntime's CPU kernels' own), and its example sized for this machine's block."""

    portable = False
    cpu_only = True

    def check(self, graph: Graph, match: Match) -> str | None:
        block = nchwc_block_size()
        if block is None:
            return "onnxruntime does no NCHWc on this machine"
        return self.nchwc_reason(graph, match, block)

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        return None

    def fingerprint(self) -> str:
        """The rule's own module and the NCHWc ones it builds on: a change to the format or to
        these helpers must verify the rules again."""
        return super().fingerprint() + _HELPERS_SOURCE


_HELPERS_SOURCE = inspect.getsource(nchwc_format) + inspect.getsource(sys.modules[__name__])


class NchwcPatternRule(NchwcRule, PatternRule):
    """An NCHWc rule over patterns, whose shared reorders stay for their other readers."""

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        for match in super().matches(graph, anchor):
            yield keep_shared_reorders(graph, match)


def example_block() -> int:
    """The block examples are sized for (8 where onnxruntime does no NCHWc: the rules then
    refuse every site, so verification fails as it should)."""
    return nchwc_block_size() or 8


def blocked_input(builder: ModelBuilder, shape: Sequence[int]) -> str:
    """A model input reordered to blocks: the simplest blocked tensor for an example."""
    return builder.op("ReorderInput", [builder.input(shape)], domain=NCHWC)


def blocked_conv(
    builder: ModelBuilder,
    x: str,
    weight: np.ndarray,
    layout: ConvLayout,
    bias: np.ndarray | None = None,
    total: str | None = None,
    **attrs: object,
) -> str:
    """An nchwc Conv of the OIHW `weight` (reordered here) for an example; `total` is its
    optional Sum input."""
    block = example_block()
    inputs = [x, builder.const(reorder_filter(weight, block, layout.per_output))]
    inputs.append("" if bias is None else builder.const(pad_channels(bias, block)))
    inputs.append(total or "")
    while not inputs[-1]:
        inputs.pop()
    return builder.op("Conv", inputs, domain=NCHWC, **attrs)


def float_tensor(graph: Graph, name: str) -> bool:
    return graph.value(name).dtype == onnx.TensorProto.FLOAT
