"""Convolution rules: TASO's folds, kernel enlargement and merges (the fusions into
onnxruntime's FusedConv and their reverse are in `fusedconv.py`; `RULES` lists both families in
their historical order, which candidate order and trained agents' rule ids follow).

- BatchNormalization(Conv(x, w, b?), ...) -> Conv(x, w', b')           (BN folded into weights)
- Mul(Conv(x, w, b?), s) -> Conv(x, w', b')                            (s per-channel constant)
- Add(Conv(x, w, b?), c) -> Conv(x, w, b')                             (c per-channel constant)
- Conv(x, w1), Conv(x, w2), ... -> Split(Conv(x, concat(w1, w2, ...)))  and back
- Conv(x, w_small) -> Conv(x, w_zero_padded, pads+)                    (to match a sibling's
  larger kernel, so that the two can merge)
- Conv(x, w, group=g) -> Conv(x, w', group=g/2)                        (TASO's group merge:
  pairs of groups become one, w' block-diagonal)
- Concat(Conv(x1, w1), Conv(x2, w2), ...) -> Conv(Concat(x1, x2, ...), concat(w), group=k)

The folds of constants into a Conv's weights (BatchNormalization, Mul, Add: ORT's ConvBNFusion,
ConvMulFusion, ConvAddFusion) have no reverse: they remove an elementwise pass and leave the Conv
as it was, so they are never slower.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx

from rlflow.graph import Graph, Node
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement, Rule, both_ways
from rlflow.rewrite.rules.common import (
    emit_split,
    example_conv,
    merge_groups,
    only_reader,
    pick,
    shape,
    split_sizes,
)
from rlflow.rewrite.rules.fusedconv import (
    ConvActivationToFusedConv,
    ConvAddReluToFusedConv,
    ConvReluToFusedConv,
    FusedConvToConv,
)


def conv_attrs(node: Node, spatial: int) -> dict:
    """A Conv's attributes with defaults filled in (kernel_shape left out: the weight says it)."""
    return {
        "auto_pad": node.attr("auto_pad", "NOTSET"),
        "dilations": list(node.attr("dilations", [1] * spatial)),
        "group": node.attr("group", 1),
        "pads": list(node.attr("pads", [0] * 2 * spatial)),
        "strides": list(node.attr("strides", [1] * spatial)),
    }


