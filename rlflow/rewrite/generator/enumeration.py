"""Enumeration: every graph of up to max_ops menu ops over the inputs of one rank, grouped by
fingerprint (the domain's key and the exact digests of the outputs at its canonical point).

Depth-first, each graph extending its parent by one op, so that the parent's values are
reused and only the new op is run. Graphs where a value is identically zero are dropped, and
graphs where two values are equal are recorded but not extended: any rule built on them
follows from a smaller one (TASO's pruning, section 3.3). A graph whose every output equals an
input is also recorded as a candidate rule with an Identity side.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow.rewrite.generator.dag import ExprDag
from rlflow.rewrite.generator.domain import canonical_point, fresh_shapes
from rlflow.rewrite.generator.exact import Digest, digest, evaluate, input_arrays, run_dag
from rlflow.rewrite.generator.menu import ELEMENTWISE, MENU, SPECS, OpSpec, infer
from rlflow.rewrite.generator.stats import STAGES, Stats
from rlflow.rewrite.generator.symbolic import Shape, Subst, resolve, resolve_shape, unify_shapes


@dataclass
class _State:
    """A graph under construction, with its values at the canonical point of its domain."""

    ops: tuple[tuple[str, tuple[int, ...]], ...]
    shapes: list[Shape]
    exprs: list[str]
    nodes: frozenset[str]
    subst: Subst
    concrete: dict[int, tuple[int, ...]]
    values: list[np.ndarray | None]
    digests: list[Digest | None]


def _connected(graph: ExprDag) -> bool:
    """Whether every op is linked to every other through the values they share."""
    parent = list(range(graph.num_inputs + sum(SPECS[k].num_outputs for k, _ in graph.ops)))

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    members = set()
    for (_, args), outs in zip(graph.ops, graph.op_outputs()):
        for v in (*args, *outs):
            members.add(v)
            parent[find(v)] = find(args[0])
    return len({find(v) for v in members}) == 1


class Enumerator:
    """Depth-first enumeration of the graphs of one rank, grouped by fingerprint.

    Every graph is reached once (a graph is identified by its set of canonical node
    expressions, so op order and commutative operand order do not make new graphs).
    """

    def __init__(
        self, rank: int, op_types: Sequence[str], max_ops: int, num_inputs: int, stats: Stats
    ) -> None:
        self.rank = rank
        self.specs = [s for t in op_types for s in MENU.get(t, ()) if s.rank == rank]
        self.max_ops = max_ops
        self.num_inputs = num_inputs
        self.stats = stats
        self.seen: set[frozenset[str]] = set()
        self.groups: dict[tuple[str, tuple[Digest, ...]], list[ExprDag]] = defaultdict(list)
        self.identities: list[tuple[ExprDag, ExprDag]] = []

    def run(self, progress: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> None:
        count = self.num_inputs
        shapes = fresh_shapes(self.rank, count)
        exprs = [f"x{i}" for i in range(count)]
        root = _State((), shapes, exprs, frozenset(), {}, {}, [None] * count, [None] * count)
        for spec in progress(self.specs):
            self._extend(root, [spec])

    def _extend(self, state: _State, specs: Sequence[OpSpec]) -> None:
        count = len(state.shapes)
        for spec in specs:
            if spec.arity == 1:
                choices: Iterable[tuple[int, ...]] = ((v,) for v in range(count))
            elif spec.commutative:
                choices = itertools.combinations(range(count), 2)
            else:
                choices = itertools.permutations(range(count), 2)
            for args in choices:
                if spec.seam and not self._unequal_parts(state, args[0], spec.axis):
                    continue  # nothing to make equal: the plain Split covers it
                result = infer(spec, [state.shapes[v] for v in args], state.subst)
                if result is None:
                    continue
                operands = [state.exprs[v] for v in args]
                if spec.commutative:
                    operands.sort()
                node = f"{spec.key}({','.join(operands)})"
                if node.replace("=", "") in {n.replace("=", "") for n in state.nodes}:
                    continue  # the same op twice (a seam Split is also a plain Split)
                nodes = state.nodes | {node}
                if nodes in self.seen:
                    continue
                self.seen.add(nodes)
                subst, outs = result
                names = [node] if len(outs) == 1 else [f"{node}#{k}" for k in range(len(outs))]
                child = _State(
                    ops=state.ops + ((spec.key, args),),
                    shapes=state.shapes + outs,
                    exprs=state.exprs + names,
                    nodes=nodes,
                    subst=subst,
                    concrete={},
                    values=[],
                    digests=[],
                )
                self._consider(state, child)

    @staticmethod
    def _unequal_parts(state: _State, value: int, axis: int) -> bool:
        dim = resolve(state.shapes[value][axis + 1], state.subst)
        return dim[0] == "s" and dim[1] != dim[2]

    def _evaluate(self, parent: _State, child: _State) -> str:
        """Fill child's values and digests; the reason it is dropped, or ""."""
        count = self.num_inputs
        graph = ExprDag(self.rank, count, child.ops, ())
        used = sorted(graph.used_inputs())
        resolved = tuple(resolve_shape(child.shapes[i], child.subst) for i in used)
        _, concrete = canonical_point(resolved)
        if concrete is None:
            return "graphs dropped: dims not whole at the canonical point"
        child.concrete = dict(zip(used, concrete))
        inputs = input_arrays(child.concrete)
        try:
            if all(child.concrete[i] == s for i, s in parent.concrete.items()):
                # The parent's values are still right: only the new op needs running.
                key, args = child.ops[-1]
                known = [inputs.get(v) if v < count else parent.values[v] for v in args]
                new_values = evaluate(SPECS[key], known)
                values = [inputs.get(i) for i in range(count)] + parent.values[count:]
                digests = [
                    parent.digests[i] if i in parent.concrete else None for i in range(count)
                ] + parent.digests[count:]
            else:
                full = run_dag(graph, inputs)
                values, new_values, digests = full[:count], full[count:], [None] * count
        except ValueError:
            return "graphs dropped: dims not whole at the canonical point"
        if any(not value.any() for value in new_values):
            return "graphs dropped: a value is identically zero"
        for i in used:
            if digests[i] is None:
                digests[i] = digest(inputs[i])
        child.values = values + new_values
        child.digests = digests + [digest(v) for v in new_values]
        return ""

    def _consider(self, parent: _State, child: _State) -> None:
        """Fingerprint a new graph, record it, and extend it unless it is redundant."""
        self.stats.add("graphs visited")
        dropped = self._evaluate(parent, child)
        if dropped:
            self.stats.add(dropped)
            return
        count = self.num_inputs
        used = sorted(child.concrete)
        known = [d for d in child.digests if d is not None]
        redundant = len(set(known)) < len(known)
        consumed = {v for _, args in child.ops for v in args}
        sinks = [v for v in range(count, len(child.values)) if v not in consumed]
        sinks.sort(key=lambda v: child.digests[v])
        graph = ExprDag(self.rank, count, child.ops, tuple(sinks), redundant)
        if used == list(range(len(used))) and _connected(graph):
            if self.rank == 2 or any(SPECS[k].op_type not in ELEMENTWISE for k, _ in graph.ops):
                self.stats.add(STAGES[0])
                resolved = tuple(resolve_shape(child.shapes[i], child.subst) for i in used)
                key, _ = canonical_point(resolved)
                fingerprint = (key, tuple(child.digests[v] for v in sinks))
                self.groups[fingerprint].append(graph)
                self._record_identity(graph, {child.digests[i]: i for i in used}, child.digests)
                if len(sinks) > 1:
                    self._record_equal_outputs(child, graph, used)
        if redundant:
            self.stats.add("graphs not extended: two equal values")
        elif len(child.ops) < self.max_ops:
            self._extend(child, self.specs)

    def _record_equal_outputs(self, state: _State, graph: ExprDag, used: list[int]) -> None:
        """Record the graph again on the part of its domain where two outputs have one shape.

        A graph ending in Split has two outputs of one shape, so a graph with outputs of two
        shapes (two matmuls sharing an input) is never in its group; on the narrower domain
        it can be, and the pair becomes TASO's merge rule (one matmul on concatenated weights,
        then Split).
        """
        for a, b in itertools.combinations(graph.outputs, 2):
            subst = state.subst
            if resolve_shape(state.shapes[a], subst) == resolve_shape(state.shapes[b], subst):
                continue
            subst = unify_shapes(state.shapes[a], state.shapes[b], subst)
            if subst is None:
                continue
            resolved = tuple(resolve_shape(state.shapes[i], subst) for i in used)
            key, concrete = canonical_point(resolved)
            if concrete is None:
                continue
            inputs = input_arrays(dict(zip(used, concrete)))
            try:
                values = run_dag(graph, inputs)
            except ValueError:
                continue
            if any(not v.any() for v in values[self.num_inputs :]):
                continue
            digests = {v: digest(values[v]) for v in (*used, *range(self.num_inputs, len(values)))}
            reducible = len(set(digests.values())) < len(digests)
            sinks = sorted(graph.outputs, key=digests.__getitem__)
            narrowed = ExprDag(self.rank, self.num_inputs, graph.ops, tuple(sinks), reducible, True)
            self.groups[(key, tuple(digests[v] for v in sinks))].append(narrowed)
            self.stats.add("graphs also enumerated with two outputs of one shape")

    def _record_identity(
        self, graph: ExprDag, input_digests: dict[Digest, int], digests: list[Digest | None]
    ) -> None:
        """A graph whose every output equals an input is a rule with an Identity side."""
        if not all(digests[v] in input_digests for v in graph.outputs):
            return
        ops = tuple(("Identity", (input_digests[digests[v]],)) for v in graph.outputs)
        first = graph.num_inputs
        identity = ExprDag(self.rank, graph.num_inputs, ops, tuple(range(first, first + len(ops))))
        self.identities.append((graph, identity))
