"""The graph IR: nodes, values and constants with static shapes, in topological order.

A `Graph` is treated as immutable: a rewrite builds a new Graph with `Graph.replaced`,
which shares every untouched Node, Value and weight array with the old one, so that a
search can keep thousands of graphs without copying weights.
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from rlflow.errors import RlflowError


class GraphError(RlflowError):
    """A graph is malformed: a cycle, a dangling input, a value defined twice."""


@dataclass(frozen=True)
class Value:
    """A tensor of the graph: its name, ONNX element type and static shape."""

    name: str
    dtype: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape))


@dataclass(eq=False)
class Node:
    """One operator. Treat as immutable once it is in a Graph: forks share Nodes.

    `inputs` may hold "" for an absent optional input. Attributes are kept as
    AttributeProto so that any operator, including ones we know nothing about,
    round-trips exactly; `attr()` gives the Python value.
    """

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, onnx.AttributeProto] = field(default_factory=dict)
    domain: str = ""
    name: str = ""

    @classmethod
    def make(
        cls,
        op_type: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        domain: str = "",
        name: str = "",
        **attrs: Any,
    ) -> Node:
        """Build a node from Python attribute values (as onnx.helper.make_node does)."""
        protos = {k: helper.make_attribute(k, v) for k, v in attrs.items() if v is not None}
        return cls(op_type, list(inputs), list(outputs), protos, domain, name)

    def attr(self, name: str, default: Any = None) -> Any:
        """The Python value of an attribute: int, float, str, list, np.ndarray or GraphProto."""
        proto = self.attrs.get(name)
        if proto is None:
            return default
        if proto.type == onnx.AttributeProto.TENSOR:
            return onnx.numpy_helper.to_array(proto.t)
        value = helper.get_attribute_value(proto)
        if isinstance(value, bytes):
            return value.decode()
        if proto.type == onnx.AttributeProto.STRINGS:
            return [v.decode() for v in value]
        return value

    @property
    def present_inputs(self) -> list[str]:
        return [name for name in self.inputs if name]

    def __repr__(self) -> str:
        domain = f"{self.domain}." if self.domain else ""
        return f"Node({domain}{self.op_type}, {self.inputs} -> {self.outputs})"


_fresh_counter = itertools.count()
# A per-process token: a model saved by one run and optimised again by another must not
# meet its own names again.
_fresh_token = secrets.token_hex(3)


def fresh_name(prefix: str) -> str:
    """A value or initializer name that no other graph uses (unique across processes).

    Rewrites must give new constants new names: weight digests are cached by name.
    """
    return f"{prefix}__rl{_fresh_token}_{next(_fresh_counter)}"


class Graph:
    """A dataflow graph with static shapes, constants as numpy arrays, nodes in topological order.

    Args:
        nodes: the operators; they are put in topological order (a cycle raises GraphError).
        inputs: the runtime inputs of the model (not initializers), in order.
        outputs: the model outputs, in order.
        initializers: constant tensors by name (never mutated in place).
        values: the Value of every tensor; inputs, outputs and initializers are added.
        opset: ONNX opset version per domain ("" is the default domain).
        metadata: the model's metadata_props (e.g. valid integer input ranges).
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        inputs: Sequence[Value],
        outputs: Sequence[Value],
        initializers: dict[str, np.ndarray],
        values: dict[str, Value],
        opset: dict[str, int],
        metadata: dict[str, str] | None = None,
        name: str = "graph",
        ir_version: int | None = None,
        functions: Sequence[onnx.FunctionProto] = (),
        _digests: dict[str, bytes] | None = None,
        _parent_hashes: tuple[dict[str, bytes], dict[str, Node]] | None = None,
    ) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.initializers = initializers
        self.values = values
        self.opset = dict(opset)
        self.metadata = dict(metadata or {})
        self.name = name
        self.ir_version = ir_version
        self.functions = list(functions)
        # Digests of initializer contents, shared by every graph derived from this one.
        self._digests: dict[str, bytes] = {} if _digests is None else _digests
        for value in (*self.inputs, *self.outputs):
            self.values.setdefault(value.name, value)
        for const_name, array in initializers.items():
            if const_name not in self.values:
                self.values[const_name] = Value(
                    const_name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
                )
        self.nodes = topological_order(list(nodes), self._available_names())
        self._producers: dict[str, Node] | None = None
        self._consumers: dict[str, list[Node]] | None = None
        self._hash: str | None = None
        # Value hashes of the graph this one was derived from: hashing reuses every value
        # not downstream of the change (dropped once this graph's own hashes exist).
        self._parent_hashes = _parent_hashes
        self._value_hashes: dict[str, bytes] | None = None
        # Lookups shared by the Derivations of this graph (rlflow.graph.derive); False if none.
        self._derivation_base: Any = None

    # ---- queries -------------------------------------------------------------------------

    def _available_names(self) -> set[str]:
        return {v.name for v in self.inputs} | set(self.initializers) | {""}

    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise GraphError(f"graph has no value named {name!r}") from None

    def is_constant(self, name: str) -> bool:
        return name in self.initializers

    def constant(self, name: str) -> np.ndarray | None:
        return self.initializers.get(name)

    def producer(self, name: str) -> Node | None:
        """The node computing a value, or None for inputs and initializers."""
        return self._producer_map().get(name)

    def _producer_map(self) -> dict[str, Node]:
        if self._producers is None:
            self._producers = {out: node for node in self.nodes for out in node.outputs if out}
        return self._producers

    def consumers(self, name: str) -> list[Node]:
        """The nodes reading a value, in topological order; an If, Loop or Scan whose body reads
        the value from this graph counts as a reader too."""
        if self._consumers is None:
            consumers: dict[str, list[Node]] = {}
            for node in self.nodes:
                for input_name in dict.fromkeys([*node.present_inputs, *outer_scope_inputs(node)]):
                    consumers.setdefault(input_name, []).append(node)
            self._consumers = consumers
        return self._consumers.get(name, [])

    def is_output(self, name: str) -> bool:
        return any(value.name == name for value in self.outputs)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return counts

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}, {len(self.nodes)} nodes, {len(self.initializers)} constants, "
            f"inputs={[v.name for v in self.inputs]}, outputs={[v.name for v in self.outputs]})"
        )

    # ---- identity ------------------------------------------------------------------------

    def canonical_hash(self) -> str:
        """A hex digest invariant to node order and intermediate value names (see hashing.py)."""
        if self._hash is None:
            from rlflow.graph.hashing import canonical_hash

            self._hash = canonical_hash(self)
        return self._hash

    def const_digest(self, name: str) -> bytes:
        digest = self._digests.get(name)
        if digest is None:
            from rlflow.graph.hashing import array_digest

            digest = array_digest(self.initializers[name])
            self._digests[name] = digest
        return digest

    # ---- derivation ----------------------------------------------------------------------

    def replaced(
        self,
        removed: Iterable[Node] = (),
        added: Iterable[Node] = (),
        initializers: dict[str, np.ndarray] | None = None,
        values: Iterable[Value] = (),
        renames: dict[str, str] | None = None,
    ) -> Graph:
        """A new graph with some nodes swapped for others; everything else is shared.

        `renames` maps old value names to new ones for every remaining reader (and the
        graph outputs, whose names are kept: the new producer is renamed instead).
        Nodes and constants that no longer reach an output are dropped.
        """
        removed_ids = {id(node) for node in removed}
        added = list(added)
        # New nodes go where the first replaced node was: usually already a valid order,
        # which topological_order then accepts in one pass instead of re-sorting.
        first = next((i for i, n in enumerate(self.nodes) if id(n) in removed_ids), None)
        nodes = [node for node in self.nodes if id(node) not in removed_ids]
        if first is None:
            nodes.extend(added)
        else:
            kept_before = sum(1 for n in self.nodes[:first] if id(n) not in removed_ids)
            nodes[kept_before:kept_before] = added
        new_initializers = dict(self.initializers)
        for const_name, array in (initializers or {}).items():
            old = self.initializers.get(const_name)
            if old is not None and old is not array:
                raise GraphError(f"constant {const_name!r} already exists with other contents")
            new_initializers[const_name] = array
        new_values = dict(self.values)
        for value in values:
            new_values[value.name] = value
        if renames:
            # Names read inside If/Loop bodies cannot be renamed there: keep them like outputs.
            kept = {v.name for v in self.outputs}.union(*map(outer_scope_inputs, nodes))
            nodes = _apply_renames(nodes, renames, kept)
        parent = None if self._value_hashes is None else (self._value_hashes, self._producer_map())
        return self._derive(nodes, new_initializers, new_values, parent).pruned()

    def pruned(self) -> Graph:
        """Drop nodes, constants and values that no output depends on (returns self if none)."""
        live = {v.name for v in self.outputs}
        kept: list[Node] = []
        for node in reversed(self.nodes):
            if any(out in live for out in node.outputs) or _has_side_effects(node):
                kept.append(node)
                live.update(node.present_inputs)
                live.update(outer_scope_inputs(node))
        unused_consts = [name for name in self.initializers if name not in live]
        if len(kept) == len(self.nodes) and not unused_consts:
            return self
        kept.reverse()
        live.update(v.name for v in self.inputs)
        live.update(out for node in kept for out in node.outputs)
        initializers = {k: v for k, v in self.initializers.items() if k in live}
        values = {k: v for k, v in self.values.items() if k in live}
        return self._derive(kept, initializers, values, self._parent_hashes)

    def with_metadata(self, entries: Mapping[str, str]) -> Graph:
        """This graph with `entries` added to its metadata (nodes and weights shared): e.g. the
        runtime settings an optimised model declares."""
        graph = self._derive(self.nodes, self.initializers, self.values, self._parent_hashes)
        graph.metadata.update(entries)
        return graph

    def without_metadata(self, keys: Iterable[str]) -> Graph:
        """This graph without the metadata entries `keys` (nodes and weights shared)."""
        graph = self._derive(self.nodes, self.initializers, self.values, self._parent_hashes)
        for key in keys:
            graph.metadata.pop(key, None)
        return graph

    def _derive(self, nodes, initializers, values, parent_hashes) -> Graph:
        """A graph with this one's interface and metadata, sharing its weight digests."""
        return Graph(
            nodes,
            self.inputs,
            self.outputs,
            initializers,
            values,
            self.opset,
            self.metadata,
            self.name,
            self.ir_version,
            self.functions,
            _digests=self._digests,
            _parent_hashes=parent_hashes,
        )

    def to_onnx(self) -> onnx.ModelProto:
        from rlflow.graph.onnx_io import graph_to_onnx

        return graph_to_onnx(self)


