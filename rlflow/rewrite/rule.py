"""Rules: a pattern, a check that says why a site does not qualify, and a rewrite.

A rule finds `Match`es (the nodes it replaces, anchor first, and the values it binds),
`check` returns None or the reason a match does not qualify, and `rewrite` returns a
`Replacement`: new nodes and constants, and the values standing for the match's outputs.
`apply` splices a replacement into a new Graph (`rlflow.rewrite.replacement`, where a rewrite
whose shapes do not work out is rejected). `GraphIndex` finds candidate anchors fast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import onnx
from onnx import helper

from rlflow.graph import Graph, Node, Value, fresh_name
from rlflow.graph.derive import Derivation
from rlflow.rewrite.pattern import Pattern
from rlflow.rewrite.replacement import (
    Match,
    Replacement,
    apply_replacement,
    derive_replacement,
)

if TYPE_CHECKING:
    from rlflow.rewrite.memo import RewriteMemo


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
    cpu_only: bool = False
    """Emits operators only onnxruntime's CPU runs (the NCHWc layout): not for a GPU target."""
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

    def apply_everywhere(self, graph: Graph, max_sites: int | None = None) -> tuple[Graph, int]:
        """`graph` rewritten at its first site until it has none, or `max_sites` times (a rule
        whose result has a site again, slice-hoist's one op further up, would go on), and how
        many rewrites that took: what one rule is worth on a whole model."""
        applied = 0
        while max_sites is None or applied < max_sites:
            match = next(iter(self.sites(graph)), None)
            if match is None:
                break
            graph, applied = self.apply(graph, match), applied + 1
        return graph, applied

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
