"""Select rows early: a Slice, or a Gather of one index, moves above the ops computing its input.

- Slice_a(f(x, y, ...)) -> f(Slice_a'(x), y, ...)      (a' the axis of x that axis a of f's
  output comes from; inputs broadcast along a are read whole)
- Gather_a(f(x, ...), i) -> Reshape(f(Slice_a'(x, i:i+1), ...))   (one constant index: the same
  rows, then the axis dropped)

A model that reads one row of a long computation -- ViT's head on the class token, a BERT
classifier on its first token -- computes every row of its last layer and keeps one. Moving
the selection up makes each op compute only the rows that are read: in ViT's last layer the
feed-forward, the output projection, the query projection and the attention scores shrink to
one row of 65, and only the keys and values still need every token (1.20x end to end at the
medium size, 1.07x at full; docs/BENCHMARKS.md). onnxruntime has no such pass for inference.
`f` is any op that computes each index along the axis from the same index of its inputs:
elementwise ops (with broadcasting), normalisations and Softmax over other axes, the rows of
MatMul / Gemm / FusedMatMul, Transpose, a Reshape that keeps the axis whole, Concat along
another axis.

One step moves the selection as far up as the ops only it reads allow (see `SliceHoist`).
Where `f`'s output is also read elsewhere, `f` stays for those readers and the selected rows
are computed a second time (one row of a LayerNorm, say): the search prices that against what
the move saves further up. Moving a selection never computes more rows than before, so the
rule has no reverse. Where the graph already selects the same rows of an input, the rewrite
reads that selection instead of making a second (a search's graph hash counts the two as one
graph anyway).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
import onnx

from rlflow.graph import MS_DOMAIN, Graph, Node
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, Replacement, Rule
from rlflow.rewrite.rules.common import opset, shape

_ELEMENTWISE = {
    "": frozenset(
        {
            *("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "PRelu"),
            *("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Log", "Erf"),
            *("Elu", "Selu", "Softplus", "Softsign", "HardSigmoid", "HardSwish", "Clip"),
            *("Sqrt", "Reciprocal", "Cast", "Gelu", "Mish", "Identity"),
        }
    ),
    MS_DOMAIN: frozenset({"Gelu", "FastGelu", "BiasGelu", "QuickGelu"}),
}
_LAST_AXIS_NORMS = frozenset(
    {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"}
)


@dataclasses.dataclass(frozen=True)
class Selection:
    """Rows [start, end) along `axis` of a tensor; `drop` when a Gather also drops the axis."""

    axis: int
    start: int
    end: int
    drop: bool = False

    @property
    def rows(self) -> Selection:
        """The rows alone, the axis kept (what a Slice of them selects)."""
        return Selection(self.axis, self.start, self.end)

    def along(self, axis: int) -> Selection:
        """The same rows along another axis (of an input)."""
        return Selection(axis, self.start, self.end)

    def of(self, dims: Sequence[int]) -> tuple[int, ...]:
        """The shape of these rows of a tensor of shape `dims`."""
        return (*dims[: self.axis], self.end - self.start, *dims[self.axis + 1 :])


def selection(graph: Graph, node: Node) -> Selection | None:
    """What a Slice (one axis, step 1, constant bounds) or a Gather of one constant index
    selects from its input, bounds resolved against its shape; None for anything else and for
    a selection of the whole axis."""
    if node.domain or not node.inputs:
        return None
    dims = shape(graph, node.inputs[0])
    if node.op_type == "Gather" and len(node.inputs) == 2:
        index = graph.constant(node.inputs[1])
        if index is None or index.size != 1 or index.dtype.kind not in "iu":
            return None
        axis = node.attr("axis", 0) % len(dims)
        start = int(index.reshape(())) % dims[axis]
        return Selection(axis, start, start + 1, drop=index.ndim == 0)
    if node.op_type != "Slice" or opset(graph) < 10 or len(node.inputs) < 3:
        return None
    bounds = [graph.constant(name) if name else None for name in node.inputs[1:5]]
    starts, ends = bounds[0], bounds[1]
    if starts is None or ends is None or starts.size != 1 or ends.size != 1:
        return None
    axes, steps = (bounds + [None, None])[2:4]
    if len(node.inputs) > 3 and node.inputs[3] and axes is None:
        return None
    if len(node.inputs) > 4 and node.inputs[4] and (steps is None or int(steps.reshape(())) != 1):
        return None
    axis = int(axes.reshape(())) % len(dims) if axes is not None else 0
    dim = dims[axis]
    start, end = (
        int(np.clip(v + dim if v < 0 else v, 0, dim))
        for v in (int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0]))
    )
    if start >= end or end - start == dim:
        return None
    return Selection(axis, start, end)


def input_axes(graph: Graph, node: Node, axis: int) -> list[int | None] | None:
    """Per input of `node`, the axis its rows along output axis `axis` come from (None: the
    input is read whole, broadcast along it or not indexed by it); None when `node` mixes rows
    along that axis or is an op this rule does not know."""
    if len([name for name in node.outputs if name]) != 1 and node.op_type not in (
        "LayerNormalization",
        *_LAST_AXIS_NORMS,
    ):
        return None
    rank = len(shape(graph, node.outputs[0]))
    op, domain = node.op_type, node.domain
    if op in _ELEMENTWISE.get(domain, ()):
        return _broadcast_axes(graph, node, axis)
    if domain == "" and op == "LayerNormalization":
        return _broadcast_axes(graph, node, axis) if axis < node.attr("axis", -1) % rank else None
    if domain == MS_DOMAIN and op in _LAST_AXIS_NORMS:
        return _broadcast_axes(graph, node, axis) if axis < rank - 1 else None
    if domain == "" and op in ("Softmax", "LogSoftmax"):
        softmax = node.attr("axis", -1 if opset(graph) >= 13 else 1) % rank
        mixed = axis == softmax if opset(graph) >= 13 else axis >= softmax
        return None if mixed else _broadcast_axes(graph, node, axis)
    if op in ("MatMul", "FusedMatMul") and domain == ("" if op == "MatMul" else MS_DOMAIN):
        return _matmul_axes(graph, node, axis, rank)
    if domain == "" and op == "Gemm":
        if axis != 0:
            return None
        bias = [] if len(node.present_inputs) < 3 else [_gemm_bias_axis(graph, node)]
        return [1 if node.attr("transA", 0) else 0, None, *bias]
    if domain == "" and op == "Transpose":
        perm = node.attr("perm") or list(range(rank))[::-1]
        return [perm[axis]]
    if domain == "" and op == "Reshape":
        source = _reshape_source_axis(
            shape(graph, node.inputs[0]), shape(graph, node.outputs[0]), axis
        )
        return None if source is None else [source, None]
    if domain == "" and op == "Concat":
        return None if node.attr("axis") % rank == axis else [axis] * len(node.inputs)
    return None


def _broadcast_axes(graph: Graph, node: Node, axis: int) -> list[int | None] | None:
    """Numpy broadcasting: an input's axis aligned from the right, None where it has no such
    axis or a 1 that broadcasts."""
    out = shape(graph, node.outputs[0])
    axes: list[int | None] = []
    for name in node.inputs:
        dims = shape(graph, name) if name else ()
        k = axis - (len(out) - len(dims))
        if not name or k < 0 or (dims[k] == 1 and out[axis] != 1):
            axes.append(None)
        elif dims[k] == out[axis]:
            axes.append(k)
        else:
            return None
    return axes


def _matmul_axes(graph: Graph, node: Node, axis: int, rank: int) -> list[int | None] | None:
    """MatMul's output rows come from A's rows; batch axes broadcast as numpy's. Columns would
    slice the weights, and FusedMatMul's batch transposes move axes: neither is taken."""
    if node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
        return None
    a_dims, b_dims = (shape(graph, name) for name in node.inputs[:2])
    if len(a_dims) < 2 or len(b_dims) < 2 or axis == rank - 1:
        return None
    if axis == rank - 2:
        return [len(a_dims) - (1 if node.attr("transA", 0) else 2), None]
    axes: list[int | None] = []
    for dims in (a_dims, b_dims):
        k = axis - (rank - len(dims))
        axes.append(None if k < 0 or dims[k] == 1 else k)
    return axes


