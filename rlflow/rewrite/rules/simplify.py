"""Simplifications that never cost anything: drop no-ops and pairs that cancel, fold constants.

- Identity(x) -> x
- Dropout(x, ratio?, training?) -> x                 (inference: training off, mask unread)
- Reshape(Reshape(x, s1), s2) -> Reshape(x, s)        (s the static final shape)
- Reshape(x, s) -> x                                  (the shape does not change)
- Transpose(Transpose(x, p), q) -> Transpose(x, p[q]) (or x when that is the identity)
- Transpose(x, identity) -> x
- Cast(Cast(x, to=U), to=T) -> x                      (x is T and T -> U is lossless)
- Cast(x, to=T) -> x                                  (x is T already)
- Concat(Split(x)) -> x                               (every part, in order, same axis)
- Relu(Split(x)[0]), Relu(Split(x)[1]), ... -> Split(Relu(x))   (any one elementwise unary op,
  the same on every part: after merging sibling convs, this lets Concat(Split) cancel)
- Op(c1, c2, ...) -> c                                (all inputs constant; result <= 4M values)
- Op(x, ...), Op(x, ...) -> one Op(x, ...)            (the same op, attributes and inputs)
- MatMul(x, Transpose(w)) -> MatMul(x, w')            (w constant, w' = transpose(w))
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import TensorProto as T

from rlflow.graph import Graph, Node
from rlflow.graph.domains import STANDARD_DOMAINS
from rlflow.graph.shapes import NONDETERMINISTIC_OPS, evaluate_node
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement, Rule
from rlflow.rewrite.rules.common import pick, shape

MAX_FOLDED = 1 << 22
# T -> U such that Cast(Cast(x, U), T) == x for every x of type T.
_LOSSLESS = {
    T.FLOAT16: {T.FLOAT, T.DOUBLE},
    T.FLOAT: {T.DOUBLE},
    T.INT8: {T.INT16, T.INT32, T.INT64, T.FLOAT, T.DOUBLE},
    T.UINT8: {T.INT16, T.UINT16, T.INT32, T.UINT32, T.INT64, T.UINT64, T.FLOAT, T.DOUBLE},
    T.INT16: {T.INT32, T.INT64, T.FLOAT, T.DOUBLE},
    T.INT32: {T.INT64, T.DOUBLE},
    T.BOOL: {T.INT8, T.UINT8, T.INT16, T.INT32, T.INT64, T.FLOAT, T.DOUBLE},
}
_SHAPES = [(2, 3), (4, 5, 6), (1, 3, 2, 2)]


def alias_problem(graph: Graph, old: str, new: str) -> str | None:
    """Why `old` cannot simply be replaced by the existing value `new` (None if it can)."""
    if graph.value(old).shape != graph.value(new).shape:
        return f"{old!r} is {graph.value(old).shape}, {new!r} is {graph.value(new).shape}"
    if graph.is_output(old) and (graph.producer(new) is None or graph.is_output(new)):
        return f"{old!r} is a graph output and {new!r} cannot take its name"
    return None


class _Elimination(PatternRule):
    """A no-op: the pattern's output is its input `x`."""

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        return Replacement([], [match["x"]])

    def check(self, graph: Graph, match: Match) -> str | None:
        return self.no_op_reason(graph, match) or alias_problem(graph, match.outputs[0], match["x"])

    def no_op_reason(self, graph: Graph, match: Match) -> str | None:
        return None


class IdentityElim(_Elimination):
    name = "identity-elim"
    description = "Identity(x) -> x"
    pattern = "Identity(x)"

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        x = b.input(pick(setting, _SHAPES))
        return b.model(b.op("Relu", [b.op("Identity", [b.op("Neg", [x])])]))


class DropoutElim(_Elimination):
    name = "dropout-elim"
    description = "Dropout(x) -> x  (inference: training off, mask unread)"
    pattern = "Dropout(x, ratio?, training?)"

    def no_op_reason(self, graph: Graph, match: Match) -> str | None:
        training = match["training"]
        if training and not (graph.is_constant(training) and not graph.constant(training).any()):
            return "training_mode is not a constant false"
        return None

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        x = b.input(pick(setting, _SHAPES))
        ratio = b.const(0.3)
        return b.model(b.op("Relu", [b.op("Dropout", [b.op("Neg", [x]), ratio])]))


