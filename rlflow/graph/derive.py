"""The hash, size and validity of `Graph.replaced(...)` without building the graph.

Candidate enumeration applies every rule at every site and keeps the results that are new (by
canonical hash), valid (no cycle, no value defined twice or read undefined) and under the op
cap; an agent then takes one of them. Building every result -- copying the node list, ordering
it, pruning it, hashing it -- costs a pass over the whole graph per candidate, most of a step's
time on the large models. A `Derivation` looks only at the change and at the nodes downstream
of it (whose hashes change anyway), and builds the graph, by the very same `Graph.replaced`
call, only when asked. Anything unusual (a renamed graph output, control flow, a parent that is
not pruned, an error) is left to `Graph.replaced` itself, so the answers are always its own.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx

from rlflow.graph.hashing import array_digest, const_hash, hash_node, outputs_hash
from rlflow.graph.ir import Graph, Node, Value


class Derivation:
    """What `parent.replaced(removed, added, initializers, values, renames)` gives.

    `hash` is the result's canonical hash, `num_nodes` its operator count and `num_inputs` the
    total length of its nodes' input lists; `graph()` builds it. Raises GraphError, as
    `Graph.replaced` does, when the result would be invalid.
    """

    def __init__(
        self,
        parent: Graph,
        removed: Iterable[Node] = (),
        added: Iterable[Node] = (),
        initializers: dict[str, np.ndarray] | None = None,
        values: Iterable[Value] = (),
        renames: dict[str, str] | None = None,
    ) -> None:
        self.parent = parent
        self._args = (list(removed), list(added), dict(initializers or {}), list(values))
        self._renames = dict(renames or {})
        self._graph: Graph | None = None
        self._value_hashes: dict[str, bytes] | None = None
        self.built_eagerly = not self._derive()
        """True where the answers came from building the graph (an unusual change)."""
        if self.built_eagerly:
            graph = self.graph()  # raises GraphError where the change is invalid
            self.hash, self.num_nodes, self.num_inputs = (
                graph.canonical_hash(),
                len(graph),
                sum(len(node.inputs) for node in graph.nodes),
            )

    def graph(self) -> Graph:
        """The derived graph, built once (by `Graph.replaced`, so in its node order)."""
        if self._graph is None:
            removed, added, initializers, values = self._args
            graph = self.parent.replaced(removed, added, initializers, values, self._renames)
            if self._value_hashes is not None:
                graph._hash, graph._value_hashes = self.hash, self._value_hashes
                graph._parent_hashes = None
            self._graph = graph
        return self._graph

    def _derive(self) -> bool:
        """Work out hash and size from the change alone; False to leave it to Graph.replaced."""
        parent, renames = self.parent, self._renames
        removed, added, initializers, _ = self._args
        base = _base(parent)
        if base is None or any(old in base.outputs for old in renames):
            return False
        if any(name in base.available or name in base.producers for name in initializers):
            return False  # a new constant under a name in use (rules make fresh ones)
        gone = {id(node) for node in removed}
        if len(gone) != len(removed) or not all(key in base.index for key in gone):
            return False

        # The nodes that differ from the parent's: the added ones and the readers of renamed
        # values, with the renames applied (keyed by the parent node they stand for).
        added = [_renamed(node, renames) for node in added]
        modified: dict[int, Node] = {}
        for old in renames:
            for reader in parent.consumers(old):
                if id(reader) not in gone and id(reader) not in modified:
                    modified[id(reader)] = _renamed(reader, renames)
        changed = added + list(modified.values())

        produced: dict[str, Node] = {}
        for node in added:
            for out in node.outputs:
                if not out:
                    continue
                before = base.producers.get(out)
                if (
                    out in produced
                    or out in base.available
                    or out in initializers
                    or (before is not None and id(before) not in gone)
                ):
                    return False  # defined twice
                produced[out] = node

        def producer(name: str) -> Node | None:
            node = produced.get(name)
            if node is None:
                node = base.producers.get(name)
                if node is not None:
                    node = None if id(node) in gone else modified.get(id(node), node)
            return node

        changed_readers: dict[str, list[Node]] = {}
        for node in changed:
            for name in dict.fromkeys(node.present_inputs):
                changed_readers.setdefault(name, []).append(node)

        def readers(name: str) -> list[Node]:
            kept = [
                reader
                for reader in parent.consumers(name)
                if id(reader) not in gone and id(reader) not in modified
            ]
            return kept + changed_readers.get(name, [])

        for node in changed:
            for name in node.present_inputs:
                if name not in base.available and name not in initializers:
                    if producer(name) is None:
                        return False  # reads a value nothing defines
        for node in removed:
            for out in node.outputs:
                if out and out not in produced:
                    if out in base.outputs:
                        return False
                    if out not in renames and readers(out):
                        return False  # a remaining node reads a removed value

        value_hash = dict(base.hashes)
        for name, array in initializers.items():
            digest = parent._digests.get(name)
            if digest is None:  # shared with every derived graph: hashed once per name
                digest = parent._digests[name] = array_digest(array)
            value_hash[name] = const_hash(digest)
        skip = {base.index[key] for key in (*gone, *modified)}
        if not self._rehash(base, changed, producer, skip, value_hash):
            return False  # a cycle, or an order to sort out: left to Graph.replaced

        dead = self._dead(added, removed, renames, producer, readers, base.outputs)
        for node in (*removed, *dead.values()):
            for out in node.outputs:
                if out and (producer(out) is None or id(producer(out)) in dead):
                    value_hash.pop(out, None)
        self._value_hashes = value_hash
        self.hash = outputs_hash(parent, value_hash)
        self.num_nodes = len(parent) - len(removed) + len(added) - len(dead)
        self.num_inputs = (
            base.num_inputs
            - sum(len(node.inputs) for node in (*removed, *dead.values()))
            + sum(len(node.inputs) for node in added)
        )
        return True

    @staticmethod
    def _rehash(base: _Base, changed, producer, skip: set[int], value_hash) -> bool:
        """Hash the changed nodes and the parent's nodes downstream of them, in an order where
        every node comes after those it reads; False if the parent's order cannot give one.

        A parent node keeps its position; a changed node goes right after the last of the
        nodes it reads. That is an order exactly when every parent node reading a changed node
        comes after it; otherwise (a cycle, or a change only a re-sort orders) the derivation
        is left to Graph.replaced.
        """
        ordered = _dependency_order(changed, producer)
        if ordered is None:
            return False  # a cycle among the changed nodes
        following: dict[int, list[Node]] = {}  # parent position -> changed nodes right after it
        after: dict[int, int] = {}
        for node in ordered:
            last = -1
            for name in node.present_inputs:
                source = producer(name)
                if source is not None:
                    position = after.get(id(source))
                    last = max(last, base.index[id(source)] if position is None else position)
            after[id(node)] = last
            for out in node.outputs:
                for position in base.readers.get(out, ()):
                    if position <= last and position not in skip:
                        return False
            following.setdefault(last, []).append(node)
        # Sweep the parent's order once: 1 marks a node to rehash, 2 one that is gone.
        marks = bytearray(len(base.nodes))
        for position in skip:
            marks[position] = 2
        cursor = 0
        for last in [*sorted(following), len(base.nodes) - 1]:
            position = marks.find(1, cursor, last + 1)
            while position != -1:
                hash_node(base.nodes[position], value_hash)
                for reader in base.node_readers[position]:
                    if not marks[reader]:
                        marks[reader] = 1
                position = marks.find(1, position + 1, last + 1)
            cursor = max(cursor, last + 1)
            for node in following.pop(last, ()):
                hash_node(node, value_hash)
                for out in node.outputs:
                    for reader in base.readers.get(out, ()):
                        if not marks[reader]:
                            marks[reader] = 1
        return True

    @staticmethod
    def _dead(added, removed, renames, producer, readers, outputs) -> dict[int, Node]:
        """The nodes `Graph.pruned` would drop: with the parent fully live, only nodes that
        lost a reader (producers of what the removed nodes read, of renamed values, and
        unread new nodes) can die, and then their producers, and so on."""
        dead: dict[int, Node] = {}

        def live(node: Node) -> bool:
            return any(
                out in outputs or any(id(reader) not in dead for reader in readers(out))
                for out in node.outputs
                if out
            )

        suspects: list[Node | None] = list(added)
        suspects += [producer(name) for node in removed for name in node.present_inputs]
        suspects += [producer(old) for old in renames]
        while suspects:
            node = suspects.pop()
            if node is None or id(node) in dead or live(node):
                continue
            dead[id(node)] = node
            suspects += [producer(name) for name in node.present_inputs]
        return dead


class _Base:
    """Lookups over a parent graph shared by all its derivations (made once per graph)."""

    def __init__(self, graph: Graph) -> None:
        graph.canonical_hash()
        if graph._value_hashes is None:  # the hash was set without value hashes
            from rlflow.graph.hashing import canonical_hash

            canonical_hash(graph)
        self.hashes: dict[str, bytes] = graph._value_hashes  # type: ignore[assignment]
        self.producers = graph._producer_map()
        self.nodes = graph.nodes
        self.index = {id(node): index for index, node in enumerate(graph.nodes)}
        # Per value, the positions of the nodes reading it (each reader once).
        self.readers: dict[str, list[int]] = {}
        for index, node in enumerate(graph.nodes):
            for name in dict.fromkeys(node.present_inputs):
                self.readers.setdefault(name, []).append(index)
        # Per node, the positions of the nodes reading any of its outputs.
        self.node_readers = [
            [reader for out in node.outputs if out for reader in self.readers.get(out, ())]
            for node in graph.nodes
        ]
        self.available = {v.name for v in graph.inputs} | set(graph.initializers) | {""}
        self.outputs = {v.name for v in graph.outputs}
        self.num_inputs = sum(len(node.inputs) for node in graph.nodes)


def _base(graph: Graph) -> _Base | None:
    """The graph's shared lookups, or None where a derivation must be built to be known: a
    graph with control flow (bodies read outer values) or with nodes pruning would drop."""
    if graph._derivation_base is None:
        usable = graph.pruned() is graph and not any(
            proto.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for node in graph.nodes
            for proto in node.attrs.values()
        )
        graph._derivation_base = _Base(graph) if usable else False
    return graph._derivation_base or None


def _dependency_order(nodes: list[Node], producer) -> list[Node] | None:
    """The few changed nodes in an order where each comes after those it reads (None: a
    cycle among them)."""
    ids = {id(node) for node in nodes}
    waiting = {
        id(node): {
            id(source)
            for source in map(producer, node.present_inputs)
            if source is not None and id(source) in ids
        }
        for node in nodes
    }
    ordered: list[Node] = []
    done: set[int] = set()
    while len(ordered) < len(nodes):
        ready = [node for node in nodes if id(node) not in done and waiting[id(node)] <= done]
        if not ready:
            return None
        ordered += ready
        done.update(id(node) for node in ready)
    return ordered


def _renamed(node: Node, renames: dict[str, str]) -> Node:
    """The node reading renamed values under their new names (as `Graph.replaced` does)."""
    if not renames or not any(name in renames for name in node.inputs):
        return node
    inputs = [renames.get(name, name) for name in node.inputs]
    return Node(node.op_type, inputs, node.outputs, node.attrs, node.domain, node.name)