def _gemm_bias_axis(graph: Graph, node: Node) -> int | None:
    """Gemm's C broadcasts to (M, N): sliced along M only where it has M rows."""
    dims = shape(graph, node.inputs[2])
    return 0 if len(dims) == 2 and dims[0] != 1 else None


def _reshape_source_axis(before: Sequence[int], after: Sequence[int], axis: int) -> int | None:
    """The input axis that output axis `axis` of a Reshape is, whole: the same length, with the
    same number of elements before it (so every row is one contiguous block in both)."""
    outer = int(np.prod(after[:axis]))
    for k, dim in enumerate(before):
        if int(np.prod(before[:k])) == outer and dim == after[axis]:
            return k
    return None


class SliceHoist(Rule):
    """The anchor is the Slice or Gather. Where it is the only reader of its input, the
    selection moves up as far as it can in one step: through every op whose outputs only the
    moved selections read, along all of their inputs (a residual Add's two paths), so that a
    chain of free steps (a Reshape) never hides the gain behind it from a greedy search. Where
    its input is read elsewhere too, it moves above that one op, which stays for the others."""

    name = "slice-hoist"
    description = (
        "Slice_a(f(x, ...)) -> f(Slice_a'(x), ...)  (f row-wise along a; Gather of one index alike)"
    )
    anchor_ops = ("Slice", "Gather")
    source_ops = {"Slice": 1}
    target_ops = {"Slice": 1}
    settings = 11

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        chosen = selection(graph, anchor)
        producer = graph.producer(anchor.inputs[0]) if chosen is not None else None
        if producer is None or producer.outputs[0] != anchor.inputs[0]:
            return
        if input_axes(graph, producer, chosen.axis) is None:
            return
        outputs = (anchor.outputs[0],)
        if _read_only_by(graph, producer, {id(anchor)}):
            moved = _moved_through(graph, anchor, chosen.rows)
            yield Match((anchor, *moved), {"x": anchor.inputs[0]}, outputs)
        else:
            yield Match((anchor,), {"x": anchor.inputs[0]}, outputs, keep=(producer,))

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        anchor = match.nodes[0]
        chosen = selection(graph, anchor)
        moved = {node.outputs[0]: node for node in (*match.nodes[1:], *match.keep)}
        emit = Emitter(graph)
        built: dict[tuple[str, Selection], str] = {}

        def rows_of(value: str, rows: Selection) -> str:
            if (value, rows) in built:
                return built[value, rows]
            node = moved.get(value)
            if node is None:
                built[value, rows] = _slice(emit, graph, value, rows)
                return built[value, rows]
            axes = input_axes(graph, node, rows.axis)
            inputs = [
                name if axis is None else rows_of(name, rows.along(axis))
                for name, axis in zip(node.inputs, axes, strict=False)
            ]
            dims = rows.of(shape(graph, value))
            if node.op_type == "Reshape":
                inputs[1] = emit.const(np.array(dims, dtype=np.int64), "shape")
            out = emit.copy(node, inputs)
            emit.values[out] = dataclasses.replace(graph.value(value), name=out, shape=dims)
            built[value, rows] = out
            return out

        result = rows_of(anchor.inputs[0], chosen.rows)
        if chosen.drop:
            target = np.array(shape(graph, anchor.outputs[0]), dtype=np.int64)
            result = emit.op("Reshape", [result, emit.const(target, "shape")])
        return emit.result(result)

    def example(self, setting: int) -> onnx.ModelProto:
        return _hoist_example(setting)


