"""What a rewrite puts in place of a match, and how it is spliced into the graph.

A `Match` is a site (the nodes a rule replaces and the values it bound), a `Replacement` the
new nodes and constants, with the values standing for the match's outputs. Splicing renames
new outputs onto the old names (readers need no rewiring) and infers the shape of every new
value with ONNX's per-node inference; a rewrite whose shapes do not work out is rejected here
(`RewriteRejected`): shape validity is the applier's job, as in Tensat.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rlflow.graph import Graph, GraphError, Node, Value, topological_order
from rlflow.graph.derive import Derivation
from rlflow.graph.domains import STANDARD_DOMAINS, onnx_opset
from rlflow.graph.ir import outer_scope_inputs

# Constants up to this size are handed to ONNX shape inference as data (Reshape's shape, ...).
_SMALL_CONST = 4096


class RewriteRejected(Exception):
    """A rewrite that cannot be applied at a site; the message is the reason."""


@dataclass(frozen=True, eq=False)
class Match:
    """A site of a rule: the nodes it replaces (anchor first) and what it bound.

    `outputs` are the values the rewrite replaces, for every reader; every other output of
    the replaced nodes must be read only inside the match. `keep` holds nodes the rule looked
    at but leaves in place (e.g. the sibling a kernel is enlarged to match).
    """

    nodes: tuple[Node, ...]
    bindings: Mapping[str, str]
    outputs: tuple[str, ...]
    keep: tuple[Node, ...] = ()
    pattern_index: int = 0

    def __getitem__(self, var: str) -> str:
        return self.bindings[var]

    def node(self, var: str) -> Node:
        """The matched node that computes the value bound to `var`."""
        name = self.bindings[var]
        return next(node for node in self.nodes if name in node.outputs)


@dataclass
class Replacement:
    """What a rewrite puts in place of a match; `outputs` stand for `Match.outputs` in order."""

    nodes: list[Node]
    outputs: list[str]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, Value] = field(default_factory=dict)


def apply_replacement(graph: Graph, match: Match, replacement: Replacement) -> Graph:
    """Swap the match's nodes for the replacement's, checking every new value's shape.

    A new node computing one of the match's outputs takes over that output's name, so readers
    need not be rewired; an output replaced by an existing value is renamed onto it.
    """
    nodes, values, renames = prepare_replacement(graph, match, replacement)
    try:
        return graph.replaced(
            removed=match.nodes,
            added=nodes,
            initializers=replacement.initializers,
            values=values.values(),
            renames=renames,
        )
    except GraphError as error:
        raise RewriteRejected(str(error)) from None


def derive_replacement(graph: Graph, match: Match, replacement: Replacement) -> Derivation:
    """`apply_replacement` as a Derivation (the graph is built when asked)."""
    nodes, values, renames = prepare_replacement(graph, match, replacement)
    try:
        return Derivation(
            graph,
            removed=match.nodes,
            added=nodes,
            initializers=replacement.initializers,
            values=values.values(),
            renames=renames,
        )
    except GraphError as error:
        raise RewriteRejected(str(error)) from None


def prepare_replacement(
    graph: Graph, match: Match, replacement: Replacement
) -> tuple[list[Node], dict[str, Value], dict[str, str]]:
    """The new nodes (outputs renamed), their Values and the renames; raises RewriteRejected."""
    if len(replacement.outputs) != len(match.outputs):
        raise RewriteRejected("replacement has the wrong number of outputs")
    new_names = {out for node in replacement.nodes for out in node.outputs if out}
    takeover: dict[str, str] = {}
    renames: dict[str, str] = {}
    for old, new in zip(match.outputs, replacement.outputs, strict=False):
        if new in new_names and new not in takeover:
            takeover[new] = old
        elif new != old:
            if graph.is_output(old) and (
                new in replacement.initializers
                or graph.producer(new) is None
                or graph.is_output(new)
            ):
                raise RewriteRejected(f"graph output {old!r} would become an alias of {new!r}")
            renames[old] = new
    nodes = [_renamed(node, takeover) for node in replacement.nodes]
    values = _infer_values(graph, nodes, replacement, takeover)
    for old, new in renames.items():
        before = graph.value(old)
        after = values.get(new) or _value_of(graph, replacement, new)
        if (after.dtype, after.shape) != (before.dtype, before.shape):
            raise RewriteRejected(f"{old!r} is {before.shape}, its replacement {after.shape}")
    return nodes, values, renames


def _renamed(node: Node, takeover: dict[str, str]) -> Node:
    if not any(name in takeover for name in (*node.inputs, *node.outputs)):
        return node
    return Node(
        node.op_type,
        [takeover.get(name, name) for name in node.inputs],
        [takeover.get(name, name) for name in node.outputs],
        node.attrs,
        node.domain,
        node.name,
    )


def _value_of(graph: Graph, replacement: Replacement, name: str) -> Value:
    if name in replacement.initializers:
        array = replacement.initializers[name]
        return Value(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
    return graph.value(name)


def _infer_values(
    graph: Graph, nodes: list[Node], replacement: Replacement, takeover: dict[str, str]
) -> dict[str, Value]:
    """A Value for every output of the new nodes; outputs taking over a name must keep its type."""
    old_names = set(takeover.values())
    known: dict[str, Value] = {}
    # Only the new nodes' own names matter to their order; asking the graph about those alone
    # lets a rewrite be reused on another graph that answers alike (RewriteMemo).
    names = {n for node in nodes for n in (*node.inputs, *node.outputs, *outer_scope_inputs(node))}
    available = {n for n in names if n in graph.values or n in replacement.initializers} | {""}
    try:
        ordered = topological_order(nodes, available - old_names)
    except GraphError as error:
        raise RewriteRejected(str(error)) from None
    for node in ordered:
        inferred = infer_node(graph, node, known, replacement)
        for name in node.outputs:
            if not name:
                continue
            value = inferred.get(name)
            rule_value = replacement.values.get(_original(name, takeover))
            if value is None and rule_value is not None:
                value = dataclasses.replace(rule_value, name=name)
            if name in old_names:
                before = graph.value(name)
                if value is None:
                    value = before
                elif (value.dtype, value.shape) != (before.dtype, before.shape):
                    raise RewriteRejected(
                        f"{name!r} would change from {_describe(before)} to {_describe(value)}"
                    )
            if value is None:
                raise RewriteRejected(f"cannot infer the shape of {node.op_type} output {name!r}")
            known[name] = value
    return known


def _original(name: str, takeover: dict[str, str]) -> str:
    for new, old in takeover.items():
        if old == name:
            return new
    return name


def infer_node(
    graph: Graph, node: Node, known: Mapping[str, Value], replacement: Replacement
) -> dict[str, Value]:
    """ONNX per-node shape inference for a standard-domain node ({} for other domains)."""
    if node.domain not in STANDARD_DOMAINS:
        return {}
    version = onnx_opset(graph.opset)
    schema = _schema(node.op_type, version)
    if schema is None:
        raise RewriteRejected(f"no ONNX schema for {node.op_type} at opset {version}")
    input_types = {}
    input_data = {}
    for name in node.present_inputs:
        if name in replacement.initializers:
            array = replacement.initializers[name]
        else:
            array = graph.constant(name)
        if name in known:
            value = known[name]
        elif array is not None and name in replacement.initializers:
            value = Value(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
        else:
            value = graph.value(name)
        input_types[name] = helper.make_tensor_type_proto(value.dtype, value.shape)
        if array is not None and array.size <= _SMALL_CONST:
            input_data[name] = numpy_helper.from_array(array, name)
    proto = onnx.NodeProto(
        op_type=node.op_type, input=node.inputs, output=node.outputs, domain=node.domain
    )
    proto.attribute.extend(node.attrs.values())
    try:
        types = onnx.shape_inference.infer_node_outputs(
            schema,
            proto,
            input_types,
            input_data,
            opset_imports=[helper.make_opsetid("", version)],
        )
    except Exception as error:  # InferenceError, ValidationError, ...: all mean "invalid here"
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RewriteRejected(f"{node.op_type} is invalid here: {message}") from None
    values = {}
    for name, type_proto in types.items():
        tensor = type_proto.tensor_type
        if not tensor.HasField("shape") or not all(
            d.HasField("dim_value") for d in tensor.shape.dim
        ):
            continue
        values[name] = Value(name, tensor.elem_type, tuple(d.dim_value for d in tensor.shape.dim))
    return values


@functools.cache
def _schema(op_type: str, version: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, version, "")
    except onnx.defs.SchemaError:
        return None


def _describe(value: Value) -> str:
    dtype = onnx.TensorProto.DataType.Name(value.dtype).lower()
    return f"{dtype}{list(value.shape)}"