class ReshapeReshapeFold(PatternRule):
    name = "reshape-reshape-fold"
    description = "Reshape(Reshape(x, s1), s2) -> Reshape(x, s)"
    pattern = "Reshape(Reshape(x, s1), s2)"
    target_ops = {"Reshape": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if 0 in shape(graph, match.outputs[0]):
            return "the result is empty (a 0 in a shape means 'copy' to Reshape)"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        target = emit.const(np.array(shape(graph, match.outputs[0]), dtype=np.int64), "shape")
        return emit.result(emit.op("Reshape", [match["x"], target]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(2, 3, 4), (6, 5), (1, 2, 3, 4)])
        x = b.input(dims)
        size = int(np.prod(dims))
        first = b.op("Reshape", [x, b.const([size], np.int64)])
        return b.model(b.op("Reshape", [first, b.const([-1, dims[-1]], np.int64)]))


class ReshapeNoopElim(_Elimination):
    name = "reshape-noop-elim"
    description = "Reshape(x, s) -> x  (shape unchanged)"
    pattern = "Reshape(x, s)"

    def no_op_reason(self, graph: Graph, match: Match) -> str | None:
        if shape(graph, match["x"]) != shape(graph, match.outputs[0]):
            return "the reshape changes the shape"
        return None

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, _SHAPES)
        x = b.op("Neg", [b.input(dims)])
        return b.model(b.op("Reshape", [x, b.const([*dims[:-1], -1], np.int64)]))


def _perm(node: Node, rank: int) -> list[int]:
    perm = node.attr("perm")
    return list(perm) if perm is not None else list(range(rank))[::-1]


class TransposeTransposeFold(PatternRule):
    name = "transpose-transpose-fold"
    description = "Transpose(Transpose(x, p), q) -> Transpose(x, p[q]) or x"
    pattern = "Transpose(t=Transpose(x))"
    target_ops = {"Transpose": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if self._composed(graph, match) == list(range(len(shape(graph, match["x"])))):
            return alias_problem(graph, match.outputs[0], match["x"])
        return None

    def _composed(self, graph: Graph, match: Match) -> list[int]:
        rank = len(shape(graph, match["x"]))
        first, second = _perm(match.node("t"), rank), _perm(match.nodes[0], rank)
        return [first[axis] for axis in second]

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        perm = self._composed(graph, match)
        if perm == list(range(len(perm))):
            return Replacement([], [match["x"]])
        emit = Emitter(graph)
        return emit.result(emit.op("Transpose", [match["x"]], perm=perm))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims, p, q = pick(
            setting,
            [
                ((2, 3, 4), [1, 0, 2], [0, 2, 1]),
                ((2, 3), [1, 0], [1, 0]),
                ((1, 2, 3, 4), [0, 2, 1, 3], [0, 1, 3, 2]),
            ],
        )
        x = b.op("Neg", [b.input(dims)])
        return b.model(b.op("Transpose", [b.op("Transpose", [x], perm=p)], perm=q))


class TransposeNoopElim(_Elimination):
    name = "transpose-noop-elim"
    description = "Transpose(x, identity) -> x"
    pattern = "Transpose(x)"

    def no_op_reason(self, graph: Graph, match: Match) -> str | None:
        rank = len(shape(graph, match["x"]))
        if _perm(match.nodes[0], rank) != list(range(rank)):
            return "the permutation is not the identity"
        return None

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, _SHAPES)
        x = b.op("Neg", [b.input(dims)])
        return b.model(b.op("Transpose", [x], perm=list(range(len(dims)))))


class CastCastElim(_Elimination):
    name = "cast-cast-elim"
    description = "Cast(Cast(x, U), T) -> x  (x is T, T -> U lossless)"
    pattern = "Cast(t=Cast(x))"
    target_ops = {}

    def no_op_reason(self, graph: Graph, match: Match) -> str | None:
        source = graph.value(match["x"]).dtype
        middle = match.node("t").attr("to")
        if match.nodes[0].attr("to") != source:
            return "the second cast does not go back to the input's type"
        if middle not in _LOSSLESS.get(source, ()) and middle != source:
            return "the first cast loses information"
        return None

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        x = b.op("Neg", [b.input(pick(setting, _SHAPES))])
        wide = b.op("Cast", [x], to=T.DOUBLE)
        return b.model(b.op("Relu", [b.op("Cast", [wide], to=T.FLOAT)]))