def _moved_through(graph: Graph, anchor: Node, rows: Selection) -> list[Node]:
    """The ops a selection of `rows` of the anchor's input moves above: each is read only by
    the anchor and ops already in the list, each of its outputs is wanted in one selection of
    rows, and no op in the list reads it whole. Found by growing the set until nothing joins,
    so an op with two readers joins once both have."""
    inside, moved = {id(anchor)}, []
    wanted: dict[str, set[Selection]] = {anchor.inputs[0]: {rows}}
    whole: set[str] = set()
    grown = True
    while grown:
        grown = False
        for value, selections in list(wanted.items()):
            producer = graph.producer(value)
            if producer is None or id(producer) in inside or len(selections) != 1:
                continue
            if producer.outputs[0] != value or value in whole:
                continue
            if not _read_only_by(graph, producer, inside) or _extra_outputs_read(graph, producer):
                continue
            (chosen,) = selections
            axes = input_axes(graph, producer, chosen.axis)
            if axes is None or _conflicts(graph, producer, axes, chosen, inside, wanted):
                continue
            inside.add(id(producer))
            moved.append(producer)
            grown = True
            for name, axis in zip(producer.inputs, axes, strict=False):
                if name and axis is None:
                    whole.add(name)
                elif name:
                    wanted.setdefault(name, set()).add(chosen.along(axis))
    return moved


def _extra_outputs_read(graph: Graph, node: Node) -> bool:
    """A LayerNormalization's mean or inverse deviation is read: its copy computes only the
    normalised rows."""
    return any(name and graph.consumers(name) for name in node.outputs[1:])


def _conflicts(
    graph: Graph,
    node: Node,
    axes: Sequence[int | None],
    rows: Selection,
    inside: set[int],
    wanted: dict[str, set[Selection]],
) -> bool:
    """Whether moving above `node` would need a moved op's output whole, or in other rows than
    the ones it now computes."""
    for name, axis in zip(node.inputs, axes, strict=False):
        producer = graph.producer(name) if name else None
        if producer is None or id(producer) not in inside:
            continue
        if axis is None or wanted.get(name) != {rows.along(axis)}:
            return True
    return False