def _has_side_effects(node: Node) -> bool:
    # Nothing in inference ONNX has side effects we must keep; the hook stays for clarity.
    return False


def _apply_renames(nodes: list[Node], renames: dict[str, str], kept: set[str]) -> list[Node]:
    """Point readers of each renamed value at its replacement.

    A renamed value in `kept` (graph outputs, values read inside control-flow bodies) keeps
    its name: the node producing the replacement is given that name instead, so the model's
    interface and the bodies never change.
    """
    producer_renames = {new: old for old, new in renames.items() if old in kept}
    result = []
    for node in nodes:
        inputs = [renames.get(name, name) for name in node.inputs]
        new_outputs = [producer_renames.get(name, name) for name in node.outputs]
        if inputs != node.inputs or new_outputs != node.outputs:
            node = Node(node.op_type, inputs, new_outputs, node.attrs, node.domain, node.name)
        result.append(node)
    # Readers of a value whose producer took an output's name must follow it.
    if producer_renames:
        result = [
            node
            if not any(name in producer_renames for name in node.inputs)
            else Node(
                node.op_type,
                [producer_renames.get(name, name) for name in node.inputs],
                node.outputs,
                node.attrs,
                node.domain,
                node.name,
            )
            for node in result
        ]
    return result


def topological_order(nodes: list[Node], available: set[str]) -> list[Node]:
    """Kahn's algorithm, stable: among ready nodes, the earlier one in `nodes` goes first.

    Raises GraphError on a cycle, a value produced twice or an input nobody produces.
    """
    producer_index: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for out in node.outputs:
            if not out:
                continue
            if out in producer_index or out in available:
                raise GraphError(f"value {out!r} is defined more than once")
            producer_index[out] = index
    reads = [set(node.present_inputs) | outer_scope_inputs(node) for node in nodes]
    waiting = [0] * len(nodes)
    readers: list[list[int]] = [[] for _ in nodes]
    for index, node in enumerate(nodes):
        for name in reads[index]:
            if name in available:
                continue
            source = producer_index.get(name)
            if source is None:
                raise GraphError(f"{node.op_type} node reads {name!r}, which nothing produces")
            waiting[index] += 1
            readers[source].append(index)
    if _is_ordered(nodes, reads, available):
        return nodes
    import heapq

    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(nodes[index])
        for reader in readers[index]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    if len(order) != len(nodes):
        raise GraphError("graph has a cycle")
    return order


