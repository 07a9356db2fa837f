"""NCHWc rules for ops that stay in the blocked layout, each with its reverse.

- Relu(ReorderOutput(x)) -> ReorderOutput(Relu(x))             (Sigmoid, Tanh, LeakyRelu, ...)
- Add(ReorderOutput(a), ReorderOutput(b)) -> ReorderOutput(Add(a, b))      (Mul alike)
- Concat(ReorderOutput(a), ReorderOutput(b)) -> ReorderOutput(Concat(a, b)) (whole blocks)
- Add(nchwc.Conv(x, w, b), s) -> nchwc.Conv(x, w, b, s)         (s blocked: the Conv's Sum)
- Relu(nchwc.Conv(...)) -> nchwc.Conv(..., activation=Relu)

Elementwise ops and channel Concats compute the same on blocked tensors (`nchwc_layout`), so
moving them across a ReorderOutput only moves the border of a blocked region; the fusions then
give the nchwc Conv what onnxruntime gives it. An activation runs after the Sum, so an Add
fuses only into a Conv without one (and is un-fused only after it).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx

from rlflow.graph import Graph, Node
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, Replacement, Rule, both_ways
from rlflow.rewrite.rules import nchwc_reorders
from rlflow.rewrite.rules.common import pick, shape
from rlflow.rewrite.rules.nchwc_format import ConvLayout
from rlflow.rewrite.rules.nchwc_layout import (
    ACTIVATIONS,
    NCHWC,
    N,
    NchwcPatternRule,
    NchwcRule,
    activation_reason,
    blocked_conv,
    blocked_input,
    channels_first,
    emit_activation,
    example_block,
    fused_activation,
    is_blocked,
    is_nchwc,
    keep_shared_reorders,
    reorder_output,
    reorder_output_for,
)

# Attributes the examples give the activations with parameters (not their defaults).
_EXAMPLE_PARAMS = {"LeakyRelu": {"alpha": 0.2}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}}


def _reorder_to_nchw(graph: Graph, name: str) -> str | None:
    if not channels_first(graph.producer(name)):
        return "the ReorderOutput is to NHWC"
    return None


class ActivationMove(NchwcPatternRule):
    name = "nchwc-activation-move"
    description = (
        "Relu(ReorderOutput(x)) -> ReorderOutput(Relu(x))"
        "  (Sigmoid, Tanh, LeakyRelu, HardSigmoid alike)"
    )
    reverse_description = "ReorderOutput(Relu(x)) -> Relu(ReorderOutput(x))"
    pattern = tuple(f"y={act}(r={N}ReorderOutput(x))" for act in ACTIVATIONS)
    reverse_pattern = tuple(f"r={N}ReorderOutput(y={act}(x))" for act in ACTIVATIONS)
    target_ops = {"ReorderOutput": 1, "Relu": 1}
    settings = len(ACTIVATIONS)

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        return _reorder_to_nchw(graph, match["r"])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        act = match.node("y")
        channels = graph.producer(match["r"]).attr("channels")
        emit = Emitter(graph)
        if self.reverse:
            nchw = reorder_output(emit, graph.value(match["x"]), channels)
            return emit.result(emit.copy(act, [nchw]))
        moved = emit.copy(act, [match["x"]])
        return emit.result(reorder_output_for(emit, moved, match.outputs[0], channels))

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        act = list(ACTIVATIONS)[setting % len(ACTIVATIONS)]
        channels, dims = pick(
            setting, [(block // 2, (1, block // 2, 5, 5)), (block, (2, block, 3, 3))]
        )
        b = ModelBuilder()
        blocked = blocked_input(b, dims)
        params = _EXAMPLE_PARAMS.get(act, {})
        if self.reverse:
            inner = b.op(act, [blocked], **params)
            return b.model(b.op("ReorderOutput", [inner], domain=NCHWC, channels=channels))
        nchw = b.op("ReorderOutput", [blocked], domain=NCHWC, channels=channels)
        return b.model(b.op(act, [nchw], **params))


_BINARY = ("Add", "Mul")


class BinaryMove(NchwcPatternRule):
    name = "nchwc-binary-move"
    description = "Add(ReorderOutput(a), ReorderOutput(b)) -> ReorderOutput(Add(a, b))  (Mul alike)"
    reverse_description = "ReorderOutput(Add(a, b)) -> Add(ReorderOutput(a), ReorderOutput(b))"
    pattern = tuple(f"y={op}(ra={N}ReorderOutput(a), rb={N}ReorderOutput(b))" for op in _BINARY)
    reverse_pattern = tuple(f"r={N}ReorderOutput(y={op}(a, b))" for op in _BINARY)
    target_ops = {"ReorderOutput": 1, "Add": 1}

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if shape(graph, match["a"]) != shape(graph, match["b"]):
            return "the operands' shapes differ (a broadcast)"
        if self.reverse:
            if not (is_blocked(graph, match["a"]) and is_blocked(graph, match["b"])):
                return "an operand is not blocked"
            return _reorder_to_nchw(graph, match["r"])
        left, right = graph.producer(match["ra"]), graph.producer(match["rb"])
        if left.attr("channels") != right.attr("channels"):
            return "the ReorderOutputs keep different channel counts"
        return _reorder_to_nchw(graph, match["ra"]) or _reorder_to_nchw(graph, match["rb"])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        op = match.node("y")
        emit = Emitter(graph)
        if self.reverse:
            channels = match.nodes[0].attr("channels")
            left = reorder_output(emit, graph.value(match["a"]), channels)
            right = left
            if match["b"] != match["a"]:
                right = reorder_output(emit, graph.value(match["b"]), channels)
            return emit.result(emit.copy(op, [left, right]))
        channels = graph.producer(match["ra"]).attr("channels")
        moved = emit.copy(op, [match["a"], match["b"]])
        return emit.result(reorder_output_for(emit, moved, match.outputs[0], channels))

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        op, channels, dims = pick(
            setting,
            [
                ("Add", block // 2, (1, block // 2, 5, 5)),
                ("Mul", block, (2, block, 3, 3)),
                ("Add", 2 * block, (1, 2 * block, 2, 4)),
            ],
        )
        b = ModelBuilder()
        left, right = blocked_input(b, dims), blocked_input(b, dims)
        if self.reverse:
            inner = b.op(op, [left, right])
            return b.model(b.op("ReorderOutput", [inner], domain=NCHWC, channels=channels))
        nchw = [b.op("ReorderOutput", [v], domain=NCHWC, channels=channels) for v in (left, right)]
        return b.model(b.op(op, nchw))


def _channel_concat(graph: Graph, concat: Node) -> bool:
    dims = shape(graph, concat.outputs[0])
    return not concat.domain and len(dims) == 4 and concat.attr("axis") % 4 == 1


class ConcatMove(NchwcRule, Rule):
    """A Concat of whole blocks joins blocked tensors as they are: each one's blocks follow
    the other's in memory, as its channels do in NCHW."""

    name = "nchwc-concat-move"
    description = (
        "Concat(ReorderOutput(a), ReorderOutput(b), axis=1) -> ReorderOutput(Concat(a, b))"
        "  (whole blocks)"
    )
    reverse_description = (
        "ReorderOutput(Concat(a, b, axis=1)) -> Concat(ReorderOutput(a), ReorderOutput(b))"
    )
    anchor_ops = ("Concat",)
    reverse_anchor_ops = ("ReorderOutput",)
    source_ops = {"Concat": 1, "ReorderOutput": 2}
    target_ops = {"ReorderOutput": 1, "Concat": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        if self.reverse:
            concat = graph.producer(anchor.inputs[0])
            if is_nchwc(anchor, "ReorderOutput") and concat is not None:
                if concat.op_type == "Concat" and _channel_concat(graph, concat):
                    parts = {f"x{i}": name for i, name in enumerate(concat.inputs)}
                    yield Match((anchor, concat), parts, (anchor.outputs[0],))
            return
        if not _channel_concat(graph, anchor):
            return
        reorders = [graph.producer(name) for name in anchor.inputs]
        if all(is_nchwc(node, "ReorderOutput") for node in reorders):
            unique = list({id(node): node for node in reorders}.values())
            parts = {f"x{i}": node.inputs[0] for i, node in enumerate(reorders)}
            yield keep_shared_reorders(graph, Match((anchor, *unique), parts, (anchor.outputs[0],)))

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if self.reverse:
            reorder, concat = match.nodes
            channels = shape(graph, concat.outputs[0])[1]
            if not channels_first(reorder) or reorder.attr("channels") != channels:
                return "the ReorderOutput drops padded channels or is to NHWC"
            if not all(is_blocked(graph, part) for part in match.bindings.values()):
                return "a joined tensor is not blocked"
            return None
        for part, reorder in zip(match.bindings.values(), _readers(graph, match), strict=True):
            if not channels_first(reorder) or reorder.attr("channels") != shape(graph, part)[1]:
                return "a ReorderOutput drops padded channels (not whole blocks) or is to NHWC"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        parts = list(match.bindings.values())
        concat = match.nodes[1] if self.reverse else match.nodes[0]
        emit = Emitter(graph)
        if self.reverse:
            nchw = [reorder_output(emit, graph.value(p), shape(graph, p)[1]) for p in parts]
            return emit.result(emit.copy(concat, nchw))
        joined = emit.copy(concat, parts)
        channels = shape(graph, match.outputs[0])[1]
        return emit.result(reorder_output_for(emit, joined, match.outputs[0], channels))

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        widths, axis = pick(setting, [((block, 2 * block), 1), ((block, block, block), -3)])
        b = ModelBuilder()
        parts = [blocked_input(b, (1 + setting % 2, c, 3, 4)) for c in widths]
        if self.reverse:
            joined = b.op("Concat", parts, axis=axis)
            return b.model(b.op("ReorderOutput", [joined], domain=NCHWC, channels=sum(widths)))
        nchw = [
            b.op("ReorderOutput", [p], domain=NCHWC, channels=c)
            for p, c in zip(parts, widths, strict=True)
        ]
        return b.model(b.op("Concat", nchw, axis=axis))


def _readers(graph: Graph, match: Match) -> list[Node]:
    return [graph.producer(name) for name in match.nodes[0].inputs]


def _example_conv(
    builder: ModelBuilder, setting: int, with_sum: bool = False, **attrs: object
) -> tuple[str, tuple]:
    """An nchwc Conv for an example, of a blocked input (even settings) or of an NCHW one with
    fewer channels than a block (odd), with a blocked Sum input if asked; returns it and its
    NCHW output shape."""
    block = example_block()
    direct = setting % 2 == 1
    cin, cout = (3, block // 2) if direct else (block, block)
    batch = 2 if setting == 2 else 1
    x = builder.input((batch, cin, 6, 6))
    source = x if direct else builder.op("ReorderInput", [x], domain=NCHWC)
    total = blocked_input(builder, (batch, cout, 6, 6)) if with_sum else None
    rng = np.random.default_rng(setting)
    weight = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    layout = ConvLayout(per_output=direct, reorder_input=not direct)
    conv = blocked_conv(builder, source, weight, layout, bias, total, pads=[1] * 4, **attrs)
    return conv, (batch, cout, 6, 6)


def _no_activation(conv: Node) -> str | None:
    if conv.attr("activation") is not None:
        return f"the nchwc Conv applies {conv.attr('activation')} (after any Sum)"
    return None


class ConvSumFusion(NchwcPatternRule):
    name = "nchwc-conv-sum-fusion"
    description = "Add(nchwc.Conv(x, w, b), s) -> nchwc.Conv(x, w, b, s)  (s blocked)"
    reverse_description = "nchwc.Conv(x, w, b, s) -> Add(nchwc.Conv(x, w, b), s)"
    pattern = f"y=Add(c={N}Conv(x, w, b?), s)"
    reverse_pattern = f"y={N}Conv(x, w, b?, s)"
    target_ops = {"Conv": 1}

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        conv = match.node("y" if self.reverse else "c")
        if self.reverse:
            return _no_activation(conv)
        if not is_blocked(graph, match["s"]):
            return "the added tensor is not blocked"
        if shape(graph, match["s"]) != shape(graph, match["c"]):
            return "the added tensor is broadcast"
        return _no_activation(conv)

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        inputs = [match["x"], match["w"], match["b"]]
        if self.reverse:
            conv = emit.copy(match.nodes[0], inputs, like=match.outputs[0])
            return emit.result(emit.op("Add", [conv, match["s"]]))
        fused = emit.copy(match.node("c"), [*inputs, match["s"]], like=match.outputs[0])
        return emit.result(fused)

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        if self.reverse:
            conv, dims = _example_conv(b, setting, with_sum=True)
            return b.model(b.op("ReorderOutput", [conv], domain=NCHWC, channels=dims[1]))
        conv, dims = _example_conv(b, setting)
        total = blocked_input(b, dims)
        added = b.op("Add", [total, conv] if setting == 2 else [conv, total])
        return b.model(b.op("ReorderOutput", [added], domain=NCHWC, channels=dims[1]))


class ConvActivationFusion(NchwcPatternRule):
    name = "nchwc-conv-activation-fusion"
    description = "Relu(nchwc.Conv(x, w, b, s)) -> nchwc.Conv(x, w, b, s, activation=Relu)"
    reverse_description = "nchwc.Conv(x, w, b, s, activation=Relu) -> Relu(nchwc.Conv(x, w, b, s))"
    pattern = tuple(f"y={act}(c={N}Conv(x, w, b?, s?))" for act in ACTIVATIONS)
    reverse_pattern = f"y={N}Conv(x, w, b?, s?)"
    target_ops = {"Conv": 1}
    settings = len(ACTIVATIONS)

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if not self.reverse:
            return _no_activation(match.node("c"))
        return activation_reason(match.nodes[0])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        inputs = [match["x"], match["w"], match["b"], match["s"]]
        if self.reverse:
            conv = match.nodes[0]
            plain = emit.copy(
                conv, inputs, like=match.outputs[0], activation=None, activation_params=None
            )
            return emit.result(emit_activation(emit, conv, plain))
        act = match.nodes[0]
        fused = emit.copy(match.node("c"), inputs, like=match.outputs[0], **fused_activation(act))
        return emit.result(fused)

    def example(self, setting: int) -> onnx.ModelProto:
        act = list(ACTIVATIONS)[setting % len(ACTIVATIONS)]
        params = _EXAMPLE_PARAMS.get(act, {})
        b = ModelBuilder()
        if self.reverse:
            fused = {"activation": act}
            if params:
                fused["activation_params"] = list(params.values())
            conv, dims = _example_conv(b, setting, **fused)
            return b.model(b.op("ReorderOutput", [conv], domain=NCHWC, channels=dims[1]))
        conv, dims = _example_conv(b, setting)
        result = b.op(act, [conv], **params)
        return b.model(b.op("ReorderOutput", [result], domain=NCHWC, channels=dims[1]))


RULES = [
    *nchwc_reorders.RULES,
    *both_ways(ActivationMove),
    *both_ways(BinaryMove),
    *both_ways(ConcatMove),
    *both_ways(ConvSumFusion),
    *both_ways(ConvActivationFusion),
]
