"""Rules: a pattern, a check that says why a site does not qualify, and a rewrite.

A rule finds `Match`es (the nodes it replaces, anchor first, and the values it binds),
`check` returns None or the reason a match does not qualify, and `rewrite` returns a
`Replacement`: new nodes and constants, and the values standing for the match's outputs.
`apply` turns a replacement into a new Graph with `Graph.replaced`, inferring the shape of
every new value on the way; a rewrite whose shapes do not work out is rejected there
(shape validity is the applier's job, as in Tensat).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rlflow.graph import Graph, GraphError, Node, Value, fresh_name, topological_order
from rlflow.graph.derive import Derivation
from rlflow.graph.domains import STANDARD_DOMAINS, onnx_opset
from rlflow.graph.ir import _outer_scope_inputs
from rlflow.rewrite.pattern import Pattern

if TYPE_CHECKING:
    from rlflow.rewrite.memo import RewriteMemo

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


class Emitter:
    """Builds a Replacement; every new value and constant gets a fresh name."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.values: dict[str, Value] = {}

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        outputs: int = 1,
        domain: str = "",
        like: Sequence[str] = (),
        **attrs: Any,
    ) -> Any:
        """Add a node; returns its output name (a list when `outputs` > 1).

        `like` gives, per output, an existing value with the same type and shape: the rule's
        own knowledge of a contrib op's shapes, which ONNX shape inference cannot give.
        An output given `like=""` is left absent.
        """
        names = [fresh_name(op_type.lower()) for _ in range(outputs)]
        for index, model in enumerate(like):
            if model == "":
                names[index] = ""
            elif model:
                self.values[names[index]] = dataclasses.replace(
                    self.graph.value(model), name=names[index]
                )
        self.nodes.append(Node.make(op_type, _trimmed(inputs), names, domain=domain, **attrs))
        return names[0] if outputs == 1 else names

    def copy(
        self,
        node: Node,
        inputs: Sequence[str],
        op_type: str | None = None,
        domain: str | None = None,
        like: str = "",
        outputs: int = 1,
        **attrs: Any,
    ) -> Any:
        """A copy of `node`'s attributes, overridden by `attrs` (None drops one), on new inputs.

        `op_type` and `domain` turn it into a related op (MatMul -> FusedMatMul); `like` as
        in `op`. Returns the output name (a list when `outputs` > 1).
        """
        protos = dict(node.attrs)
        for key, value in attrs.items():
            if value is None:
                protos.pop(key, None)
            else:
                protos[key] = helper.make_attribute(key, value)
        op_type = op_type or node.op_type
        names = [fresh_name(op_type.lower()) for _ in range(outputs)]
        domain = node.domain if domain is None else domain
        self.nodes.append(Node(op_type, _trimmed(inputs), names, protos, domain))
        if like:
            self.values[names[0]] = dataclasses.replace(self.graph.value(like), name=names[0])
        return names[0] if outputs == 1 else names

    def const(self, array: np.ndarray, prefix: str = "const") -> str:
        name = fresh_name(prefix)
        self.initializers[name] = np.ascontiguousarray(array)
        return name

    def result(self, *outputs: str) -> Replacement:
        return Replacement(self.nodes, list(outputs), self.initializers, self.values)


