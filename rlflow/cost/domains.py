"""Which values each integer input of a model may take, read off the graph.

Random inputs must be valid for the model: an index past its table fails in onnxruntime, and an
equivalence check on two error messages checks nothing. A token id drawn from {0, 1} is valid
but exercises two rows of a 30,000-row embedding. So each integer input is drawn from the widest
range the model shows to be valid, and the report states which (`InputDomain.to_json`):

1. the model's metadata, `rlflow.int_range.NAME = "low,high"` (high exclusive), when it has one:
   what the model's author says;
2. an index into a table: a Gather (GatherElements, GatherND, ScatterElements, ScatterND)
   reads the input as indices, directly or through operators that pass values on unchanged
   (Cast to an integer type, Reshape, Unsqueeze, ...): [0, n) for the n rows of the axis it
   indexes, the smallest such n where it indexes several tables;
3. a shape: a Reshape, Expand, Tile or ConstantOfShape reads the input as its target shape.
   Its value is then fixed by the static shapes the graph was loaded with, and it is fed that
   value, never a random one;
4. otherwise DEFAULT_INT_RANGE, [0, 2): valid for every usual meaning of an integer input the
   graph does not explain (a 0/1 mask, an index into any axis of two or more, a position, a
   count), and still different between seeds. A model whose integer input needs a wider range
   that the graph does not show declares it in its metadata (rule 1).

Bools are coin flips and floats standard normal (times a scale, see rlflow.cost.inputs); they
have no domain here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import onnx

from rlflow.errors import RlflowError
from rlflow.graph import Graph, Node

INT_RANGE_PREFIX = "rlflow.int_range."
DEFAULT_INT_RANGE = (0, 2)

# fmt: off
INT_TYPES = frozenset({
    onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
})
# fmt: on
_INDEXING = {"Gather": 1, "GatherElements": 1, "GatherND": 1, "ScatterElements": 1, "ScatterND": 1}
"""Operator -> the input slot it reads as indices into its input 0."""
_PASS_VALUES = frozenset(
    {"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand"}
)
"""Operators whose output (from input 0) holds only values of their input 0."""
_SHAPE_SLOTS = frozenset({("Reshape", 1), ("Expand", 1), ("Tile", 1), ("ConstantOfShape", 0)})


@dataclass(frozen=True)
class InputDomain:
    """An integer input's values: drawn from [low, high), or always `fixed` (a shape)."""

    low: int
    high: int
    origin: str
    """Why: `metadata`, `Gather 'emb' rows`, `shape of Reshape 'r'`, `default`."""
    fixed: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        if self.fixed is not None:
            return {"value": list(self.fixed), "from": self.origin}
        return {"low": self.low, "high": self.high, "from": self.origin}

    def describe(self) -> str:
        if self.fixed is not None:
            return f"= {list(self.fixed)} ({self.origin})"
        return f"in [{self.low}, {self.high}) ({self.origin})"


def int_range(metadata: Mapping[str, str], input_name: str) -> tuple[int, int]:
    """The [low, high) range of an integer input, from metadata or DEFAULT_INT_RANGE."""
    declared = metadata_range(metadata, input_name)
    return DEFAULT_INT_RANGE if declared is None else declared


def metadata_range(metadata: Mapping[str, str], input_name: str) -> tuple[int, int] | None:
    """The range `rlflow.int_range.NAME` declares (None: it declares none)."""
    key = INT_RANGE_PREFIX + input_name
    text = metadata.get(key)
    if text is None:
        return None
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise RlflowError(f"model metadata {key}={text!r} is not 'low,high'") from None
    if high <= low:
        raise RlflowError(f"model metadata {key}={text!r} is an empty range (high is exclusive)")
    return low, high