def _is_ordered(nodes: list[Node], reads: list[set[str]], available: set[str]) -> bool:
    """True when every node reads (`reads`, bodies included) only values defined before it
    (one pass, no sorting)."""
    defined = set(available)
    for node, names in zip(nodes, reads):
        if not names <= defined:
            return False
        defined.update(node.outputs)
    return True


def outer_scope_inputs(node: Node) -> frozenset[str]:
    """Names a control-flow body (If/Loop/Scan) reads from the enclosing graph: ONNX lets a
    body use any value in scope, and such a read appears in no input list. Cached on the node
    (nodes are not changed once made): ordering, pruning and hashing all ask."""
    try:
        return node._outer_scope_inputs  # type: ignore[attr-defined]
    except AttributeError:
        names = frozenset(_body_free_names(node.attrs.values()))
        node._outer_scope_inputs = names  # type: ignore[attr-defined]
        return names


def _body_free_names(attributes: Iterable[onnx.AttributeProto]) -> set[str]:
    """The names the graph-valued `attributes` read without defining them."""
    names: set[str] = set()
    for proto in attributes:
        if proto.type == onnx.AttributeProto.GRAPH:
            names |= _free_names(proto.g)
        elif proto.type == onnx.AttributeProto.GRAPHS:
            for body in proto.graphs:
                names |= _free_names(body)
    return names


def _free_names(body: onnx.GraphProto) -> set[str]:
    defined = {v.name for v in body.input} | {t.name for t in body.initializer}
    defined |= {t.values.name for t in body.sparse_initializer}
    free: set[str] = set()
    for node in body.node:
        free.update(name for name in node.input if name and name not in defined)
        free.update(name for name in _body_free_names(node.attribute) if name not in defined)
        defined.update(node.output)
    return free
