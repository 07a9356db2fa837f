"""Patterns: small dataflow graphs over variables, and a matcher that finds them in a Graph.

A pattern is written as an expression, `Relu(Conv(x, w, b?))`, or given as a node list (the
generated templates). Operators start with a capital letter (`com.microsoft.Gelu` names a
domain); variables are lower case; `b?` may be bound to an absent optional input; `d=Sub(x, m)`
names an intermediate value so that it can be used twice. Matching starts at one anchor node
(the pattern's root) and grows through producers and consumers, so a rule only looks at the
nodes of the anchor's op type, never at the whole graph.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import helper

from rlflow.graph import Graph, Node
from rlflow.graph.domains import STANDARD_DOMAINS, is_standard
from rlflow.graph.hashing import COMMUTATIVE


@dataclass(frozen=True)
class Var:
    """Constraints on a pattern input: its rank, that it is a constant, that it may be absent."""

    rank: int | None = None
    const: bool = False
    optional: bool = False


@dataclass(frozen=True)
class PatternNode:
    """One operator of a pattern. `attrs` None matches any attributes; a dict must be equal."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    domain: str = ""
    attrs: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Binding:
    """One match of a pattern: variable -> value name, and the graph node of each pattern node."""

    values: dict[str, str]
    nodes: tuple[Node, ...]


@dataclass
class Pattern:
    """A connected DAG of pattern nodes; `outputs` are the values visible outside the match.

    The anchor is the node computing `outputs[0]`; `plan` is the order in which the matcher
    visits the other nodes, each reached as the producer or a consumer of a bound value.
    """

    nodes: tuple[PatternNode, ...]
    outputs: tuple[str, ...]
    variables: dict[str, Var] = field(default_factory=dict)

    def __post_init__(self) -> None:
        produced = {out for node in self.nodes for out in node.outputs}
        inputs = dict.fromkeys(v for node in self.nodes for v in node.inputs if v not in produced)
        self.variables = {name: self.variables.get(name, Var()) for name in inputs}
        anchors = [i for i, node in enumerate(self.nodes) if self.outputs[0] in node.outputs]
        if not anchors:
            raise ValueError(f"pattern output {self.outputs[0]!r} is not computed by an operator")
        self.anchor = anchors[0]
        self.plan = _plan(self.nodes, self.anchor)
        # (op, the op computing each anchor input or None, commutative): a cheap test that
        # turns away most anchors before the matcher proper starts (GraphIndex.fitting).
        producer_op = {out: node.op for node in self.nodes for out in node.outputs}
        root = self.nodes[self.anchor]
        needs = tuple(producer_op.get(v) for v in root.inputs)
        commutative = root.op in COMMUTATIVE and root.domain == "" and len(root.inputs) == 2
        self.anchor_test = (root.op, needs, commutative)

    @classmethod
    def parse(cls, text: str, exposed: Sequence[str] = ()) -> Pattern:
        """Parse `Op(arg, ...)` expressions; `exposed` names intermediates kept as outputs."""
        nodes, variables, root = _Parser(text).parse()
        return cls(tuple(nodes), (root, *exposed), variables)

    @property
    def anchor_op(self) -> tuple[str, str]:
        node = self.nodes[self.anchor]
        return node.domain, node.op

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    def match(self, graph: Graph, anchor: Node) -> Iterator[Binding]:
        """Every way the pattern matches with its anchor node on `anchor`."""
        if anchor.op_type != self.nodes[self.anchor].op:
            return
        assigned: list[Node | None] = [None] * len(self.nodes)
        yield from self._extend(graph, 0, {}, assigned, anchor)

    def _extend(
        self, graph: Graph, step: int, bound: dict[str, str], assigned: list, anchor: Node
    ) -> Iterator[Binding]:
        if step == len(self.plan):
            binding = self._finish(graph, bound, assigned)
            if binding is not None:
                yield binding
            return
        index, how, var = self.plan[step]
        if how == "anchor":
            candidates = [anchor]
        elif how == "producer":
            producer = graph.producer(bound[var])
            candidates = [producer] if producer is not None else []
        else:
            candidates = graph.consumers(bound[var]) if bound[var] else []
        pattern_node = self.nodes[index]
        for node in candidates:
            if node.op_type != pattern_node.op or any(node is other for other in assigned):
                continue
            for extended in self._bind(graph, pattern_node, node, bound):
                assigned[index] = node
                yield from self._extend(graph, step + 1, extended, assigned, anchor)
                assigned[index] = None

    def _bind(
        self, graph: Graph, pattern: PatternNode, node: Node, bound: dict[str, str]
    ) -> Iterator[dict[str, str]]:
        if node.op_type != pattern.op or node.domain not in _domains(pattern.domain):
            return
        if pattern.attrs is not None and not attrs_equal(pattern, node, graph):
            return
        actual = list(node.inputs)
        while actual and not actual[-1]:
            actual.pop()
        if len(actual) > len(pattern.inputs) or len(node.outputs) < len(pattern.outputs):
            return
        outputs = dict(bound)
        for var, name in zip(pattern.outputs, node.outputs, strict=False):
            if not name or outputs.setdefault(var, name) != name:
                return
        orders = [pattern.inputs]
        if pattern.op in COMMUTATIVE and len(pattern.inputs) == 2 and pattern.domain == "":
            if pattern.inputs[0] != pattern.inputs[1]:
                orders.append(pattern.inputs[::-1])
        for order in orders:
            extended = self._bind_inputs(graph, order, actual, outputs)
            if extended is not None:
                yield extended

    def _bind_inputs(
        self, graph: Graph, order: Sequence[str], actual: list[str], bound: dict[str, str]
    ) -> dict[str, str] | None:
        extended = dict(bound)
        for position, var in enumerate(order):
            name = actual[position] if position < len(actual) else ""
            spec = self.variables.get(var)
            if not name and not (spec is not None and spec.optional):
                return None
            if extended.setdefault(var, name) != name:
                return None
            if spec is not None and name:
                if spec.const and not graph.is_constant(name):
                    return None
                if spec.rank is not None and len(graph.value(name).shape) != spec.rank:
                    return None
        return extended

    def _finish(self, graph: Graph, bound: dict[str, str], assigned: list) -> Binding | None:
        # An input bound to a value the match itself computes would read a removed value.
        produced = {out for node in assigned for out in node.outputs if out}
        if any(bound[var] in produced for var in self.variables):
            return None
        order = [self.anchor, *(i for i in range(len(self.nodes)) if i != self.anchor)]
        return Binding(dict(bound), tuple(assigned[i] for i in order))