class GraphView:
    """What the rules above read of a model: its nodes, who reads each value, static shapes."""

    def __init__(self, nodes: Iterable[Node], shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = shapes
        self.readers: dict[str, list[tuple[Node, int]]] = {}
        for node in nodes:
            for slot, name in enumerate(node.inputs):
                if name:
                    self.readers.setdefault(name, []).append((node, slot))

    @classmethod
    def of_graph(cls, graph: Graph) -> GraphView:
        return cls(graph.nodes, {name: value.shape for name, value in graph.values.items()})

    @classmethod
    def of_proto(
        cls, model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]]
    ) -> GraphView:
        """The nodes of a ModelProto, with the shapes it states: its initializers', its declared
        static ones, and `input_shapes` for its inputs."""
        graph = model.graph
        shapes: dict[str, tuple[int, ...]] = {}
        for info in (*graph.value_info, *graph.output, *graph.input):
            dims = info.type.tensor_type.shape.dim
            if info.type.tensor_type.HasField("shape") and all(
                d.HasField("dim_value") for d in dims
            ):
                shapes[info.name] = tuple(d.dim_value for d in dims)
        shapes.update({t.name: tuple(t.dims) for t in graph.initializer})
        shapes.update(input_shapes)
        nodes = [
            Node(p.op_type, list(p.input), list(p.output), {a.name: a for a in p.attribute})
            for p in graph.node
        ]
        return cls(nodes, shapes)


def input_domain(
    view: GraphView, name: str, shape: tuple[int, ...], metadata: Mapping[str, str]
) -> InputDomain:
    """The domain of integer input `name` (of static `shape`) by the rules of this module."""
    declared = metadata_range(metadata, name)
    if declared is not None:
        return InputDomain(*declared, origin=f"metadata {INT_RANGE_PREFIX}{name}")
    fixed = _shape_value(view, name, shape)
    if fixed is not None:
        return fixed
    tables = list(_tables(view, name, set()))
    if tables:
        rows, origin = min(tables)
        if rows > 0:
            return InputDomain(0, rows, origin)
    return InputDomain(*DEFAULT_INT_RANGE, origin="default")


def _shape_value(view: GraphView, name: str, shape: tuple[int, ...]) -> InputDomain | None:
    """The fixed value of an input that some node reads as a shape, if the shapes tell it."""
    for node, slot in view.readers.get(name, []):
        if (node.op_type, slot) not in _SHAPE_SLOTS or not node.outputs:
            continue
        out = view.shapes.get(node.outputs[0])
        if out is None:
            continue
        value = out
        if node.op_type == "Tile":
            data = view.shapes.get(node.inputs[0])
            if data is None or len(data) != len(out) or 0 in data:
                continue
            value = tuple(o // d for o, d in zip(out, data))
        if (len(value),) == tuple(shape):
            label = f" {node.name!r}" if node.name else ""
            return InputDomain(0, 0, f"the shape {node.op_type}{label} reads", fixed=value)
    return None


def _tables(view: GraphView, name: str, seen: set[str]) -> Iterable[tuple[int, str]]:
    """(rows, origin) of every table that `name`'s values index, through value-passing ops."""
    if name in seen:
        return
    seen.add(name)
    for node, slot in view.readers.get(name, []):
        if _INDEXING.get(node.op_type) == slot:
            rows = _rows(view, node)
            if rows is not None:
                yield rows, f"rows of {node.op_type} table {node.inputs[0]!r}"
        elif node.op_type in _PASS_VALUES and slot == 0 and _keeps_integers(node):
            for out in node.outputs:
                yield from _tables(view, out, seen)


def _rows(view: GraphView, node: Node) -> int | None:
    data = view.shapes.get(node.inputs[0])
    if not data:
        return None
    if node.op_type in ("GatherND", "ScatterND"):
        batch_dims = int(node.attr("batch_dims", 0) or 0)
        return min(data[batch_dims:]) if data[batch_dims:] else None
    axis = int(node.attr("axis", 0) or 0)
    return data[axis] if -len(data) <= axis < len(data) else None


def _keeps_integers(node: Node) -> bool:
    return node.op_type != "Cast" or node.attr("to") in INT_TYPES