def _read_only_by(graph: Graph, producer: Node, readers: set[int]) -> bool:
    """Every reader of `producer`'s outputs is one of `readers` (ids); none is a graph output."""
    for name in producer.outputs:
        if not name:
            continue
        if graph.is_output(name) or any(id(r) not in readers for r in graph.consumers(name)):
            return False
    return True


def _slice(emit: Emitter, graph: Graph, name: str, rows: Selection) -> str:
    """`rows` of `name`: a constant sliced now, a Slice the graph has already, or a new one."""
    array = graph.constant(name)
    if array is not None:
        index = [slice(None)] * array.ndim
        index[rows.axis] = slice(rows.start, rows.end)
        return emit.const(np.ascontiguousarray(array[tuple(index)]), "rows")
    for reader in graph.consumers(name):
        if reader.op_type == "Slice" and reader.inputs[0] == name:
            if selection(graph, reader) == rows:
                return reader.outputs[0]

    def ints(value: int) -> str:
        return emit.const(np.array([value], dtype=np.int64), "slice")

    out = emit.op("Slice", [name, ints(rows.start), ints(rows.end), ints(rows.axis)])
    emit.values[out] = dataclasses.replace(
        graph.value(name), name=out, shape=rows.of(shape(graph, name))
    )
    return out


def _hoist_example(setting: int) -> onnx.ModelProto:
    """One row-wise op under a selection, per setting: the ops of a transformer's last layer."""
    b = ModelBuilder()
    x = b.input((2, 5, 8))

    def select(value: str, axis: int, rows: tuple[int, int] | int) -> str:
        if isinstance(rows, int):  # a Gather of one index
            return b.op("Gather", [value, b.const(rows, np.int64)], axis=axis)
        starts, ends, axes = ([v] for v in (*rows, axis))
        return b.op("Slice", [value, *(b.const(v, np.int64) for v in (starts, ends, axes))])

    if setting == 0:  # Add with a bias and a full operand, under a Gather
        summed = b.op("Add", [b.op("Add", [x, b.const((8,))]), b.op("Neg", [x])])
        return b.model(select(summed, 1, 0))
    if setting == 1:  # MatMul rows, a batch of two
        return b.model(select(b.op("MatMul", [x, b.const((8, 6))]), 1, (1, 3)))
    if setting == 2:  # Gemm with A transposed and a per-row bias
        flat = b.op("Reshape", [x, b.const([8, 10], np.int64)])
        gemm = b.op("Gemm", [flat, b.const((8, 4)), b.const((10, 4))], transA=1, alpha=0.5)
        return b.model(select(gemm, 0, (0, 1)))
    if setting == 3:  # FusedMatMul of two activations (attention scores), read twice
        scores = b.op("FusedMatMul", [x, b.op("Neg", [x])], domain=MS_DOMAIN, transB=1, alpha=0.125)
        return b.model(select(scores, 1, 0), b.op("Relu", [scores]))
    if setting == 4:  # Transpose
        return b.model(select(b.op("Transpose", [x], perm=[1, 2, 0]), 1, (2, 7)))
    if setting == 5:  # Reshape splitting the last axis into heads
        heads = b.op("Reshape", [x, b.const([2, 5, 2, 4], np.int64)])
        return b.model(select(heads, 1, (-2, 5)))
    if setting == 6:  # Softmax over the last axis
        return b.model(select(b.op("Softmax", [x], axis=-1), 1, 4))
    if setting == 7:  # LayerNormalization also read elsewhere: kept for that reader
        norm = b.op("LayerNormalization", [x, b.const((8,)), b.const((8,))], axis=-1)
        return b.model(select(norm, 1, 0), b.op("Sigmoid", [norm]))
    if setting == 8:  # onnxruntime's SkipLayerNormalization
        skip = b.op(
            "SkipLayerNormalization",
            [x, b.op("Neg", [x]), b.const((8,)), b.const((8,))],
            domain=MS_DOMAIN,
        )
        return b.model(select(skip, 1, 0))
    if setting == 9:  # Concat along another axis
        concat = b.op("Concat", [x, b.op("Neg", [x])], axis=2)
        return b.model(select(concat, 0, (1, 2)))
    # A residual block: both paths from `a` move, and then the op computing `a` too.
    a = b.op("Neg", [x])
    norm = b.op("LayerNormalization", [a, b.const((8,)), b.const((8,))], axis=-1)
    block = b.op("Add", [a, b.op("Relu", [b.op("MatMul", [norm, b.const((8, 8))])])])
    return b.model(select(block, 1, 0))


RULES = [SliceHoist()]