class CastNoopElim(_Elimination):
    name = "cast-noop-elim"
    description = "Cast(x, T) -> x  (x is T)"
    pattern = "Cast(x)"

    def no_op_reason(self, graph: Graph, match: Match) -> str | None:
        if match.nodes[0].attr("to") != graph.value(match["x"]).dtype:
            return "the cast changes the type"
        return None

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        x = b.op("Neg", [b.input(pick(setting, _SHAPES))])
        return b.model(b.op("Relu", [b.op("Cast", [x], to=T.FLOAT)]))


class SplitConcatElim(Rule):
    """Concat(Split(x)) -> x: the Concat reads every part of one Split, in order."""

    name = "split-concat-elim"
    description = "Concat(Split(x)) -> x"
    anchor_ops = ("Concat",)
    source_ops = {"Split": 1, "Concat": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        split = graph.producer(anchor.inputs[0]) if anchor.inputs else None
        if split is None or split.op_type != "Split" or anchor.inputs != split.outputs:
            return
        rank = len(shape(graph, split.inputs[0]))
        if split.attr("axis", 0) % rank != anchor.attr("axis") % rank:
            return
        yield Match((anchor,), {"x": split.inputs[0]}, (anchor.outputs[0],), keep=(split,))

    def check(self, graph: Graph, match: Match) -> str | None:
        return alias_problem(graph, match.outputs[0], match["x"])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        return Replacement([], [match["x"]])

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(2, 6), (4, 4, 3), (1, 6, 2, 2)])
        x = b.op("Neg", [b.input(dims)])
        parts = b.op("Split", [x, b.const([2, dims[1] - 2], np.int64)], outputs=2, axis=1)
        return b.model(b.op("Relu", [b.op("Concat", parts, axis=-len(dims) + 1)]))


_UNARY = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "Sigmoid",
        "Tanh",
        "Neg",
        "Abs",
        "Exp",
        "Erf",
        "Elu",
        "Selu",
        "Softplus",
        "HardSigmoid",
        "Clip",
    }
)


class SplitUnaryHoist(Rule):
    """The same elementwise op on every part of a Split is applied once, before the Split."""

    name = "split-unary-hoist"
    description = "Relu(Split(x)[i]) for every i -> Split(Relu(x))[i]"
    anchor_ops = ("Split",)
    source_ops = {"Split": 1, "Relu": 2}
    target_ops = {"Relu": 1, "Split": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        readers = []
        for part in anchor.outputs:
            consumers = graph.consumers(part)
            if len(consumers) != 1 or graph.is_output(part):
                return
            readers.append(consumers[0])
        first = readers[0]
        if first.op_type not in _UNARY or first.domain or len(first.present_inputs) != 1:
            return
        attrs = {key: proto.SerializeToString() for key, proto in first.attrs.items()}
        for reader in readers:
            same = {key: proto.SerializeToString() for key, proto in reader.attrs.items()}
            if reader.op_type != first.op_type or reader.domain or same != attrs:
                return
            if len(reader.present_inputs) != 1:
                return
        if len({id(reader) for reader in readers}) != len(readers):
            return
        outputs = tuple(reader.outputs[0] for reader in readers)
        yield Match((anchor, *readers), {"x": anchor.inputs[0]}, outputs)

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        split, first = match.nodes[0], match.nodes[1]
        emit = Emitter(graph)
        hoisted = emit.copy(first, [match["x"]])
        parts = emit.copy(split, [hoisted, *split.inputs[1:]], outputs=len(split.outputs))
        return emit.result(*(parts if len(split.outputs) > 1 else [parts]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(2, 6), (4, 4, 3), (1, 6, 2, 2)])
        x = b.op("Neg", [b.input(dims)])
        parts = b.op("Split", [x, b.const([2, dims[1] - 2], np.int64)], outputs=2, axis=1)
        op = pick(setting, ["Relu", "Sigmoid", "Relu"])
        return b.model(b.op("Concat", [b.op(op, [part]) for part in parts], axis=1))


class ConstantFold(Rule):
    """A node whose inputs are all constants becomes a constant (results up to MAX_FOLDED)."""

    name = "constant-fold"
    description = "Op(c1, c2, ...) -> c  (all inputs constant)"
    anchor_ops = None
    source_ops = {"*": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        inputs = anchor.present_inputs
        if not inputs or anchor.domain not in STANDARD_DOMAINS:
            return
        if anchor.op_type in NONDETERMINISTIC_OPS or not all(map(graph.is_constant, inputs)):
            return
        if _has_subgraph(anchor):
            return
        outputs = tuple(name for name in anchor.outputs if name)
        yield Match((anchor,), {}, outputs)

    def check(self, graph: Graph, match: Match) -> str | None:
        for name in match.outputs:
            if graph.value(name).numel > MAX_FOLDED:
                return f"{name!r} has {graph.value(name).numel} elements (cap {MAX_FOLDED})"
            if graph.is_output(name):
                return f"{name!r} is a graph output"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        node = match.nodes[0]
        proto = onnx.NodeProto(op_type=node.op_type, input=node.inputs, output=node.outputs)
        proto.attribute.extend(node.attrs.values())
        constants = {name: graph.initializers[name] for name in node.present_inputs}
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in graph.opset.items()]
        results = evaluate_node(proto, constants, opsets)
        if results is None:
            from rlflow.rewrite.replacement import RewriteRejected

            raise RewriteRejected(f"cannot evaluate {node.op_type}")
        emit = Emitter(graph)
        by_name = dict(zip([o for o in node.outputs if o], results, strict=False))
        names = [emit.const(np.asarray(by_name[name]), "folded") for name in match.outputs]
        return emit.result(*names)

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(64, 80), (3, 100, 20), (70, 70)])
        x = b.input(dims[:-1] + (dims[-1],))
        weight = b.op("Transpose", [b.const(dims[::-1])])  # too big for load-time folding
        return b.model(b.op("Add", [x, b.op("Relu", [weight])]))