def _domains(domain: str) -> tuple[str, ...]:
    return STANDARD_DOMAINS if is_standard(domain) else (domain,)


def _plan(nodes: Sequence[PatternNode], anchor: int) -> list[tuple[int, str, str]]:
    """Visit order: from the anchor, prefer producers (one candidate) over consumers (many)."""
    plan = [(anchor, "anchor", "")]
    done = {anchor}
    bound = set(nodes[anchor].inputs) | set(nodes[anchor].outputs)
    while len(done) < len(nodes):
        step = next(
            (
                (i, "producer", out)
                for i, node in enumerate(nodes)
                if i not in done
                for out in node.outputs
                if out in bound
            ),
            None,
        ) or next(
            (
                (i, "consumer", var)
                for i, node in enumerate(nodes)
                if i not in done
                for var in node.inputs
                if var in bound
            ),
            None,
        )
        if step is None:
            raise ValueError("pattern is not connected")
        done.add(step[0])
        bound |= set(nodes[step[0]].inputs) | set(nodes[step[0]].outputs)
        plan.append(step)
    return plan


class _Parser:
    """Recursive descent over `Op(arg, ...)`, `name=Op(...)`, `var` and `var?`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = re.findall(r"[A-Za-z_][\w.]*|[?(),=]", text)
        if "".join(self.tokens) != re.sub(r"\s+", "", text):
            raise ValueError(f"cannot parse pattern {text!r}")
        self.position = 0
        self.nodes: list[PatternNode] = []
        self.variables: dict[str, Var] = {}

    def parse(self) -> tuple[list[PatternNode], dict[str, Var], str]:
        root = self._expr()
        if self.position != len(self.tokens):
            raise ValueError(f"trailing text in pattern {self.text!r}")
        return self.nodes, self.variables, root

    def _peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def _take(self) -> str:
        token = self._peek()
        if not token:
            raise ValueError(f"unexpected end of pattern {self.text!r}")
        self.position += 1
        return token

    def _expr(self) -> str:
        name = self._take()
        label = None
        if self._peek() == "=":
            self._take()
            label, name = name, self._take()
        if self._peek() != "(":
            if self._peek() == "?":
                self._take()
                self.variables[name] = Var(optional=True)
            return name
        self._take()
        args = []
        while self._peek() != ")":
            args.append(self._expr())
            if self._peek() == ",":
                self._take()
        self._take()
        domain, _, op = name.rpartition(".")
        output = label or f"_{op.lower()}{len(self.nodes)}"
        self.nodes.append(PatternNode(op, tuple(args), (output,), domain))
        return output


# ---- attribute comparison (templates give attributes as plain JSON values) -------------------

_IMPLICIT = {"kernel_shape"}  # determined by the weight's shape


def attrs_equal(pattern: PatternNode, node: Node, graph: Graph) -> bool:
    """Equal attributes, where an absent attribute equals its default (pads 0, strides 1, a
    Transpose's perm reversed axes)."""
    version = graph.opset.get(pattern.domain or "", 17)
    wanted = dict(pattern.attrs or {})
    actual = {k: node.attr(k) for k in node.attrs}
    if node.op_type == "Transpose" and node.inputs:
        reversed_axes = list(range(len(graph.value(node.inputs[0]).shape)))[::-1]
        wanted.setdefault("perm", reversed_axes)
        actual.setdefault("perm", reversed_axes)
    wanted = _normalized(pattern.op, pattern.domain, version, wanted)
    actual = _normalized(node.op_type, pattern.domain, version, actual)
    return wanted.keys() == actual.keys() and all(same_value(wanted[k], actual[k]) for k in wanted)


def _normalized(op: str, domain: str, version: int, attrs: dict[str, Any]) -> dict[str, Any]:
    defaults = _schema_defaults(op, domain, version)
    result = {}
    for name, value in attrs.items():
        if name in _IMPLICIT:
            continue
        if name == "pads" and all(v == 0 for v in value):
            continue
        if name in ("strides", "dilations") and all(v == 1 for v in value):
            continue
        if name in defaults and same_value(defaults[name], value):
            continue
        result[name] = value
    return result


@functools.cache
def _schema_defaults(op: str, domain: str, version: int) -> dict[str, Any]:
    try:
        schema = onnx.defs.get_schema(op, version, domain)
    except onnx.defs.SchemaError:
        return {}
    defaults = {}
    for name, attr in schema.attributes.items():
        if attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            value = helper.get_attribute_value(attr.default_value)
            defaults[name] = value.decode() if isinstance(value, bytes) else value
    return defaults


def same_value(a: Any, b: Any) -> bool:
    """Attribute equality with float32 rounding forgiven (1e-05 is stored as 9.9999997e-06)."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)):
            return False
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return a == b