def conv_weights(graph: Graph, conv: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(weight, bias) of a Conv with constant weights (bias zeros if absent), else None."""
    weight = graph.constant(conv.inputs[1])
    bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
    bias = (
        graph.constant(bias_name)
        if bias_name
        else np.zeros(weight.shape[0], weight.dtype)
        if weight is not None
        else None
    )
    if weight is None or bias is None:
        return None
    return weight, bias


def per_channel(graph: Graph, name: str, output: str) -> np.ndarray | None:
    """A constant that varies along axis 1 only of `output`, as a vector per channel."""
    array = graph.constant(name)
    out_shape = shape(graph, output)
    if array is None or array.ndim > len(out_shape):
        return None
    full = (1,) * (len(out_shape) - array.ndim) + array.shape
    if any(d != 1 for axis, d in enumerate(full) if axis != 1):
        return None
    return np.broadcast_to(array.reshape(-1), (out_shape[1],))


class _ConstantConv:
    def conv_reason(self, graph: Graph, conv: Node) -> str | None:
        if conv_weights(graph, conv) is None:
            return "the Conv's weight or bias is not a constant"
        return None


class ConvBatchNormFold(_ConstantConv, PatternRule):
    name = "conv-batchnorm-fold"
    description = "BatchNormalization(Conv(x, w, b), ...) -> Conv(x, w', b')"
    pattern = "BatchNormalization(c=Conv(x, w, b?), scale, bias, mean, var)"
    target_ops = {"Conv": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if any(not graph.is_constant(match[v]) for v in ("scale", "bias", "mean", "var")):
            return "the BatchNormalization parameters are not constants"
        if match.nodes[0].attr("training_mode", 0):
            return "BatchNormalization is in training mode"
        return self.conv_reason(graph, match.node("c"))

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        weight, bias = conv_weights(graph, match.node("c"))
        scale, shift, mean, var = (
            graph.constant(match[v]) for v in ("scale", "bias", "mean", "var")
        )
        factor = scale / np.sqrt(var + match.nodes[0].attr("epsilon", 1e-5))
        emit = Emitter(graph)
        new_weight = emit.const(weight * factor.reshape(-1, *[1] * (weight.ndim - 1)), "weight")
        new_bias = emit.const(((bias - mean) * factor + shift).astype(weight.dtype), "bias")
        return emit.result(emit.copy(match.node("c"), [match["x"], new_weight, new_bias]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        conv = example_conv(setting, b)
        channels = pick(setting, [4, 6, 3])
        params = [b.const((channels,)) for _ in range(3)]
        var = b.const(np.abs(np.random.default_rng(setting).standard_normal(channels)) + 0.5)
        return b.model(b.op("BatchNormalization", [conv, *params, var], epsilon=1e-3))


class ConvMulFold(_ConstantConv, PatternRule):
    name = "conv-mul-fold"
    description = "Mul(Conv(x, w, b), s) -> Conv(x, w', b')  (s per channel)"
    pattern = "Mul(Conv(x, w, b?), s)"
    target_ops = {"Conv": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if per_channel(graph, match["s"], match.outputs[0]) is None:
            return "the factor is not a per-channel constant"
        return self.conv_reason(graph, match.nodes[1])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        conv = match.nodes[1]
        weight, bias = conv_weights(graph, conv)
        factor = per_channel(graph, match["s"], match.outputs[0]).astype(weight.dtype)
        emit = Emitter(graph)
        new_weight = emit.const(weight * factor.reshape(-1, *[1] * (weight.ndim - 1)), "weight")
        new_bias = emit.const(bias * factor, "bias")
        return emit.result(emit.copy(conv, [match["x"], new_weight, new_bias]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        channels = pick(setting, [4, 6, 3])
        factor = pick(setting, [(1, channels, 1, 1), (channels, 1, 1), (1,)])
        return b.model(b.op("Mul", [example_conv(setting, b), b.const(factor)]))


class ConvAddBiasFold(_ConstantConv, PatternRule):
    name = "conv-add-bias-fold"
    description = "Add(Conv(x, w, b), c) -> Conv(x, w, b')  (c per channel)"
    pattern = "Add(Conv(x, w, b?), c)"
    target_ops = {"Conv": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if per_channel(graph, match["c"], match.outputs[0]) is None:
            return "the addend is not a per-channel constant"
        return self.conv_reason(graph, match.nodes[1])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        conv = match.nodes[1]
        weight, bias = conv_weights(graph, conv)
        shift = per_channel(graph, match["c"], match.outputs[0]).astype(weight.dtype)
        emit = Emitter(graph)
        new_bias = emit.const(bias + shift, "bias")
        return emit.result(emit.copy(conv, [match["x"], match["w"], new_bias]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        channels = pick(setting, [4, 6, 3])
        shift = pick(setting, [(1, channels, 1, 1), (channels, 1, 1), (1,)])
        return b.model(b.op("Add", [example_conv(setting, b), b.const(shift)]))


def _mergeable(graph: Graph, conv: Node, x: str) -> tuple | None:
    """What two convolutions of `x` must share to merge: attributes and weight shape but Cout."""
    if conv.op_type != "Conv" or conv.domain or conv.inputs[0] != x:
        return None
    weights = conv_weights(graph, conv)
    if weights is None:
        return None
    attrs = conv_attrs(conv, weights[0].ndim - 2)
    if attrs["group"] != 1 or attrs["auto_pad"] != "NOTSET":
        return None
    return repr(sorted(attrs.items())), weights[0].shape[1:], weights[0].dtype


def _concat_order(graph: Graph, convs: list[Node]) -> list[Node]:
    """The convs in the order a Concat joins their results (through single-reader elementwise
    ops such as Relu), if one does: then the Split of the merged conv can cancel against it."""
    positions = []
    for conv in convs:
        value = conv.outputs[0]
        readers = graph.consumers(value)
        while len(readers) == 1 and len(readers[0].present_inputs) == 1:
            value = readers[0].outputs[0]
            readers = graph.consumers(value)
        if len(readers) != 1 or readers[0].op_type != "Concat" or value not in readers[0].inputs:
            return convs
        positions.append((readers[0], readers[0].inputs.index(value)))
    if len({id(concat) for concat, _ in positions}) != 1:
        return convs
    order = sorted(range(len(convs)), key=lambda i: positions[i][1])
    return [convs[i] for i in order]


class ConvSiblingsMerge(Rule):
    """Convolutions of one input merged into one (weights concatenated) followed by a Split;
    the reverse splits a Conv whose only reader is a Split on channels."""

    name = "conv-siblings-merge"
    description = "Conv(x, w1), Conv(x, w2), ... -> Split(Conv(x, concat(w1, w2, ...)))"
    reverse_description = "Split(Conv(x, w)) -> Conv(x, w1), Conv(x, w2), ..."
    anchor_ops = ("Conv",)
    reverse_anchor_ops = ("Split",)
    source_ops = {"Conv": 2}
    target_ops = {"Conv": 1, "Split": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        if self.reverse:
            yield from self._split_matches(graph, anchor)
            return
        x = anchor.inputs[0]
        key = _mergeable(graph, anchor, x)
        if key is None:
            return
        group = [c for c in graph.consumers(x) if _mergeable(graph, c, x) == key]
        # One site per group of siblings, anchored at the first of them.
        if len(group) >= 2 and group[0] is anchor:
            group = _concat_order(graph, group)
            yield Match(tuple(group), {"x": x}, tuple(c.outputs[0] for c in group))

    def _split_matches(self, graph: Graph, split: Node) -> Iterator[Match]:
        conv = graph.producer(split.inputs[0])
        if conv is None or _mergeable(graph, conv, conv.inputs[0]) is None:
            return
        if split.attr("axis", 0) % len(shape(graph, split.inputs[0])) != 1:
            return
        if split_sizes(graph, split) is None or not only_reader(graph, conv.outputs[0], split):
            return
        yield Match((split, conv), {"x": conv.inputs[0]}, tuple(split.outputs))

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        if self.reverse:
            split, conv = match.nodes
            weight, bias = conv_weights(graph, conv)
            bounds = np.cumsum([0, *split_sizes(graph, split)])
            outputs = [
                emit.copy(
                    conv,
                    [
                        match["x"],
                        emit.const(weight[lo:hi], "weight"),
                        emit.const(bias[lo:hi], "bias"),
                    ],
                )
                for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)
            ]
            return emit.result(*outputs)
        weights = [conv_weights(graph, conv) for conv in match.nodes]
        weight = emit.const(np.concatenate([w for w, _ in weights]), "weight")
        bias = emit.const(np.concatenate([b for _, b in weights]), "bias")
        merged = emit.copy(match.nodes[0], [match["x"], weight, bias])
        return emit.result(*emit_split(emit, graph, merged, [w.shape[0] for w, _ in weights], 1))

    def example(self, setting: int) -> onnx.ModelProto:
        n, c, hw, k = pick(setting, [(1, 3, 8, 3), (2, 4, 5, 1), (1, 2, 7, 5)])
        b = ModelBuilder()
        x = b.op("Neg", [b.input((n, c, hw, hw))])
        if self.reverse:
            conv = b.op("Conv", [x, b.const((7, c, k, k)), b.const((7,))], pads=[k // 2] * 4)
            parts = b.op("Split", [conv, b.const([3, 4], np.int64)], outputs=2, axis=1)
            return b.model(*parts)
        outs = [
            b.op("Conv", [x, b.const((m, c, k, k)), b.const((m,))], pads=[k // 2] * 4)
            for m in (2, 5, 3)[: 2 + setting % 2]
        ]
        return b.model(*[b.op("Relu", [o]) for o in outs])


class ConvEnlargeKernel(Rule):
    """Zero-pad a Conv's kernel to a sibling's larger kernel (same input, output shape kept)."""

    name = "conv-enlarge-kernel"
    description = "Conv(x, w_1x1) -> Conv(x, w_3x3 zero-padded)  (to match a sibling)"
    anchor_ops = ("Conv",)
    source_ops = {"Conv": 1}
    target_ops = {"Conv": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        x = anchor.inputs[0]
        if _mergeable(graph, anchor, x) is None:
            return
        small = graph.constant(anchor.inputs[1]).shape[2:]
        seen = set()
        for sibling in graph.consumers(x):
            if sibling is anchor or _mergeable(graph, sibling, x) is None:
                continue
            large = graph.constant(sibling.inputs[1]).shape[2:]
            if large in seen or len(large) != len(small) or large == small:
                continue
            if any(lg < sm or (lg - sm) % 2 for lg, sm in zip(large, small, strict=False)):
                continue
            if self._enlarged_attrs(anchor, small, large) != conv_attrs(sibling, len(large)):
                continue
            seen.add(large)
            yield Match(
                (anchor,),
                {"x": x, "sibling": sibling.outputs[0]},
                (anchor.outputs[0],),
                keep=(sibling,),
            )

    @staticmethod
    def _enlarged_attrs(conv: Node, small: tuple, large: tuple) -> dict:
        attrs = conv_attrs(conv, len(small))
        grow = [(lg - sm) // 2 for lg, sm in zip(large, small, strict=False)]
        attrs["pads"] = [p + g for p, g in zip(attrs["pads"], grow + grow, strict=False)]
        return attrs

    def check(self, graph: Graph, match: Match) -> str | None:
        attrs = conv_attrs(match.nodes[0], len(shape(graph, match["x"])) - 2)
        if any(d != 1 for d in attrs["dilations"]):
            return "the Conv is dilated"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        conv = match.nodes[0]
        weight, bias = conv_weights(graph, conv)
        large = graph.constant(match.keep[0].inputs[1]).shape[2:]
        grow = [(lg - sm) // 2 for lg, sm in zip(large, weight.shape[2:], strict=False)]
        padded = np.pad(weight, [(0, 0), (0, 0), *[(g, g) for g in grow]])
        attrs = self._enlarged_attrs(conv, weight.shape[2:], large)
        emit = Emitter(graph)
        inputs = [match["x"], emit.const(padded, "weight"), *conv.inputs[2:3]]
        return emit.result(emit.copy(conv, inputs, pads=attrs["pads"], kernel_shape=list(large)))

    def example(self, setting: int) -> onnx.ModelProto:
        n, c, hw, k = pick(setting, [(1, 3, 8, 3), (2, 4, 6, 5), (1, 2, 9, 3)])
        b = ModelBuilder()
        x = b.op("Neg", [b.input((n, c, hw, hw))])
        small = b.op("Conv", [x, b.const((4, c, 1, 1)), b.const((4,))])
        large = b.op("Conv", [x, b.const((3, c, k, k))], pads=[k // 2] * 4)
        return b.model(small, large)


class ConvGroupsHalve(_ConstantConv, PatternRule):
    """TASO's group-conv merge: each pair of groups becomes one, with block-diagonal weights."""

    name = "conv-groups-halve"
    description = "Conv(x, w, group=g) -> Conv(x, w', group=g/2)"
    pattern = "Conv(x, w, b?)"
    target_ops = {"Conv": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        group = match.nodes[0].attr("group", 1)
        if group < 2 or group % 2:
            return f"group {group} is not an even number of groups"
        return self.conv_reason(graph, match.nodes[0])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        conv = match.nodes[0]
        group = conv.attr("group")
        merged = merge_groups(graph.constant(match["w"]), group, 2)
        emit = Emitter(graph)
        inputs = [match["x"], emit.const(merged, "weight"), match["b"]]
        return emit.result(emit.copy(conv, inputs, group=group // 2))

    def example(self, setting: int) -> onnx.ModelProto:
        c, out, group, k = pick(setting, [(4, 8, 2, 3), (8, 8, 4, 1), (6, 6, 6, 3)])
        b = ModelBuilder()
        x = b.input((1, c, 6, 6))
        conv = b.op(
            "Conv",
            [x, b.const((out, c // group, k, k)), b.const((out,))],
            group=group,
            pads=[k // 2] * 4,
        )
        return b.model(conv)


class ConcatConvsToGroupConv(Rule):
    """k equal-shaped Convs on k inputs, concatenated on channels -> one Conv with k groups."""

    name = "concat-convs-to-group-conv"
    description = "Concat(Conv(x1, w1), Conv(x2, w2)) -> Conv(Concat(x1, x2), w, group=2)"
    anchor_ops = ("Concat",)
    source_ops = {"Conv": 2, "Concat": 1}
    target_ops = {"Concat": 1, "Conv": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        convs = [graph.producer(name) for name in anchor.inputs]
        if len(convs) < 2 or any(conv is None for conv in convs):
            return
        if len({id(conv) for conv in convs}) != len(convs):
            return
        keys = {_mergeable(graph, conv, conv.inputs[0]) for conv in convs}
        if len(keys) != 1 or None in keys:
            return
        if len({shape(graph, conv.inputs[0]) for conv in convs}) != 1:
            return
        if anchor.attr("axis") % len(shape(graph, anchor.outputs[0])) != 1:
            return
        bindings = {f"x{i}": conv.inputs[0] for i, conv in enumerate(convs)}
        yield Match((anchor, *convs), bindings, (anchor.outputs[0],))

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        concat, *convs = match.nodes
        weights = [conv_weights(graph, conv) for conv in convs]
        emit = Emitter(graph)
        inputs = emit.op("Concat", [conv.inputs[0] for conv in convs], axis=1)
        weight = emit.const(np.concatenate([w for w, _ in weights]), "weight")
        bias = emit.const(np.concatenate([b for _, b in weights]), "bias")
        return emit.result(emit.copy(convs[0], [inputs, weight, bias], group=len(convs)))

    def example(self, setting: int) -> onnx.ModelProto:
        n, c, hw, k = pick(setting, [(1, 3, 8, 3), (2, 4, 5, 1), (1, 2, 7, 5)])
        b = ModelBuilder()
        convs = [
            b.op("Conv", [b.input((n, c, hw, hw)), b.const((4, c, k, k))], pads=[k // 2] * 4)
            for _ in range(2 + setting % 2)
        ]
        return b.model(b.op("Concat", convs, axis=1))


RULES = [
    ConvReluToFusedConv(),
    ConvAddReluToFusedConv(),
    ConvBatchNormFold(),
    ConvMulFold(),
    ConvAddBiasFold(),
    *both_ways(ConvSiblingsMerge),
    ConvEnlargeKernel(),
    ConvGroupsHalve(),
    ConcatConvsToGroupConv(),
    ConvActivationToFusedConv(),
    FusedConvToConv(),
]