def _trimmed(inputs: Sequence[str]) -> list[str]:
    """Inputs without trailing absent ones ("" is only needed before a present input)."""
    inputs = list(inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


class Rule:
    """A rewrite rule. Subclasses set `name` and implement `matches`, `check`, `rewrite`, and
    `example` (a tiny model containing the source pattern, used to verify the rule).

    `anchor_ops` are the op types a site can start from (None: any node); `source_ops` and
    `target_ops` count the operators on each side, for listings.
    """

    name: str = ""
    origin: str = "built-in"
    portable: bool = True
    description: str = ""
    """One line, `source -> target`, as in the module docstrings (shown by `rules list`)."""
    reverse_description: str = ""
    anchor_ops: tuple[str, ...] | None = None
    source_ops: Mapping[str, int] = {}
    target_ops: Mapping[str, int] = {}
    reverse: bool = False
    settings: ClassVar[int] = 3
    distinct_sites: ClassVar[bool] = True
    """Yield one match per set of nodes (the other operand orders of Add, Mul, ... are the
    same rewrite); template rules, whose orders may rewrite differently, keep them all."""

    reverse_anchor_ops: tuple[str, ...] | None = None
    """For a rule declared once for both directions: where the reverse rule's sites start."""

    def __init__(self, reverse: bool = False) -> None:
        """`reverse=True` gives the inverse of a bidirectional rule, named `<name>-reverse`."""
        if reverse:
            self.reverse = True
            self.name = f"{type(self).name}-reverse"
            self.description = self.reverse_description
            self.anchor_ops = self.reverse_anchor_ops
            self.source_ops, self.target_ops = self.target_ops, self.source_ops

    @property
    def equation(self) -> str:
        """The rule as `source => target`, the way egg lists its rewrites (`rules list`).

        A rule whose matching and rewrite are both code states its sides only in its
        description, so that is what it shows; rules with a source pattern or with both
        sides as data override this with what they really match and build.
        """
        return _arrowed(*_description_sides(self.description))

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        raise NotImplementedError

    def check(self, graph: Graph, match: Match) -> str | None:
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        raise NotImplementedError

    def example(self, setting: int) -> onnx.ModelProto:
        raise NotImplementedError(f"rule {self.name} has no example")

    def example_graph(self, setting: int) -> Graph:
        """The example loaded as the verifier sees it."""
        from rlflow.graph import load_model

        return load_model(self.example(setting))

    def fingerprint(self) -> str:
        """Changes whenever the rule's definition may have changed (for the verification cache):
        the source of the module defining it, and its direction."""
        import inspect

        return inspect.getsource(inspect.getmodule(type(self))) + f"\0{self.reverse}"

    # ---- the engine ------------------------------------------------------------------------

    def reason(self, graph: Graph, match: Match) -> str | None:
        """Why this match is not a site: a value it removes is read outside, or the check fails."""
        inside = {id(node) for node in match.nodes}
        replaced = set(match.outputs)
        for node in match.nodes:
            for name in node.outputs:
                if not name or name in replaced:
                    continue
                if graph.is_output(name):
                    return f"{name!r} is a graph output inside the pattern"
                if any(id(reader) not in inside for reader in graph.consumers(name)):
                    return f"{name!r} is read outside the pattern"
        return self.check(graph, match)

    def anchors(self, index: GraphIndex) -> Sequence[Node]:
        """The nodes a site may start from, in graph order."""
        if self.anchor_ops is None:
            return index.graph.nodes
        return index.nodes_of(self.anchor_ops)

    def sites(
        self, graph: Graph, index: GraphIndex | None = None, memo: RewriteMemo | None = None
    ) -> Iterator[Match]:
        """Every match in `graph` that passes the check, anchors in graph order.

        `index` shares per-graph lookups between the rules of a RuleSet; `memo` reuses an
        anchor's sites from the graph before, where the graph answers alike.
        """
        index = index if index is not None and index.graph is graph else GraphIndex(graph)
        for anchor in self.anchors(index):
            if memo is None:
                yield from self.anchor_sites(graph, anchor)
            else:
                yield from memo.sites(self, graph, anchor)

    def anchor_sites(self, graph: Graph, anchor: Node) -> list[Match]:
        """The matches at one anchor that pass the check."""
        found = []
        seen: set[frozenset[int]] = set()
        for match in self.matches(graph, anchor):
            if self.reason(graph, match) is not None:
                continue
            if self.distinct_sites:
                nodes = frozenset(id(node) for node in (*match.nodes, *match.keep))
                if nodes in seen:
                    continue
                seen.add(nodes)
            found.append(match)
        return found

    def apply(self, graph: Graph, match: Match) -> Graph:
        """The rewritten graph; raises RewriteRejected if the result would be invalid."""
        return apply_replacement(graph, match, self.rewrite(graph, match))

    def derive(self, graph: Graph, match: Match) -> Derivation:
        """`apply` without building the graph yet: the result's hash and size now, and the
        same graph as `apply`'s from `.graph()`; raises RewriteRejected where `apply` does."""
        return derive_replacement(graph, match, self.rewrite(graph, match))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class PatternRule(Rule):
    """A rule whose sites are the matches of one or more expression patterns.

    `pattern` is a string or a tuple of alternatives (`Match.pattern_index` says which
    matched); `exposed` names intermediate values that the rewrite also replaces. A rule
    that holds both ways sets `reverse_pattern` too and is instantiated by `both_ways`;
    its rewrite branches on `self.reverse`.
    """

    pattern: str | tuple[str, ...] = ""
    reverse_pattern: str | tuple[str, ...] = ""
    exposed: tuple[str, ...] = ()

    def __init__(self, reverse: bool = False) -> None:
        self.reverse = reverse
        text = self.reverse_pattern if reverse else self.pattern
        texts = (text,) if isinstance(text, str) else text
        self.patterns = [Pattern.parse(t, () if reverse else self.exposed) for t in texts]
        self.anchor_ops = tuple(dict.fromkeys(p.anchor_op[1] for p in self.patterns))
        counts = self.patterns[0].op_counts()
        if reverse:
            self.name = f"{type(self).name}-reverse"
            self.description = self.reverse_description
            self.source_ops, self.target_ops = counts, _forward_counts(self)
        elif not self.source_ops:
            self.source_ops = counts

    @property
    def equation(self) -> str:
        """The source as the matcher reads it (alternatives joined by `|`); the target as the
        description states it, since the rewrite is code with no pattern of its own."""
        text = self.reverse_pattern if self.reverse else self.pattern
        texts = (text,) if isinstance(text, str) else text
        source = " | ".join(" ".join(t.split()) for t in texts)
        return _arrowed(source, _description_sides(self.description)[1])

    def anchors(self, index: GraphIndex) -> Sequence[Node]:
        return pattern_anchors(self.patterns, index)

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        for index, pattern in enumerate(self.patterns):
            for binding in pattern.match(graph, anchor):
                outputs = tuple(binding.values[name] for name in pattern.outputs)
                yield Match(binding.nodes, binding.values, outputs, pattern_index=index)


def _description_sides(description: str) -> tuple[str, str]:
    """A description's source and target: the text either side of its first ` -> ` (a note
    after the target, `(c per channel)`, stays with it); no arrow: all of it is the source."""
    source, _, target = description.partition(" -> ")
    return source, target


def _arrowed(source: str, target: str) -> str:
    return f"{source} => {target}" if target else source


def pattern_anchors(patterns: Sequence[Pattern], index: GraphIndex) -> Sequence[Node]:
    """The nodes where at least one of `patterns` may match, in graph order."""
    lists = [index.fitting(*pattern.anchor_test) for pattern in patterns]
    if len(lists) == 1:
        return lists[0]
    merged = {id(node): node for nodes in lists for node in nodes}
    return sorted(merged.values(), key=index.position)


def _forward_counts(rule: PatternRule) -> Mapping[str, int]:
    text = rule.pattern if isinstance(rule.pattern, str) else rule.pattern[0]
    return type(rule).source_ops or Pattern.parse(text).op_counts()


def both_ways(cls: type[Rule]) -> list[Rule]:
    """A bidirectional rule declared once: its forward and `-reverse` instances."""
    return [cls(reverse=False), cls(reverse=True)]  # type: ignore[call-arg]


class GraphIndex:
    """Lookups over one graph, computed once and shared by every rule of a pass: nodes by op
    type, and the nodes of an op type whose inputs come from given op types (a pattern's
    anchor test). With ~1700 generated rules, most are then never tried on most nodes.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.by_op: dict[str, list[Node]] = {}
        for node in graph.nodes:
            self.by_op.setdefault(node.op_type, []).append(node)
        self._position: dict[int, int] | None = None
        self._fitting: dict[tuple, list[Node]] = {}
        self._input_ops: dict[int, tuple[str | None, ...]] = {}
        self._by_signature: dict[str, dict[tuple[str | None, ...], list[Node]]] = {}

    def nodes_of(self, ops: Sequence[str]) -> list[Node]:
        if len(ops) == 1:
            return self.by_op.get(ops[0], [])
        nodes = [node for op in dict.fromkeys(ops) for node in self.by_op.get(op, ())]
        return sorted(nodes, key=self.position)

    def position(self, node: Node) -> int:
        if self._position is None:
            self._position = {id(n): i for i, n in enumerate(self.graph.nodes)}
        return self._position[id(node)]

    def input_ops(self, node: Node) -> tuple[str | None, ...]:
        """The op type computing each input of `node` (None: a graph input or constant)."""
        ops = self._input_ops.get(id(node))
        if ops is None:
            producers = [self.graph.producer(name) if name else None for name in node.inputs]
            ops = tuple(p.op_type if p is not None else None for p in producers)
            self._input_ops[id(node)] = ops
        return ops

    def fitting(self, op: str, needs: tuple[str | None, ...], commutative: bool) -> list[Node]:
        """Nodes of type `op` whose k-th input is computed by an op of type needs[k] (where
        not None), in either input order if `commutative`."""
        key = (op, needs, commutative)
        nodes = self._fitting.get(key)
        if nodes is None:
            orders = [needs, needs[::-1]] if commutative and len(needs) == 2 else [needs]
            # Test each distinct input-op signature once, not every node (few signatures).
            groups = [
                group
                for ops, group in self._signatures(op).items()
                if any(_fits(ops, order) for order in orders)
            ]
            if len(groups) == 1:
                nodes = groups[0]
            else:
                nodes = sorted((node for group in groups for node in group), key=self.position)
            self._fitting[key] = nodes
        return nodes

    def _signatures(self, op: str) -> dict[tuple[str | None, ...], list[Node]]:
        """The nodes of type `op` by their `input_ops`, each list in graph order."""
        groups = self._by_signature.get(op)
        if groups is None:
            groups = {}
            for node in self.by_op.get(op, ()):
                groups.setdefault(self.input_ops(node), []).append(node)
            self._by_signature[op] = groups
        return groups


def _fits(ops: tuple[str | None, ...], needs: Sequence[str | None]) -> bool:
    return all(need is None or (k < len(ops) and ops[k] == need) for k, need in enumerate(needs))


def index_by_op(graph: Graph) -> dict[str, list[Node]]:
    """Nodes by op type, in graph order."""
    return GraphIndex(graph).by_op


# ---- applying a replacement -------------------------------------------------------------------


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
    names = {n for node in nodes for n in (*node.inputs, *node.outputs, *_outer_scope_inputs(node))}
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
