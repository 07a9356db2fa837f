"""Transformer rules: merge the projections that share an input, fold the attention scale.

- MatMul(x, Wq) [+ bq], MatMul(x, Wk) [+ bk], ... -> Split(MatMul(x, [Wq Wk ...]) [+ [bq bk ...]])
  and back (one bidirectional rule, so that a learner can undo a merge)
- Softmax(MatMul(q, k) * c) -> Softmax(MatMul(q', k))   (c a constant scalar; q computed from
  MatMul(x, W) [+ b] through Reshape/Transpose only, each read once: W, b scaled by c)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from rlflow.graph import Graph, Node
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement, Rule, both_ways
from rlflow.rewrite.rules.common import emit_split, only_reader, pick, rank, scalar, split_sizes


@dataclass(frozen=True)
class Projection:
    """MatMul(x, W) with W a constant matrix, and the Add of a constant bias vector if any."""

    matmul: Node
    add: Node | None
    weight: np.ndarray
    bias: np.ndarray | None

    @property
    def output(self) -> str:
        return (self.add or self.matmul).outputs[0]

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.matmul, self.add) if self.add else (self.matmul,)


def _bias_of(graph: Graph, add: Node, value: str, width: int) -> np.ndarray | None:
    """The constant vector that `add` adds to `value`, if it is one of length `width`."""
    if add.op_type != "Add" or add.domain or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] == value else add.inputs[0]
    bias = graph.constant(other)
    if other == value or bias is None or bias.shape != (width,):
        return None
    return bias


def matmul_projection(graph: Graph, matmul: Node, with_bias: bool = True) -> Projection | None:
    if matmul.op_type != "MatMul" or matmul.domain:
        return None
    weight = graph.constant(matmul.inputs[1])
    if weight is None or weight.ndim != 2 or graph.is_constant(matmul.inputs[0]):
        return None
    output = matmul.outputs[0]
    readers = graph.consumers(output)
    if with_bias and len(readers) == 1 and not graph.is_output(output):
        bias = _bias_of(graph, readers[0], output, weight.shape[1])
        if bias is not None:
            return Projection(matmul, readers[0], weight, bias)
    return Projection(matmul, None, weight, None)


class MatMulSiblingsMerge(Rule):
    """All projections of one input with the same K and bias-ness become one MatMul + Split."""

    name = "matmul-siblings-merge"
    description = (
        "MatMul(x, W1) + b1, MatMul(x, W2) + b2, ... -> Split(MatMul(x, [W1 W2 ...]) + [b1 b2 ...])"
    )
    reverse_description = "Split(MatMul(x, W) + b) -> MatMul(x, W1) + b1, MatMul(x, W2) + b2, ..."
    anchor_ops = ("MatMul",)
    reverse_anchor_ops = ("Split",)
    source_ops = {"MatMul": 2, "Add": 2}
    target_ops = {"MatMul": 1, "Add": 1, "Split": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        if self.reverse:
            yield from self._split_matches(graph, anchor)
            return
        first = matmul_projection(graph, anchor)
        if first is None:
            return
        x = anchor.inputs[0]

        def key(p: Projection) -> tuple:
            return p.weight.shape[0], p.weight.dtype, p.bias is not None

        group = [
            p
            for c in graph.consumers(x)
            if c.inputs[0] == x
            for p in [matmul_projection(graph, c)]
            if p is not None and key(p) == key(first)
        ]
        if len(group) < 2 or group[0].matmul is not anchor:
            return
        nodes = tuple(node for p in group for node in p.nodes)
        yield Match(nodes, {"x": x}, tuple(p.output for p in group))

    def _split_matches(self, graph: Graph, split: Node) -> Iterator[Match]:
        source = graph.producer(split.inputs[0])
        if source is None or not only_reader(graph, split.inputs[0], split):
            return
        matmul = source
        if source.op_type == "Add":
            matmul = next((graph.producer(i) for i in source.inputs if graph.producer(i)), None)
            if matmul is None or not only_reader(graph, matmul.outputs[0], source):
                return
        projection = matmul_projection(graph, matmul)
        if projection is None or projection.output != split.inputs[0]:
            return
        if split.attr("axis", 0) % rank(graph, split.inputs[0]) != rank(graph, split.inputs[0]) - 1:
            return
        if split_sizes(graph, split) is None:
            return
        yield Match((split, *projection.nodes), {"x": matmul.inputs[0]}, tuple(split.outputs))

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        x = match["x"]
        if self.reverse:
            split = match.nodes[0]
            projection = matmul_projection(graph, match.nodes[1])
            bounds = np.cumsum([0, *split_sizes(graph, split)])
            outputs = []
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=False):
                part = emit.op("MatMul", [x, emit.const(projection.weight[:, lo:hi], "weight")])
                if projection.bias is not None:
                    part = emit.op("Add", [part, emit.const(projection.bias[lo:hi], "bias")])
                outputs.append(part)
            return emit.result(*outputs)
        group = [matmul_projection(graph, node) for node in match.nodes if node.op_type == "MatMul"]
        weight = emit.const(np.concatenate([p.weight for p in group], axis=1), "weight")
        merged = emit.op("MatMul", [x, weight])
        if group[0].bias is not None:
            bias = emit.const(np.concatenate([p.bias for p in group]), "bias")
            merged = emit.op("Add", [merged, bias])
        axis = rank(graph, match.outputs[0]) - 1
        return emit.result(
            *emit_split(emit, graph, merged, [p.weight.shape[1] for p in group], axis)
        )

    def example(self, setting: int) -> onnx.ModelProto:
        lead, k = pick(setting, [((2,), 8), ((1, 5), 6), ((2, 3, 4), 4)])
        b = ModelBuilder()
        x = b.op("Neg", [b.input((*lead, k))])
        biased = setting != 1
        widths = [(3, 5), (4, 4, 4), (2, 6)][setting % 3]
        if self.reverse:
            merged = b.op("MatMul", [x, b.const((k, sum(widths)))])
            if biased:
                merged = b.op("Add", [b.const((sum(widths),)), merged])
            sizes = b.const(list(widths), np.int64)
            return b.model(*b.op("Split", [merged, sizes], outputs=len(widths), axis=-1))
        outputs = []
        for width in widths:
            out = b.op("MatMul", [x, b.const((k, width))])
            outputs.append(b.op("Add", [out, b.const((width,))]) if biased else out)
        return b.model(*[b.op("Relu", [o]) for o in outputs])


_MOVERS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten")


def _scalable_chain(graph: Graph, value: str, reader: Node) -> list[Node] | None:
    """From `value` back to MatMul(x, W const): Reshape/Transpose-like nodes (which commute with
    a scalar factor) and at most one Add of a constant, each read only by the next."""
    chain: list[Node] = []
    seen_bias = False
    while True:
        node = graph.producer(value)
        if node is None or node.domain or not only_reader(graph, value, reader):
            return None
        chain.append(node)
        if node.op_type in _MOVERS:
            value, reader = node.inputs[0], node
        elif node.op_type == "Add" and not seen_bias:
            constants = [i for i in node.inputs if graph.is_constant(i)]
            if len(constants) != 1 or len(node.inputs) != 2:
                return None
            value = next(i for i in node.inputs if i != constants[0])
            reader, seen_bias = node, True
        elif node.op_type == "MatMul" and graph.is_constant(node.inputs[1]):
            return chain
        else:
            return None


class SoftmaxScaleFold(PatternRule):
    """The attention scale moves into the constant weight (and bias) that computes q or k."""

    name = "softmax-scale-fold"
    description = "Softmax(MatMul(q, k) * c) -> Softmax(MatMul(q', k))  (c into q's weight)"
    pattern = ("Softmax(s=Mul(p=MatMul(q, k), c))", "Softmax(s=Div(p=MatMul(q, k), c))")
    target_ops = {"Softmax": 1, "MatMul": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        for match in super().matches(graph, anchor):
            softmax, scale, product = match.nodes[0], match.node("s"), match.node("p")
            if match["q"] == match["k"]:
                continue
            for operand in ("q", "k"):
                chain = _scalable_chain(graph, match[operand], product)
                if chain is None:
                    continue
                replaced = [n for n in chain if n.op_type in ("Add", "MatMul")]
                yield Match(
                    (scale, *replaced),
                    match.bindings,
                    (scale.outputs[0], replaced[0].outputs[0]),
                    keep=(softmax, product),
                    pattern_index=match.pattern_index,
                )
                break

    def check(self, graph: Graph, match: Match) -> str | None:
        value = scalar(graph, match["c"])
        if value is None or value == 0:
            return "the scale is not a non-zero constant scalar"
        if rank(graph, match["c"]) > rank(graph, match["p"]):
            return "the scale broadcasts the scores to a higher rank"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        value = scalar(graph, match["c"])
        factor = value if match.pattern_index == 0 else 1 / value
        scale, *replaced = match.nodes
        emit = Emitter(graph)
        matmul = replaced[-1]
        weight = graph.constant(matmul.inputs[1])
        output = emit.op(
            "MatMul", [matmul.inputs[0], emit.const(weight * weight.dtype.type(factor))]
        )
        if len(replaced) == 2:
            add = replaced[0]
            bias_name = next(i for i in add.inputs if graph.is_constant(i))
            bias = graph.constant(bias_name)
            new_bias = emit.const(bias * bias.dtype.type(factor), "bias")
            inputs = [new_bias if i == bias_name else output for i in add.inputs]
            output = emit.op("Add", inputs)
        return emit.result(match["p"], output)

    def example(self, setting: int) -> onnx.ModelProto:
        seq, heads, dim = pick(setting, [(4, 2, 3), (5, 1, 4), (3, 3, 2)])
        b = ModelBuilder()
        x = b.input((1, seq, heads * dim))

        def project(perm: list[int]) -> str:
            h = b.op("MatMul", [x, b.const((heads * dim, heads * dim))])
            if setting != 1:
                h = b.op("Add", [b.const((heads * dim,)), h])
            h = b.op("Reshape", [h, b.const([1, seq, heads, dim], np.int64)])
            return b.op("Transpose", [h], perm=perm)

        q, k = project([0, 2, 1, 3]), project([0, 2, 3, 1])
        op = "Div" if setting == 2 else "Mul"
        scores = b.op(op, [b.op("MatMul", [q, k]), b.const(dim**-0.5 if op == "Mul" else 2.0)])
        return b.model(b.op("Softmax", [scores], axis=-1))


RULES = [
    *both_ways(MatMulSiblingsMerge),
    SoftmaxScaleFold(),
]