class CommonSubexpressionElim(Rule):
    """A node computing what an earlier one computes becomes that node: the same op and
    attributes on the same inputs (a constant input the same values under any name), and so
    on down its readers that then compute what the earlier one's readers do.

    onnxruntime's `CommonSubexpressionElimination` does this at load, but a model that runs as
    written never meets it, and per-site rewrites leave such twins where one tensor has several
    readers: each blocked projection reshapes and reorders its own copy of the input that the
    query, key and value projections share. The chain goes in one step, so that a twin that
    costs nothing alone (a Reshape) takes the one that costs (the reorder after it) along.
    Anchored at the later twin, which goes. The result hashes as the graph it came from (the
    hash is of what the outputs compute), so a search never offers it as a step of its own:
    every graph a search hands back goes through `merge_twins` instead.
    """

    name = "common-subexpression-elim"
    description = "Op(x, ...), Op(x, ...) -> Op(x, ...)  (the same op, attributes and inputs)"
    anchor_ops = None
    source_ops = {"*": 2}
    target_ops = {"*": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        computed = [name for name in anchor.present_inputs if not graph.is_constant(name)]
        if not computed or not _deterministic(anchor):
            return
        readers = graph.consumers(computed[0])
        for earlier in readers[: next(i for i, r in enumerate(readers) if r is anchor)]:
            if _same_computation(graph, earlier, anchor, {}):
                twins = _twin_chain(graph, anchor, earlier)
                outputs = tuple(name for node in twins for name in node.outputs if name)
                yield Match(tuple(twins), {}, outputs, keep=tuple(twins.values()))
                return

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        twin_of = _output_twins(dict(zip(match.nodes, match.keep, strict=True)))
        return Emitter(graph).result(*[twin_of[name] for name in match.outputs])

    def example(self, setting: int) -> onnx.ModelProto:
        """Two readers of one input, each through its own twin: Reshapes whose shapes are equal
        constants under two names (0), Convs of one weight (1), Splits into two parts (2)."""
        b = ModelBuilder()
        if setting == 0:
            x = b.input((4, 6))
            twins = [b.op("Reshape", [x, b.const([2, 12], np.int64)]) for _ in "ab"]
        elif setting == 1:
            x, weight = b.input((1, 3, 5, 5)), b.const((4, 3, 3, 3))
            twins = [b.op("Conv", [x, weight], pads=[1, 1, 1, 1]) for _ in "ab"]
        else:
            x, sizes = b.input((2, 6)), b.const([2, 4], np.int64)
            twins = [b.op("Split", [x, sizes], outputs=2, axis=1)[1] for _ in "ab"]
        return b.model(b.op("Relu", [twins[0]]), b.op("Sigmoid", [twins[1]]))


def merge_twins(graph: Graph) -> tuple[Graph, int]:
    """`graph` with every twin merged into the earlier node it repeats, and how many steps
    of `common-subexpression-elim` that took (0: `graph` itself, unchanged)."""
    return CommonSubexpressionElim().apply_everywhere(graph)


def _has_subgraph(node: Node) -> bool:
    return any(
        p.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for p in node.attrs.values()
    )


def _deterministic(node: Node) -> bool:
    return node.op_type not in NONDETERMINISTIC_OPS and not _has_subgraph(node)


def _output_twins(twins: dict[Node, Node]) -> dict[str, str]:
    """Each later twin's output, mapped to the earlier twin's output it equals."""
    return {
        ours: theirs
        for later, earlier in twins.items()
        for ours, theirs in zip(later.outputs, earlier.outputs, strict=True)
        if ours
    }


def _twin_chain(graph: Graph, later: Node, earlier: Node) -> dict[Node, Node]:
    """`later` and every node below it that computes what a node below `earlier` does, once
    the twins above are one: later node -> its earlier twin, in graph order."""
    twins = {later: earlier}
    same = _output_twins(twins)
    frontier = [later]
    while frontier:
        node = frontier.pop()
        for name in (n for n in node.outputs if n):
            for reader in graph.consumers(name):
                if reader in twins or not _deterministic(reader):
                    continue
                partner = graph.consumers(same[name])
                found = next(
                    (
                        e
                        for e in partner
                        if e is not reader
                        and e not in twins
                        and _same_computation(graph, e, reader, same)
                    ),
                    None,
                )
                if found is not None:
                    twins[reader] = found
                    same.update(_output_twins({reader: found}))
                    frontier.append(reader)
    position = {id(node): index for index, node in enumerate(graph.nodes)}
    return dict(sorted(twins.items(), key=lambda pair: position[id(pair[0])]))


def _same_computation(graph: Graph, one: Node, other: Node, same: dict[str, str]) -> bool:
    """Whether two nodes compute the same outputs: op, attributes and inputs alike (constants
    by value; `other`'s inputs through `same`, the values already known to be twins), and
    every output `other` has, `one` has too."""
    if (one.op_type, one.domain, len(one.inputs)) != (
        other.op_type,
        other.domain,
        len(other.inputs),
    ):
        return False
    if len(one.outputs) != len(other.outputs) or any(
        theirs and not ours for ours, theirs in zip(one.outputs, other.outputs, strict=True)
    ):
        return False
    if {k: v.SerializeToString() for k, v in one.attrs.items()} != {
        k: v.SerializeToString() for k, v in other.attrs.items()
    }:
        return False
    for ours, theirs in zip(one.inputs, other.inputs, strict=True):
        if ours == same.get(theirs, theirs):
            continue
        a, b = graph.constant(ours), graph.constant(theirs)
        if a is None or b is None or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if not np.array_equal(a, b):
            return False
    return True


class MatMulTransposeWeightFold(PatternRule):
    name = "matmul-transpose-weight-fold"
    description = "MatMul(x, Transpose(w)) -> MatMul(x, w')  (w constant)"
    pattern = "MatMul(x, Transpose(w))"
    target_ops = {"MatMul": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if not graph.is_constant(match["w"]):
            return "the transposed operand is not a constant"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        weight = graph.constant(match["w"])
        transpose = match.nodes[1]
        emit = Emitter(graph)
        folded = emit.const(np.transpose(weight, _perm(transpose, weight.ndim)), "weight")
        return emit.result(emit.op("MatMul", [match["x"], folded]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        m, k, n = pick(setting, [(4, 70, 80), (2, 96, 64), (8, 128, 40)])
        x = b.input((m, k))
        weight = b.op("Transpose", [b.const((n, k))], perm=[1, 0])
        return b.model(b.op("MatMul", [x, weight]))


RULES = [
    IdentityElim(),
    DropoutElim(),
    ReshapeReshapeFold(),
    ReshapeNoopElim(),
    TransposeTransposeFold(),
    TransposeNoopElim(),
    CastCastElim(),
    CastNoopElim(),
    SplitConcatElim(),
    SplitUnaryHoist(),
    ConstantFold(),
    CommonSubexpressionElim(),
    MatMulTransposeWeightFold(),
]
